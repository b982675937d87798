"""``gather-aggregate report``: one HTML report from the JSON files other subcommands wrote.

Reads whatever is present in a results directory — ``eval.json``, ``scan.json``,
``detect.json``, ``ablate.json``, ``pattern.json``, ``lm_eval.json`` — and turns each into report
sections, grouped by the model each result is from (every section title names
it).  Heads are written ``L0H2``; nothing is shown as a Python repr.  Unknown
files are ignored.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gather_aggregate.core.errors import InputError
from gather_aggregate.viz.circuit import head_name

_HASH = re.compile(r"^[0-9a-f]{16}$")


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise InputError(f"{path} is not valid JSON ({exc}); rerun the subcommand that wrote it") from None


def model_of(data: Mapping[str, Any]) -> str:
    """The model a result file is from: its ``model`` (name or path), else ``meta.model_name``."""
    meta = data.get("meta", {}) if isinstance(data.get("meta"), Mapping) else {}
    for value in (data.get("model"), meta.get("model_name"), meta.get("model")):
        if isinstance(value, str) and value and not _HASH.match(value):
            return Path(value).name if "/" in value else value
    return "model not recorded"


def heads_text(heads: Any) -> str:
    """``[[1, 0], [1, 2]]`` → ``L1H0, L1H2``."""
    return ", ".join(head_name(h) for h in heads or []) or "none"


def _fmt(x: Any) -> str:
    return f"{x:.3f}" if isinstance(x, float) else str(x)


def _scan_sections(data: Mapping[str, Any], model: str, rel: str) -> list[Any]:
    from gather_aggregate.report.html import Figure, Table
    from gather_aggregate.viz import head_score_heatmaps

    meta = data.get("meta", {})
    rows = data["rows"]
    how = " ".join(str(meta[k]) for k in ("mode", "method") if meta.get(k))
    status = "" if meta.get("complete", True) else " (incomplete: rerun with --resume)"
    top = [{"rank": r.get("rank"), "head": head_name((r["layer"], r["head"])), "kind": r["kind"],
            "drop": r["score"], **({"± stderr over prompts": r["stderr"]} if "stderr" in r else {})}
           for r in rows[:10]]
    return [Figure(head_score_heatmaps(rows, ("score",), titles=["ablation drop (metric clean - ablated)"],
                                       title=f"{model}: head scan"),
                   title=f"{model}: head scan ({how}){status}",
                   caption=f"From {rel}. Boxes #1-#3: the three largest drops; grey cells: heads the layer does "
                           f"not have. Clean metric {_fmt(meta.get('metric_clean'))}."),
            Table(top, title=f"{model}: top heads of the scan")]


def _detect_sections(data: Mapping[str, Any], model: str, rel: str) -> list[Any]:
    from gather_aggregate.detect.conv_gather import conv_evidence
    from gather_aggregate.report.html import Figure, KeyValues, Table
    from gather_aggregate.viz import head_score_heatmaps

    meta, rows = data.get("meta", {}), data["rows"]
    reading = meta.get("reading", {"gather": "summary", "aggregate": "segment"})
    # the detector's own masses where it has them, else the paper's summary-token scores
    score_cols = [own if own in rows[0] else role
                  for own, role in (("gather_mass", "gather"), ("aggregate_on_correct", "aggregate"))]
    cols = [c for c in ("ablation_drop", *score_cols) if c in rows[0]]
    evidence = {(la, h): ev for la, h, ev in meta.get("evidence", [])}

    def named(role: str) -> str:
        heads = meta.get(role, [])
        return ", ".join(f"{head_name(h)} ({evidence.get(tuple(h), 'pattern')})" for h in heads) or "none named"

    joint = meta.get("joint_drop") or {}
    secs: list[Any] = [
        Figure(head_score_heatmaps(rows, cols, title=f"{model}: Gather / Aggregate scores"),
               title=f"{model}: Gather / Aggregate scores",
               caption=f"From {rel}. Boxes #1-#3: the three highest scores of each panel; grey cells: heads "
                       "the layer does not have."),
        KeyValues({"Gather heads": named("gather"),
                   "Gather by a short convolution": ", ".join(
                       f"layer {c['layer']} (loss {conv_evidence(c)} at other tokens)"
                       for c in meta.get("conv", []) if c.get("named")) or "none",
                   "Aggregate heads": named("aggregate"),
                   "G→A pairs": ", ".join(f"{head_name(g)} → {head_name(a)}" for g, a in meta.get("pairs", []))
                   or "none",
                   "read at": f"{reading.get('gather')} / {reading.get('aggregate')}",
                   "group loss (share of the retrieval margin)":
                       ", ".join(f"{role} {_fmt(d)}" for role, d in joint.items()) or "none measured"},
                  title=f"{model}: detected heads")]
    if meta.get("decisions"):  # the numbers behind each head's decision and the rule that made it
        secs.append(Table([dict(r) for r in meta["decisions"]], title=f"{model}: why each head was named or left out"))
    return secs


def _ablate_sections(data: Mapping[str, Any], model: str) -> list[Any]:
    from gather_aggregate.report.html import Table

    clean, ablated = data.get("clean", {}), data.get("ablated", {})
    rows = [{"task": t, "clean": clean[t], "ablated": ablated.get(t), "change": ablated.get(t, 0) - clean[t]}
            for t in clean]
    return [Table(rows, title=f"{model}: accuracy with {heads_text(data.get('heads'))} ablated "
                              f"({data.get('method', 'zero')})")]


def _sections(name: str, data: Mapping[str, Any], model: str, rel: str, secs: list[Any]) -> bool:
    """Append the report sections of one result file to ``secs``; whether the file is a result at all."""
    import torch

    from gather_aggregate.report.html import KeyValues
    from gather_aggregate.viz import attention_heads

    if name == "eval":
        secs.append(KeyValues({"model": model, "task": data.get("task"), "prompts": data.get("n"),
                               "accuracy": round(float(data.get("accuracy", float("nan"))), 4)},
                              title=f"{model}: {data.get('task')} accuracy"))
    elif name.startswith("scan") and data.get("rows"):
        secs += _scan_sections(data, model, rel)
    elif name == "detect" and data.get("rows"):
        secs += _detect_sections(data, model, rel)
    elif name == "ablate" and "clean" in data:
        secs += _ablate_sections(data, model)
    elif name == "lm_eval" and data.get("rows"):
        from gather_aggregate.report.lm_eval_sections import report_sections

        secs += report_sections(data)
    elif name == "pattern" and "pattern" in data:
        which = data.get("prompt_index", 0)
        secs.append(attention_heads(torch.tensor(data["pattern"]), data["tokens"], layer=data["layer"],
                                    heads=data["heads"],
                                    title=f"{model}: layer {data['layer']} ({data['kind']}), prompt {which} "
                                          f"of {data.get('task', 'the task')}"))
    else:
        return False
    return True


def build_report_from_dir(results: Path, out: Path) -> Path:
    from gather_aggregate.core.errors import GAError
    from gather_aggregate.report.html import write_report

    by_model: dict[str, list[Any]] = {}
    found = []
    for f in sorted(results.rglob("*.json")):
        name, rel = f.stem, str(f.relative_to(results))
        data = _read(f)
        if not isinstance(data, Mapping):
            continue
        model = model_of(data)
        secs = by_model.setdefault(model, [])
        try:
            known = _sections(name, data, model, rel, secs)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            if isinstance(exc, GAError):
                raise
            raise InputError(f"{rel} is not a {name} result this version can read ({type(exc).__name__}: {exc}); "
                             f"rerun the subcommand that wrote it, or move the file out of {str(results)!r}") from None
        if known:
            found.append(rel)
    if not found:
        raise InputError(f"no results found in {str(results)!r}; run eval/scan/detect/ablate/pattern with "
                         f"--out {results} first")
    sections: list[Any] = []
    for _model, secs in sorted(by_model.items()):
        sections += secs
    models = sorted(m for m, s in by_model.items() if s)
    return write_report(out, title=f"gather-aggregate results: {', '.join(models)}", sections=sections,
                        meta={"models": ", ".join(models), "results": str(results), "files": ", ".join(found)})

