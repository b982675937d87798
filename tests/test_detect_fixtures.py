"""Issue 19: the detector on fresh models it was never tuned on (``tests/fixtures/models``, trained by
``tests/fixtures/train_fixtures.py``): it names both roles where both exist, and removing the named heads takes
retrieval to at most twice chance while random sets of as many other heads do not."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
MODELS = sorted(p for p in (FIXTURES / "models").glob("*") if (p / "model.safetensors").is_file())
N = 8


def _examples(model, d, n=N):
    sys.path.insert(0, str(FIXTURES))
    from fixture_tasks import fixture_task

    return fixture_task(d).examples(model.tokenizer, n=n, seed=0)


def measure(d: Path, n_random: int = 3) -> dict:
    """Named heads, clean / ablated / random-set accuracies and chance on one fixture.  Accuracy is the retrieval the
    detector is asked about: the answer's first token against the candidates' first tokens at the query position
    (for single-token values, ``evaluate``'s accuracy); ``clean_full`` scores whole continuations (``evaluate``).
    A two-token value (the ``bag`` format) is retrieved twice: at the query, keyed by the key, and at its first
    token, keyed by that token (what follows it in the prompt), a second retrieval with its own query position."""
    from gather_aggregate import load_model
    from gather_aggregate.detect.detector import find_ga_heads
    from gather_aggregate.detect.rules import NAME_MIN
    from gather_aggregate.interventions.ablation import ablation_hooks, make_replacement
    from gather_aggregate.tasks import evaluate

    model = load_model(d)
    ex = _examples(model, d)
    ga = find_ga_heads(model, ex)
    named = ga.ga_heads()

    def acc(heads):
        hooks = ablation_hooks(model, heads, make_replacement(model, heads, "zero")) if heads else []
        return first_token_accuracy(model, ex, hooks)

    rows = {(r["layer"], r["head"]): r for r in ga.table}
    big = {hd for hd, r in rows.items() if max(r["gather_alone"], r["aggregate_alone"]) >= NAME_MIN}
    pool = [hd for hd in model.all_heads() if hd not in named and hd not in big]
    rng = random.Random(0)
    draws = [rng.sample(pool, min(len(named), len(pool))) for _ in range(n_random)] if pool else []
    ex64, read = _examples(model, d, n=64), ga.reading["gather"]
    return {"name": d.name, "gather": ga.gather, "gather_conv": ga.gather_conv, "aggregate": ga.aggregate,
            "pairs": ga.pairs, "conv_by": {c["layer"]: c["by"] for c in ga.conv if c["named"]},
            "conv": {k: conv_accuracy(model, ex64, ga.gather_conv, where) for k, where in conv_masks(read).items()},
            "clean": acc([]), "clean_full": float(evaluate(model, ex, progress=False).accuracy),
            "ablated": acc(named) if named else None, "random": [acc(hs) for hs in draws],
            "chance": sum(1 / len(e.candidates) for e in ex) / len(ex), "excluded": sorted(big - set(named)),
            "read": ga.reading["gather"], "why": {role: g["why"] for role, g in ga.groups.items()},
            "conv_why": {c["layer"]: c["why"] for c in ga.conv},
            "named_rows": {f"L{r['layer']}H{r['head']}": {k: round(r[k], 2) for k in (
                "aggregate_beats_wrong", "aggregate_slot_first", "aggregate_selectivity", "aggregate_lift",
                "gather_mass", "gather_lift")} for r in ga.table if (r["layer"], r["head"]) in named}}


def first_token_accuracy(model, ex, hooks) -> float:
    """Share of ``ex`` whose answer's first token scores highest among the candidates' first tokens at the query
    position, with ``hooks`` on (removed after the forward, also on error)."""
    import torch

    from gather_aggregate.core.protocol import pad_id_of
    from gather_aggregate.tasks.base import collate

    b = collate(ex, pad_id_of(model.tokenizer))
    with torch.no_grad():
        logits = model.run_with_hooks(b.tokens, fwd_hooks=hooks)[torch.arange(len(ex)), b.query_pos]
    cand = logits.gather(1, b.cand_ids.clamp_min(0)).masked_fill(~b.cand_mask, float("-inf"))
    return float((cand.argmax(-1) == b.answer).float().mean())


def conv_masks(read: str) -> dict:
    """Where the conv tests remove a named conv's lagged taps (``[batch, pos]`` masks per batch): at the read
    positions, and as the control at one other token of each segment (necessity); at every segment token, at every
    one but the read positions, and as the control at every one but another token (sufficiency)."""
    from gather_aggregate.detect.conv_gather import all_but, conv_positions, segment_tokens

    return {"at_read": lambda b: conv_positions(b, read, seed=None),
            "at_other": lambda b: conv_positions(b, read, seed=0),
            "everywhere": segment_tokens,
            "kept_at_read": lambda b: all_but(b, read, seed=None),
            "kept_at_other": lambda b: all_but(b, read, seed=0)}


def conv_accuracy(model, ex, layers, where) -> dict | None:
    """Per named Gather conv, accuracy with its lagged taps removed at the positions ``where(batch)`` gives (None:
    no conv named); on 64 prompts, since one prompt of the detector's 8 moves it by 0.125."""
    if not layers:
        return None
    import torch

    from gather_aggregate.core.protocol import pad_id_of
    from gather_aggregate.interventions.ablation import conv_current_tap_hooks
    from gather_aggregate.tasks.base import collate

    out = {}
    for la in layers:
        right = 0
        for e in ex:
            b = collate([e], pad_id_of(model.tokenizer))
            with torch.no_grad():
                logits = model.run_with_hooks(b.tokens, fwd_hooks=conv_current_tap_hooks(model, la, where(b)))
            first = torch.tensor([c[0] for c in e.candidate_ids])
            right += int(int(logits[0, e.query_pos][first].argmax()) == e.answer)
        out[la] = right / len(ex)
    return out


# Known failures, stated (docs/results.md, "Fresh fixtures"): the detector is not tuned to pass them.
XFAIL: dict[str, str] = {
    "bag-falconmamba": "Falcon-Mamba on the bag format, out of sample: both roles are named (the Aggregate: all 8 "
                       "channel groups of layer 1; the Gather: layer 1's conv at 'last-1', by both halves) and "
                       "removing the named groups takes retrieval to chance (0.125; 64 prompts: 0.17), but the "
                       "random control cannot pass: the only set of 8 groups outside the named ones is all of layer "
                       "0, which zeroed at every position also gives 0.125 (64 prompts: 0.19), while the detector's "
                       "own random sets, 8 of all 16 groups, keep 0.42-0.69 on 64 (docs/results_fixtures.md)",
    "log-falconmamba": "Falcon-Mamba on the log format, out of sample: the conv Gather (layer 1, by sufficiency) and a "
                       "13-group Aggregate (7 of layer 1, 6 of layer 0; peeling's layer context keeps 4 more than the "
                       "whole-group context, whose 9 passed at exactly 0.25) are named, but the 13 removed leave "
                       "0.375 on the test's 8 prompts, one prompt over twice chance (64 prompts: 0.27, against the "
                       "9's 0.28; docs/results_fixtures.md)",
    "log-falconmamba4": "log-falconmamba grown to 4 layers: the layer that reads the entry is named (all 8 groups of "
                        "layer 2), beside 7 groups of layer 1, which carries the queried key at the query (15 removed "
                        "leave 0.25, random sets 1.0), but layer 1's conv, named by sufficiency on 8 prompts, fails "
                        "the test's check on 64: removed at every entry token it leaves 0.27, over twice chance, and "
                        "kept at the read positions only 0.30 (docs/results_fixtures.md)",
}


@pytest.mark.parametrize("d", [pytest.param(d, marks=pytest.mark.xfail(strict=True, reason=XFAIL[d.name]))
                               if d.name in XFAIL else d for d in MODELS], ids=lambda p: p.name)
def test_detector_names_both_roles_on_fresh_models(d):
    m = measure(d)
    assert m["clean"] >= 0.8, m
    # both roles: the Gather by heads or, where no head gathers, by an SSM layer's short convolution
    assert (m["gather"] or m["gather_conv"]) and m["aggregate"], m
    assert m["ablated"] <= 2 * m["chance"], m
    assert m["random"] and min(m["random"]) > 2 * m["chance"], m
    low, conv = 2 * m["chance"], m["conv"]
    for la, by in m["conv_by"].items():  # each named conv carries the Gather as its test found (64 prompts)
        if "necessity" in by:  # without its lagged taps at the read positions retrieval is gone; at other tokens not
            assert conv["at_read"][la] <= low < conv["at_other"][la], (la, m)
        if "sufficiency" in by:  # gone without them at every segment token, back with them at the read positions
            # alone, and not with them at another segment token instead
            assert conv["everywhere"][la] <= low < conv["kept_at_read"][la], (la, m)
            assert conv["kept_at_other"][la] <= low, (la, m)


@pytest.mark.parametrize("d", MODELS, ids=lambda p: p.name)
def test_fresh_models_retrieve(d):
    """Every fixture answers its own task (so an expected detector failure above is not a broken fixture)."""
    from gather_aggregate import load_model
    from gather_aggregate.tasks import evaluate

    model = load_model(d)
    assert evaluate(model, _examples(model, d), progress=False).accuracy >= 0.8


def main(argv: list[str] | None = None) -> int:
    """``python tests/test_detect_fixtures.py [NAME ...]``: each fixture's (or the named ones') measurement, with 10
    random sets (the numbers in docs/results.md)."""
    import torch

    torch.set_num_threads(1)
    names = set(sys.argv[1:] if argv is None else argv)
    for d in MODELS:
        if not names or d.name in names:
            print(measure(d, n_random=10), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
