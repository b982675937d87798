"""Selective scans of Mamba-1 (S6) and Mamba-2 (SSD): fast chunked versions and sequential references.

Everything here is a pure function on fp32 tensors; the mixers cast around it.

Mamba-1, per channel ``d`` and state ``n`` (``A[d, n] < 0``)::

    h_t[d, n] = exp(Δ_t[d] A[d, n]) h_{t-1}[d, n] + Δ_t[d] B_t[n] x_t[d]
    y_t[d]    = Σ_n C_t[n] h_t[d, n] + D[d] x_t[d]

Mamba-2, per head ``h`` (scalar ``A_h < 0``; ``B, C`` shared by the heads of a group)::

    H_t[h] = exp(Δ_t[h] A_h) H_{t-1}[h] + Δ_t[h] x_t[h] ⊗ B_t[g(h)]        # [P, N]
    y_t[h] = H_t[h] C_t[g(h)] + D_h x_t[h]

The ``*_ref`` functions are the literal recurrences (a Python loop over time)
and serve as test oracles and as the ``scan_impl="sequential"`` mode, the only
one that exposes the state.  The default chunked scans loop over chunks, never
over time steps.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

#: Largest within-chunk log-decay span |Σ Δ·A| for which the Mamba-1 chunk uses the
#: rescaled-cumsum form; e^60 ≈ 1e26 leaves fp32 head-room for the rescaled inputs.
MAX_LOG_SPAN = 60.0
#: The same bound when gradients flow through the scan: the backward of ``writes / e^{S}`` divides by the decay
#: twice (``e^{2·span}``), so e^60 would overflow fp32 (max ≈ e^88) and train to NaN; e^30 keeps e^60 there.
MAX_LOG_SPAN_GRAD = 30.0


# ----------------------------------------------------------------------------- Mamba-1
def mamba1_scan_ref(
    x: Float[Tensor, "batch pos d_inner"],
    dt: Float[Tensor, "batch pos d_inner"],
    A: Float[Tensor, "d_inner d_state"],
    B: Float[Tensor, "batch pos d_state"],
    C: Float[Tensor, "batch pos d_state"],
    D: Float[Tensor, " d_inner"] | None = None,
    *,
    return_states: bool = False,
) -> tuple[Float[Tensor, "batch pos d_inner"], Float[Tensor, "batch pos d_inner d_state"] | None]:
    """The S6 recurrence, one time step at a time (the oracle)."""
    b, L, d_inner = x.shape
    h = x.new_zeros(b, d_inner, A.shape[1])
    ys, states = [], []
    for t in range(L):
        h = torch.exp(dt[:, t, :, None] * A) * h + (dt[:, t] * x[:, t])[:, :, None] * B[:, t, None, :]
        ys.append(torch.einsum("bdn,bn->bd", h, C[:, t]))
        if return_states:
            states.append(h)
    y = torch.stack(ys, 1)
    if D is not None:
        y = y + x * D
    return y, (torch.stack(states, 1) if return_states else None)


def _mamba1_chunk_doubling(
    dt: Tensor, x: Tensor, A: Tensor, B: Tensor, h0: Tensor
) -> Float[Tensor, "batch chunk d_inner d_state"]:
    """States of one chunk by a log-depth (Hillis-Steele) scan; stable for any Δ·A.

    Combines ``(a_l, u_l) ∘ (a_r, u_r) = (a_r a_l, a_r u_l + u_r)``; decays are
    products of factors in (0, 1], so nothing can overflow.
    """
    a = torch.exp(dt[..., None] * A)
    u = (dt * x)[..., None] * B[:, :, None, :]
    u = torch.cat([u[:, :1] + a[:, :1] * h0[:, None], u[:, 1:]], 1)
    T, k = u.shape[1], 1
    while k < T:
        u = torch.cat([u[:, :k], u[:, k:] + a[:, k:] * u[:, :-k]], 1)
        a = torch.cat([a[:, :k], a[:, k:] * a[:, :-k]], 1)
        k *= 2
    return u


def mamba1_scan(
    x: Float[Tensor, "batch pos d_inner"],
    dt: Float[Tensor, "batch pos d_inner"],
    A: Float[Tensor, "d_inner d_state"],
    B: Float[Tensor, "batch pos d_state"],
    C: Float[Tensor, "batch pos d_state"],
    D: Float[Tensor, " d_inner"] | None = None,
    *,
    chunk: int = 16,
    max_log_span: float | None = None,
) -> Float[Tensor, "batch pos d_inner"]:
    """Chunked S6 scan: a loop over chunks of ``chunk`` steps, each done in parallel.

    Inside a chunk, with ``τ_t = Σ_{k≤t} Δ_k`` counted from the chunk start and
    ``S_t = τ_t A ≤ 0`` (``A`` is constant in time, so the log-decay is a
    per-channel cumulative sum times ``A``)::

        h_t = e^{S_t} ( h_start + Σ_{s≤t} e^{-S_s} Δ_s B_s x_s )

    Every product ``e^{S_t} e^{-S_s} = e^{S_t - S_s}`` is a decay in (0, 1].
    The form is used only when the chunk's largest log-decay span is at most
    ``max_log_span`` (so ``e^{-S_s}`` cannot overflow) and the result is
    finite; otherwise that chunk falls back to a log-depth doubling scan, which
    is stable for any Δ·A.  Both are exact up to fp32 rounding.  Both are
    differentiable; when a gradient will flow (``max_log_span=None`` and an input
    requires grad) the bound is :data:`MAX_LOG_SPAN_GRAD`, so the backward stays finite too.
    """
    if max_log_span is None:
        grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, dt, A, B, C, D))
        max_log_span = MAX_LOG_SPAN_GRAD if grad else MAX_LOG_SPAN
    b, L, d_inner = x.shape
    h = x.new_zeros(b, d_inner, A.shape[1])
    a_max = A.abs().amax(-1)
    ys = []
    for c0 in range(0, L, chunk):
        d, xs, Bs, Cs = dt[:, c0:c0 + chunk], x[:, c0:c0 + chunk], B[:, c0:c0 + chunk], C[:, c0:c0 + chunk]
        tau = torch.cumsum(d, 1)  # [b, T, d_inner]
        hs = None
        if float((tau[:, -1] * a_max).max().detach()) <= max_log_span:
            decay = torch.exp(tau[..., None] * A)  # e^{S_t}: [b, T, d_inner, d_state]
            writes = ((d * xs)[..., None] * Bs[:, :, None, :]) / decay
            hs = decay * (torch.cumsum(writes, 1) + h[:, None])
            if not bool(torch.isfinite(hs[:, -1]).all()):
                hs = None
        if hs is None:
            hs = _mamba1_chunk_doubling(d, xs, A, Bs, h)
        ys.append(torch.matmul(hs, Cs[..., None])[..., 0])
        h = hs[:, -1]
    y = torch.cat(ys, 1)
    if D is not None:
        y = y + x * D
    return y


# ----------------------------------------------------------------------------- Mamba-2
def mamba2_scan_ref(
    x: Float[Tensor, "batch pos head d_head"],
    dt: Float[Tensor, "batch pos head"],
    A: Float[Tensor, " head"],
    B: Float[Tensor, "batch pos group d_state"],
    C: Float[Tensor, "batch pos group d_state"],
    D: Float[Tensor, " head"] | None = None,
    *,
    return_states: bool = False,
) -> tuple[Float[Tensor, "batch pos head d_head"], Float[Tensor, "batch pos head d_head d_state"] | None]:
    """The SSD recurrence, one time step at a time (the oracle)."""
    b, L, H, P = x.shape
    rep = H // B.shape[2]
    Bh, Ch = B.repeat_interleave(rep, 2), C.repeat_interleave(rep, 2)  # [b, L, H, N]
    state = x.new_zeros(b, H, P, B.shape[-1])
    ys, states = [], []
    for t in range(L):
        decay = torch.exp(dt[:, t] * A)[:, :, None, None]
        state = decay * state + (dt[:, t, :, None] * x[:, t])[..., None] * Bh[:, t, :, None, :]
        ys.append(torch.einsum("bhpn,bhn->bhp", state, Ch[:, t]))
        if return_states:
            states.append(state)
    y = torch.stack(ys, 1)
    if D is not None:
        y = y + x * D[:, None]
    return y, (torch.stack(states, 1) if return_states else None)


def segsum(a: Float[Tensor, "... T"]) -> Float[Tensor, "... T T"]:
    """``out[..., t, s] = Σ_{k=s+1..t} a[k]`` for ``s ≤ t`` and ``-inf`` above the diagonal.

    Computed from one cumulative sum in float64 (differences of fp32 prefix
    sums would lose precision on long sequences); ``exp(segsum(ΔA))`` is the
    causal decay matrix.
    """
    cs = torch.cumsum(a.double(), -1)
    out = (cs[..., :, None] - cs[..., None, :]).to(a.dtype)
    T = a.shape[-1]
    causal = torch.ones(T, T, dtype=torch.bool, device=a.device).tril()
    return out.masked_fill(~causal, float("-inf"))


def mamba2_scan(
    x: Float[Tensor, "batch pos head d_head"],
    dt: Float[Tensor, "batch pos head"],
    A: Float[Tensor, " head"],
    B: Float[Tensor, "batch pos group d_state"],
    C: Float[Tensor, "batch pos group d_state"],
    D: Float[Tensor, " head"] | None = None,
    *,
    chunk: int = 64,
) -> Float[Tensor, "batch pos head d_head"]:
    """Chunked SSD scan (the state-space dual form), grouped so B/C are never repeated per head.

    With ``c`` chunks of ``T`` steps, ``a = ΔA`` and ``Λ = exp(segsum(a))``:

    1. intra-chunk:  ``Y_diag[t] = Σ_{s≤t} (C_t·B_s) Λ[t, s] Δ_s x_s``  (a masked attention)
    2. chunk states: ``S_c = Σ_s exp(a_{s+1..T}) Δ_s x_s ⊗ B_s``
    3. inter-chunk:  ``H_c = exp(Σ_chunk a) H_{c-1} + S_c`` (a loop over chunks)
    4. off-diagonal: ``Y_off[t] = exp(a_{1..t}) C_t · H_{c-1}``
    """
    b, L, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    R = H // G
    T = min(chunk, L)
    pad = (-L) % T
    if pad:  # Δ = 0 on the padding: no input and no decay, so real positions are untouched
        x, dt = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, pad)), torch.nn.functional.pad(dt, (0, 0, 0, pad))
        B, C = (torch.nn.functional.pad(t, (0, 0, 0, 0, 0, pad)) for t in (B, C))
    c = (L + pad) // T
    # [b, c, g, r, T, ...] layout: heads split into (group, head-in-group)
    xdt = (x * dt[..., None]).view(b, c, T, G, R, P).permute(0, 1, 3, 4, 2, 5)  # b c g r T P
    Bc = B.view(b, c, T, G, N).permute(0, 1, 3, 2, 4)  # b c g T N
    Cc = C.view(b, c, T, G, N).permute(0, 1, 3, 2, 4)
    a = (dt * A).view(b, c, T, G, R).permute(0, 1, 3, 4, 2)  # b c g r T
    a_cum = torch.cumsum(a.double(), -1)
    a_cum32 = a_cum.to(x.dtype)

    # 1. intra-chunk (diagonal blocks)
    decay = torch.exp(segsum(a))  # b c g r T T
    CB = torch.matmul(Cc, Bc.transpose(-1, -2))  # b c g T T
    y = torch.matmul(CB[:, :, :, None] * decay, xdt)  # b c g r T P

    # 2. state contributed by each chunk (decay from s to the chunk end)
    to_end = torch.exp((a_cum[..., -1:] - a_cum).to(x.dtype))  # b c g r T
    chunk_states = torch.matmul((xdt * to_end[..., None]).transpose(-1, -2), Bc[:, :, :, None])  # b c g r P N

    # 3. inter-chunk recurrence on [b, g, r, P, N] states (a loop over chunks, not time)
    chunk_decay = torch.exp(a_cum32[..., -1])  # b c g r
    h = x.new_zeros(b, G, R, P, N)
    starts = []
    for k in range(c):
        starts.append(h)
        h = chunk_decay[:, k, ..., None, None] * h + chunk_states[:, k]
    h_start = torch.stack(starts, 1)  # b c g r P N

    # 4. contribution of the state entering the chunk
    y = y + torch.matmul(Cc[:, :, :, None], h_start.transpose(-1, -2)) * torch.exp(a_cum32)[..., None]

    y = y.permute(0, 1, 4, 2, 3, 5).reshape(b, c * T, H, P)[:, :L]
    if D is not None:
        y = y + x[:, :L] * D[:, None]
    return y
