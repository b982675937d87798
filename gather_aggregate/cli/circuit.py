"""``gather-aggregate circuit``: edge attribution of a model on a task, its strongest edges re-scored exactly, the
detector's named G&A circuit and its faithfulness, written as a table and an offline figure."""

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


def run_circuit(args: argparse.Namespace) -> int:
    from gather_aggregate.attribution.edges import edge_attribution, rescore
    from gather_aggregate.attribution.graph import build_graph
    from gather_aggregate.core.results_io import atomic_write_json, atomic_write_text, out_dir, write_table
    from gather_aggregate.models.loading import load_model
    from gather_aggregate.tasks.metric import task_metric
    from gather_aggregate.tasks.registry import get_task
    from gather_aggregate.viz.circuit_graph import circuit_figure, circuit_html
    from gather_aggregate.zoo import resolve_model_path

    if getattr(args, "task_file", None) or (args.task and ":" in args.task):
        raise InputError("circuit runs on the built-in tasks (kv, mqar, letter-mc, ...); a task file or factory is "
                         "not supported here yet: pass --task NAME")
    path = resolve_model_path(args.model)
    out = out_dir(args.out, "ga_out/circuit")
    model = load_model(path, device=args.device)
    kwargs: dict[str, Any] = {"n_pairs": args.dict_size} if args.dict_size and args.task in ("kv", "mqar") else {}
    task = get_task(args.task or "kv", model_dir=Path(path) if Path(path).is_dir() else None, **kwargs)
    examples = task.examples(model.tokenizer, n=args.n, seed=args.seed)
    tokens, metric = task_metric(model, examples)
    if args.ablation in ("resample", "mean") and len({e.query_pos for e in examples}) != 1:
        raise InputError(f"--ablation {args.ablation} pairs prompts position by position and these prompts have "
                         "several lengths; use --ablation zero, or a task whose prompts share one length")
    if args.ablation == "resample" and tokens.shape[0] < 2:
        raise InputError("--ablation resample needs at least two prompts (--n 2 or more)")
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

        ga = find_ga_heads(model, examples)
        gather = [f"L{a}H{b}" for a, b in ga.gather] + [f"L{la}conv" for la in ga.gather_conv]
        aggregate = [f"L{a}H{b}" for a, b in ga.aggregate]
        nodes = named_nodes(ga, graph)
        if nodes:
            faith = {"nodes": nodes, **faithfulness(model, tokens, metric, nodes=nodes, graph=graph, **opts)}
    for r in rows:
        r["role"] = ("gather" if r["sender"] in gather else "aggregate" if r["sender"] in aggregate else "") + (
            " → aggregate" if r["receiver"] in aggregate else " → gather" if r["receiver"] in gather else "")
    meta = {"model_name": args.model, "task_name": args.task or "kv", "n": int(tokens.shape[0]), "seed": args.seed,
            "estimator": args.estimator, "steps": est.steps, "ablation": args.ablation, "n_edges": graph.n_edges,
            "gather": gather, "aggregate": aggregate, "faithfulness": faith}
    write_table(rows, out / "circuit.json", meta)
    atomic_write_json(out / "faithfulness.json", faith)
    fig = circuit_figure(est, top=args.top, gather=gather, aggregate=aggregate,
                         title=f"{args.model}: strongest {args.top} edges ({args.estimator}, exact where re-scored)")
    atomic_write_text(out / "circuit.html", circuit_html(fig, rows, title=f"{args.model} circuit"))
    print(f"{graph.n_edges} edges scored ({args.estimator}); the {len(rows)} strongest re-scored exactly -> "
          f"{out}/circuit.json, circuit.csv, circuit.html")
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
