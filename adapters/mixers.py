"""Hooked Mamba-1 and Mamba-2 mixers (the SSM half of a block), exact to HF's pure-torch path.

Hook points (``[batch, pos, ...]``; names as seen from the model root are
``blocks.{L}.ssm.<name>``):

=================  ===========================================  ============================================
hook               Mamba-1                                      Mamba-2
=================  ===========================================  ============================================
``hook_conv_in``   x before the conv ``[b, p, d_inner]``        x‖B‖C before the conv ``[b, p, conv_dim]``
``hook_conv_out``  conv output, pre-activation (same shape)     conv output, pre-activation (same shape)
``hook_gate``      z ``[b, p, d_inner]``                        z ``[b, p, d_inner]``
``hook_x``         SSM input ``silu(conv)`` ``[b, p, d_inner]``  SSM input ``[b, p, d_inner]``
``hook_dt``        Δ ``[b, p, d_inner]`` (after softplus)        Δ ``[b, p, head]`` (softplus, then clamp)
``hook_B/_C``      ``[b, p, d_state]`` (after FalconMamba RMS)   ``[b, p, group, d_state]``
``hook_y``         SSM output incl. ``D x`` ``[b, p, d_inner]``  same
``hook_gated``     ``y * silu(z)`` ``[b, p, d_inner]``           ``y * silu(z)`` before the gated RMSNorm
``hook_head_out``  ``[b, p, head, d_head]`` = out_proj input     ``[b, p, head, d_head]`` = out_proj input
``hook_state``     ``[b, p, d_inner, d_state]`` (sequential      ``[b, p, head, d_head, d_state]``
                   mode only)                                   (sequential mode only)
=================  ===========================================  ============================================
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from gather_aggregate.adapters import fastpath
from gather_aggregate.adapters.config import SSMConfig
from gather_aggregate.adapters.selective_scan import (
    mamba1_scan,
    mamba1_scan_ref,
    mamba2_scan,
    mamba2_scan_ref,
)
from gather_aggregate.core.errors import InputError

SCAN_IMPLS = ("auto", "chunked", "sequential", "kernel")


class WeightedRMS(nn.Module):
    """``w ⊙ x / rms(x)``: the normalisation computed in fp32 (as HF's ``MambaRMSNorm``), the weight applied in
    the input's dtype."""

    def __init__(self, d: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def normalize(self, x: Float[Tensor, "batch pos d"]) -> Float[Tensor, "batch pos d"]:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class RMSNorm(WeightedRMS):
    """:class:`WeightedRMS` whose output is ``hook_normalized``."""

    def __init__(self, d: int, eps: float) -> None:
        super().__init__(d, eps)
        self.hook_normalized = HookPoint()

    def forward(self, x: Float[Tensor, "batch pos d"]) -> Float[Tensor, "batch pos d"]:
        return self.hook_normalized(self.normalize(x))


class MLPAfterMixer:
    """The Llama layout's rest of a block once its mixer has run, ``r += mixer_out; r += mlp(ln2(r))``, through
    the block's ``hook_mixer_out``, ``hook_resid_mid``, ``hook_mlp_out`` and ``hook_resid_post`` (a block class
    mixes it in beside ``nn.Module`` and supplies those, ``ln2`` and ``mlp``).  With ``cast_mixer_out`` the
    mixer's output is cast to the residual stream's dtype before the add."""

    cast_mixer_out: bool = False
    hook_mixer_out: HookPoint
    hook_resid_mid: HookPoint
    hook_mlp_out: HookPoint
    hook_resid_post: HookPoint
    ln2: nn.Module
    mlp: nn.Module

    def after_mixer(self, resid: Float[Tensor, "batch pos d_model"],
                    mixer_out: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        """The rest of the block once the mixer has run: residual add, MLP, residual add."""
        out = self.hook_mixer_out(mixer_out)
        resid = self.hook_resid_mid(resid + (out.to(resid.dtype) if self.cast_mixer_out else out))
        return self.hook_resid_post(resid + self.hook_mlp_out(self.mlp(self.ln2(resid))))


def weightless_rms(x: Tensor, eps: float) -> Tensor:
    """FalconMamba's parameter-free RMSNorm on Δ (low rank), B and C."""
    h = x.float()
    return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).type_as(x)


def causal_conv(x: Float[Tensor, "batch pos ch"], weight: Tensor, bias: Tensor | None) -> Float[Tensor, "batch pos ch"]:
    """Depth-wise causal conv over positions; ``weight`` is ``[ch, 1, k]`` (HF ``conv1d.weight``)."""
    L = x.shape[1]
    out = F.conv1d(x.transpose(1, 2).to(weight.dtype), weight, bias, padding=weight.shape[-1] - 1, groups=x.shape[-1])
    return out[..., :L].transpose(1, 2)


@runtime_checkable
class SSMMixer(Protocol):
    """What analyses ask of an SSM layer's mixer, whatever its family: its implied attention, and its output
    with some heads' implied attention masked.  Each family's mixer answers with its own math (the
    Mamba-1 and Mamba-2 modules of implied attention), so no caller branches on the family.  (The idea of
    TransformerLens 4.3's ``SSMMixerProtocol``, for our own hooked mixers.)"""

    cfg: SSMConfig

    def implied_attention(self, dt: Tensor, B: Tensor, C: Tensor, *, heads: list[int], rows: Tensor | None,
                          max_bytes: int, **kwargs: Any) -> Tensor:
        """``[batch, head, query, key]`` from the layer's ``hook_dt/B/C`` (see :mod:`.implied`)."""
        ...

    #: the hooks (``hook_<name>`` of the mixer) whose values :meth:`masked_output` reads, by ``<name>``
    mask_inputs: tuple[str, ...]

    def masked_output(self, y: Tensor, acts: dict[str, Tensor], heads: list[int], masks: Tensor,
                      max_bytes: int) -> Tensor:
        """``hook_y`` with ``heads`` reading through ``masks`` ``[batch, len(heads), query, key]``; ``acts`` holds
        the same forward's :attr:`mask_inputs`."""
        ...


@runtime_checkable
class HasSSMMixers(Protocol):
    """A hooked model whose SSM layers each have a mixer (``HookedSSM`` and the hybrids)."""

    def ssm_mixer(self, layer: int) -> Any:
        """The mixer of SSM layer ``layer`` (an :class:`SSMMixer` for Mamba-style layers)."""
        ...


class _MixerBase(nn.Module):
    cfg: SSMConfig
    A_log: nn.Parameter
    D: nn.Parameter
    #: "auto" (kernel when possible, else chunked), "chunked", "sequential" (exposes hook_state), "kernel"
    scan_impl: str = "auto"
    mask_inputs: tuple[str, ...] = ("x", "dt", "B", "C")

    def A(self) -> Tensor:
        """``-exp(A_log)`` in fp32, detached: Mamba-1 ``[d_inner, d_state]``, Mamba-2 ``[n_heads]``."""
        return -torch.exp(self.A_log.detach().float())

    def _hooks(self) -> None:
        for name in ("conv_in", "conv_out", "gate", "x", "dt", "B", "C", "y", "gated", "head_out", "state"):
            setattr(self, f"hook_{name}", HookPoint())

    def _impl(self, x: Tensor) -> str:
        return fastpath.choose_scan_impl(
            self.scan_impl, device=x.device, state_hooked=_has_fwd_hooks(self.hook_state), family=self.cfg.family
        )


def _has_fwd_hooks(hp: HookPoint) -> bool:
    return bool(hp._forward_hooks) or bool(getattr(hp, "fwd_hooks", None))


class Mamba1Mixer(_MixerBase):
    """S6 mixer of Mamba-1 / FalconMamba (HF ``MambaMixer`` / ``FalconMambaMixer``)."""

    def __init__(self, cfg: SSMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        di, n, r = cfg.d_inner, cfg.d_state, cfg.dt_rank
        self.in_proj = nn.Linear(cfg.d_model, 2 * di, bias=cfg.proj_bias)
        self.conv_weight = nn.Parameter(torch.zeros(di, 1, cfg.d_conv))
        self.conv_bias = nn.Parameter(torch.zeros(di)) if cfg.conv_bias else None
        self.x_proj = nn.Linear(di, r + 2 * n, bias=False)
        self.dt_proj = nn.Linear(r, di, bias=True)
        self.A_log = nn.Parameter(torch.zeros(di, n))
        self.D = nn.Parameter(torch.ones(di))
        self.out_proj = nn.Linear(di, cfg.d_model, bias=cfg.proj_bias)
        self._hooks()

    def forward(self, u: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        cfg = self.cfg
        b, L, _ = u.shape
        x, z = self.in_proj(u).chunk(2, dim=-1)
        x, z = self.hook_conv_in(x), self.hook_gate(z)
        xc = self.hook_conv_out(causal_conv(x, self.conv_weight, self.conv_bias).to(u.dtype))
        x = self.hook_x(F.silu(xc))
        dt_low, B, C = self.x_proj(x).split([cfg.dt_rank, cfg.d_state, cfg.d_state], dim=-1)
        if cfg.mixer_rms_eps is not None:  # FalconMamba
            dt_low, B, C = (weightless_rms(t, cfg.mixer_rms_eps) for t in (dt_low, B, C))
        dt = F.linear(dt_low, self.dt_proj.weight)  # HF adds the bias in fp32 inside the scan
        dt = self.hook_dt(F.softplus(dt.float() + self.dt_proj.bias.float()))
        B, C = self.hook_B(B), self.hook_C(C)
        A = -torch.exp(self.A_log.float())
        impl = self._impl(x)
        xf, Bf, Cf, Df = x.float(), B.float(), C.float(), self.D.float()
        if impl == "sequential":
            _, states = mamba1_scan_ref(xf, dt, A, Bf, Cf, None, return_states=True)
            states = self.hook_state(states)
            y = torch.einsum("bpdn,bpn->bpd", states, Cf) + xf * Df
        elif impl == "kernel":
            y = fastpath.mamba1_kernel_scan(xf, dt, A, Bf, Cf, Df)
        else:
            y = mamba1_scan(xf, dt, A, Bf, Cf, Df)
        y = self.hook_y(y)
        gated = self.hook_gated(y * F.silu(z.float()))
        heads = self.hook_head_out(gated.to(u.dtype).view(b, L, cfg.n_heads, cfg.d_head))
        return self.out_proj(heads.reshape(b, L, cfg.d_inner))

    def implied_attention(self, dt: Tensor, B: Tensor, C: Tensor, *, heads: list[int], rows: Tensor | None,
                          max_bytes: int, **kwargs: Any) -> Tensor:
        from gather_aggregate.adapters.implied_mamba1 import mamba1_implied_attention

        return mamba1_implied_attention(dt, self.A(), B, C, heads=heads, head_size=self.cfg.d_head, rows=rows,
                                        max_bytes=max_bytes, **kwargs)

    def masked_output(self, y: Tensor, acts: dict[str, Tensor], heads: list[int], masks: Tensor,
                      max_bytes: int) -> Tensor:
        from gather_aggregate.adapters.implied_mamba1 import mamba1_masked_output

        x, dt, B, C = (acts[n] for n in self.mask_inputs)
        return mamba1_masked_output(y, x, dt, B, C, self.A().to(dt.device), self.cfg.d_head, heads, masks, max_bytes)


class GatedRMSNorm(nn.Module):
    """Mamba-2's grouped RMSNorm applied after gating (``norm_before_gate=False``)."""

    def __init__(self, d: int, n_groups: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.n_groups, self.eps = n_groups, eps

    def forward(self, gated: Float[Tensor, "batch pos d_inner"]) -> Float[Tensor, "batch pos d_inner"]:
        h = gated.float().unflatten(-1, (self.n_groups, -1))
        h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).flatten(-2)
        return self.weight * h


class Mamba2Mixer(_MixerBase):
    """SSD mixer of Mamba-2 (HF ``Mamba2Mixer``), including ``n_groups > 1``."""

    def __init__(self, cfg: SSMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        di, H = cfg.d_inner, cfg.n_heads
        self.in_proj = nn.Linear(cfg.d_model, di + cfg.conv_dim + H, bias=cfg.proj_bias)
        self.conv_weight = nn.Parameter(torch.zeros(cfg.conv_dim, 1, cfg.d_conv))
        self.conv_bias = nn.Parameter(torch.zeros(cfg.conv_dim)) if cfg.conv_bias else None
        self.dt_bias = nn.Parameter(torch.zeros(H))
        self.A_log = nn.Parameter(torch.zeros(H))
        self.D = nn.Parameter(torch.ones(H))
        eps = cfg.gate_norm_eps if cfg.gate_norm_eps is not None else cfg.norm_eps
        self.norm = GatedRMSNorm(di, cfg.n_groups, eps)
        self.out_proj = nn.Linear(di, cfg.d_model, bias=cfg.proj_bias)
        self._hooks()

    def forward(self, u: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        heads = self.heads(u)
        return self.out_proj(heads.reshape(*heads.shape[:2], self.cfg.d_inner))

    def project_in(self, u: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_proj"]:
        """``z ‖ xBC ‖ dt`` before the conv (a family with input multipliers overrides it)."""
        out: Tensor = self.in_proj(u)
        return out

    def gate_and_norm(self, y: Float[Tensor, "batch pos d_inner"], z: Tensor) -> Float[Tensor, "batch pos d_inner"]:
        """``norm(y ⊙ silu(z))`` (gated RMSNorm after the gate; ``hook_gated`` is ``y ⊙ silu(z)``)."""
        out: Tensor = self.norm(self.hook_gated(y * F.silu(z.float())))
        return out

    def heads(self, u: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos head d_head"]:
        """The per-head outputs (``hook_head_out``, the ``out_proj`` input): the forward without ``out_proj``."""
        cfg = self.cfg
        b, L, _ = u.shape
        G, N, H, P = cfg.n_groups, cfg.d_state, cfg.n_heads, cfg.d_head
        z, xBC, dt_raw = self.project_in(u).split([cfg.d_inner, cfg.conv_dim, H], dim=-1)
        z, xBC = self.hook_gate(z), self.hook_conv_in(xBC)
        xBC = self.hook_conv_out(causal_conv(xBC, self.conv_weight, self.conv_bias).to(u.dtype))
        x, B, C = F.silu(xBC).split([cfg.d_inner, G * N, G * N], dim=-1)
        x = self.hook_x(x)
        B, C = self.hook_B(B.reshape(b, L, G, N)), self.hook_C(C.reshape(b, L, G, N))
        lo, hi = cfg.time_step_limit
        dt = self.hook_dt(torch.clamp(F.softplus(dt_raw.float() + self.dt_bias.float()), lo, hi))
        A = -torch.exp(self.A_log.float())
        xf, Bf, Cf, Df = x.float().view(b, L, H, P), B.float(), C.float(), self.D.float()
        impl = self._impl(x)
        if impl == "sequential":
            _, states = mamba2_scan_ref(xf, dt, A, Bf, Cf, None, return_states=True)
            states = self.hook_state(states)
            Ch = Cf.repeat_interleave(H // G, 2)
            y = torch.einsum("bphdn,bphn->bphd", states, Ch) + xf * Df[:, None]
        elif impl == "kernel":
            y = fastpath.mamba2_kernel_scan(xf, dt, A, Bf, Cf, Df)
        else:
            y = mamba2_scan(xf, dt, A, Bf, Cf, Df)
        y = self.hook_y(y.reshape(b, L, cfg.d_inner))
        heads: Tensor = self.hook_head_out(self.gate_and_norm(y, z).to(u.dtype).view(b, L, H, P))
        return heads

    def implied_attention(self, dt: Tensor, B: Tensor, C: Tensor, *, heads: list[int], rows: Tensor | None,
                          max_bytes: int, **kwargs: Any) -> Tensor:
        from gather_aggregate.adapters.implied_mamba2 import mamba2_implied_attention

        if "reduce" in kwargs:
            raise InputError("reduce= applies to Mamba-1 channel groups; Mamba-2 heads are already scalar-decay heads")
        return mamba2_implied_attention(dt, self.A(), B, C, heads=heads, rows=rows, max_bytes=max_bytes, **kwargs)

    def masked_output(self, y: Tensor, acts: dict[str, Tensor], heads: list[int], masks: Tensor,
                      max_bytes: int) -> Tensor:
        from gather_aggregate.adapters.implied_mamba2 import mamba2_masked_output

        x, dt, B, C = (acts[n] for n in self.mask_inputs)
        return mamba2_masked_output(y, x, dt, B, C, self.A().to(dt.device), self.cfg.d_head, heads, masks, max_bytes)


#: The mixer class of each SSM family (``cfg.family``).
MIXERS: dict[str, type[_MixerBase]] = {"mamba1": Mamba1Mixer, "mamba2": Mamba2Mixer}


def make_mixer(cfg: SSMConfig) -> _MixerBase:
    """The mixer of ``cfg.family`` (a key of :data:`MIXERS`)."""
    if cfg.family not in MIXERS:
        raise InputError(f"unknown SSM family {cfg.family!r}; known: {', '.join(MIXERS)}")
    return MIXERS[cfg.family](cfg)
