"""The table every head scan returns: :class:`ScanResult`, one row per head, best (largest drop) first.

Rows are tidy dicts: ``layer, head, kind, score, rank, metric_clean, metric_ablated`` and, where the scan has them,
``stderr`` (exact and naive scans with a per-prompt metric) and ``verified`` (an estimate whose shortlist was
re-scored exactly).  In Jupyter a result shows its top rows as a table; ``.to_pandas()`` gives all of them.
"""

from __future__ import annotations

import html
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from gather_aggregate.core.arguments import HEAD_KINDS, count, names, number
from gather_aggregate.core.errors import InputError, NonFiniteError, ProvenanceError
from gather_aggregate.core.indices import HEAD_NAME, as_index
from gather_aggregate.core.protocol import Head
from gather_aggregate.core.provenance import Provenance, model_fingerprint, prompts_fingerprint
from gather_aggregate.core.results_io import read_json, write_table

#: rows shown by ``repr`` and by the Jupyter table
SHOWN_TEXT, SHOWN_HTML = 10, 20


@dataclass(repr=False)
class ScanResult:
    """A tidy table of head scores, best (largest drop) first after ranking."""

    rows: list[dict[str, Any]]
    meta: dict[str, Any] = field(default_factory=dict)
    KIND: ClassVar[str] = "scan"  # its name in a study folder

    def __post_init__(self) -> None:  # a row without a score was a KeyError in .top(); rows="..." a TypeError
        if (problem := table_problem({"meta": self.meta, "rows": self.rows})) is not None:
            cls = NonFiniteError if "not finite" in problem else InputError
            raise cls(f"ScanResult(rows, meta): {problem}; give rows as dicts with layer, head and a finite score")

    @property
    def provenance(self) -> Provenance:
        """Where the scan came from: the model's fingerprint, the prompts' fingerprint and count (and the task,
        names and seed where the table records them)."""
        return Provenance.from_meta(self.meta)

    def check_for(self, model: Any, tokens: Any = None, *, what: str = "scan", fix: str | None = None) -> None:
        """Refuse this scan where it was not made on ``model`` (and, given ``tokens``, on those prompts): a head
        the model lacks, or a recorded fingerprint or prompt count that differs (:class:`ProvenanceError`)."""
        own = set(model.all_heads())
        alien = [hd for hd in self.scores() if hd not in own]  # was silently merged: a scan of another model
        if alien:
            raise ProvenanceError(f"{what} has head L{alien[0][0]}H{alien[0][1]}, which this model does not have: "
                                  f"it was computed on another model; pass a {what} of this model's heads, or none")
        expected = Provenance(model=model_fingerprint(model), prompts=None if tokens is None else
                              prompts_fingerprint(tokens), n=None if tokens is None else int(tokens.shape[0]))
        expected.check(self.provenance, what=what, fix=fix or "scan this model on these prompts (exact_scan(model, "
                       "*task_metric(model, examples))), or pass scan=None")

    def check_ordered(self, what: str = "scan") -> None:
        """Refuse a scan whose scores give no order (fewer than two heads, or every score equal, as a mean
        baseline over one prompt gives): a ranking taken from it would be the head order, not importance."""
        values = {float(r["score"]) for r in self.rows}
        if len(self.rows) >= 2 and len(values) == 1:
            raise InputError(f"{what} ranks nothing: all {len(self.rows)} heads score {values.pop():g} (a mean or "
                             "resample baseline over one prompt, or a metric that ignores the model?); rescan with "
                             "method='zero' or two or more prompts")


    def caption(self) -> str:
        """One line: how many heads, how they were scored, the clean metric."""
        return _caption(self)

    def ranked(self) -> ScanResult:
        rows = sorted(self.rows, key=lambda r: (-r["score"], r["layer"], r["head"]))
        for i, r in enumerate(rows, 1):
            r["rank"] = i
        return ScanResult(rows, self.meta)

    def top(self, k: int, kinds: Sequence[str] | None = None, *, by: str = "score") -> list[Head]:
        """The ``k`` heads of largest ``score`` (``by="score"``: the largest drops), or of largest ``|score|``
        (``by="magnitude"``: the shortlist to take from an estimate, whose sign a saturated softmax can flip;
        ``benchmarks/bench_shortlist.py`` measures both)."""
        if by not in ("score", "magnitude"):
            raise InputError(f"by must be 'score' or 'magnitude', got {by!r}")
        k, kinds = count(k, "k", minimum=0), None if kinds is None else names(kinds, "kinds", HEAD_KINDS)
        rows = [r for r in self.ranked().rows if kinds is None or r["kind"] in kinds]
        if by == "magnitude":
            rows.sort(key=lambda r: (-abs(r["score"]), r["layer"], r["head"]))
        return [(r["layer"], r["head"]) for r in rows[:k]]

    def significant(self, z: float = 2.0, kinds: Sequence[str] | None = None) -> list[Head]:
        """The heads whose drop exceeds ``z`` standard errors over the prompts (``score > z · stderr``), largest
        drop first: the heads this scan tells apart from prompt-to-prompt noise.  Needs an exact or naive scan
        with a per-prompt metric (:func:`gather_aggregate.tasks.task_metric`, :meth:`ReadoutMetric.mean_of`).
        The test is per head: of heads with no effect, about 2.3 % pass ``z = 2`` by chance (normal approximation),
        so on a model of many heads take a larger ``z`` (Bonferroni: ``z = 3.9`` keeps the chance of any false
        pass under 5 % at 1024 heads)."""
        z, kinds = number(z, "z (standard errors)", minimum=0), None if kinds is None else names(kinds, "kinds", HEAD_KINDS)
        if not self.rows or any("stderr" not in r for r in self.rows):
            raise InputError("this scan has no per-prompt standard errors; scan exactly with a per-prompt metric "
                             "(tasks.task_metric, or ReadoutMetric.mean_of) on two or more prompts")
        rows = [r for r in self.ranked().rows if kinds is None or r["kind"] in kinds]
        return [(r["layer"], r["head"]) for r in rows if r["score"] > z * r["stderr"]]

    def score(self, layer: Any, head: Any = None) -> float:
        """The score of ``(layer, head)``; also ``score((1, 2))`` or ``score("L1H2")``."""
        if head is None:
            m = HEAD_NAME.match(layer.strip()) if isinstance(layer, str) else None
            try:
                layer, head = (int(m.group(1)), int(m.group(2))) if m else layer
            except (TypeError, ValueError):
                raise InputError(f"score takes (layer, head), a pair or a name like 'L1H2', got {layer!r}") from None
        hd = (as_index(layer, "layer"), as_index(head, "head"))
        for r in self.rows:
            if (r["layer"], r["head"]) == hd:
                return float(r["score"])
        raise InputError(f"this scan has no row for L{hd[0]}H{hd[1]} (it scanned {len(self.rows)} heads); pass "
                         "one of scan.scores(), or scan that head")

    def to_pandas(self) -> Any:
        """Every row as a ``pandas.DataFrame``, best first, with ``rank, layer, head, kind, score`` leading and the
        scan's ``meta`` in ``.attrs["meta"]``."""
        import pandas as pd

        rows = [dict(r, rank=i) for i, r in enumerate(_best_first(self.rows), 1)]
        lead = [c for c in ("rank", "layer", "head", "kind", "score", "stderr", "verified") if any(c in r for r in rows)]
        rest = [c for c in dict.fromkeys(k for r in rows for k in r) if c not in lead]
        frame = pd.DataFrame(rows, columns=lead + rest)
        frame.attrs["meta"] = dict(self.meta)
        return frame

    def __len__(self) -> int:
        return len(self.rows)

    def __repr__(self) -> str:
        """The caption and the best :data:`SHOWN_TEXT` rows as a text table (all rows: ``.rows``, ``.to_pandas()``)."""
        head, body = _table(self, SHOWN_TEXT)
        widths = [max(len(str(c)) for c in col) for col in zip(head, *body)]
        lines = ["  ".join(str(c).rjust(w) for c, w in zip(row, widths)).rstrip() for row in (head, *body)]
        more = len(self.rows) - len(body)
        tail = [f"... {more} more heads (.rows, .to_pandas())"] if more > 0 else []
        return "\n".join([f"ScanResult: {_caption(self)}", *lines, *tail])

    __str__ = __repr__

    def _repr_html_(self) -> str:
        """Jupyter's view: the caption and the best :data:`SHOWN_HTML` rows as an HTML table."""
        head, body = _table(self, SHOWN_HTML)
        rows = "".join(_html_row(r, "td") for r in body)
        more = len(self.rows) - len(body)
        tail = f"<p>... {more} more heads (<code>.rows</code>, <code>.to_pandas()</code>)</p>" if more > 0 else ""
        return (f"<p><b>ScanResult</b>: {html.escape(_caption(self))}</p>"
                f"<table><thead>{_html_row(head, 'th')}</thead><tbody>{rows}</tbody></table>{tail}")

    def scores(self) -> dict[Head, float]:
        return {(r["layer"], r["head"]): float(r["score"]) for r in self.rows}

    def save(self, path: str | Path) -> Path:
        return write_table(self.rows, path, self.meta)

    @classmethod
    def load(cls, path: str | Path) -> ScanResult:
        """A table written by :meth:`save` (or a scan's ``out=``); anything else is one :class:`InputError`."""
        path = Path(path)
        data = read_json(path, InputError, f"no scan file at {str(path)!r}; pass the scan.json a scan wrote",
                         "rerun the scan that wrote it")
        problem = table_problem(data)
        if problem:
            raise InputError(f"{str(path)!r} is not a scan table ({problem}); pass the scan.json a scan wrote, or "
                             "rerun the scan that wrote it")
        return cls(data["rows"], data.get("meta", {}))


def scan_provenance(model: Any, tokens: Any) -> dict[str, Any]:
    """The provenance meta every scan records: the model's fingerprint and the prompts' fingerprint and count."""
    return Provenance(model=model_fingerprint(model), prompts=prompts_fingerprint(tokens),
                      n=int(tokens.shape[0])).to_meta()


def table_problem(data: Any) -> str | None:
    """What keeps ``data`` from being a scan table ``{"meta": {...}, "rows": [{layer, head, score, ...}]}``."""
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list) \
            or not isinstance(data.get("meta", {}), dict):
        return 'expected a JSON object {"meta": {...}, "rows": [...]}'
    seen: dict[tuple[Any, ...], int] = {}
    for i, r in enumerate(data["rows"]):
        if not isinstance(r, dict) or any(k not in r for k in ("layer", "head", "score")):
            return f"row {i} lacks layer, head or score"
        for k in ("layer", "head"):
            if isinstance(r[k], bool) or not isinstance(r[k], numbers.Integral) or r[k] < 0:
                return f"row {i}'s {k} is {r[k]!r}, not an index >= 0"
        where = f"row {i} (L{r['layer']}H{r['head']})"
        for k in ("score", "stderr", "metric_clean", "metric_ablated"):
            v = r.get(k)
            if v is None and k != "score":
                continue
            if isinstance(v, bool) or not isinstance(v, numbers.Real):
                return f"{where}'s {k} is {v!r}, not a number"
            if not math.isfinite(v):
                return f"{where}'s {k} is {v}, not finite"
        key = (r["layer"], r["head"], r.get("position"))  # patching tables have a row per head and position
        if key in seen:  # a ranking would name the head twice, and scores() keep one of the two
            return f"{where} repeats row {seen[key]}"
        seen[key] = i
    return None


def _best_first(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` in rank order (largest drop first, ties by layer and head), without touching them."""
    return sorted(rows, key=lambda r: (-r["score"], r["layer"], r["head"]))


def _caption(result: ScanResult) -> str:
    """How many heads, how they were scored, and the clean metric: ``16 heads, exact, zero ablation, ...``."""
    m = result.meta
    parts = [f"{len(result.rows)} heads"]
    if m.get("mode"):
        parts.append(str(m["mode"]) + (f" (top {m['verified']} re-scored exactly)" if m.get("verified") else ""))
    if m.get("method"):
        parts.append(f"{m['method']} ablation")
    if isinstance(m.get("metric_clean"), (int, float)):
        parts.append(f"clean metric {m['metric_clean']:.4g}")
    return ", ".join(parts)


def _table(result: ScanResult, n: int) -> tuple[list[str], list[list[str]]]:
    """Header and the best ``n`` rows as strings: rank, head, kind, drop (± its standard error), exact or not."""
    rows = _best_first(result.rows)[:n]
    has_se, has_verified = any("stderr" in r for r in rows), any("verified" in r for r in rows)
    head = ["rank", "head", "kind", "drop"] + (["± stderr"] if has_se else []) + (["exact"] if has_verified else [])
    body = []
    for i, r in enumerate(rows, 1):
        line = [str(i), f"L{r['layer']}H{r['head']}", str(r.get("kind", "")), f"{float(r['score']):+.4f}"]
        if has_se:
            line.append("" if r.get("stderr") is None else f"{float(r['stderr']):.4f}")
        if has_verified:
            line.append("yes" if r.get("verified") else "")
        body.append(line)
    return head, body


def _html_row(cells: list[str], tag: str) -> str:
    return "<tr>" + "".join(f"<{tag}>{html.escape(c)}</{tag}>" for c in cells) + "</tr>"
