"""Forward-pass speed of the hooked SSMs against HF and TransformerLens 4.3, in one run.

Small configs (d_model 256, d_inner 512, 2 layers, Mamba-1 d_state 16; Mamba-2
8 heads x 64, d_state 64), batch 8 x 512 tokens, random weights, CPU.  Columns:

* ``ours``        - our hooked forward (every HookPoint in the graph, no hook functions)
* ``ours+cache``  - the same, caching every hook (run_with_cache)
* ``HF``          - the HF pure-torch forward of the same weights (use_cache=False)
* ``TL eager``    - TransformerLens 4.3's bridge with ``eager_scan=True`` (its hooked SSM path)

Timings are the minimum over interleaved repeats (the machine is shared), single-threaded by default
(``--threads``).  The process caps its own address space (``--max-gib``, default 10) so that an oversized
run fails with ``MemoryError`` instead of waking the OOM killer.
Run: ``python benchmarks/bench_ssm_forward.py [--batch 8 --seq 512 --repeats 3 --threads 1]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from _common import limit_address_space, machine  # noqa: E402


def build(model_type: str, d_model: int):
    from gather_aggregate.adapters import load_ssm
    from gather_aggregate.testing.tiny_ssm import tiny_hf_ssm

    if model_type == "mamba2":
        hf = tiny_hf_ssm("mamba2", seed=0, vocab_size=1000, hidden_size=d_model, num_hidden_layers=2, expand=2,
                         num_heads=2 * d_model // 64, head_dim=64, n_groups=1, state_size=64, chunk_size=256)
    else:
        hf = tiny_hf_ssm("mamba", seed=0, vocab_size=1000, hidden_size=d_model, num_hidden_layers=2, expand=2,
                         state_size=16)
    return hf, load_ssm(hf)


def tl_bridge(hf, arch):
    import copy

    from transformer_lens.model_bridge.sources._bridge_builder import build_bridge_from_module

    bridge = build_bridge_from_module(copy.deepcopy(hf), arch, hf_config=hf.config)
    for blk in bridge.blocks:
        blk.mixer.eager_scan = True
    return bridge


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-tl", action="store_true", help="skip the TransformerLens column")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-gib", type=float, default=10.0, help="address-space cap of this process")
    args = ap.parse_args()
    limit_address_space(args.max_gib)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tokens = torch.randint(0, 1000, (args.batch, args.seq))
    rows = []
    for model_type, arch, goal in [("mamba", "MambaForCausalLM", 1.0), ("mamba2", "Mamba2ForCausalLM", 1.2)]:
        hf, ours = build(model_type, args.d_model)
        runs = {
            "ours": lambda m=ours: m(tokens),
            "ours+cache": lambda m=ours: m.run_with_cache(tokens),
            "HF": lambda m=hf: m(tokens, use_cache=False),
        }
        if not args.no_tl:
            bridge = tl_bridge(hf, arch)
            runs["TL eager"] = lambda m=bridge: m(tokens, use_cache=False)
        with torch.no_grad():
            ref = hf(tokens, use_cache=False).logits
            diff = (ours(tokens) - ref).abs().max().item()
            best = {k: float("inf") for k in runs}
            for _ in range(args.repeats):
                for k, fn in runs.items():
                    best[k] = min(best[k], timed(fn))
        rows.append((model_type, best, goal, diff))

    cols = ["ours", "ours+cache", "HF"] + ([] if args.no_tl else ["TL eager"])
    print(f"\nSSM forward, batch {args.batch} x {args.seq} tokens, d_model {args.d_model}, 2 layers, "
          f"{torch.get_num_threads()} threads (seconds, min of {args.repeats}); {machine()}")
    print(f"{'model':8s} " + " ".join(f"{c:>11s}" for c in cols) + f" {'ours/HF':>8s} {'goal':>6s} "
          f"{'cache/HF':>9s} {'TL/ours':>8s} {'max|dlogit|':>11s}")
    for model_type, best, goal, diff in rows:
        tl = f"{best['TL eager'] / best['ours']:8.1f}" if "TL eager" in best else f"{'-':>8s}"
        print(f"{model_type:8s} " + " ".join(f"{best[c]:11.3f}" for c in cols)
              + f" {best['ours'] / best['HF']:8.2f} {'<=' + str(goal):>6s} {best['ours+cache'] / best['HF']:9.2f} "
              + f"{tl} {diff:11.2e}")


if __name__ == "__main__":
    main()
