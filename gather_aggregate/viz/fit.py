"""Make long prompts fit an attention view: crop to a window, select positions, or downsample.

A browser can draw a 96×96 pattern per head comfortably; a 2k-token prompt
(4M cells per head) it cannot.  Three ways to shrink, each leaving a note that
the view shows:

* ``crop``: keep a contiguous window ``[start, stop)`` of positions (default:
  the last ``max_tokens``, which keeps the final query row).  Keys outside the
  window are dropped, so rows no longer sum to 1.
* ``select``: keep an explicit list of positions (e.g. the segment summary
  tokens and the query), in prompt order.
* ``downsample``: split the prompt into ``m = ceil(L / max_tokens)``-token bins;
  row ``i`` of the small pattern is the real row of bin ``i``'s *last* token,
  with its keys *summed* per bin,

      P'[i, j] = sum_{k in bin j} P[last(i), k].

  Every shown row is an exact row of the prompt with its total kept (softmax
  rows still sum to 1, a sharp head's single key stays one sharp cell), and the
  final token's row, the one Aggregate heads act on, is always shown.  (Averaging
  the queries of a bin instead would blur exactly that row.)

``fit_pattern(..., mode="auto")`` uses ``select`` when positions are given,
``crop`` when a window is given, and ``downsample`` otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from jaxtyping import Float
from torch import Tensor

from gather_aggregate.core.errors import IndexOutOfRangeError, InputError

FitMode = Literal["auto", "crop", "select", "downsample", "none"]


@dataclass(frozen=True)
class FittedPattern:
    """A pattern small enough to draw, with what was done to it."""

    pattern: Float[Tensor, "head query key"]
    tokens: list[str]
    #: for each shown position, the ``[start, stop)`` span of prompt positions it stands for
    spans: list[tuple[int, int]]
    note: str | None


def short_label(tokens: Sequence[str], width: int = 14) -> str:
    """One label for a run of tokens: ``first…last``, clipped to ``width`` characters."""
    if len(tokens) == 1:
        text = tokens[0]
    else:
        text = f"{tokens[0]}…{tokens[-1]}"
    return text if len(text) <= width else text[: width - 1] + "…"


def fit_pattern(
    pattern: Float[Tensor, "head query key"],
    tokens: Sequence[str],
    *,
    max_tokens: int = 96,
    mode: FitMode = "auto",
    window: tuple[int, int] | None = None,
    positions: Sequence[int] | None = None,
) -> FittedPattern:
    """Shrink a square ``[head, query, key]`` pattern (and its tokens) to at most ``max_tokens`` positions."""
    n = pattern.shape[-1]
    if pattern.shape[-2] != n:
        raise InputError(f"fit_pattern needs a square [head, query, key] pattern, got {tuple(pattern.shape)}")
    if max_tokens < 2:
        raise InputError(f"max_tokens must be at least 2, got {max_tokens}")
    if mode == "auto":
        mode = "select" if positions is not None else "crop" if window is not None else "downsample"
    if mode == "none" or (mode == "downsample" and n <= max_tokens):
        return FittedPattern(pattern, list(tokens), [(i, i + 1) for i in range(n)], None)
    if mode == "crop":
        return _crop(pattern, tokens, window if window is not None else (max(0, n - max_tokens), n), max_tokens)
    if mode == "select":
        if positions is None:
            raise InputError("mode='select' needs positions=[...] (the prompt positions to keep)")
        return _select(pattern, tokens, positions, max_tokens)
    if mode == "downsample":
        return _downsample(pattern, tokens, max_tokens)
    raise InputError(f"mode must be 'auto', 'crop', 'select', 'downsample' or 'none', got {mode!r}")


def _crop(pattern: Tensor, tokens: Sequence[str], window: tuple[int, int], max_tokens: int) -> FittedPattern:
    n = pattern.shape[-1]
    start, stop = (int(w) for w in window)
    start, stop = (start + n if start < 0 else start), (stop + n if stop < 0 else stop)
    if not 0 <= start < stop <= n:
        raise IndexOutOfRangeError(
            f"window {tuple(window)} is not a non-empty range inside the {n}-token prompt; pass (start, stop) "
            f"with 0 <= start < stop <= {n}"
        )
    if stop - start > max_tokens:
        raise InputError(
            f"window {tuple(window)} has {stop - start} positions, more than max_tokens={max_tokens}; "
            "narrow the window or raise max_tokens"
        )
    note = None
    if (start, stop) != (0, n):
        note = (f"Cropped: positions {start}–{stop - 1} of a {n}-token prompt; keys outside the window are "
                "not shown, so rows need not sum to 1.")
    return FittedPattern(pattern[..., start:stop, start:stop], list(tokens[start:stop]),
                         [(i, i + 1) for i in range(start, stop)], note)


def _select(pattern: Tensor, tokens: Sequence[str], positions: Sequence[int], max_tokens: int) -> FittedPattern:
    n = pattern.shape[-1]
    pos = sorted({int(p) + n if int(p) < 0 else int(p) for p in positions})
    bad = [p for p in pos if not 0 <= p < n]
    if not pos or bad:
        raise IndexOutOfRangeError(
            f"positions must be a non-empty list of indices into the {n}-token prompt; out of range: {bad}"
        )
    if len(pos) > max_tokens:
        raise InputError(f"{len(pos)} positions selected but max_tokens={max_tokens}; select fewer or raise max_tokens")
    idx = torch.tensor(pos, device=pattern.device)
    sub = pattern.index_select(-2, idx).index_select(-1, idx)
    note = (f"Selected {len(pos)} of {n} positions ({', '.join(map(str, pos[:12]))}{', …' if len(pos) > 12 else ''}); "
            "other keys are not shown, so rows need not sum to 1.")
    return FittedPattern(sub, [tokens[p] for p in pos], [(p, p + 1) for p in pos], note)


def _downsample(pattern: Tensor, tokens: Sequence[str], max_tokens: int) -> FittedPattern:
    n = pattern.shape[-1]
    m = math.ceil(n / max_tokens)  # tokens per bin
    n_bins = math.ceil(n / m)
    pad = n_bins * m - n
    spans = [(b * m, min(n, (b + 1) * m)) for b in range(n_bins)]
    last = torch.tensor([b - 1 for _, b in spans], device=pattern.device)
    rows = pattern.float().index_select(-2, last)  # [..., n_bins, n]: the row of each bin's last token
    rows = torch.nn.functional.pad(rows, (0, pad))
    p = rows.reshape(*rows.shape[:-1], n_bins, m).sum(-1)  # keys summed per bin
    labels = [short_label(tokens[a:b]) for a, b in spans]
    note = (f"Downsampled: the {n}-token prompt is shown as {n_bins} bins of {m} tokens; each row is the row of "
            f"its bin's last token with keys summed per bin, so row totals are kept and the final row is exact.")
    return FittedPattern(p.to(pattern.dtype), labels, spans, note)
