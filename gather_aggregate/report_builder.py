"""``gather-aggregate report``: one HTML report from the JSON files other subcommands wrote.

Reads whatever is present in a results directory — ``eval.json``, ``scan.json``,
``detect.json``, ``ablate.json``, ``pattern.json``, ``lm_eval.json``, ``summary.json`` — and turns
each into report sections.  Unknown files are ignored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gather_aggregate.errors import InputError


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise InputError(f"{path} is not valid JSON ({exc}); rerun the subcommand that wrote it") from None


def build_report_from_dir(results: Path, out: Path) -> Path:
    import torch

    from gather_aggregate.report import Figure, KeyValues, Table, write_report
    from gather_aggregate.viz import attention_heads, head_score_heatmaps

    sections: list[Any] = []
    found = []
    for f in sorted(results.rglob("*.json")):
        name = f.stem
        data = _read(f)
        if name == "eval":
            found.append(f)
            sections.append(KeyValues({"model": data.get("model"), "task": data.get("task"), "n": data.get("n"),
                                       "accuracy": round(float(data.get("accuracy", float("nan"))), 4)},
                                      title=f"Evaluation ({f.parent.name})"))
        elif name.startswith("scan") and "rows" in data:
            found.append(f)
            rows = data["rows"]
            sections.append(Figure(head_score_heatmaps(rows, ("score",), titles=["ablation drop"]),
                                   title=f"Head scan: {f.relative_to(results)}"))
            sections.append(Table(rows[:20], title=f"Top heads: {f.relative_to(results)}"))
        elif name == "detect" and "rows" in data:
            found.append(f)
            cols = [c for c in ("ablation_drop", "gather", "aggregate") if c in data["rows"][0]]
            sections.append(Figure(head_score_heatmaps(data["rows"], cols), title="Gather / Aggregate scores"))
            meta = data.get("meta", {})
            sections.append(KeyValues({k: str(v) for k, v in meta.items() if k not in ("decisions", "groups")},
                                      title="Detected heads"))
            if meta.get("decisions"):  # the numbers behind each head's decision and the rule that made it
                sections.append(Table([{k: v for k, v in r.items()} for r in meta["decisions"]],
                                      title="Why each head was named or left out"))
        elif name == "ablate":
            found.append(f)
            sections.append(KeyValues({"heads": str(data.get("heads")), "clean": str(data.get("clean")),
                                       "ablated": str(data.get("ablated"))}, title="Ablation"))
        elif name == "lm_eval" and "rows" in data:
            from gather_aggregate.lm_eval.schedule import report_sections

            found.append(f)
            sections.extend(report_sections(data))
        elif name == "pattern":
            found.append(f)
            pat = torch.tensor(data["pattern"])
            sections.append(attention_heads(pat, data["tokens"], layer=data["layer"],
                                            heads=data["heads"], title=f"Layer {data['layer']} ({data['kind']})"))
    if not found:
        raise InputError(f"no results found in {str(results)!r}; run eval/scan/detect/ablate/pattern with "
                         f"--out {results} first")
    return write_report(out, title="gather-aggregate results", sections=sections,
                        meta={"results": str(results), "files": ", ".join(str(f.relative_to(results)) for f in found)})
