"""Streaming checkpoint reader with HF's loading semantics (``checkpoint.py`` builds on it).

A checkpoint directory is opened as a :class:`Checkpoint`: a read-only mapping
``key -> tensor reference`` that holds no tensor data.  Each reference knows its
shape and stored dtype and copies itself, on request, straight into a
destination tensor of any dtype on any device (:meth:`StoredTensor.copy_into`).
:func:`materialize` builds every parameter of a model made on the meta device
that way, one parameter at a time, so a load allocates each parameter once, in
its final dtype and on its final device. There is no full fp32 copy and no
second copy of the model.

Reading:

* **safetensors**: the header is parsed here (``u64`` little-endian length,
  then JSON ``{name: {dtype, shape, data_offsets}, "__metadata__": {...}}``) and
  checked against the file size, so a truncated or damaged shard fails up front
  with a :class:`CheckpointError` that names the file. Tensor bytes are read with
  ``readinto`` into the destination (same dtype, on the CPU) or through a chunk
  buffer of at most ``_CHUNK_BYTES`` (dtype change or another device). Nothing is
  memory-mapped, so the page cache never counts against the process.
* **pytorch_model.bin** (zip format): ``torch.load(mmap=True, weights_only=True)``;
  after copying a tensor, its pages are dropped from the process
  (``madvise(MADV_DONTNEED)`` on Linux) so the mapping does not pile up.

HF semantics (``transformers`` 5.x ``from_pretrained``) implemented here and
tested against HF in ``tests/test_checkpoint_semantics.py``:

* ``dtype="auto"`` (HF's default): the config's ``dtype`` / ``torch_dtype``, else
  the index's ``metadata.dtype``, else the first floating tensor's dtype
  (:func:`resolve_dtype`).
* tying (:func:`apply_tying`): with ``tie_word_embeddings=True`` a stored
  ``lm_head`` that differs from the embedding *unties* them; an embedding that is
  missing while ``lm_head`` is stored takes ``lm_head``'s values.
* file-level safetensors metadata is not interpreted (HF 5.x ignores it), the
  index's ``weight_map`` names the shards.
* missing and unexpected keys are classified as HF does, but raise a
  :class:`CheckpointError` listing them instead of initialising weights at
  random (HF warns and random-initialises; an interpretability result on random
  weights is worse than an error).
"""

from __future__ import annotations

import contextlib
import json
import math
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TypeAlias

import torch
from torch import Tensor, nn

from gather_aggregate.adapters.weight_files import weight_files
from gather_aggregate.core.errors import CheckpointError, InputError, ModelLoadError

_CHUNK_BYTES = 64 * 1024**2
_ST_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}


# ----------------------------------------------------------------------------- references
class StoredTensor:
    """One tensor of a checkpoint file, read only when :meth:`copy_into` / :meth:`load` is called."""

    __slots__ = ("file", "key", "shape", "dtype", "_reader")

    def __init__(self, file: Path, key: str, shape: tuple[int, ...], dtype: torch.dtype, reader: Any) -> None:
        self.file, self.key, self.shape, self.dtype, self._reader = file, key, tuple(shape), dtype, reader

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def copy_into(self, dest: Tensor) -> None:
        """Write this tensor into ``dest`` (same number of elements, contiguous, any dtype/device)."""
        if dest.numel() != self.numel or not dest.is_contiguous():
            raise InputError(f"cannot copy {self.key} {self.shape} into a tensor of shape {tuple(dest.shape)}")
        self._reader.copy_into(self, dest)

    def load(self, dtype: torch.dtype | None = None, device: Any = None) -> Tensor:
        out = torch.empty(self.shape, dtype=dtype or self.dtype, device=device or "cpu")
        self.copy_into(out)
        return out

    def __repr__(self) -> str:
        return f"StoredTensor({self.key!r}, {self.shape}, {self.dtype}, {self.file.name})"


class StackedTensor:
    """``stack([cat(parts_0), cat(parts_1), ...])`` along dims 0, built lazily (fused MoE experts)."""

    def __init__(self, rows: list[list[Any]]) -> None:
        self.rows = rows
        first = rows[0]
        inner = (sum(p.shape[0] for p in first), *first[0].shape[1:])
        self.shape = (len(rows), *inner)
        self.dtype = first[0].dtype

    def copy_into(self, dest: Tensor) -> None:
        dest = dest.view(self.shape)
        for e, parts in enumerate(self.rows):
            at = 0
            for p in parts:
                copy_source(p, dest[e, at: at + p.shape[0]])
                at += p.shape[0]

    def load(self, dtype: torch.dtype | None = None, device: Any = None) -> Tensor:
        out = torch.empty(self.shape, dtype=dtype or self.dtype, device=device or "cpu")
        self.copy_into(out)
        return out


#: A tensor as the converters pass it on: in memory, or a checkpoint reference read only when copied.  Code that
#: needs the values calls :func:`load_source` (mypy flags a tensor method called on a reference).
TensorSource: TypeAlias = "Tensor | StoredTensor | StackedTensor"


def copy_source(src: Any, dest: Tensor) -> None:
    """Copy a :class:`StoredTensor`, :class:`StackedTensor` or in-memory tensor into ``dest``."""
    if isinstance(src, Tensor):
        with torch.no_grad():
            dest.copy_(src.detach().reshape(dest.shape))
    else:
        src.copy_into(dest)


def load_source(src: TensorSource, dtype: torch.dtype | None = None) -> Tensor:
    """A CPU tensor holding ``src`` (a reference is read; a tensor is returned as it is)."""
    return src if isinstance(src, Tensor) else src.load(dtype)


def tensors_equal(a: Any, b: Any) -> bool:
    """``torch.equal`` for tensors or references, compared a block of rows at a time (no full second copy)."""
    if tuple(a.shape) != tuple(b.shape):
        return False
    if isinstance(a, Tensor) and isinstance(b, Tensor):
        return torch.equal(a, b)
    if not a.shape:
        return torch.equal(load_source(a), load_source(b))
    if isinstance(a, StoredTensor) and isinstance(b, StoredTensor) and a._reader is b._reader \
            and hasattr(a._reader, "same_storage") and a._reader.same_storage(a, b):
        return True
    rows = max(1, _CHUNK_BYTES // max(1, 4 * math.prod(a.shape[1:])))
    for start in range(0, a.shape[0], rows):
        stop = min(a.shape[0], start + rows)
        if not torch.equal(_rows(a, start, stop), _rows(b, start, stop)):
            return False
    return True


def _rows(x: Any, start: int, stop: int) -> Tensor:
    if isinstance(x, Tensor):
        return x[start:stop]
    if isinstance(x, StoredTensor):
        part = torch.empty((stop - start, *x.shape[1:]), dtype=x.dtype)
        x._reader.copy_rows(x, start, stop, part)
        return part
    return x.load()[start:stop]


# ----------------------------------------------------------------------------- readers
class _SafetensorsReader:
    """Header parsed and checked here; bytes read with ``readinto`` (no mmap)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tensors: dict[str, tuple[tuple[int, ...], torch.dtype, int, int]] = {}
        self.metadata: dict[str, str] = {}
        size = path.stat().st_size
        try:
            with open(path, "rb") as fh:
                head = fh.read(8)
                if len(head) < 8:
                    raise ValueError("shorter than the 8-byte header length")
                (n,) = struct.unpack("<Q", head)
                if n > min(size - 8, 100 * 1024**2):
                    raise ValueError(f"header length {n} exceeds the file")
                header = json.loads(fh.read(n))
            if not isinstance(header, dict):
                raise ValueError("header is not a JSON object")
            self.metadata = dict(header.pop("__metadata__", None) or {})
            data_start, end = 8 + n, 0
            for key, info in header.items():
                dtype = _ST_DTYPES.get(info.get("dtype"))
                if dtype is None:
                    raise ValueError(f"tensor {key!r} has unknown dtype {info.get('dtype')!r}")
                shape = tuple(int(s) for s in info["shape"])
                begin, stop = (int(o) for o in info["data_offsets"])
                if stop - begin != math.prod(shape) * dtype.itemsize or begin < 0:
                    raise ValueError(f"tensor {key!r}: offsets {begin}..{stop} do not fit shape {shape} {info['dtype']}")
                self.tensors[key] = (shape, dtype, data_start + begin, stop - begin)
                end = max(end, stop)
            if data_start + end > size:
                raise ValueError(f"the header needs {data_start + end} bytes but the file has {size} (truncated?)")
        except (ValueError, KeyError, TypeError, struct.error, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{str(path)!r} is not a valid safetensors file ({exc}); the shard is damaged "
                                  "or truncated: download it again") from None

    def refs(self) -> Iterator[StoredTensor]:
        for key, (shape, dtype, _, _) in self.tensors.items():
            yield StoredTensor(self.path, key, shape, dtype, self)

    def copy_rows(self, ref: StoredTensor, start: int, stop: int, dest: Tensor) -> None:
        shape, dtype, offset, _ = self.tensors[ref.key]
        row = math.prod(shape[1:]) * dtype.itemsize
        self._read(offset + start * row, (stop - start) * row, dtype, dest.reshape(-1))

    def copy_into(self, ref: StoredTensor, dest: Tensor) -> None:
        _, dtype, offset, nbytes = self.tensors[ref.key]
        self._read(offset, nbytes, dtype, dest.reshape(-1))

    def _read(self, offset: int, nbytes: int, dtype: torch.dtype, flat: Tensor) -> None:
        with open(self.path, "rb", buffering=0) as fh:
            fh.seek(offset)
            if flat.device.type == "cpu" and flat.dtype == dtype:
                _readinto(fh, flat.view(torch.uint8).numpy(), self.path)
                return
            per = max(1, _CHUNK_BYTES // dtype.itemsize)
            buf = torch.empty(min(per, flat.numel()), dtype=dtype)
            for start in range(0, flat.numel(), per):
                n = min(per, flat.numel() - start)
                _readinto(fh, buf[:n].view(torch.uint8).numpy(), self.path)
                flat[start: start + n].copy_(buf[:n])


def _readinto(fh: Any, array: Any, path: Path) -> None:
    view, got = memoryview(array).cast("B"), 0
    while got < len(view):
        n = fh.readinto(view[got:])
        if not n:
            raise CheckpointError(f"{str(path)!r} ended early while reading tensor data; the shard is truncated: "
                                  "download it again")
        got += n


class _BinReader:
    """``pytorch_model.bin``: memory-mapped ``torch.load``; copied pages are released after each tensor."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc):
                raise CheckpointError(f"{str(path)!r} is not a readable PyTorch checkpoint ({_first_line(exc)}); "
                                      "the shard is damaged or truncated: download it again") from None
            state = _load_bin(path)  # legacy (non-zip) torch.save format cannot be memory-mapped
        except Exception as exc:  # noqa: BLE001 - pickle, zip and EOF errors of a damaged file
            raise CheckpointError(f"{str(path)!r} is not a readable PyTorch checkpoint ({_first_line(exc)}); "
                                  "the shard is damaged or truncated: download it again") from None
        if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
            state = state["state_dict"]
        if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
            raise CheckpointError(f"{str(path)!r} does not hold a state dict of tensors; save it with "
                                  "torch.save(model.state_dict(), path)")
        self.state: dict[str, Tensor] = state
        self.metadata: dict[str, str] = {}

    def refs(self) -> Iterator[StoredTensor]:
        for key, t in self.state.items():
            yield StoredTensor(self.path, key, tuple(t.shape), t.dtype, self)

    def copy_rows(self, ref: StoredTensor, start: int, stop: int, dest: Tensor) -> None:
        src = self.state[ref.key][start:stop]
        dest.copy_(src)
        _release(src)

    def copy_into(self, ref: StoredTensor, dest: Tensor) -> None:
        """Copy a block of rows at a time, releasing each block's pages, so the mapping never piles up."""
        src = self.state[ref.key].reshape(-1)
        flat = dest.reshape(-1)
        step = max(1, _CHUNK_BYTES // src.element_size())
        with torch.no_grad():
            for start in range(0, src.numel(), step):
                part = src[start: start + step]
                flat[start: start + step].copy_(part)
                _release(part)

    def same_storage(self, a: StoredTensor, b: StoredTensor) -> bool:
        """Two names of one saved tensor (``torch.save`` keeps tied weights once)."""
        x, y = self.state[a.key], self.state[b.key]
        return x.data_ptr() == y.data_ptr() and x.shape == y.shape and x.stride() == y.stride()


def _load_bin(path: Path) -> Any:
    try:
        return torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001
        raise CheckpointError(f"{str(path)!r} is not a readable PyTorch checkpoint ({_first_line(exc)}); "
                              "the shard is damaged or truncated: download it again") from None


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]


def _release(t: Tensor) -> None:
    """Drop the (clean, file-backed) pages of a memory-mapped tensor from this process."""
    try:
        import ctypes
        import mmap

        libc = ctypes.CDLL(None)
        page = mmap.PAGESIZE
        start = t.data_ptr() // page * page
        end = t.data_ptr() + t.numel() * t.element_size()
        libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), 4)  # MADV_DONTNEED
    except (OSError, AttributeError):  # pragma: no cover - not Linux: the pages stay until unmapped
        pass


# ----------------------------------------------------------------------------- checkpoint
class Checkpoint(Mapping[str, StoredTensor]):
    """A checkpoint directory as ``{key: StoredTensor}``; tensors are read only when copied."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.files, self.index_metadata = weight_files(self.directory)
        self._refs: dict[str, StoredTensor] = {}
        self.file_metadata: dict[str, str] = {}
        for i, f in enumerate(self.files):
            reader = _SafetensorsReader(f) if f.suffix == ".safetensors" else _BinReader(f)
            if i == 0:
                self.file_metadata = reader.metadata
            for ref in reader.refs():
                self._refs.setdefault(ref.key, ref)

    def __getitem__(self, key: str) -> StoredTensor:
        return self._refs[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._refs)

    def __len__(self) -> int:
        return len(self._refs)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: r.shape for k, r in self._refs.items()}

    def add_base_prefix(self, prefix: str) -> Checkpoint:
        """HF's rule for a checkpoint saved from the base model (``Mamba2Model``: ``layers.0...``, no ``backbone.``):
        its keys get the causal LM's ``prefix`` (the head, ``lm_head.*``, keeps its name).  Was: every key
        "missing" where HF loads the model.  A checkpoint with any key under ``prefix`` is left as it is."""
        dot = prefix + "."
        if any(k.startswith(dot) for k in self._refs) or not any(k.startswith("layers.") for k in self._refs):
            return self
        self._refs = {(k if k.startswith("lm_head.") else dot + k): r for k, r in self._refs.items()}
        return self

    def float_dtype(self) -> torch.dtype | None:
        """The dtype of the first floating tensor (HF's fallback for ``dtype="auto"``)."""
        return next((r.dtype for r in self._refs.values() if r.dtype.is_floating_point), None)


# ----------------------------------------------------------------------------- HF rules
def config_dtype(config: Any) -> torch.dtype | None:
    """``dtype`` / ``torch_dtype`` of an HF config object or a raw config dict, as a ``torch.dtype``."""
    get = config.get if isinstance(config, dict) else (lambda k: getattr(config, k, None))
    value = get("dtype") or get("torch_dtype")
    if value is None or isinstance(value, torch.dtype):
        return value
    name = str(value).replace("torch.", "")
    return getattr(torch, name) if isinstance(getattr(torch, name, None), torch.dtype) else None


_DTYPE_NAMES = {"float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
                "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
                "float16": torch.float16, "fp16": torch.float16, "half": torch.float16}


def parse_dtype(dtype: Any) -> Any:
    """``None``, ``"auto"``, a ``torch.dtype`` or a name such as ``"float32"``/``"bf16"``."""
    if isinstance(dtype, torch.dtype) and not dtype.is_floating_point:  # HF's refusal read as a damaged file
        raise ModelLoadError(f"dtype={dtype} is not a floating-point dtype; weights load as 'auto' or one of "
                             f"{sorted(_DTYPE_NAMES)}")
    if dtype is None or dtype == "auto" or isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _DTYPE_NAMES[str(dtype).lower().replace("torch.", "")]
    except KeyError:
        raise ModelLoadError(f"unknown dtype {dtype!r}; use 'auto' or one of {sorted(_DTYPE_NAMES)}") from None


def resolve_dtype(requested: Any, config: Any, checkpoint: Mapping[str, Any] | None) -> torch.dtype:
    """HF's dtype rule: a given dtype wins; ``"auto"``/``None``: config, index metadata, then the weights."""
    if requested is not None and requested != "auto":
        return parse_dtype(requested)
    found = config_dtype(config) if config is not None else None
    if found is None and isinstance(checkpoint, Checkpoint):
        meta = checkpoint.index_metadata.get("dtype")
        found = parse_dtype(meta) if meta else checkpoint.float_dtype()
    elif found is None and checkpoint is not None:
        found = next((v.dtype for v in checkpoint.values() if v.dtype.is_floating_point), None)
    return found or torch.float32


def apply_tying(state: Mapping[str, Any], tie: bool, embed_keys: tuple[str, ...],
                head_key: str = "lm_head.weight") -> tuple[Mapping[str, Any], bool]:
    """HF's symmetric tying: returns the (possibly renamed) state and whether to tie.

    * ``tie`` and both stored: tie only if they are equal (HF warns and unties otherwise);
    * ``tie``, the embedding missing, ``lm_head`` stored: the embedding takes ``lm_head``;
    * otherwise unchanged.
    """
    if not tie or head_key not in state:
        return state, tie
    embed = next((k for k in embed_keys if k in state), None)
    if embed is None:
        out = {k: v for k, v in state.items() if k != head_key}
        out[embed_keys[0]] = state[head_key]
        return out, True
    return state, tensors_equal(state[embed], state[head_key])


# ----------------------------------------------------------------------------- materialise
_INIT_FUNCS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
               "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_")


@contextlib.contextmanager
def meta_init() -> Iterator[None]:
    """Build modules on the meta device without running their random initialisers (they are overwritten
    by the checkpoint; on meta tensors the initialisers only cost time, ~10 s of first-call dispatch here)."""
    saved = {name: getattr(nn.init, name) for name in _INIT_FUNCS}
    try:
        for name in _INIT_FUNCS:
            setattr(nn.init, name, lambda tensor, *args, **kwargs: tensor)
        with torch.device("meta"):
            yield
    finally:
        for name, fn in saved.items():
            setattr(nn.init, name, fn)


def materialize(model: nn.Module, sources: Mapping[str, Any], *, dtype: torch.dtype,
                device: Any = None, placement: Mapping[str, Any] | None = None) -> nn.Module:
    """Replace every meta parameter of ``model`` by a tensor in ``dtype`` filled from ``sources``.

    One parameter at a time: ``torch.empty`` on its device, then the source is copied in
    (read from disk for references). ``placement`` maps parameter names to devices
    (from :func:`gather_aggregate.adapters.placement.plan`); else every parameter goes to ``device``.
    Shared parameters (tied modules) are materialised once, under their first name.
    """
    for name, p in list(model.named_parameters()):
        where = placement[name] if placement is not None else (device or "cpu")
        t = torch.empty(p.shape, dtype=dtype if p.is_floating_point() else p.dtype, device=where)
        copy_source(sources[name], t)
        owner, _, attr = name.rpartition(".")
        model.get_submodule(owner)._parameters[attr] = nn.Parameter(t, requires_grad=p.requires_grad)
    left = [n for n, b in model.named_buffers() if b.is_meta] + [n for n, q in model.named_parameters() if q.is_meta]
    if left:  # pragma: no cover - every model here has its parameters in the state dict and no buffers
        raise CheckpointError(f"tensors left unloaded: {', '.join(left[:8])}")
    model.setup()
    return model.eval()


__all__ = ["parse_dtype", "meta_init", "Checkpoint", "StoredTensor", "StackedTensor", "TensorSource", "materialize", "resolve_dtype", "apply_tying",
           "tensors_equal", "copy_source", "config_dtype"]
