"""Head-importance scans: rank heads by the drop in a task metric when ablated.

``metric(logits) -> scalar`` scores a batch of prompts (higher is better, e.g.
mean log-prob of the right answer; see :mod:`gather_aggregate.tasks`).  A head's
score is ``metric(clean) - metric(head ablated)``.  With a metric that keeps
its value per prompt (:meth:`ReadoutMetric.mean_of`, as task metrics do), the
exact and naive scans also give each head's ``stderr``: the standard error of
its drop over the prompts (:meth:`ScanResult.significant`).

Three implementations, one answer:

* :func:`naive_scan`  one full ``run_with_hooks`` per head (TransformerLens'
  ``patching`` style).  The oracle.
* :func:`exact_scan`  the same numbers, faster: one clean forward caches what
  each scanned layer needs, and the ablations of many heads of that layer run
  in one stacked forward from there, without re-running the ablated layer's
  mixer where the model allows it (:mod:`gather_aggregate.interventions.layer_resume`).
  Equal to the naive loop up to float rounding (tested).
* :func:`atp_scan`  attribution patching: one forward and one backward give the
  first-order estimate ``-(z_ablated - z) · ∂metric/∂z`` for every head at once.

Scans write a tidy table (layer, head, kind, score, rank, ...) atomically as
JSON + CSV after every chunk, and ``resume=True`` continues an interrupted scan
from that file (refusing one from another model or task).  A run killed at any
moment leaves files that parse and agree (see :func:`gather_aggregate.core.results_io.write_table`),
and the resumed scan writes exactly what an uninterrupted one writes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from gather_aggregate.core.arguments import check_model
from gather_aggregate.core.errors import InputError, NonFiniteError, ResumeMismatchError
from gather_aggregate.core.indices import as_index
from gather_aggregate.core.model_state import analysis, gradients
from gather_aggregate.core.protocol import Head, HookedModel, device_of
from gather_aggregate.core.provenance import model_fingerprint, task_fingerprint  # noqa: F401 - public here too
from gather_aggregate.core.readout import ReadoutMetric
from gather_aggregate.core.results_io import check_output_file
from gather_aggregate.interventions import layer_resume
from gather_aggregate.interventions.ablation import (
    Edit,
    Method,
    _hooks,
    group_by_layer,
    make_replacement,
)
from gather_aggregate.scan.rankings import compare_rankings  # noqa: F401  (re-exported: scans are compared from here)
from gather_aggregate.scan.result import ScanResult, scan_provenance, table_problem

Metric = Callable[[Tensor], Tensor]


# ---- fingerprints (resume safety) ---------------------------------------------------
def check_metric_fn(metric: Any) -> None:
    """Refuse a metric that is not a function ``logits -> scalar`` before any forward runs."""
    if not callable(metric):
        raise InputError(f"metric must be a function logits -> scalar tensor (e.g. mean log-prob of the answer), "
                         f"got a {type(metric).__name__}; see gather_aggregate.tasks.task_metric")


def _check_metric(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (Tensor, int, float)):
        raise InputError(f"the metric must return a scalar tensor (or a number), got {type(value).__name__} "
                         f"({what}); return e.g. logits[..., answer].log_softmax(-1).mean()")
    if not isinstance(value, Tensor):
        value = torch.as_tensor(value)
    if value.numel() != 1:
        raise InputError(f"the metric must return a scalar, got shape {tuple(value.shape)} ({what}); "
                         "reduce it, e.g. with .mean()")
    v = float(value)
    if not math.isfinite(v):
        raise NonFiniteError(f"the metric returned {v} ({what})")
    return v


def _apply(metric: Metric, readout: ReadoutMetric | None, logits: Tensor) -> Any:
    """The metric on full logits, or on logits already taken at ``readout``'s positions."""
    return metric(logits) if readout is None else readout.at_readout(logits)


def _row(model: HookedModel, layer: int, head: int, clean: float, ablated: float,
         stderr: float | None = None) -> dict[str, Any]:
    row = {"layer": layer, "head": head, "kind": model.layers[layer].kind_of(head), "score": clean - ablated,
           "metric_clean": clean, "metric_ablated": ablated}
    if stderr is not None:
        row["stderr"] = stderr
    return row


def _stderr(clean: Tensor | None, ablated: Tensor | None) -> float | None:
    """Standard error over prompts of the drop ``clean_i - ablated_i`` (sample std / √n); None without
    per-prompt values (a metric not built with :meth:`ReadoutMetric.mean_of`) or with one prompt."""
    if clean is None or ablated is None or clean.numel() < 2:
        return None
    return float((clean - ablated).std() / math.sqrt(clean.numel()))


def _measure(metric: Metric, logits: Tensor, at_readout: bool) -> tuple[Any, Tensor | None]:
    """The metric and its per-prompt values (None unless it keeps them, :meth:`ReadoutMetric.mean_of`) on full
    logits, or on logits already taken at a :class:`ReadoutMetric`'s positions."""
    if not isinstance(metric, ReadoutMetric):
        return metric(logits), None
    return metric.evaluate_at(logits if at_readout else metric.select(logits))


def _prepare(model: HookedModel, tokens: Any, heads: Sequence[Head] | None, metric: Any) -> tuple[Tensor, list[Head]]:
    check_model(model)
    check_metric_fn(metric)
    tokens = model.validate_tokens(tokens)
    heads = model.all_heads() if heads is None else model.check_head_set(heads)
    if not heads:
        raise InputError("empty head set: pass heads=None to scan every head")
    return tokens, heads


def _progress(total: int, desc: str, enabled: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, disable=not enabled, leave=False)


# ---- naive: one forward per head ------------------------------------------------------
@analysis
def naive_scan(model: HookedModel, tokens: Any, metric: Metric, heads: Sequence[Head] | None = None,
               method: Method = "zero", reference: Any = None, *, per_position: bool = True, seed: int = 0,
               progress: bool = False) -> ScanResult:
    """One full ``run_with_hooks`` per head: the reference the fast scans are tested against."""
    tokens, heads = _prepare(model, tokens, heads, metric)
    rep = make_replacement(model, heads, method, reference, per_position=per_position, seed=seed,
                           n_pos=tokens.shape[1], inputs=tokens)
    with torch.no_grad():
        value, per_clean = _measure(metric, model(tokens), False)
        clean = _check_metric(value, "clean run")
        rows = []
        bar = _progress(len(heads), "naive scan", progress)
        for layer, head in heads:
            logits = model.run_with_hooks(tokens, fwd_hooks=_hooks(model, [(layer, head)], rep))  # rep: built above
            value, per = _measure(metric, logits, False)
            rows.append(_row(model, layer, head, clean, _check_metric(value, f"head L{layer}H{head}"),
                             _stderr(per_clean, per)))
            bar.update(1)
        bar.close()
    return ScanResult(rows, {"mode": "naive", "method": method, "metric_clean": clean,
                             **scan_provenance(model, tokens)}).ranked()


# ---- exact: cached prefix + batched ablations ---------------------------------------
def default_max_rows(model: HookedModel) -> int:
    """Rows (copies x prompts) per batched forward: 256 on CUDA, 32 on CPU."""
    return 256 if device_of(model).type == "cuda" else 32


@analysis
def exact_scan(model: HookedModel, tokens: Any, metric: Metric, heads: Sequence[Head] | None = None,
               method: Method = "zero", reference: Any = None, *, per_position: bool = True, seed: int = 0,
               max_rows: int | None = None, out: str | Path | None = None, resume: bool = False,
               progress: bool = True, ray: bool = False, ray_address: str | None = None,
               num_workers: int = 2) -> ScanResult:
    """Exact ablation scores for ``heads`` (default: all), batched.

    ``max_rows`` bounds the stacked batch (copies x prompts) of one forward;
    the default, :func:`default_max_rows`, is 256 on a GPU and 32 on a CPU,
    where big stacked batches leave the cache and run slower than separate
    forwards (measured in ``docs/benchmarks.md``).
    With ``out`` the table is written (JSON + CSV, atomically) after every
    chunk; ``resume=True`` skips heads already in ``out`` after checking that
    it belongs to the same model, task and ablation.
    With ``ray=True`` (a local Ray cluster) or ``ray_address="auto"`` / ``"host:port"`` the heads are
    sharded across ``num_workers`` Ray workers that each load the model once
    (:func:`exact_scan_ray`; same numbers, same table).
    """
    if resume and out is None:
        raise InputError("resume=True needs out=PATH, the table an interrupted scan wrote")
    if out is not None and not isinstance(out, (str, Path)):
        raise InputError(f"out must be a file path (str or Path) for the scan table, got {type(out).__name__}")
    if out is not None:  # before any forward: not after the first chunk's work
        check_output_file(out, twin=True)
    if max_rows is not None and (as_index(max_rows, "max_rows") < 1):
        raise InputError(f"max_rows={max_rows}: pass a positive number of stacked rows per forward, or None")
    from gather_aggregate.scan.distributed import check_ray_options

    if check_ray_options(ray, ray_address, num_workers):
        return exact_scan_ray(model, tokens, metric, heads, method, reference, per_position=per_position,
                              seed=seed, max_rows=max_rows, out=out, resume=resume, address=ray_address,
                              num_workers=num_workers)
    tokens, heads = _prepare(model, tokens, heads, metric)
    batch = tokens.shape[0]
    rep = make_replacement(model, heads, method, reference, per_position=per_position, seed=seed,
                           n_pos=tokens.shape[1], inputs=tokens)
    meta = _exact_meta(model, tokens, metric, method, per_position, seed)
    rows, done = _resumed(out, resume, meta)
    rows = [r for r in rows if (r["layer"], r["head"]) in set(heads)]
    todo = [hd for hd in heads if hd not in done]

    per_fwd = max(1, (max_rows or default_max_rows(model)) // batch)
    # chunks are cut from the full head list, so a resumed scan stacks the same copies per forward as an
    # uninterrupted one and writes exactly the same numbers (a chunk is saved whole or not at all)
    by_layer = group_by_layer(heads)
    readout = metric if isinstance(metric, ReadoutMetric) else None
    how = layer_resume.plan(model, by_layer, readout=readout is not None)
    with torch.no_grad():
        # one clean forward gives the metric and everything each scanned layer resumes from
        clean_logits, cache = model.run_with_cache(tokens, names_filter=layer_resume.cache_names(model, how))
        value, per_clean = _measure(metric, clean_logits, False)
        clean = _check_metric(value, "clean run")
        meta["metric_clean"] = clean
        _check_resumed_clean(rows, clean, out)
        how = layer_resume.verify(model, cache, how, clean_logits)
        bar = _progress(len(heads), "exact scan", progress)
        bar.update(len(heads) - len(todo))
        for layer, hs in by_layer.items():
            for start in range(0, len(hs), per_fwd):
                chunk = [Edit(layer, h) for h in hs[start:start + per_fwd] if (layer, h) not in done]
                if not chunk:
                    continue
                logits = layer_resume.edited_logits(model, cache, how, layer, chunk,
                                                    lambda e, cur: rep.values(e.layer, e.head, cur), readout)
                rows.extend(_chunk_rows(model, chunk, logits, metric, readout, (clean, per_clean), batch))
                bar.update(len(chunk))
                if out is not None:
                    ScanResult(rows, meta).ranked().save(out)
        bar.close()
    meta["complete"] = True
    result = ScanResult(rows, meta).ranked()
    if out is not None:
        result.save(out)
    return result


def _exact_meta(model: HookedModel, tokens: Tensor, metric: Any, method: Any, per_position: bool,
                seed: int) -> dict[str, Any]:
    """An exact scan table's metadata: how it was made, and the fingerprints a resume checks."""
    how = {"method": method, "per_position": per_position, "seed": seed}
    # the resample seed is ``ablation_seed``: ``seed`` is the provenance's, the seed the prompts were drawn with
    return {"mode": "exact", "method": method, "per_position": per_position, "ablation_seed": seed,
            **scan_provenance(model, tokens), "task": task_fingerprint(tokens, metric, dict(how)), "complete": False}


def _resumed(out: str | Path | None, resume: bool, meta: dict[str, Any]) -> tuple[list[dict[str, Any]], set[Head]]:
    """With ``resume`` and a table at ``out`` (checked against ``meta``): its rows and the heads they cover."""
    rows = _load_resume(Path(out), meta) if out is not None and resume and Path(out).is_file() else []
    return rows, {(r["layer"], r["head"]) for r in rows}


def _chunk_rows(model: HookedModel, chunk: list[Edit], logits: Tensor, metric: Metric,
                readout: ReadoutMetric | None, clean: tuple[float, Tensor | None], batch: int) -> list[dict[str, Any]]:
    """The table rows of one stacked forward: copy ``i`` (rows ``i·batch`` ...) has ``chunk[i]`` ablated.
    ``clean``: the clean metric and its per-prompt values (None if the metric has none)."""
    rows = []
    for i, e in enumerate(chunk):
        value, per = _measure(metric, logits[i * batch:(i + 1) * batch], readout is not None)
        rows.append(_row(model, e.layer, e.head, clean[0], _check_metric(value, f"head L{e.layer}H{e.head}"),
                         _stderr(clean[1], per)))
    return rows


# ---- the exact scan sharded over Ray workers (gather_aggregate.scan.distributed) -------------------------------
def _as_model(model: HookedModel | str | Path) -> HookedModel:
    if isinstance(model, (str, Path)):
        from gather_aggregate.models.loading import load_model

        return load_model(str(model))
    return model


def _scan_shard(model: HookedModel, shard: tuple[list[tuple[int, int]], dict[str, Any]]) -> list[dict[str, Any]]:
    heads, kw = shard
    return exact_scan(model, heads=heads, progress=False, **kw).rows


def exact_scan_ray(model: HookedModel | str | Path, tokens: Any, metric: Any, heads: Sequence[tuple[int, int]] | None = None,
                   method: str = "zero", reference: Any = None, *, per_position: bool = True, seed: int = 0,
                   max_rows: int | None = None, out: str | Path | None = None, resume: bool = False,
                   address: str | None = None, num_workers: int = 2, threads: int = 1,
                   shards_per_worker: int = 4) -> ScanResult:
    """:func:`exact_scan` with its heads partitioned across Ray workers.

    ``model`` must be loadable in a worker (:func:`model_loader`); the driver uses it for the head list and the
    table's fingerprints.  Each shard is a run of whole stacked forwards of one layer, so every number equals
    the single-process scan's.  The table (``out``) is exact_scan's: either resumes the other's file.
    """
    from gather_aggregate.scan.distributed import (
        check_picklable,
        check_ray_options,
        model_loader,
        run_sharded,
    )

    check_ray_options(True, address, num_workers, threads=threads, shards_per_worker=shards_per_worker)
    check_picklable(metric, "the metric")  # before the model loads or any worker starts
    check_picklable(reference, "reference")
    model = _as_model(model)
    loader = model_loader(model)
    tokens, heads = _prepare(model, tokens, heads, metric)
    meta = _exact_meta(model, tokens, metric, method, per_position, seed)
    rows, done = _resumed(out, resume, meta)
    per_fwd = max(1, (max_rows or default_max_rows(model)) // tokens.shape[0])
    todo = [(la, h) for la, hs in group_by_layer([hd for hd in heads if hd not in done]).items() for h in hs]
    n_shards = max(1, num_workers * shards_per_worker)
    size = per_fwd * max(1, -(-len(todo) // (n_shards * per_fwd)))  # whole stacked forwards per shard
    kw = {"tokens": tokens.cpu(), "metric": metric, "method": method, "reference": reference,
          "per_position": per_position, "seed": seed, "max_rows": max_rows}
    shards = []
    for la, hs in group_by_layer(todo).items():
        for start in range(0, len(hs), size):
            shards.append(([(la, h) for h in hs[start:start + size]], kw))
    def on_shard(new: list[dict[str, Any]]) -> None:  # the finished shard's rows join exact_scan's table, written at once
        _check_resumed_clean(rows, _clean_of(new), out)
        rows.extend(new)
        if out is not None:
            ScanResult(rows, {**meta, "metric_clean": _clean_of(rows)}).ranked().save(out)

    run_sharded(loader, _scan_shard, shards, key=lambda s: ",".join(f"{a}.{b}" for a, b in s[0]),
                address=address, num_workers=num_workers, threads=threads, meta=meta, on_shard=on_shard,
                model=model)  # the workers compute on the weights this model holds now
    meta.update(complete=True, metric_clean=_clean_of(rows))
    result = ScanResult(rows, meta).ranked()
    if out is not None:
        result.save(out)
    return result


def _clean_of(rows: list[dict[str, Any]]) -> float | None:
    return float(rows[0]["metric_clean"]) if rows else None


def _check_resumed_clean(rows: list[dict[str, Any]], clean: float | None, out: Any) -> None:
    """A resumed table's clean metric must be this run's: the fingerprint knows a metric only by its name."""
    old = _clean_of(rows)
    if old is not None and clean is not None and abs(old - clean) > 1e-6 + 1e-4 * abs(clean):
        raise ResumeMismatchError(f"cannot resume from {str(out)!r}: its clean metric is {old:.6g} but this run's is "
                                  f"{clean:.6g}, so another metric wrote it; use another --out or drop --resume")


def _load_resume(path: Path, meta: dict[str, Any]) -> list[dict[str, Any]]:
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError) as exc:  # ValueError: invalid JSON, or bytes that are not UTF-8 text
        raise ResumeMismatchError(f"cannot resume from {str(path)!r}: not a readable scan file ({exc}); use another "
                                  "--out or drop --resume") from None
    problem = table_problem(old)
    if problem:
        raise ResumeMismatchError(f"cannot resume from {str(path)!r}: not a scan table ({problem}); use another "
                                  "--out or drop --resume")
    old_meta = old.get("meta", {})
    for key, what in (("model", "model"), ("task", "task (prompts, metric or ablation settings)"),
                      ("method", "ablation method"), ("mode", "scan mode")):
        if old_meta.get(key) != meta.get(key):
            raise ResumeMismatchError(
                f"cannot resume from {str(path)!r}: it was written for a different {what} "
                f"({old_meta.get(key)!r} vs {meta.get(key)!r}); use another --out or drop --resume"
            )
    return list(old.get("rows", []))


# ---- attribution patching --------------------------------------------------------------
@analysis
def atp_scan(model: HookedModel, tokens: Any, metric: Metric, heads: Sequence[Head] | None = None,
             method: Method = "zero", reference: Any = None, *, per_position: bool = True,
             seed: int = 0) -> ScanResult:
    """First-order estimate of every head's ablation drop from one forward and one backward.

    With ``z`` a head's output and ``z'`` its replacement,
    ``metric(ablated) - metric(clean) ≈ Σ (z' - z) · ∂metric/∂z``, so the
    estimated drop is ``-Σ (z' - z) · ∂metric/∂z``.  Gradients are taken with
    ``torch.autograd.grad`` on zero-valued probes added at the head hooks, so
    no ``.grad`` is left on the model's parameters.
    """
    tokens, heads = _prepare(model, tokens, heads, metric)
    rep = make_replacement(model, heads, method, reference, per_position=per_position, seed=seed,
                           n_pos=tokens.shape[1], inputs=tokens)
    by_layer = group_by_layer(heads)
    seen: dict[int, Tensor] = {}
    probes: dict[int, Tensor] = {}

    def probe_hook(layer: int) -> Callable:
        def hook(z: Tensor, hook: Any) -> Tensor:
            p = torch.zeros_like(z, requires_grad=True)
            probes[layer], seen[layer] = p, z.detach()
            return z + p

        return hook

    fwd = [(model.head_hook(layer)[0], probe_hook(layer)) for layer in by_layer]
    with gradients(), model.hooks(fwd_hooks=fwd):
        value = metric(model(tokens))
        if not isinstance(value, Tensor):
            raise InputError(f"AtP needs the metric to return a tensor computed from the logits (to differentiate "
                             f"it), got {type(value).__name__}; return e.g. logits.log_softmax(-1)[..., answer].mean()")
        clean = _check_metric(value.detach(), "clean run")
        if not value.requires_grad:
            raise InputError("the metric is not differentiable (no grad); AtP needs a metric computed from logits "
                             "with torch ops (e.g. log-probs, logit differences), not accuracy")
        grads = torch.autograd.grad(value, [probes[layer] for layer in by_layer], allow_unused=True)
    rows = []
    for (layer, hs), g in zip(by_layer.items(), grads):
        axis = model.head_hook(layer)[1]
        z = seen[layer]
        g = torch.zeros_like(z) if g is None else g
        for h in hs:
            cur = z.select(axis, h)
            delta = rep.values(layer, h, cur) - cur
            est = float((delta * g.select(axis, h)).sum())
            rows.append(_row(model, layer, h, clean, clean + est))
    return ScanResult(rows, {"mode": "atp", "method": method, "metric_clean": clean,
                             **scan_provenance(model, tokens)}).ranked()
