"""Mamba-1 training step: the project's chunked scan against HF's own CPU path, side by side in one run.

Both train the same ``MambaForCausalLM`` weights on the same batches of the zoo's
training mixture (``gather_aggregate.training``): one AdamW step = forward, answer-token
cross-entropy, backward, clip, update.  HF's path is ``use_mambapy=True`` (mambapy's
parallel scan over the whole sequence, what ``zoo train --arch mamba1 --mamba1-scan hf``
uses); ours swaps each mixer's scan for :func:`gather_aggregate.adapters.selective_scan.mamba1_scan`
(``--mamba1-scan chunked``, the default).  The two alternate, batch by batch, so load
on the machine hits both alike; the first step of each is a warm-up and is not timed.

    OMP_NUM_THREADS=1 python benchmarks/bench_mamba1_training.py                  # zoo mamba1-ga size
    OMP_NUM_THREADS=1 python benchmarks/bench_mamba1_training.py --batch-size 64 --steps 4
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import random
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(argv: list[str] | None = None) -> None:
    import torch

    from gather_aggregate.training.data import Mixture
    from gather_aggregate.training.train import (
        TrainConfig,
        _training_batches,
        build_model,
        set_mamba1_scan,
        train_step,
    )
    from gather_aggregate.training.vocab import PAD, build_tokenizer, make_world

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--n-layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--d-state", type=int, default=16)
    p.add_argument("--kv-max", type=int, default=12)
    p.add_argument("--steps", type=int, default=5, help="timed steps per path (after one warm-up step each)")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    mix = {"kv": 0.6, "letter_mc": 0.3, "content_mc": 0.05, "knowledge": 0.05}
    cfg = TrainConfig(arch="mamba1", n_layers=a.n_layers, d_model=a.d_model, d_state=a.d_state, batch_size=a.batch_size,
                      kv_start=a.kv_max, kv_max=a.kv_max, mixture=mix).resolved()
    world = make_world(0)
    tok, vocab = build_tokenizer(world), world.vocab()
    hf = build_model(dataclasses.replace(cfg, mamba1_scan="hf"), len(vocab), vocab[PAD], tok.eos_token_id)
    ours = set_mamba1_scan(copy.deepcopy(hf), "chunked")
    batches = _training_batches(world, random.Random(0), Mixture(kv_max_pairs=a.kv_max, **mix), cfg, vocab, vocab[PAD])
    data = [next(batches) for _ in range(a.steps + 1)]
    with torch.no_grad():
        x = data[0][0]
        diff = (hf(input_ids=x, use_cache=False).logits - ours(input_ids=x, use_cache=False).logits).abs().max()
    opts = {name: torch.optim.AdamW(m.parameters(), lr=1e-3) for name, m in (("hf", hf), ("ours", ours))}
    times: dict[str, list[float]] = {"hf": [], "ours": []}
    for i, (x, y) in enumerate(data):
        for name, m in (("hf", hf), ("ours", ours)):
            m.train()
            t = time.perf_counter()
            train_step(m, opts[name], x, y)
            if i:
                times[name].append(time.perf_counter() - t)
    mean = {k: sum(v) / len(v) for k, v in times.items()}
    shape = f"{a.n_layers} layers, d {a.d_model}, N {a.d_state}, batch {a.batch_size}"
    lengths = sorted(int(x.shape[1]) for x, _ in data[1:])
    print(f"Mamba-1 training step ({shape}; sequence lengths {lengths}; {a.threads} thread(s); "
          f"max |logit diff| at init {diff.item():.1e})\n")
    print("| path | s / step (mean) | per step |")
    print("|---|---|---|")
    print(f"| HF `MambaForCausalLM`, `use_mambapy=True` | {mean['hf']:.2f} | {', '.join(f'{t:.2f}' for t in times['hf'])} |")
    print(f"| chunked scan (`--mamba1-scan chunked`) | {mean['ours']:.2f} | "
          f"{', '.join(f'{t:.2f}' for t in times['ours'])} |")
    print(f"\nspeed-up: {mean['hf'] / mean['ours']:.2f}x")


if __name__ == "__main__":
    main()
