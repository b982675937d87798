"""Argument checks shared by the public entry points: one clear :class:`InputError` line for a wrong type.

Each check names what the caller should pass instead.  Indices (layers, heads, rows) are checked in
:mod:`gather_aggregate.core.indices`, heads and tokens by the model (:mod:`gather_aggregate.core.protocol`), task examples in
:mod:`gather_aggregate.tasks.base`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from gather_aggregate.core.errors import InputError
from gather_aggregate.core.indices import as_index

#: what every analysis calls on a model (the core of :class:`gather_aggregate.core.protocol.HookedModel`)
MODEL_MEMBERS = ("layers", "all_heads", "check_head_set", "head_hook", "validate_tokens", "run_with_hooks", "hooks")


def check_model(model: Any, what: str = "model", needs: Sequence[str] = MODEL_MEMBERS) -> None:
    """Refuse anything that is not a hooked model of this package (a raw HF model, a path, None): ``model`` must
    have every member in ``needs`` (evaluate asks only for ``__call__`` and ``hooks``)."""
    if all(callable(model) if m == "__call__" else hasattr(model, m) for m in needs):
        return
    hint = "load it with load_model(path)" if isinstance(model, str) or hasattr(model, "__fspath__") else \
        "wrap it: from_hf_model(hf_model, tokenizer)" if hasattr(model, "config") else "use load_model(name_or_path)"
    raise InputError(f"{what} must be a gather_aggregate model, got {type(model).__name__}; {hint}")


def count(x: Any, what: str, minimum: int = 1) -> int:
    """A whole number ``>= minimum`` (a batch size, a top-k, a number of rows)."""
    n = as_index(x, what)
    if n < minimum:
        raise InputError(f"{what}={n}: pass a whole number >= {minimum}")
    return n


def number(x: Any, what: str, minimum: float | None = None) -> float:
    """A finite real number (``>= minimum`` when given); bools, strings and tensors of several values refused."""
    if isinstance(x, bool) or not (isinstance(x, (int, float)) or hasattr(x, "__float__") and getattr(x, "ndim", 0) == 0):
        raise InputError(f"{what} must be a number, got {type(x).__name__}")
    v = float(x)
    if not math.isfinite(v) or (minimum is not None and v < minimum):
        raise InputError(f"{what} must be a finite number{'' if minimum is None else f' >= {minimum}'}, got {v}")
    return v


#: the head kinds (:data:`gather_aggregate.core.protocol.LayerKind`)
HEAD_KINDS = ("attn", "ssm")


def names(x: Any, what: str, allowed: Sequence[str] | None = None) -> list[str]:
    """A list of strings (e.g. head kinds ``["attn", "ssm"]``); one string alone is refused as ambiguous, and a
    name outside ``allowed`` (when given) too: ``kinds=["mlp"]`` selected no head, silently."""
    if isinstance(x, (str, bytes)) or not isinstance(x, (Sequence, set, frozenset)) \
            or not all(isinstance(v, str) for v in x):
        raise InputError(f"{what} must be a list of names such as ['attn'] or ['ssm'], got {x!r}")
    unknown = [v for v in x if allowed is not None and v not in allowed]
    if unknown:
        raise InputError(f"{what}: unknown name(s) {unknown}; choose from {list(allowed or ())}")
    return list(x)


def is_encoding(x: Any) -> bool:
    """Whether ``x`` is a tokenizer's output (a ``BatchEncoding`` or any mapping with ``input_ids``)."""
    from collections.abc import Mapping

    return isinstance(x, Mapping) and "input_ids" in x


def token_tensor(tokens: Any) -> Any:
    """``tokens`` as a tensor (a tensor passes through; nested lists of ints are converted; a tokenizer's output
    gives its ``input_ids`` when nothing in it is padding), or one clear line."""
    import torch

    if is_encoding(tokens):
        mask = tokens.get("attention_mask")
        if mask is not None and not bool(torch.as_tensor(mask).bool().all()):
            raise InputError("the tokenizer's output has padding (attention_mask has zeros): pass the texts to "
                             "model.to_tokens(...) instead, or one prompt's input_ids at a time")
        tokens = tokens["input_ids"]
    if isinstance(tokens, torch.Tensor):
        return tokens
    if isinstance(tokens, (list, tuple)) and tokens and all(getattr(t, "ndim", 1) == 1 and isinstance(t, (list, tuple, torch.Tensor)) for t in tokens):
        if not all(len(t) for t in tokens):  # [] or [[]]: was "must be integer ids, got float32"
            raise InputError("a prompt has no token ids; pass at least one id per prompt")
        if len({len(t) for t in tokens}) > 1:  # ragged: was "got list"
            raise InputError(f"prompts of different lengths ({sorted({len(t) for t in tokens})} tokens) make no "
                             "[batch, pos] tensor; pad them to one length (model.to_tokens(texts) does) or pass them "
                             "one at a time")
        if all(isinstance(t, torch.Tensor) for t in tokens):  # a list of 1-D id tensors of one length
            return torch.stack(list(tokens))
    if isinstance(tokens, (list, tuple)) and not tokens:
        raise InputError("tokens are empty; pass at least one token id")
    try:
        return torch.as_tensor(tokens)
    except (TypeError, ValueError, RuntimeError):
        raise InputError(f"tokens must be token ids (a [batch, pos] integer tensor or lists of ints) or text, got "
                         f"{type(tokens).__name__}") from None


def is_cache(x: Any) -> bool:
    """Whether ``x`` is a cache of activations (an ``ActivationCache`` or a dict of them) rather than a prompt:
    the one test every ``pattern(tokens_or_cache, ...)`` uses, so token ids in any form (a tensor, lists, a numpy
    array) and text are never taken for a cache."""
    from collections.abc import Mapping

    return (isinstance(x, Mapping) and not is_encoding(x)) or hasattr(x, "cache_dict")
