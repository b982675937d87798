"""The toy hybrid experiment: hybridise a zoo transformer keeping k heads chosen by a strategy, distil, measure.

Run (one thread, resumable: finished configurations are skipped, a killed
distillation resumes from its checkpoint)::

    OMP_NUM_THREADS=1 python -m gather_aggregate.studies.hybrids.experiment --teacher llama-kvmc \\
        --ks 0,2,16 --strategies scan,random --steps 100,100,200 --out runs/hybrid

Each configuration writes ``<out>/<strategy>-k<k>-s<seed>-N<d_state>/`` (the
distillation state and log, then the saved hybrid) and one row of
``<out>/results.json``: KV, letter-MC, content-MC and knowledge accuracy (the
project's ``evaluate`` on the zoo's own task sets), held-out perplexity on the
training mixture, steps and minutes.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from gather_aggregate.core.errors import InputError

if TYPE_CHECKING:  # pragma: no cover
    from gather_aggregate.core.protocol import HookedModel


def zoo_batches(model_dir: str | Path, batch_size: int = 16, seed: int = 0, *,
                labels: bool = False) -> Callable[[int], Any]:
    """``step -> tokens``: batches of the mixture the zoo model was trained on (a pure function of the step);
    with ``labels=True``, ``step -> (tokens, labels)`` where ``labels`` holds the next token at the positions
    the zoo trained on (the answers) and -100 elsewhere."""
    from gather_aggregate.training.data import Mixture, collate, sample_doc
    from gather_aggregate.training.vocab import PAD, make_world

    raw = json.loads((Path(model_dir) / "train_config.json").read_text())
    world = make_world(int(raw["config"].get("world_seed", 0)))
    mix = Mixture(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw["mixture"].items()})
    vocab = world.vocab()
    pad = vocab[PAD]

    def batch(step: int) -> Any:
        rng = random.Random(seed * 1_000_003 + step)
        x, y = collate([sample_doc(world, rng, mix)[1] for _ in range(batch_size)], vocab, pad)
        return (x, y) if labels else x

    return batch


def perplexity(model: HookedModel, batches: Callable[[int], tuple[torch.Tensor, torch.Tensor]], n_batches: int = 4) -> float:
    """``exp`` of the mean NLL of the answer tokens (``labels != -100``) over ``n_batches`` held-out batches.

    Only the answers: the zoo models were trained on them alone, so the other
    tokens (random keys and values, filler) are not predicted and would swamp the mean.
    """
    nll, n = 0.0, 0
    with torch.no_grad():
        for i in range(n_batches):
            x, y = batches(i)
            logits = model(x)
            labels = y.to(logits.device)  # the model moves x to its device; the labels follow
            nll += float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                                           ignore_index=-100, reduction="sum"))
            n += int((y != -100).sum())
    return float(torch.tensor(nll / max(n, 1)).exp())


def measure(model: HookedModel, model_dir: Path, eval_n: int, heldout: Callable[[int], Any]) -> dict[str, float]:
    from gather_aggregate.studies.claims import accuracies, task_sets

    accs = accuracies(model, task_sets(model, model_dir, eval_n, seed=0))
    return {**{t.replace("-", "_"): round(v, 4) for t, v in accs.items()}, "ppl": round(perplexity(model, heldout), 4)}


def remeasure(teacher_dir: Path, out: Path, eval_n: int = 96, batch_size: int = 16) -> list[dict[str, Any]]:
    """Measure every saved hybrid of a sweep (and the teacher) again with the current :func:`measure`."""
    from gather_aggregate.core.results_io import atomic_write_json
    from gather_aggregate.models.head_hybrid.build import hybridise
    from gather_aggregate.models.loading import load_model

    rows = json.loads((out / "results.json").read_text())
    heldout = zoo_batches(teacher_dir, batch_size, seed=99, labels=True)
    for r in rows:
        model = hybridise(teacher_dir, "all") if r["name"] == "teacher" else load_model(out / r["name"] / "model")
        r.update(measure(model, teacher_dir, eval_n, heldout))
    atomic_write_json(out / "results.json", rows)
    return rows


def run_sweep(teacher_dir: Path, ks: Sequence[int], strategies: Sequence[str], seeds: Sequence[int],
              d_states: Sequence[int | None], steps: tuple[int, int, int], out: Path, *, batch_size: int = 16,
              eval_n: int = 96, progress: bool = True) -> list[dict[str, Any]]:
    from gather_aggregate.core.results_io import atomic_write_json
    from gather_aggregate.models.head_hybrid.build import hybridise
    from gather_aggregate.studies.claims import task_sets
    from gather_aggregate.studies.hybrids.choose import choose_heads, scan_order
    from gather_aggregate.studies.hybrids.distill import DistillConfig, distill

    out.mkdir(parents=True, exist_ok=True)
    res_path = out / "results.json"
    rows: list[dict[str, Any]] = json.loads(res_path.read_text()) if res_path.is_file() else []
    done = {r["name"] for r in rows}
    teacher = hybridise(teacher_dir, "all")
    train = zoo_batches(teacher_dir, batch_size, seed=0)
    heldout = zoo_batches(teacher_dir, batch_size, seed=99, labels=True)
    if "teacher" not in done:
        rows.append({"name": "teacher", "strategy": "teacher", "k": teacher.cfg.n_kept, **measure(
            teacher, teacher_dir, eval_n, heldout)})
        atomic_write_json(res_path, rows)
    kv_scan_set = task_sets(teacher, teacher_dir, 32, seed=1)["kv"]  # heads are chosen on other prompts than scored
    scan: Any = None
    for d_state in d_states:
        for strategy in strategies:
            for k in ks:
                if k >= teacher.cfg.n_kept:  # every head kept: the teacher itself (exact, nothing to distil)
                    continue
                for seed in (seeds if strategy == "random" and k > 0 else seeds[:1]):
                    label = strategy if k > 0 else "none"  # k = 0 is the same model under every strategy
                    name = f"{label}-k{k}-s{seed}-N{d_state or teacher.cfg.d_head}"
                    if name in done:
                        continue
                    done.add(name)
                    if scan is None and k > 0 and strategy != "random":
                        _, scan = scan_order(teacher, kv_scan_set)
                    kept = choose_heads(teacher, kv_scan_set, k, strategy, seed=seed, scan=scan)
                    student = hybridise(teacher_dir, kept, d_state=d_state, seed=seed)
                    t0 = time.time()
                    log = distill(student, teacher, train, DistillConfig(steps=steps), out_dir=out / name,
                                  progress=progress, run_key={"batch_size": batch_size, "seed": 0})
                    minutes = (time.time() - t0) / 60
                    student.tokenizer = teacher.tokenizer
                    student.save_pretrained(out / name / "model")
                    final = {s: next((r["loss"] for r in reversed(log) if r["stage"] == s), None)
                             for s in ("orientation", "alignment", "end_to_end")}
                    rows.append({"name": name, "strategy": label, "k": k, "seed": seed,
                                 "d_state": student.cfg.d_state, "kept": [list(h) for h in kept],
                                 "steps": list(steps), "minutes_this_session": round(minutes, 2),
                                 "final_loss": final, **measure(student, teacher_dir, eval_n, heldout)})
                    atomic_write_json(res_path, rows)
                    print(json.dumps(rows[-1]), flush=True)
    return rows


def format_results(rows: Sequence[dict[str, Any]]) -> str:
    """The sweep's rows as a markdown table (the teacher first, then by k and strategy)."""
    head = "| hybrid | kept attention heads | KV | letter-MC | content-MC | knowledge | answer ppl | minutes |"
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["name"] != "teacher", r.get("k", 0), r["name"])):
        kept = "all" if r["name"] == "teacher" else (", ".join(f"L{a}H{b}" for a, b in r["kept"]) or "none")
        mins = r.get("minutes_this_session", "")
        lines.append(f"| `{r['name']}` | {kept} | {r['kv']:.2f} | {r['letter_mc']:.2f} | {r['content_mc']:.2f} | "
                     f"{r['knowledge']:.2f} | {r['ppl']:.2f} | {mins} |")
    return "\n".join(lines)


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"expected comma-separated integers, got {text!r}") from None


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--teacher", default="llama-kvmc", help="zoo name or Llama checkpoint directory")
    p.add_argument("--ks", default="0,2,16", help="numbers of heads kept as attention, comma-separated")
    p.add_argument("--strategies", default="scan,random",
                   help="head-choice strategies, comma-separated: scan, detector, random, bottom")
    p.add_argument("--seeds", default="0,1,2", help="seeds of the random strategy")
    p.add_argument("--d-states", default="0", help="SSM state sizes; 0 = the head dimension")
    p.add_argument("--steps", default="100,100,200", help="steps of the three stages")
    p.add_argument("--batch-size", type=int, default=16, help="sequences per distillation step")
    p.add_argument("--eval-n", type=int, default=96, help="prompts per task in each evaluation")
    p.add_argument("--out", default="ga_out/hybrid", help="sweep directory: results.json and each hybrid's resumable distillation")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--remeasure", action="store_true", help="only measure the saved hybrids of --out again")
    p.add_argument("--table", action="store_true", help="only print --out's results as a markdown table")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    from gather_aggregate.zoo import list_zoo

    teacher = list_zoo().get(a.teacher, Path(a.teacher))
    if a.remeasure:
        remeasure(Path(teacher), Path(a.out), a.eval_n, a.batch_size)
    if a.remeasure or a.table:
        print(format_results(json.loads((Path(a.out) / "results.json").read_text())))
        return 0
    steps = _ints(a.steps)
    if len(steps) != 3:
        raise InputError("--steps takes three numbers (orientation, alignment, end-to-end)")
    run_sweep(Path(teacher), _ints(a.ks), [s for s in a.strategies.split(",") if s], _ints(a.seeds),
              [d or None for d in _ints(a.d_states)], (steps[0], steps[1], steps[2]), Path(a.out),
              batch_size=a.batch_size, eval_n=a.eval_n)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
