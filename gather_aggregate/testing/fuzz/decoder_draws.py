"""Random small configs of the decoder-only families TransformerLens 4.3's bridge wraps beyond those of
:mod:`.config_fuzz` and :mod:`.config_fuzz_bridge` (found by ``scripts/survey_bridge_families.py``).

Each draw reaches what the family's HF config lets a checkpoint set: GQA ratios down to one KV head, ``head_dim``
other than ``d_model / n_heads``, bias toggles, qk-norm, partial and interleaved rotary, NoPE layers (SmolLM3,
Llama 4), sliding windows shorter than the prompt with any layout of sliding and full layers, chunked attention
(Llama 4), ALiBi, q/k/v clipping and q/k LayerNorm (MPT, OLMo), μP multipliers (Granite), logit scales and soft caps,
multi-query attention (GPT-BigCode), local layers (GPT-Neo), multi-head latent attention with and without a query
LoRA (DeepSeek-V2/V3, GLM-4-MoE-Lite, Youtu), and for the mixtures of experts expert counts, top-k from one to all,
shared experts, dense first layers, group-limited routing and routing scales.  Widths stay at most 64, 1-3 layers.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from gather_aggregate.testing.fuzz.bridge_draws import (
    _common,
    _divisors,
    _eps,
    _gqa,
    _layers,
    _rope,
    _window,
)


def _attn(r: random.Random, head_dims: tuple[int, ...] = (2, 4, 6, 8), own_head_dim: bool = True) -> dict[str, Any]:
    """Heads, KV heads and width: with ``own_head_dim`` a ``head_dim`` field, the width another multiple of the heads."""
    n, kv, hd = _gqa(r, head_dims)
    if own_head_dim:
        return dict(hidden_size=n * r.choice([2, 3, 4]), head_dim=hd, num_attention_heads=n, num_key_value_heads=kv)
    return dict(hidden_size=n * hd, num_attention_heads=n, num_key_value_heads=kv)


def _dense(r: random.Random, **fields: Any) -> dict[str, Any]:
    """A Llama-like decoder: attention (see :func:`_attn`), an MLP of 6 or 20, RMSNorm epsilon, default RoPE."""
    f = dict(intermediate_size=r.choice([6, 20]), rms_norm_eps=_eps(r), **_common(r))
    f.update(fields)
    f.setdefault("rope_parameters", _rope(r, f.get("head_dim") or f["hidden_size"] // f["num_attention_heads"]))
    return f


def _moe(r: random.Random, n_max: int = 5) -> tuple[int, int]:
    """(experts, top-k): one to ``n_max`` experts, any top-k up to all of them."""
    n = r.randint(1, n_max)
    return n, r.randint(1, n)


def _sliding(r: random.Random, n_layers: int) -> dict[str, Any]:
    return dict(sliding_window=_window(r), layer_types=_layers(r, n_layers))


def _apertus(r: random.Random) -> dict[str, Any]:
    return _dense(r, **_attn(r, own_head_dim=False), hidden_act=r.choice(["xielu", "relu2", "silu"]),
                  attention_bias=r.random() < 0.5)


def _arcee(r: random.Random) -> dict[str, Any]:
    return _dense(r, **_attn(r), hidden_act=r.choice(["relu2", "silu"]), attention_bias=r.random() < 0.5,
                  mlp_bias=r.random() < 0.5)


def _bitnet(r: random.Random) -> dict[str, Any]:
    return _dense(r, **_attn(r, own_head_dim=False), hidden_act=r.choice(["relu2", "silu"]),
                  attention_bias=r.random() < 0.5)


def _cohere(r: random.Random) -> dict[str, Any]:
    f = _dense(r, **_attn(r, own_head_dim=False), logit_scale=r.choice([0.0625, 1.0]), use_qk_norm=r.random() < 0.4,
               attention_bias=r.random() < 0.5, layer_norm_eps=_eps(r))
    del f["rms_norm_eps"]
    return f


def _ernie4_5(r: random.Random) -> dict[str, Any]:
    return _dense(r, **_attn(r), use_bias=r.random() < 0.5)


def _exaone4(r: random.Random) -> dict[str, Any]:
    f = _dense(r, **_attn(r, own_head_dim=False))
    return f | _sliding(r, f["num_hidden_layers"])


def _gemma(r: random.Random) -> dict[str, Any]:
    return _dense(r, **_attn(r), hidden_act=r.choice(["gelu_pytorch_tanh", "gelu"]), attention_bias=r.random() < 0.3)


def _glm(r: random.Random) -> dict[str, Any]:
    f = _dense(r, **_attn(r, (4, 8)), attention_bias=r.random() < 0.5, pad_token_id=0)
    f["rope_parameters"] = _rope(r, f["head_dim"], partial=True)
    return f


def _granite(r: random.Random) -> dict[str, Any]:
    return _dense(r, **_attn(r, own_head_dim=False), attention_bias=r.random() < 0.5, mlp_bias=r.random() < 0.5,
                  embedding_multiplier=r.uniform(0.5, 8), residual_multiplier=r.uniform(0.2, 1.2),
                  attention_multiplier=r.uniform(0.05, 1), logits_scaling=r.uniform(0.5, 4))


def _hunyuan(r: random.Random) -> dict[str, Any]:
    return _dense(r, **_attn(r), attention_bias=r.random() < 0.5)


def _jais2(r: random.Random) -> dict[str, Any]:
    f = _dense(r, **_attn(r), hidden_act=r.choice(["relu2", "gelu"]), attention_bias=r.random() < 0.5,
               mlp_bias=r.random() < 0.5, layer_norm_eps=_eps(r))
    del f["rms_norm_eps"]
    return f


def _ministral3(r: random.Random) -> dict[str, Any]:
    f = _dense(r, **_attn(r), sliding_window=r.choice([None, _window(r)]))
    del f["rope_parameters"]  # its default YaRN with Llama 4's attention scaling, which the attention reads
    return f


def _nanochat(r: random.Random) -> dict[str, Any]:
    return _dense(r, **_attn(r, own_head_dim=False), final_logit_softcapping=r.choice([None, 3.0, 15.0]),
                  attention_bias=r.random() < 0.5)


def _nemotron(r: random.Random) -> dict[str, Any]:
    f = _dense(r, **_attn(r, (4, 8)), attention_bias=r.random() < 0.5, mlp_bias=r.random() < 0.5,
               hidden_act=r.choice(["relu2", "gelu"]), norm_eps=_eps(r))
    del f["rms_norm_eps"]
    f["rope_parameters"] = _rope(r, f["head_dim"], partial=True)
    return f


def _olmo(r: random.Random) -> dict[str, Any]:
    f = _dense(r, **_attn(r, own_head_dim=False), attention_bias=r.random() < 0.5,
               clip_qkv=r.choice([None, None, 0.5, 3.0]))
    del f["rms_norm_eps"]  # OLMo's LayerNorm has no weights and a fixed epsilon
    return f


def _olmo3(r: random.Random) -> dict[str, Any]:
    f = _dense(r, **_attn(r, own_head_dim=False), attention_bias=r.random() < 0.5)
    del f["rope_parameters"]  # OLMo 3 keeps one RoPE per layer type (its default)
    return f | _sliding(r, f["num_hidden_layers"])


def _seed_oss(r: random.Random) -> dict[str, Any]:
    return _dense(r, **_attn(r), attention_bias=r.random() < 0.5, attention_out_bias=r.random() < 0.5,
                  mlp_bias=r.random() < 0.5)


def _smollm3(r: random.Random) -> dict[str, Any]:
    f = _dense(r, **_attn(r, own_head_dim=False), attention_bias=r.random() < 0.5, mlp_bias=r.random() < 0.5,
               pad_token_id=0)
    n = f["num_hidden_layers"]
    f["no_rope_layers"] = [r.choice([0, 1]) for _ in range(n)]  # 0: a NoPE layer
    if r.random() < 0.5:
        f.update(use_sliding_window=True, **_sliding(r, n))
    return f


def _codegen(r: random.Random) -> dict[str, Any]:
    n = r.choice([4, 8])  # CodeGen's fused qkv splits into 4 model-parallel parts: heads a multiple of 4
    hd = r.choice([4, 6, 8, 12])
    return dict(n_embd=n * hd, n_head=n, n_layer=r.randint(1, 3), n_positions=64, n_ctx=64,
                rotary_dim=r.choice(range(2, hd + 1, 2)), n_inner=r.choice([None, 10]),
                activation_function=r.choice(["gelu_new", "gelu", "relu"]), layer_norm_epsilon=_eps(r),
                tie_word_embeddings=r.random() < 0.3)


def _gpt_bigcode(r: random.Random) -> dict[str, Any]:
    n = r.choice([1, 2, 3, 4])
    return dict(n_embd=n * r.choice([2, 4, 6]), n_head=n, n_layer=r.randint(1, 3), n_positions=64,
                multi_query=r.random() < 0.6, n_inner=r.choice([None, 10]), layer_norm_epsilon=_eps(r),
                activation_function=r.choice(["gelu_pytorch_tanh", "gelu", "relu"]),
                scale_attn_weights=r.random() < 0.8, tie_word_embeddings=r.random() < 0.5)


def _gpt_neo(r: random.Random) -> dict[str, Any]:
    n = r.choice([1, 2, 3, 4])
    kinds = [r.choice(["global", "local"]) for _ in range(r.randint(1, 3))]
    return dict(hidden_size=n * r.choice([2, 4, 6]), num_heads=n, num_layers=len(kinds),
                attention_types=[[kinds, 1]], window_size=_window(r), intermediate_size=r.choice([None, 10]),
                activation_function=r.choice(["gelu_new", "relu"]), layer_norm_epsilon=_eps(r),
                max_position_embeddings=64, tie_word_embeddings=r.random() < 0.5)


def _mpt(r: random.Random) -> dict[str, Any]:
    n = r.choice([1, 2, 3, 4])
    return dict(d_model=n * r.choice([2, 4, 6]), n_heads=n, n_layers=r.randint(1, 3), max_seq_len=64,
                expansion_ratio=r.choice([1, 2, 4]), no_bias=r.random() < 0.5, layer_norm_epsilon=_eps(r),
                logit_scale=r.choice([None, 0.5]),
                attn_config=dict(alibi=r.random() < 0.7, alibi_bias_max=r.choice([2, 8]), qk_ln=r.random() < 0.3,
                                 clip_qkv=r.choice([None, None, 0.5]), softmax_scale=r.choice([None, 0.3])))


def _openai_gpt(r: random.Random) -> dict[str, Any]:
    n = r.choice([1, 2, 3, 4])
    return dict(n_embd=n * r.choice([2, 4, 6]), n_head=n, n_layer=r.randint(1, 3), n_positions=64,
                afn=r.choice(["gelu", "relu", "silu"]), layer_norm_epsilon=_eps(r))


def _xglm(r: random.Random) -> dict[str, Any]:
    n = r.choice([1, 2, 3, 4])
    return dict(d_model=n * r.choice([4, 6]), attention_heads=n, num_layers=r.randint(1, 3),  # sinusoids: d >= 4
                ffn_dim=r.choice([6, 20]), max_position_embeddings=64, scale_embedding=r.random() < 0.5,
                activation_function=r.choice(["gelu", "relu"]), tie_word_embeddings=r.random() < 0.7)


def _modernbert_decoder(r: random.Random) -> dict[str, Any]:
    n = r.choice([1, 2, 3, 4])
    c = _common(r)
    del c["tie_word_embeddings"]  # ModernBERT's decoder head ties its own way
    return dict(hidden_size=n * r.choice([2, 4, 8]), num_attention_heads=n, intermediate_size=r.choice([6, 20]),
                pad_token_id=0, local_attention=2 * _window(r), layer_types=_layers(r, c["num_hidden_layers"]), norm_eps=_eps(r),
                norm_bias=r.random() < 0.5, attention_bias=r.random() < 0.5, mlp_bias=r.random() < 0.5,
                decoder_bias=r.random() < 0.5, hidden_activation=r.choice(["gelu", "silu"]), **c)


def _mixtral(r: random.Random) -> dict[str, Any]:
    n, k = _moe(r)
    return _dense(r, **_attn(r), num_local_experts=n, num_experts_per_tok=k, sliding_window=r.choice([None, _window(r)]))


def _phimoe(r: random.Random) -> dict[str, Any]:
    n = r.randint(2, 5)  # PhiMoE's sparsemixer routing picks exactly two experts
    return _dense(r, **_attn(r, own_head_dim=False), num_local_experts=n, num_experts_per_tok=2,
                  sliding_window=r.choice([None, _window(r)]), attention_bias=r.random() < 0.5,
                  lm_head_bias=r.random() < 0.5)


def _olmoe(r: random.Random) -> dict[str, Any]:
    n, k = _moe(r)
    f = _dense(r, **_attn(r, own_head_dim=False), num_experts=n, num_experts_per_tok=k,
               norm_topk_prob=r.random() < 0.5, attention_bias=r.random() < 0.5, clip_qkv=r.choice([None, 0.5]))
    return f


def _qwen_moe(r: random.Random, qwen3: bool) -> dict[str, Any]:
    n, k = _moe(r)
    f = _dense(r, **_attn(r, own_head_dim=qwen3), num_experts=n, num_experts_per_tok=k,
               moe_intermediate_size=r.choice([4, 10]), norm_topk_prob=r.random() < 0.5,
               decoder_sparse_step=r.choice([1, 2]))
    f["mlp_only_layers"] = sorted(r.sample(range(f["num_hidden_layers"]), r.randint(0, 1)))
    if qwen3:
        f["attention_bias"] = r.random() < 0.5
    else:
        f.update(shared_expert_intermediate_size=r.choice([4, 12]), qkv_bias=r.random() < 0.5)
    if r.random() < 0.5:  # Qwen2-MoE slides above max_window_layers, Qwen3-MoE in every layer
        f.update(use_sliding_window=True, sliding_window=_window(r))
        if not qwen3:
            f["max_window_layers"] = r.randint(0, 2)
    return f


def _granitemoe(r: random.Random) -> dict[str, Any]:
    n, k = _moe(r)
    f = _granite(r)
    del f["mlp_bias"]
    return f | dict(num_local_experts=n, num_experts_per_tok=k)


def _flex_olmo(r: random.Random) -> dict[str, Any]:
    n, k = _moe(r)
    return _dense(r, **_attn(r, own_head_dim=False), num_experts=n, num_experts_per_tok=k,
                  norm_topk_prob=r.random() < 0.5, attention_bias=r.random() < 0.5, pad_token_id=0)


def _ernie4_5_moe(r: random.Random) -> dict[str, Any]:
    n, k = _moe(r)
    f = _dense(r, **_attn(r, own_head_dim=False), moe_num_experts=n, moe_k=k, moe_intermediate_size=r.choice([4, 10]),
               moe_num_shared_experts=r.choice([0, 1, 2]), use_bias=r.random() < 0.5,
               moe_layer_interval=r.choice([1, 2]))
    f.update(moe_layer_start_index=r.randint(0, 1), moe_layer_end_index=f["num_hidden_layers"] - 1)
    return f


def _minimax_m2(r: random.Random) -> dict[str, Any]:
    n, k = _moe(r)
    f = _dense(r, **_attn(r, (4, 8)), num_local_experts=n, num_experts_per_tok=k)
    f["rope_parameters"] = _rope(r, f["head_dim"], partial=True)
    return f


def _llama4(r: random.Random) -> dict[str, Any]:
    n, k = _moe(r)
    f = _dense(r, **_attn(r, (4, 8)), num_local_experts=n, num_experts_per_tok=k,
               intermediate_size_mlp=r.choice([6, 20]), use_qk_norm=r.random() < 0.5,
               attention_chunk_size=r.choice([2, 5, 64]), attn_temperature_tuning=r.random() < 0.5,
               floor_scale=r.choice([2, 8192]), attn_scale=r.choice([0.1, 1.0]), interleave_moe_layer_step=1,
               attention_bias=r.random() < 0.5)
    layers = f["num_hidden_layers"]
    f["no_rope_layers"] = [r.choice([0, 1]) for _ in range(layers)]  # 0: a NoPE layer
    f["moe_layers"] = sorted(r.sample(range(layers), r.randint(0, layers)))
    f["layer_types"] = [r.choice(["chunked_attention", "full_attention"]) for _ in range(layers)]
    return f


def _afmoe(r: random.Random) -> dict[str, Any]:
    n, k = _moe(r)
    f = _dense(r, **_attn(r), num_experts=n, num_experts_per_tok=k, moe_intermediate_size=r.choice([4, 10]),
               num_shared_experts=r.choice([1, 2]), route_scale=r.choice([1.0, 2.5]),
               attention_bias=r.random() < 0.5)
    f["num_dense_layers"] = r.randint(0, f["num_hidden_layers"])
    return f | _sliding(r, f["num_hidden_layers"])


def _laguna(r: random.Random) -> dict[str, Any]:
    """Laguna: per-layer head counts (multiples of the KV heads; refused unless all equal), a sigmoid gate on the attention output, one RoPE
    per layer type (its default: half the head rotated on full layers), dense or sparse MLP layers."""
    n, k = _moe(r)
    f = _dense(r, **_attn(r, (4, 8)), num_experts=n, num_experts_per_tok=k, moe_intermediate_size=r.choice([4, 10]),
               shared_expert_intermediate_size=r.choice([4, 12]), gating=r.random() < 0.7,
               moe_routed_scaling_factor=r.choice([1.0, 2.5]), moe_router_logit_softcapping=r.choice([0.0, 2.0]),
               attention_bias=r.random() < 0.5, pad_token_id=0)
    del f["rope_parameters"]
    layers, kv = f["num_hidden_layers"], f["num_key_value_heads"]
    heads = [f["num_attention_heads"]] * layers  # per-layer head counts, one draw in four (refused)
    f["num_attention_heads_per_layer"] = heads if r.random() < 0.75 else [kv * r.choice([1, 2]) for _ in heads]
    f["mlp_layer_types"] = [r.choice(["dense", "sparse"]) for _ in range(layers)]
    return f | _sliding(r, layers)


def _glm4_moe(r: random.Random) -> dict[str, Any]:
    n = r.choice([2, 4, 6])
    groups = r.choice([g for g in _divisors(n) if n // g >= 2])  # HF scores a group by its two best experts
    f = _dense(r, **_attn(r, (4, 8)), n_routed_experts=n, n_group=groups, topk_group=r.randint(1, groups),
               moe_intermediate_size=r.choice([4, 10]), n_shared_experts=r.choice([1, 2]),
               routed_scaling_factor=r.choice([1.0, 2.5]), norm_topk_prob=r.random() < 0.5,
               use_qk_norm=r.random() < 0.5, attention_bias=r.random() < 0.5)
    f["num_experts_per_tok"] = r.randint(1, n // groups * f["topk_group"])
    f["first_k_dense_replace"] = r.randint(0, f["num_hidden_layers"])
    f["rope_parameters"] = _rope(r, f["head_dim"], partial=True)
    return f


def _mla(r: random.Random) -> dict[str, Any]:
    """Multi-head latent attention: as many KV heads as query heads (HF's MLA requires it), a latent KV rank, an
    optional query LoRA, rotary and non-rotary query/key parts and a value head size."""
    n, rope = r.choice([1, 2, 3, 4]), r.choice([2, 4])
    return dict(hidden_size=n * r.choice([3, 4, 5]), num_attention_heads=n, num_key_value_heads=n,
                kv_lora_rank=r.choice([2, 4, 8]), q_lora_rank=r.choice([None, 3, 8]),  # HF rotates complex pairs
                qk_rope_head_dim=rope, qk_nope_head_dim=r.choice([2, 6]),
                v_head_dim=rope if r.random() < 0.7 else r.choice([2, 6]),  # unlike rope in released checkpoints
                intermediate_size=r.choice([6, 20]), rms_norm_eps=_eps(r), attention_bias=r.random() < 0.5,
                rope_parameters=_rope(r, 4), **_common(r))


def _deepseek(r: random.Random, v3: bool) -> dict[str, Any]:
    f = _mla(r)
    n = r.choice([2, 4, 6])
    groups = r.choice([g for g in _divisors(n) if n // g >= 2])  # HF scores a group by its two best experts
    f.update(n_routed_experts=n, moe_intermediate_size=r.choice([4, 10]), n_shared_experts=r.choice([1, 2]),
             routed_scaling_factor=r.choice([1.0, 2.5]), norm_topk_prob=r.random() < 0.5,
             first_k_dense_replace=r.randint(0, f["num_hidden_layers"]), n_group=groups,
             topk_group=r.randint(1, groups))
    f["num_experts_per_tok"] = r.randint(1, n // groups * f["topk_group"])
    if v3:
        f["rope_interleave"] = r.random() < 0.5
    else:
        f["topk_method"] = r.choice(["greedy", "group_limited_greedy"])
    return f


def _glm4_moe_lite(r: random.Random) -> dict[str, Any]:
    f = _mla(r)
    n = r.choice([2, 4, 6])
    f.update(n_routed_experts=n, moe_intermediate_size=r.choice([4, 10]), n_shared_experts=r.choice([1, 2]),
             routed_scaling_factor=r.choice([1.0, 1.8]), norm_topk_prob=r.random() < 0.5, n_group=1, topk_group=1,
             num_experts_per_tok=r.randint(1, n), rope_interleave=r.random() < 0.5,
             mlp_layer_types=[r.choice(["dense", "sparse"]) for _ in range(f["num_hidden_layers"])])
    return f


def _youtu(r: random.Random) -> dict[str, Any]:
    return _mla(r) | dict(rope_interleave=r.random() < 0.5)


def _gemma4(r: random.Random) -> dict[str, Any]:
    n, kv, hd = _gqa(r, (4, 8))
    c = _common(r)
    layers = c["num_hidden_layers"]
    f = dict(hidden_size=n * r.choice([2, 4]), head_dim=hd, num_attention_heads=n, num_key_value_heads=kv,
             intermediate_size=r.choice([6, 20]), rms_norm_eps=_eps(r),
             hidden_activation=r.choice(["gelu_pytorch_tanh", "gelu"]), attention_bias=r.random() < 0.3,
             final_logit_softcapping=r.choice([None, 3.0]), global_head_dim=r.choice([4, 8]),
             hidden_size_per_layer_input=r.choice([0, 0, 0, 4]), vocab_size_per_layer_input=53,
             attention_k_eq_v=r.random() < 0.3, use_double_wide_mlp=r.random() < 0.3, **_sliding(r, layers), **c)
    if f["hidden_size_per_layer_input"] and layers > 1:  # HF shares KV only beside per-layer inputs (E2B, E4B)
        f["num_kv_shared_layers"] = shared = r.randint(0, layers - 1)
        if shared:  # a shared layer reuses the KV of an earlier one of its type; HF makes the last layer full
            f["layer_types"][0] = "full_attention"
            for i in range(layers - shared, layers):
                f["layer_types"][i] = r.choice(f["layer_types"][:layers - shared])
            f["layer_types"][-1] = "full_attention"
    if f["attention_k_eq_v"]:
        f["num_global_key_value_heads"] = r.choice(_divisors(n))
    if r.random() < 0.3:
        ne = r.randint(1, 4)
        f.update(enable_moe_block=True, num_experts=ne, top_k_experts=r.randint(1, ne),
                 moe_intermediate_size=r.choice([4, 10]))
    return f


#: the HF classes of each family and the draw of its config fields
DECODER_HF: dict[str, tuple[str, str, Callable[[random.Random], dict[str, Any]]]] = {
    "apertus": ("ApertusConfig", "ApertusForCausalLM", _apertus),
    "arcee": ("ArceeConfig", "ArceeForCausalLM", _arcee),
    "bitnet": ("BitNetConfig", "BitNetForCausalLM", _bitnet),
    "cohere": ("CohereConfig", "CohereForCausalLM", _cohere),
    "ernie4_5": ("Ernie4_5Config", "Ernie4_5ForCausalLM", _ernie4_5),
    "exaone4": ("Exaone4Config", "Exaone4ForCausalLM", _exaone4),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", _gemma),
    "gemma4_text": ("Gemma4TextConfig", "Gemma4ForCausalLM", _gemma4),
    "glm": ("GlmConfig", "GlmForCausalLM", _glm),
    "glm4": ("Glm4Config", "Glm4ForCausalLM", _glm),
    "granite": ("GraniteConfig", "GraniteForCausalLM", _granite),
    "hunyuan_v1_dense": ("HunYuanDenseV1Config", "HunYuanDenseV1ForCausalLM", _hunyuan),
    "jais2": ("Jais2Config", "Jais2ForCausalLM", _jais2),
    "ministral3": ("Ministral3Config", "Ministral3ForCausalLM", _ministral3),
    "nanochat": ("NanoChatConfig", "NanoChatForCausalLM", _nanochat),
    "nemotron": ("NemotronConfig", "NemotronForCausalLM", _nemotron),
    "olmo": ("OlmoConfig", "OlmoForCausalLM", _olmo),
    "olmo3": ("Olmo3Config", "Olmo3ForCausalLM", _olmo3),
    "seed_oss": ("SeedOssConfig", "SeedOssForCausalLM", _seed_oss),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", _smollm3),
    "codegen": ("CodeGenConfig", "CodeGenForCausalLM", _codegen),
    "gpt_bigcode": ("GPTBigCodeConfig", "GPTBigCodeForCausalLM", _gpt_bigcode),
    "gpt_neo": ("GPTNeoConfig", "GPTNeoForCausalLM", _gpt_neo),
    "mpt": ("MptConfig", "MptForCausalLM", _mpt),
    "openai_gpt": ("OpenAIGPTConfig", "OpenAIGPTLMHeadModel", _openai_gpt),
    "xglm": ("XGLMConfig", "XGLMForCausalLM", _xglm),
    "modernbert_decoder": ("ModernBertDecoderConfig", "ModernBertDecoderForCausalLM", _modernbert_decoder),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", _mixtral),
    "phimoe": ("PhimoeConfig", "PhimoeForCausalLM", _phimoe),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", _olmoe),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", lambda r: _qwen_moe(r, qwen3=False)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", lambda r: _qwen_moe(r, qwen3=True)),
    "granitemoe": ("GraniteMoeConfig", "GraniteMoeForCausalLM", _granitemoe),
    "flex_olmo": ("FlexOlmoConfig", "FlexOlmoForCausalLM", _flex_olmo),
    "ernie4_5_moe": ("Ernie4_5_MoeConfig", "Ernie4_5_MoeForCausalLM", _ernie4_5_moe),
    "minimax_m2": ("MiniMaxM2Config", "MiniMaxM2ForCausalLM", _minimax_m2),
    "llama4_text": ("Llama4TextConfig", "Llama4ForCausalLM", _llama4),
    "afmoe": ("AfmoeConfig", "AfmoeForCausalLM", _afmoe),
    "laguna": ("LagunaConfig", "LagunaForCausalLM", _laguna),
    "glm4_moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM", _glm4_moe),
    "deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM", lambda r: _deepseek(r, v3=False)),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", lambda r: _deepseek(r, v3=True)),
    "glm4_moe_lite": ("Glm4MoeLiteConfig", "Glm4MoeLiteForCausalLM", _glm4_moe_lite),
    "youtu": ("YoutuConfig", "YoutuForCausalLM", _youtu),
}

__all__ = ["DECODER_HF"]
