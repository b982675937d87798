"""Rotary position embeddings (RoPE) in HF Llama's non-interleaved convention, partial RoPE included.

Shared by the hooked attention of hybrids (:mod:`gather_aggregate.adapters.attention`), the head-level hybrid and
the bridge's check of a model's rotation convention::

    rotate_half([x1, x2]) = [-x2, x1]
    rope(x)               = x * cos + rotate_half(x) * sin        # on the first rotary_dim dims of each head
    angle(pos, i)         = pos / theta^(2i / rotary_dim)
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor


def rotate_half(x: Tensor) -> Tensor:
    """``[x1, x2] -> [-x2, x1]`` on the last axis (the non-interleaved RoPE convention of HF Llama)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_cos_sin(inv_freq: Tensor, n_pos: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """``cos, sin`` of shape ``[pos, rotary_dim]``: angle ``pos * inv_freq``, duplicated over both halves."""
    pos = torch.arange(n_pos, device=inv_freq.device, dtype=torch.float32)
    freqs = pos[:, None] * inv_freq.float()[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: Float[Tensor, "batch pos head d_head"], cos: Tensor, sin: Tensor) -> Float[Tensor, "batch pos head d_head"]:
    """RoPE on the first ``cos.shape[-1]`` dims of each head; the rest pass through (partial RoPE).
    ``cos``/``sin``: ``[pos, rotary_dim]``, or ``[batch, pos, rotary_dim]`` for per-prompt positions."""
    r = cos.shape[-1]
    x_rot, x_pass = x[..., :r], x[..., r:]
    c, s = cos.unsqueeze(-2), sin.unsqueeze(-2)  # broadcast over heads
    return torch.cat((x_rot * c + rotate_half(x_rot) * s, x_pass), dim=-1)


def default_inv_freq(rotary_dim: int, theta: float) -> Tensor:
    """``1 / theta^(2i / rotary_dim)`` for ``i < rotary_dim / 2`` (the default RoPE)."""
    return 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))
