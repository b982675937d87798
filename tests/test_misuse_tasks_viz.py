"""A new researcher's misuses of tasks, the detector, the figures and the experiments (see ``test_misuse.py``):
each was a traceback from deep inside, a silent wrong result or a vague message before; every case was checked to
fail before its fix.
"""

from __future__ import annotations

import pytest
import torch
from error_checks import one_line as _one_line

from gather_aggregate.core.errors import InputError, TaskError
from gather_aggregate.core.model_state import count_hooks, param_checksum

PROMPT = "Keys:\napple:12\nriver:7\n\nThe value of the key 'river' is"  # segments [5, 14) and [14, 22)


# ---- prompt specs built in Python -------------------------------------------------------------------------------
@pytest.mark.parametrize("change,needle", [
    (dict(segments=[(5, 14, "a"), (14, 999, "b")]), r"segment 1 \[14, 999\) is not a non-empty span"),  # was cut
    (dict(segments=[(-5, 14, "a"), (14, 22, "b")]), r"segment 0 \[-5, 14\)"),  # counted from the end
    (dict(segments=[(5, 16, "a"), (10, 22, "b")]), "segment 1 .* overlaps segment 0"),  # shared tokens
    (dict(segments=[(5.0, 14, "a"), (14, 22, "b")]), "character offsets are ints"),  # was a TypeError in slicing
    (dict(segments=[{"start": 5, "end": 14}, (14, 22)]), "must be a .start, end. or .start, end, label. tuple"),
    (dict(candidates="12"), "candidates must be a list of answer texts"),  # was one candidate per character
    (dict(candidates=[" 12", " 7"]), "without edge spaces"),  # was scored on '  12'
    (dict(prompt=123), "prompt must be a str"),  # was the tokenizer's multi-line ValueError
    (dict(summaries=[None]), "one character index .or None. per segment, 2 in all"),  # was a zip() ValueError
])
def test_prompt_specs_are_checked_before_tokenising(llama_model, change, needle):
    import dataclasses

    from gather_aggregate.tasks.base import PromptSpec, annotate

    spec = dataclasses.replace(PromptSpec(PROMPT, [(5, 14, "a"), (14, 22, "b")], 1, ["12", "7"], 1), **change)
    with pytest.raises(TaskError, match=needle) as err:
        annotate(spec, llama_model.tokenizer)
    _one_line(err.value)


def test_a_spec_with_unlabelled_segments_and_a_model_for_a_tokenizer(llama_model):
    from gather_aggregate.tasks.base import PromptSpec, annotate

    ex = annotate(PromptSpec(PROMPT, [(5, 14), (14, 22)], 1, ("12", "7"), 1), llama_model.tokenizer)  # pairs: ok
    assert [s.label for s in ex.segments] == ["0", "1"] and ex.candidates == ["12", "7"]
    with pytest.raises(TaskError, match="a tokenizer is needed.*got BridgeModel.*model.tokenizer"):
        annotate(PromptSpec(PROMPT, [(5, 14), (14, 22)], 1, ["12", "7"], 1), llama_model)  # was an IndexError


@pytest.mark.parametrize("name,kwargs,needle", [
    ("kv", dict(n_pairs=1.5), "n_pairs=1.5: pass a whole number"),  # was a TypeError inside random.sample
    ("kv", dict(n_pairs="3"), "n_pairs='3'"),  # was "'<' not supported between 'str' and 'int'"
    ("mqar", dict(n_queries=2.5), "n_queries=2.5"),
    ("kv", dict(n_pairs=2, keys="apple"), "keys must be a list of words"),  # was the keys a, p, p, l, e
    ("mqar", dict(values="0123"), "values must be a list of words"),
])
def test_task_sizes_must_be_whole_numbers(llama_model, name, kwargs, needle):
    from gather_aggregate.tasks.registry import get_task

    with pytest.raises(TaskError, match=needle):
        get_task(name, **kwargs).examples(llama_model.tokenizer, 2)


def test_task_sizes_take_numpy_integers(llama_model):
    import numpy as np

    from gather_aggregate.tasks.registry import get_task

    a = get_task("kv", n_pairs=np.int64(3)).examples(llama_model.tokenizer, 2)
    assert [e.prompt for e in a] == [e.prompt for e in get_task("kv", n_pairs=3).examples(llama_model.tokenizer, 2)]


# ---- the detector and evaluation -------------------------------------------------------------------------------
def test_detector_layers_as_an_int_and_a_scan_of_another_model(llama_model):
    from gather_aggregate.detect.detector import find_ga_heads, pattern_scores
    from gather_aggregate.scan.exact import ScanResult
    from gather_aggregate.tasks.registry import get_task

    ex = get_task("kv", n_pairs=3).examples(llama_model.tokenizer, 2)
    assert pattern_scores(llama_model, ex, layers=1) == pattern_scores(llama_model, ex, layers=[1])  # was TypeError
    alien = ScanResult([{"layer": 5, "head": 9, "kind": "attn", "score": 1.0}], {})
    with pytest.raises(InputError, match="scan has head L5H9, which this model does not have") as err:  # was merged
        find_ga_heads(llama_model, ex, scan=alien)
    _one_line(err.value)
    with pytest.raises(InputError, match="scores has head L7H0"):
        find_ga_heads(llama_model, ex, scores=[{"layer": 7, "head": 0, "gather": 0.5}])


def test_evaluate_n_on_a_list_and_a_hook_factory_that_returns_no_hooks(llama_model):
    from gather_aggregate.tasks import evaluate
    from gather_aggregate.tasks.registry import get_task

    ex = get_task("kv", n_pairs=3).examples(llama_model.tokenizer, 4)
    assert len(evaluate(llama_model, ex, n=2, progress=False).results) == 2  # n was ignored for a list
    with pytest.raises(InputError, match="fast_single_token must be True or False"):  # "no" was true
        evaluate(llama_model, ex, fast_single_token="no", progress=False)
    with pytest.raises(InputError, match="a hook factory must return a list of .hook_name, fn. pairs, got int"):
        evaluate(llama_model, ex, fwd_hooks=lambda batch: 3, progress=False)  # was "'int' object is not iterable"
    assert count_hooks(llama_model) == 0


# ---- experiments -------------------------------------------------------------------------------------------------
def test_experiments_take_a_scan_as_a_ranking_and_one_layer_as_an_int(llama_model):
    from gather_aggregate.scan.exact import ScanResult
    from gather_aggregate.studies.ablation_tables import cumulative_ablation, skip_layer_hooks
    from gather_aggregate.tasks.registry import get_task

    ex = get_task("kv", n_pairs=3).examples(llama_model.tokenizer, 2)
    before = param_checksum(llama_model)
    scan = ScanResult([{"layer": 1, "head": h, "kind": "attn", "score": float(h)} for h in range(4)], {})
    rows = cumulative_ablation(llama_model, scan, {"kv": ex}, ks=(0, 2))  # was "heads must be a list ..." + the rows
    assert rows[1]["heads"] == [[1, 3], [1, 2]] == [list(h) for h in scan.top(2)]
    assert len(skip_layer_hooks(llama_model, 1)) == len(skip_layer_hooks(llama_model, [1]))  # was TypeError
    assert count_hooks(llama_model) == 0 and param_checksum(llama_model) == before


# ---- figures and metrics -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pattern():
    torch.manual_seed(0)
    return torch.softmax(torch.randn(4, 6, 6).masked_fill(torch.ones(6, 6).triu(1).bool(), -1e9), -1)


def test_figures_refuse_heads_rows_and_spans_they_cannot_draw(pattern):
    from gather_aggregate.viz.attention import attention_pattern
    from gather_aggregate.viz.sharpness import row_stats, sharp_vs_smooth
    from gather_aggregate.viz.tokens import token_strip

    toks = [f"t{i}" for i in range(6)]
    cases = [
        (lambda: attention_pattern(pattern, toks, head="1"), "head must be an integer"),  # was TypeError
        (lambda: attention_pattern(pattern, toks, head=1.0), "head must be an integer"),  # was TypeError in a slice
        (lambda: row_stats(pattern[0]), r"row_stats takes one row \[key\], got shape \(6, 6\)"),  # was ValueError
        (lambda: row_stats(torch.zeros(6)), "all zeros"),  # was entropy 0, sharpness 1: "perfectly sharp"
        (lambda: token_strip(toks, pattern[0]), "one number per token"),  # was ValueError from float()
        (lambda: token_strip(toks, [0.1] * 6, correct=(3, 99)), r"correct=\(3, 99\) is not a"),  # was ignored
        (lambda: token_strip(toks, [0.1] * 6, query=99), "query=99 is not a position"),  # was ignored
        (lambda: sharp_vs_smooth(pattern[0, -1], pattern[1, -1], toks, target=1.5), "target must be an integer"),
    ]
    for call, needle in cases:
        with pytest.raises(InputError, match=needle) as err:
            call()
        _one_line(err.value)
    assert 'class="ga-tok ga-query"' in token_strip(toks, [0.1] * 6, query=-1)  # -1 was never outlined


def test_metrics_take_lists_and_check_n_keys(pattern):
    from gather_aggregate.core.sharpness import row_entropy, sharpness_index

    row = pattern[2, -1]
    assert float(row_entropy(row.tolist())) == pytest.approx(float(row_entropy(row)))  # was AttributeError
    import numpy as np

    assert float(sharpness_index(row, np.int64(6))) == pytest.approx(float(sharpness_index(row, 6)))
    for bad in (0, -2, 6.0, "6"):  # 0 gave 1.0 (perfectly sharp); 6.0 and "6" were AttributeErrors
        with pytest.raises(InputError, match="n_keys="):
            sharpness_index(row, bad)


def test_circuit_diagram_takes_bare_heads_and_views_print_short(pattern):
    from gather_aggregate.viz.attention import attention_heads
    from gather_aggregate.viz.circuit import circuit_diagram

    svg = circuit_diagram([(0, 2)], ["L1H3"], [((0, 2), (1, 3))])  # was "'tuple' object is not a mapping"
    assert "L0H2" in svg and "L1H3" in svg
    with pytest.raises(InputError, match="a head is a .layer, head. pair"):
        circuit_diagram([{"head": "x"}], [], [])
    view = attention_heads(pattern, [f"t{i}" for i in range(6)], layer=1)
    assert repr(view) == "AttentionView(AttentionHeads, 4 heads x 6 tokens, signed=False; display it in Jupyter " \
                         "or .save(path))"  # was every weight of every head (2.5k characters here)
    assert "CircuitsVis.render" in view._repr_html_()


def test_strips_and_diagrams_render_in_a_notebook_and_in_a_report(tmp_path):
    from gather_aggregate.report.html import write_report
    from gather_aggregate.viz.circuit import circuit_diagram
    from gather_aggregate.viz.tokens import token_strip

    strip = token_strip(["a", "b"], [0.2, 0.8])
    svg = circuit_diagram([(0, 2)], [(1, 3)], [])
    for fragment in (strip, svg):
        assert isinstance(fragment, str) and fragment._repr_html_() == fragment  # a str showed its markup in Jupyter
    page = write_report(tmp_path / "r.html", title="t", sections=[strip, ("circuit", svg)]).read_text()
    assert '<div class="ga-strip-view">' in page and '<div class="ga-circuit-view">' in page  # were escaped text
    assert "&lt;div class=&quot;ga-strip-view" not in page
