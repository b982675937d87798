"""Integer indices (layers, heads) from what users pass: ints, NumPy integers, 0-d integer tensors.

Floats, bools and strings are refused with a one-line :class:`InputError` (a float
head such as 1.7 would otherwise be truncated to 1).  ``HEAD_NAME`` reads ``L1H0``.
"""

from __future__ import annotations

import re
from typing import Any

from gather_aggregate.errors import InputError

HEAD_NAME = re.compile(r"^L(\d+)H(\d+)$")


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
