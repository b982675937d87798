"""lm-eval with ``--model gather_aggregate`` against lm-eval's own HF model, and against this project's evaluate.

On one checkpoint and the task folder written in its own vocabulary
(:mod:`gather_aggregate.lm_eval.export`), three checks side by side:

1. **unablated**: every task's metric from ``GatherAggregateLM`` and from
   lm-eval's ``HFLM`` (``--model hf``), and the wall time of
   ``lm_eval.simple_evaluate`` for each (model loading excluded; each timed
   ``--repeats`` times, the best kept, the two alternating);
2. **ablated** (``--heads``, ``--method``): the lm-eval accuracy next to this
   project's ``tasks.evaluate`` with the same hooks on the same prompts;
3. forwards and rows our model ran (requests that share a context take one).

    python benchmarks/bench_lm_eval.py                              # llama-kvmc, its G&A heads
    python benchmarks/bench_lm_eval.py --model mamba2-mc --heads L2H0 --limit 32
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

PROJECT_TASK = {"ga_mmlu_letter": "letter-mc", "ga_mmlu_content": "content-mc", "ga_kv": "kv",
                "ga_knowledge": "knowledge"}


def _run(model, tasks, include, limit):
    import lm_eval
    from lm_eval.tasks import TaskManager

    t0 = time.perf_counter()
    res = lm_eval.simple_evaluate(model=model, tasks=tasks, task_manager=TaskManager(include_path=include),
                                  limit=limit, bootstrap_iters=0, log_samples=False, verbosity="ERROR")
    return res, time.perf_counter() - t0


def bench(model_name: str, tasks: list[str], heads: str, method: str, limit: int, repeats: int,
          batch_size: int) -> dict:
    import torch
    from lm_eval.models.huggingface import HFLM

    from gather_aggregate.lm_eval.export import export_tasks
    from gather_aggregate.lm_eval.intervention import Intervention
    from gather_aggregate.lm_eval.model import GatherAggregateLM
    from gather_aggregate.lm_eval.schedule import primary_metric
    from gather_aggregate.tasks import evaluate, get_task
    from gather_aggregate.zoo import resolve_model_path

    torch.set_num_threads(1)
    model_dir = resolve_model_path(model_name)
    include = tempfile.mkdtemp(prefix="ga_lmeval_tasks_")
    written = export_tasks(model_dir, include, n=max(limit, 64))
    tasks = [t for t in tasks if t in written]
    hf = HFLM(pretrained=model_dir, dtype="float32", device="cpu", batch_size=batch_size)
    ours = GatherAggregateLM(pretrained=model_dir, batch_size=batch_size)
    t_hf, t_ours = [], []
    for _ in range(repeats):
        res_hf, s = _run(hf, tasks, include, limit)
        t_hf.append(s)
        ours.n_forwards = ours.n_rows = 0
        res_ours, s = _run(ours, tasks, include, limit)
        t_ours.append(s)
    rows = []
    for task in tasks:
        metric, v_hf = primary_metric(res_hf["results"][task])
        _, v_ours = primary_metric(res_ours["results"][task])
        rows.append({"task": task, "metric": metric.split(",")[0], "hf": v_hf, "ours": v_ours})
    ablated_rows = []
    if heads:
        ablated = ours.with_intervention(Intervention.from_args(ablate=heads, method=method))
        res_ab, _ = _run(ablated, tasks, include, limit)
        for task in tasks:
            if task not in PROJECT_TASK:
                continue
            examples = get_task(PROJECT_TASK[task], model_dir=model_dir).examples(ours.tokenizer, n=max(limit, 64),
                                                                                 seed=0)[:limit]
            ev = evaluate(ours.model, examples, fwd_hooks=ablated._hooks, progress=False)
            ablated_rows.append({"task": task, "lm_eval": res_ab["results"][task]["acc,none"],
                                 "evaluate": ev.accuracy, "clean": dict((r["task"], r["ours"]) for r in rows)[task]})
    return {"model": model_name, "limit": limit, "rows": rows, "ablated": ablated_rows, "heads": heads,
            "method": method, "t_hf": min(t_hf), "t_ours": min(t_ours), "n_forwards": ours.n_forwards,
            "n_rows": ours.n_rows}


def markdown(r: dict) -> str:
    out = [f"**{r['model']}**, {r['limit']} examples per task; simple_evaluate wall time (best of repeats): "
           f"lm-eval HF {r['t_hf']:.2f} s, gather_aggregate {r['t_ours']:.2f} s, ratio "
           f"{r['t_ours'] / r['t_hf']:.2f}; ours ran {r['n_forwards']} forwards over {r['n_rows']} rows.", "",
           "| task | metric | lm-eval HF | gather_aggregate |", "|---|---|---|---|"]
    out += [f"| {x['task']} | {x['metric']} | {x['hf']:.4g} | {x['ours']:.4g} |" for x in r["rows"]]
    if r["ablated"]:
        out += ["", f"ablated {r['heads']} ({r['method']}):", "",
                "| task | clean | lm-eval (gather_aggregate) | project evaluate |", "|---|---|---|---|"]
        out += [f"| {x['task']} | {x['clean']:.3f} | {x['lm_eval']:.3f} | {x['evaluate']:.3f} |" for x in r["ablated"]]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama-kvmc")
    p.add_argument("--tasks", default="ga_mmlu_letter,ga_mmlu_content,ga_kv,ga_knowledge,ga_facts_ppl,ga_kv_gen")
    p.add_argument("--heads", default="L0H2")
    p.add_argument("--method", default="zero", choices=["zero", "mean", "resample"])
    p.add_argument("--limit", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    args = p.parse_args(argv)
    r = bench(args.model, args.tasks.split(","), args.heads, args.method, args.limit, args.repeats, args.batch_size)
    print(markdown(r), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
