"""Tiny random HF Mamba models for tests, benchmarks and docs (no hub access).

``tiny_hf_ssm("mamba" | "falcon_mamba" | "mamba2", **config_overrides)`` builds
an HF reference model from a config with random weights.  ``stress=True``
re-draws the SSM parameters (A_log, Δ bias, D, norm weights) far from HF's
gentle initialisation, so that tests also see large Δ·A, negative D and
non-unit norms.
"""

from __future__ import annotations

from typing import Any

import torch


def hf_config(model_type: str, **overrides: Any) -> Any:
    from transformers import FalconMambaConfig, Mamba2Config, MambaConfig

    if model_type == "mamba2":
        base: dict[str, Any] = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, state_size=16, expand=2,
                                    num_heads=8, head_dim=8, n_groups=2, chunk_size=16, conv_kernel=4,
                                    tie_word_embeddings=False)
        base.update(overrides)
        return Mamba2Config(**base)
    base = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, state_size=8, expand=2, conv_kernel=4)
    base.update(overrides)
    if model_type == "mamba":
        return MambaConfig(**base)
    if model_type == "falcon_mamba":
        return FalconMambaConfig(**base)
    raise ValueError(f"unknown model_type {model_type!r}")


@torch.no_grad()
def stress_params(hf_model: Any, seed: int = 0) -> Any:
    """Re-draw A_log, the Δ bias, D and the RMSNorm weights in place (on a model the caller owns)."""
    g = torch.Generator().manual_seed(seed)
    for name, p in hf_model.named_parameters():
        if name.endswith("A_log"):
            p.copy_(torch.empty(p.shape).uniform_(-2.0, 3.0, generator=g))
        elif name.endswith("dt_proj.bias") or name.endswith("dt_bias"):
            p.copy_(torch.empty(p.shape).uniform_(-4.0, 2.0, generator=g))
        elif name.endswith(".D"):
            p.copy_(torch.randn(p.shape, generator=g))
        elif name.endswith("norm.weight") or name.endswith("norm_f.weight"):
            p.copy_(1.0 + 0.5 * torch.randn(p.shape, generator=g))
    return hf_model


def tiny_hf_ssm(model_type: str = "mamba", *, seed: int = 0, stress: bool = False, **overrides: Any) -> Any:
    """A small random HF ``MambaForCausalLM`` / ``FalconMambaForCausalLM`` / ``Mamba2ForCausalLM`` in eval mode."""
    from transformers import FalconMambaForCausalLM, Mamba2ForCausalLM, MambaForCausalLM

    cls = {"mamba": MambaForCausalLM, "falcon_mamba": FalconMambaForCausalLM, "mamba2": Mamba2ForCausalLM}[model_type]
    torch.manual_seed(seed)
    model = cls(hf_config(model_type, **overrides)).eval()
    if stress:
        stress_params(model, seed)
    return model


def hf_logits(hf_model: Any, tokens: torch.Tensor) -> torch.Tensor:
    """Reference logits of an HF Mamba model (no cache, fp32)."""
    with torch.no_grad():
        return hf_model(tokens, use_cache=False).logits.float()
