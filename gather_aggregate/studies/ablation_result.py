"""Ablation's saved result: :class:`AblationResult`, one row per (task, heads removed, method) with the accuracy
clean and ablated.  A study keeps every ablation it ran: :meth:`AblationResult.merged` adds new rows and replaces
only the rows of the same task, heads and method."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from gather_aggregate.core.protocol import Head
from gather_aggregate.core.typed_result import TableResult


def heads_label(heads: Sequence[Sequence[int]]) -> str:
    return " ".join(f"L{la}H{h}" for la, h in heads) or "-"


@dataclass(repr=False)
class AblationResult(TableResult):
    """Accuracy clean and with heads ablated, per task and head set."""

    KIND: ClassVar[str] = "ablate"
    SHOWN_COLUMNS: ClassVar[Sequence[str]] = ("task", "heads", "method", "clean", "ablated", "change")

    @classmethod
    def of(cls, res: Mapping[str, Any], method: str, meta: dict[str, Any] | None = None) -> AblationResult:
        """From :func:`~gather_aggregate.studies.ablation_tables.remove_only`'s dict."""
        heads: list[Head] = [(int(la), int(h)) for la, h in res["heads"]]
        rows = [{"task": t, "heads": heads_label(heads), "head_list": [list(h) for h in heads], "method": method,
                 "clean": float(res["clean"][t]), "ablated": float(res["ablated"][t]),
                 "change": float(res["ablated"][t]) - float(res["clean"][t])} for t in res["clean"]]
        return cls(rows, dict(meta or {}))

    def merged(self, new: AblationResult) -> AblationResult:
        """This result's rows with ``new``'s added (a row of the same task, heads and method is replaced)."""
        def key(r: Mapping[str, Any]) -> tuple[Any, ...]:
            return r["task"], r["heads"], r["method"]

        fresh = {key(r) for r in new.rows}
        return AblationResult([r for r in self.rows if key(r) not in fresh] + list(new.rows), {**self.meta, **new.meta})

    def caption(self) -> str:
        p = self.provenance
        on = f" ({p.model_name} on {p.task_name})" if p.model_name else ""
        return f"{len(self.rows)} ablations{on}"
