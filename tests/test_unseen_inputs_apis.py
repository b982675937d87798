"""The APIs the misuse passes did not reach, given what a newcomer passes: ``hybridise`` (teachers, kept heads, sizes),
the lm-eval model's ``model_args`` and the Ray path's options.  Each case that was a failure names it in a comment
(what happened before); it is now correct or one line of our own errors naming the fix, before any model loads or
any cluster starts.  (Checkpoints on disk and models in memory: ``test_unseen_inputs.py``; the CLI: ``test_unseen_inputs_cli.py``.)
"""

from __future__ import annotations

import pytest
import torch
from error_checks import one_line as _one_line

from gather_aggregate.core.errors import InputError, ModelLoadError, UnsupportedModelError

TOL = 1e-4


# ---- hybridise ------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def llama_teacher(tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval()


def test_hybridise_takes_load_models_transformer_and_a_zoo_name(llama_teacher, llama_model, tiny_llama_dir):
    """load_model's own model of a Llama was "the teacher's weights lack 'model.embed_tokens.weight'" (the bridge
    renames HF's parameters); a zoo name was "has no config.json"."""
    from gather_aggregate.hybridise import hybridise
    from gather_aggregate.zoo import list_zoo

    want = hybridise(llama_teacher, [(0, 1), (1, 3)], d_state=8).state_dict()
    for teacher in (llama_model, tiny_llama_dir, str(tiny_llama_dir)):
        got = hybridise(teacher, [(0, 1), (1, 3)], d_state=8).state_dict()
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    tokens = torch.tensor([[1, 5, 9, 3, 7, 2]])
    with torch.no_grad():  # keeping every head is the teacher itself
        assert (hybridise(llama_model, "all")(tokens) - llama_teacher(tokens).logits).abs().max() <= TOL
    if "llama-kvmc" in list_zoo():
        assert hybridise("llama-kvmc", [(0, 1)]).cfg.n_kept == 1


@pytest.mark.parametrize("kept, needle", [
    (None, "kept must be \\(layer, head\\) pairs .*got None"),  # TypeError: 'NoneType' object is not iterable
    (5, "kept must be \\(layer, head\\) pairs .*got 5"),  # TypeError: 'int' object is not iterable
    ([(0, 1.5)], "kept head must be an integer, got 1.5"),  # was truncated to head 1
    ([(True, 1)], "kept layer must be an integer, got True"),  # was read as layer 1
    ([(0, 9)], "out of range"),
    (["L0X1"], "pairs or names like 'L1H0'"),
])
def test_hybridise_kept_heads_are_checked(llama_teacher, kept, needle):
    from gather_aggregate.hybridise import hybridise

    with pytest.raises(InputError, match=needle) as err:
        hybridise(llama_teacher, kept)
    _one_line(err.value)


def test_hybridise_kept_heads_in_the_forms_scans_use(llama_teacher):
    import numpy as np

    from gather_aggregate.hybridise import hybridise

    want = hybridise(llama_teacher, [(0, 1), (1, 3)]).cfg.kept
    for kept in (np.array([[0, 1], [1, 3]]), torch.tensor([[0, 1], [1, 3]]), ["L0H1", "l1h3"], [(0, 1), (-1, -1)],
                 {(0, 1), (1, 3)}):  # an array was "truth value of an array is ambiguous"; names were refused
        assert hybridise(llama_teacher, kept).cfg.kept == want
    assert hybridise(llama_teacher, "ALL").cfg.n_kept == 8


@pytest.mark.parametrize("kwargs, needle", [
    (dict(d_state=0), "d_state must be >= 1"),  # was silently the default (the head dimension)
    (dict(d_state=2.5), "d_state must be an integer, got 2.5"),  # was truncated to 2
    (dict(d_state=True), "d_state must be an integer, got True"),  # was d_state=1
    (dict(d_conv=2.5), "d_conv must be an integer, got 2.5"),  # TypeError in torch.zeros
    (dict(seed="a"), "seed must be an integer"),  # RuntimeError: manual_seed expected a long
])
def test_hybridise_sizes_are_whole_numbers(llama_teacher, kwargs, needle):
    from gather_aggregate.hybridise import hybridise

    with pytest.raises(InputError, match=needle) as err:
        hybridise(llama_teacher, "none", **kwargs)
    _one_line(err.value)


def test_hybridise_refuses_what_it_cannot_convert_by_name(tmp_path, llama_teacher, tiny_gpt2_dir):
    from gather_aggregate.hybridise import hybridise
    from gather_aggregate.testing.tiny_models import tiny_llama
    from gather_aggregate.testing.tiny_ssm import tiny_hf_ssm

    cases = [(tiny_gpt2_dir, UnsupportedModelError, "takes a Llama-family transformer .*got 'gpt2'"),
             (tiny_hf_ssm("mamba2"), UnsupportedModelError, "got 'mamba2'"),
             (tiny_llama(attention_bias=True)[0], UnsupportedModelError, "this teacher has attention_bias"),
             (tiny_llama(rope_scaling={"rope_type": "linear", "factor": 2.0})[0], UnsupportedModelError,
              "this teacher has rope_type 'linear'"),
             (tmp_path / "nope", ModelLoadError, "no such model directory"),
             (3, InputError, "takes a Llama directory, a zoo name, an HF LlamaForCausalLM .*got int")]
    for teacher, cls, needle in cases:
        with pytest.raises(cls, match=needle) as err:
            hybridise(teacher, [(0, 1)])
        _one_line(err.value)


# ---- the lm-eval model ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, needle", [
    ("batch_size=abc", "batch_size='abc': pass a whole number"),  # each was int()'s ValueError
    ("max_length=x", "max_length='x': pass a whole number"),
    ("max_gen_toks=x", "max_gen_toks='x': pass a whole number"),
    ("head_size=x", "head_size='x': pass a whole number"),
    ("n_reference=x", "n_reference='x': pass a whole number"),
    ("seed=x", "seed='x': pass a whole number"),
    ("batch_size=2.5", "batch_size=2.5: pass a whole number"),  # was truncated to 2
    ("max_length=-5", "max_length=-5: use a whole number of at least 1"),  # was accepted
    ("max_gen_toks=-1", "max_gen_toks=-1: use a whole number of at least 1"),  # was accepted
    ("chat_template=5", "chat_template=5: pass 'default' or a Jinja template string"),  # was accepted
    ("pretrained=", "pretrained= is empty"),  # was "'.' has no config.json"
])
def test_lm_eval_model_args_are_checked_before_the_model_loads(tiny_llama_dir, monkeypatch, args, needle):
    pytest.importorskip("lm_eval", reason="needs the lmeval extra")
    import gather_aggregate.models.loading as loading
    from gather_aggregate.lm_eval.model import GatherAggregateLM

    def never(*a, **k):
        raise AssertionError("the model loaded before its arguments were checked")

    monkeypatch.setattr(loading, "load_model", never)
    text = args if args.startswith("pretrained=") else f"pretrained={tiny_llama_dir},{args}"
    with pytest.raises(InputError, match=needle) as err:
        GatherAggregateLM.create_from_arg_string(text)
    _one_line(err.value)


# ---- the Ray path ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, needle", [
    (dict(ray="127.0.0.1:6379"), "ray must be True or False .*pass ray_address='127.0.0.1:6379'"),  # ran locally
    (dict(ray=True, num_workers=2.5), "num_workers must be an integer, got 2.5"),  # Ray's resource ValueError
    (dict(ray=True, num_workers="2"), "num_workers must be an integer, got '2'"),  # TypeError: '>' not supported
    (dict(ray=True, num_workers=True), "num_workers must be an integer, got True"),  # ran with one worker
    (dict(ray_address="127.0.0.1:1", num_workers=0), "num_workers must be at least 1"),
    (dict(ray_address=5), "ray_address must be 'auto' or 'host:port', got int"),
])
@pytest.mark.parametrize("job", ["exact_scan", "ablation_sweep"])
def test_ray_options_are_checked_before_any_cluster_starts(llama_model, monkeypatch, job, kwargs, needle):
    import gather_aggregate.scan.distributed as distributed
    from gather_aggregate.scan.exact import exact_scan
    from gather_aggregate.studies.ablation_tables import ablation_sweep

    def no_cluster():
        raise AssertionError("a Ray cluster was started before the options were checked")

    monkeypatch.setattr(distributed, "_ray", no_cluster)
    tokens = torch.tensor([[1, 5, 9, 3, 7], [2, 8, 4, 6, 11]])

    def metric(logits):
        return logits[:, -1, 3].mean()

    with pytest.raises(InputError, match=needle) as err:
        if job == "exact_scan":
            exact_scan(llama_model, tokens, metric, heads=[(0, 1)], progress=False, **kwargs)
        else:  # ray_address=5 was AttributeError: 'int' object has no attribute 'split'
            ablation_sweep(llama_model, tokens, metric, [[(0, 1)]], **kwargs)
    _one_line(err.value)


@pytest.mark.parametrize("shard_size, needle", [(0, "shard_size must be at least 1"),  # range() arg 3 must not be 0
                                                (2.5, "shard_size must be an integer")])  # TypeError
def test_ablation_sweep_shard_size(llama_model, shard_size, needle):
    from gather_aggregate.studies.ablation_tables import ablation_sweep

    with pytest.raises(InputError, match=needle):
        ablation_sweep(llama_model, torch.tensor([[1, 5, 9]]), lambda lg: lg[:, -1, 3].mean(), [[(0, 1)]],
                       shard_size=shard_size)


def test_lm_eval_model_takes_a_hooked_model(llama_teacher):
    """An HF model or a directory string as model= was an AttributeError ('... has no attribute tokenizer'); neither
    model nor pretrained said "not both"."""
    pytest.importorskip("lm_eval", reason="needs the lmeval extra")
    from gather_aggregate.lm_eval.model import GatherAggregateLM

    for model, needle in ((llama_teacher, "model= takes a hooked model .*from_hf_model.*got LlamaForCausalLM"),
                          ("llama-kvmc", "got str; for a directory or zoo name pass pretrained=")):
        with pytest.raises(InputError, match=needle) as err:
            GatherAggregateLM(model=model)
        _one_line(err.value)
    with pytest.raises(InputError, match="or model=<hooked model>$"):
        GatherAggregateLM()


def test_a_saved_hybrid_with_a_damaged_config_names_the_file(llama_teacher, tmp_path):
    """A hand-edited hybrid config.json: a missing field was KeyError 'kept', a size as text torch's TypeError."""
    import json
    import shutil

    from gather_aggregate import load_model
    from gather_aggregate.hybridise import hybridise

    hybridise(llama_teacher, [(0, 1)]).save_pretrained(tmp_path / "h")
    raw = json.loads((tmp_path / "h" / "config.json").read_text())
    for name, edit, needle in (("nokept", lambda c: c.pop("kept"), "missing fields \\['kept'\\]"),
                               ("text", lambda c: c.update(d_model="64"), "must be whole numbers: \\{'d_model': '64'\\}"),
                               ("oob", lambda c: c.update(kept=[[9], []]), "kept heads \\[9\\] of layer 0 out of range")):
        shutil.copytree(tmp_path / "h", tmp_path / name)
        cfg = dict(raw)
        edit(cfg)
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(ModelLoadError, match=f"config.json' is not a valid ga_head_hybrid config \\(.*{needle}") \
                as err:
            load_model(tmp_path / name, tokenizer=False)
        _one_line(err.value)
