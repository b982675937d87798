"""Issue 19: the Gather role carried by an SSM layer's short convolution (``detect_conv``), and the
position-controlled Aggregate numbers (``aggregate_selectivity``; issue 42: ``aggregate_slot_first``, the rank at the
slot with ties shared, which is the Aggregate gate)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from gather_aggregate.adapters import load_ssm
from gather_aggregate.detect.pattern_evidence import _slot_stats
from gather_aggregate.interventions.ablation import conv_current_tap_hooks, short_conv_layers
from gather_aggregate.testing.tiny_ssm import tiny_hf_ssm

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize("model_type", ["mamba", "mamba2"])
def test_current_tap_hooks_equal_a_conv_without_its_lagged_taps_where_asked(model_type):
    """At the masked positions the conv output is ``b + w[k-1] x[t]`` (checked against F.conv1d with the lagged
    taps zeroed); elsewhere it is the clean conv's; the weights are untouched and no hook outlives the call."""
    torch.manual_seed(0)
    model = load_ssm(tiny_hf_ssm(model_type, seed=3))
    assert short_conv_layers(model) == [info.index for info in model.layers]
    tokens = torch.randint(1, 50, (2, 11))
    where = torch.rand(2, 11) < 0.4
    mixer = model.get_submodule("blocks.1.ssm")
    w0 = mixer.conv_weight.detach().clone()
    got: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        _, clean = model.run_with_cache(tokens, names_filter=lambda n: n.startswith("blocks.1.ssm.hook_conv"))
        hooks = conv_current_tap_hooks(model, 1, where)
        hooks.append(("blocks.1.ssm.hook_conv_out", lambda y, hook: got.setdefault("y", y.clone())))
        model.run_with_hooks(tokens, fwd_hooks=hooks)
    x = clean["blocks.1.ssm.hook_conv_in"]
    k = w0.shape[-1]
    w_now = torch.zeros_like(w0)
    w_now[..., -1] = w0[..., -1]
    now = F.conv1d(x.transpose(1, 2), w_now, mixer.conv_bias, padding=k - 1, groups=x.shape[-1])[..., :11]
    want = torch.where(where[..., None], now.transpose(1, 2), clean["blocks.1.ssm.hook_conv_out"])
    torch.testing.assert_close(got["y"], want, rtol=1e-5, atol=1e-6)
    assert torch.equal(mixer.conv_weight, w0)
    assert not any(hp.fwd_hooks for hp in model.hook_dict.values())


def test_models_without_a_short_conv_have_no_conv_layers():
    sys.path.insert(0, str(Path(__file__).parent))
    from planted_circuit import build
    from planted_matrix import world

    w, tok = world()
    model, _, _ = build(tok, w.kv_values, heads_per_layer=4, n_gather=1, n_agg=1, keymover=False, read="delim",
                        depth=2, kind="ssm", seed=0)
    assert short_conv_layers(model) == []


def _slot_rows(per_prompt, correct, n_seg):
    on = torch.tensor(per_prompt, dtype=torch.float32)[:, None, :]  # [B, 1 head, seg]
    corr = torch.tensor(correct)
    wrong = torch.ones(len(correct), n_seg, dtype=torch.bool)
    wrong[torch.arange(len(correct)), corr] = False
    return on, corr, wrong


def test_a_head_fixed_on_a_slot_has_selectivity_one_whatever_its_hit_rate():
    """A head that always reads the last segment hits whenever the last segment is correct (here in 4 of 8
    prompts, a hit rate of 0.5), but gives that slot as much when it is wrong: selectivity 1."""
    correct = [4, 4, 4, 4, 0, 1, 2, 3]
    on, corr, wrong = _slot_rows([[0.0, 0.0, 0.0, 0.0, 1.0]] * 8, correct, 5)
    base = float(_slot_stats([(on, corr, wrong)])[0])
    on_correct = float(on[torch.arange(8), 0, corr].mean())
    assert on_correct == pytest.approx(0.5)
    assert on_correct / base == pytest.approx(1.0)


def test_a_smooth_row_that_favours_the_correct_segment_is_selective():
    """A recency-decaying row (nearer segments get more) plus a bump on the correct segment: its best wrong
    segment often gets more than half of what the correct one gets (the old 2x-best-wrong contrast fails), but
    the same slot gets far less when it is wrong."""
    decay = torch.tensor([0.02, 0.04, 0.08, 0.16, 0.3])
    rows, correct = [], []
    for b in range(10):
        c = b % 5
        r = decay.clone()
        r[c] += 0.25
        rows.append(r.tolist())
        correct.append(c)
    on, corr, wrong = _slot_rows(rows, correct, 5)
    base = float(_slot_stats([(on, corr, wrong)])[0])
    on_correct = float(on[torch.arange(10), 0, corr].mean())
    best_wrong = float(on[..., 0, :].masked_fill(~wrong, -1).max(-1).values.mean())
    assert on_correct < 2 * best_wrong  # the previous contrast would reject it
    assert on_correct / base >= 2.0


def test_the_rank_at_the_slot_sees_past_a_decay_towards_the_query():
    """A row decaying towards the query (the last segment gets most) with a bump on the correct segment: raw, the
    correct segment ranks first only where it is the last one (``aggregate_beats_wrong``: 1 of 5); each
    segment over its slot's base, it ranks first everywhere (``aggregate_slot_first`` 1.0).  A head fixed on the last
    slot stays at chance (1 / 5): it ranks first only where the correct segment happens to sit in that slot."""
    decay = torch.tensor([0.02, 0.04, 0.08, 0.16, 0.4])
    rows, correct = [], []
    for b in range(10):
        r = decay.clone()
        r[b % 5] += 0.12
        rows.append(r.tolist())
        correct.append(b % 5)
    on, corr, wrong = _slot_rows(rows, correct, 5)
    raw_first = float((on[torch.arange(10), 0, corr] > on[..., 0, :].masked_fill(~wrong, -1).max(-1).values)
                      .float().mean())
    assert raw_first == pytest.approx(0.2)
    assert float(_slot_stats([(on, corr, wrong)])[1][0]) == 1.0
    fixed = _slot_rows([[0.0, 0.0, 0.0, 0.0, 1.0]] * 10, correct, 5)
    assert float(_slot_stats([fixed])[1][0]) == pytest.approx(0.2)


def test_the_conv_of_the_records_ssm_is_its_gather():
    """``records-mamba2`` (a fixture never used by the zoo): its Aggregate heads sit in layer 0, so no head can
    gather before them; layer 0's short conv is named as the Gather, and no other layer's conv is."""
    sys.path.insert(0, str(FIXTURES))
    from records import RecordsRetrieval

    from gather_aggregate import load_model
    from gather_aggregate.detect.detector import find_ga_heads

    d = FIXTURES / "models" / "records-mamba2"
    model = load_model(d)
    ga = find_ga_heads(model, RecordsRetrieval.for_model(d).examples(model.tokenizer, n=8, seed=0))
    assert ga.gather_conv == [0]
    rec = {c["layer"]: c for c in ga.conv}
    assert rec[0]["loss"] - rec[0]["random_median"] >= 0.25
    assert all(rec[la]["loss"] < 0.25 for la in rec if la != 0)
    assert ga.aggregate and all(la == 0 for la, _ in ga.aggregate)
    assert ga.summary()["gather_conv"] == [0]


def test_a_conv_whose_gather_has_a_backup_is_named_by_sufficiency():
    """``notes-falconmamba`` (Falcon-Mamba): removing layer 1's conv lags at the read position alone costs little,
    as much as at another entry token (the same condensing is also done elsewhere in the entry), so the necessity
    test does not name it; removed at every entry token they take retrieval away, and kept at the read position
    alone they give it back, which kept at another token does not.  Layer 0's conv, which retrieval needs at several
    tokens, gives nothing back kept at one, and is not named."""
    sys.path.insert(0, str(FIXTURES))
    from fixture_tasks import fixture_task

    from gather_aggregate import load_model
    from gather_aggregate.detect.conv_gather import conv_evidence
    from gather_aggregate.detect.detector import find_ga_heads

    d = FIXTURES / "models" / "notes-falconmamba"
    model = load_model(d)
    ga = find_ga_heads(model, fixture_task(d).examples(model.tokenizer, n=8, seed=0))
    rec = {c["layer"]: c for c in ga.conv}
    assert ga.gather_conv == [1] and rec[1]["by"] == ["sufficiency"], ga.conv
    assert rec[1]["loss"] - rec[1]["random_median"] < 0.25  # not necessary at the read position alone
    assert rec[1]["all_loss"] - rec[1]["kept_loss"] >= 0.25 and rec[1]["kept_random_median"] - rec[1]["kept_loss"] >= 0.25
    assert not rec[0]["named"] and rec[0]["all_loss"] - rec[0]["kept_loss"] < 0.25, rec[0]
    assert conv_evidence(rec[1]).startswith("kept only at the read positions ")


def _family_model(name, tmp_path):
    from gather_aggregate import load_model
    from gather_aggregate.adapters import load_hybrid
    from gather_aggregate.testing import llamba_checkpoints as lt
    from gather_aggregate.testing import tiny_families as ft
    from gather_aggregate.testing import tiny_hybrids as ht

    if name in ("bamba", "jamba", "zamba2"):
        return load_hybrid(ht.tiny_hf_hybrid(name, seed=0))
    if name == "llamba":
        return load_model(lt.tiny_llamba_dir(tmp_path))
    return load_hybrid(getattr(ft, f"tiny_hf_{name}")(seed=0))


@pytest.mark.parametrize("name", ["bamba", "jamba", "zamba2", "granite", "nemotron_h", "falcon_h1", "qwen3_next",
                                  "llamba"])
def test_every_family_with_a_short_conv_exposes_it(name, tmp_path):
    """The hybrids (Falcon-H1's parallel layers, gated DeltaNet's bias-free conv included) and Llamba expose each
    short conv, and the current-tap hooks act from the edited position on and leave earlier positions as they
    were (up to float summation order in chunked scans)."""
    model = _family_model(name, tmp_path)
    layers = short_conv_layers(model)
    assert layers
    tokens = torch.randint(1, 50, (1, 9))
    where = torch.zeros(1, 9, dtype=torch.bool)
    where[0, 4] = True
    with torch.no_grad():
        clean = model.run_with_hooks(tokens, fwd_hooks=[])
        for la in layers:
            diff = (model.run_with_hooks(tokens, fwd_hooks=conv_current_tap_hooks(model, la, where)) - clean).abs()
            before, at = float(diff[0, :4].max()), float(diff[0, 4].max())
            assert before < 1e-5 and at > max(1e-6, 10 * before), (la, before, at)


def test_a_conv_probe_restarted_at_its_layer_equals_the_run_from_the_tokens():
    """``Prober.loss_with(start=layer)`` restarts at the conv's layer from the clean run's input to it; the loss is
    the full forward's up to float summation order, for every layer (layer 0 runs from the tokens either way)."""
    sys.path.insert(0, str(FIXTURES))
    from records import RecordsRetrieval

    from gather_aggregate import load_model
    from gather_aggregate.detect.causal_evidence import Prober
    from gather_aggregate.detect.conv_gather import conv_positions

    d = FIXTURES / "models" / "records-mamba2"
    model = load_model(d)
    prober = Prober(model, RecordsRetrieval.for_model(d).examples(model.tokenizer, n=6, seed=1))
    assert set(prober.resid[0]) == set(range(1, model.n_layers))  # the restart points are kept
    for layer in short_conv_layers(model):
        def hooks(b, layer=layer):
            return conv_current_tap_hooks(model, layer, conv_positions(b, "summary", seed=None))

        full, resumed = prober.loss_with(hooks), prober.loss_with(hooks, start=layer)
        assert resumed == pytest.approx(full, abs=1e-5), layer
        assert full != 0.0


def test_the_rank_at_the_slot_gives_ties_a_shared_place():
    """A head that gives the segments nothing, or the same share at every slot, ties everywhere: each prompt's tie
    with its ``k`` wrong segments counts ``1 / (k + 1)``, so the head scores chance (1 / 5), not 0 or 1."""
    correct = [0, 1, 2, 3, 4, 0, 1, 2]
    for row in ([0.0] * 5, [0.2] * 5):
        on, corr, wrong = _slot_rows([row] * 8, correct, 5)
        _, first, chance = _slot_stats([(on, corr, wrong)])
        assert float(first[0]) == pytest.approx(0.2) and chance == pytest.approx(0.2)


def test_a_previous_token_head_whose_other_slots_get_nothing_is_no_aggregate_candidate():
    """A head fixed on the last slot, the other slots never read (0 over a base of 0): where the correct segment
    is elsewhere it ties with every slot (all at their base), and where it is the last one it is at its base too.
    It scores chance, so it is no candidate however often the last segment is the right one."""
    from gather_aggregate.detect.pattern_evidence import is_aggregate_candidate

    correct = [4, 4, 4, 4, 4, 0, 1, 2, 3, 4]
    on, corr, wrong = _slot_rows([[0.0, 0.0, 0.0, 0.0, 1.0]] * 10, correct, 5)
    _, first, chance = _slot_stats([(on, corr, wrong)])
    assert float(first[0]) == pytest.approx(0.2)
    assert not is_aggregate_candidate({"aggregate_slot_first": float(first[0]), "aggregate_slot_chance": chance})


def test_a_slot_read_only_when_correct_ranks_first():
    """A row that reads a segment only when it is the correct one (each slot's base 0): the correct segment is
    above every ratio (nothing over nothing is 1, something over nothing above any), so it ranks first always."""
    rows, correct = [], []
    for b in range(10):
        r = [0.0] * 5
        r[b % 5] = 0.3
        rows.append(r)
        correct.append(b % 5)
    on, corr, wrong = _slot_rows(rows, correct, 5)
    assert float(_slot_stats([(on, corr, wrong)])[1][0]) == 1.0


def test_the_aggregate_gate_asks_twice_chance_where_segments_are_few():
    """With two segments a random ranking scores 0.5, so the gate asks for 1.0 (twice chance), not 0.5; from four
    segments on, ``AGGREGATE_MIN_HIT`` is the binding bar."""
    from gather_aggregate.detect.pattern_evidence import is_aggregate_candidate

    assert not is_aggregate_candidate({"aggregate_slot_first": 0.75, "aggregate_slot_chance": 0.5})
    assert is_aggregate_candidate({"aggregate_slot_first": 1.0, "aggregate_slot_chance": 0.5})
    assert is_aggregate_candidate({"aggregate_slot_first": 0.5, "aggregate_slot_chance": 0.125})
    assert not is_aggregate_candidate({"aggregate_slot_first": 0.45, "aggregate_slot_chance": 0.125})
