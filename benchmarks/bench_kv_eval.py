"""KV-retrieval scoring cost: one forward per prompt batch vs one forward per candidate.

On the same prompts (dictionary sizes 10 / 30 / 50 by default), three ways to
score the in-context candidate values by log-probability:

* **ours** — ``tasks.evaluate``: single-token values are all read from the
  logits at the query position, one forward per batch of prompts;
* **batched continuations** — ``evaluate(fast_single_token=False)``: one row
  ``prompt + value[:-1]`` per candidate, batched (what multi-token values use);
* **per candidate** — ``tasks.score_per_candidate``: one forward per
  (prompt, candidate), as the paper's code did (the anchor).

Prints a markdown table: forwards and milliseconds per prompt, the speed-up
against the per-candidate anchor, and the largest log-prob difference (the
three must agree).

    python benchmarks/bench_kv_eval.py                 # a random word-level Llama (single-token values)
    python benchmarks/bench_kv_eval.py --model gather_aggregate/zoo/<name> --sizes 8 16
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def build_default_model(n_ctx: int):
    """A random Llama over a word-level vocabulary that holds the KV keys and values 0..99."""
    from gather_aggregate import from_hf_model
    from gather_aggregate.tasks import word_level_tokenizer
    from gather_aggregate.tasks.facts import shipped_words
    from gather_aggregate.testing.tiny_models import tiny_llama

    tok = word_level_tokenizer(["Memorize the following dictionary:\n\nThe value of the key ' is",
                                " ".join(shipped_words("keys")), " ".join(map(str, range(100)))])
    hf, _ = tiny_llama(tokenizer=tok, vocab_size=len(tok), hidden_size=128, intermediate_size=256,
                       num_hidden_layers=4, max_position_embeddings=n_ctx)
    return from_hf_model(hf, tok), None


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="model directory (default: a random word-level Llama)")
    p.add_argument("--sizes", type=int, nargs="+", default=[10, 30, 50], help="dictionary sizes")
    p.add_argument("--n", type=int, default=16, help="prompts per size")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a shared small box)")
    args = p.parse_args(argv)

    import torch

    from gather_aggregate.tasks import evaluate, get_task, score_per_candidate

    torch.set_num_threads(args.threads)
    if args.model:
        from gather_aggregate import load_model

        model, model_dir = load_model(args.model), args.model
    else:
        model, model_dir = build_default_model(n_ctx=512)

    rows = []
    for size in args.sizes:
        task = get_task("kv", model_dir=model_dir, n_pairs=size)
        exs = task.examples(model.tokenizer, args.n, seed=0)
        single = sum(e.single_token for e in exs)
        evaluate(model, exs[:2], batch_size=args.batch_size, progress=False)  # warm-up

        t = time.perf_counter()
        ours = evaluate(model, exs, batch_size=args.batch_size, progress=False)
        t_ours = time.perf_counter() - t

        t = time.perf_counter()
        cont = evaluate(model, exs, batch_size=args.batch_size, progress=False, fast_single_token=False)
        t_cont = time.perf_counter() - t

        t = time.perf_counter()
        naive = [score_per_candidate(model, e) for e in exs]
        t_naive = time.perf_counter() - t
        n_naive = sum(len(e.candidates) for e in exs)

        diff = max(
            max(abs(a - b) for a, b in zip(r.logprobs, ref, strict=True)) for res in (ours, cont)
            for r, ref in zip(res.results, naive, strict=True)
        )
        same = all(r.pred == max(range(len(ref)), key=lambda k: (ref[k], -k)) for r, ref in zip(ours.results, naive, strict=True))
        n = len(exs)
        rows.append((size, single, n, ours.n_forwards / n, 1e3 * t_ours / n, cont.n_forwards / n,
                     1e3 * t_cont / n, n_naive / n, 1e3 * t_naive / n, t_naive / t_ours, t_naive / t_cont,
                     diff, same, ours.accuracy))

    print(f"KV scoring, {args.n} prompts per size, batch {args.batch_size}, {args.threads} thread(s), "
          f"model: {args.model or 'random word-level Llama (4 layers, d_model 128)'}\n")
    print("| dict size | single-token prompts | ours fwd/prompt | ours ms/prompt | batched-cont fwd/prompt "
          "| batched-cont ms/prompt | per-candidate fwd/prompt | per-candidate ms/prompt | speed-up ours "
          "| speed-up batched-cont | max abs Δ logprob | same predictions | accuracy |")
    print("|" + "---|" * 13)
    for r in rows:
        size, single, n, f1, m1, f2, m2, f3, m3, s1, s2, diff, same, acc = r
        print(f"| {size} | {single}/{n} | {f1:.3f} | {m1:.2f} | {f2:.3f} | {m2:.2f} | {f3:.1f} | {m3:.2f} "
              f"| {s1:.1f}x | {s2:.1f}x | {diff:.1e} | {same} | {acc:.3f} |")


if __name__ == "__main__":
    main()
