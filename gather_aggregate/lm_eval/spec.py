"""Head and layer lists as written on a command line: ``L16H22;L17H24``, ``16.22;17.24``, ``3;2`` (no torch)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from gather_aggregate.core.errors import InputError

Head = tuple[int, int]
_HEAD = re.compile(r"^(?:L(\d+)H(\d+)|(\d+)\.(\d+))$", re.IGNORECASE)


def parse_heads(value: Any, what: str = "ablate") -> list[Head]:
    """``"L16H22;L17H24"`` / ``"16.22;17.24"`` / ``[(16, 22)]`` -> ``[(16, 22), (17, 24)]``.

    Separators: ``;``, ``,``, ``+`` or spaces.  A bare float (lm-eval reads
    ``ablate=16.20`` as the number 16.2) is refused, since it cannot tell
    head 2 from head 20.
    """
    if value is None or value == "" or value == []:
        return []
    if isinstance(value, float):
        raise InputError(f"{what}={value!r} was read as a number, which loses the head index (16.20 == 16.2); "
                         f"write heads as L16H20 (e.g. {what}=L16H22;L17H24)")
    if isinstance(value, (list, tuple)) and all(isinstance(h, (list, tuple)) and len(h) == 2 for h in value):
        return [(int(a), int(b)) for a, b in value]
    heads: list[Head] = []
    for part in re.split(r"[;,+\s]+", str(value).strip()):
        if not part:
            continue
        m = _HEAD.match(part)
        if m is None:
            raise InputError(f"cannot read head {part!r} in {what}=; write heads as L16H22 or 16.22, "
                             f"separated by ';' (e.g. {what}=L16H22;L17H24)")
        a, b = (m.group(1), m.group(2)) if m.group(1) is not None else (m.group(3), m.group(4))
        heads.append((int(a), int(b)))
    return heads


def parse_layers(value: Any) -> list[int]:
    """``"3;2"`` / ``3`` / ``[3, 2]`` -> ``[3, 2]``."""
    if value is None or value == "" or value == []:
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    try:
        return [int(p) for p in re.split(r"[;,+\s]+", str(value).strip()) if p]
    except ValueError:
        raise InputError(f"cannot read prune={value!r}; list layer indices separated by ';' (e.g. prune=3;2)") from None


def format_heads(heads: Sequence[Head]) -> str:
    return ";".join(f"L{a}H{b}" for a, b in heads)




def whole_number(value: Any, what: str, low: int) -> int:
    """A number of ``model_args`` as lm-eval passes it (an int, or text such as ``"16"``), at least ``low``.

    Floats, booleans and words are refused (``batch_size=2.5`` was truncated to 2, ``max_length=x`` was
    ``int()``'s ValueError).
    """
    text = str(value).strip()
    if isinstance(value, bool) or not re.fullmatch(r"[+-]?\d+", text):
        raise InputError(f"{what}={value!r}: pass a whole number (at least {low}), e.g. {what}={max(low, 1) * 16}")
    number = int(text)
    if number < low:
        raise InputError(f"{what}={number}: use a whole number of at least {low}")
    return number
