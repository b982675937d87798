"""Issue 40: results handed from one step to another carry their provenance, and the receiver checks it.

Each case is a seam a new user crosses: a scan of another model, task or prompt count handed to the detector or to
head choice; a replacement built on one model used on another; a scan table edited by hand (NaN, text) read back;
a ranking without an order; a mean over one prompt.  Each asserts the refusal's class and that its one line names
the fix, or the correct value.
"""

from __future__ import annotations

import json

import pytest
import torch

from gather_aggregate.core.errors import InputError, NonFiniteError, ProvenanceError, ResumeMismatchError
from gather_aggregate.core.model_state import count_hooks, param_checksum
from gather_aggregate.core.provenance import Provenance, model_fingerprint, prompts_fingerprint
from gather_aggregate.interventions.ablation import ablation_hooks, make_replacement, run_ablated
from gather_aggregate.scan.exact import atp_scan, exact_scan, naive_scan
from gather_aggregate.scan.rankings import compare_rankings
from gather_aggregate.scan.result import ScanResult


def _one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg and "Traceback" not in msg, msg
    return msg


@pytest.fixture(scope="module")
def zoo():
    """The zoo's llama-kv, an edited copy of it (same layout, other weights), its KV prompts and their scan."""
    from gather_aggregate import load_model
    from gather_aggregate.tasks.metric import task_metric
    from gather_aggregate.tasks.registry import get_task
    from gather_aggregate.zoo import zoo_path

    path = zoo_path("llama-kv")
    model, other = load_model(path), load_model(path)
    with torch.no_grad():
        next(other.module.parameters()).mul_(0.5)  # another model of the same layout
    task = get_task("kv", model_dir=path)
    examples = task.examples(model.tokenizer, n=4, seed=0)
    tokens, metric = task_metric(model, examples)
    scan = exact_scan(model, tokens, metric, progress=False)
    return {"model": model, "other": other, "task": task, "examples": examples, "tokens": tokens, "metric": metric,
            "scan": scan}


# ---- what every scan records -------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["exact", "naive", "atp", "attribution"])
def test_every_scan_records_model_prompts_and_count(zoo, kind):
    from gather_aggregate.attribution.estimators import attribution_scan

    m, t, f = zoo["model"], zoo["tokens"], zoo["metric"]
    scan = {"exact": lambda: exact_scan(m, t, f, progress=False), "naive": lambda: naive_scan(m, t, f),
            "atp": lambda: atp_scan(m, t, f), "attribution": lambda: attribution_scan(m, t, f, estimator="atp")}[kind]()
    assert scan.provenance == Provenance(model=model_fingerprint(m), prompts=prompts_fingerprint(t), n=4,
                                         task=scan.meta.get("task"))
    scan.check_for(m, t)  # its own model and prompts: accepted


def test_the_resample_seed_is_not_the_prompts_seed(zoo):
    scan = zoo["scan"]
    assert scan.meta["ablation_seed"] == 0 and "seed" not in scan.meta  # ``seed`` is the prompts' (Provenance)


# ---- the detector --------------------------------------------------------------------------------------------
def test_detector_refuses_a_scan_of_another_model_of_the_same_layout(zoo):
    from gather_aggregate.detect.detector import find_ga_heads

    with pytest.raises(ProvenanceError, match=r"another model \(fingerprint\).*scan this model on these prompts") \
            as err:
        find_ga_heads(zoo["other"], zoo["examples"], zoo["scan"])
    _one_line(err)


@pytest.mark.parametrize("n, seed", [(4, 1), (3, 0), (6, 0)])
def test_detector_refuses_a_scan_of_other_prompts(zoo, n, seed):
    from gather_aggregate.detect.detector import find_ga_heads

    examples = zoo["task"].examples(zoo["model"].tokenizer, n=n, seed=seed)
    with pytest.raises(ProvenanceError, match=r"another prompt set.*exact_scan\(model, \*task_metric") as err:
        find_ga_heads(zoo["model"], examples, zoo["scan"])
    _one_line(err)


def test_detector_refuses_a_scan_of_a_larger_model(zoo):
    from gather_aggregate.detect.detector import find_ga_heads

    alien = ScanResult([{"layer": 5, "head": 9, "kind": "attn", "score": 1.0}], {})
    with pytest.raises(ProvenanceError, match="has head L5H9, which this model does not have.*or none"):
        find_ga_heads(zoo["model"], zoo["examples"], alien)


def test_detector_takes_its_own_scan_and_a_loaded_one(zoo, tmp_path):
    from gather_aggregate.detect.detector import check_scan

    check_scan(zoo["model"], zoo["examples"], zoo["scan"])
    zoo["scan"].save(tmp_path / "scan.json")
    check_scan(zoo["model"], zoo["examples"], ScanResult.load(tmp_path / "scan.json"))  # fingerprints survive


def test_a_table_without_provenance_is_still_taken(zoo):
    """Scans written before provenance was recorded have no fingerprints: nothing to compare, so accepted."""
    from gather_aggregate.detect.detector import check_scan

    check_scan(zoo["model"], zoo["examples"], ScanResult([dict(r) for r in zoo["scan"].rows], {"mode": "exact"}))


# ---- head choice -------------------------------------------------------------------------------------------------
def test_choose_heads_refuses_another_models_scan(zoo):
    from gather_aggregate.studies.hybrids.choose import choose_heads

    with pytest.raises(ProvenanceError, match="another model .*or pass scan=None") as err:
        choose_heads(zoo["other"], zoo["examples"], 2, "scan", scan=zoo["scan"])
    _one_line(err)


def test_choose_heads_refuses_a_scan_with_a_head_the_model_lacks(zoo):
    from gather_aggregate.studies.hybrids.choose import choose_heads

    rows = [dict(r) for r in zoo["scan"].rows] + [{"layer": 2, "head": 0, "kind": "attn", "score": 9.0}]
    with pytest.raises(ProvenanceError, match="scan has head L2H0, which this model does not have"):
        choose_heads(zoo["model"], zoo["examples"], 1, "scan", scan=ScanResult(rows, {}))  # returned L2H0


def test_choose_heads_takes_the_right_scan(zoo):
    from gather_aggregate.studies.hybrids.choose import choose_heads

    assert choose_heads(zoo["model"], zoo["examples"], 2, "scan", scan=zoo["scan"]) == zoo["scan"].top(2)


def test_choose_heads_refuses_a_scan_without_an_order(zoo):
    from gather_aggregate.studies.hybrids.choose import choose_heads

    flat = ScanResult([dict(r, score=0.0) for r in zoo["scan"].rows], dict(zoo["scan"].meta))
    with pytest.raises(InputError, match="ranks nothing: all 8 heads score 0.*rescan with method='zero'"):
        choose_heads(zoo["model"], zoo["examples"], 2, "bottom", scan=flat)


def test_choose_heads_refuses_a_partial_scan(zoo):
    from gather_aggregate.studies.hybrids.choose import choose_heads

    part = ScanResult([dict(r) for r in zoo["scan"].rows[:5]], dict(zoo["scan"].meta))
    with pytest.raises(InputError, match=r"scan has no row for L\d+H\d+ \(3 of the model's heads unscanned\); scan "
                                         r"every head"):
        choose_heads(zoo["model"], zoo["examples"], 2, "bottom", scan=part)


def test_choose_heads_refuses_what_is_not_a_scan(zoo):
    from gather_aggregate.studies.hybrids.choose import choose_heads

    with pytest.raises(InputError, match="scan must be a ScanResult"):
        choose_heads(zoo["model"], zoo["examples"], 2, "scan", scan={"rows": []})


# ---- replacements ------------------------------------------------------------------------------------------------
def test_a_replacement_of_one_model_is_refused_on_another(zoo):
    a, b, t = zoo["model"], zoo["other"], zoo["tokens"]
    rep = make_replacement(a, [(0, 1)], "mean", t)
    before = param_checksum(b)
    with pytest.raises(ProvenanceError, match=r"this replacement was made with another model .*make_replacement\("
                                              r"model, heads, method, reference\)") as err:
        ablation_hooks(b, [(0, 1)], rep)
    _one_line(err)
    assert count_hooks(b) == 0 and param_checksum(b) == before  # nothing attached, nothing changed


def test_a_replacement_for_other_layers_is_refused(zoo):
    rep = make_replacement(zoo["model"], [(0, 1)], "mean", zoo["tokens"])
    with pytest.raises(InputError, match=r"no reference values for layer 1 \(it was built for layers \[0\]\); build "
                                         r"it on this model"):
        ablation_hooks(zoo["model"], [(1, 0)], rep)


def test_a_replacement_on_its_own_model_ablates_as_run_ablated(zoo):
    m, t = zoo["model"], zoo["tokens"]
    rep = make_replacement(m, [(0, 1)], "mean", t)
    with torch.no_grad():
        hooked = m.run_with_hooks(t, fwd_hooks=ablation_hooks(m, [(0, 1)], rep))
    assert torch.equal(hooked, run_ablated(m, t, [(0, 1)], "mean", t))
    assert count_hooks(m) == 0


def test_zero_ablation_needs_no_model_of_its_own(zoo):
    rep = make_replacement(zoo["model"], [(0, 1)], "zero")
    assert rep.provenance is None and len(ablation_hooks(zoo["other"], [(0, 1)], rep)) == 1


# ---- one-prompt baselines --------------------------------------------------------------------------------------
def test_a_per_position_mean_over_one_prompt_is_refused(zoo):
    m, t = zoo["model"], zoo["tokens"]
    with pytest.raises(InputError, match="a mean over one reference prompt .*pass two or more different reference prompts") \
            as err:
        exact_scan(m, t[:1], lambda x: x[:, -1].log_softmax(-1)[:, 0].mean(), method="mean", reference=t[:1],
                   progress=False)
    _one_line(err)


@pytest.mark.parametrize("method", ["mean", "resample"])
def test_copies_of_one_prompt_are_one_prompt(zoo, method):
    t = zoo["tokens"][:1].repeat(3, 1)
    with pytest.raises(InputError, match="copies of one prompt .*two or more different"):
        exact_scan(zoo["model"], t, lambda x: x[:, -1].log_softmax(-1)[:, 0].mean(), method=method, reference=t,
                   progress=False)


def test_a_position_agnostic_mean_over_one_prompt_still_ablates(zoo):
    m, t = zoo["model"], zoo["tokens"]
    scan = exact_scan(m, t, zoo["metric"], method="mean", reference=t[:1], per_position=False, progress=False)
    assert any(abs(s) > 1e-4 for s in scan.scores().values())  # not the no-op of a per-position mean


def test_resample_with_its_own_prompt_is_refused(zoo):
    t = zoo["tokens"][:1]
    with pytest.raises(InputError, match="pass at least two prompts"):
        exact_scan(zoo["model"], t, lambda x: x[:, -1].log_softmax(-1)[:, 0].mean(), method="resample", reference=t,
                   progress=False)


# ---- tables read back from disk ----------------------------------------------------------------------------------
@pytest.mark.parametrize("field, value, needle", [
    ("score", float("nan"), "score is nan, not finite"),
    ("score", float("inf"), "score is inf, not finite"),
    ("score", "0.5", "score is '0.5', not a number"),
    ("score", True, "score is True, not a number"),
    ("stderr", "big", "stderr is 'big', not a number"),
    ("layer", "1", "layer is '1', not an index"),
])
def test_resume_refuses_a_hand_edited_row(zoo, tmp_path, field, value, needle):
    m, t, f = zoo["model"], zoo["tokens"], zoo["metric"]
    out = tmp_path / "scan.json"
    exact_scan(m, t, f, out=out, progress=False)
    data = json.loads(out.read_text())
    data["rows"][2][field] = value
    out.write_text(json.dumps(data))  # json writes NaN / Infinity, as a hand edit would
    with pytest.raises(ResumeMismatchError, match=f"{needle}.*use another --out or drop --resume") as err:
        exact_scan(m, t, f, out=out, resume=True, progress=False)
    _one_line(err)
    with pytest.raises(InputError, match=f"{needle}.*rerun the scan"):
        ScanResult.load(out)


def test_a_duplicated_row_is_refused():
    rows = [{"layer": 0, "head": 1, "score": 0.5}, {"layer": 1, "head": 0, "score": 0.2},
            {"layer": 0, "head": 1, "score": 0.1}]
    with pytest.raises(InputError, match=r"row 2 \(L0H1\) repeats row 0"):
        ScanResult(rows)


def test_a_nan_score_in_memory_is_a_non_finite_error():
    with pytest.raises(NonFiniteError, match=r"row 0 \(L0H1\)'s score is nan"):
        ScanResult([{"layer": 0, "head": 1, "score": float("nan")}])


def test_resume_of_an_intact_table_gives_the_same_numbers(zoo, tmp_path):
    m, t, f = zoo["model"], zoo["tokens"], zoo["metric"]
    out = tmp_path / "scan.json"
    full = exact_scan(m, t, f, out=out, progress=False)
    assert exact_scan(m, t, f, out=out, resume=True, progress=False).scores() == full.scores()


# ---- rankings ----------------------------------------------------------------------------------------------------
def test_compare_rankings_refuses_a_scan_without_an_order(zoo):
    flat = ScanResult([dict(r, score=0.25) for r in zoo["scan"].rows], {})
    with pytest.raises(InputError, match="b ranks nothing: all 8 heads score 0.25"):
        compare_rankings(zoo["scan"], flat)


def test_lm_eval_ranking_orders_by_score_and_refuses_what_has_no_order(zoo, tmp_path):
    from gather_aggregate.lm_eval.schedule import load_ranking

    scan = zoo["scan"]
    stale = {"meta": scan.meta, "rows": [dict(r, rank=9 - r["rank"]) for r in scan.rows]}  # ranks edited by hand
    (tmp_path / "stale.json").write_text(json.dumps(stale))
    heads, made = load_ranking(str(tmp_path / "stale.json"))
    assert heads == scan.top(8) and made.model == scan.meta["model"]
    (tmp_path / "flat.json").write_text(json.dumps({"rows": [{"layer": 0, "head": h} for h in range(4)]}))
    with pytest.raises(InputError, match="neither scores nor distinct whole-number ranks"):
        load_ranking(str(tmp_path / "flat.json"))
    nan = {"meta": {}, "rows": [dict(r) for r in scan.rows]}
    nan["rows"][0]["score"] = float("nan")
    (tmp_path / "nan.json").write_text(json.dumps(nan))
    with pytest.raises(InputError, match="not a usable ranking .*not finite.*rerun `gather-aggregate scan`"):
        load_ranking(str(tmp_path / "nan.json"))


# ---- cached activations and rankings handed to other steps ------------------------------------------------------
def test_a_cache_of_another_model_is_refused_by_pattern(zoo):
    m, other, t = zoo["model"], zoo["other"], zoo["tokens"][:1]
    _, theirs = other.run_with_cache(t)
    with pytest.raises(ProvenanceError, match="ActivationCache was made by another model .*pass tokens, or the cache "
                                              "of this model's run_with_cache") as err:
        m.pattern(theirs, 0)
    _one_line(err)
    _, own = m.run_with_cache(t)
    assert torch.allclose(m.pattern(own, 0), m.pattern(t, 0))  # its own cache gives the pattern of the tokens


def test_cumulative_ablation_refuses_another_models_ranking(zoo):
    from gather_aggregate.studies.ablation_tables import cumulative_ablation

    with pytest.raises(ProvenanceError, match="ranking was made with another model .*rank this model's heads"):
        cumulative_ablation(zoo["other"], zoo["scan"], {"kv": zoo["examples"]}, ks=(0, 1))
    rows = cumulative_ablation(zoo["model"], zoo["scan"], {"kv": zoo["examples"]}, ks=(0, 1))
    assert [r["k"] for r in rows] == [0, 1] and rows[1]["heads"] == [list(zoo["scan"].top(1)[0])]


def test_the_detector_writes_no_nan_for_heads_a_partial_scan_left_out(zoo):
    from gather_aggregate.detect.detector import find_ga_heads

    part = ScanResult([dict(r) for r in zoo["scan"].ranked().rows[:6]], dict(zoo["scan"].meta))
    ga = find_ga_heads(zoo["model"], zoo["examples"], part)
    drops = {(r["layer"], r["head"]): r["ablation_drop"] for r in ga.table}
    assert sum(v is None for v in drops.values()) == 2  # was NaN, written into detect.json
    assert all(drops[hd] == s for hd, s in part.scores().items())


def test_the_fingerprint_sum_does_not_depend_on_the_reduction_order():
    """A float32 sum rounded to 4 decimals changed with the reduction order (5 of 200 random 1M-entry tensors
    between two orders), so a scan made on a GPU was refused on a CPU; the sum is float64 now."""
    from gather_aggregate.core.provenance import _sample_parameters

    class Seen:
        def __init__(self):
            self.parts = []

        def update(self, b):
            self.parts.append(b)

    module = torch.nn.Linear(6, 1, bias=False)
    with torch.no_grad():
        module.weight.copy_(torch.tensor([[16777216.0, 1.0, 1.0, 1.0, 1.0, -16777216.0]]))
    seen = Seen()
    _sample_parameters(seen, module)
    assert seen.parts[-1] == repr(4.0).encode()  # the exact sum, in any order
