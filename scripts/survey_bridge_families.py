"""Survey the decoder-only families served through TransformerLens' bridge on random small configs.

For each family of the config fuzz (``gather_aggregate.testing.fuzz.draws``) and each seed: the fuzz's own check
against HF (logits, residual stream, patterns and ``hook_z``; ``config_fuzz_check.check_case``), plus what the exact
scans rely on: a forward resumed at every layer from the residual entering it (twice: the first resumed call learns
the block's return type) against the full forward, and every attention pattern's rows summing to 1 with nothing
above the diagonal.  Prints one line per family: the worst of each over the seeds, the seeds the loader refused
(with the field the fuzz expects it to name) and anything else (an unexpected refusal, an error, a quantity over
1e-4, with whether fp32 rounding explains it: ``config_fuzz_check.fp32_bound``).

    OMP_NUM_THREADS=1 .venv/bin/python scripts/survey_bridge_families.py --seeds 0 20 mixtral phimoe
    OMP_NUM_THREADS=1 .venv/bin/python scripts/survey_bridge_families.py --seeds 3 23 --decoders

(``--decoders``: every family of ``config_fuzz_decoders``, the families added by the survey of issue "decoder-only
families the project has never been shown".)
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
SANITY = ("resume", "rowsum", "acausal")


def sanity(case: Any) -> dict[str, float]:
    """Resumed forwards against the full forward; pattern rows' sums and mass above the diagonal."""
    import torch

    from gather_aggregate.models.loading import from_hf_model

    model = from_hf_model(case.hf)
    toks = case.tokens
    with torch.no_grad():
        full, cache = model.run_with_cache(toks)
        resume = max(float((model(cache[model.resid_hook(L)], start_at_layer=L) - full).abs().max())
                     for _ in range(2) for L in range(model.n_layers))
        patterns = [model.pattern(toks, info.index) for info in model.layers]
    return {"resume": resume, "rowsum": max(float((p.sum(-1) - 1).abs().max()) for p in patterns),
            "acausal": max(float(p.triu(1).abs().max()) for p in patterns)}


def survey(family: str, seeds: range) -> tuple[dict[str, float], list[str]]:
    from gather_aggregate.core.errors import UnsupportedModelError
    from gather_aggregate.testing.fuzz.check import (
        LIMITS,
        check_case,
        expected_refusals,
        fp32_bound,
        over_limits,
    )
    from gather_aggregate.testing.fuzz.draws import draw

    worst: dict[str, float] = {}
    notes: list[str] = []
    for seed in seeds:
        case = draw(family, seed)
        why = expected_refusals(case)
        try:
            measured = {**check_case(case), **sanity(case)}
        except UnsupportedModelError as exc:
            named = [w for w in why if w in str(exc)]
            notes.append(f"seed {seed} refused ({named[0]})" if named else f"seed {seed} UNEXPECTED REFUSAL: {exc}")
            continue
        except Exception as exc:  # noqa: BLE001 - a survey reports every failure and goes on
            notes.append(f"seed {seed} ERROR {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
            continue
        if why:
            notes.append(f"seed {seed} NOT REFUSED though the fuzz expects {why}")
        over = over_limits({k: v for k, v in measured.items() if k in LIMITS})
        over.update({k: measured[k] for k in SANITY if measured[k] > LIMITS["logits"]})
        if over:
            rounding = fp32_bound(case, {k: v for k, v in over.items() if k in LIMITS})
            notes.append(f"seed {seed} OVER {over}" + (f" ({rounding})" if rounding else ""))
        for k, v in measured.items():
            worst[k] = max(worst.get(k, 0.0), v)
    return worst, notes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("families", nargs="*")
    parser.add_argument("--seeds", nargs=2, type=int, default=(0, 20), metavar=("FIRST", "STOP"))
    parser.add_argument("--decoders", action="store_true", help="every family of config_fuzz_decoders")
    args = parser.parse_args()
    import torch

    from gather_aggregate.testing.fuzz.decoder_draws import DECODER_HF

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    families = list(args.families) + (list(DECODER_HF) if args.decoders else [])
    seeds = range(*args.seeds)
    for family in families:
        start = time.perf_counter()
        worst, notes = survey(family, seeds)
        cols = " ".join(f"{k}={worst[k]:.1e}" for k in ("logits", "resid", "pattern", "hook_z", *SANITY) if k in worst)
        print(f"{family:20s} {cols}  ({len(seeds)} seeds, {time.perf_counter() - start:.1f}s)", flush=True)
        for note in notes:
            print(f"    {note}", flush=True)


if __name__ == "__main__":
    main()
