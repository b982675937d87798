"""The report's lm-eval sections: the wide table of tasks x heads removed, and the run's settings.

``gather-aggregate lm-eval`` prints the same table (:mod:`gather_aggregate.lm_eval.schedule` imports it from here).
"""

from __future__ import annotations

from typing import Any


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """Wide table: one line per (task, format), one column per setting (``value (rel %)``)."""
    labels = list(dict.fromkeys(r["setting"] for r in rows))
    keys = list(dict.fromkeys((r["task"], r["format"], r["metric"]) for r in rows))
    cell = {(r["task"], r["format"], r["setting"]): r for r in rows}
    lines = ["| task | format | metric | " + " | ".join(labels) + " |", "|---" * (3 + len(labels)) + "|"]
    for task, fmt, metric in keys:
        parts = []
        for label in labels:
            r = cell.get((task, fmt, label))
            if r is None:
                parts.append("")
                continue
            rel = r["rel_change"]
            rel_txt = "" if rel is None or label == labels[0] else f" ({rel:+.0%})"
            parts.append(f"{r['value']:.3g}{rel_txt}")
        lines.append(f"| {task} | {fmt} | {metric.split(',')[0]} | " + " | ".join(parts) + " |")
    return "\n".join(lines) + "\n"


def report_sections(data: dict[str, Any]) -> list[Any]:
    """Report sections for a written ``lm_eval.json``: the wide table and the run's settings."""
    from gather_aggregate.report.html import KeyValues, Markdown

    rows = data.get("rows", [])
    meta = data.get("meta", {})
    return [Markdown(markdown_table(rows), title="lm-eval: tasks x heads removed"),
            KeyValues({k: str(v) for k, v in meta.items()}, title="lm-eval settings")]
