"""Hooked discrete Mamba-2 mixer (Llamba's SSM, from phi-mamba / Cartesia), exact to the reference math.

Per layer, with ``H`` value heads of ``P`` channels and ``G`` query/key heads
(``n_qk_heads``; the B/C groups) of state size ``N``::

    xBC, z, a = in_proj(u).split([d_inner + 2GN, d_inner, H])
    x, B, C   = act(conv1d(xBC)).split([d_inner, GN, GN])          # act: identity (default) or silu
    Δ_t[h]    = softplus(a_t[h])                                   # the per-head decay rate
    h_t       = exp(-Δ_t[h]) · h_{t-1} + x_t[h] ⊗ B_t[g(h)]         # no Δ on the input: "discrete"
    y_t[h]    = h_t · C_t[g(h)] + D_h · x_t[h]                     # g(h) = h // (H / G)
    out       = out_proj(y ⊙ silu(z + z_bias))                     # no gated norm (unlike Mamba-2)

The reference feeds this to Mamba-2's SSD kernel as ``x/Δ`` with ``dt = Δ`` and
``A = -1``; so do we (the chunked scan of :mod:`.scan`), which keeps the same
rounding.  **Implied attention** of head ``h`` (``y = α_h @ x_h + D_h x_h``)::

    α_h[t, s] = (C_t · B_s) · exp(-Σ_{k=s+1..t} Δ_k[h])            for s ≤ t

i.e. Mamba-2's formula with ``A_h = -1`` and without the trailing ``Δ_s``
(``mamba2_implied_attention(..., dt_scaling=False)``).

Hooks (``blocks.{L}.ssm.<name>``) as for Mamba-2: ``hook_conv_in`` / ``hook_conv_out`` (x‖B‖C),
``hook_gate`` (``z + z_bias``), ``hook_x`` ``[b, p, d_inner]``, ``hook_dt`` (Δ, ``[b, p, head]``),
``hook_B`` / ``hook_C`` ``[b, p, n_qk_heads, d_state]``, ``hook_y`` (incl. ``D x``), ``hook_gated``,
``hook_head_out`` ``[b, p, head, d_head]`` (the ``out_proj`` input) and ``hook_state`` (sequential mode only).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from gather_aggregate.adapters import fastpath
from gather_aggregate.adapters.config import SSMConfig
from gather_aggregate.adapters.mixers import _MixerBase, causal_conv
from gather_aggregate.adapters.selective_scan import mamba2_scan, mamba2_scan_ref
from gather_aggregate.core.errors import InputError


def discrete_mamba2_ref(x: Tensor, dt: Tensor, B: Tensor, C: Tensor, D: Tensor) -> Tensor:
    """The recurrence above, one step at a time (the oracle): ``x [b, L, H, P]``, ``dt [b, L, H]``,
    ``B, C [b, L, G, N]``, ``D [H]`` -> ``y [b, L, H, P]`` (fp32)."""
    b, L, H, P = x.shape
    rep = H // B.shape[2]
    Bh, Ch = B.repeat_interleave(rep, 2).float(), C.repeat_interleave(rep, 2).float()
    state = x.new_zeros(b, H, P, B.shape[-1], dtype=torch.float32)
    ys = []
    for t in range(L):
        state = torch.exp(-dt[:, t].float())[:, :, None, None] * state + x[:, t].float()[..., None] * Bh[:, t, :, None]
        ys.append(torch.einsum("bhpn,bhn->bhp", state, Ch[:, t]))
    return torch.stack(ys, 1) + x.float() * D.float()[:, None]


class DiscreteMamba2Mixer(_MixerBase):
    """Llamba's mixer (``DiscreteMamba2``): parameters ``in_proj``, ``z_bias`` (when ``proj_bias`` is off),
    ``conv_weight``/``conv_bias``, ``D``, ``out_proj``; ``cfg.n_groups`` is ``n_qk_heads``."""

    def __init__(self, cfg: SSMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        di, H = cfg.d_inner, cfg.n_heads
        self.in_proj = nn.Linear(cfg.d_model, di + cfg.conv_dim + H, bias=cfg.proj_bias)
        self.z_bias = None if cfg.proj_bias else nn.Parameter(torch.zeros(di))
        self.conv_weight = nn.Parameter(torch.zeros(cfg.conv_dim, 1, cfg.d_conv))
        self.conv_bias = nn.Parameter(torch.zeros(cfg.conv_dim)) if cfg.conv_bias else None
        self.D = nn.Parameter(torch.ones(H))
        self.out_proj = nn.Linear(di, cfg.d_model, bias=cfg.proj_bias)
        self.conv_act = str(cfg.extra.get("conv_activation", "identity"))
        self._hooks()

    def forward(self, u: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        cfg = self.cfg
        b, L, _ = u.shape
        G, N, H, P = cfg.n_groups, cfg.d_state, cfg.n_heads, cfg.d_head
        xBC, z, a = self.in_proj(u).split([cfg.conv_dim, cfg.d_inner, H], dim=-1)
        z = self.hook_gate(z if self.z_bias is None else z + self.z_bias)
        xBC = self.hook_conv_out(causal_conv(self.hook_conv_in(xBC), self.conv_weight, self.conv_bias).to(u.dtype))
        if self.conv_act != "identity":
            xBC = F.silu(xBC)
        x, B, C = xBC.split([cfg.d_inner, G * N, G * N], dim=-1)
        x = self.hook_x(x)
        B, C = self.hook_B(B.reshape(b, L, G, N)), self.hook_C(C.reshape(b, L, G, N))
        dt = self.hook_dt(F.softplus(a.float()))
        xf, Bf, Cf = x.float().view(b, L, H, P), B.float(), C.float()
        minus_one = -torch.ones(H, device=u.device)
        impl = self._impl(x)
        if impl == "sequential":
            _, states = mamba2_scan_ref(xf / dt[..., None], dt, minus_one, Bf, Cf, None, return_states=True)
            states = self.hook_state(states)
            y = torch.einsum("bphdn,bphn->bphd", states, Cf.repeat_interleave(H // G, 2))
        elif impl == "kernel":
            y = fastpath.mamba2_kernel_scan(xf / dt[..., None], dt, minus_one, Bf, Cf, torch.zeros_like(minus_one))
        else:
            y = mamba2_scan(xf / dt[..., None], dt, minus_one, Bf, Cf, None)
        y = self.hook_y((y + xf * self.D.float()[:, None]).reshape(b, L, cfg.d_inner))
        gated = self.hook_gated(y * F.silu(z.float()))
        heads = self.hook_head_out(gated.to(u.dtype).view(b, L, H, P))
        return self.out_proj(heads.reshape(b, L, cfg.d_inner))

    def A(self) -> Tensor:
        """The decay rate per head, ``-1`` (the decay is ``exp(-Δ)``)."""
        return -torch.ones(self.cfg.n_heads, device=self.D.device)

    def implied_attention(self, dt: Tensor, B: Tensor, C: Tensor, *, heads: list[int], rows: Tensor | None,
                          max_bytes: int, **kwargs: Any) -> Tensor:
        """``α_h[t, s] = (C_t · B_s) exp(-Σ_{k=s+1..t} Δ_k[h])``: Mamba-2's formula with ``A = -1`` and no ``Δ_s``."""
        from gather_aggregate.adapters.implied_mamba2 import mamba2_implied_attention

        for bad in ("reduce", "dt_scaling"):
            if bad in kwargs:
                raise InputError(f"{bad}= does not apply to Llamba: its heads are scalar-decay heads whose input "
                                 "is not scaled by Δ (α reconstructs y = α @ x + D x as it is)")
        return mamba2_implied_attention(dt, self.A().to(dt.device), B, C, heads=heads, rows=rows,
                                        max_bytes=max_bytes, dt_scaling=False, **kwargs)

    def masked_output(self, y: Tensor, acts: dict[str, Tensor], heads: list[int], masks: Tensor,
                      max_bytes: int) -> Tensor:
        from gather_aggregate.adapters.implied_mamba2 import mamba2_masked_output

        x, dt, B, C = (acts[n] for n in self.mask_inputs)
        return mamba2_masked_output(y, x, dt, B, C, self.A().to(dt.device), self.cfg.d_head, heads, masks,
                                    max_bytes, dt_scaling=False)


__all__ = ["DiscreteMamba2Mixer", "discrete_mamba2_ref"]
