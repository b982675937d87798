"""Resuming a transformer's forward at layer k: TransformerLens 4.x's bridge against ours, side by side.

TL's ``start_at_layer`` feeds the cached residual in as input embeddings, runs
blocks ``0..k-1`` anyway and swaps the residual back in at block ``k``;
``BridgeModel`` makes those blocks pass their input through.  On a random
``--layers``-deep zoo-width Llama and 32 KV prompts, this prints the full
forward, TL's resume and ours at a few start layers, and checks that both
resumes give the full forward's logits.

    python benchmarks/bench_resume.py [--layers 8] [--n 32]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(argv: list[str] | None = None) -> int:
    import torch
    from bench_scan import _time, deep_random_dir, kv_setup

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--n", type=int, default=32, help="prompts")
    args = p.parse_args(argv)
    name, path = deep_random_dir("llama", args.layers)
    model, _, tokens, _ = kv_setup(name, args.n, None, 1, path)
    with torch.no_grad():
        full_s, full = _time(lambda: model(tokens), repeats=3)
        _, cache = model.run_with_cache(tokens, names_filter=lambda name: name.endswith("hook_resid_pre"))
        print(f"random {args.layers}-layer Llama, {tuple(tokens.shape)} tokens, 1 thread; full forward "
              f"{full_s:.3f} s\n")
        print("| start layer | TL 4.x `start_at_layer` (s) | ours (s) | ours vs TL | max abs diff to the full "
              "forward (TL / ours) |")
        print("|---|---|---|---|---|")
        for k in sorted({1, args.layers // 2, args.layers - 1}):
            resid = cache[model.resid_hook(k)]
            model(resid, start_at_layer=k)  # the first resumed call learns the layers' output type
            tl_s, tl = _time(lambda r=resid, k=k: model.module(r, start_at_layer=k), repeats=3)
            ours_s, ours = _time(lambda r=resid, k=k: model(r, start_at_layer=k), repeats=3)
            print(f"| {k} | {tl_s:.3f} | {ours_s:.3f} | {tl_s / ours_s:.1f}× | "
                  f"{float((tl - full).abs().max()):.1e} / {float((ours - full).abs().max()):.1e} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
