"""A new researcher's misuses: each was a traceback from deep inside torch/TransformerLens/the tokenizer, a silent
wrong result or a vague message before; now it is one line of our own errors naming the fix, or the natural input
simply works.  (Prompts, heads, metrics, scans and files: here; tasks, the detector, figures and experiments:
``test_misuse_tasks_viz.py``.)  Every case was checked to fail before its fix.
"""

from __future__ import annotations

import json

import pytest
import torch
from error_checks import one_line as _one_line

from gather_aggregate.core.errors import GAError, InputError, ResumeMismatchError
from gather_aggregate.core.model_state import count_hooks, param_checksum


@pytest.fixture(scope="module")
def world(llama_model):
    from gather_aggregate.tasks import task_metric
    from gather_aggregate.tasks.registry import get_task

    examples = get_task("kv", n_pairs=3).examples(llama_model.tokenizer, 4, seed=0)
    tokens, metric = task_metric(llama_model, examples)
    return llama_model, examples, tokens, metric


@pytest.fixture(scope="module")
def ssm():
    from gather_aggregate.adapters import load_ssm
    from gather_aggregate.testing.tiny_ssm import tiny_hf_ssm

    return load_ssm(tiny_hf_ssm("mamba2", seed=0))


# ---- prompts in every container ------------------------------------------------------------------------------
@pytest.mark.parametrize("tokens,needle", [
    ([], "tokens are empty"),  # was "must be integer ids, got dtype torch.float32"
    ([[]], "a prompt has no token ids"),  # idem
    ([[1, 2, 3], [4, 5]], r"prompts of different lengths \(\[2, 3\] tokens\).*pad them"),  # was "got list"
    ([torch.tensor([1, 2]), torch.tensor([3])], "prompts of different lengths"),
    (torch.tensor([[1, 2]], device="meta"), "meta device"),  # was a RuntimeError from Tensor.item()
])
def test_token_containers_that_hold_no_prompt_are_one_line(world, tokens, needle):
    model = world[0]
    with pytest.raises(InputError, match=needle) as err:
        model(tokens)
    _one_line(err.value)


def test_a_list_of_id_tensors_is_a_batch(world):
    model = world[0]
    rows = [torch.tensor([5, 6, 7]), torch.tensor([8, 9, 10])]  # was "tokens must be token ids ..., got list"
    torch.testing.assert_close(model(rows), model(torch.stack(rows)))


@pytest.mark.parametrize("text,needle", [
    (3, "takes a text or a list of texts, got int"),  # was TypeError: 'int' object is not iterable
    (["a b", 3], "got a int in the list"),  # was the tokenizer's multi-line ValueError
    (torch.tensor([1, 2]), "token ids need no tokenising"),
])
def test_to_tokens_takes_text_only(world, text, needle):
    with pytest.raises(InputError, match=needle) as err:
        world[0].to_tokens(text)
    _one_line(err.value)


# ---- hooks and caches -------------------------------------------------------------------------------------
def test_a_hook_that_is_no_function_and_an_unknown_cache_name(world, ssm):
    for model in (world[0], ssm):
        toks = torch.randint(0, 50, (1, 5))
        with pytest.raises(InputError, match="must be a function fn\\(tensor, hook\\)") as err:  # was TypeError
            model.run_with_hooks(toks, fwd_hooks=[(model.head_hook(0)[0], 3)])
        _one_line(err.value)
        assert count_hooks(model) == 0
    with pytest.raises(InputError, match="names_filter names no hook of this model: 'blocks.0.ssm.hook_zz'"):
        ssm.run_with_cache(torch.randint(0, 50, (1, 5)), names_filter="blocks.0.ssm.hook_zz")  # was an empty cache
    _, cache = ssm.run_with_cache(torch.randint(0, 50, (1, 5)), names_filter=[ssm.head_hook(0)[0]])
    assert list(cache.keys()) == [ssm.head_hook(0)[0]]


@pytest.mark.parametrize("kwargs,needle", [
    (dict(normalize="no"), "normalize must be True or False"),  # "no" was true
    (dict(dt_scaling="x"), "dt_scaling must be True or False"),  # was taken as True
    (dict(max_bytes=-1), "max_bytes=-1: pass a positive number"),  # was a MemoryBudgetError of -9e-10 GiB
])
def test_pattern_flags_of_the_wrong_type(ssm, kwargs, needle):
    with pytest.raises(InputError, match=needle):
        ssm.pattern(torch.randint(0, 50, (1, 5)), 0, **kwargs)


# ---- metrics and readouts -------------------------------------------------------------------------------------
def test_readout_positions_in_natural_forms(world):
    import numpy as np

    from gather_aggregate.core.readout import ReadoutMetric
    from gather_aggregate.scan.exact import exact_scan

    model, _, tokens, _ = world
    fn = lambda la: la[:, 0, 3].mean()  # noqa: E731
    last = [tokens.shape[1] - 1] * tokens.shape[0]
    want = exact_scan(model, tokens, ReadoutMetric(fn, torch.tensor(last)), heads=[(1, 0)], progress=False)
    for positions in (last, np.array(last), np.int64(-1), torch.tensor(-1)):  # a list was "got list"
        got = exact_scan(model, tokens, ReadoutMetric(fn, positions), heads=[(1, 0)], progress=False)
        assert got.rows[0]["score"] == pytest.approx(want.rows[0]["score"], abs=1e-6)
    for bad, needle in (("logits", "fn must be a function"), ):  # was accepted, then failed in the first scan
        with pytest.raises(InputError, match=needle):
            ReadoutMetric(bad, -1)
    for positions, needle in ((True, "got bool"), ([[1], [2, 3]], "not a rectangle"), ([1.5], "float32")):
        with pytest.raises(InputError, match=needle):
            ReadoutMetric(fn, positions)


def test_patching_with_a_metric_that_does_not_tell_clean_from_corrupted(world):
    from gather_aggregate.scan.patching import patch_heads

    model, _, tokens, metric = world
    before = param_checksum(model)
    with pytest.raises(InputError, match="the metric is .* on the clean and .* on the corrupted prompts, so no patch") as err:  # was NaN scores
        patch_heads(model, tokens, tokens, metric, heads=[(0, 1)], progress=False)
    _one_line(err.value)
    mean_of_last = lambda logits: logits[:, -1].log_softmax(-1)[:, 7].mean()  # noqa: E731
    with pytest.raises(InputError, match="only reordered"):  # a reordered batch: the same mean, NaN scores before
        patch_heads(model, tokens, tokens.flip(0), mean_of_last, heads=[(0, 1)], progress=False)
    assert count_hooks(model) == 0 and param_checksum(model) == before


def test_ctrl_c_in_a_metric_then_resume_and_a_resume_with_another_metric_of_the_same_name(world, tmp_path):
    from gather_aggregate.scan.exact import exact_scan

    model, _, tokens, _ = world
    out = tmp_path / "scan.json"
    calls = {"n": 0}

    def metric(logits):
        calls["n"] += 1
        if calls["n"] == 3:  # the clean run, one chunk, then Ctrl-C
            raise KeyboardInterrupt
        return logits[:, -1].log_softmax(-1)[:, 7].mean()

    before = param_checksum(model)
    with pytest.raises(KeyboardInterrupt):
        exact_scan(model, tokens, metric, max_rows=4, out=out, progress=False)
    assert count_hooks(model) == 0 and param_checksum(model) == before
    assert len(json.loads(out.read_text())["rows"]) == 1
    resumed = exact_scan(model, tokens, metric, max_rows=4, out=out, resume=True, progress=False)
    whole = exact_scan(model, tokens, metric, max_rows=4, progress=False)
    assert {(r["layer"], r["head"]): r["score"] for r in resumed.rows} == \
        {(r["layer"], r["head"]): r["score"] for r in whole.rows}

    def metric(logits):  # noqa: F811  (a notebook cell redefined: same name, another answer token)
        return logits[:, -1].log_softmax(-1)[:, 9].mean()

    with pytest.raises(ResumeMismatchError, match="its clean metric is .* so another metric wrote it") as err:
        exact_scan(model, tokens, metric, max_rows=4, out=out, resume=True, progress=False)  # was resumed silently
    _one_line(err.value)


# ---- ablations ------------------------------------------------------------------------------------------------
def test_ablation_arguments_of_the_wrong_type(world):
    from gather_aggregate.interventions.ablation import ablation_hooks, make_replacement

    model, _, tokens, _ = world
    for kwargs, needle in ((dict(per_position="no"), "per_position must be True or False"),  # "no" was true
                           (dict(seed="x"), "seed must be an integer")):  # seeded the draw from a string
        with pytest.raises(InputError, match=needle):
            make_replacement(model, [(0, 1)], "resample", tokens.flip(0), **kwargs)
    from gather_aggregate.attribution.estimators import attribution_scan

    with pytest.raises(InputError, match="graddrop must be True or False"):  # "no" was true
        attribution_scan(model, tokens, world[3], heads=[(0, 1)], estimator="atp*", graddrop="no")
    with pytest.raises(InputError, match="replacement must be make_replacement"):  # was AttributeError at forward
        ablation_hooks(model, [(0, 1)], 3)
    hooks = ablation_hooks(model, [(0, 1)], "zero")  # the method's name is enough for a zero ablation
    want = ablation_hooks(model, [(0, 1)], make_replacement(model, [(0, 1)], "zero"))
    torch.testing.assert_close(model.run_with_hooks(tokens, fwd_hooks=hooks),
                               model.run_with_hooks(tokens, fwd_hooks=want))
    with pytest.raises(InputError, match="mean ablation needs reference"):
        ablation_hooks(model, [(0, 1)], "mean")


def test_ablate_is_a_context_manager_checked_where_it_is_written(world):
    """ablate(model, heads)(tokens) silently returned a wrapped function (a generator context manager is also a
    decorator), and a bad head was only found on entering the block."""
    from gather_aggregate.interventions.ablation import ablate, run_ablated

    model, _, tokens, _ = world
    before, hooks = param_checksum(model), count_hooks(model)
    with pytest.raises(InputError, match="is a context manager, not a forward") as err:
        ablate(model, [(0, 1)])(tokens)
    _one_line(err.value)
    with pytest.raises(GAError, match="out of range"):
        ablate(model, [(0, 99)])  # refused here, before any block
    block = ablate(model, [(0, 1)])
    with block as m, torch.no_grad():
        assert m is model and count_hooks(model) > hooks
        torch.testing.assert_close(model(tokens), run_ablated(model, tokens, [(0, 1)]))
        with pytest.raises(InputError, match="already running"), block:
            pass
    with pytest.raises(RuntimeError, match="inside"), block:  # the same object runs again; an error inside it
        raise RuntimeError("inside")  # leaves no hook behind
    assert count_hooks(model) == hooks and param_checksum(model) == before


@pytest.mark.parametrize("which", ["ssm", "transformer"])
def test_a_hook_returning_another_shape_is_refused_where_it_runs(world, ssm, which):
    """z[:, :1] for z was broadcast on without a word (normal-looking logits); a list went on to a deep error."""
    model = ssm if which == "ssm" else world[0]
    tokens = world[2] if which == "transformer" else torch.tensor([[1, 2, 3, 4]])
    name = model.head_hook(0)[0]
    hooks, clean = count_hooks(model), model(tokens)
    for bad, needle in ((lambda z, hook: z[:, :1], r"returned shape \(\d+, 1, "), (lambda z, hook: [z], "returned a list")):
        with pytest.raises(InputError, match=needle) as err:
            model.run_with_hooks(tokens, fwd_hooks=[(name, bad)])
        assert name in _one_line(err.value)
        with pytest.raises(InputError, match=needle), model.hooks(fwd_hooks=[(name, bad)]):
            model(tokens)
    assert count_hooks(model) == hooks
    torch.testing.assert_close(model.run_with_hooks(tokens, fwd_hooks=[(name, lambda z, hook: None)]), clean)
    torch.testing.assert_close(model.run_with_hooks(tokens, fwd_hooks=[(name, lambda z, hook: z.clone())]), clean)


def test_a_transformers_resumed_forward_checks_what_it_is_given(world):
    """Each was a TypeError in the bridge, an HF shape error, a dtype error of torch.matmul or TL's KeyError."""
    import copy

    model, _, tokens, _ = world
    resid = model(tokens, stop_at_layer=1)
    for kwargs, needle in ((dict(stop_at_layer="1"), "stop_at_layer='1' is out of range"),
                           (dict(start_at_layer=1, stop_at_layer=0), "comes before start_at_layer"),
                           (dict(start_at_layer=1, inp=resid[..., :-1]), "d_model="),
                           (dict(start_at_layer=1, inp=resid.double()), "pass resid.to")):
        with pytest.raises(InputError, match=needle) as err:
            model(kwargs.pop("inp", resid if "start_at_layer" in kwargs else tokens), **kwargs)
        _one_line(err.value)
    torch.testing.assert_close(model(resid, start_at_layer=-1), model(tokens))  # negative: from the end, as SSMs
    with pytest.raises(InputError, match="names_filter names no hook of this model: 'blocks.0.attn.hook_zz'"):
        model.run_with_cache(tokens, names_filter="blocks.0.attn.hook_zz")
    half = copy.deepcopy(model)
    half.module.to(torch.bfloat16)
    out = half(resid, start_at_layer=1)  # fp32 residual into a bf16 model: cast, as the SSM adapters do
    torch.testing.assert_close(out, half(resid.bfloat16(), start_at_layer=1))


def test_from_hf_model_takes_a_tokenizer_directory_and_says_why_a_tokenizer_fails(tiny_llama_dir):
    """from_hf_model refused tokenizer=dir (load_model takes one); a tokenizer that cannot be loaded was a
    three-line message (transformers' own)."""
    from gather_aggregate.core.errors import TokenizerMissingError
    from gather_aggregate.models.loading import from_hf_model
    from gather_aggregate.testing.tiny_models import tiny_llama

    hf, _ = tiny_llama()
    assert from_hf_model(hf, tokenizer=str(tiny_llama_dir)).to_tokens("apple").shape[0] == 1
    with pytest.raises(TokenizerMissingError, match="could not load the tokenizer of 'not-a-hub-name-here'") as err:
        from_hf_model(hf, tokenizer="not-a-hub-name-here")  # offline: no such tokenizer
    _one_line(err.value)


def test_head_names_in_any_case_on_the_command_line():
    from gather_aggregate.cli.arg_types import head_pairs

    assert head_pairs("l0h1,L1H0,1.2") == [(0, 1), (1, 0), (1, 2)]  # lower case was refused


def test_check_head_set_names_a_scan_result_without_printing_it(world):
    from gather_aggregate.scan.exact import ScanResult

    scan = ScanResult([{"layer": 0, "head": h, "kind": "attn", "score": 0.1 * h} for h in range(4)], {})
    with pytest.raises(GAError, match="got ScanResult$") as err:  # was every row of the scan in the message
        world[0].check_head_set(scan)
    assert len(_one_line(err.value)) < 200
    assert world[0].check_head_set(["l1h0"]) == [(1, 0)]


# ---- tables ---------------------------------------------------------------------------------------------------
def test_tables_of_the_wrong_shape_are_refused_before_the_disk_is_touched(tmp_path):
    from gather_aggregate.core.results_io import write_table
    from gather_aggregate.scan.exact import ScanResult

    out = tmp_path / "t.json"
    write_table([{"a": 1}], out, {"m": 1})
    for rows, meta in (([1, 2], {}), ("rows", {}), ([{"a": 1}], "meta")):
        with pytest.raises(InputError, match="write_table takes rows as a list of dicts"):  # [1, 2] was a TypeError
            write_table(rows, out, meta)  # after the JSON had been replaced and the CSV twin removed
        assert json.loads(out.read_text()) == {"meta": {"m": 1}, "rows": [{"a": 1}]}
        assert (tmp_path / "t.csv").read_text() == "a\n1\n"
    for rows in ([{"layer": 0}], "rows"):  # were a KeyError / TypeError at .top()
        with pytest.raises(InputError, match=r"ScanResult\(rows, meta\): .*give rows as dicts with layer, head"):
            ScanResult(rows, {})


def test_an_evaluator_that_returns_no_number(world):
    from gather_aggregate.studies.ablation_tables import layer_pruning, remove_only

    model, examples, _, _ = world
    with pytest.raises(InputError, match="the evaluator returned str 'good' on task set 'kv'"):  # was in the table
        layer_pruning(model, {"kv": examples}, evaluator=lambda m, exs, hooks: "good")
    got = remove_only(model, [(0, 1)], {"kv": examples}, evaluator=lambda m, exs, hooks: torch.tensor(0.5))
    assert got["clean"] == {"kv": 0.5} and type(got["clean"]["kv"]) is float  # a 0-d tensor was kept as one
