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
keys (and channels) so that memory stays O(D·N·chunk) whatever L is; the sum over ``n`` is one batched
matmul per chunk (``[rows, N] @ [N, keys]`` per channel).
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
#: :mod:`.implied_mamba1`, which has less per-chunk overhead; measured crossover, see docs/benchmarks.md).
ROWS_LONG = 4096
#: Channels per tile and keys per chunk of the row path: a chunk of exps is ``[channels, N, keys]`` (~2 MiB).
_ROW_CHANNELS = 128
_ROW_KEYS = 256


def rows_per_channel(dt: Tensor, dt_scaling: bool, A: Tensor, B: Tensor, C: Tensor, rows: Tensor,
                     out: Tensor) -> None:
    """Write the query rows ``rows`` ``[batch, R]`` of every channel's α into ``out`` ``[batch, c, R, L]``.

    ``dt`` ``[batch, L, c]``, ``A`` ``[c, N]``, ``B``, ``C`` ``[batch, L, N]``, float32.  For query ``t``
    and a tile of channels, keys are visited backwards from ``t`` in chunks of :data:`_ROW_KEYS`; the
    gap ``τ_t - τ_s = Σ_{k=s+1..t} Δ_k`` is a float64 sum carried from chunk to chunk, and the decays of
    state index ``n`` are computed only while some channel of the tile still has
    ``A[d, n] (τ_t - τ_s) ≥ -87`` at the chunk's nearest key.  Gaps only grow backwards, so a state
    index that has died for the tile stays dead, and once all have, the remaining keys are zeros (the
    other paths floor such decays at ``exp(-87) ≈ 1.6e-38``: a difference of that size).  Channels are
    tiled in order of how fast they decay, so that a tile dies together.  Memory: the output plus
    :func:`rows_per_channel_bytes`, whatever L is.
    """
    b, L, c = dt.shape
    N = A.shape[1]
    slowest = A.max(1).values.double()  # [c]: each channel's slowest decay rate
    buf = torch.empty(min(c, _ROW_CHANNELS) * N * _ROW_KEYS, device=dt.device)
    for bi in range(b):
        rr = [int(x) for x in rows[bi]]
        out[bi].zero_()
        tau_rows = _tau_at(dt[bi], rr)  # [R, c]
        for r, t in enumerate(rr):
            order = torch.argsort(slowest * tau_rows[r].double())  # fastest-decaying channels first
            A_p = A.index_select(0, order)  # [c, N]
            TC = _ROW_CHANNELS
            n_tiles = -(-c // TC)
            carry = torch.zeros(c, 1, dtype=torch.float64, device=dt.device)  # Σ_{k=s1..t} Δ_k per channel
            alive = [list(range(N)) for _ in range(n_tiles)]
            first = 0  # tiles before this one are dead (they die in order, fastest first)
            for s1 in range(t + 1, 0, -_ROW_KEYS):
                s0, k = max(0, s1 - _ROW_KEYS), min(s1, _ROW_KEYS)
                while first < n_tiles and not alive[first]:
                    first += 1
                if first == n_tiles:
                    break
                lo = first * TC
                d_T = dt[bi, s0:s1].index_select(1, order[lo:]).T  # [c - lo, k]: Δ in tile order
                cs = torch.empty(c - lo, k, dtype=torch.float64, device=dt.device).copy_(d_T).cumsum_(1)
                g64 = torch.sub(cs[:, -1:] + carry[lo:], cs, out=cs)  # τ_t - τ_s for s in [s0, s1)
                carry[lo:] = g64[:, :1] + d_T[:, :1]
                g = g64.float()
                near = A_p[lo:] * g[:, -1:]  # [c - lo, N]: each channel's largest exponent per n in the chunk
                pad = (n_tiles - first) * TC - (c - lo)
                if pad:
                    near = torch.cat([near, near.new_full((pad, N), float("-inf"))])
                near_t = near.view(n_tiles - first, TC, N).amax(1).tolist()
                for i in range(first, n_tiles):
                    alive[i] = [n for n in alive[i] if near_t[i - first][n] >= _EXP_FLOOR]
                    if not alive[i]:
                        continue  # every decay of the tile is below exp(-87) from here back to key 0
                    c0, c1 = i * TC, min(c, (i + 1) * TC)
                    g_t = g[c0 - lo:c1 - lo]
                    na, tc = len(alive[i]), c1 - c0
                    A_a = (A_p[c0:c1] if na == N else A_p[c0:c1, alive[i]]).T  # [n_alive, tc]
                    e = torch.mul(g_t, A_a[:, :, None], out=buf[:na * tc * k].view(na, tc, k))  # [n_alive, tc, k]
                    if float(A_a.min()) * float(g_t[:, 0].max()) < _EXP_FLOOR:
                        e.clamp_min_(_EXP_FLOOR)
                    cb = C[bi, t, alive[i], None] * B[bi, s0:s1, alive[i]].T  # [n_alive, k]: C_t[n] B_s[n]
                    row = e.exp_().mul_(cb[:, None, :]).sum(0)  # [tc, k]
                    if dt_scaling:
                        row *= d_T[c0 - lo:c1 - lo]
                    out[bi, :, r, s0:s1].index_copy_(0, order[c0:c1], row)


def _tau_at(dt: Tensor, rows: list[int]) -> Tensor:
    """τ_t = Σ_{k≤t} Δ_k at the positions ``rows`` (``dt`` ``[L, c]``): ``[R, c]``, float32 (it only orders
    the channels; the gaps themselves are float64 sums)."""
    ones = torch.ones(1, dt.shape[0], dtype=dt.dtype, device=dt.device)
    return torch.cat([ones[:, :t + 1] @ dt[:t + 1] for t in rows])
