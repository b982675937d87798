"""Tiny random HF hybrids (Bamba, Jamba, Zamba2) for tests, benchmarks and docs (no hub access)."""

from __future__ import annotations

from typing import Any

import torch

from gather_aggregate.testing.tiny_ssm import hf_logits, norm_weights, redraw, seeded_hf, ssm_rules


def hf_hybrid_config(model_type: str, **overrides: Any) -> Any:
    """A small ``BambaConfig`` / ``JambaConfig`` / ``Zamba2Config``; ``overrides`` replace any field."""
    if model_type == "bamba":
        from transformers import BambaConfig

        base: dict[str, Any] = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                                    num_attention_heads=4, num_key_value_heads=2, attn_layer_indices=[1],
                                    mamba_n_heads=8, mamba_d_head="auto", mamba_n_groups=2, mamba_d_state=16,
                                    mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=16, tie_word_embeddings=False)
        base.update(overrides)
        return BambaConfig(**base)
    if model_type == "jamba":
        from transformers import JambaConfig

        base = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=2, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
                    expert_layer_offset=0, num_experts=4, num_experts_per_tok=2, mamba_d_state=8, mamba_d_conv=4,
                    mamba_expand=2, tie_word_embeddings=False)
        base.update(overrides)
        return JambaConfig(**base)
    if model_type == "zamba2":
        from transformers import Zamba2Config

        base = dict(vocab_size=97, hidden_size=32, intermediate_size=48,
                    layers_block_type=["mamba", "hybrid", "mamba", "hybrid"], num_attention_heads=4,
                    mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, n_mamba_heads=8, mamba_ngroups=1,
                    chunk_size=16, num_mem_blocks=1, use_shared_attention_adapter=True, adapter_rank=4,
                    use_mem_rope=True, hidden_act="gelu")
        base.update(overrides)
        base.setdefault("num_hidden_layers", len(base["layers_block_type"]))
        return Zamba2Config(**base)
    raise ValueError(f"unknown hybrid model_type {model_type!r}; use 'bamba', 'jamba' or 'zamba2'")


def stress_hybrid(hf_model: Any, seed: int = 0) -> Any:
    """Re-draw SSM parameters and norm weights far from HF's gentle init (in place, on a model the caller owns)."""
    return redraw(hf_model, seed, [
        *ssm_rules(a_log_high=2.0), (lambda n: "norm" in n and n.endswith("weight"), norm_weights),
        (lambda n: "adapter_list" in n, lambda s, g: 0.3 * torch.randn(s, generator=g)),  # LoRA adapters that matter
        (lambda n: n.endswith("router.weight"), lambda s, g: torch.randn(s, generator=g)),  # sharper top-k routing
    ])


def tiny_hf_hybrid(model_type: str = "bamba", *, seed: int = 0, stress: bool = False, **overrides: Any) -> Any:
    """A small random HF ``BambaForCausalLM`` / ``JambaForCausalLM`` / ``Zamba2ForCausalLM`` in eval mode."""
    from transformers import BambaForCausalLM, JambaForCausalLM, Zamba2ForCausalLM

    cls = {"bamba": BambaForCausalLM, "jamba": JambaForCausalLM, "zamba2": Zamba2ForCausalLM}[model_type]
    return seeded_hf(cls, hf_hybrid_config(model_type, **overrides), seed, stress_hybrid if stress else None)


#: reference logits of an HF hybrid (no cache, fp32): the same call as an HF SSM's
hf_hybrid_logits = hf_logits
