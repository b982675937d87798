"""Random configurations the tests never use: each hybrid family's random-config check on fresh seeds.

``tests/hybrid_family_checks.py`` runs seeds 0-11 of every family's ``random_config`` in the default suite; this
runs the same check (logits equal HF's to 1e-4 in fp32, HF's weights untouched, and the family's extra checks,
e.g. Qwen3-Next's sequential oracle path) on any other seed range and prints each failure with its numbers.

For a failure it also says how far each fp32 computation is from the family's formula in float64: HF's modeling
module re-executed with every ``torch.float32`` / ``.float()`` cast made float64 (HF upcasts its fp32 internals
only to fp32, so HF's model in float64 is not a float64 evaluation), the same weights, run in float64.  Where HF's
own fp32 is as far from that as ours, the tolerance is below fp32 rounding for that configuration.

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 .venv/bin/python scripts/fuzz_family_configs.py --seeds 100 200
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
TESTS = Path(__file__).resolve().parents[1] / "tests"
MODULES = ("test_nemotron_h", "test_falcon_h1", "test_granite_hybrid", "test_qwen3_next")


def distances(suite, hf, toks) -> str:
    """Max abs distance of our fp32 logits (each implementation the suite checks) and HF's from float64."""
    import torch

    from gather_aggregate.testing.fuzz.check import float64_logits

    truth = float64_logits(hf, toks)
    model = suite.load(hf)
    with torch.no_grad():
        got = {"HF fp32": hf(toks, use_cache=False).logits, "ours": model(toks)}
        if hasattr(model, "scan_impl"):
            model.scan_impl = "sequential"
            got["ours sequential"] = model(toks)
    return ", ".join(f"{k} {(v.double() - truth).abs().max().item():.1e}" for k, v in got.items())


def main(argv: list[str] | None = None) -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs=2, default=(100, 124), metavar=("FIRST", "END"))
    p.add_argument("--modules", nargs="*", default=list(MODULES), help="family test modules under tests/")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    sys.path.insert(0, str(TESTS))
    from hybrid_family_checks import check_matches_hf, tokens

    failed = 0
    for name in args.modules:
        for suite in [v for k, v in vars(importlib.import_module(name)).items()
                      if k.startswith("Test") and hasattr(v, "random_config")]:
            bad, t0 = 0, time.perf_counter()
            for seed in range(*args.seeds):
                try:
                    hf = suite.make_hf(seed, config=suite.random_config(seed))
                    toks = tokens(61, L=suite.lengths[seed % 3], seed=seed)
                    model, ref = check_matches_hf(hf, suite.load, toks)
                    suite().check_random_model(model, toks, ref)
                except AssertionError as e:
                    bad += 1
                    found = re.search(r"Greatest absolute difference: ([0-9.e+-]+)", str(e))
                    where = re.search(r"Mismatched elements: (\d+ / \d+)", str(e))
                    what = (f"max abs diff {float(found.group(1)):.1e} ({where.group(1) if where else '?'} logits over)"
                            if found else " ".join(str(e).split())[:200])
                    print(f"{suite.__name__} seed {seed}: {what}; from float64: {distances(suite, hf, toks)}",
                          flush=True)
            failed += bad
            print(f"{suite.__name__}: seeds {args.seeds[0]}-{args.seeds[1] - 1}, {bad} over tolerance, "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
