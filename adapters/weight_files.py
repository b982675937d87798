"""Which files hold a checkpoint's weights, in HF's order of preference, and the refusal of Git LFS stubs.

Shared by the streaming reader (:mod:`.streaming`) and :func:`gather_aggregate.load_model`'s checks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gather_aggregate.core.errors import CheckpointError, ModelLoadError

_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
_SINGLES = ("model.safetensors", "pytorch_model.bin")
_FOREIGN = ("tf_model.h5", "flax_model.msgpack", "model.ckpt.index", "consolidated.00.pth", "model.gguf")


def refuse_lfs_pointers(files: list[Path], error: type[Exception] = CheckpointError) -> list[Path]:
    """``files``, unless one is a Git LFS pointer (a repository cloned without ``git lfs``: each weight file is a
    ~130-byte text stub).  Was "damaged or truncated" (or torch's advice to retry with ``weights_only=False``)."""
    for f in files:
        with open(f, "rb") as fh:
            if fh.read(40).startswith(b"version https://git-lfs"):
                raise error(f"{str(f)!r} is a Git LFS pointer, not the file itself (the repository was cloned "
                            "without its LFS files): run `git lfs pull` in it, or download the model with "
                            "`hf download ORG/NAME --local-dir DIR`")
    return files


def weight_files(directory: Path) -> tuple[list[Path], dict[str, Any]]:
    """The weight files of a directory (an index's shards) and the index's ``metadata``, in HF's order of
    preference: ``model.safetensors``, its index, ``pytorch_model.bin``, its index.  (Indexes first read a stale
    ``model.safetensors.index.json``, which ``save_pretrained`` leaves when a sharded model is re-saved whole: its
    missing shards were refused, or, still present, silently loaded instead of the newer file HF loads.)"""
    d = directory
    for single, index in zip(_SINGLES, _INDEXES):
        if (d / single).is_file():
            return refuse_lfs_pointers([d / single]), {}
        if (d / index).is_file():
            try:
                data = json.loads((d / index).read_text())
                shards = sorted(set(data["weight_map"].values()))
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise CheckpointError(f"{str(d / index)!r} is not a valid checkpoint index ({type(exc).__name__}: "
                                      f"{exc}); it needs a 'weight_map' of tensor name -> shard file") from None
            missing = [s for s in shards if not (d / s).is_file()]
            if missing:
                raise ModelLoadError(f"checkpoint shard(s) {', '.join(repr(str(d / s)) for s in missing)} listed in "
                                     f"{index} are missing; download them again")
            return refuse_lfs_pointers([d / s for s in shards]), dict(data.get("metadata") or {})
    foreign = [f for f in _FOREIGN if (d / f).is_file()]
    hint = (f" (found {', '.join(foreign)}: TF/Flax/GGUF/consolidated weights are not read; convert them to "
            "PyTorch with transformers and save_pretrained)" if foreign else "")
    raise ModelLoadError(
        f"no weights in {str(d)!r} (looked for model.safetensors, pytorch_model.bin and their .index.json){hint}; "
        "save the model with model.save_pretrained(dir) or torch.save(model.state_dict(), dir/'pytorch_model.bin')"
    )
