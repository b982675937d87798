"""SSM-implied attention: the matrix α with ``y = α @ x + D ∘ x`` for Mamba-1 and Mamba-2 layers.

Inputs are the hooked tensors of one layer (``hook_dt``, ``hook_B``, ``hook_C``)
and its ``A = -exp(A_log)``; outputs are ``[batch, head, query, key]``, raw and
signed (causal: zero above the diagonal).  ``model.pattern(..., normalize=True)``
gives the per-row normalised ``|α|`` that sharpness metrics use.

Mamba-2, head ``h`` (one scalar decay per head, ``B, C`` of the head's group)::

    α_h[t, s] = (C_t · B_s) · exp(Σ_{k=s+1..t} Δ_k[h] A_h) · Δ_s[h]                   (s ≤ t)

Mamba-1, channel ``d`` (the decay depends on the state index ``n``)::

    α_d[t, s] = Σ_n C_t[n] B_s[n] exp(A[d, n] (τ_t[d] - τ_s[d])) · Δ_s[d],   τ_t = Σ_{k≤t} Δ_k

``dt_scaling=False`` drops the trailing ``Δ_s`` (the "attention-like" form of
Ali et al.; then ``y = α @ (Δ ∘ x) + D ∘ x``).  With the default
``dt_scaling=True`` the matrix reconstructs ``y`` from the post-conv ``x``.

Decays are always ``exp`` of log-space differences of a float64 cumulative sum
(segsum), never ratios of exponentials, so they stay finite and accurate for
long prompts and large Δ·A.  The fast Mamba-1 path splits ``t ← s`` at block
boundaries: ``exp(A(τ_t-τ_s)) = exp(A(τ_t-τ_r)) · exp(A(τ_r-τ_e)) · exp(A(τ_e-τ_s))``
for block ends ``s ≤ e ≤ r ≤ t``; each factor is itself a decay in (0, 1], and
the sum over ``n`` becomes a batched matmul.

Memory: every entry point estimates its bytes *before* allocating and raises
:class:`~gather_aggregate.errors.MemoryBudgetError` past ``max_bytes``, naming
cheaper requests (fewer rows, fewer heads, coarser channel groups, a shorter
prompt).  Mamba-1 channels are processed in chunks and reduced into their heads
on the fly, so memory is O(L² · heads), not O(L² · d_inner · d_state).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
from jaxtyping import Float, Int
from torch import Tensor

from gather_aggregate.errors import IndexOutOfRangeError, InputError, MemoryBudgetError

Reduce = Literal["mean", "abs_mean", "sum"]
DEFAULT_MAX_BYTES = 2 * 1024**3
_GiB = 1024**3


# ============================================================================ references (oracles)
def mamba1_implied_reference(
    dt: Float[Tensor, "batch pos d_inner"],
    A: Float[Tensor, "d_inner d_state"],
    B: Float[Tensor, "batch pos d_state"],
    C: Float[Tensor, "batch pos d_state"],
    dt_scaling: bool = True,
) -> Float[Tensor, "batch d_inner query key"]:
    """Per-channel α, straight from the formula: O(batch · d_inner · d_state · L²) memory."""
    neg_seg = _segsum(-dt.double().transpose(1, 2))  # [b, d, t, s]: -Σ_{k=s+1..t} Δ_k (-inf if s > t)
    decay = torch.exp(-A.double()[None, :, :, None, None] * neg_seg[:, :, None])  # [b, d, n, t, s]
    alpha = torch.einsum("btn,bsn,bdnts->bdts", C.double(), B.double(), decay)
    if dt_scaling:
        alpha = alpha * dt.double().transpose(1, 2)[:, :, None, :]
    return alpha.to(dt.dtype)


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


def _segsum(a: Tensor) -> Tensor:
    """``[..., t, s] = Σ_{k=s+1..t} a[k]`` for ``s ≤ t``, ``-inf`` above the diagonal (float64 cumsum)."""
    cs = torch.cumsum(a.double(), -1)
    out = cs[..., :, None] - cs[..., None, :]
    L = a.shape[-1]
    return out.masked_fill(~torch.ones(L, L, dtype=torch.bool, device=a.device).tril(), float("-inf"))


# ============================================================================ helpers
def _check_inputs(dt: Tensor, B: Tensor, C: Tensor, rows: Tensor | None) -> None:
    if dt.dim() != 3 or B.shape[:2] != dt.shape[:2] or C.shape != B.shape:
        raise InputError(
            f"dt/B/C must share [batch, pos]: got dt {tuple(dt.shape)}, B {tuple(B.shape)}, C {tuple(C.shape)}"
        )
    if rows is not None:
        if rows.dim() != 2 or rows.shape[0] != dt.shape[0]:
            raise InputError(f"rows must be [batch={dt.shape[0]}, n_rows], got {tuple(rows.shape)}")
        L = dt.shape[1]
        if bool(((rows < 0) | (rows >= L)).any()):
            raise IndexOutOfRangeError(
                f"query row(s) {sorted(set(rows[(rows < 0) | (rows >= L)].tolist()))} out of range for "
                f"a prompt of {L} tokens (0..{L - 1})"
            )


def _head_list(heads: int | Sequence[int] | None, n_heads: int) -> list[int]:
    if heads is None:
        return list(range(n_heads))
    hs = [heads] if isinstance(heads, int) else [int(h) for h in heads]
    if not hs:
        raise InputError("heads is empty; pass heads=None for all heads")
    bad = [h for h in hs if not 0 <= h < n_heads]
    if bad:
        raise IndexOutOfRangeError(f"head(s) {bad} out of range: this layer has {n_heads} heads (0..{n_heads - 1})")
    return hs


def _gib(n: float) -> str:
    return f"{n / _GiB:.3g} GiB"


def _budget_error(what: str, need: float, budget: int, options: list[str]) -> MemoryBudgetError:
    return MemoryBudgetError(
        f"{what} needs about {_gib(need)}, over the budget of {_gib(budget)} (max_bytes={budget}). "
        f"Ask for less: {'; '.join(options)}; or raise max_bytes (model.max_pattern_bytes) if you have the RAM."
    )


def _block_size(L: int) -> int:
    """Block length of the Mamba-1 split: ~sqrt(L) balances the diagonal blocks against the off-diagonal ones."""
    return int(min(64, max(8, 2 ** round(math.log2(max(L, 1)) / 2))))


# ============================================================================ Mamba-2
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
    CB = torch.einsum("bqgn,bsgn->bgqs", Cq, B).float()  # [b, G, Q, L]
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


# ============================================================================ Mamba-1
def mamba1_implied_bytes(batch: int, L: int, n_out_heads: int, d_state: int, n_rows: int | None,
                         channel_chunk: int = 1, block: int | None = None) -> tuple[int, int]:
    """(output bytes, working bytes for ``channel_chunk`` channels at a time) of :func:`mamba1_implied_attention`."""
    Q = L if n_rows is None else n_rows
    out = 4 * batch * n_out_heads * Q * L
    c = channel_chunk
    if n_rows is None:
        T = block or _block_size(L)
        work = 4 * batch * c * (Q * L + 4 * L * d_state + T * L + T * T * d_state) + 8 * batch * c * T * T
    else:
        work = 4 * batch * c * Q * L * (3 * d_state + 3) + 8 * batch * c * Q * L
    return out, work


def mamba1_implied_attention(
    dt: Float[Tensor, "batch pos d_inner"],
    A: Float[Tensor, "d_inner d_state"],
    B: Float[Tensor, "batch pos d_state"],
    C: Float[Tensor, "batch pos d_state"],
    *,
    heads: int | Sequence[int] | None = None,
    head_size: int = 1,
    reduce: Reduce = "mean",
    rows: Int[Tensor, "batch n_rows"] | None = None,
    dt_scaling: bool = True,
    max_bytes: int = DEFAULT_MAX_BYTES,
    block: int | None = None,
) -> Float[Tensor, "batch head query key"]:
    """Implied attention of Mamba-1 heads (``head_size`` channels each; 1 = per channel).

    Args:
        heads: head indices (head ``h`` = channels ``h*head_size .. (h+1)*head_size-1``); default all.
        head_size: channels per head; a head's matrix is the ``reduce`` of its channels' matrices:
            ``"mean"`` (default), ``"abs_mean"`` (mean of ``|α_d|``, no cancellation) or ``"sum"``.
        rows: ``[batch, n_rows]`` query positions (e.g. each prompt's final token for Aggregate
            heads, segment summary tokens for Gather heads): cost O(rows · L · d_inner · d_state).
        dt_scaling: include the ``Δ_s`` factor (default; reconstructs ``y`` from the post-conv x).
        max_bytes: memory budget; raises :class:`MemoryBudgetError` (naming cheaper requests) past it.
        block: block length of the full-matrix path (default ~sqrt(L), 8..64).
    """
    _check_inputs(dt, B, C, rows)
    b, L, D = dt.shape
    N = A.shape[1]
    if isinstance(head_size, bool) or not isinstance(head_size, int) or head_size < 1 or D % head_size:
        raise InputError(f"head_size must be a positive divisor of d_inner={D}, got {head_size!r}")
    if reduce not in ("mean", "abs_mean", "sum"):
        raise InputError(f"reduce must be 'mean', 'abs_mean' or 'sum', got {reduce!r}")
    hs = _head_list(heads, D // head_size)
    n_rows = None if rows is None else rows.shape[1]
    Q = L if rows is None else n_rows
    T = block or _block_size(L)
    out_b, work1 = mamba1_implied_bytes(b, L, len(hs), N, n_rows, 1, T)
    if out_b + work1 > max_bytes:
        coarse = min((g for g in (64, 128, 256, 512, D) if D % g == 0 and g > head_size), default=D)
        opts = [f"rows=[-1] (the final query: {_gib(sum(mamba1_implied_bytes(b, L, len(hs), N, 1, 1, T)))})",
                f"fewer heads, e.g. heads=[{hs[0]}] ({_gib(sum(mamba1_implied_bytes(b, L, 1, N, n_rows, 1, T)))})",
                f"coarser channel groups, head_size={coarse} with reduce='mean' "
                f"({_gib(sum(mamba1_implied_bytes(b, L, max(1, len(hs) * head_size // coarse), N, n_rows, 1, T)))})",
                f"a shorter prompt (L={L // 2}: "
                f"{_gib(sum(mamba1_implied_bytes(b, L // 2, len(hs), N, None if rows is None else min(Q, L // 2), 1, T)))})"]
        raise _budget_error(f"Mamba-1 implied attention ({b} x {len(hs)} heads x {Q} x {L})", out_b + work1,
                            max_bytes, opts)
    per_channel = work1 - mamba1_implied_bytes(b, L, len(hs), N, n_rows, 0, T)[1]
    chunk = max(1, int((max_bytes - out_b) // max(per_channel, 1)))

    channels = torch.tensor([h * head_size + j for h in hs for j in range(head_size)], device=dt.device)
    slot = torch.arange(len(hs), device=dt.device).repeat_interleave(head_size)  # output head of each channel
    tau = torch.cumsum(dt.double(), 1)  # [b, L, D]: τ_t = Σ_{k≤t} Δ_k
    out = torch.zeros(b, len(hs), Q, L, dtype=torch.float32, device=dt.device)
    Af, Bf, Cf = A.float(), B.float(), C.float()
    for i in range(0, len(channels), chunk):
        ch = channels[i:i + chunk]
        if rows is None:
            alpha = _mamba1_full(tau[:, :, ch], dt[:, :, ch].float(), Af[ch], Bf, Cf, T, dt_scaling)
        else:
            alpha = _mamba1_rows(tau[:, :, ch], dt[:, :, ch].float(), Af[ch], Bf, Cf, rows, dt_scaling)
        if head_size == 1:
            out[:, i:i + len(ch)] = alpha
        else:
            out.index_add_(1, slot[i:i + len(ch)], alpha.abs() if reduce == "abs_mean" else alpha)
    if head_size > 1 and reduce != "sum":
        out /= head_size
    return out


def _mamba1_rows(tau: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, rows: Tensor,
                 dt_scaling: bool) -> Float[Tensor, "batch channel n_rows key"]:
    """α_d[t, s] for the query rows only: ``Σ_n C_t B_s exp(A (τ_t - τ_s))`` for s ≤ t."""
    b, L, c = tau.shape
    N = A.shape[1]
    tq = tau.gather(1, rows[:, :, None].expand(-1, -1, c))  # [b, R, c]
    gap = tq[:, :, None, :] - tau[:, None, :, :]  # [b, R, L, c] ≥ 0 where causal
    causal = rows[:, :, None] >= torch.arange(L, device=tau.device)[None, None, :]  # [b, R, L]
    gap = gap.clamp_min(0).float()
    Cq = C.gather(1, rows[:, :, None].expand(-1, -1, N))  # [b, R, N]
    cb = Cq[:, :, None, :] * B[:, None, :, :]  # [b, R, L, N]
    decay = torch.exp(gap[..., None] * A)  # [b, R, L, c, N]
    alpha = torch.matmul(decay, cb[..., None])[..., 0]  # [b, R, L, c]
    alpha = alpha * causal[..., None]
    if dt_scaling:
        alpha = alpha * dt[:, None, :, :]
    return alpha.permute(0, 3, 1, 2)


def _mamba1_full(tau: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, T: int,
                 dt_scaling: bool) -> Float[Tensor, "batch channel query key"]:
    """All rows of α_d for a chunk of channels, by the block split described in the module docstring."""
    b, L, c = tau.shape
    N = A.shape[1]
    nb = -(-L // T)
    pad = nb * T - L
    if pad:  # padded keys/queries get Δ = 0, B = C = 0: they contribute nothing and are cut at the end
        tau = torch.cat([tau, tau[:, -1:].expand(-1, pad, -1)], 1)
        dt, B, C = (torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in (dt, B, C))
    tb = tau.view(b, nb, T, c)
    ends = tb[:, :, -1]  # τ at each block end: [b, nb, c]
    starts = torch.cat([torch.zeros_like(ends[:, :1]), ends[:, :-1]], 1)  # τ just before each block
    w = (dt if dt_scaling else torch.ones_like(dt)).view(b, nb, T, c)
    Bb, Cb = B.view(b, nb, T, N), C.view(b, nb, T, N)
    # key factor: B_s Δ_s · decay from s to its block end;  query factor: C_t · decay from block start to t
    key = Bb[:, :, :, None, :] * w[..., None] * torch.exp((ends[:, :, None] - tb).float()[..., None] * A)
    qry = Cb[:, :, :, None, :] * torch.exp((tb - starts[:, :, None]).float()[..., None] * A)  # [b, nb, T, c, N]
    key = key.permute(0, 3, 1, 2, 4)  # [b, c, nb, T, N]
    qry = qry.permute(0, 3, 1, 2, 4)
    out = tau.new_zeros(b, c, nb * T, nb * T, dtype=torch.float32)
    causal = torch.ones(T, T, dtype=torch.bool, device=tau.device).tril()
    for q in range(nb):
        rs = slice(q * T, (q + 1) * T)
        if q > 0:
            # decay between the end of key block k and the start of query block q (k < q)
            mid = torch.exp((starts[:, q, None] - ends[:, :q]).float().permute(0, 2, 1)[..., None] * A[None, :, None])
            qm = qry[:, :, q, None] * mid[:, :, :, None, :]  # [b, c, q, T, N]
            off = torch.matmul(qm, key[:, :, :q].transpose(-1, -2))  # [b, c, q(k), T(t), T(s)]
            out[:, :, rs, : q * T] = off.permute(0, 1, 3, 2, 4).reshape(b, c, T, q * T)
        # diagonal block: direct segsum decays within the block
        gap = (tb[:, q, :, None] - tb[:, q, None, :]).clamp_min(0).float()  # [b, T(t), T(s), c]
        decay = torch.exp(gap.permute(0, 3, 1, 2)[..., None] * A[None, :, None, None, :])  # [b, c, t, s, N]
        cb = Cb[:, q, :, None, :] * Bb[:, q, None, :, :]  # [b, t, s, N]
        diag = (decay * cb[:, None]).sum(-1) * w[:, q].permute(0, 2, 1)[:, :, None, :]
        out[:, :, rs, rs] = diag * causal
    return out[:, :, :L, :L]
