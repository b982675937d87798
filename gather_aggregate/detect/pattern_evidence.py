"""Pattern evidence for the Gather/Aggregate detector, in scale-free terms that mean the same on every mixer.

A softmax row sums to 1 and often parks much of itself on a sink; an SSM's implied row does not sum to 1 and
decays; a delta rule's implied row is signed, not normalised, and carries the key-removal terms of its state.
So every number here is a **ratio of masses within one row** of the per-row normalised ``|pattern|``, over the
tokens the role chooses among, never over the whole row: an Aggregate head's query row is read over the **content**,
the tokens of the task's segments (the dictionary lines, the options), not the prompt's head or the query's own
tokens; a Gather head's read row over the tokens up to its read position.  How much of its row a mixer spends
elsewhere (a softmax sink or self-weight, a delta rule's recency and removal terms, an SSM's decaying tail into the
query) is that mixer's own scale and cancels; what is compared is only how the row shares out those tokens.  The
first token of the prompt is left out of every mass, even where it belongs to a segment (an MQAR prompt starts with
a key): it is where softmax heads, with or without a BOS token, park attention they do not use (attention sinks),
which would make the first segment look read.  A threshold then reads the same on a 4-head transformer, a 32-head
one, an SSM and a delta rule.

**Where a segment is read.**  A Gather head condenses a segment into one of its tokens, the *read position*
``r``; an Aggregate head later reads the segment there.  ``read`` names it:

* ``"summary"``: the token the task declares as each segment's summary (``Segment.summary``; for the shipped
  tasks the segment's last token, e.g. the ``\\n`` of ``k:v\\n``; a task may declare another, see
  ``PromptSpec.summaries``);
* ``"last"``, ``"last-K"``: the segment's last token, or ``K`` tokens before it (``"last-1"``: the value ``v`` of
  ``k:v\\n``), whatever the task declares as the summary;
* ``"first+K"``: ``K`` tokens after the segment's first token (``K >= 1``), for segments of unequal lengths read
  at a fixed place from their start;
* ``"auto"`` (:func:`choose_read`): the read position, among all of the above that fit the segments, on whose
  token of the correct segment the Aggregate candidates' query rows put the most mass (the token the model itself
  reads), else the one of ``summary``/``last-1``/``last-2`` where a Gather pattern is strongest.

A segment can only be read at a token with at least one of its own tokens before it (a causal model can gather
nothing into a segment's first token); a read position that no segment admits is refused (:func:`check_readable`).

**Gather mass** of a head at read position ``r`` of segment ``[start, end)``: the share of row ``r``'s mass on the
tokens up to it, ``[1, r]`` (the first token left out), that lies on the segment's own earlier tokens
``[start, r)``.  ``gather_uniform`` is the share a uniform row would give them, ``own tokens / r``;
``gather_lift`` = mass / uniform (1 = no preference, the definition of chance).  The read token itself stays in
the denominator: a row that keeps mostly its own token (a fast-decaying SSM row, a self-attending head) is not
gathering.  The previous token counts: in a two-token segment ``k v`` a previous-token head *is* what condenses
the key into the value token.  A previous-token head that gathers nothing the model uses is left out by the causal
test, not by its pattern (``gather_excl_prev@`` reports the mass without that token, for the reader).  A segment
whose only earlier own token is the first token is not counted.

**Aggregate mass** of a head: ``aggregate_on_correct``, the correct segment's share of what the query row gives the
segments (any of their tokens), with ``aggregate_wrong`` the largest share of one wrong segment (per prompt,
averaged), ``aggregate_uniform`` the correct segment's share of the segments' tokens, ``aggregate_lift`` = share /
uniform and ``aggregate_beats_wrong`` the share of prompts whose correct segment gets more of the row than every
wrong one: the correct segment ranked first (chance: 1 / number of segments).  ``aggregate_slot_base`` is the share
the same row gives the correct segment's *slot* (its index among the segments) in the prompts where that slot holds
a wrong segment, averaged over the prompts like ``aggregate_on_correct``; ``aggregate_selectivity`` = on_correct /
slot_base says how much more a segment gets *because it is the correct one*, with its position held fixed (1 = no
preference).  A head fixed on a position (previous-token, recency, a sink) scores 1 whatever its hit rate in a
small prompt sample, while an SSM's smooth Aggregate row, whose decaying tail gives nearby wrong segments a good
share, still scores well above 1.  ``aggregate_slot_first`` is the rank with the position held fixed the same way:
the share of prompts whose correct segment, divided by its slot's base, beats every wrong segment divided by its
own slot's base.  A tie (within ``TIE_RTOL``, relative) with ``k`` wrong segments is a shared first place and
counts ``1 / (k + 1)``, what a random tiebreak gives: a head that gives the segments nothing, or the same at every
slot, scores chance.  A slot that gets nothing when it holds a wrong segment is at its base (1) when it gets nothing
now, and above every finite ratio when it gets something.  ``aggregate_slot_chance`` is what a random ranking
scores, the mean over prompts of 1 / number of segments.  The raw rank ``aggregate_beats_wrong`` asks which segment
a decaying SSM row is nearest to as much as which one it reads: the last segment before the query wins most prompts
whatever is asked.

(Row keys: ``gather@READ``, ``gather_uniform@READ``, ``gather_excl_prev@READ`` per read position; the detector
copies the chosen read's values to ``gather_mass`` and ``gather_lift``.)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from gather_aggregate.core.errors import InputError
from gather_aggregate.core.protocol import HookedModel

READS = ("summary", "last-1", "last-2")

#: a head is a Gather *pattern candidate* when its read rows give their own segment's earlier tokens at least this
#: many times the share a uniform row would (over the tokens up to the read position, the first left out), and at
#: least GATHER_MIN_MASS of that mass: the segment is where the row reads, not one place among many
GATHER_MIN_LIFT = 2.0
GATHER_MIN_MASS = 0.1
#: ... an Aggregate pattern candidate when its query row, each segment's share taken over what its slot gets when it
#: holds a wrong segment, ranks the correct segment first in at least half the prompts (``aggregate_slot_first``)
#: and in at least twice the share a random ranking would (``aggregate_slot_chance``; the second bar only binds
#: below four segments a prompt).  The rank compares the correct segment only with the other segments of the same
#: head's rows, with the position held fixed, so a head fixed on one position (a previous-token head landing on the
#: last segment) ties with its slot's base wherever it reads nothing and scores chance.  The rank is the whole gate:
#: its one setting holds on softmax, SSM and delta-rule rows alike, whatever their scale or decay towards the query.
AGGREGATE_MIN_HIT = 0.5
AGGREGATE_MIN_OVER_CHANCE = 2.0
#: two ratios within this relative distance are a tie (shared first place)
TIE_RTOL = 1e-4
#: not a gate (``aggregate_selectivity`` orders the candidates and is reported): the bar the earlier gate set beside
#: the rank (``tests/planted_matrix.py --selectivity-bar``, ``scripts/aggregate_gate_compare.py``)
AGGREGATE_MIN_SELECTIVITY = 2.0
#: not a gate (``aggregate_lift`` is reported): the bar ``tests/planted_matrix.py --without-selectivity`` sets beside
#: the raw rank in the position control's place, to show what that control is there for
AGGREGATE_MIN_LIFT = 2.0


def parse_read(read: Any) -> tuple[str, int]:
    """``(anchor, offset)`` of a read position's name: ``"summary"`` -> ``("summary", 0)``, ``"last"`` / ``"last-K"``
    -> ``("last", K)``, ``"first+K"`` -> ``("first", K)`` with ``K >= 1``; anything else is an :class:`InputError`."""
    if isinstance(read, str):
        if read == "summary":
            return "summary", 0
        if read == "last":
            return "last", 0
        m = re.fullmatch(r"(last)-(\d+)|(first)\+(\d+)", read)
        if m and m.group(1) and int(m.group(2)) >= 1:
            return "last", int(m.group(2))
        if m and m.group(3) and int(m.group(4)) >= 1:
            return "first", int(m.group(4))
    raise InputError(f"reading must be 'auto', 'summary', 'last', 'last-K' or 'first+K' (K >= 1, e.g. 'last-1'), "
                     f"got {read!r}")


def read_positions(batch: Any, read: str) -> tuple[Tensor, Tensor]:
    """Per segment ``[b, seg]``: the read position for ``read`` and whether that segment can be read there (real
    segment, position inside it, at least one own token before it)."""
    anchor, off = parse_read(read)
    if anchor == "summary":
        r = batch.seg_summary.clone()
    elif anchor == "last":
        r = batch.seg_end - 1 - off
    else:
        r = batch.seg_start + off
    ok = batch.seg_mask & (r > batch.seg_start) & (r < batch.seg_end)
    return torch.where(ok, r, batch.query_pos[:, None]), ok


def candidate_reads(examples: Sequence[Any]) -> list[str]:
    """Every read position ``auto`` weighs, in order of preference on a tie: ``summary``, then ``last``,
    ``last-1``, ... and ``first+1``, ``first+2``, ... up to the longest segment (``last`` only where some segment's
    declared summary is not its last token: otherwise it is ``summary``)."""
    longest = max((len(s) for e in examples for s in e.segments), default=1)
    moved = any(s.summary != s.end - 1 for e in examples for s in e.segments)
    return (["summary"] + (["last"] if moved else []) + [f"last-{k}" for k in range(1, longest)]
            + [f"first+{k}" for k in range(1, longest)])


def check_readable(examples: Sequence[Any], read: str) -> None:
    """Refuse a read position at which no segment of ``examples`` can be read (no own token before it)."""
    anchor, off = parse_read(read)
    for e in examples:
        for s in e.segments:
            r = s.summary if anchor == "summary" else s.end - 1 - off if anchor == "last" else s.start + off
            if s.start < r < s.end:
                return
    if read == "summary":
        raise InputError("reading='summary': no segment has a token of its own before its summary (the summary is "
                         "the segment's first token, or the segment is one token), so nothing can be gathered there "
                         "(the model is causal); declare the summary at the segment's last token (the default) or "
                         "pass reading='auto'")
    raise InputError(f"reading={read!r}: no segment has a token there with one of its own tokens before it; pass "
                     "reading='auto' or a read position inside the segments (e.g. 'last')")


def pattern_evidence(model: HookedModel, examples: Sequence[Any], *, batch_size: int = 16,
                     reads: Sequence[str] = READS, profile: Sequence[str] | None = None) -> dict[str, Any]:
    """Per head (``(layer, head)`` → dict) the masses of the module docstring at every read position in ``reads``,
    plus ``read_profile``: per read position of ``profile`` (default :func:`candidate_reads`), the share of each head's
    query-row content mass on that token of the correct segment, averaged over the prompts (0 where the correct segment cannot be
    read there): how :func:`choose_read` finds where the model reads."""
    from gather_aggregate.core.protocol import pad_id_of
    from gather_aggregate.tasks.base import collate

    examples = list(examples)
    if not examples:
        raise InputError("no examples: build the task with n >= 1")
    if not any(e.correct >= 0 and len(e.segments) >= 2 for e in examples):
        raise InputError("no example has a correct segment among two or more segments; Gather/Aggregate detection "
                         "compares the correct segment with the others: give each prompt two or more segments "
                         "(KV-retrieval, multiple choice) and its correct one, not a plain query")
    for read in reads:
        parse_read(read)
    profile = list(profile) if profile is not None else candidate_reads(examples)
    sums: dict[tuple[int, str], Tensor] = {}
    counts: dict[str, float] = {}
    slots: dict[int, list[tuple[Tensor, Tensor, Tensor]]] = {}  # layer -> per batch (on_seg, correct, wrong mask)
    for i in range(0, len(examples), batch_size):
        chunk = examples[i:i + batch_size]
        batch = collate(chunk, pad_id_of(model.tokenizer), device=model.device)
        n_seg = batch.seg_start.shape[1]
        key = torch.arange(batch.tokens.shape[1], device=batch.tokens.device)
        in_seg = (key[None, None] >= batch.seg_start[..., None]) & (key[None, None] < batch.seg_end[..., None])
        has = (batch.correct >= 0) & (batch.seg_mask.sum(1) >= 2)
        corr = batch.correct.clamp_min(0)
        other = batch.seg_mask & (torch.arange(n_seg, device=key.device)[None] != corr[:, None])
        seg_len = (batch.seg_end - batch.seg_start).float()
        seg_tok = in_seg.any(1)  # [b, key]: the content tokens (any segment's)
        # the first token is left out of every mass (module docstring: where softmax heads park what they do not use)
        seg_tok = seg_tok & (key[None] > 0)
        in_seg = in_seg & (key[None, None] > 0)
        seg_len_all = seg_tok.float().sum(-1)  # [b]
        uni_corr = seg_len.gather(1, corr[:, None])[:, 0] / seg_len_all.clamp_min(1)
        read_rows, read_ok, own, content = [], [], [], []
        for read in reads:
            r, ok = read_positions(batch, read)
            own_j = in_seg & (key[None, None] < r[..., None])
            ok = ok & own_j.any(-1)
            read_rows.append(r)
            read_ok.append(ok)
            own.append(own_j)
            content.append((key[None, None] >= 1) & (key[None, None] <= r[..., None]))  # [b, seg, key]: [1, r]
            counts[f"g:{read}"] = counts.get(f"g:{read}", 0.0) + float(ok.sum())
        counts["a"] = counts.get("a", 0.0) + float(has.sum())
        rows = torch.cat([*read_rows, batch.query_pos[:, None]], 1)
        for info in model.layers:
            with torch.no_grad():
                p = model.pattern(batch.tokens, info.index, rows=rows, normalize=True).float()  # [b, h, rows, key]
            H = p.shape[1]
            acc: dict[str, Tensor] = {}
            for j, read in enumerate(reads):
                seg_rows = p[:, :, j * n_seg:(j + 1) * n_seg]  # [b, h, seg, key]
                okf = read_ok[j][:, None].float()
                cont = content[j][:, None].float()
                total = (seg_rows * cont).sum(-1)  # the read row's mass on the tokens up to it, the first left out
                inv = torch.where(total > 0, 1 / total.clamp_min(1e-30), torch.zeros(()))
                mass = (seg_rows * own[j][:, None].float()).sum(-1) * inv
                r = read_rows[j]
                prev = seg_rows.gather(3, (r - 1).clamp_min(0)[:, None, :, None].expand(-1, H, -1, 1))[..., 0] * inv
                n_cont = content[j].float().sum(-1)  # [b, seg]: r
                uni = (own[j].float().sum(-1) / n_cont.clamp_min(1))[:, None].expand_as(mass)
                acc[f"gather@{read}"] = (mass * okf).sum((0, 2))
                acc[f"gather_excl_prev@{read}"] = ((mass - prev) * okf).sum((0, 2))
                acc[f"gather_uniform@{read}"] = (uni * okf).sum((0, 2))
            q_row = p[:, :, -1]  # [b, h, key]
            raw_seg = (q_row[:, :, None, :] * in_seg[:, None].float()).sum(-1)  # [b, h, seg]
            seg_total = (q_row * seg_tok[:, None].float()).sum(-1, keepdim=True)  # [b, h, 1]
            q_inv = torch.where(seg_total > 0, 1 / seg_total.clamp_min(1e-30), torch.zeros(()))
            on_seg = raw_seg * q_inv  # each segment's share of the row's mass on the segments
            on_corr = on_seg.gather(2, corr[:, None, None].expand(-1, H, 1))[..., 0]
            wrong = on_seg.masked_fill(~other[:, None], -1.0).max(-1).values.clamp_min(0)
            hasf = has[:, None].float()
            slots.setdefault(info.index, []).append((on_seg[has].cpu(), corr[has].cpu(), other[has].cpu()))
            acc["aggregate"] = (on_corr * hasf).sum(0)
            acc["aggregate_wrong"] = (wrong * hasf).sum(0)
            acc["aggregate_uniform"] = (uni_corr[:, None].expand(-1, H) * hasf).sum(0)
            acc["aggregate_hit"] = ((on_corr > wrong).float() * hasf).sum(0)
            for read in profile:  # the query row's share on the correct segment's token at each read position
                r, ok = read_positions(batch, read)
                pos, valid = r.gather(1, corr[:, None]), (ok.gather(1, corr[:, None])[:, 0] & has).float()
                m = q_row.gather(2, pos[:, None].expand(-1, H, 1))[..., 0] * q_inv[..., 0]
                acc[f"profile:{read}"] = (m * valid[:, None]).sum(0)
            for name, v in acc.items():
                sums[(info.index, name)] = sums.get((info.index, name), 0) + v
    sums = {k: v.cpu() for k, v in sums.items()}  # one copy per sum, not a GPU sync per head below
    slot_stats = {layer: _slot_stats(data) for layer, data in slots.items()}
    out: dict[tuple[int, int], dict[str, Any]] = {}
    for info in model.layers:
        for h in range(info.n_heads):
            row: dict[str, Any] = {"layer": info.index, "head": h, "kind": info.kind_of(h)}
            for read in reads:
                n = counts[f"g:{read}"]
                m = float(sums[(info.index, f"gather@{read}")][h]) / n if n else float("nan")
                u = float(sums[(info.index, f"gather_uniform@{read}")][h]) / n if n else float("nan")
                row[f"gather@{read}"], row[f"gather_uniform@{read}"] = m, u
                row[f"gather_excl_prev@{read}"] = (float(sums[(info.index, f"gather_excl_prev@{read}")][h]) / n
                                                   if n else float("nan"))
            n = counts["a"]
            for name, col in (("aggregate", "aggregate_on_correct"), ("aggregate_wrong", "aggregate_wrong"),
                              ("aggregate_uniform", "aggregate_uniform"), ("aggregate_hit", "aggregate_beats_wrong")):
                row[col] = float(sums[(info.index, name)][h]) / n
            row["aggregate_lift"] = row["aggregate_on_correct"] / max(row["aggregate_uniform"], 1e-12)
            base, first, chance = slot_stats[info.index]
            row["aggregate_slot_base"], row["aggregate_slot_first"] = float(base[h]), float(first[h])
            row["aggregate_slot_chance"] = chance
            row["aggregate_selectivity"] = row["aggregate_on_correct"] / max(row["aggregate_slot_base"], 1e-12)
            row["read_profile"] = {read: float(sums[(info.index, f"profile:{read}")][h]) / n for read in profile}
            out[(info.index, h)] = row
    return {"heads": out, "reads": list(reads)}


def _slot_stats(data: list[tuple[Tensor, Tensor, Tensor]]) -> tuple[Tensor, Tensor, float]:
    """Per head ``[h]``: the mean over prompts of what the query row gives the correct segment's slot in the
    prompts where that slot holds a wrong segment (``aggregate_slot_base``), and the share of prompts whose correct
    segment over its slot's base beats every wrong one over its own (``aggregate_slot_first``, a tie with ``k`` wrong
    segments counting ``1 / (k + 1)``); and, one number, what a random ranking scores (``aggregate_slot_chance``,
    the mean over prompts of 1 / segments).  ``data`` holds per
    batch the query row's mass per segment ``[b, h, seg]``, the correct index ``[b]`` and the wrong-segment mask
    ``[b, seg]``.  A prompt whose correct slot is never wrong elsewhere (a one-prompt sample) falls back to that
    prompt's own mean wrong segment, as base of every slot."""
    on, corr, wrong = _stack_slots(data)
    if on.shape[0] == 0:
        return torch.zeros(on.shape[1]), torch.zeros(on.shape[1]), 1.0
    slot_b = _slot_bases(on, wrong)
    at_corr = corr[:, None, None].expand(-1, on.shape[1], 1)
    base = slot_b.gather(2, at_corr)[..., 0]  # [B, h]: the correct slot's base
    # each segment's share over its slot's base: the rank with the position held fixed
    # a slot that gets nothing when wrong and nothing now is at its base (1), one read only now is above any
    norm = torch.where(slot_b > 0, on / slot_b.clamp_min(1e-30),
                       torch.where(on > 0, torch.full((), float("inf")), torch.ones(())))
    c = norm.gather(2, at_corr)  # [B, h, 1]
    is_w = wrong[:, None].bool().expand_as(norm)
    tol = TIE_RTOL * torch.maximum(norm.abs(), c.abs()).nan_to_num(posinf=0.0)
    above = is_w & (norm > c + tol)
    tied = is_w & ~above & (norm >= c - tol)  # at an infinite c the tolerance is 0: only infinite ratios tie
    # a tie with k wrong segments is a shared first place: 1 / (k + 1) of a hit, what a random tiebreak gives
    first = torch.where(above.any(-1), torch.zeros(()), 1.0 / (1.0 + tied.sum(-1).float()))
    chance = (1.0 / (1.0 + wrong.sum(-1))).mean()
    return base.mean(0), first.mean(0), float(chance)


def _stack_slots(data: list[tuple[Tensor, Tensor, Tensor]]) -> tuple[Tensor, Tensor, Tensor]:
    """``_slot_stats``' batches as one: the mass per segment ``[B, h, seg]``, the correct index ``[B]`` and the
    wrong-segment mask ``[B, seg]`` (as floats), padded to the most segments of any batch."""
    n_seg = max(m.shape[-1] for m, _, _ in data)
    on = torch.cat([torch.nn.functional.pad(m, (0, n_seg - m.shape[-1])) for m, _, _ in data])
    corr = torch.cat([c for _, c, _ in data])
    wrong = torch.cat([torch.nn.functional.pad(w, (0, n_seg - w.shape[-1])) for _, _, w in data]).float()
    return on, corr, wrong


def _slot_bases(on: Tensor, wrong: Tensor) -> Tensor:
    """``[B, h, seg]``: each slot's base, what the row gives it over the prompts where it holds a wrong segment (a
    slot never wrong: the prompt's own mean wrong segment)."""
    per_slot = (on * wrong[:, None]).sum(0) / wrong.sum(0).clamp_min(1)  # [h, seg]
    seen = wrong.sum(0) > 0  # [seg]
    own_mean = (on * wrong[:, None]).sum(-1) / wrong.sum(-1, keepdim=True).clamp_min(1)  # [B, h]
    return torch.where(seen[None, None], per_slot[None], own_mean[..., None])


def is_aggregate_candidate(row: dict[str, Any]) -> bool:
    """Aggregate pattern candidate (thresholds: module constants, meaning in the module docstring)."""
    return (row["aggregate_slot_first"] >= AGGREGATE_MIN_HIT
            and row["aggregate_slot_first"] >= AGGREGATE_MIN_OVER_CHANCE * row["aggregate_slot_chance"])


def gather_values(row: dict[str, Any], read: str) -> tuple[float, float]:
    """(mass, lift) of a head's Gather pattern at ``read``."""
    m, u = row[f"gather@{read}"], row[f"gather_uniform@{read}"]
    return m, (m / u if u and u == u and u > 0 else 0.0)


def is_gather_candidate(row: dict[str, Any], read: str) -> bool:
    m, lift = gather_values(row, read)
    return m == m and m >= GATHER_MIN_MASS and lift >= GATHER_MIN_LIFT


def choose_read(heads: dict[tuple[int, int], dict[str, Any]], reads: Sequence[str]) -> tuple[str, str]:
    """``(read, why)`` for ``read="auto"``: the read position (of the heads' ``read_profile``:
    :func:`candidate_reads`) on whose token of the correct segment the Aggregate pattern candidates' query rows put
    the most mass, the first in ``read_profile``'s order on a tie (``summary`` before ``last-K`` before
    ``first+K``); else (no Aggregate candidate, or no mass on any such token) the one of ``reads`` whose strongest
    Gather pattern (by lift) is strongest."""
    aggs = [r for r in heads.values() if is_aggregate_candidate(r)]
    if aggs:
        prof = {rd: sum(r["read_profile"][rd] for r in aggs) for rd in aggs[0]["read_profile"]}
        best = None
        for rd, v in prof.items():  # strictly more (beyond float noise) to displace an earlier, preferred read
            if best is None or v > prof[best] + 1e-9:
                best = rd
        if best is not None and prof[best] > 0:
            return best, (f"the Aggregate candidates' query rows weigh the correct segment's {best} token most "
                          f"({prof[best]:.2f} summed over {len(aggs)} heads)")
    best = max(reads, key=lambda rd: max(gather_values(r, rd)[1] for r in heads.values()))
    return best, "no Aggregate candidate points at a token; the read position with the strongest Gather lift"
