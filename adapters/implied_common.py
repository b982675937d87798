"""What the Mamba-1 and Mamba-2 implied-attention modules share: input checks, the float64 segment sum and
the memory-budget error.  The math is in :mod:`gather_aggregate.adapters.implied`."""

from __future__ import annotations

import mmap
import sys
from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

from gather_aggregate.core.errors import IndexOutOfRangeError, InputError, MemoryBudgetError

Reduce = Literal["mean", "abs_mean", "sum"]
DEFAULT_MAX_BYTES = 2 * 1024**3
_GiB = 1024**3


def _segsum(a: Tensor) -> Tensor:
    """``[..., t, s] = Σ_{k=s+1..t} a[k]`` for ``s ≤ t``, ``-inf`` above the diagonal (float64 cumsum)."""
    cs = torch.cumsum(a.double(), -1)
    out = cs[..., :, None] - cs[..., None, :]
    L = a.shape[-1]
    return out.masked_fill(~torch.ones(L, L, dtype=torch.bool, device=a.device).tril(), float("-inf"))


#: Outputs from this size on come from :func:`mapped_zeros`' own mapping (below it, :func:`torch.zeros`).
_MAPPED_BYTES = 4 * 1024**2


def mapped_zeros(shape: tuple[int, ...], device: torch.device) -> Tensor:
    """A float32 tensor of zeros for an output that is then written (in part) by the caller.

    On Linux CPU, for :data:`_MAPPED_BYTES` or more, a fresh anonymous mapping whose pages the kernel hands
    out zeroed, all at once (``MAP_POPULATE``): no zeroing pass in user space, so a caller that leaves most
    entries at zero (the per-channel matrix above its diagonal) does not write them, and one system call
    instead of a page fault per 4 KiB in the middle of the caller's kernels (measured 5-10% of the per-channel
    full matrix at d_inner 512, L 256).  Its storage is the mapping's, so it cannot be resized.  Transparent
    huge pages (``MADV_HUGEPAGE``) were measured and left out: on the 2-core benchmark VM they made the first
    touch of a 134 MB output 2x faster in most calls but 3-6x slower in some (the kernel finding and zeroing
    2 MiB pages).  Elsewhere :func:`torch.zeros`.
    """
    n = 4
    for s in shape:
        n *= s
    if device.type != "cpu" or n < _MAPPED_BYTES or not sys.platform.startswith("linux"):
        return torch.zeros(shape, device=device)
    buf = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0))
    return torch.frombuffer(buf, dtype=torch.float32).view(shape)  # the tensor keeps the mapping alive


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
