"""The ``gather-aggregate`` command line: :mod:`.parser` (arguments), :mod:`.commands` (the subcommands as functions),
:mod:`.demo` and its parts, :mod:`.memory` (the memory table).
"""

from __future__ import annotations

from gather_aggregate.core.lazy import lazy_attributes

_LAZY: dict[str, str] = {
    "main": "gather_aggregate.cli.parser",
    "build_parser": "gather_aggregate.cli.parser",
}

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, __all__)
