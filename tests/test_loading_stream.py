"""The streamed load of checkpoints whose MoE experts HF fuses at load time (gather_aggregate.models.moe_streaming).

Every parameter and buffer, dtype included, equals ``from_pretrained``'s bit for bit (fp32 and bf16, DeepSeek-V3's
router bias kept fp32 as HF keeps it); anything it cannot map exactly goes back to ``from_pretrained``.  Its memory
bar (peak <= 1.25x the parameter bytes at DeepSeek-V2-Lite's widths with 64 experts) is the slow real-width test's.
"""

from __future__ import annotations

import json

import pytest
import torch

from gather_aggregate.models.moe_streaming import stream_fused_experts
from gather_aggregate.testing.fuzz.draws import draw

#: MoE families whose experts HF 5 fuses (per-expert on disk), MLA ones and the Mixtral naming (w1/w2/w3) among them
FAMILIES = ["deepseek_v2", "deepseek_v3", "mixtral", "qwen3_moe", "olmoe", "glm4_moe"]


def _saved(family, tmp_path):
    """The first draw of ``family`` with a layer of two or more fused experts, saved to ``tmp_path``."""
    def fused(case):
        return any(n.endswith("experts.gate_up_proj") and p.shape[0] >= 2 for n, p in case.hf.named_parameters())

    case = next(c for c in (draw(family, s) for s in range(200)) if fused(c))
    case.hf.save_pretrained(tmp_path)
    return case


def _config(d):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(d)


def _tensors(model):
    return dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers(remove_duplicate=False))


@pytest.mark.parametrize("family", FAMILIES)
def test_streamed_equals_from_pretrained_bit_for_bit(family, tmp_path):
    from transformers import AutoModelForCausalLM

    _saved(family, tmp_path)
    for dtype in (torch.float32, torch.bfloat16):
        ours = stream_fused_experts(tmp_path, _config(tmp_path), dtype)
        assert ours is not None, family
        ref = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=dtype)
        a, b = _tensors(ours), _tensors(ref)
        assert a.keys() == b.keys()
        for k in a:
            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), (family, dtype, k)
        assert not ours.training and ours.config._attn_implementation == ref.config._attn_implementation
        assert ours.config.dtype == ref.config.dtype == dtype


def test_load_model_takes_the_streamed_path_and_equals_hf(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    from gather_aggregate import load_model
    from gather_aggregate.testing.tiny_models import bpe_tokenizer, hf_logits

    case = _saved("deepseek_v2", tmp_path)
    bpe_tokenizer().save_pretrained(tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32, attn_implementation="eager").eval()

    def refused(*_a, **_k):
        raise AssertionError("from_pretrained was called")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", refused)
    model = load_model(tmp_path, dtype="float32")
    assert model.tokenizer is not None
    with torch.no_grad():
        assert float((model(case.tokens) - hf_logits(hf, case.tokens)).abs().max()) <= 1e-4


def test_what_it_cannot_map_exactly_goes_back_to_from_pretrained(tmp_path, monkeypatch):
    import transformers
    from safetensors.torch import load_file, save_file

    from gather_aggregate.testing.tiny_models import tiny_llama

    tiny_llama()[0].save_pretrained(tmp_path / "dense")  # no expert fusion: HF's lazy load is already lean

    builds = []
    build = transformers.AutoModelForCausalLM.from_config
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config",
                        lambda *a, **k: builds.append(a) or build(*a, **k))
    assert stream_fused_experts(tmp_path / "dense", _config(tmp_path / "dense"), torch.float32) is None
    assert builds == []  # nothing to stream is known from the config: the dense model is not built twice
    monkeypatch.undo()
    d = tmp_path / "moe"
    _saved("deepseek_v2", d)
    sd = load_file(d / "model.safetensors")
    save_file({**sd, "model.extra.weight": torch.zeros(2)}, d / "model.safetensors", metadata={"format": "pt"})
    assert stream_fused_experts(d, _config(d), torch.float32) is None  # a stored tensor it would not use
    expert = next(k for k in sd if ".experts.0." in k)
    save_file({k: v for k, v in sd.items() if k != expert}, d / "model.safetensors", metadata={"format": "pt"})
    assert stream_fused_experts(d, _config(d), torch.float32) is None  # an expert missing: HF's refusal names it
    save_file(sd, d / "model.safetensors", metadata={"format": "pt"})
    raw = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**raw, "quantization_config": {"quant_method": "fp8"}}))
    assert stream_fused_experts(d, _config(d), torch.float32) is None



def test_the_checkpoints_generation_config_is_read_as_from_pretrained_reads_it(tmp_path):
    """TL's generate reads the HF model's ``generation_config`` (min_length, forced EOS, n-gram ban): the streamed
    model takes the directory's generation_config.json, or, without one, the one HF derives from config.json."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    case = _saved("qwen3_moe", tmp_path)
    GenerationConfig(eos_token_id=[5, 7], bos_token_id=1, do_sample=True, temperature=0.6, min_length=3,
                     no_repeat_ngram_size=2).save_pretrained(tmp_path)
    for present in (True, False):
        if not present:
            (tmp_path / "generation_config.json").unlink()
        ours = stream_fused_experts(tmp_path, _config(tmp_path), torch.float32)
        ref = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
        assert ours.generation_config.to_dict() == ref.generation_config.to_dict(), (present, case.family)
    assert ref.generation_config.eos_token_id != [5, 7]  # the second case really read config.json


def test_a_pytorch_bin_checkpoint_goes_back_to_from_pretrained_without_being_read(tmp_path, monkeypatch):
    """Only safetensors are streamed: .bin shards are not opened here (a legacy, non-zip .bin cannot be memory-mapped
    and was read whole, then read again by from_pretrained)."""
    import gather_aggregate.adapters.streaming as streaming

    case = _saved("qwen3_moe", tmp_path)
    (tmp_path / "model.safetensors").unlink()
    torch.save(case.hf.state_dict(), tmp_path / "pytorch_model.bin", _use_new_zipfile_serialization=False)

    def opened(*_a, **_k):
        raise AssertionError("a .bin shard was read")

    monkeypatch.setattr(streaming._BinReader, "__init__", opened)
    assert stream_fused_experts(tmp_path, _config(tmp_path), torch.float32) is None
