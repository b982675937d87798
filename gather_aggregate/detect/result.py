"""The detector's saved result: :class:`DetectionResult`, one row per head (the :class:`GAHeads` table) with the
named heads, pairs, group losses and provenance in its meta.

:meth:`DetectionResult.cards` is the short reading of it: one card per named head with the few numbers that
named it (``docs/glossary.md`` defines each): its **pattern share** (the detector's own mass where it read: a
Gather head's segment rows on their own segment, ``gather_mass``; an Aggregate head's query row on the correct
segment, ``aggregate_on_correct``), its **loss alone** (``gather_alone`` / ``aggregate_alone``: the retrieval
margin lost when only it is ablated at the role's positions), its role's **group loss** (``joint_drop``) and the
rule's sentence.  The full table (every column of :data:`~gather_aggregate.detect.detector.DECISION_COLUMNS` and
the pattern scores) stays in ``rows``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from gather_aggregate.core.protocol import Head
from gather_aggregate.core.typed_result import TableResult, _cell

#: each role's pattern share column (the detector's own reading) and its loss-alone column
SHARE = {"gather": "gather_mass", "aggregate": "aggregate_on_correct"}
ALONE = {"gather": "gather_alone", "aggregate": "aggregate_alone"}


def _heads(value: Any) -> list[Head]:
    return [(int(h[0]), int(h[1])) for h in value or []]


@dataclass(repr=False)
class DetectionResult(TableResult):
    """Named Gather / Aggregate heads and the per-head table behind them (``find_ga_heads``' result, saved)."""

    KIND: ClassVar[str] = "detect"

    @classmethod
    def of(cls, ga: Any, meta: dict[str, Any] | None = None) -> DetectionResult:
        """From :func:`~gather_aggregate.detect.detector.find_ga_heads`' :class:`GAHeads`, with ``meta`` (the
        provenance, the scan it used) added."""
        return cls([dict(r) for r in ga.table], {**ga.summary(), **(meta or {})})

    @property
    def gather(self) -> list[Head]:
        return _heads(self.meta.get("gather"))

    @property
    def aggregate(self) -> list[Head]:
        return _heads(self.meta.get("aggregate"))

    @property
    def pairs(self) -> list[tuple[Head, Head]]:
        return [(tuple(g), tuple(a)) for g, a in self.meta.get("pairs", [])]  # type: ignore[misc]

    @property
    def evidence(self) -> dict[Head, str]:
        return {(int(la), int(h)): str(ev) for la, h, ev in self.meta.get("evidence", [])}

    @property
    def group_loss(self) -> dict[str, float]:
        """Each role's group loss: the share of the retrieval margin lost when its named heads are ablated
        together at the role's positions (1 = retrieval taken to chance)."""
        return dict(self.meta.get("joint_drop") or {})

    def ga_heads(self) -> list[Head]:
        """Aggregate heads first, then Gather heads (each once): the set ``Study.ablate()`` removes by default."""
        from gather_aggregate.detect.detector import aggregate_then_gather

        return aggregate_then_gather(self.aggregate, self.gather)

    def cards(self) -> list[dict[str, Any]]:
        """One card per named head: role, evidence, pattern share, loss alone, group loss and the rule."""
        by = {(int(r["layer"]), int(r["head"])): r for r in self.rows}
        loss = self.group_loss
        cards = []
        for role in ("gather", "aggregate"):
            for hd in getattr(self, role):
                r = by.get(hd, {})
                cards.append({"head": f"L{hd[0]}H{hd[1]}", "role": role, "evidence": self.evidence.get(hd, ""),
                              "pattern share": r.get(SHARE[role]), "loss alone": r.get(ALONE[role]),
                              "group loss": loss.get(role), "why": r.get("rule", "")})
        return cards

    def caption(self) -> str:
        def names(heads: list[Head]) -> str:
            return " ".join(f"L{la}H{h}" for la, h in heads) or "none"

        p = self.provenance
        on = f" ({p.model_name} on {p.task_name})" if p.model_name else ""
        return f"Gather {names(self.gather)}, Aggregate {names(self.aggregate)}, {len(self.pairs)} pairs{on}"

    def _shown(self) -> tuple[list[str], list[list[str]]]:
        cards = self.cards()
        head = ["head", "role", "evidence", "pattern share", "loss alone", "group loss"]
        return head, [[_cell(c[k]) for k in head] for c in cards]
