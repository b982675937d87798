"""Integer indices (layers, heads, query rows) from what users pass: ints, NumPy integers, 0-d integer tensors.

Floats, bools and strings are refused with a one-line :class:`InputError` (a float
head such as 1.7 would otherwise be truncated to 1).  ``HEAD_NAME`` reads ``L1H0``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gather_aggregate.core.errors import IndexOutOfRangeError, InputError

if TYPE_CHECKING:  # pragma: no cover
    from jaxtyping import Int
    from torch import Tensor

HEAD_NAME = re.compile(r"^L(\d+)H(\d+)$", re.IGNORECASE)


def is_index(x: Any) -> bool:
    """Whether ``x`` is an integer index (see :func:`as_index`)."""
    try:
        as_index(x, "index")
    except InputError:
        return False
    return True


def as_index(x: Any, what: str) -> int:
    """An int from an int, a NumPy integer or a 0-d integer tensor; floats, bools and strings are refused
    (a float head such as 1.7 would otherwise be truncated to 1)."""
    import operator

    if isinstance(x, bool) or isinstance(x, float) or isinstance(x, str):
        raise InputError(f"{what} must be an integer, got {x!r}; pass whole numbers such as 0, 1, 2")
    if hasattr(x, "dim") and x.dim() == 0 and not x.dtype.is_floating_point and str(x.dtype) != "torch.bool":
        return int(x.item())
    try:
        return operator.index(x)
    except TypeError:
        raise InputError(f"{what} must be an integer, got {x!r} ({type(x).__name__})") from None


def layer_bound(value: int | None, name: str, n_layers: int) -> int | None:
    """``start_at_layer`` / ``stop_at_layer`` (``name``) as a layer in ``[0, n_layers]``; ``None`` stays ``None``.

    ``-n_layers <= value <= n_layers``; a negative value counts from the end.
    """
    if value is None:
        return None
    n = n_layers
    if not isinstance(value, int) or isinstance(value, bool) or not -n <= value <= n:
        raise InputError(f"{name}={value!r} is out of range: use an int in [-{n}, {n}] (this model has {n} layers)")
    return value % n if value < 0 else value


def resolve_rows(rows: Any, batch: int, seq_len: int, device: Any = None) -> Int[Tensor, "batch n_rows"] | None:
    """Normalise a ``rows`` argument to a ``[batch, n_rows]`` LongTensor (or ``None`` = all rows).

    Negative positions count from the end, like Python indexing.
    """
    import torch

    if rows is None:
        return None
    if isinstance(rows, (str, bytes)):
        raise InputError(f"rows must be an int, a list of ints or an integer tensor of query positions, got {rows!r}")
    if isinstance(rows, torch.Tensor):
        if rows.is_floating_point() or rows.is_complex() or rows.dtype == torch.bool:
            raise InputError(f"rows must hold integer query positions, got a {rows.dtype} tensor; pass a LongTensor "
                             "(e.g. batch.query_pos), not a mask or floats")
        if rows.numel() == 0:
            raise InputError("rows is empty; pass rows=None for every query position")
    elif not isinstance(rows, Sequence) and not hasattr(rows, "tolist"):
        rows = as_index(rows, "rows")
    if isinstance(rows, int):
        r = torch.tensor([[rows]] * batch, dtype=torch.long)
    elif isinstance(rows, torch.Tensor):
        r = rows.long()
        if r.dim() == 0:
            r = r.view(1, 1).expand(batch, 1)
        elif r.dim() == 1:
            r = r.view(1, -1).expand(batch, -1)
        elif r.dim() != 2 or r.shape[0] != batch:
            raise InputError(f"rows tensor must be [n_rows] or [batch={batch}, n_rows], got {tuple(r.shape)}")
    else:
        vals = [as_index(x, "row") for x in (rows.tolist() if hasattr(rows, "tolist") else rows)]
        if not vals:
            raise InputError("rows is empty; pass rows=None for every query position")
        r = torch.tensor(vals, dtype=torch.long).view(1, -1).expand(batch, -1)
    r = torch.where(r < 0, r + seq_len, r)
    if (r < 0).any() or (r >= seq_len).any():
        raise IndexOutOfRangeError(
            f"query row(s) out of range for a prompt of {seq_len} tokens: got {sorted(set(r.flatten().tolist()))}"
        )
    return r.to(device) if device is not None else r
