"""Whole-layer, whole-group and conv ablations behind the Mamba-1 and out-of-sample paragraphs of
``docs/results_fixtures.md`` and ``docs/results.md``: where a role spread over a layer's channel groups, or over
several steps, acts, which no single-head test shows.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python scripts/layer_ablation_numbers.py layers tests/fixtures/models/notes-falconmamba
    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python scripts/layer_ablation_numbers.py group mamba1-kv L1H6,L1H3,L1H1,L1H5,L1H7,L1H4,L1H2

``layers FIXTURE``: per layer, (1) every head zeroed at one token of each entry, one of :data:`POSITIONS` (the
detector's read positions and the token after the key), as a share of the retrieval margin
(:class:`~gather_aggregate.detect.causal_evidence.Prober`, 32 prompts, seed 0), against the median of 5 draws of one
other token of each entry before it (the conv test's baseline,
:func:`~gather_aggregate.detect.conv_gather.conv_positions`); (2) every head zeroed at the entries' tokens and at the
query; (3) first-token accuracy on 64 prompts with the whole layer zeroed at every position.

``group MODEL HEADS``: accuracy on the zoo's four tasks (48 prompts, seed 0) with ``HEADS`` zero-ablated at every
position, against 3 random sets of as many other heads (seed 0), and with each whole layer removed.

``convs FIXTURE``: per set of short convs (each layer's, then all together), the loss with their lagged taps removed
(:func:`~gather_aggregate.interventions.ablation.conv_current_tap_hooks`) at one token of each entry, one of
:data:`POSITIONS`, against the median of 5 draws of one other token of each entry before it (the conv test of
:mod:`~gather_aggregate.detect.conv_gather` at every read position), at every entry token at once, and at every
token of the correct entry against those of one wrong entry (median of 3 draws; 32 prompts, seed 0); and the
sufficiency half: the lags kept at that one token of each entry only, removed at the entries' other tokens, against
kept at another entry token only (median of 5).  ``convs`` also takes a zoo model's directory (its KV prompts).

``lags FIXTURE LAYER``: per head of ``LAYER``, at each offset of an entry, its row's share of |mass| over the tokens
up to it on the last 4 tokens (16 prompts): which heads keep their own token.

``sets FIXTURE HEADS [--aside HEADS]``: a fixture's first-token accuracy (8 and 64 prompts, seed 0, as
``tests/test_detect_fixtures.py``), clean and with, zeroed at every position: ``HEADS``; every head outside them;
those without the ``--aside`` heads (the test's random pool sets aside heads that alone cost 0.25); and, on 64
prompts, 10 draws of the detector's random sets for ``HEADS`` from every other head
(:func:`~gather_aggregate.detect.causal_evidence.random_sets`, seed 0).

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python scripts/layer_ablation_numbers.py sets tests/fixtures/models/arrow-mamba1 L1H0,L1H1,L1H2,L1H3,L1H4,L1H5,L1H6,L1H7 --aside L0H7
"""

from __future__ import annotations

import random
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
sys.path.insert(0, str(ROOT / "tests"))

#: the positions of an entry both ablation modes test: the detector's read positions, and the token after the key
POSITIONS = ("summary", "last-1", "last-2", "first+1")


def _zero_layer_at(model: Any, layer: int, read: str, seed: int | None) -> Any:
    """Hooks per batch: every head of ``layer`` zeroed at one token of each entry (the read position, or with
    ``seed`` one other token before it)."""
    from gather_aggregate.detect.conv_gather import conv_positions

    name, _ = model.head_hook(layer)  # [batch, pos, ...]: zeroed per position, every head

    def make(b: Any) -> list:
        where = conv_positions(b, read, seed=seed)

        def hook(z: Any, hook: Any) -> Any:
            keep = (~where[:, : z.shape[1]]).to(z.dtype)  # [batch, pos]
            shape = [1] * z.dim()
            shape[0], shape[1] = keep.shape
            return z * keep.view(shape)

        return [(name, hook)]

    return make


def layers(d: Path) -> None:
    from fixture_tasks import fixture_task  # tests/fixtures
    from test_detect_fixtures import first_token_accuracy  # tests

    from gather_aggregate import load_model
    from gather_aggregate.detect.causal_evidence import Prober
    from gather_aggregate.interventions.ablation import ablation_hooks, make_replacement

    model = load_model(d)
    prober = Prober(model, fixture_task(d).examples(model.tokenizer, n=32, seed=0))
    ex64 = fixture_task(d).examples(model.tokenizer, n=64, seed=0)
    for info in model.layers:
        la, heads = info.index, [(info.index, h) for h in range(info.n_heads)]
        for read in POSITIONS:
            at = prober.loss_with(_zero_layer_at(model, la, read, None))
            other = statistics.median(prober.loss_with(_zero_layer_at(model, la, read, k)) for k in range(5))
            print(f"{d.name} layer {la} zeroed at {read}: {at:.2f} of the margin; at another entry token "
                  f"(median of 5): {other:.2f}")
        print(f"{d.name} layer {la} zeroed at the entries: {prober.loss(heads, 'segments'):.2f}; at the query: "
              f"{prober.loss(heads, 'query'):.2f}; alone at the entries, per head: "
              f"{[round(prober.loss([hd], 'segments'), 2) for hd in heads]}")
        acc = first_token_accuracy(model, ex64, ablation_hooks(model, heads, make_replacement(model, heads, "zero")))
        print(f"{d.name} layer {la} zeroed everywhere: first-token accuracy {acc:.3f} on 64 prompts")


def group(name: str, spec: str) -> None:
    from gather_aggregate.lm_eval.spec import parse_heads
    from gather_aggregate.models.loading import load_model
    from gather_aggregate.studies.claims import ablated_accuracies, accuracies, task_sets
    from gather_aggregate.zoo import resolve_model_path

    d = Path(resolve_model_path(name))
    model = load_model(d)
    heads = model.check_head_set(parse_heads(spec, "HEADS"))
    sets = task_sets(model, d, 48, 0)
    print("clean", accuracies(model, sets))
    print("named", heads, ablated_accuracies(model, heads, sets))
    pool = [hd for hd in model.all_heads() if hd not in heads]
    rng = random.Random(0)
    for _ in range(3):
        s = rng.sample(pool, min(len(heads), len(pool)))
        print("random", s, ablated_accuracies(model, s, sets))
    for info in model.layers:
        print(f"layer {info.index}", ablated_accuracies(model, [(info.index, h) for h in range(info.n_heads)], sets))


def convs(d: Path) -> None:
    import torch
    from fixture_tasks import fixture_task  # tests/fixtures

    from gather_aggregate import load_model
    from gather_aggregate.detect.causal_evidence import Prober
    from gather_aggregate.detect.conv_gather import all_but, conv_positions, segment_tokens
    from gather_aggregate.interventions.ablation import conv_current_tap_hooks, short_conv_layers

    model = load_model(d)
    if (d / "fixture.json").is_file():  # a fixture
        ex = fixture_task(d).examples(model.tokenizer, n=32, seed=0)
    else:  # a zoo model
        from gather_aggregate.tasks.registry import get_task

        ex = get_task("kv", model_dir=d).examples(model.tokenizer, n=32, seed=0)
    prober = Prober(model, ex)
    layer_sets = [[la] for la in short_conv_layers(model)]
    layer_sets += [short_conv_layers(model)] if len(layer_sets) > 1 else []

    def removed(layers: list[int], where: Any) -> Any:
        return lambda b: [h for la in layers for h in conv_current_tap_hooks(model, la, where(b))]

    def one_entry(which: str, seed: int) -> Any:
        def where(b: Any) -> Any:
            rng = random.Random(seed)
            key = torch.arange(b.tokens.shape[1], device=b.tokens.device)
            mask = torch.zeros(b.tokens.shape, dtype=torch.bool, device=b.tokens.device)
            for i in range(b.tokens.shape[0]):
                c, n = int(b.correct[i]), int(b.seg_mask[i].sum())
                j = c if which == "correct" else rng.choice([k for k in range(n) if k != c])
                mask[i] = (key >= b.seg_start[i, j]) & (key < b.seg_end[i, j])
            return mask
        return where

    def at_and_other(layers: list[int], make: Any, read: str) -> tuple[float, float]:
        """The loss with ``layers``' lags removed where ``make(b, read, seed=None)`` says, and the median of 5
        draws with ``seed=k`` (another entry token in place of the read position)."""
        at = prober.loss_with(removed(layers, lambda b: make(b, read, seed=None)))
        other = statistics.median(prober.loss_with(removed(layers, lambda b, k=k: make(b, read, seed=k)))
                                  for k in range(5))
        return at, other

    for layers in layer_sets:
        right = prober.loss_with(removed(layers, one_entry("correct", 0)))
        wrong = statistics.median(prober.loss_with(removed(layers, one_entry("wrong", k))) for k in range(3))
        print(f"{d.name} convs {layers} lags removed at every token of the correct entry: {right:.2f}; of a wrong "
              f"entry (median of 3): {wrong:.2f}")
        for read in POSITIONS:
            at, other = at_and_other(layers, conv_positions, read)
            print(f"{d.name} convs {layers} lags removed at {read}: {at:.2f} of the margin; at another entry token "
                  f"(median of 5): {other:.2f}")
            kept, kept_other = at_and_other(layers, all_but, read)
            print(f"{d.name} convs {layers} lags kept at {read} only (removed at the other entry tokens): {kept:.2f}; "
                  f"kept at another entry token only (median of 5): {kept_other:.2f}")
        print(f"{d.name} convs {layers} lags removed at every entry token: "
              f"{prober.loss_with(removed(layers, segment_tokens)):.2f}")


def sets(d: Path, spec: str, aside: str) -> None:
    from fixture_tasks import fixture_task  # tests/fixtures
    from test_detect_fixtures import first_token_accuracy  # tests

    from gather_aggregate import load_model
    from gather_aggregate.detect.causal_evidence import random_sets
    from gather_aggregate.interventions.ablation import ablation_hooks, make_replacement
    from gather_aggregate.lm_eval.spec import parse_heads

    model = load_model(d)
    heads = model.check_head_set(parse_heads(spec, "HEADS"))
    put_aside = model.check_head_set(parse_heads(aside, "--aside")) if aside else []
    ex = {n: fixture_task(d).examples(model.tokenizer, n=n, seed=0) for n in (8, 64)}

    def acc(hs: list, n: int) -> float:
        hooks = ablation_hooks(model, hs, make_replacement(model, hs, "zero")) if hs else []
        return first_token_accuracy(model, ex[n], hooks)

    print(f"{d.name} clean: {acc([], 8):.3f} on 8 prompts, {acc([], 64):.3f} on 64")

    outside = [hd for hd in model.all_heads() if hd not in heads]
    kept = [hd for hd in outside if hd not in put_aside]
    for label, hs in (("named", heads), ("every head outside", outside), ("outside without --aside", kept)):
        if hs:
            print(f"{d.name} {label} ({len(hs)} heads) zeroed everywhere: {acc(hs, 8):.3f} on 8 prompts, "
                  f"{acc(hs, 64):.3f} on 64")
    kinds = {hd: model.layers[hd[0]].kind_of(hd[1]) for hd in model.all_heads()}
    draws, source = random_sets(heads, outside, kinds, seed=0)  # nothing set aside
    print(f"{d.name} random sets ({source}) zeroed everywhere, 64 prompts:",
          sorted(round(acc(s, 64), 3) for s in draws))


def lags(d: Path, layer: int, n_lags: int = 4) -> None:
    """Per head of ``layer``: at each offset of an entry (0 = its first token), the row's share of its |mass| over
    the tokens ``[1, t]`` that lies ``0 .. n_lags - 1`` tokens back, averaged over the entries after the first (16
    prompts, seed 0): a row whose lag 0 holds it all keeps its own token and gathers nothing."""
    import torch
    from fixture_tasks import fixture_task

    from gather_aggregate import load_model

    model = load_model(d)
    ex = fixture_task(d).examples(model.tokenizer, n=16, seed=0)
    width = min(s.end - s.start for e in ex for s in e.segments)
    acc, n = None, 0
    for e in ex:
        with torch.no_grad():
            p = model.pattern(torch.tensor([e.input_ids]), layer, normalize=False).float()[0].abs()  # [h, q, k]
        acc = torch.zeros(p.shape[0], width, n_lags) if acc is None else acc
        for s in e.segments[1:]:
            for off in range(width):
                t = s.start + off
                row = p[:, t] / p[:, t, 1:t + 1].sum(-1, keepdim=True).clamp_min(1e-30)
                acc[:, off] += torch.stack([row[:, t - j] for j in range(n_lags)], -1)
            n += 1
    assert acc is not None
    for h, per in enumerate((acc / n).tolist()):
        print(f"{d.name} L{layer}H{h} |share| on lags 0..{n_lags - 1} at entry offsets 0..{width - 1}: "
              + "; ".join(" ".join(f"{x:.2f}" for x in o) for o in per))


def main(argv: list[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(description="whole-layer and whole-group ablations (module docstring)")
    sub = p.add_subparsers(dest="what", required=True)
    sub.add_parser("layers", help="per layer of a fixture: zeroed at each read position vs other entry tokens"
                   ).add_argument("fixture", type=Path)
    g = sub.add_parser("group", help="a zoo model's four tasks with a head group zeroed vs random sets")
    g.add_argument("model", help="zoo name or model directory")
    g.add_argument("heads", help="comma list, e.g. L1H6,L1H3")
    sub.add_parser("convs", help="per short conv of a fixture: lags removed at each read position vs other entry "
                   "tokens, and at every entry token").add_argument("fixture", type=Path)
    lg = sub.add_parser("lags", help="per head of a fixture's layer: its rows' |mass| on the last few tokens")
    lg.add_argument("fixture", type=Path)
    lg.add_argument("layer", type=int)
    f = sub.add_parser("sets", help="a fixture with a head set, the heads outside it and random sets zeroed")
    f.add_argument("fixture", type=Path)
    f.add_argument("heads", help="comma list, e.g. L1H0,L1H1")
    f.add_argument("--aside", default="", help="heads left out of the outside set and the random draws")
    a = p.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    if a.what == "layers":
        layers(a.fixture)
    elif a.what == "convs":
        convs(a.fixture)
    elif a.what == "lags":
        lags(a.fixture, a.layer)
    elif a.what == "sets":
        sets(a.fixture, a.heads, a.aside)
    else:
        group(a.model, a.heads)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
