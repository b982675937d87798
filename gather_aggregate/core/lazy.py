"""Lazy package attributes: a package lists ``{public name: defining module}`` and imports a module on first use.

This keeps ``import gather_aggregate`` (and its subpackages) free of torch,
transformers and TransformerLens until a name that needs them is touched.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def lazy_attributes(package: str, table: Mapping[str, str],
                    public: Sequence[str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: ``table`` maps each lazy name to its module."""
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(public)

    return __getattr__, __dir__
