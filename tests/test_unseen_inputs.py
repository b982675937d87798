"""A researcher who brings checkpoints the authors never made: the forms checkpoints take on disk (shards, a legacy
.bin, bf16/fp16 weights, dtype keys, tied embeddings, stale indexes, base-model weights, Git LFS stubs, folders that
hold no checkpoint, quantized ones) and HF models in memory in the forms researchers hold them.

Each case that was a failure names it in a comment (what happened before); it now loads and runs exactly, or is
one line of our own errors (gather_aggregate/errors.py) naming the fix.  Tiny random checkpoints, written here.
(hybridise, lm-eval's model and Ray: ``test_unseen_inputs_apis.py``; the CLI: ``test_unseen_inputs_cli.py``.)
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from error_checks import one_line as _one_line
from safetensors.torch import load_file

from gather_aggregate import load_model
from gather_aggregate.core.errors import (
    CheckpointError,
    GAError,
    InputError,
    ModelLoadError,
    UnsupportedModelError,
)

TOL = 1e-4


@pytest.fixture(scope="module")
def tok():
    from gather_aggregate.testing.tiny_models import bpe_tokenizer

    return bpe_tokenizer()


def _hf(family: str, vocab: int, **kw):
    from gather_aggregate.testing.tiny_hybrids import tiny_hf_hybrid
    from gather_aggregate.testing.tiny_models import tiny_llama
    from gather_aggregate.testing.tiny_ssm import tiny_hf_ssm

    if family == "llama":
        return tiny_llama(seed=2, vocab_size=vocab, **kw)[0]
    if family in ("mamba", "mamba2"):
        return tiny_hf_ssm(family, seed=2, vocab_size=vocab, **kw)
    return tiny_hf_hybrid(family, seed=2, vocab_size=vocab, **kw)


def _save(hf, tok, d, form: str):
    """``hf`` written as a checkpoint of ``form`` into ``d``; returns the fp32 HF reference of what was written."""
    if form == "sharded":  # several safetensors shards and model.safetensors.index.json
        hf.save_pretrained(d, max_shard_size="20KB")
        assert (d / "model.safetensors.index.json").is_file() and len(list(d.glob("model-*.safetensors"))) > 2
    elif form == "pytorch_model.bin":  # the legacy single pickle file (transformers 5 no longer writes one)
        hf.save_pretrained(d)
        torch.save(load_file(d / "model.safetensors"), d / "pytorch_model.bin")
        (d / "model.safetensors").unlink()
    elif form == "bf16":  # weights stored in bf16, config dtype bfloat16; loaded with dtype="float32"
        hf.to(torch.bfloat16).save_pretrained(d)
        hf.float()
    elif form == "tied":  # tie_word_embeddings: the checkpoint stores the embedding once
        hf.save_pretrained(d)
    elif form == "torch_dtype":  # an older config: torch_dtype only, and fp16 weights
        hf.half().save_pretrained(d)
        hf.float()
        cfg = json.loads((d / "config.json").read_text())
        cfg["torch_dtype"] = cfg.pop("dtype", "float16")
        (d / "config.json").write_text(json.dumps(cfg))
    tok.save_pretrained(d)
    return type(hf).from_pretrained(d, dtype=torch.float32).eval()


@pytest.mark.parametrize("family", ["llama", "mamba", "mamba2", "bamba"])
@pytest.mark.parametrize("form", ["sharded", "pytorch_model.bin", "bf16", "torch_dtype", "tied"])
def test_checkpoint_forms_load_exactly_and_run_the_everyday_workflow(tmp_path, tok, family, form):
    from gather_aggregate.core.model_state import count_hooks, param_checksum
    from gather_aggregate.interventions.ablation import ablate, run_ablated
    from gather_aggregate.scan.exact import exact_scan

    ref = _save(_hf(family, len(tok), **({"tie_word_embeddings": True} if form == "tied" else {})), tok, tmp_path,
                form)
    assert ref.config.tie_word_embeddings == (form == "tied" or family == "mamba")  # MambaConfig ties by default
    model = load_model(tmp_path, dtype="float32")
    tokens = model.to_tokens(["apple:12 river:7 stone:3 river", "The quick brown fox jumps over"])
    with torch.no_grad():
        want = ref(tokens).logits
        assert (model(tokens) - want).abs().max() <= TOL
        logits, cache = model.run_with_cache(tokens)
    assert (logits - want).abs().max() <= TOL and len(cache) > 0
    last = model.n_layers - 1
    pattern = model.pattern(tokens, last)  # attention or SSM-implied attention: rows are distributions
    assert pattern.shape[-2:] == (tokens.shape[1], tokens.shape[1]) and torch.isfinite(pattern).all()
    target = tokens[:, -1]

    def metric(lg):
        return lg[:, -2].log_softmax(-1).gather(1, target[:, None]).mean()

    heads = model.all_heads()[:2]
    scan = exact_scan(model, tokens, metric, heads=heads, progress=False)
    hooks, before = count_hooks(model), param_checksum(model)
    with torch.no_grad():
        for row in scan.rows:  # the scan's number is the ablated forward's
            drop = float(metric(want)) - float(metric(run_ablated(model, tokens, [(row["layer"], row["head"])])))
            assert row["score"] == pytest.approx(drop, abs=1e-4)
        with ablate(model, heads[:1]):
            ablated = model(tokens)
    assert torch.allclose(ablated, run_ablated(model, tokens, heads[:1]))
    assert count_hooks(model) == hooks and param_checksum(model) == before


@pytest.mark.parametrize("family", ["llama", "mamba2", "bamba"])
def test_a_sharded_checkpoint_saved_again_whole_loads_the_newer_weights_as_hf_does(tmp_path, tok, family):
    """save_pretrained leaves the old model.safetensors.index.json when a sharded model is re-saved whole (HF loads
    model.safetensors first).  Was: "checkpoint shard(s) ... are missing" (every family); and with the old shards
    still there, an SSM or hybrid silently loaded the old weights (logits 2.8 off HF's)."""
    old, new = _hf(family, len(tok)), _hf(family, len(tok))
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.1 * torch.randn_like(p))
    old.save_pretrained(tmp_path / "again", max_shard_size="20KB")
    new.save_pretrained(tmp_path / "again")  # removes the old shards, keeps the index
    shutil.copytree(tmp_path / "again", tmp_path / "kept")
    old.save_pretrained(tmp_path / "shards", max_shard_size="20KB")
    for shard in (tmp_path / "shards").glob("model-*.safetensors"):  # the old shards still beside the new file
        shutil.copy(shard, tmp_path / "kept")
    tokens = torch.tensor([[1, 5, 9, 3, 7, 2]])
    for d in (tmp_path / "again", tmp_path / "kept"):
        assert (d / "model.safetensors.index.json").is_file() and (d / "model.safetensors").is_file()
        with torch.no_grad():
            want = type(new).from_pretrained(d).eval()(tokens).logits
            assert (load_model(d, tokenizer=False)(tokens) - want).abs().max() <= TOL
            assert (want - new(tokens).logits).abs().max() <= TOL  # HF loads the newer weights


@pytest.mark.parametrize("family", ["mamba", "mamba2", "bamba"])
def test_weights_saved_from_the_base_model_load_as_hf_loads_them(tmp_path, tok, family):
    """A causal LM's config with the base model's weights (keys ``layers.0...``, no ``backbone.``/``model.``; tied
    embeddings): HF adds the prefix.  Was "missing keys (20)" for every SSM and hybrid."""
    from safetensors.torch import save_file

    hf = _hf(family, len(tok), tie_word_embeddings=True)
    hf.save_pretrained(tmp_path)
    dot = hf.base_model_prefix + "."
    save_file({k.removeprefix(dot): v for k, v in load_file(tmp_path / "model.safetensors").items()},
              tmp_path / "model.safetensors", metadata={"format": "pt"})
    tokens = torch.tensor([[1, 5, 9, 3, 7, 2]])
    with torch.no_grad():
        want = type(hf).from_pretrained(tmp_path).eval()(tokens).logits
        assert (want - hf(tokens).logits).abs().max() <= TOL
        assert (load_model(tmp_path, tokenizer=False)(tokens) - want).abs().max() <= TOL


@pytest.mark.parametrize("family", ["llama", "mamba", "bamba"])
def test_a_config_with_dtype_and_torch_dtype_disagreeing_loads_as_hf_does(tmp_path, tok, family):
    hf = _hf(family, len(tok))
    hf.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "dtype": "float32", "torch_dtype": "bfloat16"}))
    want = next(type(hf).from_pretrained(tmp_path).parameters()).dtype
    assert next(load_model(tmp_path).parameters()).dtype == want == torch.float32  # `dtype` wins, as in HF


def test_paths_that_hold_no_checkpoint_name_what_to_load(tmp_path, tok, tiny_llama_dir, monkeypatch):
    cases = []
    peft = tmp_path / "lora"  # a PEFT adapter; was "has no config.json; save the model there"
    peft.mkdir()
    (peft / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "org/base", "peft_type": "LORA"}))
    (peft / "adapter_model.safetensors").write_bytes(b"")
    cases.append((peft, "holds a PEFT adapter of 'org/base'.*merge_and_unload"))
    repo = tmp_path / "hub" / "models--org--tiny"  # the HF cache's folder of a repo; was "has no config.json"
    shutil.copytree(tiny_llama_dir, repo / "snapshots" / "abc123")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    cases.append((repo, "Hugging Face cache folder; load its snapshot: load_model\\('.*snapshots/abc123'\\)"))
    outer = tmp_path / "download"  # an archive unpacked into a folder of its own; was "has no config.json"
    shutil.copytree(tiny_llama_dir, outer / "tiny-llama")
    cases.append((outer, "did you mean load_model\\('.*download/tiny-llama'\\)"))
    only_tok = tmp_path / "tok"  # was "has no config.json; save the model there"
    tok.save_pretrained(only_tok)
    cases.append((only_tok, "holds only a tokenizer; the model's config.json and weights are missing"))
    (tmp_path / "empty").mkdir()
    cases.append((tmp_path / "empty", "is empty"))
    cases.append((tiny_llama_dir / "model.safetensors", f"is a file of a checkpoint; pass its directory: "
                                                        f"load_model\\('{tiny_llama_dir}'\\)"))
    (tmp_path / "m.gguf").write_bytes(b"GGUF\x03\x00\x00\x00")  # was "is a file; pass the model directory"
    cases.append((tmp_path / "m.gguf", "is a GGUF file; load_model reads Hugging Face checkpoints"))
    for path, needle in cases:
        with pytest.raises(ModelLoadError, match=needle) as err:
            load_model(path)
        _one_line(err.value)
    monkeypatch.setenv("HOME", str(tmp_path))  # `~` and a pathlib.Path name the same checkpoint
    shutil.copytree(tiny_llama_dir, tmp_path / "ckpt")
    tokens = torch.tensor([[1, 5, 9, 3]])
    with torch.no_grad():
        torch.testing.assert_close(load_model("~/ckpt")(tokens), load_model(tmp_path / "ckpt")(tokens))


def test_a_config_with_fewer_layers_than_its_weights_is_refused(tmp_path, tiny_llama_dir):
    """Was: loaded silently as a 1-layer model (HF drops the extra layers with a warning); the SSM loader refused."""
    shutil.copytree(tiny_llama_dir, tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 1}))
    with pytest.raises(CheckpointError, match="holds layers up to 1, but its config.json has num_hidden_layers=1.*"
                                              "set num_hidden_layers=2") as err:
        load_model(tmp_path / "m")
    _one_line(err.value)


@pytest.mark.parametrize("family", ["llama", "mamba2", "bamba"])
def test_quantized_checkpoints_are_one_line(tmp_path, tok, family):
    """Was: transformers' ImportError (a transformer), or the quantization config silently ignored (an SSM or hybrid,
    whose loader copies stored tensors as floats: packed integer weights would load as nonsense)."""
    hf = _hf(family, len(tok))
    hf.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    if family == "llama":
        try:
            import bitsandbytes  # noqa: F401
            pytest.skip("bitsandbytes is installed: transformers loads the checkpoint itself")
        except ImportError:
            pass
        cls, needle = ModelLoadError, "is quantized \\(quant_method 'bitsandbytes'\\) and transformers cannot load it"
    else:
        cls, needle = UnsupportedModelError, "is quantized .*load the model's unquantized checkpoint"
    with pytest.raises(cls, match=needle) as err:
        load_model(tmp_path)
    assert isinstance(err.value, GAError)
    _one_line(err.value)


# ---- models in memory in the forms researchers hold them -------------------------------------------------------------
@pytest.fixture(scope="module")
def llama_teacher(tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval()


def test_from_hf_model_unwraps_compiled_and_data_parallel_models(llama_teacher, llama_model):
    """torch.compile's OptimizedModule was "model_type 'llama' (OptimizedModule) is not supported"; DataParallel was
    "from_hf_model takes an in-memory transformers model, got DataParallel"."""
    from gather_aggregate import from_hf_model

    tokens = torch.tensor([[1, 5, 9, 3, 7, 2]])
    with torch.no_grad():
        want = llama_teacher(tokens).logits
        for wrapped in (torch.compile(llama_teacher), torch.nn.DataParallel(llama_teacher)):
            assert (from_hf_model(wrapped)(tokens) - want).abs().max() <= TOL


def test_base_models_without_an_lm_head_and_meta_models_are_named(tmp_path, tok, tiny_llama_dir):
    """AutoModel.from_pretrained gives the base model: it was a bridge AttributeError ('LlamaModel' object has no
    attribute 'model') or "missing keys (21)" for an SSM; a meta-device model was NotImplementedError (aten::equal)
    or, for a transformer, a BridgeModel without values."""
    from transformers import AutoModel

    from gather_aggregate import from_hf_model

    ssm = _hf("mamba2", len(tok))
    ssm.save_pretrained(tmp_path / "m2")
    for base, name in ((AutoModel.from_pretrained(tiny_llama_dir), "LlamaModel"),
                       (AutoModel.from_pretrained(tmp_path / "m2"), "Mamba2Model")):
        with pytest.raises(UnsupportedModelError, match=f"got {name}, a base model without a language-model head.*"
                                                        f"use {name[:-5]}ForCausalLM") as err:
            from_hf_model(base)
        _one_line(err.value)
        base.save_pretrained(tmp_path / name)  # and the checkpoint it saves (was: "the bridge has no adapter")
        tok.save_pretrained(tmp_path / name)
        with pytest.raises(UnsupportedModelError, match=f"is {name}, a base model without a language-model head"):
            load_model(tmp_path / name)
    with torch.device("meta"):
        meta = _hf("mamba", len(tok))
    with pytest.raises(InputError, match="parameters on the meta device"):
        from_hf_model(meta)


def test_git_lfs_pointers_in_place_of_weights_or_tokenizer_say_git_lfs_pull(tmp_path, tok):
    """A repository cloned without git-lfs holds ~130-byte text stubs: they were "damaged or truncated", torch's advice
    to retry with weights_only=False (a .bin), or "Expecting value: line 1 column 1" (tokenizer.json)."""
    from gather_aggregate.core.errors import TokenizerMissingError

    pointer = "version https://git-lfs.github.com/spec/v1\noid sha256:4d7a2146\nsize 12345\n"
    for family in ("llama", "mamba2"):
        for form, stub in (("single", "model.safetensors"), ("bin", "pytorch_model.bin"), ("shard", "model-00001-*")):
            d = tmp_path / f"{family}-{form}"
            _hf(family, len(tok)).save_pretrained(d, **({"max_shard_size": "20KB"} if form == "shard" else {}))
            if form == "bin":
                (d / "model.safetensors").rename(d / stub)
            next(d.glob(stub)).write_text(pointer)
            with pytest.raises(CheckpointError, match="is a Git LFS pointer, not the file itself .*git lfs pull") as err:
                load_model(d, tokenizer=False)
            _one_line(err.value)
    tok.save_pretrained(tmp_path / "llama-single")
    (tmp_path / "llama-single" / "tokenizer.json").write_text(pointer)
    with pytest.raises(TokenizerMissingError, match="tokenizer.json' is a Git LFS pointer"):
        load_model(tmp_path / "llama-single")
