"""The shape every saved result shares: ``rows`` (one dict per head, prompt or task) and ``meta`` (how it was made,
with its :class:`~gather_aggregate.core.provenance.Provenance`), saved as a JSON table with a CSV twin.

A result type subclasses :class:`TableResult` with its ``KIND`` (the ``meta["kind"]`` it is saved under and the
name of its file in a study folder: ``detect`` → ``detect.json``) and, where its rows are not its whole state,
:meth:`TableResult.from_table`.  It then has :meth:`save` / :meth:`load` (atomic; a file of another kind is refused
in one line), :meth:`to_pandas`, a text ``repr`` and a Jupyter view of its first rows, and :attr:`provenance`.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from gather_aggregate.core.errors import InputError
from gather_aggregate.core.provenance import Provenance
from gather_aggregate.core.results_io import read_json, write_table

T = TypeVar("T", bound="TableResult")

#: rows shown by ``repr`` and by the Jupyter table
SHOWN = 12


@dataclass(repr=False)
class TableResult:
    """Rows and meta, saved and read back as one JSON table (+ CSV)."""

    rows: list[dict[str, Any]]
    meta: dict[str, Any] = field(default_factory=dict)

    KIND: ClassVar[str] = "result"
    #: the columns ``repr`` and the Jupyter view show (default: every column of the first row)
    SHOWN_COLUMNS: ClassVar[Sequence[str]] = ()

    @property
    def provenance(self) -> Provenance:
        """Where this result came from (model, task, n, seed), as recorded in its meta."""
        return Provenance.from_meta(self.meta)

    def caption(self) -> str:
        """One line: what this result is (overridden by each type)."""
        p = self.provenance
        return f"{len(self.rows)} rows" + (f", {p.model_name} on {p.task_name}" if p.model_name else "")

    def save(self, path: str | Path) -> Path:
        """Write ``path`` (.json) and its ``.csv`` twin atomically, ``meta["kind"]`` included."""
        return write_table(self.rows, path, {**self.meta, "kind": self.KIND})

    @classmethod
    def from_table(cls: type[T], rows: list[dict[str, Any]], meta: dict[str, Any]) -> T:
        return cls(rows, meta)

    @classmethod
    def load(cls: type[T], path: str | Path) -> T:
        """A table written by :meth:`save`; a missing file, bad JSON or a table of another kind is one
        :class:`InputError` naming the fix."""
        return cls.from_table(*read_table(path, cls.KIND))

    def to_pandas(self) -> Any:
        """Every row as a ``pandas.DataFrame``; the meta in ``.attrs["meta"]``."""
        import pandas as pd

        frame = pd.DataFrame(self.rows)
        frame.attrs["meta"] = dict(self.meta)
        return frame

    def __len__(self) -> int:
        return len(self.rows)

    def _shown(self) -> tuple[list[str], list[list[str]]]:
        cols = list(self.SHOWN_COLUMNS) or (list(self.rows[0]) if self.rows else [])
        cols = [c for c in cols if any(c in r for r in self.rows)]
        return cols, [[_cell(r.get(c, "")) for c in cols] for r in self.rows[:SHOWN]]

    def __repr__(self) -> str:
        head, body = self._shown()
        widths = [max(len(c) for c in col) for col in zip(head, *body)]
        lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)).rstrip() for row in (head, *body)]
        more = len(self.rows) - len(body)
        tail = [f"... {more} more rows (.rows, .to_pandas())"] if more > 0 else []
        return "\n".join([f"{type(self).__name__}: {self.caption()}", *lines, *tail])

    __str__ = __repr__

    def _repr_html_(self) -> str:
        head, body = self._shown()
        return html_table(type(self).__name__, self.caption(), head, body, len(self.rows))


def read_table(path: str | Path, kind: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The rows and meta of a ``kind`` result saved at ``path`` (one :class:`InputError` naming the fix if not)."""
    path = Path(path)
    data = read_json(path, InputError, f"no {kind} result at {str(path)!r}; run the step that writes it "
                     f"(`gather-aggregate {kind}`) or pass its file", "rerun the step that wrote it")
    meta = data.get("meta") if isinstance(data, dict) else None
    if not isinstance(meta, dict) or not isinstance(data.get("rows"), list):
        raise InputError(f"{str(path)!r} is not a {kind} result (expected {{\"meta\": ..., \"rows\": [...]}}); "
                         "rerun the step that wrote it")
    if meta.get("kind", kind) != kind:
        raise InputError(f"{str(path)!r} holds a {meta['kind']} result, not a {kind} result; pass the {kind}.json "
                         "of a study")
    return data["rows"], meta


def html_table(name: str, caption: str, head: list[str], body: list[list[str]], total: int) -> str:
    """A result's Jupyter view: its name and caption, then ``body`` under ``head`` (``total`` rows in all)."""
    def row(cells: list[str], tag: str) -> str:
        return "<tr>" + "".join(f"<{tag}>{html.escape(c)}</{tag}>" for c in cells) + "</tr>"

    more = total - len(body)
    tail = f"<p>... {more} more rows (<code>.rows</code>, <code>.to_pandas()</code>)</p>" if more > 0 else ""
    return (f"<p><b>{html.escape(name)}</b>: {html.escape(caption)}</p><table><thead>{row(head, 'th')}</thead>"
            f"<tbody>{''.join(row(r, 'td') for r in body)}</tbody></table>{tail}")


def _cell(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return "" if v is None else str(v)
    if isinstance(v, float):
        return f"{v:.4f}"
    if isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(x, int) for x in v):
        return f"L{v[0]}H{v[1]}"
    return str(v)
