"""The numbers of ``docs/results.md``'s section "Circuits: faithfulness and top edges", per zoo model.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python scripts/circuit_zoo.py [--models llama-kvmc ...] [--out out.json]

Per model, on the zoo's KV-retrieval task (answer log-prob at the query): the detector names the G&A heads on
``--detect`` prompts (seed 0); the circuit is measured on ``--n`` other prompts (seed 1), each corrupted by the next
prompt of the set (the prompts all have one length, so this is resample ablation by a cyclic derangement); the
exact edge scores are re-measured on ``--n`` more prompts (seed 2) as the ceiling of rank agreement.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

MODELS = ("llama-kvmc", "llama-kv", "bamba-ga", "mamba2-ga", "mamba2-mc", "mamba1-ga", "llama-ga", "llama-mc")


def prompts(model: Any, name: str, n: int, seed: int) -> tuple[Any, Any, Any, list[Any]]:
    from gather_aggregate.tasks.metric import task_metric
    from gather_aggregate.tasks.registry import get_task
    from gather_aggregate.zoo import zoo_path

    ex = get_task("kv", model_dir=zoo_path(name)).examples(model.tokenizer, n=n, seed=seed)
    tokens, metric = task_metric(model, ex)
    if len({e.query_pos for e in ex}) != 1:
        raise SystemExit(f"{name}: KV prompts of several lengths; corrupting by the next prompt needs one length")
    return tokens, metric, tokens.roll(1, 0), ex


def run(name: str, n: int, n_detect: int, steps: int) -> dict[str, Any]:
    from gather_aggregate import load_model
    from gather_aggregate.detect.detector import find_ga_heads
    from gather_aggregate.studies.faithfulness import circuit_study
    from gather_aggregate.zoo import zoo_path

    t0 = time.time()
    model = load_model(zoo_path(name))
    *_, ex_detect = prompts(model, name, n_detect, 0)
    ga = find_ga_heads(model, ex_detect)
    tokens, metric, corrupt, _ = prompts(model, name, n, 1)
    t2, m2, c2, _ = prompts(model, name, n, 2)
    row = circuit_study(model, tokens, metric, corrupt, ga, other=(t2, m2, c2), steps=steps)
    row.update(model=name, gather=[f"L{a}H{b}" for a, b in ga.gather], aggregate=[f"L{a}H{b}" for a, b in ga.aggregate],
               gather_conv=list(getattr(ga, "gather_conv", [])), n=n, n_detect=n_detect, steps=steps,
               seconds=round(time.time() - t0, 1))
    return row


def _f(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| model | named circuit (nodes) | faithfulness: heads | + MLPs | random sets (mean, range) | edges | "
             "ρ EAP / EAP-IG / exact on other prompts | top-10 overlap (same order) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        f, fm, rnd = r.get("faith"), r.get("faith_mlps"), r.get("faith_random")
        rr = (f"{sum(rnd) / len(rnd):.2f} ({min(rnd):.2f} to {max(rnd):.2f})" if rnd else "–")
        rho, top = r["rho"], r["topk"]
        lines.append(f"| `{r['model']}` | {', '.join(r['nodes']) or '– (nothing named)'} | "
                     f"{_f(f and f['recovered'])} | {_f(fm and fm['recovered'])} | {rr} | {r['n_edges']} | "
                     f"{rho['eap']:.2f} / {rho['eap-ig']:.2f} / {rho.get('exact, other prompts', float('nan')):.2f} | "
                     f"{top['eap']:.1f} / {top['eap-ig']:.1f} / {top.get('exact, other prompts', float('nan')):.1f} |")
    lines += ["", "| model | top edges by exact effect: sender → receiver.input (exact / EAP / EAP-IG) |", "|---|---|"]
    for r in rows:
        cells = "; ".join(f"{e['sender']} → {e['receiver']} ({e['exact']:+.3f} / {e['eap']:+.3f} / "
                          f"{e['eap-ig']:+.3f})" for e in r["top_edges"])
        lines.append(f"| `{r['model']}` | {cells} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--detect", type=int, default=32)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    rows = []
    for name in args.models:
        rows.append(run(name, args.n, args.detect, args.steps))
        print(f"{name}: {rows[-1]['seconds']} s", flush=True)
        if args.out:
            args.out.write_text(json.dumps(rows, indent=1))
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
