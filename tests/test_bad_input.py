"""Issue 25: bad input gets a one-line error of the project's own classes that names the fix.

Kinds covered: damaged files, unknown model types, names that are neither a
directory nor a zoo model, devices, malformed heads, empty batches, metrics of
the wrong type (every scan, AtP included), resample ablation onto itself, and
prompts longer than a hybrid's positions.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from error_checks import one_line as _one_line

from gather_aggregate import load_model
from gather_aggregate.core.errors import (
    CheckpointError,
    ContextLengthError,
    GAError,
    InputError,
    ModelLoadError,
    UnsupportedModelError,
)
from gather_aggregate.interventions.ablation import resample_index
from gather_aggregate.scan.exact import atp_scan, exact_scan, naive_scan
from gather_aggregate.scan.patching import patch_heads
from gather_aggregate.zoo import list_zoo


# ---- files and names ---------------------------------------------------------------------
@pytest.mark.parametrize("zoo_name", ["llama-kvmc", "mamba2-ga"])
def test_truncated_weights_are_one_clear_error(tmp_path, zoo_name):
    src = list_zoo().get(zoo_name)
    if src is None:
        pytest.skip("the toy zoo is not shipped")
    d = tmp_path / zoo_name
    shutil.copytree(src, d)
    weights = next(p for p in d.iterdir() if p.suffix in (".safetensors", ".bin"))
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="damaged or truncated") as err:  # both load paths: one class
        load_model(d)
    _one_line(err.value)
    weights.write_bytes(b"\x00" * 16)  # garbage, not just short
    with pytest.raises(CheckpointError, match="damaged or truncated"):
        load_model(d)


def test_unknown_model_type_and_damaged_config(tmp_path, tiny_llama_dir):
    d = tmp_path / "m"
    shutil.copytree(tiny_llama_dir, d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "model_type": "banana-lm", "architectures": ["BananaLM"]}))
    with pytest.raises(UnsupportedModelError, match="'banana-lm'.*Supported SSM/hybrid model types") as err:
        load_model(d)
    _one_line(err.value)
    (d / "config.json").write_text('{"model_type": "llama", ')
    with pytest.raises(ModelLoadError, match="config.json.*damaged"):
        load_model(d)


def _edit_config(src, dst, **changes):
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**cfg, **changes}))
    return dst


def test_configs_that_do_not_match_their_weights_or_are_inconsistent(tmp_path, tiny_llama_dir):
    # one layer more than the weights hold: HF would initialise it at random and only warn
    with pytest.raises(CheckpointError, match="does not match its config: missing keys.*same model") as err:
        load_model(_edit_config(tiny_llama_dir, tmp_path / "deeper", num_hidden_layers=3))
    _one_line(err.value)
    with pytest.raises(CheckpointError, match="do not have the shapes its config.json gives.*same model") as err:
        load_model(_edit_config(tiny_llama_dir, tmp_path / "wider", hidden_size=32))
    _one_line(err.value)
    # transformers' own config checks (ZeroDivisionError, multi-line validation errors) become one line
    with pytest.raises(ModelLoadError, match="cannot read the config.*fix config.json") as err:
        load_model(_edit_config(tiny_llama_dir, tmp_path / "noheads", num_attention_heads=0))
    _one_line(err.value)
    (tmp_path / "wider" / "model.safetensors").unlink()  # was "the file is damaged or truncated"
    with pytest.raises(ModelLoadError, match="no weights in .*save the model with model.save_pretrained"):
        load_model(tmp_path / "wider")
    (tmp_path / "deeper" / "config.json").write_text("[1, 2]")
    with pytest.raises(ModelLoadError, match="JSON list, not an object"):
        load_model(tmp_path / "deeper")


def test_options_and_tokenizers_are_checked_before_loading(tiny_llama_dir, tmp_path):
    from gather_aggregate import from_hf_model
    from gather_aggregate.core.errors import TokenizerMissingError
    from gather_aggregate.testing.tiny_models import tiny_llama

    with pytest.raises(InputError, match=r"unknown option\(s\) \['hed_size'\].*head_size, max_memory"):
        load_model(tiny_llama_dir, hed_size=2)
    with pytest.raises(TokenizerMissingError, match="no such directory"):
        load_model(tiny_llama_dir, tokenizer=str(tmp_path / "no" / "tok"))
    with pytest.raises(InputError, match="tokenizer must be a tokenizer"):
        load_model(tiny_llama_dir, tokenizer=3)
    assert load_model(tiny_llama_dir, tokenizer=str(tiny_llama_dir)).to_tokens("apple").shape[0] == 1
    hf, tok = tiny_llama()
    for bad in ("my-model-dir", None, torch.nn.Linear(2, 2)):
        with pytest.raises(InputError, match="in-memory transformers model.*use load_model"):
            from_hf_model(bad)
    with pytest.raises(InputError, match="tokenizer must be a tokenizer"):  # a directory works (test_misuse.py)
        from_hf_model(hf, tokenizer=3)


def test_zoo_names_typos_and_missing_paths(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    zoo = list_zoo()
    if "llama-kvmc" not in zoo:
        pytest.skip("the toy zoo is not shipped")
    assert load_model("llama-kvmc").n_layers == 4  # a zoo name works in Python as in the CLI
    with pytest.raises(ModelLoadError, match="did you mean the zoo model 'llama-kvmc'"):
        load_model("llama-kvm")
    (tmp_path / "my-model").mkdir()
    with pytest.raises(ModelLoadError, match="no such model directory.*did you mean .*my-model"):
        load_model(str(tmp_path / "my-modle"))
    with pytest.raises(ModelLoadError, match="no such model directory"):
        load_model("./no/such/dir")
    with pytest.raises(ModelLoadError, match="hub is offline"):
        load_model("some-org/some-model")


@pytest.mark.parametrize("device,needle", [("banana", "unknown device"), ("cuda:7", "CUDA"), (3.5, "unknown device")])
def test_devices(tiny_llama_dir, device, needle):
    if torch.cuda.is_available() and str(device).startswith("cuda") and torch.cuda.device_count() > 7:
        pytest.skip("this machine has that device")
    with pytest.raises(InputError, match=needle) as err:
        load_model(tiny_llama_dir, device=device)
    _one_line(err.value)


# ---- heads ------------------------------------------------------------------------------
@pytest.mark.parametrize("heads,needle", [
    ([(1, 1.7)], "head must be an integer, got 1.7"),
    ([(1.0, 0)], "layer must be an integer"),
    ([(True, 0)], "layer must be an integer"),
    (["x"], "cannot read head 'x'"),
    ([((1, 0), 1)], "layer must be an integer"),
    ([(1, 0, 2)], "pairs of ints"),
    ((1, 0), "for one head write"),
    ("L1H0", "list of (layer, head) pairs"),
    ([(9, 0)], "out of range"),
    ([(1, 0), (0, 1), (1, -4)], "head L1H0 is given twice in heads (as (1, 0) and (1, -4))"),  # 4 heads a layer
    (["L1H0", (1, 0)], "given twice"),
])
def test_malformed_heads(llama_model, heads, needle):
    with pytest.raises(GAError, match=needle.replace("(", r"\(").replace(")", r"\)")) as err:
        llama_model.check_head_set(heads)
    _one_line(err.value)


def test_head_names_and_integer_types_are_accepted(llama_model):
    import numpy as np

    assert llama_model.check_head_set(["L1H0", (np.int64(1), torch.tensor(2))]) == [(1, 0), (1, 2)]
    assert llama_model.check_heads(1, torch.tensor([0, 3])) == [0, 3]
    with pytest.raises(InputError, match="integer"):
        llama_model.check_heads(1, [0.5])
    with pytest.raises(InputError, match="integer"):
        llama_model.check_layer(1.0)


# ---- batches and metrics ----------------------------------------------------------------------
def _metric(logits):
    return logits[:, -1].log_softmax(-1)[:, 1].mean()


def test_empty_batch_is_refused_by_every_scan(llama_model):
    empty = torch.zeros((0, 5), dtype=torch.long)
    for scan in (naive_scan, exact_scan, atp_scan):
        with pytest.raises(InputError, match="batch is empty"):
            scan(llama_model, empty, _metric)
    with pytest.raises(InputError, match="batch is empty"):
        patch_heads(llama_model, empty, empty, _metric)


@pytest.mark.parametrize("bad,needle", [
    (None, "metric must be a function"),
    ("logprob", "metric must be a function"),
    (lambda logits: "high", "return a (scalar )?tensor"),
    (lambda logits: {"m": 1.0}, "return a (scalar )?tensor"),
    (lambda logits: logits[:, -1, :2], "must return a scalar"),
])
def test_metric_of_the_wrong_type_in_every_scan(llama_model, bad, needle):
    tokens = torch.randint(0, 50, (2, 6))
    for scan in (naive_scan, exact_scan, atp_scan):
        with pytest.raises(GAError, match=needle) as err:
            scan(llama_model, tokens, bad, heads=[(1, 0)])
        _one_line(err.value)
    with pytest.raises(GAError, match=needle):
        patch_heads(llama_model, tokens, tokens.flip(0), bad, heads=[(1, 0)])


def test_scan_options_resume_files_and_scan_tables(llama_model, tmp_path):
    from gather_aggregate.core.errors import ResumeMismatchError
    from gather_aggregate.core.protocol import count_hooks
    from gather_aggregate.scan.exact import ScanResult

    tokens = torch.randint(0, 50, (2, 6))
    for bad, needle in ((0, "max_rows=0: pass a positive"), (-4, "max_rows=-4"), (2.5, "max_rows must be an integer")):
        with pytest.raises(InputError, match=needle):  # each was accepted and ignored
            exact_scan(llama_model, tokens, _metric, heads=[(1, 0)], max_rows=bad, progress=False)
    with pytest.raises(InputError, match="resume=True needs out=PATH"):  # was silently a fresh scan
        exact_scan(llama_model, tokens, _metric, heads=[(1, 0)], resume=True, progress=False)
    with pytest.raises(InputError, match="is a directory; pass a file path in it"):  # was IsADirectoryError
        exact_scan(llama_model, tokens, _metric, heads=[(1, 0)], out=tmp_path, progress=False)
    out = tmp_path / "scan.json"
    for text in ("[]", '{"meta": 3, "rows": 5}', '{"meta": {}, "rows": [{"layer": 1}]}'):
        out.write_text(text)  # valid JSON that is no scan table: was an AttributeError
        with pytest.raises(ResumeMismatchError, match="not a scan table.*drop --resume") as err:
            exact_scan(llama_model, tokens, _metric, heads=[(1, 0)], out=out, resume=True, progress=False)
        _one_line(err.value)
        with pytest.raises(InputError, match="is not a scan table"):
            ScanResult.load(out)
    with pytest.raises(InputError, match="no scan file at"):  # was FileNotFoundError
        ScanResult.load(tmp_path / "nope.json")
    out.write_text("{oops")
    with pytest.raises(InputError, match="not valid JSON"):  # was JSONDecodeError
        ScanResult.load(out)
    assert count_hooks(llama_model) == 0


def test_hook_names_start_layers_and_detector_arguments(llama_model):
    from gather_aggregate.core.protocol import count_hooks, param_checksum
    from gather_aggregate.detect.detector import find_ga_heads
    from gather_aggregate.tasks import evaluate, get_task

    before = param_checksum(llama_model)
    exs = get_task("kv", n_pairs=2).examples(llama_model.tokenizer, 2)
    with pytest.raises(InputError, match="no hook named 'blocks.9.attn.hook_z'.*head_hook") as err:  # was KeyError
        evaluate(llama_model, exs, fwd_hooks=[("blocks.9.attn.hook_z", lambda t, hook: t)])
    _one_line(err.value)
    with pytest.raises(InputError, match="must be \\(hook_name, fn\\) pairs"):
        evaluate(llama_model, exs, fwd_hooks=["blocks.0.attn.hook_z"])
    name = llama_model.head_hook(0)[0]
    assert evaluate(llama_model, exs, fwd_hooks=[(name, lambda t, hook: t)]).accuracy == evaluate(llama_model,
                                                                                                  exs).accuracy
    with pytest.raises(InputError, match="start_at_layer=.1. is out of range: use an int"):  # was a TypeError (int < str)
        llama_model(torch.zeros(1, 3, 64), start_at_layer="1")
    with pytest.raises(InputError, match="scan must be a ScanResult"):  # was AttributeError: no .scores
        find_ga_heads(llama_model, exs, scan="scan.json")
    with pytest.raises(InputError, match="max_candidates=0: pass a positive int"):  # was an empty, silent answer
        find_ga_heads(llama_model, exs, max_candidates=0)
    assert count_hooks(llama_model) == 0 and param_checksum(llama_model) == before


def test_run_with_hooks_and_hooks_refuse_unknown_hook_names_on_every_kind_of_model(llama_model):
    """TransformerLens raises a bare ``KeyError`` for a hook name the model lacks; the hooked models (bridge and our
    SSMs) say which names to use, in ``run_with_hooks`` and ``hooks`` alike; a name filter still passes."""
    from gather_aggregate.adapters import load_ssm
    from gather_aggregate.core.protocol import count_hooks
    from gather_aggregate.testing.tiny_ssm import tiny_hf_ssm

    for model in (llama_model, load_ssm(tiny_hf_ssm("mamba2", seed=0))):
        toks = torch.randint(0, 50, (1, 5))
        bad = [("blocks.9.hook_nope", lambda t, hook: t)]
        with pytest.raises(InputError, match="no hook named 'blocks.9.hook_nope'.*head_hook") as err:
            model.run_with_hooks(toks, fwd_hooks=bad)
        _one_line(err.value)
        with pytest.raises(InputError, match="no hook named"):
            with model.hooks(fwd_hooks=bad):
                pass
        with pytest.raises(InputError, match="no hook named"):
            model.run_with_hooks(toks, bwd_hooks=bad)
        seen = []
        out = model.run_with_hooks(toks, fwd_hooks=[(lambda n: n.endswith("hook_resid_pre"),
                                                     lambda t, hook, seen=seen: seen.append(hook.name))])
        torch.testing.assert_close(out, model(toks))
        assert len(seen) == model.n_layers and count_hooks(model) == 0


def test_atp_needs_a_tensor_metric(llama_model):
    tokens = torch.randint(0, 50, (2, 6))
    with pytest.raises(InputError, match="AtP needs the metric to return a tensor"):
        atp_scan(llama_model, tokens, lambda logits: float(_metric(logits)))


# ---- resample ablation ------------------------------------------------------------------------
def test_resample_is_a_derangement_and_refuses_itself(llama_model):
    tokens = torch.randint(0, 50, (7, 6))
    for seed in range(5):
        idx = resample_index(tokens, tokens, seed)
        assert sorted(idx.tolist()) == list(range(7)) and all(int(i) != b for b, i in enumerate(idx))
    # a reference that contains the inputs at other positions: never the example itself
    ref = torch.cat([tokens[3:], tokens[:3]])
    idx = resample_index(tokens, ref, 0)
    assert all(not torch.equal(ref[int(i)], tokens[b]) for b, i in enumerate(idx))
    with pytest.raises(InputError, match="one-example reference"):
        exact_scan(llama_model, tokens[:1], _metric, method="resample", reference=tokens[:1], heads=[(1, 0)])
    with pytest.raises(InputError, match="every reference prompt equals input prompt"):
        resample_index(tokens[:2], tokens[:1].expand(3, -1), 0)
    # the scan equals a naive loop that resamples with the same derangement; scores are not diluted to 0
    fast = exact_scan(llama_model, tokens, _metric, method="resample", reference=tokens, progress=False)
    slow = naive_scan(llama_model, tokens, _metric, method="resample", reference=tokens)
    assert fast.scores().keys() == slow.scores().keys()
    assert all(abs(fast.scores()[h] - slow.scores()[h]) < 1e-4 for h in fast.scores())


# ---- positions ----------------------------------------------------------------------------
def test_prompt_longer_than_a_hybrids_positions():
    path = list_zoo().get("bamba-ga")
    if path is None:
        pytest.skip("the toy zoo is not shipped")
    model = load_model(path)
    n = json.loads((path / "config.json").read_text())["max_position_embeddings"]
    assert model.n_ctx == n
    too_long = torch.zeros((1, n + 1), dtype=torch.long)
    with pytest.raises(ContextLengthError, match=f"context is {n}"):
        model(too_long)
    with pytest.raises(ContextLengthError):
        exact_scan(model, too_long, _metric, heads=[(1, 0)])


def test_print_gaheads_is_a_short_summary():
    from gather_aggregate.detect.detector import GAHeads

    table = [{"layer": la, "head": h, "gather": 0.1, "aggregate": 0.2} for la in range(4) for h in range(8)]
    ga = GAHeads(table, gather=[(0, 2)], aggregate=[(1, 0), (1, 3)], pairs=[((0, 2), (1, 0))],
                 reading={"gather": "gather", "aggregate": "aggregate"},
                 evidence={(0, 2): "alone", (1, 0): "joint", (1, 3): "joint"})
    text = str(ga)
    assert text == repr(ga) and "\n" not in text and len(text) < 300
    assert "L0H2 (alone)" in text and "L1H3 (joint)" in text and "L0H2->L1H0" in text and "32 heads" in text


def test_resample_hooks_give_each_prompt_another_prompts_outputs_in_any_batching():
    """``ablate --ablation resample`` (remove_only): every prompt takes the head outputs of another prompt of the
    set (a derangement), however the evaluator batches them; before, batches reused the reference rows modulo
    and a prompt could get its own outputs back."""
    from gather_aggregate.core.protocol import pad_id_of
    from gather_aggregate.interventions.ablation import head_outputs, resample_hooks
    from gather_aggregate.studies.ablation_tables import remove_only
    from gather_aggregate.studies.claims import task_sets
    from gather_aggregate.tasks import evaluate
    from gather_aggregate.tasks.base import collate

    path = list_zoo().get("llama-kvmc")
    if path is None:
        pytest.skip("the toy zoo is not shipped")
    model = load_model(path)
    kv = task_sets(model, path, 6, seed=1)["kv"]
    head = (0, 2)
    factory = resample_hooks(model, [head], kv, seed=3)
    small = evaluate(model, kv, fwd_hooks=factory, batch_size=2, progress=False)
    whole = evaluate(model, kv, fwd_hooks=factory, batch_size=6, progress=False)
    assert torch.allclose(torch.tensor([r.logprobs for r in small.results]),
                          torch.tensor([r.logprobs for r in whole.results]), atol=1e-4)
    tokens = collate(kv, pad_id_of(model.tokenizer)).tokens
    partner = resample_index(tokens, tokens, 3)
    assert all(int(j) != i for i, j in enumerate(partner))
    name, _ = model.head_hook(0)
    for i in range(len(kv)):  # by hand: example i with L0H2's output taken from its partner's prompt
        other = head_outputs(model, tokens[int(partner[i])][None], [0])[0]

        def put(z, hook, other=other):
            z = z.clone()
            z[:, :, head[1]] = other[:, : z.shape[1], head[1]]
            return z

        one = collate([kv[i]], pad_id_of(model.tokenizer))
        with torch.no_grad():
            want = model.run_with_hooks(one.tokens, fwd_hooks=[(name, put)])[0, kv[i].query_pos]
            got = model.run_with_hooks(one.tokens, fwd_hooks=factory(one))[0, kv[i].query_pos]
        assert torch.allclose(got, want, atol=1e-5)
    res = remove_only(model, [head], {"kv": kv}, method="resample", seed=3)
    assert res["ablated"]["kv"] == pytest.approx(whole.accuracy)
    with pytest.raises(InputError, match="at least two prompts"):
        resample_hooks(model, [head], kv[:1])


# ---- second audit: inputs nobody had tried ------------------------------------------------------
def test_configs_that_load_into_nothing_and_integer_dtypes(tmp_path, tiny_llama_dir):
    """A config with 0 layers or 0 positions loaded (0 heads: every scan answered nothing); a non-UTF-8
    config.json was a UnicodeDecodeError; dtype=torch.int64 was called a damaged weight file."""
    for key in ("num_hidden_layers", "max_position_embeddings"):
        with pytest.raises(ModelLoadError, match=f"has {key}=0; it must be at least 1") as err:
            load_model(_edit_config(tiny_llama_dir, tmp_path / key, **{key: 0}))
        _one_line(err.value)
    d = _edit_config(tiny_llama_dir, tmp_path / "latin1")
    (d / "config.json").write_bytes((d / "config.json").read_bytes().replace(b'"llama"', b'"llama\xff"'))
    with pytest.raises(ModelLoadError, match="config.json' is damaged.*utf-8"):
        load_model(d)
    with pytest.raises(ModelLoadError, match="torch.int64 is not a floating-point dtype"):
        load_model(tiny_llama_dir, dtype=torch.int64)


def test_examples_with_bad_fields_or_another_tokenizer(llama_model):
    """An answer past the candidates scored 0 (one candidate: 1) silently, a query past the prompt, an empty
    candidate or ids past the vocabulary were bare IndexError/RuntimeError from torch, and examples tokenised by
    another tokenizer whose ids fit the vocabulary were read as other words (a silent wrong accuracy)."""
    import dataclasses

    from gather_aggregate.core.errors import TaskError
    from gather_aggregate.tasks import evaluate, task_metric
    from gather_aggregate.tasks.base import PromptSpec, annotate
    from gather_aggregate.tasks.registry import get_task

    tok = llama_model.tokenizer
    for answer, candidates in ((5, ["cat", "dog"]), ("dog", ["cat", "dog"]), (-1, ["cat", "dog"]), (0, ["cat"])):
        with pytest.raises(TaskError, match=f"answer={answer!r} must index one of two or more candidates"):
            annotate(PromptSpec("the cat sat", [(0, 7, "a")], 0, candidates, answer), tok)
    with pytest.raises(TaskError, match="correct=4 must index the segments"):
        annotate(PromptSpec("the cat sat", [(0, 7, "a")], 4, ["cat", "dog"], 0), tok)
    ex = get_task("kv", n_pairs=2).examples(tok, 3)
    for bad, needle in (({"answer": 7}, "answer=7 must index"), ({"query_pos": 999}, "query_pos=999 is not one"),
                        ({"candidate_ids": [[]] * len(ex[0].candidates)}, "a candidate has no token ids"),
                        ({"candidate_ids": [[9999]] * len(ex[0].candidates)}, "token ids up to 9999 but the")):
        for call in (lambda e: evaluate(llama_model, e, progress=False), lambda e: task_metric(llama_model, e)):
            with pytest.raises(GAError, match=needle) as err:
                call([dataclasses.replace(ex[0], **bad), *ex[1:]])
            _one_line(err.value)
    path = list_zoo().get("llama-kv")
    if path is None:
        pytest.skip("the toy zoo is not shipped")
    zoo_model = load_model(path)  # a word-level vocabulary of 376: the tiny BPE's ids (< 300) all fit it
    with pytest.raises(InputError, match="example 0 was tokenised by another tokenizer than the model's"):
        evaluate(zoo_model, ex, progress=False)
    zoo_ex = get_task("kv", model_dir=path, n_pairs=2).examples(zoo_model.tokenizer, 2)
    from gather_aggregate.detect.detector import find_ga_heads

    for call in (evaluate, task_metric, find_ga_heads):
        with pytest.raises(InputError, match="build the examples with this model's tokenizer"):
            call(llama_model, zoo_ex)
    assert evaluate(zoo_model, zoo_ex, progress=False).n == 2  # its own examples still pass


def test_scan_files_that_are_not_text_and_outputs_under_a_file(llama_model, tmp_path):
    from gather_aggregate.core.errors import ResumeMismatchError
    from gather_aggregate.scan.exact import ScanResult

    tokens = torch.randint(0, 50, (2, 6))
    out = tmp_path / "scan.json"
    out.write_bytes(b"\xff\xfe not text")  # was a UnicodeDecodeError, on resume and on load
    with pytest.raises(ResumeMismatchError, match="not a readable scan file.*drop --resume"):
        exact_scan(llama_model, tokens, _metric, heads=[(1, 0)], out=out, resume=True, progress=False)
    with pytest.raises(InputError, match="not valid JSON"):
        ScanResult.load(out)
    with pytest.raises(InputError, match="scan.json' is a file, not a directory"):  # was NotADirectoryError
        exact_scan(llama_model, tokens, _metric, heads=[(1, 0)], out=out / "x.json", progress=False)


def test_scan_scores_by_name_and_reports_of_scans(llama_model, tmp_path):
    from gather_aggregate.report.html import write_report

    scan = exact_scan(llama_model, torch.randint(0, 50, (2, 6)), _metric, heads=[(1, 0), (1, 2)], progress=False)
    assert scan.score("L1H2") == scan.score((1, 2)) == scan.score(torch.tensor(1), 2) == scan.scores()[(1, 2)]
    with pytest.raises(InputError, match="no row for L1H1 .*scanned 2 heads"):  # was a bare KeyError
        scan.score(1, 1)
    with pytest.raises(InputError, match="a pair or a name like 'L1H2'"):
        scan.score("head two")
    assert "<table" in write_report(tmp_path / "r.html", title="scan", sections=[scan]).read_text()
    with pytest.raises(InputError, match="meta must be a dict"):  # was AttributeError: no .items
        write_report(tmp_path / "r.html", title="scan", sections=["x"], meta=["model"])


def test_cli_names_no_model_results_file_and_training_counts(tmp_path, capsys):
    """``demo --model ,,`` was a StopIteration; ``report --results FILE`` said the file did not exist; ``zoo
    train --steps -1`` trained nothing and saved the untrained model."""
    from gather_aggregate.cli.parser import main

    (tmp_path / "scan.json").write_text("{}")
    for argv, needle in ((["demo", "--model", ",,", "--out", str(tmp_path / "d")], "names no model"),
                         (["report", "--results", str(tmp_path / "scan.json")], "is a file; pass the directory"),
                         (["zoo", "train", "--steps", "-1", "--out", str(tmp_path / "z")], "--steps must be at least 1"),
                         (["zoo", "train", "--lr", "nan", "--out", str(tmp_path / "z")], "--lr must be a positive"),
                         (["zoo", "train", "--curriculum", "2", "--out", str(tmp_path / "z")], "from 0 to 1")):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert needle in err[-1] and "error (" not in err[-1], err
    assert not (tmp_path / "z").exists()


def test_unknown_head_kinds_and_patch_positions_past_the_prompt(llama_model):
    """``kinds=["mlp"]`` (or "Attn") selected no head and answered ``[]``; a patch position past the prompt wrapped
    around (99 patched position 99 % n_pos); numpy / torch positions still work."""
    import numpy as np

    tokens = torch.randint(0, 50, (2, 6))
    scan = exact_scan(llama_model, tokens, _metric, heads=[(1, 0)], progress=False)
    for call in (lambda k: scan.top(1, kinds=k), lambda k: scan.significant(kinds=k),
                 lambda k: llama_model.all_heads(kinds=k)):
        with pytest.raises(InputError, match=r"kinds: unknown name\(s\) \['mlp'\]; choose from \['attn', 'ssm'\]"):
            call(["mlp"])
    assert llama_model.all_heads(kinds=["ssm"]) == [] and len(llama_model.all_heads(kinds=("attn",))) > 0
    with pytest.raises(GAError, match=r"positions \[99\] are outside the prompts' 6 tokens"):
        patch_heads(llama_model, tokens, (tokens + 1) % 50, _metric, heads=[(1, 0)], per_position=True, positions=[99])
    rows = patch_heads(llama_model, tokens, (tokens + 1) % 50, _metric, heads=[(1, 0)], per_position=True,
                       positions=[np.int64(2), torch.tensor(-1)], progress=False).rows
    assert sorted(r["position"] for r in rows) == [2, 5]
