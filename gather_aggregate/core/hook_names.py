"""Hooks a caller hands a model: their names are checked before a forward, and what a forward hook returns is
checked when it runs.

TransformerLens' hook point puts whatever a hook returns in place of the activation.  A tensor of another shape
(``z[:, :1]`` for ``z``) is broadcast or reshaped further on without a word, and the logits look normal; so every
forward hook goes through :func:`checked_hooks`, which refuses such a return in one :class:`InputError` line.

Nothing here imports torch at module level.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gather_aggregate.core.errors import InputError


def hook_dict_of(model: Any) -> dict[str, Any] | None:
    """The model's TransformerLens ``hook_dict`` (its own, or its wrapped ``module``'s); ``None`` without one."""
    names = getattr(model, "hook_dict", None)
    if names is None:
        names = getattr(getattr(model, "module", None), "hook_dict", None)
    return names if isinstance(names, dict) else None


def check_hook_names(model: Any, hooks: Sequence[Any]) -> None:
    """Every ``(name, fn)`` of ``hooks`` names a hook point of ``model`` (a callable name filter passes)."""
    names = hook_dict_of(model)
    if names is None:
        return
    for item in hooks:
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise InputError(f"hooks must be (hook_name, fn) pairs, got {item!r}")
        if not callable(item[1]):  # was a TypeError from inside TransformerLens' hook point
            raise InputError(f"the hook for {item[0]!r} must be a function fn(tensor, hook) -> tensor or None, got "
                             f"{type(item[1]).__name__}")
        if isinstance(item[0], str) and item[0] not in names:
            raise InputError(f"no hook named {item[0]!r} on this model; use its own names, e.g. model.head_hook(layer)"
                             f"[0] or model.resid_hook(layer) ({len(names)} hooks in model.hook_dict)")


def check_cache_names(model: Any, names_filter: Any) -> None:
    """Every hook name a ``run_with_cache`` ``names_filter`` lists (one name or a list; a callable passes) is a hook
    point of ``model``: an unknown one gave an empty cache (TransformerLens' own models) or TL's ``KeyError``."""
    names = hook_dict_of(model)
    if names is None:
        return
    wanted = [names_filter] if isinstance(names_filter, str) else names_filter \
        if isinstance(names_filter, (list, tuple)) else []
    unknown = [n for n in wanted if isinstance(n, str) and n not in names]
    if unknown:
        raise InputError(f"names_filter names no hook of this model: {unknown[0]!r}; use its own names, e.g. "
                         f"model.head_hook(layer)[0] or model.resid_hook(layer) ({len(names)} hooks in "
                         "model.hook_dict)")


def checked_hooks(model: Any, hooks: Sequence[Any]) -> list[tuple[Any, Any]]:
    """``hooks`` (``(name, fn)`` pairs of forward hooks) as a list, names checked (:func:`check_hook_names`) and each
    ``fn`` wrapped so that returning something other than ``None`` or a tensor of the activation's shape is one
    :class:`InputError` naming the hook."""
    hooks = list(hooks)
    check_hook_names(model, hooks)
    return [(name, _shape_checked(fn)) for name, fn in hooks]


def _shape_checked(fn: Any) -> Any:
    if getattr(fn, "_ga_shape_checked", False):  # already wrapped (hooks handed on from one call to another)
        return fn

    def hook(activation: Any, *args: Any, **kwargs: Any) -> Any:
        out = fn(activation, *args, **kwargs)
        if out is None or out is activation:
            return out
        name = getattr(kwargs.get("hook", args[0] if args else None), "name", "?")
        if not hasattr(out, "shape"):
            raise InputError(f"the hook on {name!r} returned a {type(out).__name__}; a forward hook returns None or "
                             "a tensor of its activation's shape")
        if hasattr(activation, "shape") and tuple(out.shape) != tuple(activation.shape):
            raise InputError(f"the hook on {name!r} returned shape {tuple(out.shape)} for an activation of shape "
                             f"{tuple(activation.shape)}; return a tensor of the same shape (e.g. edit it in place "
                             "or with torch.where), or None to keep it")
        return out

    hook._ga_shape_checked = True  # type: ignore[attr-defined]
    hook.__name__ = getattr(fn, "__name__", "hook")
    hook.__wrapped__ = fn  # type: ignore[attr-defined]
    return hook


class CheckedHooks:
    """``run_with_hooks`` and ``hooks`` of a TransformerLens ``HookedRootModule`` subclass (list it before
    ``HookedRootModule``), with the names of all hooks checked and every forward hook shape-checked."""

    def run_with_hooks(self, *args: Any, fwd_hooks: Any = (), bwd_hooks: Any = (), **kwargs: Any) -> Any:
        check_hook_names(self, list(bwd_hooks))
        return super().run_with_hooks(*args, fwd_hooks=checked_hooks(self, fwd_hooks),  # type: ignore[misc]
                                      bwd_hooks=list(bwd_hooks), **kwargs)

    def hooks(self, fwd_hooks: Any = (), bwd_hooks: Any = (), *args: Any, **kwargs: Any) -> Any:
        check_hook_names(self, list(bwd_hooks))
        return super().hooks(checked_hooks(self, fwd_hooks), list(bwd_hooks), *args, **kwargs)  # type: ignore[misc]
