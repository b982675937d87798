"""The states a Jupyter user's model and session are really in when they call the public API.

Earlier rounds checked bad *arguments* (test_bad_input, test_argument_types, test_crash_safety,
test_device_handling); these check *states*: ``torch.no_grad()`` / ``torch.inference_mode()``, a model left in
``.train()`` with dropout, frozen parameters and a user's own ``.grad``, a user's own hooks, a
``KeyboardInterrupt`` from inside a hook mid-scan, prompts in every form, and results paths that cannot be
written.  The rules are in :mod:`gather_aggregate.core.model_state` and :func:`gather_aggregate.core.results_io.check_output_file`.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gather_aggregate.core.errors import InputError
from gather_aggregate.core.model_state import count_hooks, param_checksum

MODELS = ["llama-kv", "mamba2-ga", "bamba-ga", "mamba1"]  # bridge transformer, Mamba-2, hybrid, Mamba-1
HEADS = [(0, 0), (0, 1), (1, 0)]


def _zoo(name):
    from gather_aggregate.zoo import list_zoo

    path = list_zoo().get(name)
    if path is None:
        pytest.skip("the toy zoo is not shipped")
    return path


@pytest.fixture(scope="module")
def worlds():
    """name -> (model, tokens, metric): the metric a ReadoutMetric of the zoo's KV task, or a plain function."""
    from gather_aggregate import load_model
    from gather_aggregate.models.loading import from_hf_model
    from gather_aggregate.tasks import task_metric
    from gather_aggregate.tasks.registry import get_task
    from gather_aggregate.testing.tiny_ssm import tiny_hf_ssm

    out = {}
    for name in MODELS[:3]:
        model = load_model(_zoo(name))
        examples = get_task("kv", model_dir=_zoo(name), n_pairs=4).examples(model.tokenizer, n=3, seed=0)
        out[name] = (model, *task_metric(model, examples))
    model = from_hf_model(tiny_hf_ssm("mamba", n_layer=2), head_size=4)
    out["mamba1"] = (model, torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(0)), _metric)
    return out


def _metric(logits):
    return logits[:, -1].float().log_softmax(-1)[:, 1].mean()


def _estimators(metric):
    from gather_aggregate.core.readout import ReadoutMetric

    return ["atp", "ig", "atp*"] + (["atp-softmax", "atp*-softmax"] if isinstance(metric, ReadoutMetric) else [])


def _scores(result):
    return [(r["layer"], r["head"], r["score"]) for r in result.rows]


def _estimates(model, tokens, metric):
    from gather_aggregate.attribution.estimators import attribution_scan
    from gather_aggregate.scan.exact import atp_scan

    out = {e: _scores(attribution_scan(model, tokens, metric, heads=HEADS, estimator=e, steps=2))
           for e in _estimators(metric)}
    out["atp_scan"] = _scores(atp_scan(model, tokens, metric, heads=HEADS))
    return out


# ---- no_grad / inference_mode --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", MODELS)
def test_gradient_estimators_work_under_no_grad_and_inference_mode(worlds, name):
    """Under inference_mode every gradient estimator said "the metric is not differentiable ... not accuracy"
    (a wrong diagnosis); now each re-enables autograd for its own forwards and gives the same numbers."""
    from gather_aggregate.scan.exact import exact_scan

    model, tokens, metric = worlds[name]
    want = _estimates(model, tokens, metric)
    for mode in (torch.no_grad, torch.inference_mode):
        with mode():
            assert _estimates(model, tokens, metric) == want, mode.__name__
            exact = exact_scan(model, tokens, metric, heads=HEADS, progress=False)
            pattern = model.pattern(tokens, 0, rows=-1)
        assert not pattern.is_inference() and not torch.is_inference_mode_enabled()
        assert _scores(exact) == _scores(exact_scan(model, tokens, metric, heads=HEADS, progress=False))
    assert _estimates(model, tokens, metric) == want  # nothing poisoned for later calls
    assert torch.is_grad_enabled()


@pytest.mark.parametrize("name", ["llama-kv", "mamba2-ga"])
def test_a_model_and_metric_made_under_inference_mode_serve_a_later_gradient_estimate(worlds, name):
    """load_model and task_metric run under inference_mode made inference tensors (the SSMs' parameters, the
    metric's query positions) that a later gradient estimate could not save for backward (a raw RuntimeError)."""
    from gather_aggregate import load_model
    from gather_aggregate.attribution.estimators import attribution_scan
    from gather_aggregate.tasks import task_metric
    from gather_aggregate.tasks.registry import get_task

    model, tokens, metric = worlds[name]
    want = _scores(attribution_scan(model, tokens, metric, heads=HEADS, steps=2))
    examples = get_task("kv", model_dir=_zoo(name), n_pairs=4).examples(model.tokenizer, n=3, seed=0)
    with torch.inference_mode():
        loaded = load_model(_zoo(name))
        toks_inf, metric_inf = task_metric(model, examples)
    assert not any(p.is_inference() for p in getattr(loaded, "module", loaded).parameters())
    assert _scores(attribution_scan(loaded, tokens, metric, heads=HEADS, steps=2)) == want
    assert _scores(attribution_scan(model, toks_inf, metric_inf, heads=HEADS, steps=2)) == want
    # a metric of the user's own that closes over an inference tensor: one of our errors naming the fix
    with torch.inference_mode():
        answer = torch.tensor([1])

    def own_metric(logits):
        return logits[:, -1].log_softmax(-1).index_select(-1, answer).mean()

    with pytest.raises(InputError, match="inference_mode"):
        attribution_scan(model, tokens, own_metric, heads=HEADS, estimator="atp")


# ---- train mode with dropout ---------------------------------------------------------------------------------
def _flags(model):
    root = getattr(model, "module", model)
    owners = [root, *(v for v in vars(root).values() if isinstance(v, torch.nn.Module))]  # the bridge's HF model
    return [m.training for owner in owners for m in owner.modules()]


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_train_mode_with_dropout_gives_eval_results_and_leaves_every_flag_as_it_was(family):
    """A bridge model left in .train() with dropout ran every analysis with dropout: each call gave other numbers.
    Now analyses run in eval mode and put each module's flag back, after errors and interrupts too."""
    from gather_aggregate import attribution, experiments, interventions, scan
    from gather_aggregate.models.loading import from_hf_model
    from gather_aggregate.scan import patching
    from gather_aggregate.testing.tiny_models import tiny_gpt2, tiny_llama

    hf, tok = tiny_gpt2(resid_pdrop=0.5, attn_pdrop=0.5, embd_pdrop=0.5) if family == "gpt2" else \
        tiny_llama(attention_dropout=0.5)
    model = from_hf_model(hf, tok)
    tokens, corrupted = torch.randint(3, 40, (2, 2, 6), generator=torch.Generator().manual_seed(0))
    heads = [(0, 0), (1, 1)]
    calls = {
        "exact": lambda: _scores(scan.exact_scan(model, tokens, _metric, heads=heads, progress=False)),
        "naive": lambda: _scores(scan.naive_scan(model, tokens, _metric, heads=heads)),
        "ig": lambda: _scores(attribution.attribution_scan(model, tokens, _metric, heads=heads, steps=2)),
        "atp*": lambda: _scores(attribution.attribution_scan(model, tokens, _metric, heads=heads, estimator="atp*")),
        "patch": lambda: _scores(patching.patch_heads(model, tokens, corrupted, _metric, heads=heads,
                                                      progress=False)),
        "ablated": lambda: interventions.run_ablated(model, tokens, heads).tolist(),
        "pattern": lambda: model.pattern(tokens, 1).tolist(),
        "sweep": lambda: experiments.ablation_sweep(model, tokens, _metric, [heads, heads[:1]]),
    }
    want = {k: f() for k, f in calls.items()}  # eval mode, as loaded
    model.train()
    list(model.module.original_model.modules())[5].eval()  # a mixed state, which must come back exactly
    before = _flags(model)
    assert any(before) and not all(before)
    assert not torch.equal(model(tokens), model(tokens))  # the model's own forward does follow train mode
    for k, f in calls.items():
        assert f() == want[k], k
        assert _flags(model) == before, k

    def interrupted(logits):
        raise KeyboardInterrupt

    for bad, exc in ((lambda logits: 1 / 0, ZeroDivisionError), (interrupted, KeyboardInterrupt)):
        with pytest.raises(exc):
            scan.exact_scan(model, tokens, bad, heads=heads, progress=False)
        with pytest.raises(exc):
            attribution.attribution_scan(model, tokens, bad, heads=heads)
        assert _flags(model) == before and count_hooks(model) == 0


def test_the_lm_eval_model_scores_a_model_left_in_train_mode_as_in_eval_mode():
    """GatherAggregateLM (lm-evaluation-harness) ran a model left in .train() with dropout: its log-likelihoods
    changed from call to call.  Now its forwards run in eval mode, and the flags come back."""
    pytest.importorskip("lm_eval", reason="needs the lmeval extra")
    from gather_aggregate.lm_eval.model import GatherAggregateLM
    from gather_aggregate.models.loading import from_hf_model
    from gather_aggregate.testing.tiny_models import tiny_gpt2

    model = from_hf_model(*tiny_gpt2(resid_pdrop=0.5, attn_pdrop=0.5, embd_pdrop=0.5))
    lm = GatherAggregateLM(model=model)
    rows = [[3, 4, 5, 6], [7, 8, 9, 10]]
    want = lm._logits(rows)
    model.train()
    before = _flags(model)
    assert torch.equal(lm._logits(rows), want) and torch.equal(lm._logits(rows), want)
    assert _flags(model) == before and all(before)


# ---- frozen parameters, the user's own .grad ------------------------------------------------------------------
@pytest.mark.parametrize("name", MODELS)
def test_gradient_estimators_leave_frozen_flags_and_the_users_grad_alone(worlds, name):
    model, tokens, metric = worlds[name]
    params = list(getattr(model, "module", model).parameters())
    flags = [p.requires_grad for p in params]
    want = _estimates(model, tokens, metric)
    try:
        model(tokens).float().logsumexp(-1).sum().backward()  # the user's own backward
        grads = [None if p.grad is None else p.grad.clone() for p in params]
        assert any(g is not None for g in grads)
        assert _estimates(model, tokens, metric) == want
        assert all(g is None and p.grad is None or torch.equal(g, p.grad) for g, p in zip(grads, params, strict=True))
        for p in params:
            p.grad = None
            p.requires_grad_(False)
        assert _estimates(model, tokens, metric) == want
        assert all(p.grad is None and not p.requires_grad for p in params)
    finally:
        for p, flag in zip(params, flags, strict=True):
            p.grad = None
            p.requires_grad_(flag)


# ---- prompts in every form -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", MODELS[:3])
def test_pattern_and_to_str_tokens_take_a_prompt_in_every_form(worlds, name):
    """A numpy array was taken for a cache by the bridge's pattern ("the cache has no ..."), and to_str_tokens
    raised raw ValueError/TypeError on a list of one text, a 2-D numpy array and a list of lists."""
    model = worlds[name][0]
    ids2 = model.to_tokens("a:b\nc:d\n")
    ids = ids2[0].tolist()
    forms = ["a:b\nc:d\n", ["a:b\nc:d\n"], ids, [ids], tuple(ids), torch.tensor(ids), ids2, ids2.int(),
             np.array(ids), ids2.numpy(), ids2.numpy().astype(np.int32)]
    want_pattern, want_str = model.pattern(ids2, 0), model.to_str_tokens(ids2)
    for form in forms:
        assert torch.equal(model.pattern(form, 0), want_pattern), type(form)
        assert model.to_str_tokens(form) == want_str, type(form)
    with pytest.raises(InputError, match="one prompt"):
        model.to_str_tokens(["a:b\n", "c:d\n"])
    # a tokenizer's own output (a BatchEncoding, a mapping) was taken for a cache: "the cache has no ..."
    enc = model.tokenizer("a:b\nc:d\n", return_tensors="pt", add_special_tokens=True)
    assert torch.equal(enc["input_ids"], ids2)  # to_tokens follows the tokenizer's own special tokens
    assert torch.equal(model.pattern(enc, 0), want_pattern) and model.to_str_tokens(enc) == want_str
    padded = model.tokenizer(["a:b\nc:d\n", "a"], return_tensors="pt", padding=True)
    with pytest.raises(InputError, match="has padding.*to_tokens"):
        model.pattern(padded, 0)


# ---- the user's own hooks -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", MODELS)
def test_the_users_hooks_stay_attached_and_our_results_see_them(worlds, name):
    """A TransformerLens hook (add_hook) and torch forward / pre-hooks of the user's: still attached after our
    calls and our errors, ours gone; the exact scan sees the user's edit exactly as the naive scan does."""
    from gather_aggregate import attribution, scan

    model, tokens, metric = worlds[name]
    root = getattr(model, "module", model)
    hook_name, axis = model.head_hook(model.n_layers - 1)
    calls = {"tl": 0, "fwd": 0, "pre": 0}

    def users_edit(z, hook):  # the user's own intervention: head 0 of the last layer scaled down
        calls["tl"] += 1
        z = z.clone()
        z.select(axis, 0).mul_(0.3)
        return z

    embed = next(m for m in root.modules() if isinstance(m, torch.nn.Embedding))  # runs in every forward
    handles = [embed.register_forward_hook(lambda *a: calls.__setitem__("fwd", calls["fwd"] + 1)),
               embed.register_forward_pre_hook(lambda *a: calls.__setitem__("pre", calls["pre"] + 1))]
    root.hook_dict[hook_name].add_hook(users_edit)
    try:
        n_tl, n_torch = count_hooks(model), len(_torch_hooks(root))
        heads = model.all_heads()[:3] + [(model.n_layers - 1, 0)]
        exact = {(r["layer"], r["head"]): r["score"] for r in scan.exact_scan(model, tokens, metric, heads=heads,
                                                                                progress=False).rows}
        naive = {(r["layer"], r["head"]): r["score"] for r in scan.naive_scan(model, tokens, metric, heads=heads).rows}
        assert exact == pytest.approx(naive, abs=1e-4)
        attribution.attribution_scan(model, tokens, metric, heads=heads, estimator="atp*")
        with pytest.raises(ZeroDivisionError):
            scan.exact_scan(model, tokens, lambda logits: 1 / 0, heads=heads, progress=False)
        with pytest.raises(KeyboardInterrupt):
            attribution.attribution_scan(model, tokens, _interrupt, heads=heads)
        assert calls["tl"] > 0 and calls["fwd"] == calls["pre"] > 0
        assert count_hooks(model) == n_tl == 1
        assert len(_torch_hooks(root)) == n_torch == 3  # the two torch hooks, and the one under add_hook
        # without the user's edit the scores differ: the results did see it
        root.hook_dict[hook_name].remove_hooks()
        plain = {(r["layer"], r["head"]): r["score"] for r in scan.exact_scan(model, tokens, metric, heads=heads,
                                                                                progress=False).rows}
        assert plain != pytest.approx(exact, abs=1e-6)
    finally:
        root.hook_dict[hook_name].remove_hooks()
        for h in handles:
            h.remove()
    assert count_hooks(model) == 0


#: wiring transformers and TransformerLens install once, on a model's first forward of a kind, and keep
_WIRING = ("transformers.utils.output_capturing", "transformer_lens.model_bridge.")


def _torch_hooks(root):
    """The torch forward / pre-hooks on ``root``'s modules, less the libraries' own lazily installed wiring (a
    bridge's first scan adds 10 on llama-kv, once: counting them made the test depend on what ran before it)."""
    return [h for m in root.modules() for h in (*m._forward_hooks.values(), *m._forward_pre_hooks.values())
            if not getattr(h, "__module__", "").startswith(_WIRING)]


def _interrupt(logits):
    raise KeyboardInterrupt


# ---- KeyboardInterrupt mid-scan, then resume --------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:hooks. skipped")  # the bridge's hook points its config turns off
@pytest.mark.parametrize("name", ["mamba2-ga", "llama-kv"])
def test_an_interrupt_from_a_hook_mid_scan_leaves_the_model_and_a_file_that_resumes_exactly(worlds, name, tmp_path):
    from gather_aggregate.scan.exact import exact_scan

    model, tokens, metric = worlds[name]
    root = getattr(model, "module", model)
    rows = tokens.shape[0]  # one head per stacked forward: a chunk (saved) per head
    fired: dict[str, int] = {}

    def count(x, hook):
        fired[hook.name] = fired.get(hook.name, 0) + 1

    with model.hooks(fwd_hooks=[(lambda name: True, count)]):
        ref = exact_scan(model, tokens, metric, out=tmp_path / "ref" / "scan.json", max_rows=rows, progress=False)
    busiest = max(fired, key=fired.get)  # a hook point that fires in the scan's every forward
    checksum, flags = param_checksum(model), _flags(model)
    out = tmp_path / "scan.json"

    def saved() -> list:
        return json.loads(out.read_text())["rows"] if out.exists() else []

    seen = []
    for _ in range(3):
        start = len(saved())

        def interrupt(x, hook, start=start):  # as Jupyter's "interrupt kernel" does, mid-forward
            if len(saved()) > start:  # one more chunk is saved: stop inside the next one
                raise KeyboardInterrupt

        root.hook_dict[busiest].add_hook(interrupt)
        try:
            with pytest.raises(KeyboardInterrupt):
                exact_scan(model, tokens, metric, out=out, resume=True, max_rows=rows, progress=False)
        finally:
            root.hook_dict[busiest].remove_hooks()
        assert count_hooks(model) == 0 and param_checksum(model) == checksum and _flags(model) == flags
        assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
        done = saved()
        assert len({(r["layer"], r["head"]) for r in done}) == len(done)  # nothing duplicated
        seen.append(len(done))
    assert seen[0] > 0 and seen == sorted(set(seen)) and seen[-1] < len(ref.rows), seen  # one chunk more each time
    exact_scan(model, tokens, metric, out=out, resume=True, max_rows=rows, progress=False)
    assert out.read_text() == (tmp_path / "ref" / "scan.json").read_text()
    assert out.with_suffix(".csv").read_text() == (tmp_path / "ref" / "scan.csv").read_text()


# ---- half precision, one prompt of one or two tokens ------------------------------------------------------------
@pytest.mark.parametrize("name", ["llama-kv", "mamba2-ga", "bamba-ga", "mamba1-ga"])
def test_half_precision_models_on_one_short_prompt(name):
    """fp16 and bf16 models on the CPU, a batch of one prompt of one or two tokens: the exact scan within half
    precision's rounding of the fp32 model's (measured on these prompts: at most 1.0% of the largest score in
    fp16, 6.2% in bf16 (llama-kv, one token): bf16 keeps 8 bits of mantissa), gradient estimates finite,
    patterns float32."""
    from gather_aggregate import load_model
    from gather_aggregate.attribution.estimators import attribution_scan
    from gather_aggregate.scan.exact import exact_scan

    ref = load_model(_zoo(name), dtype=torch.float32)
    for dtype, tol in ((torch.float16, 0.03), (torch.bfloat16, 0.12)):
        model = load_model(_zoo(name), dtype=dtype)
        for n_tokens in (1, 2):
            tokens = torch.randint(5, 30, (1, n_tokens), generator=torch.Generator().manual_seed(0))
            got = {(r["layer"], r["head"]): r["score"] for r in exact_scan(model, tokens, _metric, progress=False).rows}
            want = {(r["layer"], r["head"]): r["score"] for r in exact_scan(ref, tokens, _metric, progress=False).rows}
            scale = max(abs(v) for v in want.values())
            assert got == pytest.approx(want, abs=tol * scale), (dtype, n_tokens)
            est = attribution_scan(model, tokens, _metric, steps=2)
            assert all(np.isfinite(r["score"]) for r in est.rows)
            pattern = model.pattern(tokens, 0)
            assert pattern.dtype == torch.float32 and pattern.shape[-2:] == (n_tokens, n_tokens)
            assert bool(torch.isfinite(pattern).all())


# ---- two models interleaved --------------------------------------------------------------------------------------
def test_two_models_interleaved_and_a_freed_one_replaced_keep_nothing_of_each_other():
    """Nothing is cached per model at module level (no id()-keyed caches): interleaved calls on two models of the
    same architecture give each its own numbers, and a new model (possibly at a freed one's id) its own."""
    import gc

    from gather_aggregate.attribution.estimators import attribution_scan
    from gather_aggregate.models.loading import from_hf_model
    from gather_aggregate.scan.exact import exact_scan, naive_scan
    from gather_aggregate.testing.tiny_models import tiny_llama

    tokens = torch.randint(3, 40, (2, 6), generator=torch.Generator().manual_seed(0))

    def results(model):
        return (_scores(exact_scan(model, tokens, _metric, progress=False)),
                _scores(attribution_scan(model, tokens, _metric, estimator="atp*")), model.pattern(tokens, 1).tolist())

    a, b = (from_hf_model(*tiny_llama(seed=s)) for s in (0, 1))
    solo = [results(a), results(b)]
    assert solo[0] != solo[1]
    for _ in range(2):
        assert [results(a), results(b)] == solo
    for seed in (2, 3):
        del a
        gc.collect()
        a = from_hf_model(*tiny_llama(seed=seed))
        naive = {(la, h): v for la, h, v in _scores(naive_scan(a, tokens, _metric))}
        assert {(la, h): v for la, h, v in results(a)[0]} == pytest.approx(naive, abs=1e-5)


# ---- results files that cannot be written -------------------------------------------------------------------
def test_results_paths_that_cannot_be_written_are_refused_before_any_work(worlds, tmp_path):
    """A directory given as a scan's out deleted a sibling '<dir>.csv' (the twin) before refusing; a '.csv' out
    had its JSON overwritten by its own CSV twin (the resume then failed); a bad out was found only after the
    first chunk's forwards; an --out that is a file said "File exists"; FactWorld.save wrote in place and raised
    raw OSErrors."""
    from gather_aggregate.core.results_io import out_dir, write_table
    from gather_aggregate.scan.exact import exact_scan
    from gather_aggregate.tasks.facts import FactWorld

    model, tokens, _ = worlds["llama-kv"]
    (tmp_path / "file").write_text("x")
    (tmp_path / "results").mkdir()
    (tmp_path / "results.csv").write_text("the user's own file")
    forwards = []

    def counting(logits):
        forwards.append(1)
        return _metric(logits)

    cases = {tmp_path / "file" / "scan.json": "is a file, not a directory",
             tmp_path / "file" / "deeper" / "scan.json": "is a file, not a directory",
             tmp_path / "results": "is a directory", tmp_path / "scan.csv": "pass the .json path"}
    before = sorted(tmp_path.rglob("*"))
    for path, needle in cases.items():
        with pytest.raises(InputError, match=needle):
            exact_scan(model, tokens, counting, out=path, progress=False)
        with pytest.raises(InputError, match=needle):
            write_table([{"a": 1}], path)
    assert not forwards and sorted(tmp_path.rglob("*")) == before
    assert (tmp_path / "results.csv").read_text() == "the user's own file"
    with pytest.raises(InputError, match="file' is a file, not a directory\); pass --out with a directory"):
        out_dir(tmp_path / "file", "x")
    with pytest.raises(InputError, match="is a file, not a directory"):
        FactWorld.random(n_entities=4, n_attributes=2).save(tmp_path / "file" / "facts.json")
    assert sorted(tmp_path.rglob("*")) == before
