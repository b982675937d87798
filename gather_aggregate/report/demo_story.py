"""The demo's HTML report: each model tells the Gather-and-Aggregate story.

Per model: the circuit (Gather heads → Aggregate heads, with their evidence), the
Gather head's rows at the segment summaries and the Aggregate head's query row
drawn over one prompt, and its head scores.  Across models: accuracy, the
cumulative ablation as small multiples (one panel per model, one colour per
task), sharp (attention) against smooth (SSM) rows on the same prompt, and KV
accuracy against dictionary size.

Every title states what was measured on this run's prompts ("0.96 of the query
row on the correct line"); a head is said to read the correct segment only when
that is where most of its row goes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gather_aggregate.core.protocol import HookedModel
from gather_aggregate.viz.circuit import head_name

UNIT = {"kv": "line", "letter-mc": "option", "content-mc": "option", "mqar": "pair"}


def heads_text(heads: Sequence[Sequence[int]]) -> str:
    """``[[1, 0], [1, 2]]`` → ``L1H0 L1H2`` (``-`` when empty)."""
    return " ".join(head_name(h) for h in heads) or "-"


def text_table(header: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    """Rows as text columns, each as wide as its widest cell (numbers right-aligned)."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        return "  ".join(str(c).rjust(w) if i in right else str(c).ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    return [line(header)] + [line(r) for r in rows]


def _row_over_keys(model: HookedModel, tokens: Any, layer: int, head: int, rows: Any) -> Any:
    import torch

    with torch.no_grad():
        return model.pattern(tokens, layer, heads=[head], rows=rows)[0, 0].float().cpu()


def score_key(table: Sequence[Mapping[str, Any]], role: str) -> str:
    """The table column holding a role's pattern share: the detector's own mass at the position it read
    (``gather_mass``: a segment's read row on its own segment; ``aggregate_on_correct``: the query row on the
    correct segment), else the paper's summary-token score column (``gather`` / ``aggregate``)."""
    own = {"gather": "gather_mass", "aggregate": "aggregate_on_correct"}[role]
    return own if table and own in table[0] else role


def _pick(g: Mapping[str, Any], table: Sequence[Mapping[str, Any]], role: str) -> tuple[tuple[int, int], bool]:
    """The role's first named head, else the head with the highest score of the role's reading."""
    if g[role]:
        return tuple(g[role][0]), True  # type: ignore[return-value]
    key = score_key(table, role)
    best = max(table, key=lambda r: (r.get(key) or 0.0))
    return (int(best["layer"]), int(best["head"])), False


def segment_views(model: HookedModel, example: Any, g: Mapping[str, Any], table: Sequence[Mapping[str, Any]],
                  unit: str) -> dict[str, Any]:
    """The Gather head's summary rows and the Aggregate head's query row on ``example``, with what they show."""
    import torch

    from gather_aggregate.viz.tokens import row_shares

    tok = torch.tensor([example.input_ids], device=model.device)
    tokens = model.to_str_tokens(tok)
    segs = example.segments
    n = len(tokens)
    # Gather: each segment's summary row, drawn over that segment's own tokens
    (gl, gh), g_named = _pick(g, table, "gather")
    summaries = torch.tensor([[s.summary for s in segs]], device=model.device)
    g_rows = _row_over_keys(model, tok, gl, gh, summaries)  # [n_seg, key]
    gather_w = [math.nan] * n
    own = []
    for s, row in zip(segs, g_rows, strict=True):
        share = row_shares(row)
        for k in range(s.start, s.end):
            gather_w[k] = share[k]
        own.append(sum(share[s.start:s.end]))
    # Aggregate: the query row over the whole prompt
    (al, ah), a_named = _pick(g, table, "aggregate")
    q_row = _row_over_keys(model, tok, al, ah, example.query_pos)[0]  # [key]
    agg_w = row_shares(q_row)  # signed where the row is (drawn as is)
    # what each segment gets of the row's |mass|, as the detector reads a row (a signed SSM row's negative terms
    # are weight on a token too, not a deficit that cancels the positive ones)
    seg_mass = [sum(abs(w) for w in agg_w[s.start:s.end]) for s in segs]
    best = max(range(len(segs)), key=lambda i: seg_mass[i])
    c = example.correct
    if c >= 0 and best == c:
        finding = f"{seg_mass[c]:.2f} of the query row on the correct {unit}"
    elif c >= 0:
        finding = (f"most of the query row on {unit} {best + 1} ({seg_mass[best]:.2f}), not on the correct "
                   f"{unit} {c + 1} ({seg_mass[c]:.2f})")
    else:
        finding = f"most of the query row on {unit} {best + 1} ({seg_mass[best]:.2f})"
    return {"tokens": tokens, "gather": (gl, gh), "gather_named": g_named, "gather_w": gather_w,
            "gather_own": sum(own) / len(own), "aggregate": (al, ah), "aggregate_named": a_named,
            "aggregate_w": agg_w, "aggregate_row": q_row, "finding": finding, "seg_mass": seg_mass,
            "correct_span": (segs[c].start, segs[c].end) if c >= 0 else None, "query": example.query_pos,
            "kind": model.layers[al].kind, "example": example}


def _circuit_section(m: str, g: Mapping[str, Any], table: Sequence[Mapping[str, Any]], view: Mapping[str, Any]) -> Any:
    from gather_aggregate.report.html import Html
    from gather_aggregate.viz.circuit import circuit_diagram

    by = {(int(r["layer"]), int(r["head"])): r for r in table}
    evidence = {(la, h): ev for la, h, ev in g["evidence"]}

    def items(role: str) -> list[dict[str, Any]]:
        key = score_key(table, role)
        return [{"head": hd, "evidence": evidence.get(tuple(hd), ""),
                 "score": float(by[tuple(hd)][key]) if tuple(hd) in by else ""} for hd in g[role]]

    joint = ", ".join(f"{role} {d:.2f}" for role, d in g["joint_drop"].items())
    convs = [f"layer {la}'s short convolution" for la in g.get("gather_conv", [])]
    gather = " + ".join(([heads_text(g["gather"])] if g["gather"] else []) + convs) or "none"
    text = (f"<p><strong>{m}</strong>: Gather {gather}, Aggregate {heads_text(g['aggregate'])}; "
            f"on the prompt below the Aggregate head {head_name(view['aggregate'])} puts {view['finding']}."
            + (f" Group loss (share of the retrieval margin): {joint}." if joint else "") + "</p>")
    return Html(text + circuit_diagram(items("gather"), items("aggregate"), [tuple(p) for p in g["pairs"]],
                                       scores=(score_key(table, "gather"), score_key(table, "aggregate"))),
                title=f"{m}: the circuit")


def _strips_section(m: str, view: Mapping[str, Any], unit: str) -> Any:
    from gather_aggregate.report.html import Html
    from gather_aggregate.viz.tokens import token_strip

    gname, aname = head_name(view["gather"]), head_name(view["aggregate"])
    g_title = (f"Gather {gname}: each {unit}'s summary row keeps {view['gather_own']:.2f} of its weight on its own "
               f"{unit} (mean over the prompt's {unit}s)")
    if not view["gather_named"]:
        g_title = f"No Gather head was named; the highest-scoring head {gname}: " + g_title.split(": ", 1)[1]
    a_title = f"Aggregate {aname} ({view['kind']}): {view['finding']}"
    if not view["aggregate_named"]:
        a_title = f"No Aggregate head was named; the highest-scoring head {aname}: {view['finding']}"
    html = ('<div class="ga-strip-pair">' + token_strip(view["tokens"], view["gather_w"], title=g_title, correct=view["correct_span"],
                        note=f"Each {unit} is coloured by the row of its own summary token (its last token); "
                             "tokens outside the segments are not scored.")
            + token_strip(view["tokens"], view["aggregate_w"], title=a_title, correct=view["correct_span"],
                          query=view["query"],
                          note="The query token (outlined) reads the prompt; weights are the row's shares "
                               "(a signed SSM row divided by its total |weight|).") + "</div>")
    return Html(html, title=f"{m}: Gather and Aggregate rows on one prompt")


def _sharp_section(views: Mapping[str, Mapping[str, Any]], same_prompt: bool) -> Any | None:
    from gather_aggregate.report.html import Figure
    from gather_aggregate.viz import sharp_vs_smooth

    def on_correct(m: str) -> float:
        v = views[m]
        c = v["example"].correct
        return v["seg_mass"][c] if c >= 0 else 0.0

    # the models whose named Aggregate head puts the most of its query row on the correct segment
    attn = sorted((m for m, v in views.items() if v["kind"] == "attn" and v["aggregate_named"]),
                  key=lambda m: -on_correct(m))
    ssm = sorted((m for m, v in views.items() if v["kind"] == "ssm" and v["aggregate_named"]),
                 key=lambda m: -on_correct(m))
    if not attn or not ssm:
        return None
    a_m, s_m = attn[0], ssm[0]
    a, s = views[a_m], views[s_m]
    ex_a, ex_s = a["example"], s["example"]
    fig = sharp_vs_smooth(
        a["aggregate_row"], s["aggregate_row"], a["tokens"], ssm_tokens=s["tokens"],
        labels=(f"{a_m} {head_name(a['aggregate'])}", f"{s_m} {head_name(s['aggregate'])}"),
        summaries=[sg.summary for sg in ex_a.segments], target=ex_a.segments[ex_a.correct].summary,
        ssm_summaries=[sg.summary for sg in ex_s.segments], ssm_target=ex_s.segments[ex_s.correct].summary,
        title="Sharp (attention) vs smooth (SSM): the Aggregate head's query row")
    prompt = "the same prompt" if ex_a.prompt == ex_s.prompt else "each model's first prompt"
    return Figure(fig, title="Sharp (attention) vs smooth (SSM) Aggregate rows",
                  caption=f"Both rows on {prompt}. {a_m}: {a['finding']}; {s_m}: {s['finding']}. Bars are each "
                          "row's weights divided by the row's total |weight|; red bars are negative SSM-implied "
                          "weights; triangles mark segment summaries, the star the correct one.")


def write_demo_report(out: Path, summary: Mapping[str, Any], models: Mapping[str, Any], scans: Mapping[str, Any],
                      tables: Mapping[str, Any], examples: Mapping[str, Sequence[Any]],
                      cumulative: Mapping[str, Any], kv_rows: list[dict[str, Any]],
                      extra: Sequence[Any] = ()) -> tuple[Path, dict[str, Any]]:
    """Write ``out/report.html`` (``extra`` sections before the closing table); returns its path and each
    model's views (for the console summary)."""
    from gather_aggregate.report.html import Figure, Markdown, Table, write_report
    from gather_aggregate.viz import head_score_heatmaps, kv_accuracy_curve
    from gather_aggregate.viz.curves import ablation_small_multiples

    task = summary["scan_task"]
    unit = UNIT.get(task, "segment")
    views = {m: segment_views(models[m], examples[m][0], summary["ga_heads"][m], tables[m], unit) for m in models}
    tasks = list(summary["chance"])
    sections: list[Any] = [Markdown(
        f"The toy zoo, trained on this CPU, analysed end to end on {summary['n_prompts']} prompts per task "
        f"(seed {summary.get('seed', 0)}). How to read it:\n\n"
        "- **Accuracy** on retrieval-heavy tasks (KV-retrieval, letter-format multiple choice) and knowledge tasks "
        "(content-format multiple choice, plain knowledge queries).\n"
        f"- **Cumulative ablation**: remove the {task} scan's top heads one after another; retrieval should fall "
        "to chance and knowledge should hold.\n"
        "- **Per model**: the circuit the detector names (Gather → Aggregate, with the evidence for each head), "
        "the two heads' rows drawn over one prompt, and the head scores they were named from.\n"
        "- **Sharp vs smooth**: an attention Aggregate row against an SSM one.\n"
        "- **Hybrids** (when llama-kvmc is among the models): which heads a transformer must keep as attention "
        "to retrieve, from the sweep shipped with the zoo, and one shipped hybrid evaluated in this run.")]
    acc_rows = [{"model": m, **{t: round(v, 3) for t, v in a.items()}} for m, a in summary["accuracy"].items()]
    acc_rows.append({"model": "chance", **{t: round(v, 3) for t, v in summary["chance"].items()}})
    sections.append(Table(acc_rows, title="Accuracy", caption=f"Fraction correct on {summary['n_prompts']} prompts "
                                                              "per task; the last row is chance."))
    sections.append(Figure(ablation_small_multiples(cumulative, tasks=tasks, chance=summary["chance"],
                                                    title=f"Removing each model's top heads of the {task} scan"),
                           title="Cumulative ablation",
                           caption="One panel per model, one colour per task (dotted: the task's chance level). "
                                   "x: how many of the scan's top heads are zero-ablated together."))
    sharp = _sharp_section(views, True)
    if sharp is not None:
        sections.append(sharp)
    for m in models:
        g = summary["ga_heads"][m]
        sections.append(_circuit_section(m, g, tables[m], views[m]))
        sections.append(_strips_section(m, views[m], unit))
        drops = scans[m].scores()
        rows = [{**r, "ablation_drop": drops.get((r["layer"], r["head"]), math.nan)} for r in tables[m]]
        read = (g["reading"]["gather"], g["reading"]["aggregate"])
        cols = (score_key(tables[m], "gather"), score_key(tables[m], "aggregate"))
        sections.append(Figure(head_score_heatmaps(rows, ("ablation_drop", *cols), floor=0.1,
                                                   titles=["ablation drop (nats)", f"Gather score (read at {read[0]})",
                                                           f"Aggregate score (read at {read[1]})"],
                                                   title=f"{m}: head scores"),
                               title=f"{m}: head scores",
                               caption="Boxes #1-#3: the three highest scores of each panel. Grey cells: heads "
                                       "the layer does not have (attention and SSM layers differ in head count). "
                                       "Gather/Aggregate scores are shares of a row on a fixed 0-1 scale; drops "
                                       "span at least ±0.1 nats, so a model without retrieval heads stays pale."))
    if kv_rows:
        sections.append(Figure(kv_accuracy_curve(kv_rows, title="KV-retrieval accuracy vs dictionary size"),
                               title="KV accuracy vs dictionary size"))
    sections.extend(extra)
    sections.append(Table([{"model": m, **{k: v for k, v in r.items() if k != "heads"}, "heads removed":
                            heads_text(r["heads"])} for m, rows in cumulative.items() for r in rows],
                          title="Cumulative ablation table"))
    path = write_report(out / "report.html", title="gather-aggregate: the toy zoo", sections=sections,
                        meta={"models": ", ".join(models), "prompts per task": summary["n_prompts"],
                              "seed": summary.get("seed", 0), "scan task": task})
    return path, views
