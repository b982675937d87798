"""The command line's option types: a bad value is refused by argparse, before anything loads.

Shared by :mod:`.parser` (which declares the options) and :mod:`.commands` (which reads head lists from files).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def int_in_range(name: str, low: int, high: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a whole number, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{name} must be at least {low}, got {value}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"{name} must be at most {high}, got {value}")
        return value

    parse.__name__ = name
    return parse


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive finite number (standard deviations), got {text}")
    return value


def head_pairs(text: str) -> list[tuple[int, int]]:
    """``1.0,1.3`` or ``L1H0,L1H3`` → ``[(1, 0), (1, 3)]``."""
    import re

    heads = []
    for part in [p for p in text.replace(" ", "").split(",") if p]:
        m = re.fullmatch(r"(\d+)\.(\d+)|L(\d+)H(\d+)", part, flags=re.IGNORECASE)  # l1h0 was refused
        if not m:
            raise argparse.ArgumentTypeError(f"cannot read head {part!r}; write LAYER.HEAD or LxHy, comma separated, "
                                             "e.g. --heads 1.0,1.3 or --heads L1H0,L1H3")
        g = [int(x) for x in m.groups() if x is not None]
        heads.append((g[0], g[1]))
    if not heads:
        raise argparse.ArgumentTypeError("no heads given; e.g. --heads 1.0,1.3")
    return heads


def head_indices(text: str) -> list[int]:
    """``0,2`` → ``[0, 2]`` (head indices of one layer)."""
    out = []
    for part in [p for p in text.replace(" ", "").split(",") if p]:
        if not part.isdigit():
            raise argparse.ArgumentTypeError(f"cannot read head index {part!r}; pass non-negative whole numbers, "
                                             "comma separated, e.g. --heads 0,2")
        out.append(int(part))
    if not out:
        raise argparse.ArgumentTypeError("no head indices given; e.g. --heads 0,2, or leave --heads out for all heads")
    return out
