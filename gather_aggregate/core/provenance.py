"""Where a result came from, and the one check every step that receives a result makes.

A result that crosses from one step to another (a scan handed to the detector, a replacement handed to ablation
hooks, a ranking handed to head choice, cached activations handed to a worker) carries a :class:`Provenance`.
The receiver builds the provenance it expects from what it holds and calls :meth:`Provenance.check`; a field
set on both sides that differs is refused in one line that names the field and the fix.

=====================  ==========================================================  ==================
field                  what it identifies                                          meta key
=====================  ==========================================================  ==================
``model``              :func:`model_fingerprint`: layer layout + a sample of      ``model``
                       every parameter (cheap; changes with any real edit)
``weights``            :func:`weights_checksum`: SHA-256 of every parameter and    ``weights``
                       buffer (where an in-memory edit could differ from disk)
``model_name``         a label: the zoo name or the directory it was loaded from   ``model_name``
``task``               :func:`task_fingerprint`: prompts, metric and settings      ``task``
``task_name``          the task's name (``kv``, ``letter-mc``, a task file)        ``task_name``
``prompts``            :func:`prompts_fingerprint`: the token ids alone (what a    ``prompts``
                       detector or head choice compares: it holds examples, not
                       the scan's metric or ablation settings)
``n``                  the number of prompts                                       ``n``
``seed``               the seed the prompts were drawn with                        ``seed``
=====================  ==========================================================  ==================

The meta keys are those results already write (``ScanResult.meta``, the CLI's JSON), so files written before
this record was named read back with their fields.  A field left ``None`` is not compared: a label is checked
only where both sides have one, and two fingerprints decide identity whatever the labels say.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gather_aggregate.core.errors import ProvenanceError
from gather_aggregate.core.model_state import param_checksum

#: field -> the meta key it is stored under
META_KEYS: dict[str, str] = {"model": "model", "weights": "weights", "model_name": "model_name", "task": "task",
                             "task_name": "task_name", "prompts": "prompts", "n": "n", "seed": "seed"}
#: how a mismatch of each field reads
_WHAT = {"model": "model (fingerprint)", "weights": "weights (checksum)", "model_name": "model", "task":
         "prompts and metric (task fingerprint)", "task_name": "task", "prompts": "prompt set (token ids)", "n": "number of prompts", "seed": "seed"}


def model_fingerprint(model: Any) -> str:
    """Cheap identity of a model: its layer layout and a sample of every parameter (the first 64 entries and the
    rounded sum of each tensor)."""
    h = hashlib.sha256(repr([(i.kind, i.n_heads, i.d_head) for i in model.layers]).encode())
    _sample_parameters(h, getattr(model, "module", model))  # a bridge's wrapped HF model, else the model
    return h.hexdigest()[:16]


def module_fingerprint(module: Any) -> str:
    """The parameter sample of :func:`model_fingerprint` of a bare ``torch.nn.Module`` (no layer table): what an
    ``ActivationCache``'s ``model`` (the module that ran) can be compared by."""
    h = hashlib.sha256()
    _sample_parameters(h, module)
    return h.hexdigest()[:16]


def _sample_parameters(h: Any, module: Any) -> None:
    """Each parameter's name, first 64 entries and rounded sum into ``h``.  The sum is taken in float64, chunk by
    chunk: a float32 sum depends on the reduction order (device, thread count, layout) and, rounded to 4 decimals,
    changed between a CPU and a GPU, so a scan made on one was refused on the other."""
    for name, p in module.named_parameters():
        flat = p.detach().reshape(-1)
        h.update(name.encode())
        h.update(flat[:64].float().cpu().numpy().tobytes())
        total = 0.0
        for chunk in flat.split(1 << 22):
            chunk = chunk.cpu() if chunk.device.type == "mps" else chunk  # MPS has no float64
            total += float(chunk.double().sum())
        h.update(repr(round(total, 4)).encode())


def check_cache_owner(cache: Any, model: Any) -> None:
    """Refuse an ``ActivationCache`` that another model (other weights) made: read as ``model``'s, its activations
    would give that model's patterns.  A cache of ``model`` itself, or without a recorded maker, passes."""
    maker = getattr(cache, "model", None)
    own = getattr(model, "module", model)
    if maker is None or maker is model or maker is own or not hasattr(maker, "named_parameters"):
        return
    if module_fingerprint(maker) != module_fingerprint(own):
        raise ProvenanceError("this ActivationCache was made by another model (other weights); pass tokens, or the "
                              "cache of this model's run_with_cache(tokens)")


def weights_checksum(model: Any) -> str:
    """SHA-256 (16 hex digits) of every parameter and buffer: equal only for bit-equal weights."""
    return param_checksum(model)[:16]


def task_fingerprint(tokens: Any, metric: Any, extra: Mapping[str, Any]) -> str:
    """Identity of a scan's inputs: the token ids and their shape, the metric's name, and ``extra`` settings."""
    h = hashlib.sha256(tokens.detach().cpu().numpy().tobytes())
    h.update(str(tuple(tokens.shape)).encode())
    h.update(getattr(metric, "__qualname__", type(metric).__name__).encode())
    h.update(json.dumps(dict(extra), sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def prompts_fingerprint(tokens: Any) -> str:
    """Identity of a prompt set alone: its token ids and their shape (16 hex digits)."""
    h = hashlib.sha256(tokens.detach().cpu().long().numpy().tobytes())
    h.update(str(tuple(tokens.shape)).encode())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class Provenance:
    """Where a result came from (see the module's table); ``None`` fields are unknown and not compared."""

    model: str | None = None
    weights: str | None = None
    model_name: str | None = None
    task: str | None = None
    task_name: str | None = None
    prompts: str | None = None
    n: int | None = None
    seed: int | None = None

    @classmethod
    def of_model(cls, model: Any, *, weights: bool = False, **fields: Any) -> Provenance:
        """The provenance of a result made on ``model`` now (``weights=True`` adds the full checksum)."""
        return cls(model=model_fingerprint(model), weights=weights_checksum(model) if weights else None, **fields)

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any] | None) -> Provenance:
        """The fields a result's ``meta`` dict records (unknown keys are ignored)."""
        meta = meta or {}
        return cls(**{f: meta.get(k) for f, k in META_KEYS.items()})

    @classmethod
    def of(cls, result: Any) -> Provenance:
        """What ``result`` records: its ``provenance`` attribute, else the fields of its ``meta`` (none: all
        unknown)."""
        own = getattr(result, "provenance", None)
        return own if isinstance(own, Provenance) else cls.from_meta(getattr(result, "meta", None))

    def to_meta(self) -> dict[str, Any]:
        """The known fields, under their meta keys (merge into a result's ``meta``)."""
        return {META_KEYS[f]: v for f, v in dataclasses.asdict(self).items() if v is not None}

    def replace(self, **fields: Any) -> Provenance:
        return dataclasses.replace(self, **fields)

    def mismatches(self, other: Provenance) -> list[str]:
        """The fields set on both sides whose values differ."""
        mine, theirs = dataclasses.asdict(self), dataclasses.asdict(other)
        return [f for f in META_KEYS if mine[f] is not None and theirs[f] is not None and mine[f] != theirs[f]]

    def check(self, received: Provenance, *, what: str, fix: str) -> None:
        """Refuse ``received`` (the provenance of a result handed in as ``what``) where it differs from this, the
        provenance the receiver expects: a :class:`ProvenanceError` naming the first differing field and ``fix``."""
        bad = self.mismatches(received)
        if bad:
            f = bad[0]
            raise ProvenanceError(f"{what} was made with another {_WHAT[f]} ({getattr(received, f)!r}, here "
                                  f"{getattr(self, f)!r}); {fix}")
