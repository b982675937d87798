"""Random small configs of the transformer families served through TransformerLens' bridge beyond Llama, Qwen3,
Mistral, GPT-2, Pythia and Gemma-2 (whose draws live in :mod:`.config_fuzz`).

Each draw reaches what a real checkpoint may set and ``tests/test_transformer_families.py`` holds fixed: GQA ratios
(down to one KV head), ``head_dim`` other than ``d_model / n_heads``, partial rotary (Phi, StableLM, Phi-3, GPT-J's
``rotary_dim``), qk-norm, parallel or sequential blocks (GPT-J, Falcon, StableLM, Cohere), bias toggles,
LayerNorm with or without its affine weights, sliding windows shorter than the prompt and any layout of sliding and
full layers (Qwen2, Gemma 3, Phi-3, Cohere 2, GPT-OSS, Starcoder2), tied embeddings, attention softcapping, MoE
expert counts and top-k (GPT-OSS), OPT's pre/post LayerNorm and ``word_embed_proj_dim != hidden_size``, Falcon's
multi-query, grouped KV, ALiBi and new decoder layout.  Widths stay at most 64, 1-3 layers.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _eps(r: random.Random) -> float:
    return r.choice([1e-6, 1e-5, 1e-2])


def _gqa(r: random.Random, head_dims: tuple[int, ...] = (2, 4, 6, 8)) -> tuple[int, int, int]:
    """(n_heads, n_kv_heads, head_dim): any KV group count dividing the heads."""
    n_heads = r.choice([1, 2, 3, 4])
    return n_heads, r.choice(_divisors(n_heads)), r.choice(head_dims)


def _rope(r: random.Random, head_dim: int, partial: bool = False) -> dict[str, Any]:
    """Default RoPE with base 10 to 5e5; with ``partial`` a rotary share whose rotated dims are even."""
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": r.choice([10.0, 1e4, 5e5])}
    if partial:
        rope["partial_rotary_factor"] = r.choice([p for p in (0.25, 0.5, 0.75, 1.0) if (head_dim * p) % 2 == 0])
    return rope


def _layers(r: random.Random, n: int) -> list[str]:
    """A layout of sliding and full attention layers (any first, one in four all sliding)."""
    if r.random() < 0.25:
        return ["sliding_attention"] * n
    return [r.choice(["sliding_attention", "full_attention"]) for _ in range(n)]


def _window(r: random.Random) -> int:
    """A sliding window: mostly shorter than the longer prompts (up to 40), once in five longer."""
    return r.choice([1, 2, 3, 5, 8, 64])


def _common(r: random.Random, n_layers: int | None = None) -> dict[str, Any]:
    return dict(num_hidden_layers=n_layers or r.randint(1, 3), tie_word_embeddings=r.random() < 0.5,
                max_position_embeddings=64)


def _qwen2(r: random.Random) -> dict[str, Any]:
    n, kv, hd = _gqa(r)
    f = dict(hidden_size=n * hd, num_attention_heads=n, num_key_value_heads=kv, intermediate_size=r.choice([6, 20]),
             rms_norm_eps=_eps(r), rope_parameters=_rope(r, hd), hidden_act=r.choice(["silu", "silu", "gelu"]),
             **_common(r))
    if r.random() < 0.5:  # sliding attention above max_window_layers (Qwen2's own rule)
        f.update(use_sliding_window=True, sliding_window=_window(r), max_window_layers=r.randint(0, 2))
    return f


def _gemma3(r: random.Random) -> dict[str, Any]:
    n, kv, hd = _gqa(r)
    c = _common(r)
    return dict(hidden_size=n * r.choice([2, 4]), head_dim=hd, num_attention_heads=n, num_key_value_heads=kv,
                intermediate_size=r.choice([6, 20]), query_pre_attn_scalar=r.choice([hd, 3]),
                sliding_window=_window(r), layer_types=_layers(r, c["num_hidden_layers"]),
                attn_logit_softcapping=r.choice([None, None, 1.0]), final_logit_softcapping=r.choice([None, 3.0]),
                attention_bias=r.random() < 0.3, rms_norm_eps=_eps(r),
                hidden_activation=r.choice(["gelu_pytorch_tanh", "gelu"]), **c)


def _phi(r: random.Random) -> dict[str, Any]:
    n, kv, hd = _gqa(r, (4, 6, 8, 12))
    return dict(hidden_size=n * hd, num_attention_heads=n, num_key_value_heads=kv, intermediate_size=r.choice([6, 20]),
                rope_parameters=_rope(r, hd, partial=True), qk_layernorm=r.random() < 0.25,
                hidden_act=r.choice(["gelu_new", "gelu", "relu"]), layer_norm_eps=_eps(r), **_common(r))


def _phi3(r: random.Random) -> dict[str, Any]:
    n, kv, hd = _gqa(r, (4, 6, 8, 12))
    return dict(hidden_size=n * hd, num_attention_heads=n, num_key_value_heads=kv, intermediate_size=r.choice([6, 20]),
                rope_parameters=_rope(r, hd, partial=r.random() < 0.5), rms_norm_eps=_eps(r),
                sliding_window=r.choice([None, _window(r)]), hidden_act=r.choice(["silu", "gelu"]),
                pad_token_id=0, **_common(r))


def _olmo2(r: random.Random) -> dict[str, Any]:
    n, kv, hd = _gqa(r)
    return dict(hidden_size=n * hd, num_attention_heads=n, num_key_value_heads=kv, intermediate_size=r.choice([6, 20]),
                rope_parameters=_rope(r, hd), attention_bias=r.random() < 0.5, rms_norm_eps=_eps(r),
                hidden_act=r.choice(["silu", "gelu"]), pad_token_id=0, **_common(r))


def _opt(r: random.Random) -> dict[str, Any]:
    n = r.choice([1, 2, 3, 4])
    d = n * r.choice([2, 4, 6, 8])
    return dict(hidden_size=d, num_attention_heads=n, ffn_dim=r.choice([6, 20]),
                word_embed_proj_dim=r.choice([d, d, 5, 12]), do_layer_norm_before=r.random() < 0.7,
                _remove_final_layer_norm=r.random() < 0.2, enable_bias=r.random() < 0.8,
                layer_norm_elementwise_affine=r.random() < 0.8, activation_function=r.choice(["relu", "gelu"]),
                pad_token_id=0, **_common(r))


def _gptj(r: random.Random) -> dict[str, Any]:
    n = r.choice([1, 2, 3, 4])
    hd = r.choice([4, 6, 8, 12])
    return dict(n_embd=n * hd, n_head=n, n_layer=r.randint(1, 3), n_positions=64,
                rotary_dim=r.choice(range(2, hd + 1, 2)), n_inner=r.choice([None, 10]),
                activation_function=r.choice(["gelu_new", "gelu", "relu"]), layer_norm_epsilon=_eps(r),
                tie_word_embeddings=r.random() < 0.3)


def _gpt_oss(r: random.Random) -> dict[str, Any]:
    n, kv, hd = _gqa(r)
    n_exp = r.randint(1, 5)
    c = _common(r)
    return dict(hidden_size=r.choice([8, 12, 16]), head_dim=hd, num_attention_heads=n, num_key_value_heads=kv,
                intermediate_size=r.choice([4, 10]), num_local_experts=n_exp, num_experts_per_tok=r.randint(1, n_exp),
                sliding_window=_window(r), layer_types=_layers(r, c["num_hidden_layers"]),
                attention_bias=r.random() < 0.5, rms_norm_eps=_eps(r), swiglu_limit=r.choice([7.0, 1.0]),
                rope_parameters=r.choice([None, _rope(r, hd)]), **c)


def _cohere2(r: random.Random) -> dict[str, Any]:
    n, kv, hd = _gqa(r)
    c = _common(r)
    return dict(hidden_size=n * hd, num_attention_heads=n, num_key_value_heads=kv, intermediate_size=r.choice([6, 20]),
                sliding_window=_window(r), layer_types=_layers(r, c["num_hidden_layers"]),
                logit_scale=r.choice([0.0625, 1.0, 0.5]), attention_bias=r.random() < 0.5, layer_norm_eps=_eps(r),
                rope_parameters=_rope(r, hd), **c)


def _falcon(r: random.Random) -> dict[str, Any]:
    n = r.choice([1, 2, 3, 4])
    hd = r.choice([4, 6, 8])
    new = r.random() < 0.4
    f: dict[str, Any] = dict(hidden_size=n * hd, num_attention_heads=n, new_decoder_architecture=new,
                             multi_query=r.random() < 0.5, parallel_attn=r.random() < 0.6, bias=r.random() < 0.5,
                             alibi=r.random() < 0.25, layer_norm_epsilon=_eps(r),
                             ffn_hidden_size=r.choice([None, 10]), **_common(r))
    if new:  # KV groups (n_head_kv) and one or two LayerNorms before the parallel attention and MLP
        f.update(num_kv_heads=1 if r.random() < 0.5 else r.choice(_divisors(n)),
                 num_ln_in_parallel_attn=r.choice([None, 1, 2]))
    if not f["alibi"]:
        f["rope_parameters"] = _rope(r, hd)
    return f


def _stablelm(r: random.Random) -> dict[str, Any]:
    n, kv, hd = _gqa(r, (4, 6, 8, 12))
    return dict(hidden_size=n * hd, num_attention_heads=n, num_key_value_heads=kv, intermediate_size=r.choice([6, 20]),
                rope_parameters=_rope(r, hd, partial=True), use_qkv_bias=r.random() < 0.5,
                qk_layernorm=r.random() < 0.4, use_parallel_residual=r.random() < 0.4, layer_norm_eps=_eps(r),
                hidden_act=r.choice(["silu", "gelu"]), **_common(r))


def _starcoder2(r: random.Random) -> dict[str, Any]:
    n, kv, hd = _gqa(r)
    return dict(hidden_size=n * hd, num_attention_heads=n, num_key_value_heads=kv, intermediate_size=r.choice([6, 20]),
                sliding_window=r.choice([None, _window(r)]), use_bias=r.random() < 0.6, norm_epsilon=_eps(r),
                hidden_act=r.choice(["gelu_pytorch_tanh", "gelu"]), rope_parameters=_rope(r, hd), **_common(r))


#: the HF classes of each family and the draw of its config fields
BRIDGE_HF: dict[str, tuple[str, str, Callable[[random.Random], dict[str, Any]]]] = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", _qwen2),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", _gemma3),
    "phi": ("PhiConfig", "PhiForCausalLM", _phi),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", _phi3),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", _olmo2),
    "opt": ("OPTConfig", "OPTForCausalLM", _opt),
    "gptj": ("GPTJConfig", "GPTJForCausalLM", _gptj),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", _gpt_oss),
    "cohere2": ("Cohere2Config", "Cohere2ForCausalLM", _cohere2),
    "falcon": ("FalconConfig", "FalconForCausalLM", _falcon),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", _stablelm),
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", _starcoder2),
}

__all__ = ["BRIDGE_HF"]
