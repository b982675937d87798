"""Head-scan speed and fidelity, side by side in one run.

For each model, on the same prompts and metric (mean log-prob of the right
answer on KV-retrieval):

* naive loop: one full ``run_with_hooks`` per head (TransformerLens'
  ``patching`` style) — the anchor;
* exact scan: cached prefix per layer + batched per-copy ablations, with the
  task's ``ReadoutMetric`` (forwards finish at the answer position only) and,
  for comparison, with the same metric as a plain function (full logits);
* AtP: one forward + one backward.

Prints a markdown table: times, exact-vs-naive speed-up and max score
difference, AtP-vs-exact speed-up, Spearman ρ and top-5 overlap.

    python benchmarks/bench_scan.py                      # shipped zoo models (or a random Llama if none)
    python benchmarks/bench_scan.py --models llama-ga mamba2-ga --n 32
    python benchmarks/bench_scan.py --models --deep 12   # random-weight 12-layer Llama and Mamba-2 only
    python benchmarks/bench_scan.py --models --deep 12 --deep-heads 16   # ... with 16 heads per layer
    python benchmarks/bench_scan.py --rows-sweep 32,64,128   # exact-scan time per stacked-batch size
    python benchmarks/bench_scan.py --bound   # the exact scan against its compute bound on this CPU, per model
    python benchmarks/bench_scan.py --models llama-kvmc --per-head   # ... and every head's exact and AtP score
    python benchmarks/bench_scan.py --device cuda --deep 12 --deep-heads 16   # on a GPU (not run here: none)

``--deep N`` adds a randomly initialised ``N``-layer Llama and Mamba-2 of the zoo's
widths and vocabulary (same KV prompts), to see the speed-ups at a depth the
2-4-layer zoo does not have (the exact scan's stays near 2-2.5x: every later
layer's mixer still runs at every position; see docs/benchmarks.md).  Their scores are those of
untrained weights: read the timing, not the ranking agreement.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _time(fn):
    _sync()
    t = time.perf_counter()
    out = fn()
    _sync()
    return time.perf_counter() - t, out


def deep_random_dir(arch: str, n_layers: int, n_heads: int | None = None) -> tuple[str, "os.PathLike"]:
    """A randomly initialised ``n_layers``-deep zoo-width ``arch`` model (``n_heads`` heads per layer, else the
    zoo's) with the zoo's tokenizer and tasks."""
    import shutil
    import tempfile
    from pathlib import Path

    from gather_aggregate.training.train import TrainConfig, build_model
    from gather_aggregate.zoo import list_zoo

    zoo = list_zoo()
    src = zoo.get({"llama": "llama-kv", "mamba2": "mamba2-ga"}[arch]) or next(iter(zoo.values()), None)
    if src is None:
        raise SystemExit("--deep needs a shipped zoo model for the tokenizer and tasks")
    out = Path(tempfile.mkdtemp(prefix=f"deep-{arch}-"))
    for f in Path(src).iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "facts", "zoo_tasks")):
            shutil.copy(f, out / f.name)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    cfg = TrainConfig(arch=arch, out=str(out), n_layers=n_layers, n_heads=n_heads).resolved()
    build_model(cfg, len(tok), tok.pad_token_id, tok.eos_token_id).save_pretrained(out)
    return f"{arch} random {n_layers}L" + (f"×{n_heads}H" if n_heads else ""), out


def kv_setup(name: str, n: int, dict_size: int | None, threads: int, path: "os.PathLike | None" = None,
             kind: str = "logprob", device: str = "cpu"):
    """``(model, task, tokens, metric)``: zoo model ``name`` (or ``path``; a random 4-layer Llama if neither
    exists) with ``n`` KV prompts (seed 0) and the task's metric (answer log-prob, or ``kind="logit_diff"``)."""
    import torch

    from gather_aggregate import load_model
    from gather_aggregate.tasks import task_metric
    from gather_aggregate.tasks.registry import get_task
    from gather_aggregate.zoo import list_zoo

    torch.set_num_threads(threads)
    path = path or list_zoo().get(name)
    if path is None:
        import tempfile

        from gather_aggregate.testing.tiny_models import save_model_dir, tiny_llama

        hf, tok = tiny_llama(num_hidden_layers=4)
        path = save_model_dir(hf, tok, tempfile.mkdtemp())
    model = load_model(path, device=device)
    task = get_task("kv", model_dir=path, **({"n_pairs": dict_size} if dict_size else {}))
    tokens, metric = task_metric(model, task.examples(model.tokenizer, n=n, seed=0), kind=kind)
    return model, task, tokens, metric


def bench_model(name: str, n: int, dict_size: int | None, threads: int, method: str = "zero",
                path: "os.PathLike | None" = None, max_rows: int | None = None, kind: str = "logprob",
                repeats: int = 3, device: str = "cpu") -> dict:
    from gather_aggregate.scan.exact import atp_scan, compare_rankings, exact_scan, naive_scan
    from gather_aggregate.tasks import task_metric

    model, task, tokens, metric = kv_setup(name, n, dict_size, threads, path, kind, device)
    abl: dict = {"method": method}
    if method != "zero":  # reference prompts: the same task, other seed (same length: per-position means)
        ref, _ = task_metric(model, task.examples(model.tokenizer, n=n, seed=1), kind=kind)
        abl["reference"] = ref
    runs = {  # each timed best-of-``repeats``, the methods interleaved so that a busy machine slows them alike
        "naive": lambda: naive_scan(model, tokens, metric, **abl),
        "exact": lambda: exact_scan(model, tokens, metric, progress=False, max_rows=max_rows, **abl),
        "full": lambda: exact_scan(model, tokens, lambda lg: metric(lg), progress=False,  # no readout finish
                                   max_rows=max_rows, **abl),
        "atp": lambda: atp_scan(model, tokens, metric, **abl),
    }
    best, out = {k: float("inf") for k in runs}, {}
    for _ in range(repeats):
        for k, fn in runs.items():
            t, out[k] = _time(fn)
            best[k] = min(best[k], t)
    t_naive, t_exact, t_full, t_atp = (best[k] for k in ("naive", "exact", "full", "atp"))
    naive, exact, full, atp = (out[k] for k in ("naive", "exact", "full", "atp"))
    diff = max(abs(e.score(*hd) - naive.score(*hd)) for hd in model.all_heads() for e in (exact, full))
    cmp = compare_rankings(exact, atp, k=5)
    return {"model": name, "method": method, "heads": len(model.all_heads()), "prompts": tuple(tokens.shape),
            "naive_s": t_naive, "exact_s": t_exact, "atp_s": t_atp, "full_s": t_full,
            "exact_speedup": t_naive / t_exact, "full_speedup": t_naive / t_full, "max_abs_diff": diff,
            "atp_speedup_vs_exact": t_exact / t_atp, "spearman": cmp["spearman"], "top5": cmp["top5_overlap"],
            "per_head": [(hd, score, atp.score(*hd)) for hd, score in
                         sorted(exact.scores().items(), key=lambda t: -t[1])]}


def cpu_bound(name: str, n: int, threads: int, repeats: int = 3, path: "os.PathLike | None" = None) -> dict:
    """The exact scan against its compute bound on this CPU, timed side by side (best of ``repeats``, interleaved).

    On a compute-bound CPU a stacked copy costs what a separate forward costs, so no exact scan can spend less
    than the one clean forward plus, for every head, the forward downstream of its edit (the layers above it, the
    last mixer at every position, the finish at the readout rows).  ``bound_s`` times exactly that: the clean
    forward plus one resumed forward per layer (the engine's own, one copy of the batch) times the layer's head
    count.  ``naive_s / bound_s`` is the most any exact scan can gain over the naive loop here, and
    ``bound_s / exact_s`` the fraction of it the scan reaches.
    """
    import torch

    from gather_aggregate.interventions import layer_resume
    from gather_aggregate.interventions.ablation import Edit, group_by_layer
    from gather_aggregate.scan.exact import exact_scan, naive_scan

    model, _, tokens, metric = kv_setup(name, n, None, threads, path)
    by_layer = group_by_layer(model.all_heads())
    how = layer_resume.plan(model, by_layer, readout=True)
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens, names_filter=layer_resume.cache_names(model, how))
        how = layer_resume.verify(model, cache, how, logits)

    def bound() -> None:
        with torch.no_grad():
            model(tokens)
            for layer, hs in by_layer.items():
                t, _ = _time(lambda layer=layer, hs=hs: layer_resume.edited_logits(
                    model, cache, how, layer, [Edit(layer, hs[0])], lambda e, cur: cur, metric))
                bound.extra += t * (len(hs) - 1)  # the other heads of the layer cost the same forward

    runs = {"naive": lambda: naive_scan(model, tokens, metric),
            "exact": lambda: exact_scan(model, tokens, metric, progress=False), "bound": bound}
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeats):
        for k, fn in runs.items():
            bound.extra = 0.0
            t, _ = _time(fn)
            best[k] = min(best[k], t + (bound.extra if k == "bound" else 0.0))
    return {"model": name, "heads": len(model.all_heads()), "layers": model.n_layers, "prompts": tuple(tokens.shape),
            "naive_s": best["naive"], "exact_s": best["exact"], "bound_s": best["bound"]}


def rows_sweep(name: str, n: int, sizes: list[int], threads: int, repeats: int = 3) -> dict:
    """Best-of-``repeats`` exact-scan time (task ``ReadoutMetric``) for each ``max_rows``, the sizes interleaved
    so that a busy machine slows them alike."""
    from gather_aggregate.scan.exact import exact_scan

    model, _, tokens, metric = kv_setup(name, n, None, threads)
    best = {m: float("inf") for m in sizes}
    for _ in range(repeats):
        for m in sizes:
            best[m] = min(best[m], _time(lambda m=m: exact_scan(model, tokens, metric, max_rows=m, progress=False))[0])
    return best


def main(argv: list[str] | None = None) -> int:
    from gather_aggregate.zoo import list_zoo

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="*", default=None,
                   help="zoo names (default: every shipped zoo model; an empty --models with --deep: none)")
    p.add_argument("--deep", type=int, default=None, metavar="N",
                   help="also scan randomly initialised N-layer Llama and Mamba-2 models (timing only)")
    p.add_argument("--deep-heads", type=int, default=None, metavar="H",
                   help="with --deep: H heads per layer instead of the zoo's (4 Llama, 8 Mamba-2)")
    p.add_argument("--n", type=int, default=32, help="prompts per scan")
    p.add_argument("--dict-size", type=int, default=None)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--method", choices=["zero", "mean", "resample"], default="zero", help="ablation method")
    p.add_argument("--metric", choices=["logprob", "logit_diff"], default="logprob",
                   help="what every scan scores: the answer's log-prob or its logit difference")
    p.add_argument("--repeats", type=int, default=3,
                   help="time every method best-of-this, the methods interleaved (default 3)")
    p.add_argument("--device", default="cpu",
                   help="e.g. cuda: where the ≥ 5x exact-scan goal is meant to be met (stacked copies are nearly "
                        "free on an under-used GPU; none here)")
    p.add_argument("--per-head", action="store_true",
                   help="also print every head's exact and AtP scores, best exact first")
    p.add_argument("--max-rows", type=int, default=None, help="exact scan's stacked rows per forward (default: 32 on CPU)")
    p.add_argument("--bound", action="store_true",
                   help="instead: the exact scan against its compute bound (clean forward + one downstream forward "
                        "per head), per model")
    p.add_argument("--rows-sweep", type=lambda v: [int(x) for x in v.split(",")], default=None, metavar="R1,R2,..",
                   help="instead: time the exact scan of each zoo model at these max_rows values (best of 3)")
    args = p.parse_args(argv)
    models = args.models if args.models is not None else (list(list_zoo()) or ["random-llama"])
    if args.bound:
        rows = [cpu_bound(m, args.n, args.threads, args.repeats) for m in models]
        if args.deep:
            rows += [cpu_bound(name, args.n, args.threads, args.repeats, path) for name, path in
                     (deep_random_dir(arch, args.deep, args.deep_heads) for arch in ("llama", "mamba2"))]
        print("| model | layers | heads | prompts | naive (s) | bound (s) | bound speed-up | exact (s) "
              "| exact speed-up | fraction of bound |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['model']} | {r['layers']} | {r['heads']} | {r['prompts'][0]}×{r['prompts'][1]} | "
                  f"{r['naive_s']:.2f} | {r['bound_s']:.2f} | {r['naive_s'] / r['bound_s']:.1f}× | {r['exact_s']:.2f} | "
                  f"{r['naive_s'] / r['exact_s']:.1f}× | **{r['bound_s'] / r['exact_s']:.2f}** |")
        return 0
    if args.rows_sweep:
        print("| model | prompts | " + " | ".join(f"{m} rows (s)" for m in args.rows_sweep) + " |")
        print("|---|---|" + "---|" * len(args.rows_sweep))
        for m in models:
            best = rows_sweep(m, args.n, args.rows_sweep, args.threads)
            print(f"| {m} | {args.n} | " + " | ".join(f"{best[r]:.3f}" for r in args.rows_sweep) + " |")
        return 0
    rows = [bench_model(m, args.n, args.dict_size, args.threads, args.method, max_rows=args.max_rows, kind=args.metric,
                        repeats=args.repeats, device=args.device) for m in models]
    if args.deep:
        for arch in ("llama", "mamba2"):
            name, path = deep_random_dir(arch, args.deep, args.deep_heads)
            rows.append(bench_model(name, args.n, args.dict_size, args.threads, args.method, path=path,
                                    max_rows=args.max_rows, kind=args.metric, repeats=args.repeats,
                                    device=args.device))
    print("| model | ablation | heads | prompts | naive (s) | exact, full logits (s) | speed-up | exact, readout (s) "
          "| speed-up | max abs diff | AtP (s) | AtP speed-up vs exact | Spearman ρ | top-5 overlap |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['method']} | {r['heads']} | {r['prompts'][0]}×{r['prompts'][1]} | {r['naive_s']:.2f} | "
              f"{r['full_s']:.2f} | {r['full_speedup']:.1f}× | {r['exact_s']:.2f} | {r['exact_speedup']:.1f}× | "
              f"{r['max_abs_diff']:.1e} | {r['atp_s']:.3f} | {r['atp_speedup_vs_exact']:.1f}× | {r['spearman']:.3f} | "
              f"{int(r['top5'])}/5 |")
    if args.per_head:
        for r in rows:
            print(f"\n{r['model']}: head, exact score, AtP score")
            for (layer, head), ex, at in r["per_head"]:
                print(f"  L{layer}H{head} {ex:9.3f} {at:9.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
