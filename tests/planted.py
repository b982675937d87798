"""A tiny attention-only model whose heads follow hand-set rules over token content.

Each head's attention pattern is written by hand as a rule over the token ids
(never over task annotations), the head output is ``pattern @ (x W_V)`` and the
model writes it back through ``W_O``, with TransformerLens hook points
(``blocks.L.attn.hook_pattern``, ``blocks.L.attn.hook_z``, residual hooks) and
the gather-aggregate protocol.  Planted rules:

* ``gather``     a newline attends uniformly to the other tokens of its line;
* ``gather_value`` the token before a newline (a KV line's value) attends to its
                 line's first token (the key): it condenses the line into the
                 value token, not into the newline;
* ``aggregate``  each position attends to the newline ending the line whose
                 first token equals the token two positions back (in the KV
                 prompt ``... key ' k ' is`` that is the queried key ``k``).

Distractors: ``prev`` (previous token), ``uniform``, ``first`` (BOS-like sink),
``self``, ``first_line`` (always the newline ending the first dictionary line,
a fixed-segment head that looks like aggregation but does not retrieve).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from transformer_lens.ActivationCache import ActivationCache
from transformer_lens.hook_points import HookPoint
from transformer_lens.HookedRootModule import HookedRootModule

from gather_aggregate.core.protocol import LayerInfo, ProtocolMixin, gather_rows, resolve_rows


class HookedPatterns:
    """For the planted models: ``run_with_cache`` returns an ``ActivationCache`` and ``pattern`` reads each
    layer's ``blocks.{L}.attn.hook_pattern`` (put it first among the bases)."""

    def run_with_cache(self, *args: Any, **kwargs: Any):
        logits, cache = super().run_with_cache(*args, **kwargs)
        return logits, ActivationCache(cache, self)

    def _pattern(self, tokens_or_cache: Any, info: LayerInfo, heads: list[int], rows: Any, **kwargs: Any) -> Tensor:
        name = f"blocks.{info.index}.attn.hook_pattern"
        _, cache = self.run_with_cache(self.validate_tokens(tokens_or_cache), names_filter=[name])
        full = cache[name][:, heads]
        return gather_rows(full, resolve_rows(rows, full.shape[0], full.shape[-1]))


class PlantedModel(HookedPatterns, HookedRootModule, ProtocolMixin):
    def __init__(self, tokenizer: Any, rules: list[list[str]], d_model: int = 16, d_head: int = 4, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.tokenizer = tokenizer
        self.rules = rules
        self.d_vocab = len(tokenizer)
        self.n_ctx = None
        self.newline = tokenizer.convert_tokens_to_ids("\n")
        n_heads = len(rules[0])
        self.embed = nn.Parameter(torch.randn(self.d_vocab, d_model, generator=g) * 0.1)
        self.W_V = nn.Parameter(torch.randn(len(rules), n_heads, d_model, d_head, generator=g) * 0.1)
        self.W_O = nn.Parameter(torch.randn(len(rules), n_heads, d_head, d_model, generator=g) * 0.1)
        self.hook_embed = HookPoint()
        self.hooks_resid_pre = nn.ModuleList([HookPoint() for _ in rules])
        self.hooks_pattern = nn.ModuleList([HookPoint() for _ in rules])
        self.hooks_z = nn.ModuleList([HookPoint() for _ in rules])
        self.hooks_resid_post = nn.ModuleList([HookPoint() for _ in rules])
        self._layers = [LayerInfo(i, "attn", n_heads, d_head, f"blocks.{i}.attn.hook_z") for i in range(len(rules))]
        self.setup()
        # TL names the hook points by attribute path; rename to the TL-style block names
        renamed = {}
        for i in range(len(rules)):
            for attr, name in (("hooks_resid_pre", "hook_resid_pre"), ("hooks_pattern", "attn.hook_pattern"),
                               ("hooks_z", "attn.hook_z"), ("hooks_resid_post", "hook_resid_post")):
                hp = getattr(self, attr)[i]
                hp.name = f"blocks.{i}.{name}"
                renamed[hp.name] = hp
        renamed["hook_embed"] = self.hook_embed
        self.hook_dict = renamed
        self.mod_dict = dict(renamed)

    @property
    def layers(self) -> list[LayerInfo]:
        return self._layers

    # ---- the hand-set rules -------------------------------------------------
    def _rule(self, rule: str, toks: Tensor) -> Tensor:
        L = toks.shape[0]
        p = torch.zeros(L, L)
        nl = (toks == self.newline).nonzero().flatten().tolist()
        for t in range(L):
            if rule == "gather" and int(toks[t]) == self.newline:
                prev = max([s for s in nl if s < t], default=-1)
                if t - prev > 1:
                    p[t, prev + 1:t] = 1.0
            elif (rule == "gather_value" and t + 1 < L and int(toks[t + 1]) == self.newline
                  and int(toks[t]) != self.newline):
                start = max([s for s in nl if s < t], default=-1) + 1
                if t - start >= 2:
                    p[t, start] = 1.0
            elif rule == "aggregate" and t >= 2:
                target = int(toks[t - 2])
                for s in range(1, t - 2):
                    if int(toks[s]) == target and int(toks[s - 1]) == self.newline:
                        end = min([n for n in nl if n > s], default=None)
                        if end is not None and end < t:
                            p[t, end] = 1.0
                            break
            elif rule == "prev" and t >= 1:
                p[t, t - 1] = 1.0
            elif rule == "uniform":
                p[t, : t + 1] = 1.0
            elif rule == "first":
                p[t, 0] = 1.0
            elif rule == "first_line" and len(nl) >= 2 and nl[1] < t:
                p[t, nl[1]] = 1.0
            if p[t].sum() == 0:
                p[t, t] = 1.0  # default: attend to self
        return p / p.sum(-1, keepdim=True)

    def forward(self, tokens: Any, **kwargs: Any) -> Tensor:
        tokens = self.validate_tokens(tokens)
        x = self.hook_embed(self.embed[tokens])
        for i, layer_rules in enumerate(self.rules):
            x = self.hooks_resid_pre[i](x)
            pat = torch.stack([torch.stack([self._rule(r, row) for r in layer_rules]) for row in tokens])
            pat = self.hooks_pattern[i](pat)  # [batch, head, q, k]
            v = torch.einsum("bkd,hde->bkhe", x, self.W_V[i])
            z = self.hooks_z[i](torch.einsum("bhqk,bkhe->bqhe", pat, v))
            x = self.hooks_resid_post[i](x + torch.einsum("bqhe,hed->bqd", z, self.W_O[i]))
        return x @ self.embed.T
