"""The Gather/Aggregate decision rule: one setting for every model, every threshold a stated meaning.

For each role (Gather, Aggregate):

1. **Pattern candidates** (:mod:`gather_aggregate.detect.pattern_evidence`): heads whose pattern shows the role in
   scale-free terms, ratios within each row over the tokens the role chooses among (the first token, a sink, left
   out), so that what a mixer puts elsewhere (a softmax sink, a delta rule's signed removal terms, an SSM's tail)
   does not count.  A Gather head's read rows give their own segment's earlier tokens at least twice the share a
   uniform row would, and at least 0.1, of their mass on the tokens up to the read position; an Aggregate head's
   query row, read over the segments' tokens only and each segment's share taken over what its slot gets when it
   holds a wrong segment, ranks the correct segment first in at least half the prompts and in at least twice the
   share a random ranking would (chance 1 / segments; ties shared): with the position held fixed, so that an SSM
   row's decay towards the query does not decide, and a rank, so that a mixer's scale does not.  At most
   ``max_candidates`` per role, strongest first (by Gather lift, by Aggregate selectivity, the correct segment's
   share over its slot's base: the only use of ranking).
2. **A group, by peeling** (:func:`gather_aggregate.detect.causal_evidence.peel`): all candidates are zero-ablated together
   where the role acts (Gather: the segments' tokens; Aggregate: the query position) and heads are dropped one at
   a time while some head, restored alone, gives back less than ``KEEP_MIN`` (0.05) of the retrieval margin, in
   both of two contexts: the rest of the group ablated, and the rest of its layer's part of the group ablated
   (the other layers clean).  A lone head, redundant heads and two stages in series (each a bottleneck only while
   the other works) come out of the same rule.
3. **Named or not**: the group is named when its loss beats the median of ``N_RANDOM`` random head sets of the
   same size and kinds (ablated at the same positions) by at least ``NAME_MIN`` (0.25) of the retrieval margin:
   removing it takes away a quarter of what the model retrieves above chance more than removing as many ordinary
   heads does.  The sets are drawn from the heads outside the group where those are at least twice as many (per
   kind), so that the draws differ; else from the whole model, the group included
   (:func:`gather_aggregate.detect.causal_evidence.random_sets`): a group that fills one layer of a two-layer model
   is compared with random halves of the model, not with the other layer alone.  Heads that alone cost
   ``NAME_MIN`` where the role acts are left out of the random draws (they are reported): a head that moves the
   query key is not an ordinary head.

**A short convolution as the Gather** (:mod:`gather_aggregate.detect.conv_gather`): in every SSM layer with a short
conv, the conv's lagged taps are removed (only its current-token tap kept) at the segments' read positions, and,
for a conv whose work there has a backup, at every segment token but the read positions.  Each is compared with
the same at another token of each segment; the layer's conv is named (``gather_conv``) when removing it at the read
positions costs ``NAME_MIN`` more than at other tokens (necessity), or when keeping it only at the read positions
gives back ``NAME_MIN`` of what removing it at every segment token costs, and ``NAME_MIN`` more than keeping it
only at other tokens does (sufficiency).

Then **pairs**: a Gather head and a later Aggregate head are paired when path patching
(:func:`gather_aggregate.detect.causal_evidence.path_losses`) shows that restoring only the path from the one into the
other's keys and values gives back at least ``PAIR_MIN`` (0.1) of the margin, in either of the same two contexts
per side (every sender or receiver, or those of the pair's layers only).

A model whose clean retrieval is within ``MIN_MARGIN`` (0.1 nats) of chance has nothing to detect: the rule names
nothing and says so.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from gather_aggregate.core.errors import GAWarning, InputError, warn
from gather_aggregate.core.protocol import Head, HookedModel
from gather_aggregate.detect.causal_evidence import (
    KEEP_MIN,
    N_RANDOM,
    RANDOM_SOURCES,
    Prober,
    path_losses,
    peel,
    random_losses,
)
from gather_aggregate.detect.conv_gather import conv_gather
from gather_aggregate.detect.pattern_evidence import (
    READS,
    check_readable,
    choose_read,
    gather_values,
    is_aggregate_candidate,
    is_gather_candidate,
    parse_read,
    pattern_evidence,
)

NAME_MIN = 0.25
PAIR_MIN = 0.1
MIN_MARGIN = 0.1
WHERE = {"gather": "segments", "aggregate": "query"}


def decide(model: HookedModel, examples: Sequence[Any], *, read: str = "auto", max_candidates: int = 64, seed: int = 0,
           batch_size: int = 64) -> dict[str, Any]:
    """Run the whole rule; returns ``heads`` (one explained row per head), ``gather``/``aggregate`` (named heads,
    group order), ``pairs``, ``read`` (+ ``read_why``), ``groups`` (per role: candidates, group, loss, random
    losses, verdict) and the prober's ``clean``/``chance``/``margin``."""
    examples = list(examples)
    if read != "auto":
        parse_read(read)
        check_readable(examples, read)
    warn_gaps(examples)
    ev = pattern_evidence(model, examples, reads=READS)
    heads: dict[Head, dict[str, Any]] = ev["heads"]
    if read == "auto":
        read_used, why = choose_read(heads, READS)
    else:
        read_used, why = read, "given"
    if read_used not in READS:  # a read position outside the usual three: its Gather masses, one more pass
        extra = pattern_evidence(model, examples, reads=[read_used], profile=[])["heads"]
        for hd, r in heads.items():
            r.update({k: v for k, v in extra[hd].items() if k.startswith("gather")})
    try:
        check_readable(examples, read_used)
    except InputError:
        warn(GAWarning(
            f"no segment can be read at {read_used!r} (each segment is one token, or has no token before that "
            "position), so no Gather head can be looked for; annotate segments of two or more tokens (e.g. the "
            "whole 'key: value' line) to find Gather heads"))
    prober = Prober(model, examples, batch_size=batch_size)
    kinds = {hd: r["kind"] for hd, r in heads.items()}
    for r in heads.values():
        r["gather_mass"], r["gather_lift"] = gather_values(r, read_used)
        r["gather_candidate"] = is_gather_candidate(r, read_used)
        r["aggregate_candidate"] = is_aggregate_candidate(r)
    result: dict[str, Any] = {"read": read_used, "read_why": why, "clean": prober.clean, "chance": prober.chance,
                              "margin": prober.margin, "gather": [], "aggregate": [], "pairs": [], "groups": {},
                              "conv": [], "gather_conv": [],
                              "pair_loss": {}, "thresholds": {"keep_min": KEEP_MIN, "name_min": NAME_MIN,
                                                              "pair_min": PAIR_MIN, "n_random": N_RANDOM,
                                                              "min_margin": MIN_MARGIN}}
    for r in heads.values():  # every row has every column, also when nothing is tested
        for role in WHERE:
            for col in ("alone", "give_back", "group_loss", "random_median"):
                r.setdefault(f"{role}_{col}", float("nan"))
    if prober.margin < MIN_MARGIN:
        for r in heads.values():
            r["role"], r["rule"] = "", (f"not named: the model retrieves within {MIN_MARGIN} nats of chance "
                                        f"(margin {prober.margin:.3f}); nothing to detect")
        result["heads"] = list(heads.values())
        result["note"] = "no retrieval above chance"
        return result
    cands = {
        "gather": sorted((hd for hd, r in heads.items() if r["gather_candidate"]),
                         key=lambda hd: -heads[hd]["gather_lift"])[:max_candidates],
        "aggregate": sorted((hd for hd, r in heads.items() if r["aggregate_candidate"]),
                            key=lambda hd: -heads[hd]["aggregate_selectivity"])[:max_candidates],
    }
    groups: dict[str, dict[str, Any]] = {}
    for role, where in WHERE.items():
        for r, alone in zip(heads.values(), prober.losses([([hd], where) for hd in heads])):
            r[f"{role}_alone"] = alone
        group, loss, give, steps = peel(prober, cands[role], where)
        groups[role] = {"where": where, "candidates": [list(h) for h in cands[role]], "group": group, "loss": loss,
                        "give_back": give, "steps": steps}
        for hd in heads:
            heads[hd][f"{role}_give_back"] = give.get(hd, float("nan"))
    for role, g in groups.items():
        # the random pool: heads outside the group that do not cost NAME_MIN alone where the role acts (a big head
        # that moves the query key would make any set that draws it look important)
        big = [hd for hd in heads if hd not in g["group"] and heads[hd][f"{role}_alone"] >= NAME_MIN]
        g["excluded_from_random"] = [list(h) for h in big]
        pool = [hd for hd in heads if hd not in g["group"] and hd not in big]
        rand, source = random_losses(prober, g["group"], g["where"], pool, kinds, seed=seed)
        med = statistics.median(rand) if rand else 0.0
        g["random"], g["random_from"] = rand, source
        g["random_kinds_matched"] = source.endswith("kinds matched")
        g["random_median"] = med
        g["named"] = bool(g["group"]) and bool(rand) and g["loss"] - med >= NAME_MIN
        if g["group"] and not rand:
            g["why"] = "no other head to draw a random baseline from"
        elif g["group"]:
            drawn = "" if source == RANDOM_SOURCES[0] else f", sets drawn from {source}"
            g["why"] = (f"group loss {g['loss']:.2f} vs random median {med:.2f} "
                        f"({'>=' if g['named'] else '<'} {NAME_MIN} above{drawn})")
        else:
            g["why"] = "no candidate survives peeling" if cands[role] else "no pattern candidate"
        result[role] = list(g["group"]) if g["named"] else []
    result["conv"] = conv_gather(model, prober, read_used, NAME_MIN, seed=seed)
    result["gather_conv"] = [c["layer"] for c in result["conv"] if c["named"]]
    full, pair_give = path_losses(prober, result["gather"], result["aggregate"])
    result["pair_loss"] = {"routed": full, "pairs": {f"{g}->{a}": v for (g, a), v in pair_give.items()}}
    result["pairs"] = [(g, a) for (g, a), v in pair_give.items() if v >= PAIR_MIN]
    for hd, r in heads.items():
        _explain(r, hd, groups, result)
    result["heads"] = list(heads.values())
    result["groups"] = {role: {**{k: v for k, v in g.items() if k not in ("give_back", "group")},
                               "group": [list(h) for h in g["group"]]} for role, g in groups.items()}
    result["n_forwards"], result["n_passes"] = prober.n_forwards, prober.n_passes
    return result


def warn_gaps(examples: Sequence[Any]) -> None:
    """Warn (:class:`GAWarning`) when an example's segments leave tokens between them (a line's ``\\n`` outside
    its segment): Gather heads are ablated, and Aggregate heads credited, only on the segments' own tokens, so a
    head that writes or reads there is missed."""
    for i, e in enumerate(examples):
        segs = sorted(e.segments, key=lambda sg: sg.start)
        gaps = [(a.label, b.start - a.end) for a, b in zip(segs, segs[1:]) if b.start > a.end]
        if gaps:
            warn(GAWarning(
                f"example {i}: its segments leave {sum(n for _, n in gaps)} token(s) between them (first after "
                f"segment {gaps[0][0]!r}); Gather heads are ablated and Aggregate heads credited only on the "
                "segments' own tokens, so a head that writes or reads there is missed: let each segment cover "
                "its separator (e.g. a line's '\\n')"))
            return


def _explain(row: dict[str, Any], hd: Head, groups: dict[str, dict[str, Any]], result: dict[str, Any]) -> None:
    """The head's role and the rule that named it or left it out, in words."""
    roles, why = [], []
    for role in ("gather", "aggregate"):
        g = groups[role]
        row[f"{role}_group_loss"] = g["loss"] if hd in g["group"] else float("nan")
        row[f"{role}_random_median"] = g.get("random_median", float("nan"))
        if not row[f"{role}_candidate"]:
            continue
        if hd in result[role]:
            roles.append(role)
            why.append(f"{role}: in a group of {len(g['group'])} whose loss {g['loss']:.2f} beats random sets' "
                       f"median {g['random_median']:.2f} by >= {NAME_MIN}; restoring it gives back "
                       f"{row[f'{role}_give_back']:.2f} (>= {KEEP_MIN})")
        elif hd in g["group"]:
            why.append(f"{role} candidate, not named: {g['why']}")
        else:
            why.append(f"{role} candidate, peeled: restored alone it gave back at most {row[f'{role}_give_back']:.2f} "
                       f"< {KEEP_MIN} of the margin (against its group and its layer's part of it)")
    row["role"] = "+".join(roles)
    row["rule"] = "; ".join(why) if why else "no Gather or Aggregate pattern (not a candidate)"
