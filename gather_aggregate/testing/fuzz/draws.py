"""Randomised small configurations of every supported family, over the fields the hand-written tests hold fixed.

``draw(family, seed)`` gives a :class:`FuzzCase`: a random HF model of that family (or, for Llamba, a random
checkpoint in Cartesia's format with its sequential oracle) and a batch of token rows.  The draws reach what a real
checkpoint may set and a hand-picked test config does not: odd widths, head sizes that are not powers of two,
``n_groups`` from 1 to ``n_heads``, conv kernels 1-5, bias toggles, Δ limits, norm epsilons, layouts with attention
(or an MLP) first or last or everywhere, expert counts and top-k, μP multipliers, GQA ratios, rotary share and
base, chunk sizes that do not divide the prompt, prompts of length 1 and 2, and batches of 1-3.  Weights are
redrawn far from HF's gentle initialisation (``families_testing.stress_weights``).  The draws of the transformer
families beyond Llama, Qwen3, Mistral, GPT-2, Pythia and Gemma-2 live in :mod:`.config_fuzz_bridge` and
:mod:`.config_fuzz_decoders`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from gather_aggregate.testing.fuzz.bridge_draws import BRIDGE_HF
from gather_aggregate.testing.fuzz.decoder_draws import DECODER_HF
from gather_aggregate.testing.tiny_families import stress_weights


@dataclass
class FuzzCase:
    """One drawn case: ``hf`` (an HF model in eval mode; ``None`` for Llamba), the ``tokens`` ``[batch, L]``, the
    config fields drawn (for the report) and, for Llamba, the raw config and state dict of its checkpoint."""

    family: str
    seed: int
    hf: Any
    tokens: torch.Tensor
    fields: dict[str, Any]
    load_kwargs: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] | None = None
    state_dict: dict[str, torch.Tensor] | None = field(default=None, repr=False)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _shape(r: random.Random, long: int = 40) -> tuple[int, int]:
    """A batch of 1-3 rows; the length is 1, 2, 3, a short odd length or ``long`` (beyond most chunks)."""
    return r.choice([1, 2, 3]), r.choice([1, 2, 3, 7, 13, long])


def _eps(r: random.Random) -> float:
    return r.choice([1e-6, 1e-5, 1e-2])


def _act(r: random.Random) -> str:
    """silu, or (one draw in ten) gelu: most families' SSM mixers read ``hidden_act`` too and refuse it."""
    return "gelu" if r.random() < 0.1 else "silu"


def _rope(r: random.Random, head_dim: int) -> dict[str, Any]:
    """Default RoPE (base 10 to 5e5, a rotary share whose dims are even, or none stated; families whose HF attention
    rotates the whole head ignore the share), or one draw in ten linear scaling (the hooked hybrids refuse it)."""
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": r.choice([10.0, 1e4, 5e5])}
    shares = [p for p in (0.25, 0.5, 1.0) if (head_dim * p) % 2 == 0]
    if r.random() < 0.7:
        rope["partial_rotary_factor"] = r.choice(shares)
    if r.random() < 0.1:  # HF's linear init reads partial_rotary_factor where the attention does not: no share then
        rope = {"rope_type": "linear", "rope_theta": rope["rope_theta"], "factor": 2.0}
    return rope


def _mamba1(r: random.Random, model_type: str) -> dict[str, Any]:
    f: dict[str, Any] = dict(
        hidden_size=r.choice([5, 7, 12, 13, 16]), state_size=r.randint(1, 8), expand=r.choice([1, 2, 3]),
        conv_kernel=r.randint(1, 5), time_step_rank=r.choice(["auto", 1, 3]), use_bias=r.random() < 0.5,
        use_conv_bias=r.random() < 0.5, residual_in_fp32=r.random() < 0.5, layer_norm_epsilon=_eps(r),
        num_hidden_layers=r.randint(1, 3), tie_word_embeddings=r.random() < 0.5)
    if model_type == "falcon_mamba":
        f["mixer_rms_eps"] = _eps(r)
    # not a config field: channels per protocol head (``from_hf_model(head_size=)``), 1 = the paper's per channel
    f["head_size"] = r.choice([1, 1] + [h for h in _divisors(f["hidden_size"] * f["expand"]) if 1 < h < 8])
    return f


def _mamba2(r: random.Random) -> dict[str, Any]:
    d, expand = r.choice([6, 9, 12, 15, 16]), r.choice([1, 2])
    head_dim = r.choice([h for h in _divisors(d * expand) if h < d * expand])
    n_heads = d * expand // head_dim
    return dict(hidden_size=d, expand=expand, head_dim=head_dim, num_heads=n_heads,
                n_groups=r.choice(_divisors(n_heads)), state_size=r.randint(1, 12), conv_kernel=r.randint(1, 5),
                chunk_size=r.choice([1, 3, 5, 16, 64]), use_bias=r.random() < 0.5, use_conv_bias=r.random() < 0.5,
                time_step_limit=r.choice([(0.0, float("inf")), (0.05, 0.6)]), residual_in_fp32=r.random() < 0.5,
                layer_norm_epsilon=_eps(r), num_hidden_layers=r.randint(1, 3), tie_word_embeddings=r.random() < 0.5)


def _ssm_heads(r: random.Random, d_inner: int) -> tuple[int, int, int]:
    """Mamba-2 head geometry of a hybrid: (n_heads, d_head, n_groups), ``d_head`` often not a power of two."""
    d_head = r.choice([h for h in _divisors(d_inner) if h < d_inner] or [d_inner])
    n_heads = d_inner // d_head
    return n_heads, d_head, r.choice(_divisors(n_heads))


def _attention(r: random.Random, rotary_quarter: bool = False) -> tuple[int, int, int]:
    """(n_heads, n_kv_heads, head_dim): head_dim even (a multiple of 4 where half of it rotates)."""
    n_heads = r.choice([1, 2, 3, 4])
    head_dim = r.choice([4, 8, 12] if rotary_quarter else [2, 4, 6, 8])
    return n_heads, r.choice(_divisors(n_heads)), head_dim


def _layout(r: random.Random, kinds: list[str], n_min: int = 1, n_max: int = 4) -> list[str]:
    """A layer layout: uniform (all one kind) one time in four, else random with any kind first or last."""
    n = r.randint(n_min, n_max)
    if r.random() < 0.25:
        return [r.choice(kinds)] * n
    return [r.choice(kinds) for _ in range(n)]


def _bamba(r: random.Random) -> dict[str, Any]:
    n_attn, n_kv, hd = _attention(r, rotary_quarter=True)
    d = n_attn * hd
    expand = r.choice([1, 2])
    n_heads, d_head, groups = _ssm_heads(r, d * expand)
    types = _layout(r, ["attn", "ssm"])
    return dict(hidden_size=d, num_hidden_layers=len(types), num_attention_heads=n_attn, num_key_value_heads=n_kv,
                attn_layer_indices=[i for i, t in enumerate(types) if t == "attn"] or None,
                intermediate_size=r.choice([6, 20]), mamba_expand=expand, mamba_n_heads=n_heads, mamba_d_head=d_head,
                mamba_n_groups=groups, mamba_d_state=r.randint(1, 8), mamba_d_conv=r.randint(1, 5),
                mamba_chunk_size=r.choice([1, 3, 16]), mamba_conv_bias=r.random() < 0.5,
                mamba_proj_bias=r.random() < 0.5, attention_bias=r.random() < 0.5, mlp_bias=r.random() < 0.5,
                hidden_act=_act(r), rms_norm_eps=_eps(r), tie_word_embeddings=r.random() < 0.5,
                time_step_limit=r.choice([(0.0, float("inf")), (0.05, 0.6)]),
                rope_parameters=_rope(r, hd))


def _jamba(r: random.Random) -> dict[str, Any]:
    n_attn, n_kv, hd = _attention(r)
    n_layers = r.randint(1, 4)
    ap, ep = r.randint(1, 3), r.randint(1, 3)
    n_exp = r.randint(1, 5)
    return dict(hidden_size=n_attn * hd, num_hidden_layers=n_layers, num_attention_heads=n_attn,
                num_key_value_heads=n_kv, intermediate_size=r.choice([6, 20]), attn_layer_period=ap,
                attn_layer_offset=r.randrange(ap), expert_layer_period=ep, expert_layer_offset=r.randrange(ep),
                num_experts=n_exp, num_experts_per_tok=r.randint(1, n_exp), mamba_d_state=r.randint(1, 8),
                mamba_d_conv=r.randint(1, 5), mamba_expand=r.choice([1, 2, 3]),
                mamba_dt_rank=r.choice(["auto", 1, 5]), mamba_conv_bias=r.random() < 0.5,
                mamba_proj_bias=r.random() < 0.5, hidden_act=_act(r), rms_norm_eps=_eps(r),
                tie_word_embeddings=r.random() < 0.5)


def _zamba2(r: random.Random) -> dict[str, Any]:
    n_attn = r.choice([1, 2, 3, 4])
    d = n_attn * r.choice([1, 2, 3])  # attention runs on 2·d: head dim 2·d/n_attn, even
    expand = r.choice([1, 2])
    n_mamba, _, groups = _ssm_heads(r, d * expand)
    adapters = r.random() < 0.5
    types = _layout(r, ["mamba", "hybrid"], n_max=5)
    return dict(hidden_size=d, layers_block_type=types, num_hidden_layers=len(types),
                intermediate_size=r.choice([6, 20]), num_attention_heads=n_attn,
                num_key_value_heads=n_attn if adapters else r.choice(_divisors(n_attn)), mamba_expand=expand,
                n_mamba_heads=n_mamba, mamba_ngroups=groups, mamba_d_state=r.randint(1, 8),
                mamba_d_conv=r.randint(1, 5), chunk_size=r.choice([1, 3, 16]), num_mem_blocks=r.randint(1, 3),
                use_shared_attention_adapter=adapters, adapter_rank=r.randint(1, 3), use_mem_rope=r.random() < 0.5,
                rope_parameters=_rope(r, 2 * d // n_attn),
                use_long_context=r.random() < 0.3, hidden_act=r.choice(["gelu", "silu"]),
                add_bias_linear=r.random() < 0.5, use_conv_bias=r.random() < 0.5, rms_norm_eps=_eps(r),
                tie_word_embeddings=r.random() < 0.5, time_step_min=r.choice([0.001, 0.05]))


def _nemotron_h(r: random.Random) -> dict[str, Any]:
    n_attn, n_kv, hd = _attention(r)
    n_heads = r.choice([1, 2, 3, 4, 6])
    n_exp = r.choice([2, 3, 4, 6])
    types = _layout(r, ["mamba", "attention", "mlp", "moe"], n_max=5)
    if r.random() < 0.9:  # a layout must start with a mixer (refused otherwise), one draw in ten checks the refusal
        types[0] = r.choice(["mamba", "attention"])
    return dict(hidden_size=r.choice([9, 12, 16]), layers_block_type=types,
                num_attention_heads=n_attn, num_key_value_heads=n_kv, head_dim=hd, mamba_num_heads=n_heads,
                mamba_head_dim=r.choice([2, 3, 5, 8]), ssm_state_size=r.randint(1, 8),
                n_groups=r.choice(_divisors(n_heads)), conv_kernel=r.randint(1, 5), chunk_size=r.choice([1, 3, 16]),
                intermediate_size=r.choice([6, 20]), moe_intermediate_size=r.choice([4, 10]),
                moe_shared_expert_intermediate_size=r.choice([4, 12]), n_routed_experts=n_exp,
                n_group=(r.choice([g for g in _divisors(n_exp) if n_exp // g >= 2]) if r.random() < 0.9 else n_exp),
                topk_group=1,
                num_experts_per_tok=r.randint(1, 2), norm_topk_prob=r.random() < 0.5,
                routed_scaling_factor=r.choice([1.0, 2.5]), moe_latent_size=r.choice([None, 6]),
                use_bias=r.random() < 0.5, use_conv_bias=r.random() < 0.5, mamba_proj_bias=r.random() < 0.5,
                attention_bias=r.random() < 0.5, mlp_bias=r.random() < 0.5,
                mlp_hidden_act=r.choice(["relu2", "relu2", "gelu", "silu"]),
                residual_in_fp32=r.random() < 0.5, layer_norm_epsilon=_eps(r),
                time_step_limit=r.choice([(0.0, float("inf")), (0.05, 0.6)]), tie_word_embeddings=r.random() < 0.5)


def _nemotron_fix(f: dict[str, Any], r: random.Random) -> dict[str, Any]:
    """Routing HF can run (one draw in ten has groups of one expert, which the loader refuses): ``topk_group``
    groups up to ``n_group``, at most the experts they hold chosen per token."""
    n_exp, n_group = f["n_routed_experts"], f["n_group"]
    f["topk_group"] = r.randint(1, n_group)
    f["num_experts_per_tok"] = min(f["num_experts_per_tok"], n_exp // n_group * f["topk_group"])
    return f


def _falcon_h1(r: random.Random) -> dict[str, Any]:
    n_attn, n_kv, hd = _attention(r)
    d = r.choice([8, 12, 16])
    d_inner = d * r.choice([1, 2])
    n_ssm, d_head, groups = _ssm_heads(r, d_inner)
    u = [round(r.uniform(0.4, 1.6), 2) for _ in range(13)]
    return dict(hidden_size=d, num_hidden_layers=r.randint(1, 3), num_attention_heads=n_attn,
                num_key_value_heads=n_kv, head_dim=hd, intermediate_size=r.choice([6, 20]), mamba_n_heads=n_ssm,
                mamba_d_ssm=d_inner, mamba_expand=d_inner // d, mamba_d_head=d_head, mamba_n_groups=groups,
                mamba_d_state=r.randint(1, 8), mamba_d_conv=r.randint(1, 5), mamba_chunk_size=r.choice([1, 3, 16]),
                mamba_rms_norm=r.random() < 0.6, mamba_norm_before_gate=r.random() < 0.5,
                mamba_conv_bias=r.random() < 0.5, mamba_proj_bias=r.random() < 0.5,
                projectors_bias=r.random() < 0.5, attention_bias=r.random() < 0.5, mlp_bias=r.random() < 0.5,
                hidden_act=_act(r), rms_norm_eps=_eps(r), tie_word_embeddings=r.random() < 0.5,
                embedding_multiplier=u[0], lm_head_multiplier=u[1], key_multiplier=u[2],
                attention_in_multiplier=u[3], attention_out_multiplier=u[4], ssm_in_multiplier=u[5],
                ssm_out_multiplier=u[6], ssm_multipliers=u[7:12], mlp_multipliers=[u[12], u[0]],
                time_step_limit=r.choice([(0.0, float("inf")), (0.05, 0.6)]), rope_parameters=_rope(r, hd))


def _granite(r: random.Random) -> dict[str, Any]:
    n_attn, n_kv, hd = _attention(r)
    d = n_attn * hd
    expand = r.choice([1, 2])
    n_heads, d_head, groups = _ssm_heads(r, d * expand)
    n_exp = r.choice([0, 1, 3, 5])
    types = _layout(r, ["mamba", "attention"])
    return dict(hidden_size=d, layer_types=types, num_hidden_layers=len(types), num_attention_heads=n_attn,
                num_key_value_heads=n_kv, intermediate_size=r.choice([6, 20]),
                shared_intermediate_size=r.choice([6, 20]), mamba_expand=expand, mamba_n_heads=n_heads,
                mamba_d_head=d_head, mamba_n_groups=groups, mamba_d_state=r.randint(1, 8),
                mamba_d_conv=r.randint(1, 5), mamba_chunk_size=r.choice([1, 3, 16]), num_local_experts=n_exp,
                num_experts_per_tok=r.randint(1, max(1, n_exp)), position_embedding_type=r.choice(["rope", None]),
                rope_parameters=_rope(r, hd), embedding_multiplier=r.uniform(0.5, 8),
                residual_multiplier=r.uniform(0.2, 1.2), attention_multiplier=r.uniform(0.05, 1),
                logits_scaling=r.uniform(0.5, 4), attention_bias=r.random() < 0.5,
                hidden_act=_act(r), rms_norm_eps=_eps(r), tie_word_embeddings=r.random() < 0.5,
                mamba_proj_bias=r.random() < 0.5, mamba_conv_bias=r.random() < 0.5,
                time_step_limit=r.choice([(0.0, float("inf")), (0.05, 0.6)]))


def _qwen3_next(r: random.Random) -> dict[str, Any]:
    n_attn, n_kv, hd = _attention(r)
    n_k = r.choice([1, 2, 3])
    n_layers = r.randint(1, 4)
    f: dict[str, Any] = dict(
        hidden_size=r.choice([9, 12, 16]), num_attention_heads=n_attn, num_key_value_heads=n_kv, head_dim=hd,
        linear_num_key_heads=n_k, linear_num_value_heads=n_k * r.choice([1, 2, 3]),
        linear_key_head_dim=r.choice([2, 3, 6, 8]), linear_value_head_dim=r.choice([2, 5, 8]),
        linear_conv_kernel_dim=r.randint(1, 5), intermediate_size=r.choice([6, 20]),
        num_experts=r.choice([0, 1, 3, 4]), num_experts_per_tok=1, moe_intermediate_size=r.choice([4, 10]),
        shared_expert_intermediate_size=r.choice([4, 12]), decoder_sparse_step=r.choice([1, 2]),
        norm_topk_prob=r.random() < 0.5, mlp_only_layers=sorted(r.sample(range(n_layers), r.randint(0, 1))),
        attention_bias=r.random() < 0.5, rms_norm_eps=_eps(r), tie_word_embeddings=r.random() < 0.5,
        hidden_act=_act(r), rope_parameters=_rope(r, hd), num_hidden_layers=n_layers)
    f["num_experts_per_tok"] = r.randint(1, max(1, f["num_experts"]))
    if r.random() < 0.4:  # the layout from full_attention_interval (HF's default rule) or explicit
        f["full_attention_interval"] = r.randint(1, 3)
    else:
        f["layer_types"] = _layout(r, ["linear_attention", "full_attention"], n_layers, n_layers)
    return f


def _llamba(r: random.Random) -> dict[str, Any]:
    n_qk = r.choice([1, 2, 3])
    n_v = n_qk * r.choice([1, 2])
    d = n_v * r.choice([1, 2, 3, 5])
    return dict(d_model=d, n_layer=r.randint(1, 3), vocab_size=r.choice([50, 61]),
                pad_vocab_size_multiple=r.choice([1, 8]), tie_embeddings=r.random() < 0.5, norm_epsilon=_eps(r),
                ssm_cfg={"d_state": r.randint(1, 8), "n_v_heads": n_v, "n_qk_heads": n_qk, "expand": r.choice([1, 2]),
                         "d_conv": r.randint(1, 5), "conv_bias": r.random() < 0.5,
                         "chunk_size": r.choice([1, 3, 16]),
                         "activation": r.choice(["identity", "silu"]), "bias": r.random() < 0.5},
                mlp_cfg={"intermediate_size": r.choice([6, 20]), "bias": r.random() < 0.5,
                         "act_fn": r.choice(["silu", "gelu"])})


def _llama_like(r: random.Random) -> dict[str, Any]:
    n_attn, n_kv, hd = _attention(r)
    return dict(hidden_size=n_attn * r.choice([2, 3, 4]), head_dim=hd, num_attention_heads=n_attn,
                num_key_value_heads=n_kv, intermediate_size=r.choice([6, 20]), num_hidden_layers=r.randint(1, 3),
                rms_norm_eps=_eps(r), tie_word_embeddings=r.random() < 0.5, rope_parameters=_rope(r, hd),
                attention_bias=r.random() < 0.5, hidden_act=_act(r), max_position_embeddings=64)


def _gpt2(r: random.Random) -> dict[str, Any]:
    n_head = r.choice([1, 2, 3, 4])
    return dict(n_embd=n_head * r.choice([2, 4, 6]), n_head=n_head, n_layer=r.randint(1, 3), n_positions=64,
                n_inner=r.choice([None, 10]), activation_function=r.choice(["gelu_new", "relu", "gelu"]),
                layer_norm_epsilon=_eps(r), scale_attn_weights=r.random() < 0.8,
                scale_attn_by_inverse_layer_idx=r.random() < 0.3, reorder_and_upcast_attn=r.random() < 0.3,
                tie_word_embeddings=r.random() < 0.5)


def _pythia(r: random.Random) -> dict[str, Any]:
    n_head = r.choice([1, 2, 3, 4])
    return dict(hidden_size=n_head * r.choice([4, 8]), num_attention_heads=n_head, num_hidden_layers=r.randint(1, 3),
                intermediate_size=r.choice([6, 20]), rotary_pct=r.choice([0.25, 0.5, 1.0]),
                rotary_emb_base=r.choice([10.0, 1e4]), use_parallel_residual=r.random() < 0.5,
                attention_bias=r.random() < 0.8, layer_norm_eps=_eps(r), max_position_embeddings=64,
                hidden_act=r.choice(["gelu", "relu"]), tie_word_embeddings=r.random() < 0.3)


def _gemma2(r: random.Random) -> dict[str, Any]:
    n_attn, n_kv, hd = _attention(r)
    return dict(hidden_size=n_attn * r.choice([2, 4]), head_dim=hd, num_attention_heads=n_attn,
                num_key_value_heads=n_kv, intermediate_size=r.choice([6, 20]), num_hidden_layers=r.randint(1, 3),
                query_pre_attn_scalar=r.choice([hd, 3]), sliding_window=r.choice([2, 5, 64]),
                attn_logit_softcapping=r.choice([None, 1.0, 20.0]), final_logit_softcapping=r.choice([None, 3.0]),
                rms_norm_eps=_eps(r), max_position_embeddings=64, rope_parameters=_rope(r, hd))


#: the HF classes of each family and the draw of its config fields
_HF: dict[str, tuple[str, str, Callable[[random.Random], dict[str, Any]]]] = {
    "mamba": ("MambaConfig", "MambaForCausalLM", lambda r: _mamba1(r, "mamba")),
    "falcon_mamba": ("FalconMambaConfig", "FalconMambaForCausalLM", lambda r: _mamba1(r, "falcon_mamba")),
    "mamba2": ("Mamba2Config", "Mamba2ForCausalLM", _mamba2),
    "bamba": ("BambaConfig", "BambaForCausalLM", _bamba),
    "jamba": ("JambaConfig", "JambaForCausalLM", _jamba),
    "zamba2": ("Zamba2Config", "Zamba2ForCausalLM", _zamba2),
    "nemotron_h": ("NemotronHConfig", "NemotronHForCausalLM", lambda r: _nemotron_fix(_nemotron_h(r), r)),
    "falcon_h1": ("FalconH1Config", "FalconH1ForCausalLM", _falcon_h1),
    "granitemoehybrid": ("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM", _granite),
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM", _qwen3_next),
    "llama": ("LlamaConfig", "LlamaForCausalLM", _llama_like),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", _llama_like),
    "mistral": ("MistralConfig", "MistralForCausalLM", _llama_like),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", _gpt2),
    "pythia": ("GPTNeoXConfig", "GPTNeoXForCausalLM", _pythia),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", _gemma2),
    **BRIDGE_HF,
    **DECODER_HF,
}

#: every family :func:`draw` knows
FAMILIES: tuple[str, ...] = (*_HF, "llamba")
VOCAB = 53


def draw_fields(family: str, seed: int) -> tuple[int, int, dict[str, Any]]:
    """``(batch, L, fields)`` of :func:`draw` without building the model (Llamba: its raw config's overrides)."""
    r = random.Random(f"{family}/{seed}")
    batch, L = _shape(r)
    return batch, L, _llamba(r) if family == "llamba" else _HF[family][2](r)


def draw(family: str, seed: int) -> FuzzCase:
    """A random small model of ``family`` and token rows for it, both from ``seed``."""
    batch, L, fields = draw_fields(family, seed)
    if family == "llamba":
        from gather_aggregate.testing.llamba_checkpoints import llamba_raw_config, random_llamba_state_dict

        raw = llamba_raw_config(**fields)
        toks = torch.randint(0, int(raw["vocab_size"]), (batch, L), generator=torch.Generator().manual_seed(seed))
        return FuzzCase(family, seed, None, toks, fields, raw=raw, state_dict=random_llamba_state_dict(raw, seed))
    import transformers

    config_cls, model_cls, _ = _HF[family]
    load_kwargs = {k: fields[k] for k in ("head_size",) if k in fields}
    config = getattr(transformers, config_cls)(vocab_size=VOCAB, **{k: v for k, v in fields.items()
                                                                    if k not in load_kwargs})
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"  # HF's grouped-matmul experts need 16-byte strides (odd widths fail)
    torch.manual_seed(seed)
    hf = stress_weights(getattr(transformers, model_cls)(config).eval(), seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # routers' correction biases matter too
        for name, buf in hf.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.copy_(0.3 * torch.randn(buf.shape, generator=g))
    toks = torch.randint(0, VOCAB, (batch, L), generator=torch.Generator().manual_seed(seed))
    return FuzzCase(family, seed, hf, toks, fields, load_kwargs)


__all__ = ["FAMILIES", "FuzzCase", "draw", "draw_fields"]
