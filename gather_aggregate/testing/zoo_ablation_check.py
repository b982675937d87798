"""Quick per-head checks of a zoo checkpoint, for the training log (``docs/results.md``).

    python -m gather_aggregate.testing.zoo_ablation_check gather_aggregate/zoo/llama-ga

For every head it reports the accuracy of letter-MC, content-MC, knowledge and
KV after zero-ablating that head alone (:func:`quick_eval.ablate_heads`), a
random-head baseline, and, for attention models, where the final position looks
in letter-MC prompts: the mean attention onto the correct option's summary
token (its ``\\n``), onto any token of the correct option, and onto the
summary tokens of the wrong options.  These are plain HF forwards; the
project's scan/detector (``gather_aggregate.scan.exact``/``detect``) re-measures the
shipped checkpoints through the hooked models.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from gather_aggregate.training.data import EvalItem, knowledge_eval_items, kv_eval_items, mc_eval_items
from gather_aggregate.training.quick_eval import ablate_heads, accuracy, n_heads
from gather_aggregate.training.vocab import World, split_words

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedModel


def load(path: str | Path) -> tuple[Any, World]:
    from transformers import AutoModelForCausalLM

    p = Path(path)
    model = AutoModelForCausalLM.from_pretrained(p, attn_implementation="eager").eval()
    facts = json.loads((p / "facts.json").read_text())
    tasks = json.loads((p / "zoo_tasks.json").read_text())
    world = World(entities=facts["entities"], attributes=facts["attributes"], facts=facts["facts"],
                  kv_keys=tasks["kv_keys"], kv_values=tasks["kv_values"], relation=facts["relation"])
    return model, world


def suites(world: World, seed: int, n: int, kv_sizes: tuple[int, ...] = (8,)) -> dict[str, list[EvalItem]]:
    rng = random.Random(seed)
    out = {"letter_mc": mc_eval_items(world, rng, n, letter=True),
           "content_mc": mc_eval_items(world, rng, n, letter=False),
           "knowledge": knowledge_eval_items(world, rng, n)}
    for k in kv_sizes:
        out[f"kv{k}"] = kv_eval_items(world, rng, k, n)
    return out


def scores(model: PreTrainedModel, world: World, items: dict[str, list[EvalItem]], heads=()) -> dict[str, float]:
    vocab = world.vocab()
    with ablate_heads(model, heads):
        return {k: round(accuracy(model, v, vocab, vocab["<pad>"]), 4) for k, v in items.items()}


@torch.no_grad()
def mc_attention(model: PreTrainedModel, world: World, items: list[EvalItem]) -> torch.Tensor:
    """``[layer, head, 4]`` mean attention of the last position onto: correct ``\\n``, any correct-option
    token, the correct option's letter, the mean wrong-option ``\\n``."""
    vocab = world.vocab()
    L, H = n_heads(model)
    acc = torch.zeros(L, H, 4)
    for it in items:
        words = split_words(it.prompt)
        ids = torch.tensor([[vocab[w] for w in words]])
        att = model(input_ids=ids, output_attentions=True).attentions  # L x [1, H, T, T]
        nl = [i for i, w in enumerate(words) if w == "\n"]
        # option j spans (nl[j], nl[j+1]]: letter, '.', text..., '\n'
        spans = [(nl[j] + 1, nl[j + 1]) for j in range(len(nl) - 1)]
        letters = [words[s] for s, _ in spans]
        c = letters.index(it.answer)
        s, e = spans[c]
        wrong = [spans[j][1] for j in range(len(spans)) if j != c]
        for layer in range(L):
            row = att[layer][0, :, -1]  # [H, T]
            acc[layer, :, 0] += row[:, e]
            acc[layer, :, 1] += row[:, s : e + 1].sum(-1)
            acc[layer, :, 2] += row[:, s]
            acc[layer, :, 3] += row[:, wrong].mean(-1)
    return acc / len(items)


def run(path: str | Path, n: int = 256, seed: int = 123, baseline_draws: int = 8) -> dict[str, Any]:
    model, world = load(path)
    items = suites(world, seed, n)
    L, H = n_heads(model)
    clean = scores(model, world, items)
    single = {f"L{l}H{h}": scores(model, world, items, [(l, h)]) for l in range(L) for h in range(H)}
    rng = random.Random(seed)
    all_heads = [(l, h) for l in range(L) for h in range(H)]
    pairs = [rng.sample(all_heads, 2) for _ in range(baseline_draws)]
    random_pairs = [scores(model, world, items, p) for p in pairs]
    out: dict[str, Any] = {"clean": clean, "single": single,
                           "random_pairs_mean": {k: round(sum(r[k] for r in random_pairs) / len(random_pairs), 4)
                                                 for k in clean}}
    if model.config.model_type == "llama":
        att = mc_attention(model, world, items["letter_mc"][:64])
        out["mc_attention"] = {f"L{l}H{h}": [round(float(v), 3) for v in att[l, h]] for l in range(L) for h in range(H)}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("path")
    p.add_argument("--n", type=int, default=256)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    res = run(a.path, a.n)
    print(json.dumps(res["clean"]))
    print("random 2-head ablation mean:", json.dumps(res["random_pairs_mean"]))
    for name, sc in res["single"].items():
        extra = res.get("mc_attention", {}).get(name, "")
        print(name, json.dumps(sc), "att[nl, seg, letter, wrong-nl]:", extra)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
