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
multiply-adds run in matmuls.

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
#: Rows of the blocks whose entries are computed straight from the formula (the last level).
_DIRECT = 4
#: Children per parent block at each level of the hierarchy.
_SPLIT = 4


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
    # τ (float64), Δ_s, B_s Δ_s, the query/key factor buffers, the batched lower-level product (at most
    # 3/16 · L · T per channel), the direct blocks' float64/float32 temporaries
    return 8 * L + 4 * L + 12 * d_state * L + 4 * (3 * L * T // 16) + 20 * L * _DIRECT


def full_per_channel(dt: Tensor, w: Tensor, A: Tensor, B: Tensor, C: Tensor, out: Tensor) -> None:
    """Write the per-channel α of every channel into ``out`` ``[batch, c, L, L]`` (zeros above the diagonal).

    ``dt``, ``w`` (the ``Δ_s`` factor, or ones): ``[batch, L, c]``; ``A`` ``[c, N]``; ``B``, ``C``
    ``[batch, L, N]``; all float32 (``out`` may be a strided channel slice of a larger tensor).
    """
    b, L, c = dt.shape
    N = A.shape[1]
    if L == 0 or c == 0:
        return
    A3 = A[:, :, None]  # [c, N, 1]
    for bi in range(b):
        tau = torch.cumsum(dt[bi].T, -1, dtype=torch.float64)  # [c, L]
        ctx = _Ctx(out[bi], tau, A3, B[bi], C[bi], w[bi].T.contiguous(), L, N)
        ctx.square(0, 1, L, _sizes(L))


class _Ctx:
    """One prompt's operands, and the recursion over levels of diagonal blocks."""

    def __init__(self, out: Tensor, tau: Tensor, A3: Tensor, B: Tensor, C: Tensor, wT: Tensor, L: int,
                 N: int) -> None:
        self.out, self.tau, self.A3, self.B, self.C, self.wT, self.L, self.N = out, tau, A3, B, C, wT, L, N
        self.bw = (B.T[None] * wT[:, None]).contiguous()  # [c, N, L]: B_s Δ_s
        self.BT, self.CT = B.T.contiguous(), C.T.contiguous()  # [N, L]
        self.c = tau.shape[0]
        self.kbuf = torch.empty(self.c * N * L, device=tau.device)  # key factors of one level step
        self.qbuf = torch.empty(self.c * N * L, device=tau.device)

    def view(self, lo: int, n_par: int, P: int, r0: int, h: int, k0: int, k: int) -> Tensor:
        """``out`` rows ``lo + i·P + r0 + [0, h)`` x keys ``lo + i·P + k0 + [0, k)`` for parents ``i``: ``[c, n_par, h, k]``."""
        o = self.out
        L = self.L
        return o.as_strided((self.c, n_par, h, k), (o.stride(0), P * (L + 1), L, 1),
                            o.storage_offset() + (lo + r0) * L + lo + k0)

    def square(self, lo: int, n_par: int, P: int, sizes: list[int]) -> None:
        """Fill the ``n_par`` back-to-back diagonal blocks of ``P`` rows starting at ``lo`` (lower triangles)."""
        T = next((s for s in sizes if s < P), None)
        if T is None or P <= _DIRECT:
            self.direct(lo, n_par, P)
            return
        rest = [s for s in sizes if s < T]
        for j in range(-(-P // T)):
            r0, h = j * T, min(T, P - j * T)
            if j:
                self.rect(lo, n_par, P, r0, h)
            if r0 + h < P:  # zeros right of the child block
                self.view(lo, n_par, P, r0, h, r0 + h, P - r0 - h).zero_()
        full, rem = divmod(P, T)
        if n_par > 1 and rem:  # never happens: sizes divide each other
            raise AssertionError("block sizes must divide each other")
        self.square(lo, n_par * full, T, rest)
        if rem:
            self.square(lo + full * T, 1, rem, rest)

    def blocks(self, t: Tensor, lo: int, n_par: int, P: int) -> Tensor:
        """``t[..., lo + i·P + j]`` as ``[..., n_par, P]`` (a view)."""
        return t[..., lo:lo + n_par * P].unflatten(-1, (n_par, P))

    def rect(self, lo: int, n_par: int, P: int, r0: int, h: int) -> None:
        """Rows ``[r0, r0+h)`` x keys ``[0, r0)`` of each parent block, one matmul over ``n`` per block; and
        zeros in rows ``[r0, r0+h)`` x keys ``[r0+h, P)``."""
        c, N = self.c, self.N
        tau = self.blocks(self.tau, lo, n_par, P)  # [c, n_par, P] float64
        ref = tau[:, :, r0 - 1, None]  # τ just before the query block: [c, n_par, 1]
        # query factor C_t exp(A (τ_t - τ_{r-1})): [c, n_par, h, N]
        gq = (tau[:, :, r0:r0 + h] - ref).float()
        qf = torch.mul(gq[..., None], self.A3.view(c, 1, 1, N), out=self.qbuf[:c * n_par * h * N].view(c, n_par, h, N))
        qf.clamp_min_(_EXP_FLOOR).exp_().mul_(self.blocks(self.CT, lo, n_par, P)[:, :, r0:r0 + h].permute(1, 2, 0)
                                              .contiguous())
        # key factor B_s Δ_s exp(A (τ_{r-1} - τ_s)), keys s = block start .. r-1: [c, N, n_par, r0]
        gk = (ref - tau[:, :, :r0]).float()
        kf = torch.mul(gk[:, None], self.A3[..., None], out=self.kbuf[:c * n_par * N * r0].view(c, N, n_par, r0))
        kf.clamp_min_(_EXP_FLOOR).exp_().mul_(self.blocks(self.bw, lo, n_par, P)[..., :r0])
        dst = self.view(lo, n_par, P, r0, h, 0, r0)
        if n_par == 1:
            torch.bmm(qf[:, 0], kf[:, :, 0], out=dst[:, 0])  # straight into the output (strided rows)
        else:
            dst.copy_(torch.matmul(qf, kf.transpose(1, 2)))

    def direct(self, lo: int, n_par: int, P: int) -> None:
        """Blocks of ``P`` rows on the diagonal, from the formula: Σ_n C_t B_s exp(A (τ_t - τ_s)) · Δ_s."""
        c, N = self.c, self.N
        t = self.blocks(self.tau, lo, n_par, P)  # [c, n_par, P] float64
        gap = (t[..., :, None] - t[..., None, :]).float().clamp_min_(0)  # [c, n_par, P, P]; s > t masked below
        Cb, Bb = (self.blocks(x, lo, n_par, P) for x in (self.CT, self.BT))  # [N, n_par, P]
        cb = Cb[..., :, None] * Bb[..., None, :]  # [N, n_par, P, P]: C_t[n] B_s[n]
        acc = torch.zeros_like(gap)
        e = torch.empty_like(gap)
        for n in range(N):
            torch.mul(gap, self.A3[:, n].view(c, 1, 1, 1), out=e)
            acc.addcmul_(e.clamp_min_(_EXP_FLOOR).exp_(), cb[n])
        acc.mul_(self.blocks(self.wT, lo, n_par, P)[:, :, None, :])
        acc.masked_fill_(~torch.ones(P, P, dtype=torch.bool, device=acc.device).tril(), 0.0)
        self.view(lo, n_par, P, 0, P, 0, P).copy_(acc)


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
