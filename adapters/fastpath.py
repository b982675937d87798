"""Optional mamba-ssm CUDA kernels for the scan (UNTESTED here: this machine has no GPU).

The hooked mixers compute every hooked tensor (x, Δ, B, C, y, ...) outside the
scan, so the only scan internal is the state, which fires only in
``scan_impl="sequential"``.  With ``scan_impl="auto"`` (the default) a layer
therefore uses mamba-ssm's ``selective_scan_fn`` (Mamba-1) or
``mamba_chunk_scan_combined`` (Mamba-2) when *all* of these hold:

* the tensors are on CUDA,
* ``mamba_ssm`` is importable (it is looked up, never imported at module import),
* nobody asked for the sequential reference.

Otherwise it runs our chunked pure-torch scan.  :func:`choose_scan_impl` holds
the whole decision and is tested on CPU; the kernel calls themselves have not
been run in this project's CI.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch
from torch import Tensor

from gather_aggregate.core.errors import InputError

_IMPLS = ("auto", "chunked", "sequential", "kernel")


def kernels_available() -> bool:
    """True when the ``mamba_ssm`` package can be found (without importing it)."""
    try:
        return importlib.util.find_spec("mamba_ssm") is not None
    except (ImportError, ValueError):  # pragma: no cover - broken installs
        return False


def choose_scan_impl(requested: str, *, device: Any, state_hooked: bool = False, family: str = "mamba1",
                     kernels: bool | None = None) -> str:
    """Which scan a layer runs: ``"kernel"``, ``"chunked"`` or ``"sequential"``.

    ``kernels`` overrides the availability probe (for tests).
    """
    if requested not in _IMPLS:
        raise InputError(f"scan_impl must be one of {_IMPLS}, got {requested!r}")
    if requested in ("chunked", "sequential"):
        return requested
    on_cuda = torch.device(device).type == "cuda"
    if not on_cuda and requested == "auto":
        return "chunked"  # no probe off CUDA
    have = kernels_available() if kernels is None else kernels
    usable = on_cuda and have and not state_hooked
    if requested == "kernel":
        if not usable:
            why = ("the model is not on CUDA" if not on_cuda else "mamba_ssm is not installed" if not have
                   else "hook_state is hooked (the kernel does not expose the state)")
            raise InputError(f"scan_impl='kernel' is unavailable: {why}; use scan_impl='auto' or 'chunked'")
        return "kernel"
    return "kernel" if usable else "chunked"


def mamba1_kernel_scan(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor) -> Tensor:
    """``selective_scan_fn`` on our ``[batch, pos, ...]`` layout (Δ already soft-plussed)."""
    from mamba_ssm.ops.selective_scan_interface import selective_scan_fn  # pragma: no cover

    y = selective_scan_fn(x.transpose(1, 2).contiguous(), dt.transpose(1, 2).contiguous(), A,
                          B.transpose(1, 2).contiguous(), C.transpose(1, 2).contiguous(), D=D,
                          delta_softplus=False)  # pragma: no cover
    return y.transpose(1, 2)  # pragma: no cover


def mamba2_kernel_scan(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor,
                       chunk: int = 256) -> Tensor:
    """``mamba_chunk_scan_combined`` on ``x [b, p, head, d_head]``, ``B/C [b, p, group, d_state]``."""
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined  # pragma: no cover

    return mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size=chunk, D=D, dt_softplus=False)  # pragma: no cover
