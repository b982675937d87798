"""Planted Gather/Aggregate circuits under prompt formats the other planted models do not cover.

``tests/planted_circuit.py`` finds its segments in the tokens of two fixed formats (``k : v \\n`` lines, MQAR
pairs).  Here a format generator (:class:`Fmt`) writes each prompt word by word together with its *true
structure*: every segment's key and content tokens, the token its Gather writes into (``read``: the segment's
last token, or its value's last token), and the queried key's tokens.  :class:`FormatModel` acts on that structure
(registered per prompt by its token ids), never on the task's annotations: those come separately, from the
character spans through :func:`gather_aggregate.tasks.base.annotate` (optionally with a declared summary
character, as a task file or ``PromptSpec.summaries`` gives it), exactly what a user would hand the detector.

Formats (fields of :class:`Fmt`): keys and values of several tokens, segments of unequal lengths (filler words),
separators of several tokens or none, a declared summary at the segment's start, its key or its value, a
distractor segment whose key starts with the queried key's first word, trailing words after the queried key,
1-32 segments, a BOS token, the value before its key.

Residual blocks as in ``planted_circuit``: ``E`` (the token), ``C`` (content gathered into a read position),
``Q`` (the queried key at the query position), ``O`` (read by the unembedding).  Heads: ``gather`` (the read
position attends uniformly to the segment's key and value tokens before it, writes ``E`` into ``C``),
``aggregate`` (``softmax(beta * cos(Q_query, C_key))``, copies ``E + C`` into ``O``), ``keymover`` (the query
position attends to the queried key's tokens, writes ``E`` into ``Q``; without it the embedding puts the key
there), distractors ``prev``, ``uniform``, ``sink``, ``self`` (``0.02 E`` into ``O``).  ``ssm`` layers add a
decaying, unnormalised tail to every row, like implied attention.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import torch
from planted_circuit import PlantedModel, place_roles
from torch import Tensor

from gather_aggregate.tasks.base import PromptSpec, annotate

DISTRACTORS = ("prev", "uniform", "sink", "self")


@dataclass
class Truth:
    """A prompt's structure in token positions, as the planted heads use it."""

    segs: list[tuple[list[int], list[int], int]]  # per segment: key positions, content positions, read position
    query_key: list[int]
    query_pos: int


@dataclass
class Fmt:
    """A prompt format: ``header``, ``n_seg`` segments ``pre key mid value filler sep`` (or ``value mid key``), then
    ``query key trailing``; the answer is the queried segment's value."""

    name: str
    n_seg: int = 6
    key_len: tuple[int, int] = (1, 1)
    val_len: tuple[int, int] = (1, 1)
    pre: list[str] = field(default_factory=list)  # words before the key in each segment
    mid: list[str] = field(default_factory=lambda: [":"])  # between key and value
    sep: list[str] = field(default_factory=lambda: ["\n"])  # after the value
    filler: tuple[int, int] = (0, 0)  # random filler words inside a segment, after the value (unequal lengths)
    header: list[str] = field(default_factory=lambda: ["Memorize", "the", "following", "dictionary", ":", "\n"])
    query: list[str] = field(default_factory=lambda: ["The", "value", "of", "the", "key"])
    trailing: list[str] = field(default_factory=lambda: ["is"])
    read: str = "last"  # where the model's Gather writes: "last" token of the segment, or "value_end"
    summary: str | None = None  # declared summary: None (last token), "start", "key", "value_end"
    distractor: bool = False  # a segment whose key's first word equals the queried key's first word
    bos: bool = False
    value_first: bool = False  # segment = value mid key sep
    annotate_sep: bool = True  # False: the annotated segment stops before its separator (the model still uses it)


def make_prompt(fmt: Fmt, rng: random.Random, keys: list[str], values: list[str], filler_words: list[str]):
    """``(words, segment word spans [a, b), declared summary word per segment or None, truth in word positions,
    candidates, correct index)``; the answer is the correct segment's value."""
    n = fmt.n_seg
    klen = [rng.randint(*fmt.key_len) for _ in range(n)]
    seg_keys: list[list[str]] = []
    pool = list(keys)
    rng.shuffle(pool)
    for i in range(n):
        while True:
            k = [rng.choice(pool) for _ in range(klen[i])]
            if len(set(k)) == len(k) and k not in seg_keys:
                break
        seg_keys.append(k)
    q = rng.randrange(n)
    if fmt.distractor and n >= 2:
        d = (q + 1 + rng.randrange(n - 1)) % n
        if len(seg_keys[q]) == 1:  # a one-word key shares its first word only with itself; lengthen both
            seg_keys[q] = seg_keys[q] + [rng.choice([w for w in pool if w != seg_keys[q][0]])]
        seg_keys[d] = [seg_keys[q][0]] + [rng.choice([w for w in pool if w not in seg_keys[q]])]
    firsts = rng.sample(values, n)
    seg_vals = [[firsts[i]] + rng.sample([v for v in values if v not in firsts], rng.randint(*fmt.val_len) - 1)
                for i in range(n)]
    words = list(fmt.header)
    spans, summ, truth_segs = [], [], []
    for i in range(n):
        a = len(words)
        words += fmt.pre
        fill = [rng.choice(filler_words) for _ in range(rng.randint(*fmt.filler))]
        pos: dict[str, tuple[int, int]] = {}
        for part in (("value", "key") if fmt.value_first else ("key", "value")):
            if part == ("key" if fmt.value_first else "value"):
                words += fmt.mid
            start = len(words)
            words += seg_keys[i] if part == "key" else seg_vals[i]
            pos[part] = (start, len(words))
        words += fill + fmt.sep
        b = len(words)
        (k0, k1), (v0, v1) = pos["key"], pos["value"]
        spans.append((a, b if fmt.annotate_sep or not fmt.sep else b - len(fmt.sep)))
        summ.append({None: None, "start": a, "key": k0, "value_end": v1 - 1}[fmt.summary])
        read = b - 1 if fmt.read == "last" else v1 - 1
        content = [p for p in [*range(k0, k1), *range(v0, v1)] if p < read] or [read]
        truth_segs.append((list(range(k0, k1)), content, read))
    words += fmt.query
    qk = list(range(len(words), len(words) + len(seg_keys[q])))
    words += seg_keys[q] + fmt.trailing
    truth = Truth(truth_segs, qk, len(words) - 1)
    cands = [" ".join(v) for v in seg_vals]
    if n == 1:  # one segment: the other candidates are values the prompt does not hold
        cands += rng.sample([v for v in values if v not in seg_vals[0]], 3)
    return words, spans, summ, truth, cands, q


def spec_and_truth(fmt: Fmt, index: int, keys: list[str], values: list[str], filler_words: list[str],
                   seed: int = 0) -> tuple[PromptSpec, Truth]:
    """Prompt ``index`` of ``fmt`` as a :class:`PromptSpec` (character spans, a declared summary where ``fmt``
    says) and its :class:`Truth` in word positions (one word = one token of the world's tokenizer)."""
    rng = random.Random(f"{fmt.name}:{seed}:{index}")
    words, spans, summ, truth, cands, q = make_prompt(fmt, rng, keys, values, filler_words)
    starts, pos = [], 0
    for w in words:
        starts.append(pos)
        pos += len(w) + 1
    prompt = " ".join(words)
    segs = [(starts[a], starts[b - 1] + len(words[b - 1]), f"s{i}") for i, (a, b) in enumerate(spans)]
    summaries = [None if s is None else starts[s] for s in summ]
    spec = PromptSpec(prompt=prompt, segments=segs, correct=q, candidates=cands, answer=q,
                      summaries=summaries if any(s is not None for s in summaries) else None)
    return spec, truth


class FormatModel(PlantedModel):
    """The planted model of the module docstring; :meth:`register` gives it a prompt's true structure."""

    normalize_scores = True

    def __init__(self, tokenizer: Any, heads: list[list[str]], kinds: list[str], *, beta: float = 60.0,
                 gain: float = 30.0, noise: float = 0.02):
        super().__init__(tokenizer, heads, kinds, beta=beta, gain=gain, noise=noise)
        self.pad = tokenizer.pad_token_id
        self.truths: dict[tuple[int, ...], Truth] = {}

    def register(self, ids: list[int], truth: Truth) -> None:
        """Use ``truth`` for every row whose tokens start with ``ids`` (after any leading padding)."""
        self.truths[tuple(ids)] = truth

    def _truth(self, toks: list[int]) -> tuple[Truth | None, int]:
        """The truth of a row (its registered prompt is a prefix of the row after any leading padding) and the
        offset of its first real token."""
        t = tuple(toks)
        lo = 0
        while True:
            for hi in range(len(t), lo, -1):
                if t[lo:hi] in self.truths:
                    return self.truths[t[lo:hi]], lo
            if lo < len(t) and t[lo] == self.pad:
                lo += 1
            else:
                return None, 0

    def _rules(self, toks: list[int]) -> dict[str, Tensor]:
        L = len(toks)
        truth, off = self._truth(toks)
        sink = torch.zeros(L, L)
        sink[:, off] = 1.0
        sink[:off, :] = 0
        for t in range(off):
            sink[t, t] = 1.0
        pats: dict[str, Tensor] = {"sink": sink, "self": torch.eye(L)}
        g = sink.clone()
        km = sink.clone()
        qvec = torch.zeros(L, self.V)
        if truth is not None:
            for _keys, content, r in truth.segs:
                g[r + off] = 0.0
                for p in content:
                    g[r + off, p + off] = 1.0 / len(content)
            q = truth.query_pos + off
            km[q] = 0.0
            for p in truth.query_key:
                km[q, p + off] = 1.0 / len(truth.query_key)
                qvec[q, toks[p + off]] += 1.0
        pats["gather"] = g
        pats["keymover"] = km
        pats["qembed"] = qvec
        prev = sink.clone()
        for t in range(off + 1, L):
            prev[t] = 0.0
            prev[t, t - 1] = 1.0
        pats["prev"] = prev
        uni = torch.zeros(L, L)
        for t in range(L):
            lo = off if t >= off else t
            uni[t, lo:t + 1] = 1.0 / (t + 1 - lo)
        pats["uniform"] = uni
        return pats

    def _queried_key(self, tokens: Tensor, rules: list[dict[str, Tensor]]) -> Tensor:
        return torch.stack([r["qembed"] for r in rules])


def build(tokenizer: Any, *, heads_per_layer: int = 4, depth: int = 2, n_gather: int = 1, n_agg: int = 1,
          keymover: bool = True, kind: str = "attn", seed: int = 0) -> tuple[FormatModel, set, set]:
    """Gather heads in one layer, Aggregate heads in a later one (drawn with ``seed``), the key-mover (if any) in
    layer 0, distractors elsewhere; returns the model and the true Gather and Aggregate heads."""
    spec, kinds, gather, agg = place_roles(random.Random(seed), heads_per_layer=heads_per_layer, depth=depth,
                                           n_gather=n_gather, n_agg=n_agg, keymover=keymover, kind=kind,
                                           distractors=DISTRACTORS)
    return FormatModel(tokenizer, spec, kinds), gather, agg


def world(bos: bool = False, n_keys: int = 64, n_values: int = 64) -> tuple[Any, Any]:
    """The zoo's word-level world (64 keys, 64 values) and its tokenizer, with ``bos``: one that puts ``<eos>``
    before every prompt as its BOS token."""
    from gather_aggregate.training.vocab import build_tokenizer, make_world

    w = make_world(seed=5, n_entities=16, n_keys=n_keys, n_values=n_values)
    tok = build_tokenizer(w)
    if bos:
        from tokenizers import processors
        from transformers import PreTrainedTokenizerFast

        inner = tok.backend_tokenizer
        inner.post_processor = processors.TemplateProcessing(single="<eos> $A", special_tokens=[("<eos>", tok.eos_token_id)])
        tok = PreTrainedTokenizerFast(tokenizer_object=inner, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
                                      bos_token="<eos>", clean_up_tokenization_spaces=False)
    return w, tok


def examples(fmt: Fmt, model: FormatModel, w: Any, tok: Any, n: int = 8, seed: int = 1) -> list[Any]:
    """``n`` prompts of ``fmt`` annotated by ``tok`` (as any task's), each one's true structure registered with
    ``model``."""
    out = []
    for i in range(n):
        spec, truth = spec_and_truth(fmt, i, w.kv_keys, w.kv_values, w.filler, seed=seed)
        ex = annotate(spec, tok)
        shift = 1 if fmt.bos else 0
        tr = Truth([([k + shift for k in ks], [c + shift for c in cs], r + shift) for ks, cs, r in truth.segs],
                   [p + shift for p in truth.query_key], truth.query_pos + shift)
        assert len(ex.input_ids) == tr.query_pos + 1, (len(ex.input_ids), tr.query_pos, spec.prompt)
        model.register(ex.input_ids, tr)
        out.append(ex)
    return out
