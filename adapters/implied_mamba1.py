"""Mamba-1 implied attention, channel ``d`` (the decay depends on the state index ``n``)::

    α_d[t, s] = Σ_n C_t[n] B_s[n] exp(A[d, n] (τ_t[d] - τ_s[d])) · Δ_s[d],   τ_t = Σ_{k≤t} Δ_k

:func:`mamba1_implied_reference` is the formula itself (the oracle);
:func:`mamba1_implied_attention` is the fast path (block split of the decay,
channel chunks reduced into heads on the fly, cache-sized tiles; the whole
matrix, or a few query rows), and :func:`mamba1_masked_output` the layer output
with some heads' implied attention masked.  Conventions and the memory story
are in :mod:`gather_aggregate.adapters.implied`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from gather_aggregate.adapters.implied_common import (
    DEFAULT_MAX_BYTES,
    Reduce,
    _budget_error,
    _check_inputs,
    _gib,
    _head_list,
    _segsum,
    mapped_zeros,
)
from gather_aggregate.adapters.implied_mamba1_blocks import (
    ROWS_LONG,
    full_per_channel,
    full_per_channel_bytes,
    rows_per_channel,
)
from gather_aggregate.core.errors import InputError


# ============================================================================ reference (oracle)
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


# ============================================================================ fast path
def _block_size(L: int) -> int:
    """Block length of the Mamba-1 split: ~sqrt(L) balances the diagonal blocks against the off-diagonal ones."""
    return int(min(64, max(8, 2 ** round(math.log2(max(L, 1)) / 2))))


#: Elements (fp32) of one working tile: the off-diagonal key tile, the diagonal-block temporaries and the
#: row-query tiles are each capped near this size (8 MiB), so temporaries stay cache-sized and are recycled
#: by the allocator instead of being page-faulted in afresh for every block.
_TILE = 2**21
#: Tile-sized temporaries alive at once (a bound, used by the memory estimate).
_N_TILES = 8
#: Floor of decay exponents: exp(-87) ≈ 1.6e-38 is the smallest fp32 decay kept normal (see :func:`_decay`).
_EXP_FLOOR = -87.0
#: Tile cap of the row-query path: its tiles take ~4 passes per state index, so they should stay in L2.
_ROW_TILE = 2**18


def _tile_elems(max_bytes: int) -> int:
    """Tile size for a budget: at most :data:`_TILE`, and small enough that the tiles use < 1/3 of the budget."""
    return int(max(1024, min(_TILE, max_bytes // (4 * 4 * _N_TILES))))


def mamba1_implied_bytes(batch: int, L: int, n_out_heads: int, d_state: int, n_rows: int | None,
                         channel_chunk: int = 1, block: int | None = None, *, tile: int = _TILE,
                         per_channel_temp: bool = False) -> tuple[int, int]:
    """(output bytes, working bytes for ``channel_chunk`` channels at a time) of :func:`mamba1_implied_attention`.

    ``per_channel_temp``: the channels' own matrices are materialised before they are reduced into their
    heads (``reduce="abs_mean"``, or query rows with ``head_size > 1``); otherwise channels are written, or
    summed inside the contraction, straight into the output.
    """
    Q = L if n_rows is None else n_rows
    out = 4 * batch * n_out_heads * Q * L
    c = channel_chunk
    if n_rows is None:
        # τ (float64) and Δ of the chunk, the query/key factors [L, N] per channel (with their transients)
        # and the diagonal block [T, T] per channel
        T = block or _block_size(L)
        per = max(8 * L + 4 * L + 4 * 3 * L * d_state + 8 * T * T, full_per_channel_bytes(L, d_state))
    else:
        per = 8 * L + 4 * L  # τ (float64) and Δ of the chunk; the tiles hold the rest
    if per_channel_temp:
        per += 4 * Q * L
    fixed = 4 * _N_TILES * tile if c else 0
    return out, batch * c * per + fixed


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
            For ``"mean"``/``"sum"`` the sum over a head's channels happens inside the contraction
            (one matmul over ``head_size · d_state``), so coarse heads over long prompts are cheap:
            memory O(L² · heads + L · d_inner · d_state).
        rows: ``[batch, n_rows]`` query positions (e.g. each prompt's final token for Aggregate
            heads, segment summary tokens for Gather heads): cost O(rows · L · d_inner · d_state),
            memory O(rows · L · heads) plus cache-sized tiles.
        dt_scaling: include the ``Δ_s`` factor (default; reconstructs ``y`` from the post-conv x).
        max_bytes: memory budget; raises :class:`MemoryBudgetError` (naming cheaper requests) past it.
        block: block length of the grouped-head and autograd full-matrix path (default ~sqrt(L), 8..64); per-channel
            matrices without autograd use the block hierarchy of :mod:`.implied_mamba1_blocks`.
    """
    _check_inputs(dt, B, C, rows)
    b, L, D = dt.shape
    hs = _checked_heads(heads, head_size, reduce, D)
    Q = L if rows is None else rows.shape[1]
    T = block or _block_size(L)
    tile = _tile_elems(max_bytes)
    # channels of a head are summed inside the contraction (full matrix, mean/sum) or come one per head
    fused = rows is None and reduce != "abs_mean"
    chunk = _channels_at_once(b, L, A.shape[1], D, hs, head_size, rows, T, tile, fused, max_bytes)

    channels = torch.tensor([h * head_size + j for h in hs for j in range(head_size)], device=dt.device)
    slot = torch.arange(len(hs), device=dt.device).repeat_interleave(head_size)  # output head of each channel
    dtf, Af, Bf, Cf = dt.float(), A.float(), B.float(), C.float()
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (dt, A, B, C))  # out-of-place ops then
    # heads accumulate into zeros, and the per-channel full matrix leaves its zeros above the diagonal to a
    # zero-mapped output; query rows write every entry of theirs
    if rows is None or head_size > 1:
        out = mapped_zeros((b, len(hs), Q, L), dt.device)
    else:
        out = torch.empty(b, len(hs), Q, L, dtype=torch.float32, device=dt.device)
    for i, j in _channel_pieces(len(channels), head_size, chunk, whole_groups=fused):
        ch = channels[i:j]
        if bool((ch == torch.arange(int(ch[0]), int(ch[0]) + len(ch), device=ch.device)).all()):
            ch = slice(int(ch[0]), int(ch[0]) + len(ch))  # a contiguous range: views, no gathers
        dt_c, A_c = dtf[:, :, ch], Af[ch]
        if rows is None and head_size == 1 and not grad:  # per channel: the hierarchy of diagonal blocks
            full_per_channel(dt_c, dt_c if dt_scaling else torch.ones_like(dt_c), A_c, Bf, Cf, out[:, i:j],
                             zeroed=True)
        elif rows is None and (head_size == 1 or fused):
            group = min(head_size, j - i)  # a piece is whole heads, or a part of one head
            dst = out[:, i // head_size:-(-j // head_size)]
            _mamba1_full(dt_c, dt_scaling, A_c, Bf, Cf, T, group, dst, accumulate=head_size > 1, tile=tile,
                         grad=grad)
        else:  # per-channel matrices (or query rows), reduced into their heads here
            alpha = out[:, i:j] if head_size == 1 else torch.empty(b, j - i, Q, L, device=dt.device)
            _per_channel(dt_c, dt_scaling, A_c, Bf, Cf, rows, alpha, T, tile=tile, grad=grad)
            if head_size > 1:
                out.index_add_(1, slot[i:j], alpha.abs() if reduce == "abs_mean" else alpha)
    if head_size > 1 and reduce != "sum":
        out /= head_size
    return out


def _checked_heads(heads: int | Sequence[int] | None, head_size: int, reduce: str, D: int) -> list[int]:
    """The head list of :func:`mamba1_implied_attention`, once ``head_size`` and ``reduce`` are valid."""
    if isinstance(head_size, bool) or not isinstance(head_size, int) or head_size < 1 or D % head_size:
        raise InputError(f"head_size must be a positive divisor of d_inner={D}, got {head_size!r}")
    if reduce not in ("mean", "abs_mean", "sum"):
        raise InputError(f"reduce must be 'mean', 'abs_mean' or 'sum', got {reduce!r}")
    return _head_list(heads, D // head_size)


def _channels_at_once(b: int, L: int, N: int, D: int, hs: list[int], head_size: int, rows: Tensor | None, T: int,
                      tile: int, fused: bool, max_bytes: int) -> int:
    """How many channels :func:`mamba1_implied_attention` processes at once within ``max_bytes``; raises
    :class:`MemoryBudgetError`, naming cheaper requests and their cost, when even one does not fit."""
    n_rows = None if rows is None else rows.shape[1]
    Q = L if n_rows is None else n_rows
    temp = head_size > 1 and not fused

    def need(n_heads: int, n_r: int | None, chunk: int, L_: int = L, temp_: bool = temp) -> tuple[int, int]:
        return mamba1_implied_bytes(b, L_, n_heads, N, n_r, chunk, T, tile=tile, per_channel_temp=temp_)

    out_b, work1 = need(len(hs), n_rows, 1)
    if out_b + work1 > max_bytes:
        coarse = min((g for g in (64, 128, 256, 512, D) if D % g == 0 and g > head_size), default=D)
        opts = [f"rows=[-1] (the final query: {_gib(sum(need(len(hs), 1, 1, temp_=head_size > 1)))})",
                f"fewer heads, e.g. heads=[{hs[0]}] ({_gib(sum(need(1, n_rows, 1)))})",
                f"coarser channel groups, head_size={coarse} with reduce='mean' "
                f"({_gib(sum(need(max(1, len(hs) * head_size // coarse), n_rows, 1, temp_=rows is not None)))})",
                f"a shorter prompt (L={L // 2}: "
                f"{_gib(sum(need(len(hs), None if rows is None else min(Q, L // 2), 1, L // 2)))})"]
        raise _budget_error(f"Mamba-1 implied attention ({b} x {len(hs)} heads x {Q} x {L})", out_b + work1,
                            max_bytes, opts)
    per_channel = need(len(hs), n_rows, 2)[1] - work1
    return max(1, int((max_bytes - out_b - (work1 - per_channel)) // max(per_channel, 1)))


def _per_channel(dt: Tensor, dt_scaling: bool, A: Tensor, B: Tensor, C: Tensor, rows: Tensor | None,
                 alpha: Tensor, T: int, *, tile: int, grad: bool) -> None:
    """Write each channel's own α (all query rows, or ``rows``) into ``alpha`` ``[batch, channel, Q, L]``."""
    if rows is None:
        _mamba1_full(dt, dt_scaling, A, B, C, T, 1, alpha, accumulate=False, tile=tile, grad=grad)
    elif not grad and dt.shape[1] >= ROWS_LONG:  # long prompts: key chunks, dead decays skipped
        rows_per_channel(dt, dt_scaling, A, B, C, rows, alpha)
    else:
        _mamba1_rows(dt, dt_scaling, A, B, C, rows, alpha, tile=tile, grad=grad)


def _channel_pieces(n: int, head_size: int, chunk: int, whole_groups: bool) -> list[tuple[int, int]]:
    """Ranges of the channel list processed at once: whole heads when they fit, else parts of one head."""
    if head_size == 1 or not whole_groups:
        return [(i, min(n, i + chunk)) for i in range(0, n, chunk)]
    if chunk >= head_size:
        step = chunk // head_size * head_size
        return [(i, min(n, i + step)) for i in range(0, n, step)]
    return [(h + k, h + min(head_size, k + chunk))
            for h in range(0, n, head_size) for k in range(0, head_size, chunk)]


def _mamba1_rows(dt: Tensor, dt_scaling: bool, A: Tensor, B: Tensor, C: Tensor, rows: Tensor,
                 dst: Float[Tensor, "batch channel n_rows key"], *, tile: int, grad: bool) -> None:
    """Write α_d[t, s] = ``Σ_n C_t B_s exp(A (τ_t - τ_s)) · Δ_s`` (zero for s > t) of the query rows into ``dst``.

    Channels-first tiles ``[channel, rows, keys]`` of at most ``min(tile, _ROW_TILE)`` elements (they stay
    in L2): τ is a float64 cumsum along the contiguous axis, the decay argument a float64 difference, and
    the sum over ``n`` a loop of in-place ops on the tile (no ``[.., N]`` temporary).  Tiles entirely
    after the last query row are skipped.
    """
    b, L, c = dt.shape
    N = A.shape[1]
    R = rows.shape[1]
    tile = min(tile, _ROW_TILE)
    cs = max(1, min(c, tile // L))  # channels per tile
    rc = max(1, min(R, tile // (cs * min(L, 256))))  # query rows per tile
    pos = torch.arange(L, device=dt.device)
    pool = {"device": torch.empty(0, device=dt.device)}
    for bi in range(b):
        dt_T = dt[bi].T.contiguous()  # [c, L]: one transposing copy (cheaper than one per tile)
        for c0 in range(0, c, cs):
            c1 = min(c, c0 + cs)
            dtT = dt_T[c0:c1]  # [cs, L]
            tauT = torch.cumsum(dtT.double(), -1) if grad else dtT.double().cumsum_(-1)  # τ, float64
            An = [A[c0:c1, n, None, None] for n in range(N)]
            for r0 in range(0, R, rc):
                rr = rows[bi, r0:r0 + rc]
                nr = rr.shape[0]
                tmin, tmax = int(rr.min()), int(rr.max())
                S = max(1, min(L, tile // (nr * (c1 - c0))))  # keys per tile
                tq = tauT[:, rr, None]  # [cs, nr, 1]
                cq = C[bi, rr]  # [nr, N]
                for s0 in range(0, L, S):
                    s1 = min(L, s0 + S)
                    view = dst[bi, c0:c1, r0:r0 + nr, s0:s1]
                    if s0 > tmax:  # the whole tile is after the query rows
                        view.zero_()
                        continue
                    cb = (cq[:, None, :] * B[bi, None, s0:s1, :]).permute(2, 0, 1).contiguous()  # [N, nr, S]
                    crosses = s1 - 1 > tmin  # some key of the tile comes after some query row
                    causal = rr[:, None] >= pos[None, s0:s1] if crosses else None
                    if grad:
                        gap = (tq - tauT[:, None, s0:s1]).float().clamp_min(0)
                        a = _nsum(gap, An, cb, None) * (causal if crosses else 1)
                        view.copy_(a * dtT[:, None, s0:s1] if dt_scaling else a)
                        continue
                    shape = (c1 - c0, nr, s1 - s0)
                    g64 = torch.sub(tq, tauT[:, None, s0:s1], out=_buf(pool, "g64", shape, torch.float64))
                    gap = _buf(pool, "g32", shape).copy_(g64)
                    if crosses:
                        gap.clamp_min_(0)  # s > t: a growth, not a decay; masked below
                    view.zero_()
                    _nsum(gap, An, cb, view, _buf(pool, "e", shape))
                    if causal is not None:  # the tile crosses the query rows
                        view.masked_fill_(~causal, 0.0)
                    if dt_scaling:
                        view *= dtT[:, None, s0:s1]


def _buf(pool: dict[str, Tensor], name: str, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> Tensor:
    """A contiguous ``shape`` view of work buffer ``name``, reused across tiles (no fresh pages per tile).

    ``pool["device"]`` is an empty tensor on the device the buffers live on.
    """
    n = math.prod(shape)
    t = pool.get(name)
    if t is None or t.numel() < n or t.dtype != dtype:
        t = pool[name] = torch.empty(n, dtype=dtype, device=pool["device"].device)
    return t[:n].view(shape)


def _nsum(gap: Tensor, An: list[Tensor], cb: Tensor, acc: Tensor | None, e: Tensor | None = None) -> Tensor:
    """``acc + Σ_n exp(gap · A_n) · cb_n``: in place into ``acc`` (a cache-sized tile), or out of place (autograd)."""
    if acc is None:
        return sum(torch.exp((gap * a).clamp_min(_EXP_FLOOR)) * cb[n] for n, a in enumerate(An))
    e = torch.empty_like(gap) if e is None else e
    for n, a in enumerate(An):
        acc.addcmul_(_decay(torch.mul(gap, a, out=e)), cb[n])
    return acc


def _decay(arg: Tensor) -> Tensor:
    """``exp`` in place, with the argument floored at :data:`_EXP_FLOOR`.

    ``exp`` of fp32 arguments below about -87.3 (subnormal or zero results) takes a slow path on x86
    (~10x); flooring changes any decay by less than ``exp(-87) ≈ 1.6e-38`` in absolute value.
    """
    return arg.clamp_min_(_EXP_FLOOR).exp_()


@dataclass(frozen=True)
class _BlockSplit:
    """The block split of :func:`_mamba1_full`: ``nb`` blocks of ``T`` steps (keys and queries padded to
    ``nb · T``), channels in ``G`` groups of ``group`` (``K = group · N`` contraction)."""

    b: int
    L: int
    c: int
    N: int
    T: int
    nb: int
    group: int
    qry: Tensor  # [b, G, nb, T, K]: C_t · decay from the block start to t
    key: Tensor  # [b, G, nb, T, K]: B_s Δ_s · decay from s to the block end
    starts: Tensor  # [b, nb, c] float64: τ just before each block
    ends: Tensor  # [b, nb, c] float64: τ at each block end
    tbT: Tensor  # [b, nb, c, T] float64: τ of each step
    wbT: Tensor  # [b, nb, c, T]: the Δ_s factor (ones without dt_scaling)
    Bb: Tensor  # [b, nb, T, N]
    Cb: Tensor  # [b, nb, T, N]
    Ak: Tensor  # [G, 1, group, N]: A by channel group
    An: list[Tensor]  # A[:, n] as [c, 1, 1], per state index n

    @property
    def G(self) -> int:
        return self.c // self.group

    @property
    def K(self) -> int:
        return self.group * self.N


def _split_blocks(dt: Tensor, dt_scaling: bool, A: Tensor, B: Tensor, C: Tensor, T: int, group: int,
                  grad: bool) -> _BlockSplit:
    """τ per block and the query/key factors of every block (the part of α shared by all its tiles)."""
    b, L, c = dt.shape
    N = A.shape[1]
    G, K = c // group, group * N
    nb = -(-L // T)
    pad = nb * T - L
    tau = torch.cumsum(dt, 1, dtype=torch.float64)  # [b, L, c]: τ_t = Σ_{k≤t} Δ_k
    w = dt if dt_scaling else torch.ones_like(dt)
    if pad:  # padded keys/queries get Δ = 0, B = C = 0: they contribute nothing and are never written out
        tau = torch.cat([tau, tau[:, -1:].expand(-1, pad, -1)], 1)
        w, B, C = (torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in (w, B, C))
    tb = tau.view(b, nb, T, c)
    ends = tb[:, :, -1]  # τ at each block end: [b, nb, c]
    starts = torch.cat([torch.zeros_like(ends[:, :1]), ends[:, :-1]], 1)  # τ just before each block
    wb, Bb, Cb = w.view(b, nb, T, c), B.view(b, nb, T, N), C.view(b, nb, T, N)
    Ag = A.view(G, 1, 1, group, N)

    def factor(x: Tensor, gap: Tensor, scale: Tensor) -> Tensor:  # -> [b, G, nb, T, group·N]
        def grouped(t: Tensor) -> Tensor:  # [b, nb, T, c] -> [b, G, nb, T, group, 1]
            return t.view(b, nb, T, G, group).permute(0, 3, 1, 2, 4)[..., None]

        xg = x[:, None, :, :, None, :]  # [b, 1, nb, T, 1, N]
        if grad:
            f = torch.exp((grouped(gap.float()) * Ag).clamp_min(_EXP_FLOOR)) * xg * grouped(scale)
        else:  # one allocation, written in the layout the matmuls read
            f = torch.mul(grouped(gap.float()), Ag, out=torch.empty(b, G, nb, T, group, N, device=dt.device))
            _decay(f).mul_(xg).mul_(grouped(scale))
        return f.view(b, G, nb, T, K)

    qry = factor(Cb, tb - starts[:, :, None], torch.ones_like(wb[:1, :1, :1]).expand_as(wb))
    key = factor(Bb, ends[:, :, None] - tb, wb)
    return _BlockSplit(b, L, c, N, T, nb, group, qry, key, starts, ends, tb.permute(0, 1, 3, 2),
                       wb.permute(0, 1, 3, 2), Bb, Cb, A.view(G, 1, group, N), [A[:, n, None, None] for n in range(N)])


def _mamba1_full(dt: Tensor, dt_scaling: bool, A: Tensor, B: Tensor, C: Tensor, T: int, group: int,
                 out: Float[Tensor, "batch head query key"], *, accumulate: bool, tile: int, grad: bool) -> None:
    """Write (or, with ``accumulate``, add) the sums over consecutive ``group``-channel groups of α_d into ``out``.

    The block split of the module docstring: for query block ``q`` and key block ``k < q``,
    ``α[t, s] = Σ_{d,n} qry[t, d, n] · mid_{qk}[d, n] · key[s, d, n]`` — one matmul over the
    ``group · N`` contraction per tile of key blocks (so a group's sum over channels costs no more
    than one channel's matrix).  Diagonal blocks use direct float64 segsum decays.  Temporaries are
    tiles of at most ``tile`` elements in reused buffers (``grad``: out-of-place ops for autograd).
    """
    sp = _split_blocks(dt, dt_scaling, A, B, C, T, group, grad)
    pool = {"device": torch.empty(0, device=dt.device)}
    for q in range(sp.nb):
        r0, r1 = q * T, min(sp.L, (q + 1) * T)
        _write_off_diagonal(sp, q, out[:, :, r0:r1], pool, accumulate=accumulate, tile=tile, grad=grad)
        diag = _diagonal_block(sp, q, pool, tile=tile, grad=grad)
        nr = r1 - r0
        dst = out[:, :, r0:r1, r0:r1]
        dst.add_(diag[:, :, :nr, :nr]) if accumulate else dst.copy_(diag[:, :, :nr, :nr])
        if not accumulate and r1 < sp.L:
            out[:, :, r0:r1, r1:].zero_()


def _write_off_diagonal(sp: _BlockSplit, q: int, rows_out: Tensor, pool: dict[str, Tensor], *,
                        accumulate: bool, tile: int, grad: bool) -> None:
    """Write (or add) query block ``q``'s keys before the block into ``rows_out`` (its rows of the output), a tile
    of key blocks at a time: ``qry_q · (mid_{qk} ⊙ key_k)ᵀ``, ``mid_{qk}`` the decay between the end of key block
    ``k`` and the start of block ``q``."""
    b, G, T, K, group, N = sp.b, sp.G, sp.T, sp.K, sp.group, sp.N
    nr = rows_out.shape[2]
    qq = sp.qry[:, :, q, :nr]  # [b, G, nr, K]
    nk = max(1, tile // max(1, b * G * T * max(K, T)))  # key blocks per off-diagonal tile
    for k0 in range(0, q, nk):
        k1 = min(q, k0 + nk)
        # decay between the end of key block k and the start of query block q (k < q), laid out [b, G, k, K]
        span = (sp.starts[:, q, None] - sp.ends[:, k0:k1]).float().view(b, k1 - k0, G, group).transpose(1, 2)
        if grad:
            mid = torch.exp((span[..., None] * sp.Ak).clamp_min(_EXP_FLOOR)).view(b, G, k1 - k0, 1, K)
            keym = sp.key[:, :, k0:k1] * mid
            off = torch.matmul(qq, keym.view(b, G, (k1 - k0) * T, K).transpose(-1, -2))
        else:
            mid = _decay(torch.mul(span[..., None], sp.Ak, out=_buf(pool, "mid", (b, G, k1 - k0, group, N))))
            keym = torch.mul(sp.key[:, :, k0:k1], mid.view(b, G, k1 - k0, 1, K),
                             out=_buf(pool, "keym", (b, G, k1 - k0, T, K)))
            off = torch.matmul(qq, keym.view(b, G, (k1 - k0) * T, K).transpose(-1, -2),
                               out=_buf(pool, "off", (b, G, nr, (k1 - k0) * T)))  # [b, G, nr, kT]
        dst = rows_out[..., k0 * T:k1 * T]
        dst.add_(off) if accumulate else dst.copy_(off)


def _diagonal_block(sp: _BlockSplit, q: int, pool: dict[str, Tensor], *, tile: int,
                    grad: bool) -> Tensor:
    """Diagonal block ``q``, ``[b, G, T, T]``, channels outermost: ``Σ_n C_t B_s exp(A (τ_t - τ_s))`` per channel
    (float64 differences of τ), times ``Δ_s``, summed over each group, zero above the diagonal."""
    b, c, T, G, group = sp.b, sp.c, sp.T, sp.G, sp.group
    cc = max(1, min(c, tile // max(1, 2 * b * T * T)))  # channels per diagonal tile
    tq = sp.tbT[:, q]  # [b, c, T] float64
    keep = torch.ones(T, T, dtype=torch.bool, device=tq.device).tril()
    cb = (sp.Cb[:, q, None, :, None, :] * sp.Bb[:, q, None, None, :, :]).permute(4, 0, 1, 2, 3).contiguous()
    # cb: [N, b, 1, t, s]
    parts = []
    res = None if grad else _buf(pool, "res", (b, c, T, T))
    for c0 in range(0, c, cc):
        c1 = min(c, c0 + cc)
        Ac = [a[c0:c1] for a in sp.An]
        if grad:
            gap = (tq[:, c0:c1, :, None] - tq[:, c0:c1, None, :]).float().clamp_min(0)  # [b, cc, t, s]
            parts.append(_nsum(gap, Ac, cb, None))
            continue
        shape = (b, c1 - c0, T, T)
        g64 = torch.sub(tq[:, c0:c1, :, None], tq[:, c0:c1, None, :], out=_buf(pool, "g64", shape, torch.float64))
        gap = _buf(pool, "g32", shape).copy_(g64).clamp_min_(0)
        assert res is not None  # allocated whenever grad is off
        acc = res[:, c0:c1].zero_()
        _nsum(gap, Ac, cb, acc, _buf(pool, "e", shape))
    if grad:
        res = (parts[0] if len(parts) == 1 else torch.cat(parts, 1)) * sp.wbT[:, q, :, None, :]  # [b, c, t, s]
        return res.view(b, G, group, T, T).sum(2) * keep  # [b, G, t, s]
    assert res is not None
    res *= sp.wbT[:, q, :, None, :]
    diag = res.view(b, G, group, T, T)[:, :, 0] if group == 1 else torch.sum(
        res.view(b, G, group, T, T), 2, out=_buf(pool, "diag", (b, G, T, T)))
    return diag.masked_fill_(~keep, 0.0)


def mamba1_masked_output(y: Tensor, x: Tensor, dt: Tensor, B: Tensor, C: Tensor, A: Tensor, head_size: int,
                         heads: list[int], masks: Float[Tensor, "batch n_heads query key"],
                         max_bytes: int) -> Float[Tensor, "batch pos d_inner"]:
    """``y`` with Mamba-1 heads ``heads`` (``head_size`` channels each) replaced by ``(α ⊙ M_h) @ x + D ∘ x``
    per channel, computed as ``y - (α ⊙ (1 - M_h)) @ x`` (see :func:`..implied_mamba2.mamba2_masked_output`)."""
    out = y.clone()
    removed = 1.0 - masks
    channels = [h * head_size + c for h in heads for c in range(head_size)]
    alpha = mamba1_implied_attention(dt, A, B, C, heads=channels, head_size=1, max_bytes=max_bytes)  # [b, n_ch, L, L]
    cut = torch.einsum("bcts,bsc->btc", alpha * removed.repeat_interleave(head_size, 1), x.float()[:, :, channels])
    out[:, :, channels] = out[:, :, channels] - cut.to(out.dtype)
    return out
