"""How much of a task the model's tokenizer cannot read: the share of unknown tokens.

A word-level tokenizer (the toy zoo's) maps every word outside its vocabulary
to ``<unk>``; MMLU's own questions then become strings of ``<unk>`` and any
accuracy measured on them means little.  For a token-id list ``t`` and the
tokenizer's ``unk_token_id`` ``u``::

    unknown_fraction = #{i : t_i = u} / len(t)

(over all prompts and answers of a task together).  Byte-level tokenizers have
no unknown token (``unk_token_id is None``): the fraction is 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from gather_aggregate.core.errors import UnknownTokenWarning, warn

#: warn when more than this share of a task's tokens are unknown
UNKNOWN_THRESHOLD = 0.05


def unk_id_of(tokenizer: Any) -> int | None:
    """The tokenizer's unknown-token id, or ``None`` when it has none."""
    unk = getattr(tokenizer, "unk_token_id", None)
    return int(unk) if unk is not None else None


def unknown_fraction(token_lists: Iterable[Sequence[int]], unk_id: int | None) -> tuple[float, int]:
    """``(share of unknown tokens, total tokens)`` over ``token_lists``."""
    total = unknown = 0
    for ids in token_lists:
        total += len(ids)
        if unk_id is not None:
            unknown += sum(1 for t in ids if t == unk_id)
    return (unknown / total if total else 0.0), total


def warn_if_unknown(task: str, token_lists: Iterable[Sequence[int]], tokenizer: Any, *,
                    threshold: float = UNKNOWN_THRESHOLD) -> float:
    """Warn (:class:`UnknownTokenWarning`) when more than ``threshold`` of ``task``'s tokens are unknown.

    Returns the fraction.
    """
    frac, total = unknown_fraction(token_lists, unk_id_of(tokenizer))
    if total and frac > threshold:
        warn(UnknownTokenWarning(
            f"task {task!r}: {frac:.0%} of its {total} tokens are unknown to the tokenizer "
            f"(> {threshold:.0%}); the model cannot read these prompts, so the accuracy says little. "
            "Use a task written in the model's vocabulary (e.g. the facts-based MMLU set for the zoo)"))
    return frac
