"""``gather-aggregate report STUDY``: one report from whichever results a study folder holds.

It draws what the demo draws for a model (:mod:`gather_aggregate.report.demo_story`'s pieces, not copies): the
circuit, the Gather and Aggregate rows over one prompt, the head scores, and the ablation table; with an attention
study and an SSM study in one folder, also sharp against smooth.  The "why each head was named" table is one short
card per named head (:meth:`DetectionResult.cards`), the full per-head table folded under it.  Every section title
starts with the study's model and task (``llama-kvmc · kv: the circuit``); a folder of several studies gets one
such group of sections per study.  The rows over a prompt need the model: it is loaded again from the study's
``meta.json``, and where it cannot be, the report says so and draws the rest.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gather_aggregate.core.errors import GAError, InputError
from gather_aggregate.studies.study_folder import StudyFolder, describe, studies_in


def study_label(meta: Mapping[str, Any]) -> str:
    """``llama-kvmc · kv``: the name every section of a study starts with (a model path shows its last part)."""
    model = str(meta.get("model_name") or "model")
    return f"{Path(model).name if '/' in model else model} · {meta.get('task_name')}"


def _views(study: Any, det: Any) -> dict[str, Any] | None:
    from gather_aggregate.report.demo_story import UNIT, segment_views

    if study is None or det is None or not study.examples:
        return None
    unit = UNIT.get(str(study.task_name), "segment")
    return segment_views(study.model, study.examples[0], det.meta, det.rows, unit)


def _sharpness(p: str, views: Mapping[str, Any]) -> Any:
    """How sharp the Aggregate head's query row is on the prompt drawn (sharp: attention; smooth: SSM)."""
    from gather_aggregate.report.html import KeyValues
    from gather_aggregate.viz.circuit import head_name
    from gather_aggregate.viz.sharpness import row_stats

    st = row_stats(views["aggregate_row"])
    return KeyValues({"head": f"{head_name(views['aggregate'])} ({views['kind']})",
                      "entropy (nats)": round(st["entropy"], 3),
                      "uniform row's entropy (nats)": round(math.log(st["n_keys"]), 3),
                      "top-1 mass": round(st["top1"], 3), "sharpness index": round(st["sharpness"], 3)},
                     title=f"{p}: sharp or smooth: the Aggregate row on that prompt",
                     caption="On the per-row normalised |row| (docs/glossary.md). A folder holding an attention "
                             "study and an SSM study also draws the two rows side by side.")


def _cards(p: str, det: Any) -> list[Any]:
    from gather_aggregate.report.html import Html, Table, _table_html

    cards = det.cards()
    full = Table([dict(r) for r in det.meta.get("decisions") or det.rows])
    folded = (f"<details><summary>Every head's numbers ({len(full.rows)} heads; the columns are defined in "
              f"docs/glossary.md)</summary>{_table_html(full)}</details>")
    secs: list[Any] = [Table(cards or [{"head": "none", "why": "no Gather or Aggregate head was named"}],
                             title=f"{p}: why each head was named",
                             caption="pattern share: the head's row mass where its role reads (Gather: a segment's "
                                     "rows on its own segment; Aggregate: the query row on the correct segment). "
                                     "loss alone / group loss: the share of the retrieval margin lost when the head "
                                     "alone / its role's named group is ablated at the role's positions.")]
    secs.append(Html(folded, title=f"{p}: every head, in detail"))
    return secs


def _scores_figure(p: str, det: Any, scan: Any) -> Any:
    from gather_aggregate.report.demo_story import score_key
    from gather_aggregate.report.html import Figure
    from gather_aggregate.viz import head_score_heatmaps

    drops = scan.scores() if scan is not None else {}
    rows = [{**r, "ablation_drop": drops.get((r["layer"], r["head"]), r.get("ablation_drop", math.nan))}
            for r in det.rows]
    read = det.meta.get("reading", {})
    cols = (score_key(det.rows, "gather"), score_key(det.rows, "aggregate"))
    return Figure(head_score_heatmaps(rows, ("ablation_drop", *cols), floor=0.1,
                                      titles=["ablation drop (nats)", f"Gather pattern share (read at "
                                              f"{read.get('gather')})", "Aggregate pattern share (query row)"],
                                      title=f"{p}: head scores"),
                  title=f"{p}: head scores",
                  caption="Boxes #1-#3: the three highest values of each panel; grey cells: heads the layer does "
                          "not have. Pattern shares are on a fixed 0-1 scale; drops span at least ±0.1 nats.")


def study_sections(folder: StudyFolder, study: Any, note: str = "",
                   label: str | None = None) -> tuple[list[Any], dict[str, Any] | None]:
    """The sections of one study (every title starts with :func:`study_label`) and its views (for sharp vs
    smooth across studies)."""
    from gather_aggregate.report.demo_story import _circuit_section, _strips_section
    from gather_aggregate.report.from_results import _scan_sections
    from gather_aggregate.report.html import KeyValues, Table
    from gather_aggregate.viz import attention_heads

    meta = folder.meta()
    p = label or study_label(meta)
    got = {k: folder.load(k) for k in folder.kinds()}
    secs: list[Any] = [KeyValues({"model": meta.get("model_name"), "task": meta.get("task_name"),
                                  "prompts": meta.get("n"), "seed": meta.get("seed"),
                                  "results": ", ".join(got) or "none yet", "folder": str(folder.path),
                                  **({"note": note} if note else {}),
                                  **{f"version of {k}": v for k, v in (meta.get("versions") or {}).items()}},
                                 title=f"{p}: the study")]
    if "eval" in got:
        ev = got["eval"]
        secs.append(KeyValues({"accuracy": round(ev.accuracy, 4), "prompts": ev.n}, title=f"{p}: accuracy"))
    det, scan = got.get("detect"), got.get("scan")
    views = None
    if det is not None:
        views = _views(study, det)
        if views is not None:
            from gather_aggregate.report.demo_story import UNIT

            secs.append(_circuit_section(p, det.meta, det.rows, views))
            secs.append(_strips_section(p, views, UNIT.get(str(meta.get("task_name")), "segment")))
            secs.append(_sharpness(p, views))
        secs.append(_scores_figure(p, det, scan))
        secs += _cards(p, det)
    if scan is not None:
        data = {"meta": scan.meta, "rows": scan.rows}
        secs += _scan_sections(data, p, folder.file("scan").name)
    if "ablate" in got:
        rows = [{k: r[k] for k in ("task", "heads", "method", "clean", "ablated", "change")} for r in got["ablate"].rows]
        secs.append(Table(rows, title=f"{p}: accuracy with heads ablated",
                          caption="clean: accuracy on the study's prompts; ablated: with the heads' outputs replaced "
                                  "together (zero, mean or resample)."))
    if "pattern" in got:
        pat = got["pattern"]
        m = pat.meta
        secs.append(attention_heads(pat.pattern, m["tokens"], layer=m["layer"], heads=m["heads"],
                                    title=f"{p}: layer {m['layer']} ({m.get('layer_kind')}), prompt "
                                          f"{m.get('prompt_index', 0)}"))
    secs += _circuit_edges(folder, p)
    return secs, views


def _circuit_edges(folder: StudyFolder, p: str) -> list[Any]:
    """The edge graph ``gather-aggregate circuit`` left in the folder (``circuit.json``), drawn and tabled."""
    import json

    from gather_aggregate.report.html import Figure, Table
    from gather_aggregate.viz.circuit_graph import edge_rows_figure

    path = folder.path / "circuit.json"
    if not path.is_file():
        return []
    data = json.loads(path.read_text())
    rows, meta = data.get("rows", []), data.get("meta", {})
    est = meta.get("estimator", "estimate")
    faith = meta.get("faithfulness") or {}
    fig = edge_rows_figure(rows, estimator=est, gather=meta.get("gather", []), aggregate=meta.get("aggregate", []))
    kept = (f" The named circuit ({', '.join(faith['nodes'])}) keeps {faith['recovered']:.2f} of the clean-to-ablated "
            "gap with every other edge ablated." if faith.get("nodes") else "")
    return [Figure(fig, title=f"{p}: the strongest edges ({est}, exact where re-scored)",
                   caption=f"{len(rows)} of {meta.get('n_edges')} edges; width: |effect|, dotted where patching "
                           f"lowers the metric; Gather green, Aggregate blue.{kept}"),
            Table(rows, title=f"{p}: edges", caption="exact: edge patching (M(patched) − M(clean)); see "
                                                     "docs/circuits.md")]


def study_report(study: Any, out: str | Path | None = None) -> Path:
    """The report of a :class:`~gather_aggregate.studies.study.Study` (its folder's ``report.html`` unless
    ``out``), drawn with the study's model already loaded."""
    if getattr(study, "folder", None) is None:
        raise InputError("a study without a folder has nothing saved to report; pass folder= to Study")
    return write_study_report(study.folder.path, out, models={str(study.model_name): study.model})


def write_study_report(path: str | Path, out: str | Path | None = None,
                       models: Mapping[str, Any] | None = None) -> Path:
    """Write ``out`` (default ``path/report.html``) for the study folder ``path``, or for every study folder
    below it (one group of sections per study).  ``models``: loaded models by study model name (else each is
    loaded again from its ``meta.json``)."""
    from gather_aggregate.report.demo_story import _sharp_section
    from gather_aggregate.report.html import Html, write_report
    from gather_aggregate.studies.study import Study

    path = Path(path)
    folders = studies_in(path)
    if not folders:
        raise InputError(f"{str(path)!r} holds no study (no meta.json in it or below it); run scan/detect/eval with "
                         f"--out {path} first")
    sections: list[Any] = []
    all_views: dict[str, Any] = {}
    metas = [f.meta() for f in folders]
    short = [study_label(m) for m in metas]
    names = [s if short.count(s) == 1 else f"{s} ({m.get('n')} prompts, seed {m.get('seed')})"
             for s, m in zip(short, metas)]
    for folder, meta, name in zip(folders, metas, names):
        given = (models or {}).get(str(meta.get("model_name")))
        note = ""
        try:
            study = Study.open(folder.path, model=given)
        except (GAError, OSError) as exc:  # the model moved or cannot load: draw what needs no model
            study, note = None, f"the model could not be loaded again ({str(exc).splitlines()[0]}), so no rows " \
                                "over a prompt are drawn"
        secs, views = study_sections(folder, study, note, name)
        if len(folders) > 1:
            secs.insert(0, Html(f"<p>Study <strong>{html.escape(describe(meta))}</strong> in "
                                f"<code>{html.escape(str(folder.path))}</code>.</p>", title=name))
        sections += secs
        if views is not None:
            all_views[name] = views
    sharp = _sharp_section(all_views, True) if len(all_views) > 1 else None
    if sharp is not None:
        sharp.title = f"Sharp (attention) vs smooth (SSM): {' and '.join(all_views)}"
        sections.append(sharp)
    title = f"gather-aggregate: {names[0]}" if len(names) == 1 else f"gather-aggregate: {len(names)} studies"
    first = folders[0].meta()
    head = ({"model": first.get("model_name"), "task": first.get("task_name"), "prompts": first.get("n"),
             "seed": first.get("seed")} if len(folders) == 1 else {"studies": ", ".join(names)})
    return write_report(Path(out) if out is not None else path / "report.html", title=title, sections=sections,
                        meta=head)
