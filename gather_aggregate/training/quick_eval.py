"""A small, dependency-light evaluator used while training the zoo (HF models, no hooks library).

Accuracy is the argmax of the next-token logits *restricted to the candidates*
(dictionary values, option letters, option texts, attributes) at the last prompt
token.  Prompts are right-padded: the models are causal, so padding after the
last real token does not change its logits.

:func:`ablate_heads` zeroes heads' slices of the tensor entering the output
projection (``o_proj`` for Llama, ``out_proj`` for Mamba/Mamba-2) with forward
pre-hooks that are removed on exit, also on exceptions; the weights are never
touched.  The project's own evaluation and scans live elsewhere
(``gather_aggregate.tasks``); this module only serves training logs and the
quick checks in ``docs/results.md``.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

from gather_aggregate.training.data import (
    EvalItem,
    knowledge_eval_items,
    kv_eval_items,
    mc_eval_items,
    mqar_eval_items,
    recall_eval_items,
    reverse_mqar_eval_items,
)
from gather_aggregate.training.vocab import World, split_words

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedModel


def _encode(items: Sequence[EvalItem], vocab: dict[str, int], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = [[vocab[w] for w in split_words(it.prompt)] for it in items]
    T = max(map(len, ids))
    x = torch.full((len(ids), T), pad_id, dtype=torch.long)
    for b, row in enumerate(ids):
        x[b, : len(row)] = torch.tensor(row)
    last = torch.tensor([len(r) - 1 for r in ids])
    return x, last


@torch.no_grad()
def accuracy(model: PreTrainedModel, items: Sequence[EvalItem], vocab: dict[str, int], pad_id: int, batch_size: int = 64) -> float:
    """Fraction of items whose correct candidate has the highest logit among the candidates."""
    model.eval()
    correct = 0
    for i in range(0, len(items), batch_size):
        chunk = items[i : i + batch_size]
        x, last = _encode(chunk, vocab, pad_id)
        logits = model(input_ids=x, use_cache=False).logits[torch.arange(len(chunk)), last]  # [batch, vocab]
        for b, it in enumerate(chunk):
            cand = [vocab[c.split()[0]] for c in it.candidates]
            best = it.candidates[int(torch.argmax(logits[b, cand]))]
            correct += best == it.answer
    return correct / max(len(items), 1)


def eval_suite(world: World, seed: int, n: int, kv_sizes: Iterable[int] = (4, 8, 16)) -> dict[str, list[EvalItem]]:
    """Fixed evaluation sets (same ``seed`` -> same prompts) for every metric the training log reports."""
    rng = random.Random(seed)
    suite = {f"kv{k}": kv_eval_items(world, rng, k, n) for k in kv_sizes}
    suite["letter_mc"] = mc_eval_items(world, rng, n, letter=True)
    suite["content_mc"] = mc_eval_items(world, rng, n, letter=False)
    suite["knowledge"] = knowledge_eval_items(world, rng, n)
    suite["mqar8"] = mqar_eval_items(world, random.Random(seed + 1), 8, n)  # own stream: other sets unchanged
    suite["lookup"] = mc_eval_items(world, random.Random(seed + 2), n, letter=True, lookup=True)
    suite["rmqar8"] = reverse_mqar_eval_items(world, random.Random(seed + 3), 8, n)
    suite["recall"] = recall_eval_items(world, random.Random(seed + 4), n)
    return suite


def suite_accuracies(model: PreTrainedModel, suite: dict[str, list[EvalItem]], vocab: dict[str, int], pad_id: int) -> dict[str, float]:
    return {name: round(accuracy(model, items, vocab, pad_id), 4) for name, items in suite.items()}


def _out_proj(model: PreTrainedModel, layer: int) -> tuple[torch.nn.Module, int]:
    """The output projection of ``layer`` and its head width (columns per head)."""
    cfg = model.config
    if cfg.model_type == "llama":
        return model.model.layers[layer].self_attn.o_proj, cfg.hidden_size // cfg.num_attention_heads
    mixer = model.backbone.layers[layer].mixer
    if cfg.model_type == "mamba2":
        return mixer.out_proj, cfg.head_dim
    if cfg.model_type == "mamba":
        return mixer.out_proj, 1  # a Mamba-1 "head" is one channel
    raise ValueError(f"quick_eval.ablate_heads supports llama, mamba and mamba2, not {cfg.model_type!r}")


def n_heads(model: PreTrainedModel) -> tuple[int, int]:
    """(layers, heads per layer) in the sense used by :func:`ablate_heads`."""
    cfg = model.config
    if cfg.model_type == "llama":
        return cfg.num_hidden_layers, cfg.num_attention_heads
    if cfg.model_type == "mamba2":
        return cfg.num_hidden_layers, cfg.num_heads
    return cfg.num_hidden_layers, cfg.intermediate_size


@contextlib.contextmanager
def ablate_heads(model: PreTrainedModel, heads: Iterable[tuple[int, int]]) -> Iterator[None]:
    """Zero-ablate ``(layer, head)`` slices of the output projections' input while inside the block."""
    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        by_layer.setdefault(layer, []).append(head)
    handles = []
    try:
        for layer, hs in by_layer.items():
            proj, width = _out_proj(model, layer)
            mask = torch.ones(proj.in_features)
            for h in hs:
                mask[h * width : (h + 1) * width] = 0.0

            def pre_hook(_mod: Any, args: tuple, _mask: torch.Tensor = mask) -> tuple:
                return (args[0] * _mask,) + tuple(args[1:])

            handles.append(proj.register_forward_pre_hook(pre_hook))
        yield
    finally:
        for h in handles:
            h.remove()
