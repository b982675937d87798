"""Issue 40: the memory table counts SSM and conv state for every hybrid it accepts, or refuses the family.

Zamba2 and Falcon-H1 reported 0 B of SSM state and every layer as key/value cache (exit 0).  Each family's count
is checked here against the tensors HF's own cache holds after a forward (``measured_cache_bytes``), at two
lengths, so both the constant state and the per-token KV are right; configs whose cache is not Llama-style keys
and values are refused rather than counted as KV.
"""

from __future__ import annotations

import json

import pytest
import torch

from gather_aggregate.core.errors import InputError, UnsupportedModelError
from gather_aggregate.models.memory import cache_bytes, measured_cache_bytes


def _hf(family: str):
    from gather_aggregate.testing import tiny_families as tf
    from gather_aggregate.testing.tiny_hybrids import tiny_hf_hybrid

    return {"zamba2": lambda: tiny_hf_hybrid("zamba2"), "falcon_h1": tf.tiny_hf_falcon_h1,
            "granitemoehybrid": tf.tiny_hf_granite, "nemotron_h": tf.tiny_hf_nemotron_h,
            "qwen3_next": tf.tiny_hf_qwen3_next, "bamba": lambda: tiny_hf_hybrid("bamba"),
            "jamba": lambda: tiny_hf_hybrid("jamba")}[family]()


@pytest.mark.parametrize("family", ["zamba2", "falcon_h1", "granitemoehybrid", "nemotron_h", "qwen3_next", "bamba",
                                    "jamba"])
def test_every_hybrid_counts_what_hfs_cache_holds(family, tmp_path):
    hf = _hf(family)
    hf.config.save_pretrained(tmp_path)  # counted from config.json, as `gather-aggregate memory` reads it
    for length, batch in ((5, 1), (9, 2)):
        tokens = torch.randint(0, 50, (batch, length), generator=torch.Generator().manual_seed(length))
        with torch.no_grad():
            measured = measured_cache_bytes(hf, tokens)
        got = cache_bytes(tmp_path, length, batch=batch, bytes_per_element=4)
        assert got.total == measured, (family, length, got)
        assert got.ssm_state_bytes > 0 and got.conv_bytes > 0  # was 0 B for Zamba2 and Falcon-H1


def _raw(family: str) -> dict:
    return _hf(family).config.to_dict()


def test_zamba2_in_its_released_spelling_counts_the_same():
    raw = _raw("zamba2")
    released = dict(raw, layers_block_type=["mamba" if t == "linear_attention" else t for t in raw["layers_block_type"]])
    assert cache_bytes(released, 64) == cache_bytes(raw, 64)
    # every layer keeps Mamba-2 state; only the hybrid layers keep keys and values
    per_token = cache_bytes(raw, 65).kv_bytes - cache_bytes(raw, 64).kv_bytes
    n_hybrid = raw["layers_block_type"].count("hybrid")
    assert per_token == n_hybrid * 2 * raw["num_key_value_heads"] * raw["attention_head_dim"] * 4


def test_nemotron_h_pattern_and_block_types_agree():
    raw = _raw("nemotron_h")
    letters = {"linear_attention": "M", "mamba": "M", "full_attention": "*", "attention": "*", "mlp": "-", "moe": "E"}
    pattern = "".join(letters[t] for t in raw["layers_block_type"])
    from_pattern = {k: v for k, v in raw.items() if k != "layers_block_type"} | {"hybrid_override_pattern": pattern}
    assert cache_bytes(from_pattern, 32) == cache_bytes(raw, 32)


@pytest.mark.parametrize("edit, needle", [
    ({"kv_lora_rank": 16}, "kv_lora_rank"),  # latent attention caches a compressed KV
    ({"num_kv_heads": 2}, "num_kv_heads"),  # Falcon's KV heads: not num_key_value_heads
    ({"mamba_d_state": 16}, "mamba_d_state"),  # SSM state in an unknown family
    ({"layer_types": ["full_attention", "linear_attention"]}, "linear_attention"),
    ({"global_head_dim": 256}, "global_head_dim"),  # per-layer head widths
])
def test_a_cache_that_is_not_llama_style_is_refused_not_counted_as_kv(tiny_llama_dir, edit, needle):
    raw = json.loads((tiny_llama_dir / "config.json").read_text()) | edit
    raw["model_type"] = "some_new_family"
    with pytest.raises(UnsupportedModelError, match=f"cannot count model_type 'some_new_family'.*{needle}.*"
                                                    "supported: .*zamba2"):
        cache_bytes(raw, 16)


def test_a_sliding_window_the_model_does_not_use_is_counted_as_full_attention(tiny_llama_dir):
    raw = json.loads((tiny_llama_dir / "config.json").read_text())
    qwen2 = raw | {"model_type": "qwen2", "sliding_window": 4096, "use_sliding_window": False}
    assert cache_bytes(qwen2, 8192).kv_bytes == cache_bytes(raw, 8192).kv_bytes
    with pytest.raises(UnsupportedModelError, match="sliding-window attention"):
        cache_bytes(qwen2 | {"use_sliding_window": True}, 8192)


def test_a_hybrid_config_that_lacks_its_fields_is_one_line():
    raw = _raw("falcon_h1")
    del raw["mamba_n_heads"]
    with pytest.raises(InputError, match="cannot read the falcon_h1 config .*mamba_n_heads.*config.json the "
                                         "checkpoint was saved with"):
        cache_bytes(raw, 16)


def test_an_unknown_layer_kind_is_refused():
    raw = _raw("qwen3_next")
    raw["layer_types"] = ["full_attention", "sliding_window_attention", "linear_attention", "full_attention"]
    with pytest.raises(InputError, match=r"layer kinds \['sliding_window_attention'\]"):
        cache_bytes(raw, 16)


def test_the_cli_prints_zamba2s_ssm_state(tmp_path, capsys):
    from gather_aggregate.cli.parser import main

    hf = _hf("zamba2")
    hf.config.save_pretrained(tmp_path)
    rc = main(["memory", "--model", str(tmp_path), "--lengths", "16", "--bytes-per-element", "4"])
    out = capsys.readouterr().out
    want = cache_bytes(tmp_path, 16, bytes_per_element=4)
    assert rc == 0 and want.ssm_state_bytes > 0
    row = next(line for line in out.splitlines() if str(tmp_path) in line)
    assert row.rstrip(" |").endswith(f"{(want.ssm_state_bytes + want.conv_bytes) / 1024:.1f} KiB"), row
