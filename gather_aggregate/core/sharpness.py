"""Sharpness metrics of attention rows.

All metrics work on the per-row normalised magnitude ``p = |a| / Σ_k |a|``
(:func:`gather_aggregate.core.protocol.normalize_rows`).  For a softmax row that is
the row itself; SSM-implied attention is signed and unnormalised, so its raw
values are not a distribution and are normalised first.  Pass raw patterns:
every function normalises (idempotent for softmax rows).

Half-precision rows (bf16/fp16, e.g. a pattern cached from a bf16 model on a GPU) are measured in float32,
and the result is float32: a bf16 sum over a few hundred keys is off by ~1e-2, and fp16 rounds the clamps
below (1e-30, 1e-12) to 0, turning empty keys into NaN.

* ``row_entropy``   H(p) = -Σ_k p_k log p_k (nats);
* ``top1_mass``     max_k p_k;
* ``sharpness_index``  1 - H(p) / log(n_k), where n_k is the number of keys the
  row can see (``query + 1`` for a causal row): 1 for a one-hot row, 0 for a
  uniform one.  It lets rows of different lengths be compared.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from gather_aggregate.core.errors import InputError
from gather_aggregate.core.indices import is_index
from gather_aggregate.core.protocol import normalize_rows


def _at_least_fp32(pattern: Tensor) -> Tensor:
    if not isinstance(pattern, torch.Tensor):  # a list or numpy row: was "'list' object has no attribute 'dtype'"
        pattern = torch.as_tensor(pattern, dtype=torch.float32)
    return pattern.float() if pattern.dtype in (torch.float16, torch.bfloat16) else pattern


def row_entropy(pattern: Float[Tensor, "... key"]) -> Float[Tensor, "..."]:
    """Entropy in nats of each normalised row."""
    p = normalize_rows(_at_least_fp32(pattern))
    return -(p * torch.log(p.clamp_min(1e-30))).sum(-1)


def top1_mass(pattern: Float[Tensor, "... key"]) -> Float[Tensor, "..."]:
    """Largest share of a normalised row."""
    return normalize_rows(_at_least_fp32(pattern)).max(-1).values


def sharpness_index(pattern: Float[Tensor, "... key"], n_keys: Tensor | int | None = None) -> Float[Tensor, "..."]:
    """``1 - H/log(n_keys)``; ``n_keys`` defaults to the number of non-zero keys of each row (a tensor
    ``n_keys`` may live on another device than ``pattern``: it is moved to it)."""
    pattern = _at_least_fp32(pattern)
    if n_keys is None:
        n = (pattern != 0).sum(-1).clamp_min(1).to(pattern.dtype)
    elif not isinstance(n_keys, torch.Tensor):  # 6.0 was "'float' object has no attribute 'to'"; 0 gave 1.0
        if not is_index(n_keys) or int(n_keys) < 1:
            raise InputError(f"n_keys={n_keys!r}: pass the number of keys the row can see (a positive int)")
        n = torch.full(pattern.shape[:-1], float(n_keys), dtype=pattern.dtype, device=pattern.device)
    else:
        n = n_keys.to(device=pattern.device, dtype=pattern.dtype).expand(pattern.shape[:-1])
    log_n = torch.log(n)
    h = row_entropy(pattern)
    out = 1.0 - h / log_n.clamp_min(1e-12)
    return torch.where(n <= 1, torch.ones_like(out), out)
