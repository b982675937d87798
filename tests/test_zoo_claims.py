"""Claims a-d of the paper, measured on the shipped toy zoo (issue 9; numbers and history in docs/results.md).

Every head named here comes from the model's own exact scan and Gather/Aggregate
scores (``gather_aggregate.zoo.claims``); nothing is hard-coded.

What the shipped zoo reproduces, and what it does not (see docs/results.md):

* ``llama-ga`` (pure attention) learnt knowledge and content-format MC but **not** in-context retrieval in the
  CPU budget: its KV and letter-MC accuracy sit at chance.  Claims a and b on the transformer are therefore
  tests marked ``xfail(strict=True)``: they run and assert the paper's claim, and they will fail loudly
  the day a retrained transformer starts to meet it, so this file gets updated.
* No shipped model learnt letter-format MC; the retrieval task the zoo does solve is KV-retrieval.  The hybrid
  ``bamba-ga`` (a Mamba-2 layer, then an attention layer) solves it with sharp attention Aggregate heads, and
  ``mamba2-ga`` solves it with smooth implied attention.  Claims b-d are checked on KV-retrieval with those;
  b holds only in a weaker form (named heads cost >= 0.3 of KV accuracy, not down to <= 0.30), which the
  tests state as such next to the strict-xfail full claim.
"""

from __future__ import annotations

import pytest

from gather_aggregate.zoo import list_zoo

ZOO = list_zoo()
N = 48
pytestmark = pytest.mark.skipif(not {"llama-ga", "mamba2-ga", "bamba-ga"} <= set(ZOO),
                                reason="the toy zoo is not shipped in this checkout")
NOT_LEARNT = ("not reproduced at toy scale: the shipped transformer did not learn in-context retrieval on this "
              "CPU (KV and letter-MC at chance); see docs/results.md")


@pytest.fixture(scope="module")
def measured() -> dict:
    from gather_aggregate.zoo.claims import measure_model

    return {name: measure_model(name, ZOO[name], n=N) for name in ("llama-ga", "mamba2-ga", "bamba-ga")}


def _breaks(r: dict, task: str) -> dict:
    """The named head set (<= 2 heads) that hurts ``task`` most, checked against the claim-b criteria."""
    an = r["by_task"][task]
    best = an["bottleneck"]["best"]
    assert best is not None, f"no head named by the G&A scores: {an['scan_top']}"
    assert 1 <= len(best["heads"]) <= 2
    named = {tuple(h) for h in an["bottleneck"]["flagged"]}
    assert {tuple(h) for h in best["heads"]} <= named  # chosen by the G&A scores, never by index
    assert best[task] <= 0.30, best
    assert abs(best["delta_content-mc"]) <= 0.05 and abs(best["delta_knowledge"]) <= 0.05, best
    assert an["random_baseline"][task] >= best[task] + 0.3, (an["random_baseline"], best)
    return best


# --- a: the transformer retrieves -------------------------------------------------------------------------


@pytest.mark.xfail(strict=True, reason=NOT_LEARNT)
def test_a_transformer_solves_kv_and_letter_mc(measured):
    r = measured["llama-ga"]
    assert r["clean"]["kv"] >= 0.9 and r["clean"]["letter-mc"] >= 0.9, r["clean"]


def test_a_knowledge_without_retrieval_and_attention_retrieval_in_the_hybrid(measured):
    llama, hybrid = measured["llama-ga"], measured["bamba-ga"]
    # the negative control: knowledge formats are solved with no retrieval at all (the paper's dissociation)
    assert llama["clean"]["knowledge"] >= 0.9 and llama["clean"]["content-mc"] >= 0.9, llama["clean"]
    assert llama["clean"]["kv"] <= 3 * llama["chance"]["kv"], llama["clean"]
    # the hybrid's attention layer does retrieve
    assert hybrid["clean"]["kv"] >= 0.9, hybrid["clean"]
    assert hybrid["by_task"]["kv"]["top_aggregate"]["kind"] == "attn"


# --- b: a <= 2-head bottleneck that spares knowledge ---------------------------------------------------------


@pytest.mark.xfail(strict=True, reason=NOT_LEARNT)
def test_b_transformer_letter_mc_bottleneck(measured):
    _breaks(measured["llama-ga"], "letter-mc")


@pytest.mark.xfail(strict=True, reason="not reproduced in full: the hybrid's <= 2 G&A-named heads take KV from "
                   "~0.97 only to ~0.5, not to <= 0.30 (the scan's top-2 do reach ~0.24); see docs/results.md")
def test_b_hybrid_kv_bottleneck_named_by_the_ga_scores(measured):
    _breaks(measured["bamba-ga"], "kv")


def _named_heads_cost_kv(r: dict) -> dict:
    an = r["by_task"]["kv"]
    best = an["bottleneck"]["best"]
    assert best is not None and len(best["heads"]) <= 2
    assert {tuple(h) for h in best["heads"]} <= {tuple(h) for h in an["bottleneck"]["flagged"]}
    assert r["clean"]["kv"] - best["kv"] >= 0.3, best
    assert an["random_baseline"]["kv"] >= best["kv"] + 0.1, (an["random_baseline"], best)
    return best


def test_b_weaker_hybrid_named_heads_carry_kv_retrieval_but_not_knowledge(measured):
    """The weaker, measured form of b on the hybrid: <= 2 heads named by the G&A scores cost >= 0.3 of KV
    accuracy, far more than as many random heads, while content-MC and knowledge move <= 5 points."""
    best = _named_heads_cost_kv(measured["bamba-ga"])
    assert abs(best["delta_content-mc"]) <= 0.05 and abs(best["delta_knowledge"]) <= 0.05, best


def test_b_weaker_ssm_named_heads_hit_retrieval_far_harder_than_knowledge(measured):
    """On Mamba-2 the two named Aggregate heads cost >= 0.3 of KV accuracy; knowledge moves too (5-8 points
    measured, so the issue's <= 5 points is not met), but at least 4x less than retrieval."""
    r = measured["mamba2-ga"]
    best = _named_heads_cost_kv(r)
    kv_drop = r["clean"]["kv"] - best["kv"]
    assert abs(best["delta_knowledge"]) * 4 <= kv_drop and abs(best["delta_content-mc"]) * 4 <= kv_drop, best


# --- c: SSM heads form G&A-shaped but smoother implied attention ----------------------------------------------


def test_c_ssm_aggregate_rows_are_ga_shaped_but_smoother_than_attention(measured):
    ssm, hyb = measured["mamba2-ga"]["by_task"]["kv"], measured["bamba-ga"]["by_task"]["kv"]
    assert ssm["top_aggregate"]["kind"] == "ssm" and hyb["top_aggregate"]["kind"] == "attn"
    # G&A-shaped: the strongest Aggregate row peaks on the correct line's summary token far above chance (1/12)
    assert ssm["top_aggregate"]["aggregate_hit"] >= 0.5, ssm["top_aggregate"]
    assert hyb["top_aggregate"]["aggregate_hit"] >= 0.5, hyb["top_aggregate"]
    # ... and smoother: higher row entropy and lower peak mass than the attention Aggregate head's rows
    assert ssm["aggregate_row"]["entropy"] > hyb["aggregate_row"]["entropy"] + 1.0, (ssm["aggregate_row"],
                                                                                     hyb["aggregate_row"])
    assert ssm["aggregate_row"]["top1_mass"] < hyb["aggregate_row"]["top1_mass"]


def test_c_ssm_heads_are_redundant(measured):
    """Single SSM heads matter less than the hybrid's most important head: retrieval is spread over several."""
    ssm, hyb = measured["mamba2-ga"]["by_task"]["kv"], measured["bamba-ga"]["by_task"]["kv"]
    assert ssm["max_single_head_drop"] < hyb["max_single_head_drop"], (ssm["max_single_head_drop"],
                                                                      hyb["max_single_head_drop"])
    # ... yet together the two named SSM Aggregate heads do carry it
    assert measured["mamba2-ga"]["clean"]["kv"] - ssm["bottleneck"]["best"]["kv"] > 2 * ssm["max_single_head_drop"]


def test_c_ssm_kv_accuracy_falls_faster_with_dictionary_size(measured):
    ssm, hyb = measured["mamba2-ga"]["kv_by_size"], measured["bamba-ga"]["kv_by_size"]
    lo, hi = min(ssm), max(ssm)
    assert ssm[lo] >= 0.9 and hyb[lo] >= 0.9  # both solve small dictionaries
    assert ssm[lo] - ssm[hi] > hyb[lo] - hyb[hi], (ssm, hyb)


# --- d: the cumulative-ablation table -------------------------------------------------------------------------


def test_d_cumulative_ablation_table(measured):
    for r in measured.values():
        for task, an in r["by_task"].items():
            rows = an["cumulative"]
            assert [row["k"] for row in rows] == [0, 1, 2, 4, 8]
            assert rows[0]["heads"] == [] and rows[0][task] == pytest.approx(r["clean"][task])
            assert [tuple(h) for h in rows[-1]["heads"][:4]] == [tuple(h) for h in an["scan_top"]]
    hyb = measured["bamba-ga"]["by_task"]["kv"]["cumulative"]
    # retrieval collapses within the scan's first few heads while knowledge holds
    assert min(row["kv"] for row in hyb if row["k"] <= 4) <= 0.30, hyb
    assert all(abs(row["knowledge"] - hyb[0]["knowledge"]) <= 0.05 for row in hyb if row["k"] <= 4), hyb
