"""The reverse-graft experiment: graft attention into a zoo SSM's top G&A head, and into random heads.

    python -m gather_aggregate.studies.hybrids.graft_experiment --model mamba2-ga --out runs/graft

For the model's top head (the detector's first G&A head on 32 KV prompts, seed 1;
topped up in scan order if it names none) and for ``--random-seeds`` random
other heads (distinct: each seed draws from the heads not drawn yet), one graft each (:class:`~gather_aggregate.studies.hybrids.graft.AttentionGraft`)
is trained for ``--steps`` steps on the model's own training mixture.  Every row
is measured on KV prompts of ``--pairs`` key-value pairs (seed 0, other prompts
than the head choice); the mixture itself has the zoo's 12 pairs, so longer
dictionaries test whether the grafted head generalises where the SSM's fixed
state runs out.  Rows: the model, its top head zero-ablated, the untrained graft
of the top head, and the trained grafts.  ``results.json`` is written atomically
after each row, and a rerun skips the rows it holds and resumes a graft's
training from its checkpoint.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gather_aggregate.core.protocol import Head, HookedModel


def kv_accuracy(model: HookedModel, model_dir: Path, pairs: Sequence[int], n: int, hooks: list) -> dict[str, float]:
    """KV accuracy per dictionary size on ``n`` prompts (seed 0), with ``hooks`` on every forward."""
    from gather_aggregate.tasks.evaluate import evaluate
    from gather_aggregate.tasks.registry import get_task

    out = {}
    for p in pairs:
        task = get_task("kv", model_dir=model_dir, n_pairs=p)
        out[f"kv{p}"] = round(evaluate(model, task.examples(model.tokenizer, n=n, seed=0), fwd_hooks=hooks,
                                       progress=False).accuracy, 4)
    return out


def top_head(model: HookedModel, model_dir: Path) -> Head:
    """The detector's first G&A head on 32 KV prompts (seed 1), in scan order if it names none."""
    from gather_aggregate.studies.hybrids.choose import choose_heads
    from gather_aggregate.tasks.registry import get_task

    kv = get_task("kv", model_dir=model_dir).examples(model.tokenizer, n=32, seed=1)
    return choose_heads(model, kv, 1, "detector")[0]


def _mean_loss(rows: Sequence[dict[str, float]]) -> float:
    return round(sum(r["loss"] for r in rows) / max(len(rows), 1), 4)


def random_heads(model: HookedModel, top: Head, seeds: Sequence[int]) -> list[Head]:
    """One head per seed, drawn uniformly from the heads other than ``top`` and those drawn before it."""
    picked: list[Head] = []
    for s in seeds:
        pool = [h for h in model.all_heads() if h != top and h not in picked]
        if not pool:
            break
        picked.append(random.Random(s).choice(pool))
    return picked


def run_graft_experiment(model_dir: Path, out: Path, *, steps: int = 300, batch_size: int = 16, lr: float = 3e-3,
                         eval_n: int = 64, pairs: Sequence[int] = (12, 48), random_seeds: Sequence[int] = (0, 1),
                         progress: bool = True) -> list[dict[str, Any]]:
    from gather_aggregate.core.results_io import atomic_write_json
    from gather_aggregate.interventions.ablation import ablation_hooks, make_replacement
    from gather_aggregate.models.loading import load_model
    from gather_aggregate.studies.hybrids.experiment import zoo_batches
    from gather_aggregate.studies.hybrids.graft import AttentionGraft, train_graft

    out.mkdir(parents=True, exist_ok=True)
    res_path = out / "results.json"
    rows: list[dict[str, Any]] = json.loads(res_path.read_text()) if res_path.is_file() else []
    done = {r["name"] for r in rows}
    model = load_model(model_dir)
    if getattr(model.cfg, "family", None) != "mamba2":
        from gather_aggregate.core.errors import InputError

        raise InputError(f"{model_dir} is not a Mamba-2 model; the graft replaces a Mamba-2 head (try mamba2-ga)")
    top = top_head(model, model_dir)
    grafts = [("top", top)] + [(f"random L{h[0]}H{h[1]} (seed {s})", h)
                               for s, h in zip(random_seeds, random_heads(model, top, random_seeds))]

    def add(name: str, head: Head | None, hooks: list, **extra: Any) -> None:
        if name in done:
            return
        rows.append({"name": name, "head": list(head) if head else None, **extra,
                     **kv_accuracy(model, model_dir, pairs, eval_n, hooks)})
        done.add(name)
        atomic_write_json(res_path, rows)
        print(json.dumps(rows[-1]), flush=True)

    add("model", None, [])
    add("top ablated (zero)", top, ablation_hooks(model, [top], make_replacement(model, [top], "zero")))
    add("top grafted, untrained", top, AttentionGraft(model, *top).hooks())
    train = zoo_batches(model_dir, batch_size, seed=0, labels=True)
    for label, head in grafts:
        name = f"{label} grafted, trained"
        if name in done:
            continue
        graft = AttentionGraft(model, *head)
        t0 = time.time()
        log = train_graft(model, graft, train, steps, lr=lr, out_dir=out / f"L{head[0]}H{head[1]}",
                          progress=progress)
        add(name, head, graft.hooks(), steps=steps, minutes_this_session=round((time.time() - t0) / 60, 2),
            loss_first20=_mean_loss(log[:20]), loss_last20=_mean_loss(log[-20:]))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    from gather_aggregate.zoo import resolve_model_path

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mamba2-ga", help="a zoo Mamba-2 name or a model directory")
    p.add_argument("--out", type=Path, required=True, help="output directory: results.json and each graft's resumable training state")
    p.add_argument("--steps", type=int, default=300, help="training steps per graft")
    p.add_argument("--batch-size", type=int, default=16, help="sequences per training step")
    p.add_argument("--lr", type=float, default=3e-3, help="learning rate of the graft's parameters")
    p.add_argument("--eval-n", type=int, default=64, help="KV prompts per dictionary size")
    p.add_argument("--pairs", default="12,48", help="KV dictionary sizes to measure, comma-separated")
    p.add_argument("--random-seeds", default="0,1", help="seeds of the random heads grafted for comparison")
    a = p.parse_args(argv)
    run_graft_experiment(Path(resolve_model_path(a.model)), a.out, steps=a.steps, batch_size=a.batch_size, lr=a.lr,
                         eval_n=a.eval_n, pairs=[int(x) for x in a.pairs.split(",")],
                         random_seeds=[int(x) for x in a.random_seeds.split(",") if x])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
