"""Draw random small configurations of every supported family and check each against its reference.

``gather_aggregate.testing.fuzz.draws`` draws them (odd widths, head sizes that are not powers of two, groups from
1 to the head count, conv kernels 1-5, bias toggles, Δ limits, norm epsilons, layouts with any layer kind first,
last or everywhere, expert counts, μP multipliers, GQA, rotary share and base, prompts of length 1 to 40, batches
of 1-3) and checks logits, residual hooks, attention patterns and implied attention (``check_case``).  Prints one
line per failure, crash or refusal and a summary per family; a logit failure also says how far HF's own fp32 and ours
are from HF's modeling code evaluated in float64 (``fp32_distances``).  The default suite runs a few seeds of each
(``tests/test_config_fuzz.py``); ``-m slow`` runs more.

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 .venv/bin/python scripts/fuzz_configs.py --seeds 0 40 [--families mamba2 ...]
"""

from __future__ import annotations

import argparse
import os
import time
import traceback

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(argv: list[str] | None = None) -> int:
    import torch

    from gather_aggregate.core.errors import UnsupportedModelError
    from gather_aggregate.testing.fuzz.check import (
        check_case,
        expected_refusals,
        fp32_bound,
        fp32_distances,
        over_limits,
    )
    from gather_aggregate.testing.fuzz.draws import FAMILIES, draw

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs=2, default=(0, 40), metavar=("FIRST", "END"))
    p.add_argument("--families", nargs="*", default=list(FAMILIES), choices=FAMILIES)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    total_bad = 0
    for family in args.families:
        t0, bad, refused, fp32, worst = time.perf_counter(), 0, 0, 0, 0.0
        for seed in range(*args.seeds):
            case = draw(family, seed)
            why = expected_refusals(case)
            try:
                measured = check_case(case)
            except UnsupportedModelError as e:
                ok = any(w in str(e) for w in why)
                refused += ok
                bad += not ok
                print(f"{'refused' if ok else 'REFUSED, NOT EXPECTED'} {family} seed {seed}: {e}", flush=True)
                continue
            except Exception as e:  # noqa: BLE001 - a crash is a finding: report it and go on
                bad += 1
                where = traceback.extract_tb(e.__traceback__)[-1]
                print(f"CRASH {family} seed {seed}: {type(e).__name__}: {e} ({where.filename}:{where.lineno}); "
                      f"fields {case.fields}", flush=True)
                continue
            worst = max(worst, measured["logits"])
            over = over_limits(measured)
            if over and not why and (why_fp32 := fp32_bound(case, over)):  # formula or fp32 rounding?
                fp32 += 1
                print(f"fp32-bound {family} seed {seed}: {why_fp32}", flush=True)
                continue
            if over or why:
                bad += 1
                yardstick = ""
                if "logits" in over and case.hf is not None:
                    d = fp32_distances(case)
                    yardstick = (f"; from float64: ours {d['ours']:.1e}, HF fp32 {d['hf']:.1e}, HF jitter "
                                 f"{d['hf_jitter']:.1e}")
                print(f"FAIL {family} seed {seed} tokens {tuple(case.tokens.shape)}: "
                      f"{over or f'loaded although it should refuse ({why})'}{yardstick}; fields {case.fields}",
                      flush=True)
        total_bad += bad
        print(f"{family}: seeds {args.seeds[0]}-{args.seeds[1] - 1}: {bad} failed, {refused} refused as expected, "
              f"{fp32} fp32-bound (xfail), worst logit diff {worst:.1e}, {time.perf_counter() - t0:.0f} s", flush=True)
    return 1 if total_bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
