"""The G&A detector through user task files (JSONL) on zoo models and a fixture (the table in docs/results.md).

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python scripts/detect_task_files.py [VARIANT ...] [--n 24] [--out DIR]

Each model's own KV prompts (8 pairs) are written as a task file (``docs/tasks.md``) in four variants and run
through ``read_task_file`` and the detector's rule (``detect_rules.decide``):

* ``default``: every segment a whole ``k:v\\n`` line, its summary the last token (as the built-in task);
* ``summary_at_key``: the same lines, each segment's ``summary`` declared at its key's first character;
* ``no_newline``: segments ``k:v`` that leave the line's ``\\n`` out (the detector warns about the gaps);
* ``own_format``: a format of our own, entries ``k:v .`` after ``Memorize the following dictionary :``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

VARIANTS = ("default", "summary_at_key", "no_newline", "own_format")
FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "models" / "kv-world1"


def lines(model_dir: Path, variant: str, n: int) -> list[dict[str, Any]]:
    """The task file's lines for ``variant`` (the KV task's first ``n`` prompts of seed 0)."""
    from gather_aggregate.tasks.registry import get_task

    rows = []
    for sp in get_task("kv", model_dir=model_dir, n_pairs=8).specs(n, seed=0):
        prompt, segs = sp.prompt, []
        for cs, ce, label in sp.segments:
            seg: dict[str, Any] = {"start": cs, "end": ce, "label": label}
            if variant == "summary_at_key":
                seg["summary"] = cs
            elif variant == "no_newline":
                seg["end"] = ce - 1
            segs.append(seg)
        if variant == "own_format":
            prompt, segs = "Memorize the following dictionary :", []
            for cs, ce, label in sp.segments:
                key, value = sp.prompt[cs:ce].strip().split(":")
                start = len(prompt) + 1
                prompt += f" {key}:{value} ."
                segs.append({"start": start, "end": len(prompt), "label": label})
            prompt += f" The value of the key '{sp.meta['key']}' is"
        rows.append({"prompt": prompt, "segments": segs, "correct": sp.correct, "candidates": sp.candidates,
                     "answer": sp.candidates[sp.answer]})
    return rows


def main() -> int:
    import torch

    from gather_aggregate.detect.rules import decide
    from gather_aggregate.models.loading import load_model
    from gather_aggregate.tasks.taskfile import read_task_file
    from gather_aggregate.zoo import list_zoo

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("variants", nargs="*", help=f"any of {', '.join(VARIANTS)} (default: all)")
    p.add_argument("--n", type=int, default=24)
    p.add_argument("--out", type=Path, default=Path("ga_out/task_files"))
    args = p.parse_args()
    bad = [v for v in args.variants if v not in VARIANTS]
    if bad:
        p.error(f"unknown variant {bad[0]!r}; choose from {', '.join(VARIANTS)}")
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    zoo = list_zoo()
    targets = [(name, Path(zoo[name])) for name in ("llama-kvmc", "bamba-ga", "mamba2-ga") if name in zoo]
    targets += [("kv-world1", FIXTURE)] if (FIXTURE / "model.safetensors").is_file() else []
    for name, model_dir in targets:
        model = load_model(model_dir)
        for variant in args.variants or VARIANTS:
            path = args.out / f"{name}-{variant}.jsonl"
            path.write_text("".join(json.dumps(r) + "\n" for r in lines(model_dir, variant, args.n)))
            ex = read_task_file(path).examples(model.tokenizer, n=args.n)
            t0 = time.time()
            r = decide(model, ex)
            print(f"| {name} | {variant} | {r['read']} | {r['margin']:.2f} | {r['gather']} | {r['aggregate']} | "
                  f"{r['gather_conv']} | {time.time() - t0:.0f} s |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
