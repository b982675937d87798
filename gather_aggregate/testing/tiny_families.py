"""Tiny random HF models of the newer recurrent families (Qwen3-Next, ...) for tests, benchmarks and docs.

Weights are redrawn so that activations stay O(1) and every parameter matters: linear weights
``N(0, 1/fan_in)``, norm weights ``N(0, 0.3)`` around their neutral value, decay parameters ``N(0, 1)``.
"""

from __future__ import annotations

import random
from typing import Any

import torch


def qwen3_next_config(**overrides: Any) -> Any:
    """A small ``Qwen3NextConfig`` (DeltaNet, attention, DeltaNet, attention; MoE with a shared expert)."""
    from transformers import Qwen3NextConfig

    base: dict[str, Any] = dict(
        vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=8,
        linear_value_head_dim=8, linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=16, shared_expert_intermediate_size=24,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"])
    base.update(overrides)
    base["num_hidden_layers"] = len(base["layer_types"])
    return Qwen3NextConfig(**base)


def random_qwen3_next_config(seed: int, vocab_size: int = 61) -> Any:
    """A randomised small ``Qwen3NextConfig`` (layouts, head counts, GQA, MoE/dense layers, RoPE share)."""
    r = random.Random(seed)
    n_k = r.choice([1, 2])
    n_layers = r.choice([2, 3, 4])
    types = [r.choice(["linear_attention", "linear_attention", "full_attention"]) for _ in range(n_layers)]
    types[0] = "linear_attention"
    n_attn = r.choice([2, 4])
    return qwen3_next_config(
        vocab_size=vocab_size, hidden_size=r.choice([16, 32]), layer_types=types, num_attention_heads=n_attn,
        num_key_value_heads=r.choice([1, n_attn]), head_dim=r.choice([4, 8]), linear_num_key_heads=n_k,
        linear_num_value_heads=n_k * r.choice([1, 2, 3]), linear_key_head_dim=r.choice([4, 8]),
        linear_value_head_dim=r.choice([4, 6, 8]), linear_conv_kernel_dim=r.choice([2, 4]),
        num_experts=r.choice([0, 4]), num_experts_per_tok=r.choice([1, 2]), norm_topk_prob=r.random() < 0.5,
        mlp_only_layers=[0] if r.random() < 0.3 else [], tie_word_embeddings=r.random() < 0.3,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": r.choice([0.25, 0.5, 1.0])})


def granite_config(**overrides: Any) -> Any:
    """A small ``GraniteMoeHybridConfig`` (Mamba-2, attention, Mamba-2; MoE; μP multipliers away from 1)."""
    from transformers import GraniteMoeHybridConfig

    base: dict[str, Any] = dict(
        vocab_size=97, hidden_size=32, intermediate_size=24, shared_intermediate_size=40, num_attention_heads=4,
        num_key_value_heads=2, layer_types=["mamba", "attention", "mamba"], mamba_n_heads=8, mamba_n_groups=2,
        mamba_d_state=8, mamba_d_head=8, mamba_expand=2, mamba_chunk_size=16, num_local_experts=4,
        num_experts_per_tok=2, position_embedding_type="rope", embedding_multiplier=3.0, residual_multiplier=0.5,
        attention_multiplier=0.3, logits_scaling=2.5)
    base.update(overrides)
    base["num_hidden_layers"] = len(base["layer_types"])
    return GraniteMoeHybridConfig(**base)


def random_granite_config(seed: int, vocab_size: int = 61) -> Any:
    """A randomised small ``GraniteMoeHybridConfig`` (layout, heads, groups, experts, RoPE or none, multipliers)."""
    r = random.Random(seed)
    n_layers = r.choice([2, 3, 4])
    types = [r.choice(["mamba", "mamba", "attention"]) for _ in range(n_layers)]
    d = r.choice([16, 32])
    n_heads = r.choice([4, 8])
    n_attn = r.choice([2, 4])
    return granite_config(
        vocab_size=vocab_size, hidden_size=d, layer_types=types, mamba_n_heads=n_heads,
        mamba_d_head=2 * d // n_heads, mamba_n_groups=r.choice([1, 2]), mamba_d_state=r.choice([4, 8, 16]),
        mamba_d_conv=r.choice([2, 4]), mamba_chunk_size=r.choice([8, 16]), num_attention_heads=n_attn,
        num_key_value_heads=r.choice([1, n_attn]), num_local_experts=r.choice([0, 4]),
        num_experts_per_tok=r.choice([1, 2]), position_embedding_type=r.choice(["rope", None]),
        embedding_multiplier=r.choice([1.0, 4.0]), residual_multiplier=r.choice([1.0, 0.3]),
        attention_multiplier=r.choice([0.125, 0.5]), logits_scaling=r.choice([1.0, 3.0]),
        tie_word_embeddings=r.random() < 0.3, mamba_proj_bias=r.random() < 0.3, mamba_conv_bias=r.random() < 0.7)


def tiny_hf_granite(seed: int = 0, config: Any = None, **overrides: Any) -> Any:
    """A random ``GraniteMoeHybridForCausalLM`` in eval mode (fp32, CPU)."""
    from transformers import GraniteMoeHybridForCausalLM

    torch.manual_seed(seed)
    hf = GraniteMoeHybridForCausalLM(config if config is not None else granite_config(**overrides)).eval()
    return stress_weights(hf, seed)


def nemotron_h_config(**overrides: Any) -> Any:
    """A small ``NemotronHConfig``: Mamba-2, MoE, attention, MLP, Mamba-2 (three protocol layers)."""
    from transformers import NemotronHConfig

    base: dict[str, Any] = dict(
        vocab_size=97, hidden_size=32, layers_block_type=["linear_attention", "moe", "full_attention", "mlp",
                                                          "linear_attention"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, mamba_num_heads=8, mamba_head_dim=8,
        ssm_state_size=8, n_groups=2, chunk_size=16, intermediate_size=48, moe_intermediate_size=16,
        moe_shared_expert_intermediate_size=24, n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
        routed_scaling_factor=2.5)
    base.update(overrides)
    return NemotronHConfig(**base)


def random_nemotron_h_config(seed: int, vocab_size: int = 61) -> Any:
    """A randomised small ``NemotronHConfig`` (layout, heads, groups, experts, latent MoE, routing)."""
    r = random.Random(seed)
    types = ["linear_attention"]
    for _ in range(r.choice([2, 3, 4, 5])):
        types.append(r.choice(["linear_attention", "full_attention", "mlp", "moe"]))
    n_heads = r.choice([4, 8])
    n_attn = r.choice([2, 4])
    n_exp = r.choice([4, 8])
    return nemotron_h_config(
        vocab_size=vocab_size, layers_block_type=types, mamba_num_heads=n_heads, mamba_head_dim=r.choice([4, 8]),
        ssm_state_size=r.choice([4, 8, 16]), n_groups=r.choice([1, 2]), conv_kernel=r.choice([2, 4]),
        chunk_size=r.choice([8, 16]), num_attention_heads=n_attn, num_key_value_heads=r.choice([1, n_attn]),
        n_routed_experts=n_exp, n_group=r.choice([1, 2]), topk_group=1, num_experts_per_tok=r.choice([1, 2]),
        norm_topk_prob=r.random() < 0.5, moe_latent_size=r.choice([None, 12]), use_bias=r.random() < 0.3,
        use_conv_bias=r.random() < 0.7, tie_word_embeddings=r.random() < 0.3, time_step_min=r.choice([0.001, 0.3]))


def tiny_hf_nemotron_h(seed: int = 0, config: Any = None, **overrides: Any) -> Any:
    """A random ``NemotronHForCausalLM`` in eval mode (fp32, CPU); the router's correction bias is redrawn too."""
    from transformers import NemotronHForCausalLM

    torch.manual_seed(seed)
    hf = stress_weights(NemotronHForCausalLM(config if config is not None else nemotron_h_config(**overrides)).eval(),
                        seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, buf in hf.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.copy_(0.3 * torch.randn(buf.shape, generator=g))
    return hf


def falcon_h1_config(**overrides: Any) -> Any:
    """A small ``FalconH1Config``: attention (4 heads of 8, GQA 2) beside Mamba-2 (8 heads of 8, 2 groups) in each
    of 2 layers, every μP multiplier away from 1."""
    from transformers import FalconH1Config

    base: dict[str, Any] = dict(
        vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, mamba_d_ssm=64, mamba_n_heads=8, mamba_d_head=8, mamba_n_groups=2,
        mamba_d_state=8, mamba_d_conv=4, mamba_chunk_size=16, mamba_rms_norm=True, mamba_norm_before_gate=False,
        embedding_multiplier=2.5, lm_head_multiplier=0.4, key_multiplier=0.7, attention_in_multiplier=1.3,
        attention_out_multiplier=0.6, ssm_in_multiplier=1.2, ssm_out_multiplier=0.8,
        ssm_multipliers=[0.9, 1.1, 0.7, 1.4, 0.5], mlp_multipliers=[1.2, 0.6])
    base.update(overrides)
    return FalconH1Config(**base)


def random_falcon_h1_config(seed: int, vocab_size: int = 61) -> Any:
    """A randomised small ``FalconH1Config`` (head counts and sizes, GQA, groups, gated-norm variants, biases,
    ``mamba_d_ssm`` or ``mamba_expand``, multipliers)."""
    r = random.Random(seed)
    d = r.choice([16, 32])
    n_attn = r.choice([2, 4])
    n_ssm = r.choice([4, 8])
    d_inner = r.choice([d, 2 * d])
    u = [round(r.uniform(0.4, 1.6), 2) for _ in range(13)]
    return falcon_h1_config(
        vocab_size=vocab_size, hidden_size=d, num_hidden_layers=r.choice([1, 2, 3]), num_attention_heads=n_attn,
        num_key_value_heads=r.choice([1, n_attn]), head_dim=r.choice([4, 8]), mamba_n_heads=n_ssm,
        mamba_d_ssm=d_inner if r.random() < 0.7 else None, mamba_expand=d_inner // d, mamba_d_head=d_inner // n_ssm,
        mamba_n_groups=r.choice([1, 2]), mamba_d_state=r.choice([4, 8, 16]), mamba_d_conv=r.choice([2, 4]),
        mamba_chunk_size=r.choice([8, 16]), mamba_rms_norm=r.random() < 0.7, mamba_norm_before_gate=r.random() < 0.5,
        mamba_conv_bias=r.random() < 0.7, mamba_proj_bias=r.random() < 0.3, projectors_bias=r.random() < 0.3,
        attention_bias=r.random() < 0.3, mlp_bias=r.random() < 0.3, tie_word_embeddings=r.random() < 0.3,
        embedding_multiplier=u[0], lm_head_multiplier=u[1], key_multiplier=u[2], attention_in_multiplier=u[3],
        attention_out_multiplier=u[4], ssm_in_multiplier=u[5], ssm_out_multiplier=u[6], ssm_multipliers=u[7:12],
        mlp_multipliers=[u[12], u[0]], time_step_limit=r.choice([(0.0, float("inf")), (0.01, 2.0)]),
        rope_parameters={"rope_type": "default", "rope_theta": 1e11 if seed % 2 else 1e4})  # Falcon-H1 ships 1e11


def tiny_hf_falcon_h1(seed: int = 0, config: Any = None, **overrides: Any) -> Any:
    """A random ``FalconH1ForCausalLM`` in eval mode (fp32, CPU)."""
    from transformers import FalconH1ForCausalLM

    torch.manual_seed(seed)
    hf = FalconH1ForCausalLM(config if config is not None else falcon_h1_config(**overrides)).eval()
    return stress_weights(hf, seed)


def stress_weights(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Redraw every parameter in place (see the module docstring); returns ``model``."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                neutral = 0.0 if p.data.abs().max() == 0 else 1.0  # offset norms start at 0, plain ones at 1
                p.copy_(neutral + 0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith(("A_log", "dt_bias")):
                p.copy_(torch.randn(p.shape, generator=g))
            elif p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5)
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return model


def tiny_hf_qwen3_next(seed: int = 0, config: Any = None, **overrides: Any) -> Any:
    """A random ``Qwen3NextForCausalLM`` in eval mode (fp32, CPU)."""
    from transformers import Qwen3NextForCausalLM

    torch.manual_seed(seed)
    hf = Qwen3NextForCausalLM(config if config is not None else qwen3_next_config(**overrides)).eval()
    return stress_weights(hf, seed)


__all__ = ["qwen3_next_config", "random_qwen3_next_config", "stress_weights", "tiny_hf_qwen3_next", "granite_config",
           "random_granite_config", "tiny_hf_granite", "nemotron_h_config", "random_nemotron_h_config",
           "tiny_hf_nemotron_h", "falcon_h1_config", "random_falcon_h1_config", "tiny_hf_falcon_h1"]
