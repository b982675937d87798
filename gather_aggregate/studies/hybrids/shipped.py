"""The hybrids shipped with the zoo: the toy sweep's measured table and one distilled hybrid.

Distilling a hybrid takes 8-16 minutes on one CPU thread, too long for the demo,
so the zoo ships what the sweep of :mod:`.experiment` measured
(``zoo/hybrids/llama-kvmc-sweep.json``: one row per hybrid, with its kept heads,
accuracies, answer perplexity and minutes) and one of its hybrids
(``zoo/hybrids/llama-kvmc-detector-k2``, loadable with ``load_model``), which
the demo evaluates live.  Write the JSON from a sweep directory with::

    python -m gather_aggregate.studies.hybrids.shipped runs/hybrid

The fraction of heads that recovers the teacher's KV accuracy
(:func:`recovery`) is the follow-up paper's headline: for each strategy, the
smallest measured ``k`` with ``KV(k) >= 0.95 * KV(teacher)``, over the model's
head count.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gather_aggregate.core.errors import InputError
from gather_aggregate.zoo import ZOO_DIR

HYBRIDS_DIR = ZOO_DIR / "hybrids"
SWEEP_FILE = HYBRIDS_DIR / "llama-kvmc-sweep.json"
DEMO_HYBRID = "llama-kvmc-detector-k2"
#: shipped hybrid -> the sweep row it is the model of
SHIPPED_MODELS = {DEMO_HYBRID: "detector-k2-s0-N32"}
#: the row fields the shipped table keeps (the rest of a sweep row is the run's own bookkeeping)
FIELDS = ("name", "strategy", "k", "seed", "d_state", "kept", "steps", "kv", "letter_mc", "content_mc", "knowledge",
          "ppl", "minutes_this_session")


def shipped_sweep(path: Path = SWEEP_FILE) -> dict[str, Any]:
    """The shipped sweep: ``teacher``, ``n_heads``, ``d_head``, ``eval_n``, ``eval_seed``, ``command``, ``rows``
    and ``shipped`` (shipped hybrid -> the name of its row)."""
    if not path.is_file():
        raise InputError(f"no hybrid sweep at {path}; write one with `python -m gather_aggregate.studies.hybrids.shipped "
                         "SWEEP_DIR`")
    return json.loads(path.read_text())


def shipped_hybrids() -> dict[str, Path]:
    """Shipped hybrid models: name -> directory."""
    if not HYBRIDS_DIR.is_dir():
        return {}
    return {p.name: p for p in sorted(HYBRIDS_DIR.iterdir()) if (p / "config.json").is_file()}


def series(row: Mapping[str, Any]) -> str:
    """The curve a row belongs to: its strategy, ``random (seed s)`` for random heads (:func:`label` adds the state
    size when it is not the head dimension)."""
    name = str(row["strategy"])
    if name == "random":
        name += f" (seed {row['seed']})"
    return name


def label(row: Mapping[str, Any], d_head: int) -> str:
    """A row's name in tables: ``scan``, ``random (seed 1)``, ``scan, N = 8``, ``none`` (k = 0) or ``teacher``."""
    text = series(row)
    d_state = row.get("d_state")
    return text + (f", N = {d_state}" if d_state not in (None, d_head) else "")


def table_rows(sweep: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The sweep as display rows, by k then name (the teacher last): hybrid, k, kept heads, accuracies, ppl."""
    d_head = int(sweep["d_head"])
    out = []
    for r in sorted(sweep["rows"], key=lambda r: (r["strategy"] == "teacher", r["k"], label(r, d_head))):
        kept = "all" if r["strategy"] == "teacher" else " ".join(f"L{a}H{b}" for a, b in r["kept"]) or "-"
        out.append({"hybrid": label(r, d_head), "k": r["k"], "attention heads": kept, "kv": r["kv"],
                    "letter-mc": r["letter_mc"], "content-mc": r["content_mc"], "knowledge": r["knowledge"],
                    "answer ppl": r["ppl"], "minutes": r.get("minutes_this_session", "")})
    return out


def recovery(sweep: Mapping[str, Any], threshold: float = 0.95) -> list[dict[str, Any]]:
    """Per curve (state size ``d_head``): the fewest kept heads with ``KV >= threshold * KV(teacher)``.

    Each entry: ``series``, ``k`` (``None`` when no measured ``k`` reached it), ``fraction`` (``k / n_heads``)
    and ``largest_k`` (the largest ``k`` measured on that curve).  The ``k = 0`` hybrid belongs to every curve.
    """
    rows, d_head, n_heads = sweep["rows"], int(sweep["d_head"]), int(sweep["n_heads"])
    teacher = next((r for r in rows if r["strategy"] == "teacher"), None)
    if teacher is None:
        raise InputError("the sweep has no teacher row; rerun the experiment (it measures the teacher first)")
    target = threshold * float(teacher["kv"])
    base = [r for r in rows if r["strategy"] == "none" and r.get("d_state") == d_head]
    curves: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        if r["strategy"] not in ("teacher", "none") and r.get("d_state") == d_head:
            curves.setdefault(series(r), []).append(r)
    out = []
    for name, rs in curves.items():
        reached = sorted(int(r["k"]) for r in [*base, *rs] if float(r["kv"]) >= target)
        k = reached[0] if reached else None
        out.append({"series": name, "k": k, "fraction": None if k is None else k / n_heads,
                    "largest_k": max(int(r["k"]) for r in rs)})
    return sorted(out, key=lambda e: (e["k"] is None, e["k"] or 0, e["series"]))


def recovery_text(sweep: Mapping[str, Any], threshold: float = 0.95) -> str:
    """``detector 2/16, scan 4/16, random (seed 0) not within k <= 4, ...``"""
    n = int(sweep["n_heads"])
    return ", ".join(f"{e['series']} {e['k']}/{n}" if e["k"] is not None
                     else f"{e['series']} not within k <= {e['largest_k']}" for e in recovery(sweep, threshold))


def sweep_from_dir(sweep_dir: Path, teacher: str = "llama-kvmc", *, eval_n: int = 64, eval_seed: int = 0,
                   command: str = "") -> dict[str, Any]:
    """The shippable sweep of an experiment directory (``results.json`` and each hybrid's ``model/config.json``)."""
    rows = json.loads((sweep_dir / "results.json").read_text())
    hybrid = next((r for r in rows if r["strategy"] != "teacher"), None)
    if hybrid is None:
        raise InputError(f"{sweep_dir}/results.json holds no hybrid; run the experiment first")
    cfg = json.loads((sweep_dir / hybrid["name"] / "model" / "config.json").read_text())
    return {"teacher": teacher, "n_heads": cfg["n_layers"] * cfg["n_heads"], "d_head": cfg["d_head"],
            "eval_n": eval_n, "eval_seed": eval_seed, "command": command,
            "shipped": {m: r for m, r in SHIPPED_MODELS.items() if any(x["name"] == r for x in rows)},
            "rows": [{k: r[k] for k in FIELDS if k in r} for r in rows]}


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    from gather_aggregate.core.results_io import atomic_write_json

    parser = argparse.ArgumentParser(
        prog="python -m gather_aggregate.studies.hybrids.shipped",
        description=f"write the sweep shipped with the zoo ({SWEEP_FILE}) from a sweep directory")
    parser.add_argument("sweep_dir", type=Path,
                        help="the --out of python -m gather_aggregate.studies.hybrids.experiment (holds results.json)")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if not (args.sweep_dir / "results.json").is_file():  # was a NotADirectoryError / FileNotFoundError traceback
        parser.error(f"no results.json in {args.sweep_dir}; pass the --out directory of "
                     "python -m gather_aggregate.studies.hybrids.experiment")
    command = ("OMP_NUM_THREADS=1 python -m gather_aggregate.studies.hybrids.experiment --teacher llama-kvmc --ks K "
               "--strategies S --seeds SEED --steps 60,60,120 --batch-size 8 --eval-n 64 --out runs/hybrid")
    atomic_write_json(SWEEP_FILE, sweep_from_dir(args.sweep_dir, command=command))
    print(f"wrote {SWEEP_FILE}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())


__all__ = ["shipped_sweep", "shipped_hybrids", "table_rows", "recovery", "recovery_text", "sweep_from_dir",
           "HYBRIDS_DIR", "SWEEP_FILE", "DEMO_HYBRID"]
