"""Sharded jobs on Ray: exact scans, ablation sweeps, and any per-model job (e.g. lm-eval runs).

Ray is an optional extra (``pip install "gather-aggregate[ray]"``) and is
imported only when a job runs.  The one engine is :func:`run_sharded`:

* ``num_workers`` Ray actors each call ``load()`` **once** (load a model) and
  then run ``run(state, shard) -> rows`` for one shard after another; they
  stay in a pool, so the next job with the same loader reuses them, model
  loaded (a job with another loader, or :func:`shutdown_workers`, releases
  them);
* the driver writes the rows of every finished shard into one table
  (JSON + CSV, atomically, :func:`gather_aggregate.core.results_io.write_table`) and records
  the finished shards' keys in its ``meta``, so an interrupted job resumes
  with ``resume=True`` and runs only the shards that are missing;
* a shard whose worker dies (killed, out of memory, node lost) is re-run on a
  fresh worker; its rows enter the table only once, when a run of it
  finishes, so nothing is lost or counted twice.

Jobs built on it: :func:`gather_aggregate.scan.exact.exact_scan_ray` (behind
``exact_scan(..., ray=True)``) shards an exact head scan by heads, aligned to
its stacked forwards so the numbers are those of one process, bit for bit, and
writes the table ``exact_scan`` writes (either resumes the other's file);
:func:`gather_aggregate.studies.ablation_tables.ablation_sweep` scores a list of head sets.

``address``: ``None`` starts (or reuses) a local Ray cluster; ``"auto"`` or
``"host:port"`` / ``"ray://host:port"`` joins a running one.  An address that
does not answer raises :class:`~gather_aggregate.core.errors.ClusterUnreachableError`.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gather_aggregate.core.errors import ClusterUnreachableError, InputError, ResumeMismatchError
from gather_aggregate.core.results_io import check_output_file, write_table

if TYPE_CHECKING:  # pragma: no cover
    from gather_aggregate.core.protocol import HookedModel

Rows = list[dict[str, Any]]


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise InputError("Ray is not installed; install the extra: pip install \"gather-aggregate[ray]\"") from None
    return ray


def check_ray_options(ray: Any, address: Any, num_workers: Any, **counts: Any) -> bool:
    """Whether a job goes to Ray, after checking its options before any cluster starts (``ray="host:port"`` ran a
    local cluster and ignored the address; ``num_workers=2.5`` reached Ray's own resource check).  ``counts``:
    other whole numbers that must be at least 1 (``shard_size=4``)."""
    from gather_aggregate.core.indices import as_index

    if not isinstance(ray, bool):
        hint = f"; to join the cluster at {ray!r}, pass ray_address={ray!r}" if isinstance(ray, str) else ""
        raise InputError(f"ray must be True or False (True: a local Ray cluster), got {ray!r}{hint}")
    if address is not None and not isinstance(address, str):
        raise InputError(f"ray_address must be 'auto' or 'host:port', got {type(address).__name__}")
    for name, value in {"num_workers": num_workers, **counts}.items():
        if as_index(value, name) < 1:
            raise InputError(f"{name} must be at least 1, got {value}")
    return ray or address is not None


#: the HTTP/2 client preface and an empty SETTINGS frame: a gRPC server (Ray's GCS and its client server speak
#: gRPC) answers them with a SETTINGS frame of its own
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def _answers_grpc(sock: socket.socket, timeout: float) -> bool:
    """Whether the peer of ``sock`` answers the HTTP/2 preface with a SETTINGS frame within ``timeout``."""
    sock.settimeout(timeout)
    try:
        sock.sendall(_H2_PREFACE)
        head = b""
        while len(head) < 9:
            chunk = sock.recv(9 - len(head))
            if not chunk:
                return False
            head += chunk
    except OSError:  # socket.timeout included
        return False
    return head[3] == 4


def _check_reachable(address: str, timeout: float = 3.0) -> None:
    """Fail fast (one line, the fix named) when ``host:port`` does not accept a connection, or accepts one but
    does not answer as Ray does (gRPC) within ``timeout``: ``ray.init`` would wait there for minutes."""
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise InputError(f"cannot read Ray address {address!r}; pass 'auto', 'HOST:PORT' or 'ray://HOST:PORT'")
    try:
        sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
    except OSError as exc:
        raise ClusterUnreachableError(
            f"no Ray cluster answers at {address!r} ({exc.strerror or exc}); start one with `ray start --head` "
            "and pass its address, or pass ray_address=None (--ray without an address) for a local cluster"
        ) from None
    with sock:
        if not _answers_grpc(sock, timeout):
            raise ClusterUnreachableError(
                f"{address!r} accepts connections but does not answer as a Ray cluster (no gRPC reply in "
                f"{timeout:g} s); pass the address `ray start --head` printed (HOST:6379 by default), or "
                "ray_address=None (--ray without an address) for a local cluster")


def check_address(address: str | None) -> None:
    """Probe a Ray address before anything else is done (a model loaded, a folder made): ``None``, ``"local"``
    and ``"auto"`` need no probe; ``HOST:PORT`` must answer as Ray does (:func:`_check_reachable`)."""
    if address is not None and address not in ("local", "auto"):
        _check_reachable(address)


def check_picklable(obj: Any, what: str) -> None:
    """Refuse, before any worker starts, what Ray could not send to its workers, naming it and the reason."""
    ray = _ray()
    try:
        ray.cloudpickle.dumps(obj)
    except Exception as exc:  # noqa: BLE001 - pickling raises TypeError, PicklingError, AttributeError, ...
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(f"{what} cannot be sent to Ray workers ({type(exc).__name__}: {reason}); make it a "
                         "module-level function over picklable values (tensors, numbers, lists), or run "
                         "without ray") from None


def connect(address: str | None = None, num_cpus: int | None = None) -> Any:
    """The ``ray`` module, initialised: reuse a running session, join ``address``, or start a local cluster."""
    if address is not None and not isinstance(address, str):
        raise InputError(f"a Ray address is 'auto', 'HOST:PORT' or 'ray://HOST:PORT', got {type(address).__name__}")
    check_address(address)
    ray = _ray()
    if ray.is_initialized():
        return ray
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
    if address is not None and address != "local":
        try:
            ray.init(address=address, **kwargs)
        except (ConnectionError, RuntimeError) as exc:
            raise ClusterUnreachableError(
                f"cannot join the Ray cluster at {address!r} ({str(exc).splitlines()[0]}); start one with "
                "`ray start --head`, or pass ray_address=None for a local cluster") from None
        return ray
    ray.init(num_cpus=num_cpus, **kwargs)
    return ray


class _Worker:
    """One Ray actor: ``load()`` once, then ``run(state, shard)`` for shard after shard (of any job)."""

    def __init__(self, load: Callable[[], Any], threads: int) -> None:
        import os
        import sys

        os.environ["OMP_NUM_THREADS"] = str(threads)  # read by torch when load() imports it
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(threads)
        self.error: BaseException | None = None
        try:  # a load that fails (a checkpoint moved since the driver loaded it) is raised by every call, as
            self.state = load()  # itself: an actor that dies in __init__ read as a worker lost, retried 3 times
        except Exception as exc:  # noqa: BLE001 - re-raised below
            self.state, self.error = None, exc

    def run(self, fn: Callable[[Any, Any], Rows], index: int, shard: Any) -> tuple[int, Rows]:
        if self.error is not None:
            raise self.error
        return index, list(fn(self.state, shard))

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self.error is not None:
            raise self.error
        return fn(self.state, *args)


def _get(ray: Any, refs: Any) -> Any:
    """``ray.get(refs)``; a project error raised in a worker (a bad metric value, a refused input) is raised here
    as itself, in its one line, instead of Ray's traceback text."""
    from gather_aggregate.core.errors import GAError

    try:
        return ray.get(refs)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, GAError):
            raise type(cause)(str(cause)) from None
        raise


def _checksum(model: Any) -> str:
    from gather_aggregate.core.provenance import weights_checksum

    return weights_checksum(model)


def _set_weights(model: Any, weights: dict[str, Any]) -> str:
    """Load the driver's weights into a worker's model; its checksum after."""
    from gather_aggregate.core.model_state import _root

    _root(model).load_state_dict(weights, strict=True)
    return _checksum(model)


def _sync_weights(ray: Any, workers: list[Any], model: Any, expected: str) -> None:
    """Give every worker whose model differs from ``model`` (the one the user holds, edited in memory or its
    checkpoint changed on disk) ``model``'s weights; refuse when they still differ."""
    from gather_aggregate.core.errors import ProvenanceError
    from gather_aggregate.core.model_state import _root

    sums = _get(ray, [w.call.remote(_checksum) for w in workers])
    stale = [w for w, got in zip(workers, sums) if got != expected]
    if not stale:
        return
    weights = ray.put({k: v.detach().cpu() for k, v in _root(model).state_dict().items()})
    sums = _get(ray, [w.call.remote(_set_weights, weights) for w in stale])
    if any(got != expected for got in sums):
        raise ProvenanceError("the Ray workers' model differs from the one in memory even after loading its "
                              "weights (a buffer or setting the state dict does not hold); save the model "
                              "(save_pretrained) and load_model it, or run without ray")


#: live workers of the last loader, per (Ray session, loader, threads): the next job on the same model reuses
#: them, model loaded
_POOLS: dict[tuple[str, bytes, int], list[Any]] = {}


def _pool_key(ray: Any, load: Callable[[], Any], threads: int) -> tuple[str, bytes, int]:
    import hashlib

    session = str(ray.get_runtime_context().gcs_address)
    return session, hashlib.sha256(ray.cloudpickle.dumps(load)).digest(), threads


def _workers(ray: Any, load: Callable[[], Any], threads: int, n: int) -> list[Any]:
    """``n`` workers that have run ``load()``: the pool's live ones first, new ones for the rest.  Workers
    pooled for another loader are released first: they hold CPUs the new ones need."""
    key = _pool_key(ray, load, threads)
    for other in [k for k in _POOLS if k != key]:
        for w in _POOLS.pop(other):
            if other[0] == key[0]:
                ray.kill(w, no_restart=True)
    pool = _POOLS.setdefault(key, [])
    actor_cls = ray.remote(num_cpus=threads, max_restarts=0)(_Worker)
    while len(pool) < n:
        pool.append(actor_cls.remote(load, threads))
    return pool[:n]


def _replace(ray: Any, load: Callable[[], Any], threads: int, dead: Any) -> Any:
    pool = _POOLS.setdefault(_pool_key(ray, load, threads), [])
    if dead in pool:
        pool.remove(dead)
    new = ray.remote(num_cpus=threads, max_restarts=0)(_Worker).remote(load, threads)
    pool.append(new)
    return new


def shutdown_workers() -> None:
    """Release every pooled worker (and the models they hold)."""
    ray = _ray()
    for pool in _POOLS.values():
        for w in pool:
            if ray.is_initialized():
                ray.kill(w, no_restart=True)
    _POOLS.clear()


def run_sharded(load: Callable[[], Any], run: Callable[[Any, Any], Rows], shards: Sequence[Any], *,
                key: Callable[[Any], str] = repr, address: str | None = None, num_workers: int = 2,
                threads: int = 1, out: str | Path | None = None, meta: dict[str, Any] | None = None,
                resume: bool = False, prior_rows: Rows | None = None, max_retries: int = 3,
                on_shard: Callable[[Rows], None] | None = None, model: Any = None) -> Rows:
    """Run ``run(state, shard)`` for every shard on ``num_workers`` Ray actors that each ``load()`` once.

    Returns every row (prior rows first, then the shards' rows in shard order).  With ``out`` the table
    ``{"meta": meta + done_shards, "rows": rows}`` is written atomically after every finished shard;
    ``resume=True`` skips the shards whose ``key(shard)`` the file lists, after checking that its other meta
    entries equal ``meta``.  ``load`` and ``run`` must be picklable (module-level functions, ``functools.partial``,
    or closures over picklable values; refused before any worker starts).  A shard whose worker dies is retried on
    a new worker up to ``max_retries`` times.  With ``model`` (the model the user holds), every worker's model is
    checked against its weights checksum and gets its weights where they differ, so the job computes on the
    model in memory, not on a checkpoint that differs from it.
    """
    check_ray_options(True, address, num_workers, threads=threads)
    for obj, what in ((load, "the model loader"), (run, "the job function")):
        check_picklable(obj, what)
    if shards:
        check_picklable(shards[0], "a shard (the prompts, metric and settings sent to a worker)")
    if out is not None:  # before any worker starts
        check_output_file(out, twin=True)
    meta = dict(meta or {})
    keys = [key(s) for s in shards]
    if len(set(keys)) != len(keys):
        raise InputError("two shards have the same key; give every shard a distinct key (key=...)")
    prior, done = list(prior_rows or []), set[str]()
    if out is not None and resume and Path(out).is_file():
        prior, done = _resume_rows(Path(out), meta)
    todo = [i for i, k in enumerate(keys) if k not in done]
    results: dict[int, Rows] = {}

    def save() -> None:
        if out is not None:
            rows = prior + [r for i in sorted(results) for r in results[i]]
            write_table(rows, out, {**meta, "done_shards": sorted(done | {keys[i] for i in results}),
                                    "complete": len(done) + len(results) == len(keys)})

    if todo:
        expected = "" if model is None else _checksum(model)
        ray = connect(address, num_cpus=None if address is not None else num_workers * threads)
        workers = _workers(ray, load, threads, min(num_workers, len(todo)))
        if model is not None:
            _sync_weights(ray, workers, model, expected)
        queue, tries = list(todo), dict.fromkeys(todo, 0)
        running: dict[Any, tuple[int, Any]] = {}

        def submit(w: Any) -> None:
            i = queue.pop(0)
            tries[i] += 1
            running[w.run.remote(run, i, shards[i])] = (i, w)

        for w in workers:
            if queue:
                submit(w)
        while running:
            ready, _ = ray.wait(list(running), num_returns=1)
            i, w = running.pop(ready[0])
            try:
                _, rows = _get(ray, ready[0])
            except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as exc:
                if tries[i] > max_retries:
                    raise RuntimeError(f"shard {keys[i]!r} lost its worker {tries[i]} times; giving up "
                                       f"({type(exc).__name__})") from None
                queue.insert(0, i)  # re-run it first, on a fresh worker
                w = _replace(ray, load, threads, w)
                if model is not None:
                    _sync_weights(ray, [w], model, expected)
            else:
                results[i] = rows
                save()
                if on_shard is not None:
                    on_shard(rows)
            if queue:
                submit(w)
    save()
    return prior + [r for i in sorted(results) for r in results[i]]


#: row fields of the jobs' tables that must be numbers (a scan's rows are checked by scan.result.table_problem)
_NUMBERS = ("score", "drop", "metric_clean", "metric_ablated", "stderr")


def _resume_rows(path: Path, meta: dict[str, Any]) -> tuple[Rows, set[str]]:
    import json

    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError) as exc:  # ValueError: invalid JSON, or bytes that are not UTF-8 text
        raise ResumeMismatchError(f"cannot resume from {str(path)!r}: not a readable table ({exc}); use another out= "
                                  "or drop resume") from None
    if not isinstance(old, dict) or not isinstance(old.get("rows", []), list) or not isinstance(old.get("meta", {}), dict):
        raise ResumeMismatchError(f"cannot resume from {str(path)!r}: not a table {{\"meta\": ..., \"rows\": [...]}}; "
                                  "use another out= or drop resume")
    import math

    for i, row in enumerate(old.get("rows", [])):  # a hand-edited NaN or text value was taken into the result
        bad = "not an object" if not isinstance(row, dict) else next(
            (f"{k} is {v!r}" for k, v in row.items() if isinstance(v, float) and not math.isfinite(v)
             or k in _NUMBERS and (isinstance(v, bool) or not isinstance(v, (int, float)))), None)
        if bad:
            raise ResumeMismatchError(f"cannot resume from {str(path)!r}: row {i}'s {bad}; use another out= or drop "
                                      "resume")
    old_meta = old.get("meta", {})
    for k, v in meta.items():
        if k not in ("complete", "done_shards", "metric_clean") and old_meta.get(k) != v:
            raise ResumeMismatchError(f"cannot resume from {str(path)!r}: its {k!r} is {old_meta.get(k)!r}, "
                                      f"this job's is {v!r}; use another out= or drop resume")
    return list(old.get("rows", [])), set(old_meta.get("done_shards", []))


# ---- models on workers ------------------------------------------------------------------------------------
def model_loader(model: str | Path | Callable[[], HookedModel] | HookedModel) -> Callable[[], Any]:
    """A picklable loader that rebuilds ``model`` in a worker: a directory / hub name, a callable, or a model
    returned by :func:`gather_aggregate.load_model` (which records how it was loaded)."""
    import functools

    from gather_aggregate.models.loading import load_model

    if isinstance(model, (str, Path)):
        return functools.partial(load_model, str(model))
    if callable(model) and not hasattr(model, "layers"):
        return model
    spec = getattr(model, "ga_load_spec", None)
    if spec is None:
        raise InputError("Ray workers load the model themselves: pass a model from load_model(path), its path, "
                         "or a picklable loader function")
    path, kwargs = spec
    return functools.partial(load_model, path, **kwargs)
