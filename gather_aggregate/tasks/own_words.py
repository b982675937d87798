"""Word lists for the built-in KV / MQAR tasks written in a model's own vocabulary (``--vocab``).

A checkpoint with its own tokenizer may not know the shipped keys (``flute`` → ``<unk>``).  ``--vocab auto``
draws the keys and values from the tokenizer itself: words it writes as one known token wherever the task puts
them (at a line start, after ``:`` and in the question), numbers first for the values; ``--vocab FILE.json``
reads ``{"keys": [...], "values": [...]}``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gather_aggregate.core.errors import TaskError


def _one_token(tokenizer: Any, word: str, unk: int | None) -> bool:
    """Whether ``word`` is one known token in the places the KV format puts it."""
    for text, before in ((f"\n{word}:", "\n"), (f":{word}\n", ":"), (f"'{word}'", "'")):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        base = tokenizer(before, add_special_tokens=False)["input_ids"]
        if unk is not None and unk in ids:
            return False
        if len(ids) - len(base) - 1 > 1:  # more than the word and the punctuation after it
            return False
    return True


def tokenizer_words(tokenizer: Any, *, limit: int = 400) -> dict[str, list[str]]:
    """``{"keys", "values"}`` drawn from ``tokenizer``'s vocabulary (sorted, so the same tokenizer gives the same
    lists): keys are alphabetic words, values numbers (else further words, disjoint from the keys)."""
    unk = getattr(tokenizer, "unk_token_id", None)
    special = set(getattr(tokenizer, "all_special_tokens", []))
    words = sorted({t.lstrip("Ġ▁ ") for t in tokenizer.get_vocab() if t not in special})
    words = [w for w in words if w and w.isascii() and ":" not in w and "'" not in w]
    alpha = [w for w in words if w.isalpha() and len(w) >= 2 and _one_token(tokenizer, w, unk)][:limit]
    numbers = sorted((w for w in words if w.isdigit() and _one_token(tokenizer, w, unk)), key=int)[:limit]
    if len(numbers) >= 8:
        keys, values = alpha, numbers
    else:
        keys, values = alpha[0::2], alpha[1::2]
    if len(keys) < 4 or len(values) < 4:
        raise TaskError(f"the tokenizer has too few one-token words for a KV task ({len(keys)} keys, {len(values)} "
                        "values); pass --vocab FILE.json with your own keys and values, or a task file (--task-file)")
    return {"keys": keys, "values": values}


def read_vocab(spec: str, tokenizer: Any) -> dict[str, list[str]]:
    """``--vocab``: ``auto`` (:func:`tokenizer_words`) or a JSON file ``{"keys": [...], "values": [...]}``."""
    if spec == "auto":
        return tokenizer_words(tokenizer)
    path = Path(spec)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TaskError(f"--vocab {spec!r}: cannot read it as JSON ({exc}); pass auto or a file "
                        '{"keys": [...], "values": [...]}') from None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), list) for k in ("keys", "values")):
        raise TaskError(f'--vocab {spec!r} must hold {{"keys": [...], "values": [...]}} (lists of words)')
    return {"keys": [str(w) for w in data["keys"]], "values": [str(w) for w in data["values"]]}
