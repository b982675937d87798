"""Tidy tables in, validated lists of dicts out (no pandas needed).

A tidy table is a list of dicts, one per row (``[{"layer": 0, "head": 1, ...}]``).
For convenience the figure functions also accept a column dict
(``{"layer": [...], "head": [...]}``), an object with a ``rows`` attribute (a
scan result) or anything with ``to_dict("records")`` (a pandas DataFrame).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from gather_aggregate.core.errors import InputError

Rows = list[dict[str, Any]]


def as_rows(table: Any, *, what: str = "table") -> Rows:
    """Normalise a tidy table to a list of dicts (copies; the caller's data is not touched)."""
    if hasattr(table, "rows") and not isinstance(table, Mapping):
        table = table.rows
    elif hasattr(table, "to_dict") and not isinstance(table, Mapping):
        table = table.to_dict("records")
    if isinstance(table, Mapping):
        cols = {k: list(v) for k, v in table.items()}
        lengths = {len(v) for v in cols.values()}
        if len(lengths) > 1:
            raise InputError(f"{what}: the columns have different lengths {sorted(lengths)}; pass equal-length columns")
        n = lengths.pop() if lengths else 0
        return [{k: v[i] for k, v in cols.items()} for i in range(n)]
    if isinstance(table, (str, bytes)) or not isinstance(table, Sequence):
        raise InputError(f"{what} must be a list of dicts (one per row) or a dict of columns, got "
                         f"{type(table).__name__}")
    rows = []
    for i, r in enumerate(table):
        if not isinstance(r, Mapping):
            raise InputError(f"{what}: row {i} is a {type(r).__name__}, not a dict; pass one dict per row")
        rows.append(dict(r))
    return rows


def require(rows: Rows, columns: Sequence[str], *, what: str = "table") -> None:
    """Raise unless every row has every column."""
    if not rows:
        raise InputError(f"{what} is empty; pass at least one row")
    for i, r in enumerate(rows):
        missing = [c for c in columns if c not in r]
        if missing:
            raise InputError(f"{what}: row {i} lacks column(s) {missing} (it has {sorted(r)}); "
                             f"every row needs {list(columns)}")


def number(value: Any, *, column: str, row: int, what: str = "table", allow_missing: bool = False) -> float | None:
    """A finite float from a cell; ``None``/NaN are 'missing' when allowed."""
    if value is None:
        if allow_missing:
            return None
        raise InputError(f"{what}: row {row} has no value in column {column!r}; fill it in or drop the row")
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{what}: row {row}, column {column!r} is {value!r}, not a number") from None
    if math.isnan(x):
        if allow_missing:
            return None
        raise InputError(f"{what}: row {row}, column {column!r} is NaN; fill it in or drop the row")
    if math.isinf(x):
        raise InputError(f"{what}: row {row}, column {column!r} is infinite; check the computation that made it")
    return x


def integer(value: Any, *, column: str, row: int, what: str = "table") -> int:
    """A non-negative int from a cell (layer and head indices)."""
    x = value.item() if hasattr(value, "item") else value
    if isinstance(x, float) and x.is_integer():
        x = int(x)
    if isinstance(x, bool) or not isinstance(x, int):
        raise InputError(f"{what}: row {row}, column {column!r} is {value!r}, not an integer")
    if x < 0:
        raise InputError(f"{what}: row {row}, column {column!r} is {x}; layer and head indices are non-negative")
    return x


def fmt(value: Any) -> str:
    """Short human formatting of a cell for hover text and HTML tables."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "—"
        return f"{value:.4g}"
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return fmt(value.item())
    return str(value)
