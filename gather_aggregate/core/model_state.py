"""The user's session state, which an analysis must neither depend on nor change.

A notebook's model and session may be in any of these states when a public function is called:

* **train mode** (``model.train()``; a transformer with dropout > 0): every analysis runs in eval mode
  (:func:`eval_mode`), so its numbers are deterministic and equal to eval mode's, and each module's
  ``training`` flag is put back as it was when the call returns, also after an error or a
  ``KeyboardInterrupt``.  The model's own forwards (``model(tokens)``, ``run_with_cache``,
  ``run_with_hooks``) follow the mode the user set, as any ``torch.nn.Module`` does.
* **``torch.no_grad()`` or ``torch.inference_mode()``**: every analysis leaves inference mode for its own
  work (grad still off), so what it makes and returns are normal tensors; the gradient estimators re-enable
  autograd where they take gradients (:func:`gradients`).  A tensor an earlier inference-mode block made that
  autograd cannot use (a metric of the user's own closing over one) raises one
  :class:`~gather_aggregate.core.errors.InputError` naming the fix.
* **frozen parameters or a user's own ``.grad``**: gradients are taken with ``torch.autograd.grad`` with respect
  to probes on the head outputs only, so ``requires_grad`` flags and ``.grad`` are never read or written.
* **the user's own hooks** (TransformerLens ``add_hook``, torch forward / pre-hooks): they stay attached, and
  our results see them, as the model's own forwards do: a hook is part of the model the user asked about
  (the exact scan equals the naive one with them in place).  Our hooks are gone when a call returns.

:func:`analysis` gives a public entry point the first two, :func:`gradients` is how every autograd site gets
autograd; :func:`param_checksum` and :func:`count_hooks` are how the tests prove that nothing else changed.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar, cast

from gather_aggregate.core.errors import InputError

if TYPE_CHECKING:  # pragma: no cover
    import torch

F = TypeVar("F", bound=Callable[..., Any])

INFERENCE_TENSOR_FIX = ("a tensor made under torch.inference_mode() reached a gradient computation (e.g. one the "
                        "metric closes over); make the tokens and the metric outside inference_mode, use "
                        "torch.no_grad() instead, or .clone() the tensor outside it")


def _root(model: Any) -> Any:
    """The ``torch.nn.Module`` holding the model's weights (a bridge's wrapped module, else the model)."""
    return getattr(model, "module", model)


@contextlib.contextmanager
def eval_mode(model: Any) -> Iterator[None]:
    """Run the body with every module of ``model`` in eval mode, then put each ``training`` flag back as it was
    (also after any exception, ``KeyboardInterrupt`` included).  The switch goes through ``train(False)`` of the
    model (and of a bridge's unregistered ``original_model``) and back through ``train(flag)``, so a model that
    overrides ``train()`` sees both.  Anything that is not a module is left alone."""
    import torch

    root = _root(model)
    if not isinstance(root, torch.nn.Module):
        yield
        return
    # TransformerLens' bridge keeps the HF model it wraps (``original_model``) outside its registered tree
    owners = [root, *(v for v in vars(root).values() if isinstance(v, torch.nn.Module))]
    modules = list({id(m): m for owner in owners for m in owner.modules()}.values())
    flags = [m.training for m in modules]
    owner_flags = [o.training for o in owners]
    switched = any(flags)
    try:
        if switched:
            for o in owners:  # through each owner's own train(): a model that overrides it sees the switch
                o.train(False)
            for m in modules:  # and whatever such an override left in train mode
                m.training = False
        yield
    finally:
        if switched:
            for o, flag in zip(owners, owner_flags, strict=True):
                o.train(flag)
        for m, flag in zip(modules, flags, strict=True):
            m.training = flag


@contextlib.contextmanager
def gradients() -> Iterator[None]:
    """Autograd on for the body, whatever the caller's mode: ``torch.no_grad()`` and ``torch.inference_mode()``
    are lifted inside it only.  An inference tensor autograd must save raises one :class:`InputError`."""
    import torch

    try:
        with torch.inference_mode(False), torch.enable_grad():
            yield
    except RuntimeError as exc:
        if "Inference tensors" not in str(exc):
            raise
        raise InputError(INFERENCE_TENSOR_FIX) from None


@contextlib.contextmanager
def outside_inference_mode() -> Iterator[None]:
    """Leave ``torch.inference_mode()`` for the body, keeping the grad mode it had (off): what an analysis makes is
    then a normal tensor, which a later gradient estimate may use, and so is what it returns."""
    import torch

    if not torch.is_inference_mode_enabled():
        yield
        return
    with torch.inference_mode(False), torch.no_grad():
        yield


def analysis(fn: F) -> F:
    """Decorate a public entry point whose first argument is the model: it runs in :func:`eval_mode` and outside
    ``torch.inference_mode()`` (nested entry points nest harmlessly).  Autograd, where an analysis needs it, is :func:`gradients`' business."""

    if inspect.isgeneratorfunction(fn) or inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        # the eval-mode and inference-mode scopes would close when the generator is made, before its body runs
        raise TypeError(f"@analysis cannot wrap {fn.__qualname__}: a generator or coroutine runs after the call "
                        "returns; wrap a function that returns its result")

    @functools.wraps(fn)
    def inner(model: Any, *args: Any, **kwargs: Any) -> Any:
        with eval_mode(model), outside_inference_mode():
            return fn(model, *args, **kwargs)

    return cast(F, inner)


def param_checksum(model: torch.nn.Module | Any) -> str:
    """SHA-256 over every parameter and buffer (used to prove analyses never mutate a model)."""
    import hashlib

    import torch

    module: torch.nn.Module = _root(model)
    h = hashlib.sha256()
    for name, t in sorted(list(module.state_dict().items()), key=lambda kv: kv[0]):
        h.update(name.encode())
        if isinstance(t, torch.Tensor):
            h.update(t.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def count_hooks(model: torch.nn.Module | Any) -> int:
    """Number of hook functions currently attached to the model's ``HookPoint``s.

    (TransformerLens' bridge keeps internal torch hooks on its components and permanent ones on some hook
    points as wiring, e.g. OPT's MLP; only the non-permanent hooks of hook points are counted: users and
    analyses attach those, and the toolkit never adds permanent ones.)
    """
    from transformer_lens.hook_points import HookPoint

    module: torch.nn.Module = _root(model)
    n = 0
    for m in module.modules():
        if isinstance(m, HookPoint):
            n += len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
            n += len(getattr(m, "_backward_pre_hooks", {}))
            n -= sum(h.is_permanent for h in (*getattr(m, "fwd_hooks", ()), *getattr(m, "bwd_hooks", ())))
    return n
