"""Activation patching, clean → corrupted, per head and per head × position.

Run the *corrupted* prompts, but give one head (at every position, or at one
position) the output it had on the *clean* prompts, and measure
``metric`` (e.g. the logit difference between the right and the wrong
answer).  The table reports the raw metric and the normalised effect
``(patched - corrupted) / (clean - corrupted)``: 1 = the head alone restores the
clean behaviour, 0 = no effect.

Like :func:`gather_aggregate.scan.exact.exact_scan`, one corrupted forward caches
what each patched layer needs and many patches of that layer run in one stacked
forward from there (:mod:`gather_aggregate.interventions.layer_resume`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from gather_aggregate.core.arguments import check_model, count
from gather_aggregate.core.errors import IndexOutOfRangeError, InputError
from gather_aggregate.core.indices import as_index
from gather_aggregate.core.model_state import analysis
from gather_aggregate.core.protocol import Head, HookedModel
from gather_aggregate.core.readout import ReadoutMetric
from gather_aggregate.interventions import layer_resume
from gather_aggregate.interventions.ablation import Edit, group_by_layer, head_outputs
from gather_aggregate.scan.exact import (
    Metric,
    ScanResult,
    _apply,
    _check_metric,
    _progress,
    check_metric_fn,
    default_max_rows,
)
from gather_aggregate.scan.result import scan_provenance


@analysis
def patch_heads(model: HookedModel, clean: Any, corrupted: Any, metric: Metric, heads: Sequence[Head] | None = None, *,
                per_position: bool = False, positions: Sequence[int] | None = None, max_rows: int | None = None,
                progress: bool = True) -> ScanResult:
    """Patch clean head outputs into the corrupted run; one row per head (or head × position).

    ``metric(logits) -> scalar``.  ``positions`` restricts the per-position
    sweep (default: every position).  ``score`` in the table is the normalised
    effect.  ``max_rows``: as in :func:`~gather_aggregate.scan.exact.exact_scan`.
    """
    check_model(model)
    check_metric_fn(metric)
    clean = model.validate_tokens(clean)
    corrupted = model.validate_tokens(corrupted)
    if clean.shape != corrupted.shape:
        raise InputError(f"clean and corrupted prompts must have the same shape (same number of tokens at the "
                         f"same positions), got {tuple(clean.shape)} and {tuple(corrupted.shape)}")
    heads = model.all_heads() if heads is None else model.check_head_set(heads)
    if not heads:
        raise InputError("empty head set: pass heads=None to patch every head")
    n_pos = clean.shape[1]
    if positions is not None:
        if isinstance(positions, (str, bytes)) or not hasattr(positions, "__iter__"):
            raise InputError(f"positions must be a list of token positions, e.g. [3, -1], got {positions!r}")
        positions = [as_index(p, "a position") for p in positions]
        far = [p for p in positions if not -n_pos <= p < n_pos]  # was wrapped: 99 patched position 99 % n_pos
        if far:
            raise IndexOutOfRangeError(f"positions {far} are outside the prompts' {n_pos} tokens; pass 0..{n_pos - 1} "
                                       "(or -1 for the last)")
        positions = [p % n_pos for p in positions]
        if not per_position:
            raise InputError("positions= only applies with per_position=True")
    pos_list: list[int | None] = (list(positions) if positions is not None else list(range(n_pos))) \
        if per_position else [None]
    batch = clean.shape[0]
    layers = sorted({la for la, _ in heads})
    clean_z = head_outputs(model, clean, layers)
    readout = metric if isinstance(metric, ReadoutMetric) else None
    how = layer_resume.plan(model, layers, readout=readout is not None)
    with torch.no_grad():
        m_clean = _check_metric(metric(model(clean)), "clean run")
        corr_logits, cache = model.run_with_cache(corrupted, names_filter=layer_resume.cache_names(model, how))
        m_corr = _check_metric(metric(corr_logits), "corrupted run")
        how = layer_resume.verify(model, cache, how, corr_logits)
        denom = m_clean - m_corr
        if abs(denom) <= 1e-6 * max(1.0, abs(m_clean)):  # was a table of NaN (or float-noise-sized, huge) scores
            raise InputError(f"the metric is {m_clean:.6g} on the clean and {m_corr:.6g} on the corrupted prompts, so "
                             "no patch has anything to restore (score = (patched - corrupted) / (clean - corrupted)); "
                             "pass corrupted prompts that change the metric, e.g. the same prompts asking for another "
                             "key (a mean over prompts does not change when they are only reordered)")
        per_fwd = max(1, (default_max_rows(model) if max_rows is None else count(max_rows, "max_rows")) // batch)
        edits_all = [Edit(la, h, p) for la, hs in group_by_layer(heads).items() for h in hs for p in pos_list]
        bar = _progress(len(edits_all), "patching", progress)
        rows = []
        for layer in layers:
            edits = [e for e in edits_all if e.layer == layer]
            axis = model.head_hook(layer)[1]

            def fill(e: Edit, cur: Any, layer: int = layer, axis: int = axis) -> Any:
                src = clean_z[layer].select(axis, e.head)  # [batch, pos, d_head]
                return src if e.position is None else src[:, e.position]

            for start in range(0, len(edits), per_fwd):
                chunk = edits[start:start + per_fwd]
                logits = layer_resume.edited_logits(model, cache, how, layer, chunk, fill, readout)
                for i, e in enumerate(chunk):
                    where = f"head L{e.layer}H{e.head}" + ("" if e.position is None else f" pos {e.position}")
                    m = _check_metric(_apply(metric, readout, logits[i * batch:(i + 1) * batch]), where)
                    rows.append({"layer": e.layer, "head": e.head, "kind": model.layers[e.layer].kind_of(e.head),
                                 "position": e.position, "metric_patched": m,
                                 "score": (m - m_corr) / denom})
                bar.update(len(chunk))
        bar.close()
    meta = {"mode": "patching", "metric_clean": m_clean, "metric_corrupted": m_corr, "per_position": per_position,
            **scan_provenance(model, clean)}
    return ScanResult(rows, meta).ranked()
