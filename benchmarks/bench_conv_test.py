"""What the detector's conv test costs, by half (``gather_aggregate.detect.conv_gather``).

For each zoo model with a short conv, on its KV prompts (32, seed 0; batches of 16, the detector's default), this
runs ``find_ga_heads`` once and reports its wall time, the conv test's time inside it, and the conv test's forwards
(one per batch each, every one restarted at the conv's layer).  The necessity half's forwards follow from the
records exactly: one per layer, and ``N_RANDOM`` more where its loss reaches ``NAME_MIN``; the rest are the
sufficiency half's (one for ``all_loss``, and one plus ``N_RANDOM`` more where ``all_loss`` reaches ``NAME_MIN``).

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python benchmarks/bench_conv_test.py [MODEL ...]
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(__file__))

MODELS = ("bamba-ga", "mamba2-ga", "mamba2-mc", "mamba1-kv")
N, BATCH = 32, 16


def measure(name: str) -> dict[str, Any]:
    import gather_aggregate.detect.rules as rules
    from gather_aggregate import load_model
    from gather_aggregate.detect.causal_evidence import N_RANDOM
    from gather_aggregate.detect.detector import find_ga_heads
    from gather_aggregate.tasks.registry import get_task
    from gather_aggregate.zoo import zoo_path

    model = load_model(zoo_path(name))
    ex = get_task("kv", model_dir=zoo_path(name)).examples(model.tokenizer, n=N, seed=0)
    spent: dict[str, float] = {}
    inner = rules.conv_gather

    def timed(model: Any, prober: Any, read: str, name_min: float, *, seed: int = 0) -> Any:
        n0, t0 = prober.n_forwards, time.perf_counter()
        out = inner(model, prober, read, name_min, seed=seed)
        spent.update(t=time.perf_counter() - t0, n=prober.n_forwards - n0)
        return out

    rules.conv_gather = timed  # the detector looks it up in rules at call time
    try:
        t0 = time.perf_counter()
        ga = find_ga_heads(model, ex, batch_size=BATCH)
        total = time.perf_counter() - t0
    finally:
        rules.conv_gather = inner
    batches = -(-N // BATCH)
    necessity = sum(1 + (N_RANDOM if c["loss"] >= rules.NAME_MIN else 0) for c in ga.conv) * batches
    return {"model": name, "detector_s": total, "conv_s": spent["t"], "forwards": int(spent["n"]),
            "necessity": necessity, "named": {c["layer"]: c["by"] for c in ga.conv if c["named"]}}


def main(argv: list[str] | None = None) -> int:
    import argparse

    from _common import single_thread

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="*", default=list(MODELS), help=f"zoo models (default: {', '.join(MODELS)})")
    names = p.parse_args(argv).models
    single_thread()
    print("| model | detector | conv test | its share | conv forwards: necessity + sufficiency | named by |")
    print("|---|---|---|---|---|---|")
    for name in names:
        r = measure(name)
        by = "; ".join(f"L{la}: {', '.join(b)}" for la, b in r["named"].items()) or "–"
        print(f"| {r['model']} | {r['detector_s']:.1f} s | {r['conv_s']:.1f} s | {r['conv_s'] / r['detector_s']:.0%} | "
              f"{r['necessity']} + {r['forwards'] - r['necessity']} | {by} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
