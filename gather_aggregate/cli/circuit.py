"""``gather-aggregate circuit``: edge attribution of a model on a task, its strongest edges re-scored exactly, the
detector's named G&A circuit (the study's detection when it has one) and its faithfulness, written as a table and
an offline figure into the study folder."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gather_aggregate.core.errors import InputError


def add_circuit_options(p: argparse.ArgumentParser) -> None:
    from gather_aggregate.cli.arg_types import int_in_range

    p.add_argument("--estimator", choices=["eap", "eap-ig"], default="eap-ig",
                   help="EAP (first order) or EAP-IG (gradients averaged along the clean-to-ablated path)")
    p.add_argument("--steps", type=int_in_range("--steps", 1), default=5, help="EAP-IG's interpolation points")
    p.add_argument("--ablation", choices=["resample", "mean", "zero"], default="resample",
                   help="a sender's ablated output: another prompt's (never its own), the prompts' mean, or zero")
    p.add_argument("--top", type=int_in_range("--top", 1), default=20,
                   help="edges drawn and re-scored exactly by edge patching")
    p.add_argument("--no-detect", action="store_true", help="skip the detector (no roles, no faithfulness)")


def _roles(detection: Any) -> tuple[list[str], list[str], list[int]]:
    """Gather and Aggregate node names (a convolution named as the Gather is ``L{l}conv``) of a detection: the
    detector's :class:`GAHeads` or the study's saved :class:`DetectionResult`."""
    conv = list(getattr(detection, "gather_conv", None) or getattr(detection, "meta", {}).get("gather_conv") or [])
    gather = [f"L{a}H{b}" for a, b in detection.gather] + [f"L{la}conv" for la in conv]
    return gather, [f"L{a}H{b}" for a, b in detection.aggregate], conv


def run_circuit(args: argparse.Namespace) -> int:
    from types import SimpleNamespace

    from gather_aggregate.attribution.edges import edge_attribution, rescore
    from gather_aggregate.attribution.graph import build_graph
    from gather_aggregate.cli.commands import study_of
    from gather_aggregate.core.results_io import atomic_write_json, atomic_write_text, write_table
    from gather_aggregate.tasks.metric import task_metric
    from gather_aggregate.viz.circuit_graph import circuit_figure, circuit_html

    if args.ablation == "resample" and args.n < 2:
        raise InputError("--ablation resample needs at least two prompts (--n 2 or more)")
    study = study_of(args)
    model, examples = study.model, study.examples
    tokens, metric = task_metric(model, examples)
    if args.ablation in ("resample", "mean") and len({e.query_pos for e in examples}) != 1:
        raise InputError(f"--ablation {args.ablation} pairs prompts position by position and these prompts have "
                         "several lengths; use --ablation zero, or a task whose prompts share one length")
    graph = build_graph(model)
    opts = {"method": args.ablation, "reference": tokens if args.ablation != "zero" else None}
    est = edge_attribution(model, tokens, metric, graph=graph, estimator=args.estimator, steps=args.steps, **opts)
    est = rescore(model, tokens, metric, est, k=args.top, reference=opts["reference"])
    rows = est.rows(args.top)
    gather: list[str] = []
    aggregate: list[str] = []
    faith: dict[str, Any] = {}
    if not args.no_detect:
        from gather_aggregate.detect.detector import find_ga_heads
        from gather_aggregate.studies.faithfulness import faithfulness, named_nodes

        detection = study.saved("detect")
        if detection is not None:
            print(f"circuit: uses the study's detection {study.out('detect')}")
        else:
            print("circuit: the study has no detection; naming the G&A heads without a head scan (run `detect` "
                  "first to keep one in the study)")
            detection = find_ga_heads(model, examples)
        gather, aggregate, conv = _roles(detection)
        nodes = named_nodes(SimpleNamespace(gather=detection.gather, aggregate=detection.aggregate,
                                            gather_conv=conv), graph)
        if nodes:
            faith = {"nodes": nodes, **faithfulness(model, tokens, metric, nodes=nodes, graph=graph, **opts)}
    for r in rows:
        r["role"] = ("gather" if r["sender"] in gather else "aggregate" if r["sender"] in aggregate else "") + (
            " → aggregate" if r["receiver"] in aggregate else " → gather" if r["receiver"] in gather else "")
    folder = study.folder.path if study.folder is not None else Path(args.out)
    meta = study.meta(estimator=args.estimator, steps=est.steps, ablation=args.ablation, n_edges=graph.n_edges,
                      gather=gather, aggregate=aggregate, faithfulness=faith)
    write_table(rows, folder / "circuit.json", meta)
    atomic_write_json(folder / "faithfulness.json", {**study.meta(ablation=args.ablation), **faith})
    fig = circuit_figure(est, top=args.top, gather=gather, aggregate=aggregate,
                         title=f"{study.model_name}: strongest {args.top} edges ({args.estimator}, exact where "
                               "re-scored)")
    atomic_write_text(folder / "circuit.html", circuit_html(fig, rows, title=f"{study.model_name} circuit"))
    print(f"{graph.n_edges} edges scored ({args.estimator}); the {len(rows)} strongest re-scored exactly -> "
          f"{folder}/circuit.json, circuit.csv, circuit.html")
    for r in rows[:10]:
        print(f"  {r['sender']:>8} -> {r['receiver']}.{r['input']:<5} {args.estimator} {r[args.estimator]:+.4f}  "
              f"exact {r['exact']:+.4f}  {r['role']}")
    if faith:
        print(f"named circuit {', '.join(faith['nodes'])}: faithfulness {faith['recovered']:.3f} "
              f"(clean {faith['m_clean']:.3f}, all edges ablated {faith['m_nothing']:.3f}, circuit "
              f"{faith['m_circuit']:.3f}; {faith['kept']} of {faith['n_edges']} edges kept)")
    elif not args.no_detect:
        print("the detector named no Gather or Aggregate head here, so there is no circuit to measure")
    return 0
