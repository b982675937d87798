"""The planted retrieval circuit of :mod:`planted_circuit` with the hooks the edge graph reads (issue 41).

The same forward (the same roles, patterns and writes), but every head reads the residual through its own
``q`` / ``k`` / ``v`` inputs (``blocks.L.attn.hook_q`` etc., ``ssm.hook_q`` in an SSM layer, ``[batch, pos, head, 4V]``, one copy of the residual
per head: the Aggregate head's scores read ``Q`` from ``q`` and ``C`` from ``k``, its values ``E + C`` from ``v``;
every other head's values ``E`` from ``v``), the heads' writes are one linear out-projection ``W`` (``mixer_resume``),
and a forward can resume at a layer from a residual (``start_at_layer``; the token-given patterns of the rows are
those of the last forward from tokens, row ``r`` taking prompt ``r mod batch``, as stacked copies need).
"""

from __future__ import annotations

from typing import Any

import torch
from planted_circuit import CircuitModel
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint


class GraphCircuitModel(CircuitModel):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        n = len(self.heads_spec)
        names = {"resid_pre": "hook_resid_pre", "q": "{}.hook_q", "k": "{}.hook_k", "v": "{}.hook_v",
                 "mixer": "hook_mixer_out"}
        self.extra = nn.ModuleDict({key: nn.ModuleList([HookPoint() for _ in range(n)]) for key in names})
        self.hook_final = HookPoint()
        self.hook_normalized = HookPoint()
        for key, name in names.items():
            for i, hp in enumerate(self.extra[key]):
                hp.name = f"blocks.{i}." + name.format(self.kinds[i])  # an SSM layer's heads read ssm.hook_q/k/v
                self.hook_dict[hp.name] = self.mod_dict[hp.name] = hp
        self.hook_final.name, self.hook_normalized.name = f"blocks.{n - 1}.hook_resid_post", "ln_final.hook_normalized"
        for hp in (self.hook_final, self.hook_normalized):
            self.hook_dict[hp.name] = self.mod_dict[hp.name] = hp
        self._rows: list[dict[str, Tensor]] = []
        self.W = [self._out_proj(spec) for spec in self.heads_spec]

    def _out_proj(self, spec: list[str]) -> Tensor:
        V = self.V
        w = torch.zeros(4 * V, len(spec) * V)
        eye = torch.eye(V)
        for h, role in enumerate(spec):
            block = {"gather": (1, 1 / self.n_gather), "aggregate": (3, 1 / self.n_agg), "keymover": (2, 1.0)}
            at, scale = block.get(role, (3, self.noise))
            w[at * V:(at + 1) * V, h * V:(h + 1) * V] = scale * eye
        return w

    def mixer_resume(self, layer: int) -> tuple[str, Tensor] | None:
        return f"blocks.{layer}.hook_mixer_out", self.W[layer]

    def forward(self, tokens: Any, *, start_at_layer: int | None = None, **kwargs: Any) -> Tensor:
        V = self.V
        if start_at_layer is None:
            tokens = self.validate_tokens(tokens)
            self._rows = [self._row_rules(row.tolist()) for row in tokens]
            x = self.hook_embed(self._embed(tokens, self._rows))
            start = 0
        else:
            x, start = tokens, start_at_layer
        B, L = x.shape[:2]
        rules = [self._rows[r % len(self._rows)] for r in range(B)]
        causal = torch.tril(torch.ones(L, L, dtype=torch.bool))
        for i in range(start, len(self.heads_spec)):
            spec = self.heads_spec[i]
            x = self.extra["resid_pre"][i](x)
            per_head = x[:, :, None].expand(B, L, len(spec), 4 * V)
            q_in, k_in, v_in = (self.extra[k][i](per_head) for k in ("q", "k", "v"))
            pats, src = [], []
            for h, role in enumerate(spec):
                if role == "aggregate":
                    q, c = q_in[:, :, h, 2 * V:3 * V], k_in[:, :, h, V:2 * V]
                    if self.normalize_scores:
                        q, c = nn.functional.normalize(q, dim=-1), nn.functional.normalize(c, dim=-1)
                    s = self.beta * torch.einsum("bqv,bkv->bqk", q, c)
                    pats.append(s.masked_fill(~causal, float("-inf")).softmax(-1))
                    src.append(v_in[:, :, h, :V] + v_in[:, :, h, V:2 * V])
                else:
                    pats.append(torch.stack([r[role if role in r else "sink"] for r in rules]))
                    src.append(v_in[:, :, h, :V])
            pat = torch.stack(pats, 1)
            if self.kinds[i] == "ssm":
                pat = pat + self._tail(L)
            pat = self.hooks_pattern[i](pat)
            z = self.hooks_z[i](torch.einsum("bhqk,bkhv->bqhv", pat, torch.stack(src, 2)))
            x = x + self.extra["mixer"][i](z.flatten(2) @ self.W[i].T)
        x = self.hook_normalized(self.hook_final(x))
        return self.gain * x[..., 3 * V:]


def build_graph_model(tokenizer: Any, values: list[str], **cfg: Any) -> tuple[GraphCircuitModel, set, set]:
    """As :func:`planted_circuit.build`, with the graph's hooks."""
    import random

    from planted_circuit import place_roles

    spec, kinds, gather, agg = place_roles(random.Random(cfg.pop("seed", 0)), **{k: cfg[k] for k in (
        "heads_per_layer", "depth", "n_gather", "n_agg", "keymover", "kind")})
    fmt = "mqar" if cfg["read"] == "pair" else "kv"
    return GraphCircuitModel(tokenizer, spec, kinds, fmt=fmt, read=cfg["read"], values=values), gather, agg
