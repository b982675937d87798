"""``gather-aggregate demo``.

With the toy zoo shipped, the demo runs the whole pipeline on it (see
:func:`gather_aggregate.cli.demo_zoo.run_zoo_demo`).  Without a zoo (e.g. a source
tree where the checkpoints are not trained yet) it runs the quickstart below on
a tiny random Llama built from a config: real loading, patterns and ablations,
but of course no learnt retrieval.
"""

from __future__ import annotations

import argparse
import tempfile
import time


def run_demo(args: argparse.Namespace) -> int:
    from gather_aggregate.zoo import list_zoo

    if getattr(args, "model", None) or list_zoo():
        from gather_aggregate.cli.demo_zoo import run_zoo_demo

        return run_zoo_demo(args)
    return run_quickstart(args)


def run_quickstart(args: argparse.Namespace) -> int:
    import torch

    from gather_aggregate.core.sharpness import row_entropy
    from gather_aggregate.models.loading import load_model
    from gather_aggregate.testing.tiny_models import save_model_dir, tiny_llama

    t0 = time.perf_counter()
    print("no toy zoo found: running the quickstart on a tiny random Llama built from a config")
    with tempfile.TemporaryDirectory() as tmp:
        hf, tok = tiny_llama(seed=args.seed)
        model = load_model(save_model_dir(hf, tok, tmp))
    prompt = "Memorize the following dictionary:\napple:12\nriver:7\nstone:3\n\nThe value of the key 'river' is"
    tokens = model.to_tokens(prompt)
    with torch.no_grad():
        logits = model(tokens)[0, -1].log_softmax(-1)
    target = int(logits.argmax())
    print(f"model: {model!r}; prompt of {tokens.shape[1]} tokens; top next token {tok.decode([target])!r}")
    print(f"{'layer':>5} {'head':>4} {'last-row entropy':>16} {'top key':>10} {'Δ log p(top) when zeroed':>24}")
    for info in model.layers:
        pat = model.pattern(tokens, info.index, rows=-1)[0, :, 0]  # [head, key]
        ent = row_entropy(pat)
        name, axis = model.head_hook(info.index)
        for h in range(info.n_heads):
            def zero(z, hook, h=h, axis=axis):
                z = z.clone()
                z.select(axis, h).zero_()
                return z

            with torch.no_grad():
                ablated = model.run_with_hooks(tokens, fwd_hooks=[(name, zero)])[0, -1].log_softmax(-1)
            top_key = tok.decode([int(tokens[0, int(pat[h].argmax())])])
            print(f"{info.index:>5} {h:>4} {float(ent[h]):>16.3f} {top_key!r:>10} "
                  f"{float(ablated[target] - logits[target]):>24.4f}")
    print(f"done in {time.perf_counter() - t0:.1f} s")
    return 0
