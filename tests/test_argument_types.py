"""Wrong argument types at the public entry points: one line of the project's own error classes, before any work.

Each case replaces one argument of a valid call with a value of the wrong type or range (a raw HF model or a path
for the model, ``None`` or a dict for tokens, a string for examples, a float for a count, ...).  Before these
checks, most of them surfaced as a ``TypeError`` / ``AttributeError`` from deep inside torch or the task code.
"""

from __future__ import annotations

import pytest
import torch

from gather_aggregate.core.errors import GAError

BAD_MODELS = {"a path": "gather_aggregate/zoo/llama-kv", "None": None, "an HF model": "hf"}


@pytest.fixture(scope="module")
def world():
    from gather_aggregate import load_model
    from gather_aggregate.scan.exact import exact_scan
    from gather_aggregate.tasks import task_metric
    from gather_aggregate.tasks.registry import get_task
    from gather_aggregate.zoo import list_zoo

    path = list_zoo().get("llama-kv")
    if path is None:
        pytest.skip("the toy zoo is not shipped")
    model = load_model(path)
    examples = get_task("kv", model_dir=path, n_pairs=4).examples(model.tokenizer, n=4, seed=0)
    tokens, metric = task_metric(model, examples)
    scan = exact_scan(model, tokens, metric, heads=[(0, 0), (0, 1)], progress=False)
    return model, examples, tokens, metric, scan


def _calls(world):
    """name -> (function, args, kwargs): valid calls, each run once to prove it works."""
    from gather_aggregate import attribution, detect, experiments, interventions, scan
    from gather_aggregate.scan import patching, rankings
    from gather_aggregate.tasks import evaluate, task_metric

    model, ex, toks, met, res = world
    one = [(0, 1)]
    return {
        "exact_scan": (scan.exact_scan, (model, toks, met), dict(heads=one, progress=False)),
        "naive_scan": (scan.naive_scan, (model, toks, met), dict(heads=one)),
        "atp_scan": (scan.atp_scan, (model, toks, met), dict(heads=one)),
        "attribution_scan": (attribution.attribution_scan, (model, toks, met), dict(heads=one, steps=2)),
        "patch_heads": (patching.patch_heads, (model, toks, toks.flip(0), met), dict(heads=one, progress=False)),
        "run_ablated": (interventions.run_ablated, (model, toks, one), {}),
        "make_replacement": (interventions.make_replacement, (model, one, "mean", toks), {}),
        "evaluate": (evaluate, (model, ex), dict(progress=False)),
        "task_metric": (task_metric, (model, ex), {}),
        "find_ga_heads": (detect.find_ga_heads, (model, ex), {}),
        "pattern": (model.pattern, (toks, 0), dict(heads=[0], rows=-1)),
        "top": (res.top, (2,), {}),
        "significant": (res.significant, (), {}),
        "compare_rankings": (rankings.compare_rankings, (res, res), {}),
        "remove_only": (experiments.remove_only, (model, one, {"kv": ex}), {}),
        "keep_only": (experiments.keep_only, (model, one, {"kv": ex}), {}),
        "cumulative_ablation": (experiments.cumulative_ablation, (model, one, {"kv": ex}), dict(ks=(0, 1))),
        "layer_pruning": (experiments.layer_pruning, (model, {"kv": ex}), {}),
    }


MODEL_FIRST = ["exact_scan", "naive_scan", "atp_scan", "attribution_scan", "patch_heads", "run_ablated",
               "make_replacement", "evaluate", "task_metric", "find_ga_heads", "remove_only", "keep_only",
               "cumulative_ablation", "layer_pruning"]
# (call, argument: a position or a keyword, bad values)
CASES = [
    *[(name, 0, list(BAD_MODELS.values())) for name in MODEL_FIRST],
    *[(name, 1, [None, {"a": 1}]) for name in ("exact_scan", "naive_scan", "atp_scan", "attribution_scan",
                                                "run_ablated")],
    ("patch_heads", 2, [None, {"a": 1}]),
    *[(name, 1, [None, "some text", 3, [1, 2]]) for name in ("evaluate", "task_metric", "find_ga_heads")],
    *[(name, 2, [None, [1, 2], {"kv": "text"}, {}]) for name in ("remove_only", "keep_only", "cumulative_ablation")],
    ("layer_pruning", 1, [None, [1, 2], {"kv": "text"}]),
    ("make_replacement", 1, [None, 3, "L0", [(0, 0, 0)]]),
    ("evaluate", "batch_size", [None, 0, 1.5, "8"]),
    ("evaluate", "seed", [None, "x", 1.5]),
    ("evaluate", "fwd_hooks", [None, 3]),
    ("find_ga_heads", "batch_size", [None, -1, 2.5]),
    ("find_ga_heads", "seed", [[1], 1.5]),
    ("find_ga_heads", "scores", ["x", 3, [1, 2]]),
    ("patch_heads", "positions", [3, "ab", [1.5]]),
    ("patch_heads", "max_rows", [0, "32", 2.5]),
    ("exact_scan", "out", [3, [1]]),
    ("exact_scan", "ray_address", [3]),
    ("cumulative_ablation", "ks", [3, "10", [1.5], [-1]]),
    ("keep_only", "kinds", ["attn", 3]),
    ("layer_pruning", "evaluator", [3, "acc"]),
    ("top", 0, [1.5, "3", -1, None]),
    ("top", "kinds", ["attn", 3]),
    ("significant", "z", [None, "2", float("nan"), -1.0]),
    ("compare_rankings", 0, [None, {"a": 1}, [1, 2]]),
    ("compare_rankings", "k", [0, 1.5]),
    ("pattern", 0, [None, 3, 1.5]),
]


def test_every_valid_call_runs(world):
    for fn, args, kw in _calls(world).values():
        fn(*args, **kw)  # any exception here means the cases below test nothing


@pytest.mark.parametrize("name,where,values", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_a_wrong_argument_is_one_line_of_our_errors(world, name, where, values):
    from transformers import LlamaConfig, LlamaForCausalLM

    fn, args, kw = _calls(world)[name]
    for value in values:
        if value == "hf":  # a raw HF model, the commonest mix-up
            value = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                                                 num_hidden_layers=1, num_attention_heads=2))
        a, k = list(args), dict(kw)
        if isinstance(where, int):
            a[where] = value
        else:
            k[where] = value
        with pytest.raises(GAError) as err:
            fn(*a, **k)
        assert "\n" not in str(err.value).strip(), str(err.value)
    assert torch.is_grad_enabled()


def test_negative_heads_count_from_the_end_like_negative_layers(world):
    """A negative head is read as Python reads it, as a negative layer already was: ``(-1, -1)`` is the last head
    of the last layer, everywhere a head set is taken."""
    from gather_aggregate.interventions.ablation import run_ablated
    from gather_aggregate.scan.exact import exact_scan

    model, _, toks, met, _ = world
    last_layer, last_head = model.n_layers - 1, model.layers[-1].n_heads - 1
    assert model.check_head_set([(-1, -1), ("L0H1")]) == [(last_layer, last_head), (0, 1)]
    assert model.check_heads(0, [-1, 0]) == [model.layers[0].n_heads - 1, 0]
    torch.testing.assert_close(run_ablated(model, toks[:2], [(-1, -1)]),
                               run_ablated(model, toks[:2], [(last_layer, last_head)]), rtol=0, atol=0)
    scan = exact_scan(model, toks, met, heads=[(0, -1)], progress=False)
    assert [(r["layer"], r["head"]) for r in scan.rows] == [(0, model.layers[0].n_heads - 1)]
    n = model.layers[0].n_heads
    with pytest.raises(GAError, match=rf"-{n}\.\.-1"):
        model.check_heads(0, [-n - 1])
