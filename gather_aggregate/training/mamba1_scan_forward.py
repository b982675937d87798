"""Train HF's ``MambaForCausalLM`` through this project's chunked S6 scan (:func:`~gather_aggregate.adapters.selective_scan.mamba1_scan`).

HF's CPU path for Mamba-1 materialises ``exp(Δ A)`` and ``Δ B x`` for the whole
sequence (``[batch, d_inner, pos, d_state]``) and scans them with mambapy's
``pscan`` (or a Python loop over time without it).  The chunked scan loops over
chunks of 16 steps and, inside a chunk, writes the states in closed form

    h_t = e^{S_t} ( h_start + Σ_{s≤t} e^{-S_s} Δ_s B_s x_s ),    S_t = A Σ_{k≤t} Δ_k,

which is differentiable end to end (cumsum, exp, products; the fallback
doubling scan likewise).  :class:`ScanMambaMixer` is HF's ``MambaMixer`` with
that scan in its forward and the same parameters, so a model trained with it
is a plain ``MambaForCausalLM``: ``save_pretrained`` writes the HF layout and
the checkpoint reloads without this module.  The mixer's per-token math is
HF's ``MambaMixer.forward`` without a cache:

    x, z      = in_proj(u)                              (split over channels)
    x         = silu(causal_conv1d(x))
    δ, B, C   = x_proj(x)                                (split: dt_rank, N, N)
    Δ         = softplus(dt_proj.weight δ + dt_proj.bias)    (fp32)
    y         = S6(x, Δ, A = -exp(A_log), B, C) + D x
    out       = out_proj(y · silu(z))

With a cache (generation) the mixer defers to HF's own forward.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from gather_aggregate.adapters.selective_scan import mamba1_scan


def _mixer_class() -> type:
    from transformers.models.mamba.modeling_mamba import MambaMixer

    class ScanMambaMixer(MambaMixer):  # type: ignore[misc]
        """HF ``MambaMixer`` whose cache-free forward runs :func:`mamba1_scan` (same parameters, same outputs)."""

        def forward(self, hidden_states: Tensor, cache_params: Any = None, attention_mask: Tensor | None = None,
                    **kwargs: Any) -> Tensor:
            if cache_params is not None:
                return super().forward(hidden_states, cache_params=cache_params, attention_mask=attention_mask,
                                       **kwargs)
            return scan_mixer_forward(self, hidden_states, attention_mask)

    return ScanMambaMixer


def scan_mixer_forward(mixer: Any, u: Tensor, attention_mask: Tensor | None = None) -> Tensor:
    """HF ``MambaMixer.forward`` (no cache) with the S6 scan done by :func:`mamba1_scan`."""
    dtype, L = u.dtype, u.shape[1]
    if attention_mask is not None:
        u = u * attention_mask[:, :, None].to(dtype)
    x, z = mixer.in_proj(u).chunk(2, dim=-1)  # [b, L, d_inner] each
    w = mixer.conv1d.weight  # [d_inner, 1, k]
    x = F.conv1d(x.transpose(1, 2).to(w.dtype), w, mixer.conv1d.bias, padding=w.shape[-1] - 1,
                 groups=w.shape[0])[..., :L]
    x = F.silu(x).transpose(1, 2).to(dtype)
    if attention_mask is not None:
        x = x * attention_mask[:, :, None].to(dtype)
    dt_low, B, C = mixer.x_proj(x).split([mixer.time_step_rank, mixer.ssm_state_size, mixer.ssm_state_size], dim=-1)
    dt = F.softplus(F.linear(dt_low, mixer.dt_proj.weight).float() + mixer.dt_proj.bias.float())
    A = -torch.exp(mixer.A_log.float())
    y = mamba1_scan(x.float(), dt, A, B.float(), C.float(), mixer.D.float())
    y = y * F.silu(z.float())
    return mixer.out_proj(y.to(dtype))


def use_chunked_scan(model: Any) -> Any:
    """Switch every Mamba-1 mixer of ``model`` (a ``MambaForCausalLM`` this package is training) to
    :class:`ScanMambaMixer`, in place; returns ``model``.  Parameters, state-dict keys and config are untouched,
    so ``model.save_pretrained`` writes a plain HF checkpoint."""
    from transformers.models.mamba.modeling_mamba import MambaMixer

    cls = _scan_mixer()
    for module in model.modules():
        if isinstance(module, MambaMixer) and not isinstance(module, cls):
            module.__class__ = cls
    return model


def use_hf_scan(model: Any) -> Any:
    """Undo :func:`use_chunked_scan` (every mixer back to HF's ``MambaMixer``), in place; returns ``model``."""
    from transformers.models.mamba.modeling_mamba import MambaMixer

    cls = _scan_mixer()
    for module in model.modules():
        if isinstance(module, cls):
            module.__class__ = MambaMixer
    return model


@functools.cache
def _scan_mixer() -> type:
    """The one :class:`ScanMambaMixer` class (built lazily so importing this module does not import transformers)."""
    return _mixer_class()
