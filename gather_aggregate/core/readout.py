"""Metrics that read the logits at a few positions of each prompt.

Most scan metrics look at one position per prompt (the answer's).  A
:class:`ReadoutMetric` says which, so the exact scan and activation patching
can finish every edited forward at those positions only: the last layer's
after-mixer part (its MLP), the final norm and the unembedding work position
by position, and everything else they would compute is thrown away by the
metric.  Called on full logits it gives exactly what its function gives on the
selected rows, so a ``ReadoutMetric`` works wherever a plain
``metric(logits) -> scalar`` does.

    >>> m = ReadoutMetric(lambda la: la[:, 0, answer_id].mean(), positions=-1)   # last position
    >>> m = ReadoutMetric(fn, positions=batch.query_pos[:, None])                # one position per prompt
    >>> m = ReadoutMetric.mean_of(per_prompt, positions=-1)    # per_prompt(logits_at) -> [batch]; m is its mean

A metric built with :meth:`ReadoutMetric.mean_of` also gives one value per
prompt, so the exact scan can report each head's standard error over the
prompts (``stderr``) beside its drop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from gather_aggregate.core.errors import InputError


class ReadoutMetric:
    """``fn(logits_at) -> scalar`` over ``logits_at = logits[b, positions[b, j]]`` (``[batch, k, vocab]``).

    ``positions``: an int (the same position in every prompt; negative counts
    from the end), or an integer tensor ``[batch]`` / ``[batch, k]``.
    """

    #: ``per_prompt(logits_at) -> [batch]`` whose mean is the metric (set by :meth:`mean_of`), else None
    per_prompt: Callable[[Tensor], Tensor] | None = None

    def __init__(self, fn: Callable[[Tensor], Tensor], positions: int | Tensor) -> None:
        if not callable(fn):  # was accepted, then failed inside the first scan
            raise InputError(f"fn must be a function logits_at [batch, k, vocab] -> scalar, got {type(fn).__name__}")
        if isinstance(positions, (list, tuple)) or type(positions).__module__ == "numpy":  # lists, numpy ints/arrays
            try:
                positions = torch.as_tensor(positions)
            except (TypeError, ValueError, RuntimeError):
                raise InputError("readout positions must be an int or integers [batch] / [batch, k], got a "
                                 f"{type(positions).__name__} that is not a rectangle of integers") from None
        if isinstance(positions, Tensor) and positions.dim() == 0 and not positions.is_floating_point() \
                and positions.dtype != torch.bool:
            positions = int(positions)
        if isinstance(positions, Tensor):
            if positions.dtype == torch.bool:
                raise InputError("readout positions must be integers, got booleans; pass the positions themselves")
            if positions.is_floating_point() or positions.dim() not in (1, 2):
                raise InputError(f"readout positions must be an int or an integer tensor [batch] or [batch, k], "
                                 f"got {positions.dtype} of shape {tuple(positions.shape)}")
            positions = positions.long().reshape(positions.shape[0], -1)
        elif not isinstance(positions, int) or isinstance(positions, bool):
            raise InputError(f"readout positions must be an int or an integer tensor, got {type(positions).__name__}")
        self.fn = fn
        self.positions = positions
        self.__qualname__ = f"ReadoutMetric.{getattr(fn, '__qualname__', type(fn).__name__)}"

    @classmethod
    def mean_of(cls, per_prompt: Callable[[Tensor], Tensor], positions: int | Tensor) -> ReadoutMetric:
        """The mean over prompts of ``per_prompt(logits_at) -> [batch]``, which it also keeps, so scans can say
        how much a head's drop varies from prompt to prompt."""
        if not callable(per_prompt):
            raise InputError(f"per_prompt must be a function logits_at -> [batch] values, got "
                             f"{type(per_prompt).__name__}")

        def mean(logits_at: Tensor) -> Tensor:
            return per_prompt(logits_at).mean()

        mean.__qualname__ = getattr(per_prompt, "__qualname__", type(per_prompt).__name__)
        metric = cls(mean, positions)
        metric.per_prompt = per_prompt
        return metric

    def evaluate_at(self, logits_at: Float[Tensor, "batch k vocab"]) -> tuple[Any, Tensor | None]:
        """The metric on logits taken at the readout positions, and its values per prompt (float64 ``[batch]``)
        for a metric built with :meth:`mean_of` (else None): one call of ``per_prompt`` gives both."""
        if self.per_prompt is None:
            return self.fn(logits_at), None
        v = self.per_prompt(logits_at)
        if not isinstance(v, Tensor) or tuple(v.shape) != (logits_at.shape[0],):
            got = tuple(v.shape) if isinstance(v, Tensor) else type(v).__name__
            raise InputError(f"per_prompt must return one value per prompt, shape ({logits_at.shape[0]},), got "
                             f"{got}; reduce over the readout positions inside it")
        return v.mean(), v.detach().double()

    def index(self, batch: int, n_pos: int, copies: int = 1) -> Int[Tensor, "rows k"]:
        """Positions ``[copies * batch, k]`` (non-negative), for ``copies`` stacked copies of the batch."""
        if isinstance(self.positions, int):
            pos = torch.full((batch, 1), self.positions, dtype=torch.long)
        else:
            pos = self.positions
            if pos.shape[0] != batch:
                raise InputError(f"the metric reads positions for {pos.shape[0]} prompts but the batch has {batch}")
        if bool(((pos >= n_pos) | (pos < -n_pos)).any()):
            raise InputError(f"a readout position is out of range for prompts of {n_pos} tokens")
        return (pos % n_pos).repeat(copies, 1)

    def select(self, x: Float[Tensor, "batch pos *d"], copies: int = 1) -> Float[Tensor, "batch k *d"]:
        """The readout rows of ``x`` (``copies`` stacked copies of the batch along dim 0)."""
        idx = self.index(x.shape[0] // copies, x.shape[1], copies).to(x.device)
        return x[torch.arange(x.shape[0], device=x.device)[:, None], idx]

    def at_readout(self, logits_at: Float[Tensor, "batch k vocab"]) -> Any:
        """The metric on logits already taken at the readout positions."""
        return self.fn(logits_at)

    def __call__(self, logits: Float[Tensor, "batch pos vocab"]) -> Any:
        return self.fn(self.select(logits))
