"""Do a model and a list of examples belong together?  Checks run before any forward.

Examples carry token ids, not text alone: ids from another model's tokenizer either fall outside the model's
vocabulary (torch's gather then raised a bare ``IndexError``) or, worse, fit it and are read as other words (a
silent wrong accuracy).  Every built-in and file task builds its examples with :func:`~.base.annotate`, so an
example's ``input_ids`` are its prompt tokenised by the tokenizer that built it: the model's tokenizer must give
the same ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gather_aggregate.core.errors import InputError
from gather_aggregate.tasks.base import Example, _encode


def check_vocab(examples: Sequence[Example], d_vocab: int | None) -> None:
    """Prompt and candidate ids inside the model's vocabulary ``[0, d_vocab)``."""
    if d_vocab is None:
        return
    for i, e in enumerate(examples):
        ids = [*e.input_ids, *(t for c in e.candidate_ids for t in c)]
        if ids and not 0 <= min(ids) <= max(ids) < d_vocab:
            raise InputError(f"example {i} has token ids up to {max(ids)} but the model's vocabulary has {d_vocab}; "
                             "build the examples with this model's tokenizer: task.examples(model.tokenizer, n=...)")


def check_tokenizer(examples: Sequence[Example], tokenizer: Any) -> None:
    """The first and last example's prompt, tokenised by ``tokenizer``, gives its ``input_ids``.  Skipped when the
    model has no tokenizer, or the tokenizer cannot encode (the evaluation itself then needs none)."""
    if tokenizer is None or not callable(tokenizer):
        return
    for i in sorted({0, len(examples) - 1}):
        e = examples[i]
        try:
            ids = list(_encode(tokenizer, e.prompt, offsets=False)["input_ids"])
        except Exception:  # noqa: BLE001 - a tokenizer that cannot encode text: nothing to compare
            return
        if ids != list(e.input_ids):
            _check_padding(i, ids, list(e.input_ids), tokenizer)
            raise InputError(f"example {i} was tokenised by another tokenizer than the model's: its prompt gives "
                             f"{len(ids)} tokens here, not its {len(e.input_ids)} ids; build the examples with this "
                             "model's tokenizer: task.examples(model.tokenizer, n=...)")


def _check_padding(i: int, ids: list[int], got: list[int], tokenizer: Any) -> None:
    """An example whose ids are its prompt's ids with padding before (a left-padded batch row) or after them is
    refused as such (not as another tokenizer's): the tools pad batches themselves, on the right."""
    from gather_aggregate.core.protocol import pad_id_of

    pad, extra = pad_id_of(tokenizer), len(got) - len(ids)
    if extra <= 0:
        return
    for side, body, rest in (("starts", got[extra:], got[:extra]), ("ends", got[:len(ids)], got[len(ids):])):
        if body == ids and all(t == pad for t in rest):
            raise InputError(f"example {i} {side} with {extra} padding tokens (a padded batch row); give each example "
                             "its own unpadded ids, as task.examples(model.tokenizer, n=...) builds them: batches "
                             "are padded when they run, on the right")


def check_fits(model: Any, examples: Sequence[Example]) -> None:
    """Both checks above for ``model``."""
    check_vocab(examples, getattr(model, "d_vocab", None))
    check_tokenizer(examples, getattr(model, "tokenizer", None))
