"""Tiny random HF Mamba models for tests, benchmarks and docs (no hub access).

``tiny_hf_ssm("mamba" | "falcon_mamba" | "mamba2", **config_overrides)`` builds
an HF reference model from a config with random weights.  ``stress=True``
re-draws the SSM parameters (A_log, Δ bias, D, norm weights) far from HF's
gentle initialisation, so that tests also see large Δ·A, negative D and
non-unit norms.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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


Rule = tuple[Callable[[str], bool], Callable[[torch.Size, torch.Generator], torch.Tensor]]


def ssm_rules(a_log_high: float) -> list[Rule]:
    """Re-draws of the SSM parameters: ``A_log`` ~ U(-2, ``a_log_high``), the Δ bias ~ U(-4, 2), ``D`` ~ N(0, 1)."""
    return [(lambda n: n.endswith("A_log"), lambda s, g: torch.empty(s).uniform_(-2.0, a_log_high, generator=g)),
            (lambda n: n.endswith("dt_proj.bias") or n.endswith("dt_bias"),
             lambda s, g: torch.empty(s).uniform_(-4.0, 2.0, generator=g)),
            (lambda n: n.endswith(".D"), lambda s, g: torch.randn(s, generator=g))]


def norm_weights(s: torch.Size, g: torch.Generator) -> torch.Tensor:
    """Norm weights far from one: ``1 + 0.5 N(0, 1)``."""
    return 1.0 + 0.5 * torch.randn(s, generator=g)


@torch.no_grad()
def redraw(hf_model: Any, seed: int, rules: Sequence[Rule]) -> Any:
    """Re-draw in place (on a model the caller owns) every parameter whose name a rule accepts, by the first such
    rule, in ``named_parameters`` order from one generator seeded by ``seed``; returns the model."""
    g = torch.Generator().manual_seed(seed)
    for name, p in hf_model.named_parameters():
        draw = next((draw for accepts, draw in rules if accepts(name)), None)
        if draw is not None:
            p.copy_(draw(p.shape, g))
    return hf_model


def stress_params(hf_model: Any, seed: int = 0) -> Any:
    """Re-draw A_log, the Δ bias, D and the RMSNorm weights in place (on a model the caller owns)."""
    norm = (lambda n: n.endswith("norm.weight") or n.endswith("norm_f.weight"), norm_weights)
    return redraw(hf_model, seed, [*ssm_rules(a_log_high=3.0), norm])


def seeded_hf(cls: Any, config: Any, seed: int, stress: Callable[[Any, int], Any] | None = None) -> Any:
    """``cls(config)`` in eval mode, its weights drawn after ``torch.manual_seed(seed)``, then ``stress(model,
    seed)`` when given."""
    torch.manual_seed(seed)
    model = cls(config).eval()
    return stress(model, seed) if stress is not None else model


def tiny_hf_ssm(model_type: str = "mamba", *, seed: int = 0, stress: bool = False, **overrides: Any) -> Any:
    """A small random HF ``MambaForCausalLM`` / ``FalconMambaForCausalLM`` / ``Mamba2ForCausalLM`` in eval mode."""
    from transformers import FalconMambaForCausalLM, Mamba2ForCausalLM, MambaForCausalLM

    cls = {"mamba": MambaForCausalLM, "falcon_mamba": FalconMambaForCausalLM, "mamba2": Mamba2ForCausalLM}[model_type]
    return seeded_hf(cls, hf_config(model_type, **overrides), seed, stress_params if stress else None)


def hf_logits(hf_model: Any, tokens: torch.Tensor) -> torch.Tensor:
    """Reference logits of an HF Mamba model (no cache, fp32)."""
    with torch.no_grad():
        return hf_model(tokens, use_cache=False).logits.float()
