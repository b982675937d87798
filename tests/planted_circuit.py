"""A planted retrieval circuit that *works*: its answer runs through Gather and Aggregate heads we place, so
the detector's causal tests have a ground truth.

The residual stream has four blocks of ``V`` dimensions (``V`` = vocabulary size), each a one-hot code of tokens:
``E`` (the token itself), ``C`` (content gathered into a segment's read position), ``Q`` (the queried key at the
query position) and ``O`` (the output the unembedding reads: ``logits = gain * O``).  Heads (``kind`` per layer:
``attn`` softmax rows; ``ssm``: the same rows plus a decaying tail, not renormalised, like implied attention; or
``delta``: the same rows plus what a delta rule's implied row carries besides the content it reads, signed and not
normalised: a large negative weight on the first token (``-DELTA_SINK``) and a removal-like term of alternating
sign on every earlier token (``±DELTA_SPREAD``), in every head's row but the key-mover's (its output is the query
the Aggregate heads match against the gathered content, where the first token's term would match itself); the
layer's output is computed from these signed rows, so the circuit still retrieves, but on the normalised ``|row|``
most of the mass lies off the segments):

* ``gather``: at each segment's read position (``read`` = ``"delim"``: the ``\\n`` ending a ``k:v\\n`` line;
  ``"value"``: the value token before it; ``"pair"``: the value of an MQAR pair ``k v``) attends uniformly to the
  segment's earlier tokens and writes their ``E`` into ``C`` (``1/k`` each for ``k`` redundant Gather heads);
* ``aggregate``: attends by content, ``softmax(beta * <Q_query, C_key>)``, and copies ``E + C`` of what it reads
  into ``O`` (``1/k`` each);
* ``relay`` (a first Aggregate stage, in series with the ``aggregate`` heads of a later layer): attends as an
  ``aggregate`` head does and writes ``E + C`` of what it reads into a fifth block ``R`` (``1/k`` each), and
  ``relay_out`` of it into ``O`` too; a model with relay heads has its ``aggregate`` heads match ``R`` instead of
  ``Q``, ``softmax(beta * <R_query, C_key>)``: the segment whose content the relay found.  The score is then
  quadratic in the gathered content, so that where the relay only feeds the later stage, two or more Gather heads
  are needed together (losing one of two takes retrieval to chance) instead of each enough alone.  At ``relay_out = 0``
  neither stage retrieves without the other; the relay's row, like the key-mover's, carries no delta terms (its
  output is the later stage's query);
* ``keymover`` (the unrelated high-drop head): attends to the queried key (two tokens back in the KV prompt's
  ``... ' k ' is``, itself in MQAR) and writes its ``E`` into ``Q``; without it the embedding puts it there;
* distractors ``prev``, ``uniform``, ``sink``, ``self``, ``first_line`` write ``0.02 E`` into ``O`` (a small,
  real effect) — none retrieves.  Rows a rule does not cover attend to position 0 (a sink).
"""

from __future__ import annotations

from typing import Any

import torch
from planted import HookedPatterns
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint
from transformer_lens.HookedRootModule import HookedRootModule

from gather_aggregate.core.protocol import LayerInfo, ProtocolMixin

DISTRACTORS = ("prev", "uniform", "sink", "self", "first_line")
#: the ``delta`` kind's signed extra terms (module docstring): the first token's weight and the alternating term's
DELTA_SINK = 6.0
DELTA_SPREAD = 0.02


class PlantedModel(HookedPatterns, HookedRootModule, ProtocolMixin):
    """The forward every planted model shares: per layer, each head's role (``heads[layer][head]``) picks its
    pattern, from the per-row rules a subclass's :meth:`_rules` computes (``aggregate`` attends by content), and
    writes its block of the residual as the module docstring says.  Subclasses give :meth:`_rules` and
    :meth:`_embed`."""

    #: cosine instead of dot-product Aggregate scores (keys of several tokens put several ones in ``Q``)
    normalize_scores = False

    def __init__(self, tokenizer: Any, heads: list[list[str]], kinds: list[str], *, beta: float = 60.0,
                 gain: float = 30.0, noise: float = 0.02, relay_out: float = 0.0):
        super().__init__()
        self.tokenizer, self.heads_spec, self.kinds = tokenizer, heads, kinds
        self.V = self.d_vocab = len(tokenizer)
        self.beta, self.gain, self.noise = beta, gain, noise
        self.n_ctx = None
        n = max(len(h) for h in heads)
        self.n_gather = sum(r == "gather" for layer in heads for r in layer)
        self.n_agg = sum(r == "aggregate" for layer in heads for r in layer)
        self.n_relay = sum(r == "relay" for layer in heads for r in layer)
        self.relay_out = relay_out
        self.n_blocks = 5 if self.n_relay else 4
        self.has_keymover = any("keymover" in layer for layer in heads)
        self._layers = [LayerInfo(i, "ssm" if kinds[i] == "delta" else kinds[i], n, self.V, f"blocks.{i}.attn.hook_z")
                        for i in range(len(heads))]
        self.hook_embed = HookPoint()
        self.hooks_pattern = nn.ModuleList([HookPoint() for _ in heads])
        self.hooks_z = nn.ModuleList([HookPoint() for _ in heads])
        self.dummy = nn.Parameter(torch.zeros(1))  # device/dtype anchor (never used)
        self.setup()
        renamed = {"hook_embed": self.hook_embed}
        for i in range(len(heads)):
            for hp, name in ((self.hooks_pattern[i], "attn.hook_pattern"), (self.hooks_z[i], "attn.hook_z")):
                hp.name = f"blocks.{i}.{name}"
                renamed[hp.name] = hp
        self.hook_dict = renamed
        self.mod_dict = dict(renamed)
        self._cache: dict[tuple[int, ...], dict[str, Tensor]] = {}

    @property
    def layers(self) -> list[LayerInfo]:
        return self._layers

    def _rules(self, toks: list[int]) -> dict[str, Tensor]:  # pragma: no cover - abstract
        """Role -> ``[L, L]`` pattern of one row of tokens (computed once per distinct row: :meth:`_row_rules`)."""
        raise NotImplementedError

    def _queried_key(self, tokens: Tensor, rules: list[dict[str, Tensor]]) -> Tensor:  # pragma: no cover
        """``[batch, pos, V]``: the ``Q`` block the embedding writes when no key-mover head does."""
        raise NotImplementedError

    def _row_rules(self, toks: list[int]) -> dict[str, Tensor]:
        key = tuple(toks)
        if key not in self._cache:
            self._cache[key] = self._rules(toks)
        return self._cache[key]

    def _embed(self, tokens: Tensor, rules: list[dict[str, Tensor]]) -> Tensor:
        """The residual ``[batch, pos, 4V]`` (``5V`` with relay heads) before the first layer: ``E`` the token,
        ``Q`` the queried key when no key-mover head puts it there."""
        B, L = tokens.shape
        V = self.V
        x = torch.zeros(B, L, self.n_blocks * V)
        x[..., :V] = nn.functional.one_hot(tokens, V).float()
        if not self.has_keymover:
            x[..., 2 * V:3 * V] = self._queried_key(tokens, rules)
        return x

    def _tail(self, L: int) -> Tensor:
        idx = torch.arange(L)
        d = (idx[:, None] - idx[None]).float()
        return torch.where(d > 0, 0.1 * 0.5 ** (d - 1), torch.zeros(())).clamp_min(0)

    def _delta_terms(self, L: int) -> Tensor:
        """The ``delta`` kind's extra terms ``[L, L]``: ``-DELTA_SINK`` on the first token and ``±DELTA_SPREAD``
        (the sign alternating with the distance) on every other earlier token, in every row after the first."""
        idx = torch.arange(L)
        d = idx[:, None] - idx[None]
        out = torch.where(d > 0, DELTA_SPREAD * (1.0 - 2.0 * (d % 2)).float(), torch.zeros(()))
        out[1:, 0] = -DELTA_SINK
        return out

    def forward(self, tokens: Any, **kwargs: Any) -> Tensor:
        tokens = self.validate_tokens(tokens)
        V = self.V
        rules = [self._row_rules(row.tolist()) for row in tokens]
        x = self.hook_embed(self._embed(tokens, rules))  # [b, L, 4V or 5V]
        B, L = tokens.shape
        causal = torch.tril(torch.ones(L, L, dtype=torch.bool))
        for i, spec in enumerate(self.heads_spec):
            pats = []
            for role in spec:
                if role in ("aggregate", "relay"):
                    later = role == "aggregate" and self.n_relay  # the second stage matches what the relay found
                    q, c = x[..., 4 * V:] if later else x[..., 2 * V:3 * V], x[..., V:2 * V]
                    if self.normalize_scores:
                        q, c = nn.functional.normalize(q, dim=-1), nn.functional.normalize(c, dim=-1)
                    s = self.beta * torch.einsum("bqv,bkv->bqk", q, c)
                    p = s.masked_fill(~causal, float("-inf")).softmax(-1)
                else:
                    p = torch.stack([r[role if role in r else "sink"] for r in rules])
                pats.append(p)
            pat = torch.stack(pats, 1)  # [b, h, q, k]
            if self.kinds[i] == "ssm":
                pat = pat + self._tail(L)
            elif self.kinds[i] == "delta":  # not the key-mover's or a relay's row: each output is a query, which
                # the Aggregate heads match against the gathered content, so the first token's term would match itself
                plain = torch.tensor([role not in ("keymover", "relay") for role in spec]).float()
                pat = pat + self._delta_terms(L) * plain[:, None, None]
            pat = self.hooks_pattern[i](pat)
            src = torch.stack([x[..., :V] + (x[..., V:2 * V] if role in ("aggregate", "relay") else 0)
                               for role in spec], 2)
            z = self.hooks_z[i](torch.einsum("bhqk,bkhv->bqhv", pat, src))  # [b, q, h, V]
            out = torch.zeros_like(x)
            for h, role in enumerate(spec):
                zh = z[:, :, h]
                if role == "gather":
                    out[..., V:2 * V] += zh / self.n_gather
                elif role == "aggregate":
                    out[..., 3 * V:4 * V] += zh / self.n_agg
                elif role == "relay":
                    out[..., 4 * V:] += zh / self.n_relay
                    out[..., 3 * V:4 * V] += self.relay_out * zh / self.n_relay
                elif role == "keymover":
                    out[..., 2 * V:3 * V] += zh
                else:
                    out[..., 3 * V:4 * V] += self.noise * zh
            x = x + out
        return self.gain * x[..., 3 * V:4 * V]


class CircuitModel(PlantedModel):
    """Segments found in the tokens of two fixed formats: ``k : v \\n`` lines (``fmt="kv"``) or MQAR pairs."""

    def __init__(self, tokenizer: Any, heads: list[list[str]], kinds: list[str], *, fmt: str = "kv",
                 read: str = "delim", values: list[str] | None = None, beta: float = 60.0, gain: float = 30.0,
                 noise: float = 0.02, relay_out: float = 0.0):
        super().__init__(tokenizer, heads, kinds, beta=beta, gain=gain, noise=noise, relay_out=relay_out)
        self.fmt, self.read = fmt, read
        self.newline = tokenizer.convert_tokens_to_ids("\n")
        self.colon = tokenizer.convert_tokens_to_ids(":")
        self.value_ids = set(tokenizer.convert_tokens_to_ids(list(values or [])))

    # ---- token structure ----------------------------------------------------------------------------------
    def _segments(self, toks: list[int]) -> list[tuple[int, int, int]]:
        """``(start, end, read)`` of every segment found in the tokens (never from task annotations)."""
        out = []
        if self.fmt == "kv":
            nl = [i for i, t in enumerate(toks) if t == self.newline]
            for a, b in zip(nl, nl[1:]):
                if b - a >= 4 and toks[a + 2] == self.colon:  # a `k : v \n` line
                    out.append((a + 1, b + 1, b if self.read == "delim" else b - 1))
        else:  # mqar: value tokens right after a non-value token
            for i in range(1, len(toks)):
                if toks[i] in self.value_ids and toks[i - 1] not in self.value_ids:
                    out.append((i - 1, i + 1, i))
        return out

    def _rules(self, toks: list[int]) -> dict[str, Tensor]:
        L = len(toks)
        eye = torch.eye(L)
        sink = torch.zeros(L, L)
        sink[:, 0] = 1.0
        pats: dict[str, Tensor] = {"sink": sink, "self": eye}
        g = sink.clone()
        segs = self._segments(toks)
        for s, _e, r in segs:
            g[r] = 0.0
            g[r, s:r] = 1.0 / (r - s)
        pats["gather"] = g
        off = 2 if self.fmt == "kv" else 0
        km = sink.clone()
        for t in range(off, L):
            km[t] = 0.0
            km[t, t - off] = 1.0
        pats["keymover"] = km
        prev = sink.clone()
        for t in range(1, L):
            prev[t] = 0.0
            prev[t, t - 1] = 1.0
        pats["prev"] = prev
        pats["uniform"] = torch.tril(torch.ones(L, L)) / torch.arange(1, L + 1)[:, None]
        fl = sink.clone()
        if segs:
            r0 = segs[0][2]
            fl[r0 + 1:] = 0.0
            fl[r0 + 1:, r0] = 1.0
        pats["first_line"] = fl
        return pats

    def _queried_key(self, tokens: Tensor, rules: list[dict[str, Tensor]]) -> Tensor:
        """The token ``off`` places back (the key of ``... ' k ' is`` in KV, the token itself in MQAR)."""
        L = tokens.shape[1]
        off = 2 if self.fmt == "kv" else 0
        q = torch.zeros(*tokens.shape, self.V)
        q[:, off:] = nn.functional.one_hot(tokens[:, : L - off], self.V).float()
        return q


def place_roles(rng: Any, *, heads_per_layer: int, depth: int, n_gather: int, n_agg: int, keymover: bool,
                kind: str, distractors: tuple[str, ...] = DISTRACTORS, n_keymover: int = 1, n_relay: int = 0
                ) -> tuple[list[list[str]], list[str], set, set]:
    """Gather heads in one layer, Aggregate heads in a later one (drawn with ``rng``), the key-mover (if any;
    ``n_keymover`` redundant ones, each enough alone: their outputs add up in ``Q``) in layer 0, distractors
    everywhere else; ``kind="ssm"`` (``"delta"``) makes the Gather and Aggregate layers SSM
    (delta-rule) layers.  ``n_relay`` > 0 (``depth`` >= 3) puts that many relay heads, the first of two Aggregate
    stages in series, in a layer between the Gather and the Aggregate layers.
    Returns the roles per layer, the layer kinds, and the true Gather and Aggregate heads (the relays among the
    Aggregate heads)."""
    if n_relay:
        if depth < 3:
            raise ValueError("relay heads need depth >= 3 (Gather, relay and Aggregate layers)")
        g_layer = rng.randrange(0, depth - 2)
        r_layer = rng.randrange(g_layer + 1, depth - 1)
        a_layer = rng.randrange(r_layer + 1, depth)
    else:
        g_layer = rng.randrange(0, depth - 1)
        a_layer = rng.randrange(g_layer + 1, depth)
    spec = [[""] * heads_per_layer for _ in range(depth)]

    def place(layer: int, role: str, k: int) -> list[tuple[int, int]]:
        free = [h for h in range(heads_per_layer) if not spec[layer][h]]
        picks = rng.sample(free, k)
        for h in picks:
            spec[layer][h] = role
        return [(layer, h) for h in picks]
    if keymover:
        place(0, "keymover", n_keymover)
    gather = place(g_layer, "gather", n_gather)
    agg = place(a_layer, "aggregate", n_agg) + (place(r_layer, "relay", n_relay) if n_relay else [])
    for layer in spec:
        for h in range(heads_per_layer):
            if not layer[h]:
                layer[h] = rng.choice(distractors)
    kinds = ["attn"] * depth
    if kind in ("ssm", "delta"):
        kinds[g_layer] = kinds[a_layer] = kind
        if n_relay:
            kinds[r_layer] = kind
    return spec, kinds, set(gather), set(agg)


def build(tokenizer: Any, values: list[str], *, heads_per_layer: int, depth: int, n_gather: int, n_agg: int,
          keymover: bool, read: str, kind: str = "attn", seed: int = 0, n_keymover: int = 1, n_relay: int = 0,
          relay_out: float = 0.0) -> tuple[CircuitModel, set, set]:
    """A planted model: Gather heads in one layer, Aggregate heads in a later one, the key-mover (if any) in layer
    0, distractors everywhere else; ``n_relay`` relay heads (a first Aggregate stage, ``relay_out`` of it also
    into the output) in a layer between.  Returns the model and the true Gather and Aggregate heads."""
    import random

    spec, kinds, gather, agg = place_roles(random.Random(seed), heads_per_layer=heads_per_layer, depth=depth,
                                           n_gather=n_gather, n_agg=n_agg, keymover=keymover, kind=kind,
                                           n_keymover=n_keymover, n_relay=n_relay)
    fmt = "mqar" if read == "pair" else "kv"
    model = CircuitModel(tokenizer, spec, kinds, fmt=fmt, read=read, values=values, relay_out=relay_out)
    return model, gather, agg
