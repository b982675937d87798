"""Weight converters: HF save_pretrained directories, in-memory HF models, original mamba-ssm checkpoints."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from gather_aggregate.adapters import SSM_MODEL_TYPES, is_mamba_ssm_dir, load_ssm
from gather_aggregate.core.errors import CheckpointError, InputError, ModelLoadError, UnsupportedModelError
from gather_aggregate.core.protocol import param_checksum
from gather_aggregate.testing.tiny_ssm import hf_logits, tiny_hf_ssm

TOL = 1e-4



def toks(vocab=97, L=19):
    return torch.randint(0, vocab, (2, L), generator=torch.Generator().manual_seed(0))


def test_model_types():
    assert SSM_MODEL_TYPES == ("mamba", "falcon_mamba", "mamba2", "llamba")


@pytest.mark.parametrize("model_type", ["mamba", "falcon_mamba", "mamba2"])
@pytest.mark.parametrize("tied", [True, False])
def test_save_pretrained_directory(tmp_path, model_type, tied):
    hf = tiny_hf_ssm(model_type, seed=2, stress=True, tie_word_embeddings=tied)
    hf.save_pretrained(tmp_path)
    m = load_ssm(tmp_path)
    assert (m.unembed is None) == tied
    assert (m(toks()) - hf_logits(hf, toks())).abs().max() <= TOL


def test_sharded_checkpoint(tmp_path):
    hf = tiny_hf_ssm("mamba2", seed=4, stress=True, num_hidden_layers=3)
    hf.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert (load_ssm(tmp_path)(toks()) - hf_logits(hf, toks())).abs().max() <= TOL


def test_in_memory_model_is_copied_not_modified():
    hf = tiny_hf_ssm("mamba", seed=5)
    before = param_checksum(hf)
    m = load_ssm(hf)
    with torch.no_grad():
        m.blocks[0].ssm.A_log.add_(1.0)
    assert param_checksum(hf) == before
    hf_ptrs = {p.data_ptr() for p in hf.parameters()}
    assert not any(p.data_ptr() in hf_ptrs for p in m.parameters())


def test_load_model_dispatches_to_adapters(tmp_path):
    from gather_aggregate import load_model
    from gather_aggregate.testing.tiny_models import bpe_tokenizer

    tok = bpe_tokenizer()
    hf = tiny_hf_ssm("mamba2", seed=6, vocab_size=len(tok))
    hf.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    m = load_model(tmp_path)
    assert type(m).__name__ == "HookedSSM" and m.tokenizer is not None
    t = m.to_tokens(["The value of the key 'river' is", "apple"])
    got = m(t)
    for i, text in enumerate(["The value of the key 'river' is", "apple"]):
        ids = torch.tensor([tok(text)["input_ids"]])
        assert (got[i, : ids.shape[1]] - hf_logits(hf, ids)[0]).abs().max() <= TOL


def test_bf16_load(tmp_path):
    hf = tiny_hf_ssm("falcon_mamba", seed=1)
    hf.save_pretrained(tmp_path)
    m = load_ssm(tmp_path, dtype=torch.bfloat16)
    assert {p.dtype for p in m.parameters()} == {torch.bfloat16}
    out = m(toks())
    ref = hf_logits(hf, toks())
    assert (out - ref).norm() / ref.norm() < 0.05


# ------------------------------------------------------------------ original mamba-ssm layout
def write_mamba_ssm_checkpoint(directory, hf, layer: str, ssm_cfg: dict, vocab: int, tie: bool):
    """What mamba-ssm's MambaLMHeadModel.save_pretrained writes: config.json + pytorch_model.bin."""
    sd = {k.replace("backbone.embeddings.", "backbone.embedding."): v.clone() for k, v in hf.state_dict().items()}
    if tie:
        sd["lm_head.weight"] = sd["backbone.embedding.weight"]  # mamba-ssm keeps the tied copy in its state dict
    cfg = {"d_model": hf.config.hidden_size, "d_intermediate": 0, "n_layer": hf.config.num_hidden_layers,
           "vocab_size": vocab, "ssm_cfg": {"layer": layer, **ssm_cfg}, "attn_layer_idx": [], "attn_cfg": {},
           "rms_norm": True, "residual_in_fp32": True, "fused_add_norm": True, "pad_vocab_size_multiple": 8,
           "tie_embeddings": tie}
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(cfg))
    torch.save(sd, directory / "pytorch_model.bin")
    return directory


def test_mamba_ssm_mamba1_checkpoint(tmp_path):
    # vocab 101 is padded to 104 by mamba-ssm (pad_vocab_size_multiple=8): the embedding has 104 rows
    hf = tiny_hf_ssm("mamba", seed=8, stress=True, vocab_size=104, hidden_size=32, state_size=16, expand=2,
                     time_step_rank=2, tie_word_embeddings=True)
    d = write_mamba_ssm_checkpoint(tmp_path / "m1", hf, "Mamba1", {"d_state": 16, "d_conv": 4, "expand": 2,
                                                                  "dt_rank": 2}, vocab=101, tie=True)
    assert is_mamba_ssm_dir(d)
    m = load_ssm(d)
    assert m.cfg.d_vocab == 104 and m.cfg.family == "mamba1"
    assert (m(toks()) - hf_logits(hf, toks())).abs().max() <= TOL
    # load_model(dir) dispatches the same layout (no tokenizer ships with it: attach one by hand)
    from gather_aggregate import load_model

    m2 = load_model(d)
    assert m2.tokenizer is None and (m2(toks()) - m(toks())).abs().max() == 0


def test_mamba_ssm_mamba2_checkpoint(tmp_path):
    hf = tiny_hf_ssm("mamba2", seed=9, stress=True, vocab_size=104, hidden_size=32, expand=2, head_dim=8,
                     num_heads=8, n_groups=2, state_size=16, tie_word_embeddings=False)
    d = write_mamba_ssm_checkpoint(tmp_path / "m2", hf, "Mamba2", {"d_state": 16, "headdim": 8, "ngroups": 2,
                                                                  "expand": 2, "chunk_size": 16}, vocab=104, tie=False)
    m = load_ssm(d)
    assert (m.cfg.n_heads, m.cfg.d_head, m.cfg.n_groups) == (8, 8, 2)
    assert (m(toks()) - hf_logits(hf, toks())).abs().max() <= TOL


def test_mamba_ssm_unsupported_variants(tmp_path):
    hf = tiny_hf_ssm("mamba", seed=1)
    d = write_mamba_ssm_checkpoint(tmp_path / "x", hf, "Mamba1", {"d_state": 8}, vocab=97, tie=True)
    cfg = json.loads((d / "config.json").read_text())
    cfg["d_intermediate"] = 64
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="MLP"):
        load_ssm(d)


# ------------------------------------------------------------------ bad checkpoints
def broken_dir(tmp_path, edit):
    hf = tiny_hf_ssm("mamba", seed=3, tie_word_embeddings=False)
    hf.save_pretrained(tmp_path)
    sd = load_file(tmp_path / "model.safetensors")
    edit(sd)
    save_file(sd, tmp_path / "model.safetensors")
    return tmp_path


def test_missing_keys_are_listed(tmp_path):
    d = broken_dir(tmp_path, lambda sd: [sd.pop("backbone.layers.1.mixer.A_log"), sd.pop("lm_head.weight")])
    with pytest.raises(CheckpointError, match=r"missing keys \(2\).*backbone.layers.1.mixer.A_log.*lm_head.weight"):
        load_ssm(d)


def test_misshaped_and_unexpected_keys_are_listed(tmp_path):
    def edit(sd):
        sd["backbone.layers.0.mixer.D"] = torch.ones(3)
        sd["backbone.layers.0.mixer.mystery.weight"] = torch.ones(2)

    with pytest.raises(CheckpointError) as err:
        load_ssm(broken_dir(tmp_path, edit))
    msg = str(err.value)
    assert "mis-shaped keys (1): blocks.0.ssm.D: checkpoint (3,) vs expected (64,)" in msg
    assert "unexpected keys (1): backbone.layers.0.mixer.mystery.weight" in msg
    assert "config.json" in msg  # says how to fix


def test_other_bad_inputs(tmp_path):
    hf = tiny_hf_ssm("mamba", seed=0)
    with pytest.raises(InputError, match="head_size 5 does not divide d_inner=64"):
        load_ssm(hf, head_size=5)
    with pytest.raises(InputError, match="head_size must be a positive int"):
        load_ssm(hf, head_size=0)
    with pytest.raises(InputError, match="Mamba-1"):
        load_ssm(tiny_hf_ssm("mamba2"), head_size=4)
    with pytest.raises(ModelLoadError, match="not a directory"):
        load_ssm(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    hf.config.save_pretrained(tmp_path / "empty")
    with pytest.raises(ModelLoadError, match="no weights"):
        load_ssm(tmp_path / "empty")
    with pytest.raises(InputError, match="checkpoint directory or an HF model"):
        load_ssm(42)
    from transformers import LlamaConfig

    with pytest.raises(UnsupportedModelError, match="not a Mamba model"):
        load_ssm(tmp_path / "empty", LlamaConfig())
