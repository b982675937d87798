"""Cost of edge attribution against the node-level scans, at 192 and 1024 heads (random weights, CPU).

    OMP_NUM_THREADS=1 python benchmarks/bench_edges.py [--shapes 12x16 32x32] [--arch llama mamba2] [--n 2]

Per random model (zoo width, ``L`` layers × ``H`` heads, the zoo's tokenizer and KV prompts of ~64 tokens), the wall
time per prompt (best of ``--repeats``, one thread) and the peak RSS growth of: the graph's build (its checks
included), EAP over every edge, EAP-IG with 5 steps, exact patching of the 20 strongest EAP edges, and, for
comparison, the node-level AtP scan and the exact head scan (``--exact-scan``) of the same prompts.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(__file__))


def bench(arch: str, layers: int, heads: int, n: int, repeats: int, exact_scan: bool) -> list[dict]:
    from _common import measure
    from bench_scan import deep_random_dir

    from gather_aggregate import load_model
    from gather_aggregate.attribution.edges import edge_attribution, rescore
    from gather_aggregate.attribution.graph import build_graph
    from gather_aggregate.scan import exact as scans
    from gather_aggregate.tasks.metric import task_metric
    from gather_aggregate.tasks.registry import get_task

    name, path = deep_random_dir(arch, layers, heads)
    model = load_model(path)
    ex = get_task("kv", model_dir=path).examples(model.tokenizer, n=n, seed=0)
    tokens, metric = task_metric(model, ex)
    opts = {"method": "resample", "reference": tokens}
    m, graph = measure(lambda: build_graph(model), 1)
    rows = [{"what": "graph build", **m}]
    m, eap = measure(lambda: edge_attribution(model, tokens, metric, graph=graph, **opts), repeats)
    rows.append({"what": "EAP, every edge", **m})
    m, _ = measure(lambda: edge_attribution(model, tokens, metric, graph=graph, estimator="eap-ig", steps=5, **opts),
                   repeats)
    rows.append({"what": "EAP-IG (5 steps), every edge", **m})
    m, _ = measure(lambda: rescore(model, tokens, metric, eap, k=20, reference=tokens), 1)
    rows.append({"what": "exact patching of the 20 strongest edges", **m})
    m, _ = measure(lambda: scans.atp_scan(model, tokens, metric), repeats)
    rows.append({"what": "node level: AtP scan of every head", **m})
    if exact_scan:
        m, _ = measure(lambda: scans.exact_scan(model, tokens, metric, progress=False), 1)
        rows.append({"what": "node level: exact scan of every head", **m})
    for r in rows:
        r.update(model=name, heads=layers * heads, edges=graph.n_edges, tokens=int(tokens.shape[1]), n=n)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="*", default=["12x16", "32x32"], help="LAYERSxHEADS")
    ap.add_argument("--arch", nargs="*", default=["llama", "mamba2"])
    ap.add_argument("--n", type=int, default=2, help="prompts")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--exact-scan", action="store_true", help="also the exact head scan (slow at 1024 heads)")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    print("| model | heads | edges | tokens | what | s per prompt | peak RSS growth |")
    print("|---|---|---|---|---|---|---|")
    for arch in args.arch:
        for shape in args.shapes:
            layers, heads = (int(x) for x in shape.split("x"))
            for r in bench(arch, layers, heads, args.n, args.repeats, args.exact_scan):
                print(f"| {r['model']} | {r['heads']} | {r['edges']} | {r['tokens']} | {r['what']} | "
                      f"{r['wall_s'] / r['n']:.3f} | {r['dpeak_mib']:.0f} MiB |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
