"""Gather / Aggregate scores from patterns and a task's segment annotations.

For every head, on the per-row normalised ``|pattern|`` (softmax rows as they
are; SSM-implied attention normalised, see :mod:`gather_aggregate.core.sharpness`):

* **gather**: from each segment's summary token (its last token, e.g. the
  ``\\n`` of ``B. Access Point\\n``), the mass on the segment's tokens
  ``[start, summary - 1)``, averaged over segments and examples.  A Gather head
  condenses its segment (its label or key, at the start) into the summary
  token.  The token right before the summary is left out, because every
  previous-token head puts all its mass there; ``gather_incl_prev`` keeps it.
* **aggregate**: from the query position, the mass on the correct segment's
  summary token minus the mean mass on the other segments' summary tokens.
  An Aggregate head reads the right segment's summary.
* **aggregate_segment**: the same contrast with the mass on *any* token of each
  segment.  A head that reads the correct segment's content token rather than
  its summary scores here but not on ``aggregate``; the difference is part of
  the science (the trial models in ``docs/results.md`` show such heads).
* **aggregate_hit**: how often the correct segment's summary gets strictly more
  mass than every other summary;  **aggregate_mass**: the mass on it.
* **gather_segment** (``gather_any=True``; needs every row of the pattern): the
  Gather score read from the segment's best token instead of its last one: for
  each segment, the largest mass any of its tokens ``t`` puts on the segment's
  own tokens ``[start, t - 1)``.  A head that condenses a line ``k:v\n`` into the
  value token ``v`` (the ``llama-kv`` transformer's KV Gather head) scores here
  but not on ``gather``.

No position is hard-coded: everything comes from ``Example.segments``,
``Example.correct`` and ``Example.query_pos``.  :func:`find_ga_heads` then
combines these scores with an ablation scan to name candidate Gather and
Aggregate heads and G→A pairs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from gather_aggregate.core.arguments import check_model, count
from gather_aggregate.core.errors import InputError, ProvenanceError
from gather_aggregate.core.indices import as_index, is_index
from gather_aggregate.core.model_state import analysis
from gather_aggregate.core.protocol import Head, HookedModel


def _batches(examples: Sequence[Any], size: int) -> list[list[Any]]:
    return [list(examples[i:i + size]) for i in range(0, len(examples), size)]


@analysis
def pattern_scores(model: HookedModel, examples: Sequence[Any], layers: int | Sequence[int] | None = None, *,
                   batch_size: int = 16, gather_any: bool = False, **pattern_kwargs: Any) -> list[dict[str, Any]]:
    """Gather and Aggregate scores of every head of ``layers`` (default all), one row per head.

    ``gather_any=True`` adds ``gather_segment`` (see the module docstring); it computes every row of each
    pattern, so it costs ``batch x heads x pos²`` memory per layer.
    """
    from gather_aggregate.core.protocol import pad_id_of
    from gather_aggregate.tasks.base import collate

    examples = list(examples)
    if not examples:
        raise InputError("no examples: build the task with n >= 1")
    if not any(e.segments for e in examples):
        raise InputError("the examples have no segments; Gather/Aggregate scores need a task with segments "
                         "(KV-retrieval, multiple choice), not a plain knowledge query")
    if isinstance(layers, int) or is_index(layers):  # one layer: was "'int' object is not iterable"
        layers = [as_index(layers, "layer")]
    layers = [model.check_layer(la).index for la in (layers if layers is not None else range(model.n_layers))]
    sums: dict[tuple[int, str], Tensor] = {}
    counts: dict[str, float] = {"gather": 0.0, "aggregate": 0.0}
    for chunk in _batches(examples, batch_size):
        batch = collate(chunk, pad_id_of(model.tokenizer), device=model.device)
        b, n_seg = batch.seg_summary.shape
        # rows: every segment's summary, then the query position (padding rows repeat the query)
        rows = torch.cat([torch.where(batch.seg_mask, batch.seg_summary, batch.query_pos[:, None]),
                          batch.query_pos[:, None]], dim=1)
        key = torch.arange(batch.tokens.shape[1], device=rows.device)
        in_seg = (key[None, None] >= batch.seg_start[..., None]) & (key[None, None] < batch.seg_end[..., None])
        own_all = in_seg & (key[None, None] < batch.seg_summary[..., None])  # own tokens before the summary
        own = in_seg & (key[None, None] < batch.seg_summary[..., None] - 1)  # ... minus the previous token
        gather_valid = batch.seg_mask & own.any(-1)  # segments of >= 3 tokens
        has_correct = batch.correct >= 0
        other = batch.seg_mask & (torch.arange(n_seg, device=rows.device)[None] != batch.correct[:, None])
        counts["gather"] += float(gather_valid.sum())
        counts["aggregate"] += float(has_correct.sum())
        for layer in layers:
            with torch.no_grad():
                p = model.pattern(batch.tokens, layer, rows=rows, normalize=True, **pattern_kwargs).float()
            seg_rows, q_row = p[:, :, :n_seg], p[:, :, n_seg]  # [b,h,seg,key], [b,h,key]
            valid = gather_valid[:, None].float()
            g = ((seg_rows * own[:, None].float()).sum(-1) * valid).sum((0, 2))  # [h]
            g_all = ((seg_rows * own_all[:, None].float()).sum(-1) * valid).sum((0, 2))
            summ = torch.where(batch.seg_mask, batch.seg_summary, 0)
            on_summary = q_row.gather(2, summ[:, None].expand(-1, p.shape[1], -1))  # [b, h, seg]
            on_segment = (q_row[:, :, None, :] * in_seg[:, None].float()).sum(-1)  # [b, h, seg]
            agg = _contrast(on_summary, batch.correct, other, has_correct)
            agg_seg = _contrast(on_segment, batch.correct, other, has_correct)
            on_correct = on_summary.gather(2, batch.correct.clamp_min(0)[:, None, None]
                                           .expand(-1, p.shape[1], 1))[..., 0]  # [b, h]
            best_other = on_summary.masked_fill(~other[:, None], -1.0).max(-1).values
            hit = ((on_correct > best_other) & has_correct[:, None]).float().sum(0)
            correct_mass = (on_correct * has_correct[:, None]).sum(0)
            scores = [("gather", g), ("gather_incl_prev", g_all), ("aggregate", agg),
                      ("aggregate_segment", agg_seg), ("aggregate_hit", hit), ("aggregate_mass", correct_mass)]
            if gather_any:
                with torch.no_grad():
                    full = model.pattern(batch.tokens, layer, normalize=True, **pattern_kwargs).float()
                scores.append(("gather_segment", _best_token_gather(full, batch.seg_start, batch.seg_end,
                                                                     gather_valid)))
            for name, val in scores:
                sums[(layer, name)] = sums.get((layer, name), 0) + val
    sums = {k: v.cpu() for k, v in sums.items()}  # one copy per sum, not a GPU sync per head below
    rows_out = []
    for layer in layers:
        info = model.layers[layer]
        for h in range(info.n_heads):
            row: dict[str, Any] = {"layer": layer, "head": h, "kind": info.kind_of(h)}
            names = ["gather", "gather_incl_prev", "aggregate", "aggregate_segment", "aggregate_hit",
                     "aggregate_mass"] + (["gather_segment"] if gather_any else [])
            for name in names:
                denom = counts["gather" if name.startswith("gather") else "aggregate"]
                row[name] = float(sums[(layer, name)][h]) / denom if denom else float("nan")
            rows_out.append(row)
    return rows_out


def _best_token_gather(p: Tensor, start: Tensor, end: Tensor, valid: Tensor) -> Tensor:
    """Per head: Σ over valid segments of max_t (mass from token t onto the segment's tokens [start, t - 1)).

    ``p`` is the full pattern ``[batch, head, query, key]``; ``t`` runs over ``[start + 2, end)``.
    """
    total = torch.zeros(p.shape[1], device=p.device)
    csum = p.cumsum(-1)  # csum[..., q, k] = mass of row q on keys 0..k
    starts, ends = start.tolist(), end.tolist()  # once, not a GPU sync per segment
    for b, s in valid.nonzero().tolist():
        lo, hi = int(starts[b][s]), int(ends[b][s])
        t = torch.arange(lo + 2, hi, device=p.device)
        if len(t) == 0:
            continue
        rows = csum[b, :, t]  # [head, n_t, key]
        mass = rows.gather(2, (t - 2)[None, :, None].expand(rows.shape[0], -1, 1))[..., 0]
        if lo > 0:
            mass = mass - rows[:, :, lo - 1]
        total += mass.max(-1).values
    return total


def _contrast(mass: Tensor, correct: Tensor, other: Tensor, has_correct: Tensor) -> Tensor:
    """Per head: Σ_examples [mass on correct segment - mean mass on the other segments]."""
    on_correct = mass.gather(2, correct.clamp_min(0)[:, None, None].expand(-1, mass.shape[1], 1))[..., 0]
    n_other = other.sum(-1).clamp_min(1).float()
    on_other = (mass * other[:, None].float()).sum(-1) / n_other[:, None]
    return ((on_correct - on_other) * has_correct[:, None].float()).sum(0)


#: the per-head numbers behind each decision (JSON ``decisions``, CSV columns, the report's detector table)
DECISION_COLUMNS = ("layer", "head", "kind", "role", "gather_mass", "gather_lift", "aggregate_on_correct",
                    "aggregate_wrong", "aggregate_slot_base", "aggregate_selectivity", "aggregate_lift",
                    "aggregate_beats_wrong", "aggregate_slot_first", "aggregate_slot_chance", "gather_alone",
                    "aggregate_alone", "gather_give_back", "aggregate_give_back", "gather_random_median",
                    "aggregate_random_median", "rule")


@dataclass
class GAHeads:
    """Named Gather and Aggregate heads and G→A pairs, with the evidence for each (:mod:`gather_aggregate.detect.rules`).

    ``reading`` says where segments were read (``reading["gather"]``: ``summary``, ``last``, ``last-K`` or
    ``first+K`` (:mod:`gather_aggregate.detect.pattern_evidence`), the read position the Gather masses were taken at;
    ``reading["aggregate"]``: always ``segment``, the query row's mass on the whole correct segment) and ``read_why`` why; ``evidence`` per named head is ``"alone"`` (its role's group
    is that one head) or ``"joint"`` (one of a group that is named together); ``joint_drop`` holds each role's group
    loss as a share of the retrieval margin (1 = retrieval taken to chance); ``groups`` the whole record per role
    (candidates, peeling steps, random-set losses, verdict); ``pair_loss`` the path-patching numbers.  ``table`` has
    one row per head with its pattern masses, its losses alone and in its group, the random baseline and ``rule``:
    the sentence that named it or left it out.  ``gather_conv`` lists the SSM layers whose short convolution is
    itself a Gather (:mod:`gather_aggregate.detect.conv_gather`: no head, so it is not in ``gather`` and has no pairs),
    ``conv`` the test's record per layer with a short conv.
    """

    table: list[dict[str, Any]]
    gather: list[Head] = field(default_factory=list)
    aggregate: list[Head] = field(default_factory=list)
    pairs: list[tuple[Head, Head]] = field(default_factory=list)
    reading: dict[str, str] = field(default_factory=dict)
    evidence: dict[Head, str] = field(default_factory=dict)
    joint_drop: dict[str, float] = field(default_factory=dict)
    groups: dict[str, Any] = field(default_factory=dict)
    pair_loss: dict[str, Any] = field(default_factory=dict)
    margin: dict[str, float] = field(default_factory=dict)
    read_why: str = ""
    gather_conv: list[int] = field(default_factory=list)
    conv: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """The named heads and the evidence, JSON-ready."""
        return {"gather": [list(h) for h in self.gather], "aggregate": [list(h) for h in self.aggregate],
                "pairs": [[list(g), list(a)] for g, a in self.pairs], "reading": dict(self.reading),
                "read_why": self.read_why,
                "evidence": [[*hd, why] for hd, why in self.evidence.items()], "joint_drop": dict(self.joint_drop),
                "groups": self.groups, "pair_loss": self.pair_loss, "margin": dict(self.margin),
                "gather_conv": list(self.gather_conv), "conv": self.conv,
                "decisions": [{k: r.get(k) for k in DECISION_COLUMNS} for r in self.table]}

    def __repr__(self) -> str:
        """A short summary: the named heads with their evidence, the pairs, and the table's size."""
        def named(role: str) -> str:
            heads = getattr(self, role)
            return "[" + ", ".join(f"L{la}H{h} ({self.evidence.get((la, h), 'pattern')})" for la, h in heads) + "]"

        cols = len(self.table[0]) if self.table else 0
        conv = f"gather_conv=[{', '.join(f'L{la} conv' for la in self.gather_conv)}], " if self.gather_conv else ""
        return (f"GAHeads(gather={named('gather')}, {conv}aggregate={named('aggregate')}, "
                f"pairs=[{', '.join(f'L{g[0]}H{g[1]}->L{a[0]}H{a[1]}' for g, a in self.pairs)}], "
                f"reading={self.reading.get('gather')}/{self.reading.get('aggregate')}, "
                f"table={len(self.table)} heads x {cols} columns (see .table))")

    __str__ = __repr__

    def ga_heads(self) -> list[Head]:
        """Aggregate heads first, then Gather heads (each once)."""
        return aggregate_then_gather(self.aggregate, self.gather)


def aggregate_then_gather(aggregate: Sequence[Head], gather: Sequence[Head]) -> list[Head]:
    """The named heads, Aggregate heads first, then Gather heads, each once (the set a G&A ablation removes)."""
    out: list[Head] = []
    for hd in [*aggregate, *gather]:
        if hd not in out:
            out.append(hd)
    return out


def _reads_segment(table: Sequence[dict[str, Any]], summary: str, segment: str) -> bool:
    """Whether some head shows the ``segment`` reading far more (over twice, plus 0.05) than any head shows the
    ``summary`` one."""
    top = {k: max(r[k] for r in table) for k in (summary, segment)}
    return top[segment] > 2 * top[summary] + 0.05


def aggregate_reading(table: Sequence[dict[str, Any]]) -> str:
    """Which Aggregate score to rank a model's heads by: ``"aggregate"`` (the correct segment's summary token,
    the paper's reading), or ``"aggregate_segment"`` (any of its tokens) when some head reads the segment far
    more (over twice, plus 0.05) than any head reads its summary, as ``llama-kv``'s value-reading KV heads do."""
    return "aggregate_segment" if _reads_segment(table, "aggregate", "aggregate_segment") else "aggregate"


def gather_reading(table: Sequence[dict[str, Any]]) -> str:
    """The same choice for the Gather score: ``"gather"`` (read at each segment's summary token), or
    ``"gather_segment"`` (at its best token; in the table only with ``pattern_scores(..., gather_any=True)``) when
    some head gathers there far more, as ``llama-kv``'s Gather head does into each line's value token."""
    if "gather_segment" not in table[0]:
        return "gather"
    return "gather_segment" if _reads_segment(table, "gather", "gather_segment") else "gather"


def _mean_sd(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation of ``values`` (NaN counts as 0; sd 0 for fewer than two values)."""
    t = torch.nan_to_num(torch.tensor(values, dtype=torch.float64), nan=0.0)
    return float(t.mean()), float(t.std()) if len(values) > 1 else 0.0


def zscores(values: list[float]) -> list[float]:
    """Standard scores of ``values`` (NaN counts as 0; all 0 when they do not vary)."""
    finite = [0.0 if math.isnan(v) else float(v) for v in values]
    mean, sd = _mean_sd(finite)
    return [0.0 if sd == 0 else (v - mean) / sd for v in finite]


def check_scan(model: HookedModel, examples: Sequence[Any], scan: Any, what: str = "scan") -> None:
    """Refuse ``scan`` unless it was made on ``model`` over ``examples`` (the tokens :func:`task_metric` gives
    them): its heads, its model fingerprint, its prompts' fingerprint and count (:meth:`ScanResult.check_for`)."""
    from gather_aggregate.core.protocol import pad_id_of
    from gather_aggregate.scan.result import ScanResult
    from gather_aggregate.tasks.base import collate

    if not isinstance(scan, ScanResult):
        scan = ScanResult(list(getattr(scan, "rows", [])), dict(getattr(scan, "meta", {}) or {}))
    tokens = collate(list(examples), pad_id_of(model.tokenizer)).tokens
    scan.check_for(model, tokens, what=what)


#: the usual values of ``reading`` (``"last-K"`` and ``"first+K"`` take any ``K >= 1``)
READINGS = ("auto", "summary", "last", "last-1", "last-2")


@analysis
def find_ga_heads(model: HookedModel, examples: Sequence[Any], scan: Any = None, *, reading: str = "auto",
                  scores: list[dict[str, Any]] | None = None, batch_size: int = 16, max_candidates: int = 64,
                  seed: int = 0, z: float | None = None) -> GAHeads:
    """Name Gather / Aggregate heads by the rule of :mod:`gather_aggregate.detect.rules`: chance-relative pattern
    masses make candidates, position-restricted joint ablation (greedy peeling) forms each role's group, a group is
    named when it beats random head sets of the same size and kinds, and path patching pairs Gather with Aggregate
    heads.  One setting serves every model; nothing is decided by a z-score.

    ``reading`` is where a segment is read (``"summary"``: the task's summary token; ``"last"``, ``"last-K"``: its
    last token or ``K`` before it; ``"first+K"``: ``K`` after its first; or ``"auto"``: of all of these that fit the
    segments, the one the Aggregate candidates read most, reported in ``reading`` and ``read_why``).  ``scan`` (a
    single-head scan of the same prompts) and ``scores`` (:func:`pattern_scores` rows) only add columns to the table
    (``ablation_drop`` and the z-scores ``z_gather``/``z_aggregate``/``z_ablation``, for ranking by eye).  ``z`` is
    accepted for compatibility and unused.
    """
    from gather_aggregate.detect.pattern_evidence import parse_read
    from gather_aggregate.detect.rules import decide
    from gather_aggregate.tasks.base import check_examples
    from gather_aggregate.tasks.fit import check_fits

    check_model(model)
    examples = check_examples(examples)
    check_fits(model, examples)
    batch_size, seed = count(batch_size, "batch_size"), as_index(seed, "seed")
    if scores is not None and (not isinstance(scores, list) or not all(isinstance(r, dict) for r in scores)):
        raise InputError(f"scores must be the rows pattern_scores(model, examples) returns, got "
                         f"{type(scores).__name__}")
    if reading == "segment":  # the earlier name of the value-token reading
        reading = "last-1"
    if reading != "auto":
        parse_read(reading)
    if scan is not None and not callable(getattr(scan, "scores", None)):
        raise InputError(f"scan must be a ScanResult (e.g. exact_scan(...) or ScanResult.load(path)), got "
                         f"{type(scan).__name__}")
    if isinstance(max_candidates, bool) or not isinstance(max_candidates, int) or max_candidates < 1:
        raise InputError(f"max_candidates={max_candidates!r}: pass a positive int (heads per role tested causally)")
    if scan is not None:  # a scan of another model, task or prompt count was merged as it was
        check_scan(model, examples, scan)
    own = set(model.all_heads())
    alien = [hd for hd in [(r.get("layer"), r.get("head")) for r in scores or []] if hd not in own]
    if alien:
        raise ProvenanceError(f"scores has head L{alien[0][0]}H{alien[0][1]}, which this model does not have: it "
                              "was computed on another model; pass a scores of this model's heads, or none")
    res = decide(model, examples, read=reading, max_candidates=max_candidates, seed=seed, batch_size=batch_size)
    if scores is None:  # the paper's summary-token scores, as columns beside the detector's own
        scores = pattern_scores(model, examples, batch_size=batch_size)
    extra = {(r["layer"], r["head"]): r for r in scores}
    drops = scan.scores() if scan is not None else {}
    table = []
    for row in res["heads"]:
        hd = (row["layer"], row["head"])
        merged = {**extra.get(hd, {}), **{k: v for k, v in row.items() if k != "read_profile"}}
        if drops:  # a head the scan left out has no drop: None (JSON null), not a NaN written into the table
            merged["ablation_drop"] = drops.get(hd)
        table.append(merged)
    for key, col in (("z_gather", "gather_mass"), ("z_aggregate", "aggregate_on_correct")) + ((("z_ablation", "ablation_drop"),)
                                                                                 if drops else ()):
        for row, zz in zip(table, zscores([float("nan") if r[col] is None else r[col] for r in table])):
            row[key] = zz
    evidence: dict[Head, str] = {}
    joint: dict[str, float] = {}
    for role in ("aggregate", "gather"):
        named = res[role]
        for hd in named:
            evidence.setdefault(hd, "alone" if len(named) == 1 else "joint")
        if named:
            joint[role] = res["groups"][role]["loss"]
    for row in table:
        row["evidence"] = evidence.get((row["layer"], row["head"]), "")
    return GAHeads(table, list(res["gather"]), list(res["aggregate"]), list(res["pairs"]),
                   reading={"gather": res["read"], "aggregate": "segment"}, evidence=evidence, joint_drop=joint,
                   groups=res["groups"], pair_loss=res["pair_loss"],
                   margin={k: res[k] for k in ("clean", "chance", "margin")}, read_why=res["read_why"],
                   gather_conv=list(res.get("gather_conv", [])), conv=list(res.get("conv", [])))
