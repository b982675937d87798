"""Mamba-2 implied attention, head ``h`` (one scalar decay per head, ``B, C`` of the head's group)::

    α_h[t, s] = (C_t · B_s) · exp(Σ_{k=s+1..t} Δ_k[h] A_h) · Δ_s[h]                   (s ≤ t)

:func:`mamba2_implied_reference` is the formula itself (the oracle);
:func:`mamba2_implied_attention` is the fast path, by head chunks under a
memory budget, and :func:`mamba2_masked_output` the layer output with some
heads' implied attention masked (the masking experiment).  Conventions are in
:mod:`gather_aggregate.adapters.implied`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from gather_aggregate.adapters.implied_common import (
    DEFAULT_MAX_BYTES,
    _budget_error,
    _check_inputs,
    _gib,
    _head_list,
    _segsum,
)


# ============================================================================ reference (oracle)
def mamba2_implied_reference(
    dt: Float[Tensor, "batch pos head"],
    A: Float[Tensor, " head"],
    B: Float[Tensor, "batch pos group d_state"],
    C: Float[Tensor, "batch pos group d_state"],
    dt_scaling: bool = True,
) -> Float[Tensor, "batch head query key"]:
    """Per-head α, straight from the formula."""
    H, G = dt.shape[-1], B.shape[2]
    seg = _segsum((dt.double() * A.double()).transpose(1, 2))  # [b, h, t, s]
    CB = torch.einsum("btgn,bsgn->bgts", C.double(), B.double()).repeat_interleave(H // G, 1)
    alpha = CB * torch.exp(seg)
    if dt_scaling:
        alpha = alpha * dt.double().transpose(1, 2)[:, :, None, :]
    return alpha.to(dt.dtype)


# ============================================================================ fast path
def mamba2_implied_bytes(batch: int, L: int, n_heads: int, n_groups: int, n_rows: int | None,
                         head_chunk: int = 1) -> tuple[int, int]:
    """(output bytes, working bytes for ``head_chunk`` heads at a time) of :func:`mamba2_implied_attention`."""
    Q = L if n_rows is None else n_rows
    out = 4 * batch * n_heads * Q * L
    work = 4 * batch * n_groups * Q * L + 16 * batch * head_chunk * Q * L
    return out, work


def mamba2_implied_attention(
    dt: Float[Tensor, "batch pos head"],
    A: Float[Tensor, " head"],
    B: Float[Tensor, "batch pos group d_state"],
    C: Float[Tensor, "batch pos group d_state"],
    *,
    heads: int | Sequence[int] | None = None,
    rows: Int[Tensor, "batch n_rows"] | None = None,
    dt_scaling: bool = True,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> Float[Tensor, "batch head query key"]:
    """Implied attention of Mamba-2 heads: ``α_h = (C Bᵀ) ∘ exp(segsum(Δ_h A_h)) · Δ_s``.

    ``rows`` (``[batch, n_rows]`` query positions) restricts the query axis;
    the result is then ``[batch, head, n_rows, key]``.  Cost O(heads · rows · L).
    """
    _check_inputs(dt, B, C, rows)
    b, L, H = dt.shape
    G = B.shape[2]
    hs = _head_list(heads, H)
    Q = L if rows is None else rows.shape[1]
    out_b, work1 = mamba2_implied_bytes(b, L, len(hs), G, None if rows is None else Q)
    if out_b + work1 > max_bytes:
        opts = [f"rows=[-1] (the final query: {_gib(sum(mamba2_implied_bytes(b, L, len(hs), G, 1)))})",
                f"one head, heads=[{hs[0]}] ({_gib(sum(mamba2_implied_bytes(b, L, 1, G, None if rows is None else Q)))})",
                f"a shorter prompt (L={L // 2}: {_gib(sum(mamba2_implied_bytes(b, L // 2, len(hs), G, None if rows is None else min(Q, L // 2))))})"]
        raise _budget_error(f"Mamba-2 implied attention ({b} x {len(hs)} heads x {Q} x {L})", out_b + work1,
                            max_bytes, opts)
    per_head = (mamba2_implied_bytes(b, L, 1, G, None if rows is None else Q, 2)[1]
                - mamba2_implied_bytes(b, L, 1, G, None if rows is None else Q, 1)[1])
    chunk = max(1, min(len(hs), int((max_bytes - out_b - 4 * b * G * Q * L) // max(per_head, 1))))

    cum = torch.cumsum(dt.double() * A.double(), 1)  # [b, L, H]: Σ_{k≤t} Δ_k A_h
    Cq = C if rows is None else C.gather(1, rows[:, :, None, None].expand(-1, -1, G, C.shape[-1]))
    # float32 products (bf16 hooks are upcast first, exactly, as the scan does): no bf16 rounding of C·B
    CB = torch.einsum("bqgn,bsgn->bgqs", Cq.float(), B.float())  # [b, G, Q, L]
    tq = torch.arange(L, device=dt.device)[None, :].expand(b, L) if rows is None else rows  # [b, Q]
    causal = tq[:, :, None] >= torch.arange(L, device=dt.device)[None, None, :]  # [b, Q, L]
    out = dt.new_zeros(b, len(hs), Q, L, dtype=torch.float32)
    idx = torch.tensor(hs, device=dt.device)
    for i in range(0, len(hs), chunk):
        h = idx[i:i + chunk]
        cq = cum[:, :, h].gather(1, tq[:, :, None].expand(-1, -1, len(h)))  # [b, Q, hc]
        seg = (cq[:, :, None, :] - cum[:, None, :, h])  # [b, Q, L, hc] float64
        seg = seg.masked_fill(~causal[..., None], float("-inf")).permute(0, 3, 1, 2)
        a = torch.exp(seg.float()) * CB[:, h // (H // G)]
        if dt_scaling:
            a = a * dt[:, :, h].float().permute(0, 2, 1)[:, :, None, :]
        out[:, i:i + len(h)] = a
    return out


def mamba2_masked_output(y: Tensor, x: Tensor, dt: Tensor, B: Tensor, C: Tensor, A: Tensor, d_head: int,
                         heads: list[int], masks: Float[Tensor, "batch n_heads query key"],
                         max_bytes: int, dt_scaling: bool = True) -> Float[Tensor, "batch pos d_inner"]:
    """``y`` with Mamba-2 heads ``heads`` replaced by ``(α_h ⊙ M_h) @ x_h + D_h ∘ x_h``.

    Computed as ``y_h - (α_h ⊙ (1 - M_h)) @ x_h``: the same quantity (because
    ``y_h = α_h @ x_h + D_h ∘ x_h``), but an all-ones mask returns ``y``
    bit for bit and the kept part keeps the scan's exact value.
    """
    b, L, _ = y.shape
    out = y.clone()
    removed = 1.0 - masks
    n_heads = A.shape[0]
    alpha = mamba2_implied_attention(dt, A, B, C, heads=heads, max_bytes=max_bytes, dt_scaling=dt_scaling)
    xh = x.float().view(b, L, n_heads, d_head)[:, :, heads]  # [b, L, k, P]
    cut = torch.einsum("bkts,bskp->btkp", alpha * removed, xh)
    for j, h in enumerate(heads):
        out[:, :, h * d_head:(h + 1) * d_head] = out[:, :, h * d_head:(h + 1) * d_head] - cut[:, :, j].to(out.dtype)
    return out
