"""Fast Mamba-1 implied attention, per channel, for the two requests that dominate in practice.

Channel ``d``, query ``t``, key ``s ≤ t`` (the oracle is :func:`.implied_mamba1.mamba1_implied_reference`)::

    α_d[t, s] = Σ_n C_t[n] · B_s[n] Δ_s[d] · exp(A[d, n] (τ_t[d] - τ_s[d])),      τ_t = Σ_{k≤t} Δ_k

**The whole matrix** (:func:`full_per_channel`), by a hierarchy of diagonal blocks.  A block of rows
``[r, r+T)`` and the keys ``[p, r)`` before it (``p`` the start of its parent block) meet at ``r``::

    exp(A (τ_t - τ_s)) = exp(A (τ_t - τ_{r-1})) · exp(A (τ_{r-1} - τ_s))            (s < r ≤ t)

Both factors are decays in (0, 1] (exponents of float64 τ differences, never ratios of exponentials), so
the rectangle is one batched matmul over ``n``: ``[T, N] @ [N, r - p]`` per channel, written straight into
the output.  The parent's diagonal children are split again, every level batched over all blocks of that
size (strided views of the output), until blocks of :data:`_DIRECT` rows, whose entries come from the
formula itself.  Elementwise work is O(D·N·L·levels) exps instead of O(D·N·L·T), and the O(D·N·L²/2)
multiply-adds run in matmuls.  What makes it fast on a CPU:

- each factor's exponent is floored at :data:`_FACTOR_FLOOR` = -35, so that a product of two factors stays
  a normal fp32 number (a matmul over subnormal products runs ~50x slower on x86); an entry changes by less
  than ``exp(-35) ≈ 6.3e-16`` times ``Σ_n |C_t[n] B_s[n]| Δ_s``;
- the factors are laid out ``[.., keys, N]`` with ``N`` innermost, so that each elementwise pass is one
  sweep over contiguous memory whatever the block shape;
- the diagonal blocks of at most :data:`_LEAF` rows (the leaves) are filled in a small buffer and copied
  into the output whole (their rows are a few floats long);
- with ``zeroed`` (an output from :func:`.implied_common.mapped_zeros`) the zeros above the diagonal are not
  written at all.

**Query rows** (:func:`rows_per_channel`): for one query ``t`` the row is a single reverse pass over the
keys, ``α_d[t, s] = Σ_n C_t[n] B_s[n] Δ_s[d] exp(A[d, n] (τ_t - τ_s))`` for ``s ≤ t``, done in chunks of
keys and tiles of channels so that memory stays O(D·chunk) whatever L is; a decay is computed only inside
the smallest (channel, key) block that holds all of its state index's live decays (exponent ≥ -87), so
the exps are about the live ones, whatever the decays are (no assumption on ``A``).
"""

from __future__ import annotations

import torch
from torch import Tensor

#: Floor of decay exponents: exp(-87) ≈ 1.6e-38 is the smallest fp32 decay kept normal (slow paths below).
_EXP_FLOOR = -87.0
#: Floor of the exponent of every decay factor of the full matrix (:func:`full_per_channel`): each changes by
#: less than exp(-35) ≈ 6.3e-16, and a product of two floored factors (≥ exp(-70) ≈ 4e-31, times C·B·Δ)
#: stays a normal fp32 number; subnormal operands or results make a matmul ~50x slower on x86.
_FACTOR_FLOOR = -35.0
#: Rows of the blocks whose entries are computed straight from the formula (the last level).
_DIRECT = 4
#: Children per parent block at each level of the hierarchy.
_SPLIT = 4
#: Channels processed at once by :func:`full_per_channel` (measured: 32-256 take the same time).
_FULL_CHANNELS = 128
#: Rows of the diagonal blocks (leaves) filled in a small buffer and copied into the output whole.
_LEAF = 16


def _sizes(L: int) -> list[int]:
    """Block sizes of the levels below the whole matrix, largest first: L/4-ish powers of 4, down to 4."""
    sizes = []
    T = _DIRECT
    while T * _SPLIT < L:
        T *= _SPLIT
    while T >= _DIRECT:
        sizes.append(T)
        T //= _SPLIT
    return sizes


def full_per_channel_bytes(L: int, d_state: int) -> int:
    """Working bytes per channel of :func:`full_per_channel` (the output aside)."""
    T = (_sizes(L) or [0])[0]
    # τ (float64), Δ_s; B_s Δ_s, one level's query and key factors, the direct blocks' two [3/2 L, N]
    # temporaries; the batched lower-level product (at most 3/16 · L · T); the leaves' buffer
    return 12 * L + 4 * d_state * L * (1 + 1 + 1 + 3) + 4 * (3 * L * T // 16) + 4 * L * (_LEAF + 1)


def full_per_channel(dt: Tensor, w: Tensor, A: Tensor, B: Tensor, C: Tensor, out: Tensor,
                     zeroed: bool = False) -> None:
    """Write the per-channel α of every channel into ``out`` ``[batch, c, L, L]`` (zeros above the diagonal).

    ``dt``, ``w`` (the ``Δ_s`` factor, or ones): ``[batch, L, c]``; ``A`` ``[c, N]``; ``B``, ``C``
    ``[batch, L, N]``; all float32 (``out`` may be a strided channel slice of a larger tensor).  ``zeroed``:
    ``out`` holds zeros already, so the entries above the diagonal are not written (pages of a fresh
    zero mapping are then touched only by the lower triangle's writes).  Each decay is a product of factors
    whose exponents are floored at :data:`_FACTOR_FLOOR`: an entry changes by less than
    ``exp(-35) · Σ_n |C_t[n] B_s[n]| Δ_s``.
    """
    b, L, c = dt.shape
    if L == 0 or c == 0:
        return
    sizes = _sizes(L)
    tile = min(c, _FULL_CHANNELS)
    for bi in range(b):
        for c0 in range(0, c, tile):
            c1 = min(c, c0 + tile)
            tau = torch.cumsum(dt[bi, :, c0:c1].T, -1, dtype=torch.float64)  # [tile, L]
            ctx = _Ctx(out[bi, c0:c1], tau, A[c0:c1], B[bi], C[bi], w[bi, :, c0:c1].T.contiguous(), zeroed)
            ctx.square(0, 1, L, sizes)


def _factor(gap: Tensor, A4: Tensor, coef: Tensor) -> Tensor:
    """``exp(A gap) · coef`` with the exponent floored at :data:`_FACTOR_FLOOR`: ``gap`` ``[c, m, k, 1]`` (a
    float32 τ difference, its sign that of the decay's exponent over ``A``), ``A4`` ``[c, 1, 1, N]``, ``coef``
    ``[m, k, N]`` or ``[c, m, k, N]``: ``[c, m, k, N]``."""
    return torch.mul(gap, A4).clamp_min_(_FACTOR_FLOOR).exp_().mul_(coef)


class _Ctx:
    """One prompt's operands for a tile of channels, and the recursion over levels of diagonal blocks.

    Blocks of more than :data:`_LEAF` rows write into ``out``; the diagonal blocks of at most :data:`_LEAF`
    rows (the leaves) are filled in a small buffer first (with its zeros above the diagonal) and copied into
    ``out`` whole: there rows are a few floats long, which would cost ``out`` a partial cache line per row and
    level.  The *target* (``out`` or the leaf buffer) holds entry ``(t, s)`` at ``(t - org)·rs + s - org``.
    """

    def __init__(self, out: Tensor, tau: Tensor, A: Tensor, B: Tensor, C: Tensor, wT: Tensor, zeroed: bool) -> None:
        self.out, self.tau, self.A4, self.B, self.C, self.wT = out, tau, A[:, None, None, :], B, C, wT
        self.zeroed = zeroed
        self.bw = B * wT[:, :, None]  # [c, L, N]: B_s Δ_s
        self.c, self.N = A.shape
        self.L = tau.shape[1]
        self.tgt, self.rs, self.org = out, self.L, 0

    def view(self, lo: int, n_par: int, P: int, r0: int, h: int, k0: int, k: int) -> Tensor:
        """Target rows ``lo + i·P + r0 + [0, h)`` x keys ``lo + i·P + k0 + [0, k)`` for parents ``i``: ``[c, n_par, h, k]``."""
        t, rs, lo = self.tgt, self.rs, lo - self.org
        return t.as_strided((self.c, n_par, h, k), (t.stride(0), P * (rs + 1), rs, 1),
                            t.storage_offset() + (lo + r0) * rs + lo + k0)

    def square(self, lo: int, n_par: int, P: int, sizes: list[int]) -> None:
        """Fill the ``n_par`` back-to-back diagonal blocks of ``P`` rows starting at ``lo`` (lower triangles)."""
        if P <= _LEAF and self.tgt is self.out:
            self.leaf(lo, n_par, P, sizes)
            return
        T = next((s for s in sizes if s < P), None)
        if T is None or P <= _DIRECT:
            self.direct(lo, n_par, P)
            return
        rest = [s for s in sizes if s < T]
        for j in range(-(-P // T)):
            r0, h = j * T, min(T, P - j * T)
            if j:
                self.rect(lo, n_par, P, r0, h)
            if r0 + h < P and self.tgt is self.out and not self.zeroed:  # zeros right of the child block
                self.view(lo, n_par, P, r0, h, r0 + h, P - r0 - h).zero_()
        full, rem = divmod(P, T)
        if n_par > 1 and rem:  # never happens: sizes divide each other
            raise AssertionError("block sizes must divide each other")
        self.square(lo, n_par * full, T, rest)
        if rem:
            self.square(lo + full * T, 1, rem, rest)

    def leaf(self, lo: int, n_par: int, P: int, sizes: list[int]) -> None:
        """The ``n_par`` diagonal blocks of ``P ≤`` :data:`_LEAF` rows at ``lo``, filled in a zeroed buffer (row
        stride ``P``: block ``i`` at ``i·P(P+1)``) by the same recursion, then copied into ``out`` at once."""
        buf = torch.zeros(self.c, n_par * P * (P + 1), device=self.out.device)
        self.tgt, self.rs, self.org = buf, P, lo
        try:
            self.square(lo, n_par, P, sizes)
        finally:
            self.tgt, self.rs, self.org = self.out, self.L, 0
        self.view(lo, n_par, P, 0, P, 0, P).copy_(buf.as_strided((self.c, n_par, P, P), (buf.stride(0), P * (P + 1), P, 1)))

    def blocks(self, t: Tensor, lo: int, n_par: int, P: int, dim: int = -1) -> Tensor:
        """``t[.., lo + i·P + j, ..]`` (along ``dim``) as ``[.., n_par, P, ..]`` (a view)."""
        return t.narrow(dim, lo, n_par * P).unflatten(dim, (n_par, P))

    def rect(self, lo: int, n_par: int, P: int, r0: int, h: int) -> None:
        """Rows ``[r0, r0+h)`` x keys ``[0, r0)`` of each parent block, one matmul over ``n`` per block."""
        tau = self.blocks(self.tau, lo, n_par, P)  # [c, n_par, P] float64
        Cb = self.blocks(self.C, lo, n_par, P, 0)  # [n_par, P, N]
        ref = tau[:, :, r0 - 1, None]  # τ just before the query block: [c, n_par, 1]
        # query factor C_t exp(A (τ_t - τ_{r-1})): [c, n_par, h, N]; key factor B_s Δ_s exp(A (τ_{r-1} - τ_s)),
        # keys s = block start .. r-1: [c, n_par, r0, N]
        qf = _factor((tau[:, :, r0:r0 + h] - ref).float()[..., None], self.A4, Cb[:, r0:r0 + h])
        kf = _factor((ref - tau[:, :, :r0]).float()[..., None], self.A4, self.blocks(self.bw, lo, n_par, P, 1)[:, :, :r0])
        dst = self.view(lo, n_par, P, r0, h, 0, r0)
        if n_par == 1:
            torch.bmm(qf[:, 0], kf[:, 0].transpose(1, 2), out=dst[:, 0])  # straight into the target (strided rows)
        else:
            dst.copy_(torch.matmul(qf, kf.transpose(2, 3)))

    def direct(self, lo: int, n_par: int, P: int) -> None:
        """Blocks of ``P`` rows on the diagonal, from the formula: Σ_n C_t B_s exp(A (τ_t - τ_s)) · Δ_s for the
        ``P (P - 1) / 2`` pairs ``s < t`` of a block, and Σ_n C_t B_t · Δ_t on its diagonal (into the target,
        whose entries above the diagonal are zeros already)."""
        rs = self.rs
        Bb, Cb = (self.blocks(x, lo, n_par, P, 0) for x in (self.B, self.C))  # [n_par, P, N]
        wb = self.blocks(self.wT, lo, n_par, P)  # [c, n_par, P]
        self.view(lo, n_par, P, 0, P, 0, P).diagonal(0, 2, 3).copy_((Cb * Bb).sum(-1) * wb)
        if P == 1:
            return
        ii, jj = torch.tril_indices(P, P, -1, device=self.tau.device)  # the pairs t > s of a block
        t = self.blocks(self.tau, lo, n_par, P)  # [c, n_par, P] float64
        gap = (t.index_select(2, ii) - t.index_select(2, jj)).float()[..., None]  # [c, n_par, p, 1]
        e = _factor(gap, self.A4, Cb.index_select(1, ii) * Bb.index_select(1, jj))  # [c, n_par, p, N]
        s = e.sum(-1).mul_(wb.index_select(2, jj))  # [c, n_par, p]
        first = (lo - self.org) * (rs + 1)  # target offset of each block's (0, 0), block i at + i·P(rs + 1)
        pos = first + torch.arange(n_par, device=ii.device)[:, None] * (P * (rs + 1)) + ii * rs + jj  # [n_par, p]
        tg = self.tgt  # the leaf buffer [c, m]
        tg.index_copy_(1, pos.flatten(), s.flatten(1))


#: Prompt length from which query rows take :func:`rows_per_channel` (below it, the tiled path of
#: :mod:`.implied_mamba1`, which has less per-chunk overhead; on the 7B-sized layer the two are even at
#: L = 2048 and this path is 1.35x faster at 4096, see docs/benchmarks.md).
ROWS_LONG = 4096
#: Channels per tile and keys per chunk of the row path.  A (tile, chunk, n) block costs four torch calls
#: whatever its size, and on CPU a call's overhead (µs) outweighs L2 misses: measured best of 64-1024 x
#: 256-2048 on the 7B-sized layer (docs/benchmarks.md).  Working memory: 20 bytes x channels x chunk.
_ROW_CHANNELS = 256
_ROW_KEYS = 1024
#: Keys per step of the gather of a chunk's Δ into tile order.
_GATHER_ROWS = 32


def rows_per_channel(dt: Tensor, dt_scaling: bool, A: Tensor, B: Tensor, C: Tensor, rows: Tensor,
                     out: Tensor) -> None:
    """Write the query rows ``rows`` ``[batch, R]`` of every channel's α into ``out`` ``[batch, c, R, L]``.

    ``dt`` ``[batch, L, c]``, ``A`` ``[c, N]``, ``B``, ``C`` ``[batch, L, N]``, float32.  For query ``t``,
    keys are visited backwards from ``t`` in chunks of :data:`_ROW_KEYS`, channels in tiles of
    :data:`_ROW_CHANNELS`, ordered by how fast they decay.  A tile's gaps ``g_d(s) = τ_t - τ_s =
    Σ_{k=s+1..t} Δ_k`` are a float64 cumsum over the chunk plus the sum carried from the chunks before.
    The decay of ``(d, n)`` is alive while ``A[d, n] g_d(s) ≥ -87``; ``g_d`` only grows backwards, so its
    live keys are a suffix of the chunk, found by a binary search of ``g_d`` against ``-87 / A[d, n]``.
    The tile's row is accumulated state index by state index,
    ``acc += C_t[n] B_s[n] · exp(A[d, n] g_d(s))``, over the smallest block of (channel, key) holding every
    live decay of ``n``; dead ones inside the block are floored at ``exp(-87) ≈ 1.6e-38`` as on the other
    paths, those outside it (and every key before the chunk where all have died) get no term: a difference
    of that size.  Memory: the output plus ``20 · c · chunk`` bytes, whatever L is.
    """
    b, L, c = dt.shape
    TC, K = min(c, _ROW_CHANNELS), min(L, _ROW_KEYS)
    n_tiles = -(-c // TC)
    slowest = A.max(1).values  # [c]: each channel's slowest decay rate
    x_buf, w_buf, acc_buf = (torch.empty(K * c, device=dt.device) for _ in range(3))
    cs_buf = torch.empty(K * c, dtype=torch.float64, device=dt.device)
    e_buf = torch.empty(TC, K, device=dt.device)
    in_tile = torch.arange(TC, device=dt.device)
    for bi in range(b):
        rr = [int(x) for x in rows[bi]]
        out[bi].zero_()
        tau_rows = _tau_at(dt[bi], rr)  # [R, c]
        for r, t in enumerate(rr):
            order = torch.argsort(slowest.double() * tau_rows[r].double())  # fastest-decaying channels first
            A_p = A.index_select(0, order)  # [c, N]
            negA = (-A_p).T[:, :, None].contiguous()  # [N, c, 1]
            # the decay of (d, n) is alive while -g_d(s) ≥ -87 / -A[d, n] (never dead if A ≥ 0)
            bound = torch.where(A_p < 0, _EXP_FLOOR / -A_p.clamp_max(-1e-30), float("-inf"))
            slow_p = slowest.index_select(0, order).double()
            carry = torch.zeros(c, dtype=torch.float64, device=dt.device)  # Σ_{k=s1..t} Δ_k per channel
            for s1 in range(t + 1, 0, -K):
                s0, k = max(0, s1 - K), min(s1, K)
                near = slow_p * carry >= _EXP_FLOOR  # [c]: some decay alive at the chunk's last key
                alive = torch.cat([near, near.new_zeros(n_tiles * TC - c)]).view(n_tiles, TC).any(1)
                tiles = alive.nonzero()[:, 0]
                if not len(tiles):
                    break  # every decay is below exp(-87) from here back to key 0
                pos = (tiles[:, None] * TC + in_tile).flatten()
                pos = pos[pos < c]  # the live tiles' channels (positions in ``order``), back to back
                idx, m = order.index_select(0, pos), len(pos)
                X = x_buf[:k * m].view(k, m)  # their Δ
                for q in range(0, k, _GATHER_ROWS):  # a few keys at a time: the rows stay in cache
                    torch.index_select(dt[bi, s0 + q:s0 + min(k, q + _GATHER_ROWS)], 1, idx, out=X[q:q + _GATHER_ROWS])
                w = w_buf[:m * k].view(m, k).copy_(X.T)  # Δ_s [m, k]
                cs = cs_buf[:m * k].view(m, k).copy_(w).cumsum_(1)
                cs.sub_(cs[:, -1:] + carry.index_select(0, pos)[:, None])  # -g_d(s) = -(τ_t - τ_s), s in [s0, s1)
                carry.index_copy_(0, pos, w[:, 0] - cs[:, 0])
                ng = x_buf[:m * k].view(m, k).copy_(cs)  # (Δ's gather buffer, free again)
                acc_all = acc_buf[:m * k].view(m, k)
                cb = (C[bi, t, :, None] * B[bi, s0:s1].T).unbind(0)  # N x [k]: C_t[n] B_s[n]
                e_k = e_buf[:, :k]
                for ti, blocks in enumerate(_live_blocks(ng, bound.index_select(0, pos), TC)):
                    j = ti * TC
                    c0, tc = int(pos[j]), min(TC, m - j)
                    ng_t, acc = ng[j:j + tc], acc_all[j:j + tc]
                    if not blocks or blocks[0][1:4] != (0, tc, 0):
                        acc.zero_()
                    for i, (n, f, e, ks, low) in enumerate(blocks):
                        if (f, e, ks) == (0, tc, 0):  # the whole tile: no slicing
                            x = torch.mul(ng_t, negA[n, c0:c0 + tc], out=e_k[:tc])
                            if low:
                                x.clamp_min_(_EXP_FLOOR)
                            if i:
                                acc.addcmul_(x.exp_(), cb[n])
                            else:
                                torch.mul(x.exp_(), cb[n], out=acc)
                        else:
                            x = torch.mul(ng_t[f:e, ks:], negA[n, c0 + f:c0 + e], out=e_k[:e - f, ks:])
                            if low:
                                x.clamp_min_(_EXP_FLOOR)
                            acc[f:e, ks:].addcmul_(x.exp_(), cb[n][ks:])
                if dt_scaling:
                    acc_all.mul_(w)
                out[bi, :, r, s0:s1].index_copy_(0, idx, acc_all)


def _live_blocks(ng: Tensor, bound: Tensor, TC: int) -> list[list[tuple[int, int, int, int, bool]]]:
    """For tiles of ``TC`` channels back to back, their ``-g`` ``[m, k]`` (increasing along keys) and bounds
    ``-87 / -A`` ``[m, N]``: per tile, ``(n, first, end, key, low)`` for each state index ``n`` alive
    somewhere in the tile: its live decays lie in the tile's channels ``[first, end)``, keys ``[key, k)``;
    ``low`` when some decay in that block is dead (exponent below -87)."""
    (m, k), N = ng.shape, bound.shape[1]
    fa = torch.searchsorted(ng, bound)  # [m, N]: first live key of each (channel, n)
    nt = -(-m // TC)
    fa = torch.cat([fa, fa.new_full((nt * TC - m, N), k)]).view(nt, TC, N)
    live = fa < k
    ar = torch.arange(TC, device=ng.device)[None, :, None]
    first = torch.where(live, ar, TC).amin(1)
    end = torch.where(live, ar + 1, 0).amax(1)
    key = torch.where(live, fa, k).amin(1)
    low = (end - first > live.sum(1)) | (torch.where(live, fa, -1).amax(1) > key)
    info = torch.stack([first, end, key, low.long()], -1).tolist()  # [nt, N, 4]
    return [[(n, f, e, ks, bool(lw)) for n, (f, e, ks, lw) in enumerate(tile) if f < e] for tile in info]


def _tau_at(dt: Tensor, rows: list[int]) -> Tensor:
    """τ_t = Σ_{k≤t} Δ_k at the positions ``rows`` (``dt`` ``[L, c]``): ``[R, c]``, float32 (it only orders
    the channels; the gaps themselves are float64 sums)."""
    ones = torch.ones(1, dt.shape[0], dtype=dt.dtype, device=dt.device)
    return torch.cat([ones[:, :t + 1] @ dt[:t + 1] for t in rows])
