"""Synthetic but realistically shaped inputs for the figures (docs, tests, a model-free preview).

Nothing here pretends to be a result: these are inputs with the right shapes
and the right kind of structure, so that every figure and view can be tried
without a model.

* :func:`kv_prompt` — a KV-retrieval prompt in the paper's format, as word-level
  tokens with its segment annotations (summary positions, the correct one, the query).
* :func:`softmax_pattern` — causal softmax attention ``[head, query, key]``; head 0
  is an Aggregate-like head whose final row puts most mass on the target summary.
* :func:`mamba2_implied_pattern` — SSM-implied attention of random Mamba-2 heads,
  computed with the real formula ``α[t,s] = (C_t·B_s) Δ_s exp(Σ_{k=s+1..t} Δ_k A)``
  (signed and unnormalised).
* :func:`head_score_table` — a tidy head-score table for a hybrid (attention
  layers with 4 heads, SSM layers with 8).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor


@dataclass(frozen=True)
class Prompt:
    tokens: list[str]
    summaries: list[int]  # the last token ("\n") of each dictionary line
    target: int  # summary position of the line holding the queried key
    query: int  # the final position


def kv_prompt(n_keys: int = 6, target_index: int = 2, seed: int = 0) -> Prompt:
    """``Memorize the following dictionary:\\n`` + ``key:value\\n`` lines + the question, word tokens."""
    g = torch.Generator().manual_seed(seed)
    words = ["apple", "river", "stone", "cloud", "maple", "tiger", "lemon", "piano", "ocean", "amber", "cedar",
             "delta", "ember", "frost", "grove", "haven"]
    if not 1 <= n_keys <= len(words):
        raise ValueError(f"n_keys must be in 1..{len(words)}")
    keys = [words[i] for i in torch.randperm(len(words), generator=g)[:n_keys].tolist()]
    values = [str(v) for v in torch.randint(0, 100, (n_keys,), generator=g).tolist()]
    tokens = ["Memorize", " the", " following", " dictionary", ":", "\n"]
    summaries = []
    for k, v in zip(keys, values, strict=True):
        tokens += [k, ":", v, "\n"]
        summaries.append(len(tokens) - 1)
    tokens += ["\n", "The", " value", " of", " the", " key", " '", keys[target_index], "'", " is"]
    return Prompt(tokens, summaries, summaries[target_index], len(tokens) - 1)


def softmax_pattern(prompt: Prompt, n_heads: int = 4, seed: int = 0,
                    sharpness: float = 6.0) -> Float[Tensor, "head query key"]:
    """Causal softmax heads; head 0's final row is an Aggregate head's (sharp on ``prompt.target``)."""
    g = torch.Generator().manual_seed(seed)
    n = len(prompt.tokens)
    logits = torch.randn(n_heads, n, n, generator=g)
    logits[1] += 2.0 * torch.eye(n)  # a previous-token-ish / self head for variety
    logits[0, -1, prompt.target] += sharpness
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    return logits.masked_fill(~causal, float("-inf")).softmax(-1)


def mamba2_implied_pattern(n: int, n_heads: int = 8, d_state: int = 16, seed: int = 0,
                           ) -> Float[Tensor, "head query key"]:
    """Implied attention of random Mamba-2 heads: ``(C_t·B_s) Δ_s exp(S_t - S_s)``, ``S`` = cumsum of ``Δ A``."""
    g = torch.Generator().manual_seed(seed)
    B = torch.randn(n, d_state, generator=g)
    C = torch.randn(n, d_state, generator=g)
    delta = torch.nn.functional.softplus(torch.randn(n, n_heads, generator=g) - 1.0)  # [pos, head]
    A = -torch.exp(torch.linspace(-2.0, 0.5, n_heads))  # one scalar decay rate per head
    S = torch.cumsum(delta * A, dim=0)  # [pos, head], log-space cumulative decay
    decay = torch.exp(S.T[:, :, None] - S.T[:, None, :])  # [head, t, s] = exp(S_t - S_s)
    cb = C @ B.T  # [t, s]
    alpha = cb[None] * delta.T[:, None, :] * decay
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    return alpha.masked_fill(~causal, 0.0)


def head_score_table(layers: Sequence[tuple[str, int]] = (("ssm", 8), ("ssm", 8), ("attn", 4), ("ssm", 8),
                                                          ("attn", 4), ("ssm", 8)),
                     gather: tuple[int, int] = (2, 1), aggregate: tuple[int, int] = (4, 3),
                     seed: int = 0) -> list[dict[str, Any]]:
    """A tidy head-score table (``layer, head, kind, score, rank, gather, aggregate, ablation_drop``).

    Two heads stand out (the Gather head ``gather`` and the Aggregate head
    ``aggregate``), the rest is noise; ``score`` is the ablation drop and
    ``rank`` orders it.
    """
    g = torch.Generator().manual_seed(seed)
    rows = []
    for layer, (kind, n_heads) in enumerate(layers):
        for h in range(n_heads):
            noise = torch.rand(3, generator=g).tolist()
            gat = 0.05 + 0.1 * noise[0] + (0.7 if (layer, h) == tuple(gather) else 0.0)
            agg = 0.05 + 0.1 * noise[1] + (0.8 if (layer, h) == tuple(aggregate) else 0.0)
            drop = 0.04 * (noise[2] - 0.3) + (0.45 if (layer, h) in (tuple(gather), tuple(aggregate)) else 0.0)
            rows.append({"layer": layer, "head": h, "kind": kind, "score": drop, "ablation_drop": drop,
                         "gather": gat, "aggregate": agg})
    for rank, r in enumerate(sorted(rows, key=lambda r: -r["score"])):
        r["rank"] = rank
    return rows
