"""Causal evidence for the Gather/Aggregate detector: position-restricted ablations, group peeling, random
baselines and G→A path patching, all measured as a share of the model's retrieval margin above chance.

**Retrieval margin.**  ``m`` is the mean over prompts of the answer's log-probability *among the candidates*
(softmax over the candidates' first tokens at the query position); a model that guesses uniformly scores
``chance = mean(-log n_candidates)``.  The *loss* of an intervention is
``(m_clean - m_intervened) / (m_clean - chance)``: 0 = no effect, 1 = retrieval taken to chance (it can exceed 1
when the intervention makes the model confidently wrong).  The same number means the same thing on any model.

**Where a role is ablated.**  A Gather head writes the summary of each segment into the segment's tokens, an
Aggregate head writes the retrieved answer at the query position.  So Gather candidates are zero-ablated at the
segments' tokens only and Aggregate candidates at the query position only.  A head whose ablation matters for
another reason (a head that moves the queried key into the query position, a previous-token head feeding the
query) costs nothing where the role it is tested for acts, and is not named.

**Path patching (G→A).**  Run the model with the Gather set ablated at the segments; keep the Aggregate heads'
outputs at the query position from that run; then run the clean model with only those outputs patched in.  What
retrieval loses is routed from the Gather heads into the Aggregate heads' keys and values (the query position is
clean, so their queries are).  The same hooks serve SSM heads (the tensor entering ``out_proj``).  As peeling does,
:func:`path_losses` also measures each path against its layers' heads only, for stages in series.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from gather_aggregate.core.errors import InputError
from gather_aggregate.core.protocol import Head, HookedModel

WHERE = ("segments", "query", "all")


class Prober:
    """Runs interventions on one set of prompts and scores them as a share of the retrieval margin."""

    def __init__(self, model: HookedModel, examples: Sequence[Any], *, batch_size: int = 64):
        from gather_aggregate.core.protocol import pad_id_of
        from gather_aggregate.tasks.base import collate

        self.model = model
        self.batches = [collate(list(examples[i:i + batch_size]), pad_id_of(model.tokenizer), device=model.device)
                        for i in range(0, len(examples), batch_size)]
        self.masks = [self._masks(b) for b in self.batches]
        self.n_forwards = 0  # interventions run (forward-equivalents)
        self.n_passes = 0  # model calls (stacked ablations share one)
        # the clean forward also keeps each layer's input, so that an ablation whose earliest head is in layer L
        # restarts there (``start_at_layer``) instead of at the tokens, within RESID_CACHE_BYTES
        self.resid: list[dict[int, Tensor]] = []
        parts = []
        for b in self.batches:
            got: dict[int, Tensor] = {}
            hooks = [(name, self._keep(got, la)) for la in range(1, model.n_layers)
                     if (name := model.resid_hook(la)) in getattr(model, "hook_dict", {})]
            with torch.no_grad():
                parts.append(self._logprob(b, model.run_with_hooks(b.tokens, fwd_hooks=hooks))[0])
            self.resid.append(got)
        if sum(t.numel() * t.element_size() for got in self.resid for t in got.values()) > RESID_CACHE_BYTES:
            self.resid = [{} for _ in self.batches]
        self.clean = self._mean(parts)
        n_cand = torch.cat([b.cand_mask.sum(1).float() for b in self.batches])
        self.chance = float((-n_cand.log()).mean())
        self.margin = self.clean - self.chance

    @staticmethod
    def _keep(got: dict[int, Tensor], layer: int) -> Any:
        def hook(x: Tensor, hook: Any) -> None:
            got[layer] = x.detach()

        return hook

    @staticmethod
    def _masks(b: Any) -> dict[str, Tensor]:
        key = torch.arange(b.tokens.shape[1], device=b.tokens.device)
        in_seg = ((key[None, None] >= b.seg_start[..., None]) & (key[None, None] < b.seg_end[..., None])).any(1)
        query = key[None] == b.query_pos[:, None]
        return {"segments": in_seg & ~query, "query": query, "all": torch.ones_like(query)}

    def _mean(self, parts: list[Tensor]) -> float:
        return float(torch.cat(parts).mean())

    @staticmethod
    def _logprob(b: Any, logits: Tensor, copies: int = 1) -> Tensor:
        """Per copy and prompt (``[copies, batch]``; logits of ``copies`` stacked copies of the batch): log-prob of
        the answer among the candidates' first tokens at the query position."""
        nb, width = b.tokens.shape
        q = logits.view(copies, nb, width, -1)[:, torch.arange(nb), b.query_pos].float()  # [copies, nb, vocab]
        cand = q.gather(2, b.cand_ids.clamp_min(0).expand(copies, -1, -1)).masked_fill(~b.cand_mask, float("-inf"))
        return cand.log_softmax(-1).gather(2, b.answer[None, :, None].expand(copies, -1, 1))[..., 0]

    def _mask_hooks(self, b: Any, masks: dict[str, Tensor],
                    copies: Sequence[Sequence[tuple[Sequence[Head], str]]]) -> list[tuple[str, Any]]:
        """Hooks that zero, in copy ``c`` of the stacked batch, each ``heads`` of ``copies[c]`` at its ``where``:
        one multiplicative mask per layer, ``[copies * batch, pos, heads]``."""
        r, (nb, width) = len(copies), b.tokens.shape
        keep: dict[int, Tensor] = {}  # layer -> [copies * nb, pos, heads] (1 = keep, 0 = zeroed)
        for c, ablations in enumerate(copies):
            for heads, where in ablations:
                for la, h in heads:
                    if la not in keep:
                        keep[la] = torch.ones(r * nb, width, self.model.layers[la].n_heads, device=b.tokens.device)
                    keep[la][c * nb:(c + 1) * nb, :, h] *= (~masks[where]).float()
        hooks = []
        for la, k in keep.items():
            name, axis = self.model.head_hook(la)

            def hook(z: Tensor, hook: Any, k: Tensor = k, axis: int = axis) -> Tensor:
                m = k[:, : z.shape[1]].to(z.dtype).movedim(2, axis)  # heads onto z's head axis
                return z * m.unsqueeze(-1)

            hooks.append((name, hook))
        return hooks

    def run(self, ablate: dict[str, Sequence[Head]] | None = None,
            patch: dict[Head, list[Tensor]] | None = None, capture: Sequence[Head] = ()) -> tuple[float, dict]:
        """Mean candidate log-prob with ``ablate[where]`` heads zeroed at ``where``, ``patch[head]`` (per batch a
        ``[b, d]`` tensor) written into that head's output at the query position, and the query-position outputs
        of ``capture`` returned (per head, per batch)."""
        parts: list[Tensor] = []
        captured: dict[Head, list[Tensor]] = {hd: [] for hd in capture}
        for bi, (b, masks) in enumerate(zip(self.batches, self.masks)):
            zeroed = [(list(heads), where) for where, heads in (ablate or {}).items() if heads]
            hooks: list[tuple[str, Any]] = self._mask_hooks(b, masks, [zeroed]) if zeroed else []
            rows = torch.arange(len(b), device=b.tokens.device)
            for (la, h), vals in (patch or {}).items():
                name, axis = self.model.head_hook(la)

                def put(z: Tensor, hook: Any, h: int = h, axis: int = axis, v: Tensor = vals[bi], rows: Tensor = rows,
                        qpos: Tensor = b.query_pos) -> Tensor:
                    z = z.clone()
                    z.select(axis, h)[rows, qpos] = v.to(z.dtype)
                    return z

                hooks.append((name, put))
            for la, h in capture:
                name, axis = self.model.head_hook(la)

                def grab(z: Tensor, hook: Any, hd: Head = (la, h), axis: int = axis, rows: Tensor = rows,
                         qpos: Tensor = b.query_pos) -> Tensor:
                    captured[hd].append(z.select(axis, hd[1])[rows, qpos].detach().clone())
                    return z

                hooks.append((name, grab))
            with torch.no_grad():
                logits = self.model.run_with_hooks(b.tokens, fwd_hooks=hooks) if hooks else self.model(b.tokens)
            self.n_forwards += 1
            self.n_passes += 1
            parts.append(self._logprob(b, logits)[0])
        return self._mean(parts), captured

    def loss_with(self, make_hooks: Any, start: int | None = None) -> float:
        """Share of the retrieval margin lost under the hooks ``make_hooks(batch)`` returns for each batch of
        prompts (any intervention that is not a head ablation, e.g. one on a short convolution).  ``start``: the
        first layer the hooks touch; the forward restarts there from the clean run's input to it, where kept."""
        parts = []
        for b, resid in zip(self.batches, self.resid):
            with torch.no_grad():
                if start is not None and start in resid:
                    with self.model.hooks(fwd_hooks=make_hooks(b)):
                        logits = self.model(resid[start], start_at_layer=start)
                else:
                    logits = self.model.run_with_hooks(b.tokens, fwd_hooks=make_hooks(b))
            self.n_forwards += 1
            self.n_passes += 1
            parts.append(self._logprob(b, logits)[0])
        return (self.clean - self._mean(parts)) / self.margin

    def loss(self, heads: Sequence[Head], where: str) -> float:
        """Share of the retrieval margin lost when ``heads`` are zero-ablated at ``where``."""
        return self.losses([(heads, where)])[0]

    def losses(self, ablations: Sequence[tuple[Sequence[Head], str]]) -> list[float]:
        """:meth:`loss` of each ``(heads, where)``, with the ablations stacked along the batch: a forward on ``R``
        copies of a batch of prompts runs ``R`` ablations, each copy with its own heads zeroed (one multiplicative
        mask per layer).  ``R`` is at most :data:`STACK_MAX_COPIES` and keeps the copies' logits within
        :data:`STACK_LOGITS` floats, so a small model runs several ablations per forward and a large one
        (vocabulary x width past the budget) one at a time, as :meth:`run` does.  Each copy restarts at its
        earliest ablated layer from the clean run's input to it.  The numbers equal separate forwards up to float
        summation order (tests/test_detect.py)."""
        for _, where in ablations:
            if where not in WHERE:
                raise InputError(f"where must be one of {WHERE}, got {where!r}")
        last = self.model.n_layers - 1
        # a last-layer head's output at a segment token reaches only that token's logits, never the query's: it
        # is left out of a segments ablation (exactly what running it would give)
        ablations = [([hd for hd in heads if not (where == "segments" and hd[0] == last)], where)
                     for heads, where in ablations]
        out = [0.0] * len(ablations)
        todo = [i for i, (heads, _) in enumerate(ablations) if heads]
        if not todo:
            return out
        todo.sort(key=lambda i: min(la for la, _ in ablations[i][0]))  # copies that restart at one layer together
        sums = {i: 0.0 for i in todo}
        count = 0
        for b, masks, resid in zip(self.batches, self.masks, self.resid):
            nb, width = b.tokens.shape
            per = max(1, min(STACK_MAX_COPIES, STACK_LOGITS // max(1, nb * width * int(self.model.d_vocab))))
            for lo in range(0, len(todo), per):
                chunk = todo[lo:lo + per]
                lp = self._stacked(b, masks, resid, [ablations[i] for i in chunk])  # [copies, nb]
                for j, i in enumerate(chunk):
                    sums[i] += float(lp[j].sum())
                self.n_forwards += len(chunk)
                self.n_passes += 1
            count += nb
        for i in todo:
            out[i] = (self.clean - sums[i] / count) / self.margin
        return out

    def _stacked(self, b: Any, masks: dict[str, Tensor], resid: dict[int, Tensor],
                 ablations: Sequence[tuple[Sequence[Head], str]]) -> Tensor:
        """Candidate log-probs ``[copies, batch]`` of one batch under each ablation, in one forward that starts
        at the earliest ablated layer (from the clean run's input to it, where kept)."""
        r = len(ablations)
        hooks = self._mask_hooks(b, masks, [[ab] for ab in ablations])
        start = min(la for heads, _ in ablations for la, _ in heads)
        with torch.no_grad():
            if start in resid:
                x = resid[start]
                with self.model.hooks(fwd_hooks=hooks):
                    logits = self.model(x.repeat(r, *([1] * (x.dim() - 1))), start_at_layer=start)
            else:
                logits = self.model.run_with_hooks(b.tokens.repeat(r, 1), fwd_hooks=hooks)
        return self._logprob(b, logits, r)


#: stacked ablations (:meth:`Prober.losses`): at most this many copies of a batch per forward, and their logits
#: within this many floats (256 MB in fp32)
STACK_MAX_COPIES = 4
STACK_LOGITS = 1 << 26
#: the clean run's layer inputs are kept for restarts when they fit in this many bytes (else every ablation
#: runs from the tokens)
RESID_CACHE_BYTES = 1 << 29


#: a head stays in its role's group while restoring it alone (the rest of the group, or of its layer's part of the
#: group, still ablated: :func:`peel`) gives back at least this share of the retrieval margin: it carries something
#: the others do not replace
KEEP_MIN = 0.05


#: the contexts :func:`peel` and :func:`path_losses` measure a head (a path) in: the whole group, and the head's
#: layer's part of it.  The detector uses both; ``("group",)`` is the earlier rule
#: (``scripts/peel_context_compare.py`` runs the two side by side)
CONTEXTS = ("group", "layer")


def peel(prober: Prober, candidates: Sequence[Head], where: str) -> tuple[list[Head], float, dict[Head, float],
                                                                          list[dict[str, Any]]]:
    """Greedy peeling by joint ablation: start from every candidate ablated together; while some head gives back
    less than ``KEEP_MIN`` of the margin when restored alone, drop the one that gives back least.  Returns the
    group, its loss, each candidate's give-back (at its last test) and the steps, one rule for groups of one, two
    or many (redundant heads each give back much once the others are gone).

    **Two contexts.**  A head's give-back is the larger of what restoring it gives back with, besides it,

    1. the whole group ablated, ``loss(G) - loss(G - h)``: heads in parallel, within a layer or across layers (a
       backup in a later layer gives back much when everything else is gone); and
    2. its own layer's part of the group ablated, the group's other layers left clean,
       ``loss(G_l) - loss(G_l - h)`` with ``G_l`` the group's heads in ``h``'s layer: stages in series, across
       layers.  Where one stage reads what an earlier one wrote at the same position (a second Aggregate stage
       whose query the first stage formed), restoring either alone against the whole group gives back nothing:
       the other stage is still ablated.  With the other layers clean each stage is the bottleneck it is.

    A group within one layer has one context (the two coincide), and costs what one context costs.  Heads needed
    together within a layer (any one missing costs what all missing do) pass neither: restoring one alone gives
    nothing back, so all but the last restored are dropped (``tests/planted_matrix.py``'s serial configurations
    with two or more Gather heads feeding a relay only; docs/results_fixtures.md, "Two Aggregate stages in
    series").

    Lazily evaluated: after a drop, a head's give-back is measured again only when its last value is the least
    one known.  Restoring heads one by one only makes the others matter more where heads are redundant, so an
    older value stands in as a lower bound; and the group is final only after a round in which every head was
    measured on the final group and gave back at least ``KEEP_MIN``: the plain greedy rule's stopping point.  Where
    heads drop out one by one this costs a few forwards per candidate instead of half the candidates squared
    (on ``mamba2-mc``'s KV prompts the whole detector ran 103 ablations instead of 154, naming the same heads)."""
    group = list(candidates)
    steps: list[dict[str, Any]] = []
    give: dict[Head, float] = {}
    fresh: set[Head] = set()  # measured on the current group
    loss = prober.loss(group, where)
    layer_loss: dict[int, float] = {}  # per layer of the group: loss with only that layer's part of it ablated

    def part(la: int) -> list[Head]:
        return [g for g in group if g[0] == la]

    def measure(heads: list[Head]) -> None:
        layers = {g[0] for g in group}
        todo = [(g, "group") for g in heads]
        if len(layers) > 1 and "layer" in CONTEXTS:  # 2. the layer context, where it differs from the whole group's
            todo += [(g, "layer") for g in heads]
            missing = sorted({g[0] for g in heads} - set(layer_loss))
            for la, lo in zip(missing, prober.losses([(part(la), where) for la in missing])):
                layer_loss[la] = lo
        ablations = [([g for g in (group if ctx == "group" else part(hd[0])) if g != hd], where) for hd, ctx in todo]
        for (hd, ctx), lo in zip(todo, prober.losses(ablations)):
            base = loss if ctx == "group" else layer_loss[hd[0]]
            give[hd] = base - lo if ctx == "group" else max(give[hd], base - lo)
            fresh.add(hd)

    measure(group)
    while group:
        worst = min(group, key=lambda hd: (give[hd], hd))
        if worst not in fresh:
            measure([worst])
            continue
        if give[worst] >= KEEP_MIN:
            stale = [hd for hd in group if hd not in fresh]
            if stale:
                measure(stale)
                continue
            steps.append({"group": [list(h) for h in group], "loss": loss, "least_give_back": give[worst]})
            break
        steps.append({"group": [list(h) for h in group], "loss": loss, "least_give_back": give[worst]})
        group.remove(worst)
        loss = prober.loss(group, where) if group else 0.0
        layer_loss.pop(worst[0], None)  # that layer's part changed; the others' did not
        fresh.clear()
    return group, loss, give, steps


#: random head sets drawn for each named group's baseline
N_RANDOM = 10


#: the sources random sets are drawn from, in order of preference (:func:`random_sets`)
RANDOM_SOURCES = ("outside the group, kinds matched", "outside the group, any kind",
                  "all heads, kinds matched", "all heads, any kind")


def random_sets(group: Sequence[Head], pool: Sequence[Head], kinds: dict[Head, str], n: int = N_RANDOM,
                seed: int = 0) -> tuple[list[list[Head]], str]:
    """``n`` random head sets as large as ``group``, and the source they were drawn from (one of
    :data:`RANDOM_SOURCES`).

    A baseline is a distribution only if its draws differ: a set drawn from a source that holds at least twice as
    many heads shares, on average, at most half its heads with another draw (two random ``k``-subsets of ``m``
    share ``k / m`` of their heads).  So the first source that holds at least twice the group's heads (of each
    kind, where kinds are matched) is used:

    1. ``pool`` (the heads outside the group), as many heads of each kind as the group has;
    2. ``pool``, heads of any kind (a hybrid whose group holds every attention head);
    3. ``group`` and ``pool`` together, kinds matched: a permutation baseline, asking whether this set matters
       more than a random set of as many heads of the model (a group that fills one layer of a two-layer model,
       whose only same-size set outside it is the other layer);
    4. ``group`` and ``pool``, any kind; also where no source is that large.
    """
    if not group or all(hd in group for hd in pool):  # no other head: no baseline
        return [], RANDOM_SOURCES[0]
    need: dict[str, int] = {}
    for hd in group:
        need[kinds[hd]] = need.get(kinds[hd], 0) + 1
    everyone = list(group) + [hd for hd in pool if hd not in group]
    rng = random.Random(seed)

    def split_by_kind(heads: Sequence[Head]) -> dict[str, list[Head]] | None:
        """``heads`` by the group's kinds, or None where some kind holds fewer than twice the group's."""
        split = {k: [hd for hd in heads if kinds[hd] == k] for k in need}
        return split if all(len(split[k]) >= 2 * c for k, c in need.items()) else None

    def kinds_matched(split: dict[str, list[Head]]) -> list[list[Head]]:
        return [[hd for k, c in need.items() for hd in rng.sample(split[k], c)] for _ in range(n)]

    if split := split_by_kind(pool):  # 1.
        return kinds_matched(split), RANDOM_SOURCES[0]
    if len(pool) >= 2 * len(group):  # 2.
        return [rng.sample(list(pool), len(group)) for _ in range(n)], RANDOM_SOURCES[1]
    if split := split_by_kind(everyone):  # 3.
        return kinds_matched(split), RANDOM_SOURCES[2]
    return [rng.sample(everyone, len(group)) for _ in range(n)], RANDOM_SOURCES[3]  # 4.


def random_losses(prober: Prober, group: Sequence[Head], where: str, pool: Sequence[Head], kinds: dict[Head, str],
                  seed: int = 0) -> tuple[list[float], str]:
    """Losses of ``N_RANDOM`` random head sets as large as ``group`` (:func:`random_sets`: from ``pool``, the
    heads outside the group, with as many heads of each kind where the pool is large enough), ablated at the
    same positions; and the source they were drawn from."""
    picks, source = random_sets(group, pool, kinds, seed=seed)
    return (prober.losses([(p, where) for p in picks]) if picks else []), source


def path_losses(prober: Prober, senders: Sequence[Head], receivers: Sequence[Head]) -> tuple[float, dict]:
    """G→A path patching (module docstring).  Returns the loss routed from all ``senders`` into all ``receivers``
    and, per pair ``(g, a)`` with ``g`` in an earlier layer, how much of it the path ``g → a`` carries.

    In a context ``(S, R)``, senders ``S`` ablated and receivers ``R`` patched with their outputs from that run,
    the pair's share is what comes back when ``a`` instead receives the run in which only ``S - {g}`` are ablated.
    It is the largest over the two contexts :func:`peel` uses, taken on each side: ``S`` every sender or ``g``'s
    layer's senders; ``R`` every receiver or ``a``'s layer's receivers.  Every sender and receiver: heads in parallel.
    ``a``'s layer: receivers in series (where a later Aggregate stage reads what ``a`` writes at the query,
    restoring ``g → a`` gives nothing back while that stage still receives the corrupted run).  Contexts that
    coincide (one layer) are run once."""
    recv = [a for a in receivers if any(g[0] < a[0] for g in senders)]
    if not senders or not recv:
        return 0.0, {}
    runs: dict[frozenset, dict] = {frozenset(): {}}  # senders ablated -> receivers' outputs at the query (none: clean)
    bases: dict[tuple[frozenset, frozenset], float] = {}

    def outputs(ablated: frozenset) -> dict:
        if ablated not in runs:
            runs[ablated] = prober.run({"segments": sorted(ablated)}, capture=recv)[1]
        return runs[ablated]

    def loss(patch: dict) -> float:
        return (prober.clean - prober.run(patch=patch)[0]) / prober.margin

    def share(s: frozenset, r: frozenset, g: Head, a: Head) -> float:
        if (s, r) not in bases:
            bases[(s, r)] = loss({hd: outputs(s)[hd] for hd in r})
        kept = outputs(s - {g})
        restored = {hd: outputs(s)[hd] for hd in r if hd != a} | ({a: kept[a]} if a in kept else {})
        return bases[(s, r)] - (loss(restored) if restored else 0.0)

    everything = (frozenset(senders), frozenset(recv))
    full = bases[everything] = loss({hd: outputs(everything[0])[hd] for hd in recv})
    pairs: dict[tuple[Head, Head], float] = {}
    for g in senders:
        for a in recv:
            if g[0] >= a[0]:
                continue
            sides = ({frozenset(senders)}, {frozenset(recv)})
            if "layer" in CONTEXTS:
                sides[0].add(frozenset(s for s in senders if s[0] == g[0]))
                sides[1].add(frozenset(r for r in recv if r[0] == a[0]))
            pairs[(g, a)] = max(share(s, r, g, a) for s in sides[0] for r in sides[1])
    return full, pairs
