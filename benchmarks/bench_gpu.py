"""The whole pipeline on CUDA with real-width random checkpoints (run once, on an H200: docs/benchmarks.md, "On a GPU").

Per family (``gather_aggregate.testing.realwidth``; published widths, ``--layers`` layers, shipped dtype and
sharding) it measures, in one process, one family at a time:

* bf16 (shipped dtype) load: time and peak device memory / parameter bytes (goal <= 1.1);
* forward, ``run_with_cache`` (every hook), last-row pattern of each layer, one exact scan over ``--heads``
  heads of every layer against the naive loop (max |Δscore|), an AtP scan of all heads;
* for SSM layers: mamba-ssm's fused kernels (``scan_impl="kernel"``, when installed) against our chunked
  scan: max |Δlogit| and forward time;
* fp32 logits against HF's own model on the same device.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_gpu.py                 # all families, on cuda
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_gpu.py --device cpu --layers 1 --vocab 1024 \\
        --families mamba2-2.7b     # the CPU smoke run used by tests/test_bench_smoke-style checks
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

FAMILIES = ("falcon-mamba-7b", "mamba2-2.7b", "zamba2-7b", "jamba-v0.1", "bamba-9b")


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _timed(fn: Any, device: str, repeats: int = 3) -> tuple[float, Any]:
    out, best = None, float("inf")
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        out = fn()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return best, out


def run_family(name: str, tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    from gather_aggregate import load_model
    from gather_aggregate.adapters.fastpath import kernels_available
    from gather_aggregate.scan.exact import atp_scan, exact_scan, naive_scan
    from gather_aggregate.testing.realwidth import PUBLISHED, hf_reference, param_bytes, write_checkpoint

    dev = args.device
    cut = {"vocab": args.vocab} if args.vocab else {}
    d = write_checkpoint(name, tmp / name, n_layers=args.layers, **cut)
    row: dict[str, Any] = {"family": name, "layers": args.layers, "dtype": PUBLISHED[name]["dtype"]}
    if dev.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    model = load_model(d, tokenizer=False, device=dev)
    _sync(dev)
    row["load_s"] = time.perf_counter() - t0
    row["param_GiB"] = param_bytes(model) / 2**30
    row["kept_dtype"] = str(model.dtype).replace("torch.", "")
    if dev.startswith("cuda"):
        row["load_peak_over_params"] = (torch.cuda.max_memory_allocated() - base) / param_bytes(model)
    vocab = args.vocab or PUBLISHED[name]["vocab_size"]
    tokens = torch.randint(0, vocab, (args.batch, args.seq), generator=torch.Generator().manual_seed(0)).to(dev)
    with torch.no_grad():
        row["forward_s"], logits = _timed(lambda: model(tokens), dev)
        row["cache_s"], _ = _timed(lambda: model.run_with_cache(tokens)[0], dev, repeats=1)
    t0 = time.perf_counter()
    for info in model.layers:
        model.pattern(tokens[:1], info.index, rows=-1)
    _sync(dev)
    row["last_row_patterns_s"] = time.perf_counter() - t0
    sub = tokens[: min(2, args.batch)]  # the scans run on the first two prompts
    target = sub[:, -1]

    def metric(lg: torch.Tensor) -> torch.Tensor:
        return lg[:, -1].float().log_softmax(-1).gather(-1, target[:, None]).mean()

    heads = [(i.index, h) for i in model.layers for h in range(min(args.heads, i.n_heads))]
    t0 = time.perf_counter()
    exact = exact_scan(model, sub, metric, heads=heads, progress=False).scores()
    _sync(dev)
    row["exact_scan_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    naive = naive_scan(model, sub, metric, heads=heads).scores()
    _sync(dev)
    row["naive_scan_s"] = time.perf_counter() - t0
    row["exact_vs_naive"] = max(abs(exact[h] - naive[h]) for h in heads)
    t0 = time.perf_counter()
    atp = atp_scan(model, sub, metric)
    _sync(dev)
    row["atp_s"], row["atp_heads"] = time.perf_counter() - t0, len(atp.rows)
    if any(i.kind == "ssm" for i in model.layers) and dev.startswith("cuda") and kernels_available():
        model.scan_impl = "chunked"
        with torch.no_grad():
            row["chunked_s"], chunked = _timed(lambda: model(tokens), dev)
            model.scan_impl = "kernel"
            row["kernel_s"], fused = _timed(lambda: model(tokens), dev)
        row["kernel_vs_chunked"] = (fused - chunked).abs().max().item()
        model.scan_impl = "auto"
    model = None  # free it before the fp32 pair
    # fp32 against HF's own model, on the same device
    kw = {"n_layers": args.layers, **cut}
    hf = hf_reference(name, d, **kw).to(dev)
    ours = load_model(d, tokenizer=False, device=dev, dtype="float32")
    with torch.no_grad():
        row["fp32_dlogit_vs_hf"] = (ours(tokens).float() - hf(tokens).logits.float()).abs().max().item()
    del hf, ours
    if dev.startswith("cuda"):
        torch.cuda.empty_cache()
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", nargs="*", default=list(FAMILIES))
    p.add_argument("--device", default="cuda")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=None, help="cut the vocabulary (default: the published one)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--heads", type=int, default=4, help="heads per layer in the exact/naive scans")
    p.add_argument("--json", default=None, help="also write the rows here")
    args = p.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("no CUDA device; run with --device cpu for a smoke run")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.families:
            rows.append(run_family(name, Path(tmp), args))
            print(json.dumps(rows[-1]), flush=True)
    if args.json:
        from gather_aggregate.core.results_io import atomic_write_json

        atomic_write_json(args.json, {"rows": rows, "device": args.device})
    keys = ["family", "kept_dtype", "param_GiB", "load_s", "load_peak_over_params", "forward_s", "cache_s",
            "last_row_patterns_s", "exact_scan_s", "naive_scan_s", "exact_vs_naive", "atp_s", "chunked_s", "kernel_s",
            "kernel_vs_chunked", "fp32_dlogit_vs_hf"]
    print("\n| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for r in rows:
        cells = [f"{r[k]:.3g}" if isinstance(r.get(k), float) else str(r.get(k, "—")) for k in keys]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
