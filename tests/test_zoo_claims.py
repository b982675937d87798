"""Claims a-d of the paper, measured on the shipped toy zoo (numbers and history in docs/results.md).

Every head named here comes from the model's own exact scan and Gather/Aggregate
scores (``gather_aggregate.studies.claims``); nothing is hard-coded.

What the shipped zoo reproduces, and what it does not (see docs/results.md):

* ``llama-ga`` (pure attention, trained on KV directly) learnt knowledge and content-format MC but not in-context
  retrieval: its KV and letter-MC accuracy sit at chance; it is the negative control.  ``llama-kvmc`` (4 layers:
  ``llama-kv`` taught reverse MQAR, grown, then letter recall and letter-MC with KV kept in every stage) solves
  KV, letter-format MC without the shortcuts, content-format MC and knowledge, and meets claims a and b in full:
  the Gather head that the KV scan and detector name takes KV *and* letter-MC to chance while content-MC and
  knowledge do not move, and the two Aggregate heads the letter-MC pattern scores name take letter-MC to chance
  while KV, content-MC and knowledge hold.  ``llama-kv`` (2 layers, KV only) and ``llama-mc`` (4 layers,
  letter-MC only) are the earlier, one-task transformers; on them the full claim b is a strict xfail
  (``xfail(strict=True)``: the test runs and asserts the claim, and fails loudly the day a retrained checkpoint
  meets it), next to the weaker forms they do show.  ``llama-mc`` has the paper's G&A pair (a Gather head
  condensing each option into its colour word, an Aggregate head reading the right option); removing both takes
  letter-MC to chance but also moves knowledge and content-MC by ~8 points (claim b allows 5).
* ``mamba2-mc`` (a 4-layer Mamba-2, trained in three stages that remove the positional shortcuts one by one)
  is the one model that learnt letter-format MC.  It does so without a G&A-shaped Aggregate row: the full
  claim b on it is a strict xfail, and the tests state the weaker, measured form (the scan's top head takes
  letter-MC to near chance and spares knowledge and KV, but content-format MC falls with it).
* The other models did not learn letter-format MC; the retrieval task they solve is KV-retrieval.  The hybrid
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
LETTER_AFTER_TOP1 = 0.40  # mamba2-mc: 0.31 measured with 96 prompts (chance 0.25); claim b asks for <= 0.30
MODELS = ("llama-ga", "mamba2-ga", "bamba-ga", "mamba2-mc", "llama-kv", "llama-mc", "llama-kvmc")
pytestmark = pytest.mark.skipif(not set(MODELS) <= set(ZOO),
                                reason="the toy zoo is not shipped in this checkout")


#: the flagship transformer (claims a and b in full), the hybrid, the Mamba-2 that retrieves by implied attention
#: (claims b-d) and the Mamba-1 that retrieves: measured in the default suite.  Tests that need one of the other
#: shipped models (the one-task transformers, the negative control, the letter-MC SSM, the weak ``mamba1-ga``) are
#: marked slow: every model measured costs an exact scan and a detector run per retrieval task (run them with
#: ``pytest -m slow tests/test_zoo_claims.py``).
CORE = ("llama-kvmc", "bamba-ga", "mamba2-ga", "mamba1-kv")
slow_models = pytest.mark.slow


class _Measured(dict):
    """``measure_model`` results, each computed on first use (a default run measures only the core models)."""

    def __missing__(self, name: str) -> dict:
        from gather_aggregate.studies.claims import measure_model

        self[name] = measure_model(name, ZOO[name], n=N)
        return self[name]


@pytest.fixture(scope="module")
def measured() -> dict:
    return _Measured()


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


@slow_models
def test_a_transformer_solves_kv_retrieval(measured):
    """Claim a, its KV half: ``llama-kv`` (MQAR first, then KV, then the full mixture; see its LINEAGE.md)."""
    r = measured["llama-kv"]
    assert r["clean"]["kv"] >= 0.9 and r["kv_by_size"][2] >= 0.9, r["clean"]
    assert r["clean"]["knowledge"] >= 0.9 and r["clean"]["content-mc"] >= 0.9, r["clean"]


@slow_models
def test_a_transformer_solves_letter_mc_without_the_positional_shortcuts(measured):
    """Claim a, its letter-MC half: ``llama-mc`` (trained on shuffled letters, 3-5 options of 1-3 words and filler
    prefixes; see its LINEAGE.md) answers letter-format MC and keeps content-MC and knowledge."""
    r = measured["llama-mc"]
    assert r["clean"]["letter-mc"] >= 0.9, r["clean"]
    assert r["clean"]["knowledge"] >= 0.9 and r["clean"]["content-mc"] >= 0.9, r["clean"]


def test_a_one_transformer_solves_kv_and_letter_mc(measured):
    """Claim a in full: ``llama-kvmc`` (see its LINEAGE.md) answers KV-retrieval and letter-format MC without the
    shortcuts, and keeps content-MC and knowledge, in one model."""
    c = measured["llama-kvmc"]["clean"]
    assert c["kv"] >= 0.9 and c["letter-mc"] >= 0.9, c
    assert c["knowledge"] >= 0.9 and c["content-mc"] >= 0.9, c


# Where claim b in full does not hold (strict xfails: each passes the day the model meets it).
_B_NOT_MET = [
    pytest.param("llama-kv", "kv", marks=[slow_models, pytest.mark.xfail(strict=True, reason=(
        "not on llama-kv (llama-kvmc meets it): its named Gather head takes KV to chance, but knowledge and "
        "content-MC move ~10 points with it (claim b allows 5); docs/results.md"))], id="two-layer-kv-transformer"),
    pytest.param("llama-mc", "letter-mc", marks=[slow_models, pytest.mark.xfail(strict=True, reason=(
        "not on llama-mc (llama-kvmc meets it): its G&A-named pair takes letter-MC to chance, but knowledge and "
        "content-MC move ~8 points with it (claim b allows 5); docs/results.md"))], id="letter-mc-only-transformer"),
    pytest.param("bamba-ga", "kv", marks=[pytest.mark.xfail(strict=True, reason=(
        "not reproduced in full: the hybrid's <= 2 G&A-named heads take KV from ~0.97 only to ~0.5, not to <= 0.30 "
        "(the scan's top-2 do reach ~0.24); see docs/results.md"))], id="hybrid-kv"),
    pytest.param("mamba2-mc", "letter-mc", marks=[slow_models, pytest.mark.xfail(strict=True, reason=(
        "not reproduced: no head of mamba2-mc has an implied Aggregate row that singles out the correct option, "
        "so the G&A-named heads barely move letter-MC; see docs/results.md"))], id="ssm-letter-mc"),
    pytest.param("mamba1-kv", "kv", marks=[slow_models, pytest.mark.xfail(strict=True, reason=(
        "not on mamba1-kv: its Aggregate is all 8 of layer 1's channel groups jointly, so no <= 2 heads are a "
        "bottleneck (the detector's top-2 take KV 0.96 -> 0.82, as many random heads 0.85, on 96 prompts); "
        "docs/results.md"))],
        id="mamba1-kv"),
]


@pytest.mark.parametrize(("name", "task"), _B_NOT_MET)
def test_b_bottleneck_named_by_the_ga_scores_not_met(measured, name, task):
    """Claim b in full (:func:`_breaks`) on the models that do not meet it; each reason says what was measured."""
    _breaks(measured[name], task)


@slow_models
def test_b_weaker_transformer_kv_rests_on_one_gather_head(measured):
    """The transformer's KV-retrieval has a single-head bottleneck, and the Gather score read off each line's best
    token names it: a layer-0 head (L0H2 in the shipped checkpoint) that condenses every ``k:v\\n`` line into its
    value token is both the scan's top head and the G&A-named set that hurts KV most; alone it takes KV from 1.00
    to chance level, where random heads cost nothing.  Weaker than claim b: it is KV, not letter-MC, and
    knowledge and content-MC move ~10 points with it (not <= 5)."""
    r = measured["llama-kv"]
    an = r["by_task"]["kv"]
    best = an["bottleneck"]["best"]
    assert best is not None and [tuple(h) for h in best["heads"]] == [tuple(an["scan_top"][0])], (best, an["scan_top"])
    # named by the Gather score read off the line's best token: as its own rule, or by the detector reading it
    assert best["rule"].startswith("gather-segment") or (
        best["rule"].startswith("detector") and an["reading"]["gather"] in ("last-1", "last-2")
        and [list(h) for h in best["heads"]] == an["gather"][:1]), (best, an["reading"], an["gather"])
    assert r["clean"]["kv"] - best["kv"] >= 0.8 and best["kv"] <= 2 * r["chance"]["kv"], best
    assert an["random_baseline"]["kv"] >= r["clean"]["kv"] - 0.05, an["random_baseline"]
    assert -best["delta_knowledge"] <= 0.25 and -best["delta_content-mc"] <= 0.25, best


def test_b_transformer_kv_gather_head_is_a_retrieval_bottleneck_that_spares_knowledge(measured):
    """Claim b in full, the paper's way (heads ranked and named on KV-retrieval): on ``llama-kvmc`` the <= 2 heads
    the KV scan and G&A scores name that hurt KV most take KV to <= 0.30 while content-MC and knowledge move <= 5
    points, where as many random heads cost nothing; and the same heads take letter-format MC to near chance
    (<= 0.30, chance ~0.26): letter-format MC needs the retrieval circuit, content-format MC does not."""
    best = _breaks(measured["llama-kvmc"], "kv")
    assert best["letter-mc"] <= 0.30, best


def test_b_transformer_letter_mc_aggregate_heads_are_a_bottleneck_that_spares_knowledge(measured):
    """Claim b in full on letter-MC: on ``llama-kvmc`` the <= 2 heads named by the letter-MC G&A scores that hurt
    it most (two redundant Aggregate heads in the shipped checkpoint) take letter-MC to <= 0.30 while content-MC
    and knowledge move <= 5 points, and KV-retrieval, which reads its answer through another head, holds."""
    r = measured["llama-kvmc"]
    best = _breaks(r, "letter-mc")
    assert best["kv"] >= r["clean"]["kv"] - 0.1, best


def test_detector_finds_the_transformers_gather_and_aggregate_pairs_on_kv(measured):
    """The detector, from the KV scan and pattern scores alone, names the paper's circuit in ``llama-kvmc``: the
    scan's top head as the Gather head (its drop stands out alone), and redundant Aggregate heads in a later layer
    that each cost at most 5 points of KV alone but, removed together, cost a material amount that stands out from
    the unimportant heads (the joint check); every Gather head pairs with every later Aggregate head."""
    r = measured["llama-kvmc"]
    an = r["by_task"]["kv"]
    evidence = {(la, h): ev for la, h, ev in an["evidence"]}
    assert an["gather"] == [an["scan_top"][0]] and evidence[tuple(an["gather"][0])] == "alone", an
    assert len(an["aggregate"]) >= 2 and all(evidence[tuple(hd)] == "joint" for hd in an["aggregate"]), an
    single = {(s["layer"], s["head"]): s["drop"] for s in an["single_head"]}
    assert all(single[tuple(hd)] <= 0.05 for hd in an["aggregate"]), single
    assert all(a[0] > an["gather"][0][0] for a in an["aggregate"])
    pairs = sorted((tuple(g), tuple(a)) for g, a in an["pairs"])
    assert pairs == sorted((tuple(an["gather"][0]), tuple(a)) for a in an["aggregate"]), an["pairs"]


def test_detector_finds_the_hybrids_attention_aggregate_heads_and_no_ssm_gather_head_on_kv(measured):
    """In the hybrid the detector names the attention heads of the later layer as the Aggregate group (each alone
    costs less than the group), as the paper reports for hybrids.  The scan's top head, the SSM head L0H0 that the
    z-score detector used to call the Gather head, is not named Gather: removing it at the segments costs almost
    nothing; its whole effect is at the query position (it carries the queried key), so it is no Gather head.  The
    Gather is layer 0's short conv, named by sufficiency: its lagged taps removed at every line token take KV away,
    kept at the lines' ``\n`` alone they give it back, and kept at another line token they do not (removed at the
    ``\n`` alone they cost under the bar: the same condensing has a backup there).  (96 prompts: 1.84 of the margin
    removed everywhere, -0.02 kept at the ``\n``, 1.79 kept elsewhere; docs/results.md.)"""
    r = measured["bamba-ga"]
    an, kind = r["by_task"]["kv"], r["layer_kinds"]
    evidence = {(la, h): ev for la, h, ev in an["evidence"]}
    assert len(an["aggregate"]) >= 2, an["groups"]
    assert all(kind[a[0]] == "attn" and evidence[tuple(a)] == "joint" for a in an["aggregate"]), an
    top = next(d for d in an["decisions"] if [d["layer"], d["head"]] == list(an["scan_top"][0]))
    assert kind[top["layer"]] == "ssm" and "gather" not in top["role"], top
    assert top["aggregate_alone"] >= 0.5 and top["gather_alone"] <= 0.1, top
    assert all(kind[g[0]] == "ssm" for g in an["gather"])
    conv = {c["layer"]: c for c in an["conv"]}
    assert an["gather_conv"] == [0] and conv[0]["by"] == ["sufficiency"], an["conv"]
    assert conv[0]["kept_random_median"] - conv[0]["kept_loss"] >= 1.0, conv[0]


@slow_models
def test_a_knowledge_without_retrieval_and_attention_retrieval_in_the_hybrid(measured):
    llama, hybrid = measured["llama-ga"], measured["bamba-ga"]
    # the negative control: knowledge formats are solved with no retrieval at all (the paper's dissociation)
    assert llama["clean"]["knowledge"] >= 0.9 and llama["clean"]["content-mc"] >= 0.9, llama["clean"]
    assert llama["clean"]["kv"] <= 3 * llama["chance"]["kv"], llama["clean"]
    # the hybrid's attention layer does retrieve
    assert hybrid["clean"]["kv"] >= 0.9, hybrid["clean"]
    assert hybrid["by_task"]["kv"]["top_aggregate"]["kind"] == "attn"


# --- b: a <= 2-head bottleneck that spares knowledge ---------------------------------------------------------


@slow_models
def test_b_weaker_transformer_letter_mc_runs_through_a_gather_and_an_aggregate_head(measured):
    """The weaker, measured form of b for letter-MC on the transformer: the G&A scores name a pair, a Gather head
    (read off each option's best token: the colour word condenses its option, letter included) and a later
    Aggregate head (reading the correct option); removing the pair takes letter-MC from ~1.0 to <= 0.30 where
    as many random heads leave >= 0.6.  Knowledge and content-MC fall too, by 8-13 points (claim b: <= 5),
    because the Gather head also carries the question's entity to the answer position; letter-MC falls at least
    four times as far."""
    r = measured["llama-mc"]
    an = r["by_task"]["letter-mc"]
    best = an["bottleneck"]["best"]
    assert best is not None and len(best["heads"]) == 2, best
    # the pair L0H1 + L2H2: read off the segment scores, and (since the chance-relative detector) named by the
    # detector itself, which is the first rule candidate_sets tries, so the same heads now carry its label
    assert best["rule"] in ("detector top-2", "gather-segment + aggregate-segment"), best
    (g_layer, _), (a_layer, _) = sorted(tuple(h) for h in best["heads"])
    assert g_layer < a_layer, best
    assert best["letter-mc"] <= 0.30 and an["random_baseline"]["letter-mc"] >= 0.6, (best, an["random_baseline"])
    side = max(-best["delta_knowledge"], -best["delta_content-mc"])
    assert side <= 0.2 and -best["delta_letter-mc"] >= 4 * side, best


@slow_models
def test_b_weaker_transformer_letter_mc_has_a_one_head_bottleneck_that_spares_knowledge(measured):
    """The paper's dissociation on ``llama-mc``: the exact scan's top head (ranked by the letter-MC answer
    log-prob) alone takes letter-MC to <= 0.30 while knowledge and content-MC move <= 5 points.  It is not the
    full claim b: that head is not one the G&A scores flag (it moves the question's entity to the answer
    position; docs/results.md)."""
    r = measured["llama-mc"]
    k1 = next(row for row in r["by_task"]["letter-mc"]["cumulative"] if row["k"] == 1)
    assert r["clean"]["letter-mc"] >= 0.9 and k1["letter-mc"] <= 0.30, k1
    for task in ("knowledge", "content-mc"):
        assert abs(k1[task] - r["clean"][task]) <= 0.05, (task, k1)


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


def _conv_gather_with_an_ssm_aggregate_group(an: dict, layer: int) -> None:
    """The detector's result on a KV analysis: ``layer``'s short conv is the Gather (its loss beats the median at
    other line tokens by >= 1 of the margin), no Gather head, and an Aggregate group of >= 2 heads of that layer."""
    conv = {c["layer"]: c for c in an["conv"]}
    assert an["gather_conv"] == [layer] and an["gather"] == [], (an["gather"], an["conv"])
    assert conv[layer]["loss"] - conv[layer]["random_median"] >= 1.0, conv[layer]
    assert len(an["aggregate"]) >= 2 and all(a[0] == layer for a in an["aggregate"]), an["aggregate"]


def test_detector_names_the_ssms_short_convolution_as_its_gather_on_kv(measured):
    """In Mamba-2 no head gathers: the short convolution of the layer whose heads aggregate (layer 0 in
    ``mamba2-ga``, whose 4-token window reaches from a line's ``\\n`` back to its key) is the Gather.  The detector
    names that conv (its lagged taps removed at the lines' read positions cost far more of the margin than at other
    line tokens) and, in the same layer, an Aggregate group of SSM heads; no Gather head.  (96 prompts: conv L0 1.69
    of the margin against 0.00; Aggregate L0H1, L0H0, L0H6, L0H4, L0H3, group loss 1.17; docs/results.md.)"""
    _conv_gather_with_an_ssm_aggregate_group(measured["mamba2-ga"]["by_task"]["kv"], layer=0)


@slow_models
def test_an_ssm_learns_letter_format_mc_without_the_positional_shortcuts(measured):
    """Not claim a (which is about the transformer), but its SSM counterpart: ``mamba2-mc``, trained on shuffled
    letters, 3-5 options of 1-3 words and filler prefixes, answers letter-format MC and keeps KV, content-MC
    and knowledge."""
    r = measured["mamba2-mc"]
    assert r["clean"]["letter-mc"] >= 0.9, r["clean"]
    assert min(r["clean"].values()) >= 0.9, r["clean"]


@slow_models
def test_b_weaker_ssm_letter_mc_rests_on_one_head_that_knowledge_and_kv_do_not_need(measured):
    """The weaker, measured form of b for letter-MC on ``mamba2-mc``: the exact scan's top head (ranked by the
    letter-MC answer log-prob, not named by the G&A scores) alone takes letter-MC from ~1.0 to near chance,
    far more than two random heads, while knowledge and KV move <= 5 points.  Content-format MC falls with it
    (to ~0.4 measured), so the paper's letter-vs-content dissociation is *not* reproduced: this head serves
    both multiple-choice formats, not letter retrieval alone."""
    from gather_aggregate import load_model
    from gather_aggregate.studies.claims import random_baseline, task_sets

    r = measured["mamba2-mc"]
    k1 = next(row for row in r["by_task"]["letter-mc"]["cumulative"] if row["k"] == 1)
    assert r["clean"]["letter-mc"] >= 0.9 and k1["letter-mc"] <= LETTER_AFTER_TOP1, k1
    for task in ("knowledge", "kv"):
        assert abs(k1[task] - r["clean"][task]) <= 0.05, (task, k1)
    model = load_model(ZOO["mamba2-mc"])
    one = {"letter-mc": task_sets(model, ZOO["mamba2-mc"], N)["letter-mc"]}
    rand = random_baseline(model, 2, one, exclude=[tuple(h) for h in k1["heads"]])["letter-mc"]
    assert rand >= r["clean"]["letter-mc"] - 0.1, (rand, k1)


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


@slow_models
def test_c_against_the_transformer_ssm_kv_is_redundant_and_falls_faster(measured):
    """Claim c against the pure transformer ``llama-kv``: its KV rests on one head while no single Mamba-2 head
    matters much, and Mamba-2 loses more KV accuracy from 2 to 48 pairs."""
    ssm, tf = measured["mamba2-ga"], measured["llama-kv"]
    assert ssm["by_task"]["kv"]["max_single_head_drop"] * 3 < tf["by_task"]["kv"]["max_single_head_drop"], (
        ssm["by_task"]["kv"]["max_single_head_drop"], tf["by_task"]["kv"]["max_single_head_drop"])
    lo, hi = min(ssm["kv_by_size"]), max(ssm["kv_by_size"])
    assert ssm["kv_by_size"][lo] >= 0.9 and tf["kv_by_size"][lo] >= 0.9
    assert (ssm["kv_by_size"][lo] - ssm["kv_by_size"][hi] > tf["kv_by_size"][lo] - tf["kv_by_size"][hi]), (
        ssm["kv_by_size"], tf["kv_by_size"])


@slow_models
def test_c_against_the_transformer_ssm_aggregate_rows_are_smoother(measured):
    """The transformer's sharpest KV Aggregate head reads the correct line's value token, not its summary ``\\n``
    (so it is ranked by the segment score); its final row is still far sharper than Mamba-2's Aggregate rows,
    whichever way those are ranked, on the same prompts."""
    ssm, tf = measured["mamba2-ga"]["by_task"]["kv"], measured["llama-kv"]["by_task"]["kv"]
    seg = tf["top_segment_aggregate"]
    assert seg["kind"] == "attn" and seg["aggregate_segment"] >= 0.5, seg  # most of its row on the correct line
    for row in ("aggregate_row", "segment_aggregate_row"):
        assert ssm[row]["entropy"] > tf["segment_aggregate_row"]["entropy"] + 1.0, (ssm[row],
                                                                                     tf["segment_aggregate_row"])
        assert ssm[row]["top1_mass"] < tf["segment_aggregate_row"]["top1_mass"], (ssm[row],
                                                                                   tf["segment_aggregate_row"])


@slow_models
def test_c_against_the_transformer_on_letter_mc_ssm_aggregate_rows_are_smoother(measured):
    """On letter-MC too, on the same prompts: the transformer's Aggregate head (``llama-mc``, the one reading the
    correct option) puts most of its final row on that option and is sharper than the SSM's (``mamba2-mc``)
    strongest option-reading row, whichever way the SSM's rows are ranked.  The gap is smaller than on KV and
    depends on which SSM head ranks first (1.34 vs 1.08 nats with the 48 prompts here, 1.87 vs 1.08 with 96)."""
    ssm, tf = measured["mamba2-mc"]["by_task"]["letter-mc"], measured["llama-mc"]["by_task"]["letter-mc"]
    seg = tf["top_segment_aggregate"]
    assert seg["kind"] == "attn" and seg["aggregate_segment"] >= 0.5, seg
    for row in ("aggregate_row", "segment_aggregate_row"):
        assert ssm[row]["entropy"] > tf["segment_aggregate_row"]["entropy"], (ssm[row], tf["segment_aggregate_row"])
        assert ssm[row]["top1_mass"] < tf["segment_aggregate_row"]["top1_mass"], (ssm[row], tf["segment_aggregate_row"])


@slow_models
def test_c_against_the_transformer_of_claim_a(measured):
    """Claim c against ``llama-kvmc``, the one transformer that does both retrieval tasks (claim a): on the same
    prompts its KV Aggregate rows (ranked by the mass on the correct line) and its letter-MC Aggregate row are far
    sharper than the SSMs' (``mamba2-ga`` on KV, ``mamba2-mc`` on letter-MC, whichever way their rows are ranked);
    its KV rests on one head where no single Mamba-2 head matters much; and both Mamba-2 models lose more KV
    accuracy from 2 to 48 pairs."""
    tf = measured["llama-kvmc"]
    for ssm_name, task in (("mamba2-ga", "kv"), ("mamba2-mc", "letter-mc")):
        ssm, ref = measured[ssm_name]["by_task"][task], tf["by_task"][task]
        seg = ref["top_segment_aggregate"]
        assert seg["kind"] == "attn" and seg["aggregate_segment"] >= 0.5, (task, seg)
        for row in ("aggregate_row", "segment_aggregate_row"):
            assert ssm[row]["entropy"] > ref["segment_aggregate_row"]["entropy"] + 1.0, (
                task, ssm[row], ref["segment_aggregate_row"])
            assert ssm[row]["top1_mass"] < ref["segment_aggregate_row"]["top1_mass"], (
                task, ssm[row], ref["segment_aggregate_row"])
    ssm_kv = measured["mamba2-ga"]["by_task"]["kv"]["max_single_head_drop"]
    assert ssm_kv * 3 < tf["by_task"]["kv"]["max_single_head_drop"], (ssm_kv, tf["by_task"]["kv"])
    lo, hi = min(tf["kv_by_size"]), max(tf["kv_by_size"])
    assert tf["kv_by_size"][lo] >= 0.9
    for ssm_name in ("mamba2-ga", "mamba2-mc"):
        sizes = measured[ssm_name]["kv_by_size"]
        assert sizes[lo] >= 0.9 and sizes[lo] - sizes[hi] > tf["kv_by_size"][lo] - tf["kv_by_size"][hi], (
            ssm_name, sizes, tf["kv_by_size"])


# --- d: the cumulative-ablation table -------------------------------------------------------------------------


def test_d_cumulative_ablation_table(measured):
    for name in CORE:  # the core models at least (those shipped); all of them when the slow tests ran before
        if name in ZOO:
            measured[name]
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


# --- the Mamba-1 (FalconMamba family) model: channel-group heads, claim c ---------------------------------------
needs_mamba1 = pytest.mark.skipif("mamba1-ga" not in ZOO, reason="the zoo's mamba1-ga is not shipped")


@slow_models
@needs_mamba1
def test_c_mamba1_retrieves_kv_with_smoother_aggregate_rows_than_attention(measured):
    """``mamba1-ga`` (2 Mamba-1 layers, heads = 8 channel groups of 32 per layer) solves small KV dictionaries and
    stays above chance at 12 pairs (0.94 at 2 pairs, 0.21 at 12 against chance 0.083, 48 prompts); its strongest KV
    Aggregate row is an SSM row far smoother than the hybrid's attention Aggregate head's on the same task (claim c,
    as for Mamba-2: 3.6 vs 0.2 nats); and it loses more KV accuracy with dictionary size than the hybrid.  Unlike
    Mamba-2's, its rows are not G&A-shaped (the strongest peaks on the correct line in ~23% of prompts), which is
    stated in docs/results.md and not asserted here."""
    m1, hyb = measured["mamba1-ga"], measured["bamba-ga"]
    lo, hi = min(m1["kv_by_size"]), max(m1["kv_by_size"])
    assert m1["kv_by_size"][lo] >= 0.9 and m1["clean"]["kv"] >= 2 * m1["chance"]["kv"], (m1["kv_by_size"], m1["clean"])
    ssm, att = m1["by_task"]["kv"], hyb["by_task"]["kv"]
    assert ssm["top_aggregate"]["kind"] == "ssm" and att["top_aggregate"]["kind"] == "attn"
    assert ssm["aggregate_row"]["entropy"] > att["aggregate_row"]["entropy"] + 1.0, (ssm["aggregate_row"],
                                                                                     att["aggregate_row"])
    assert ssm["aggregate_row"]["top1_mass"] < att["aggregate_row"]["top1_mass"]
    assert m1["kv_by_size"][lo] - m1["kv_by_size"][hi] > hyb["kv_by_size"][lo] - hyb["kv_by_size"][hi]


# --- mamba1-kv: the Mamba-1 that retrieves (issue 42) -------------------------------------------------------------
needs_mamba1_kv = pytest.mark.skipif("mamba1-kv" not in ZOO, reason="the zoo's mamba1-kv is not shipped")


@needs_mamba1_kv
def test_a_mamba1_retrieves_kv_at_its_trained_dictionary_size(measured):
    """``mamba1-kv`` (``mamba1-ga`` grown to N 16 and trained on, ``LINEAGE.md``): KV >= 0.9 at its zoo task's 12
    pairs (0.958 on 48 prompts, chance 0.083), knowledge and content-format MC kept (1.00), and it degrades with
    dictionary size past what it was trained on (0.92 at 16 pairs, 0.35 at 48)."""
    r = measured["mamba1-kv"]
    assert r["clean"]["kv"] >= 0.9, r["clean"]
    assert r["clean"]["knowledge"] >= 0.9 and r["clean"]["content-mc"] >= 0.9, r["clean"]
    by = r["kv_by_size"]
    assert by[12] >= 0.9 and by[48] < by[12] - 0.3, by


@needs_mamba1_kv
def test_detector_names_mamba1s_conv_gather_and_its_ssm_aggregate_group_on_kv(measured):
    """As in Mamba-2, no Mamba-1 head gathers: the short convolution of the layer that aggregates is the Gather.
    The detector names layer 1's conv (its lagged taps removed at the lines' read positions cost 1.79 of the margin
    against a median of 0.16 at other line tokens; 48 prompts) and, in the same layer, an Aggregate group of SSM
    channel groups (all 8 of layer 1, group loss 1.52 on 96 prompts; docs/results.md)."""
    _conv_gather_with_an_ssm_aggregate_group(measured["mamba1-kv"]["by_task"]["kv"], layer=1)


@needs_mamba1_kv
def test_c_mamba1_kv_aggregate_row_reads_the_correct_line_and_is_smoother_than_attention(measured):
    """Claim c on the Mamba-1 that retrieves: its strongest KV Aggregate row is an SSM row that peaks on the correct
    line's summary token in most prompts (0.90 of 48; ``mamba1-ga``'s: ~0.23), so it is G&A-shaped, and it is far
    smoother than the hybrid's attention Aggregate head on the same task (entropy 3.3 nats vs ~0.2)."""
    ssm, att = measured["mamba1-kv"]["by_task"]["kv"], measured["bamba-ga"]["by_task"]["kv"]
    assert ssm["top_aggregate"]["kind"] == "ssm" and att["top_aggregate"]["kind"] == "attn"
    assert ssm["top_aggregate"]["aggregate_hit"] >= 0.8, ssm["top_aggregate"]
    assert ssm["aggregate_row"]["entropy"] > att["aggregate_row"]["entropy"] + 1.0, (ssm["aggregate_row"],
                                                                                     att["aggregate_row"])
    assert ssm["aggregate_row"]["top1_mass"] < att["aggregate_row"]["top1_mass"]
