"""Run many edits of one layer from a cached forward: the engine of the exact scan and of patching.

An *edit* replaces one head's output (at every position, or at one) in one
copy of the batch; ``len(edits)`` copies are stacked and run in one forward
that starts from cached activations instead of the tokens.

Two ways to resume, chosen per layer by :func:`plan`:

* **inside the layer** (``model.mixer_resume(layer)``: our SSMs and hybrids;
  sequential, parallel and post-norm transformer blocks).  A head reaches the
  layer's mixer output (before any norm after the mixer) only through its
  columns ``W[:, h]`` of the output projection, so replacing its output ``z_h``
  by ``z'_h`` adds exactly

      Δ = (z'_h − z_h) @ W[:, h]ᵀ

  to the layer's mixer output.  The cached mixer output is edited and the
  forward continues after the mixer: the edited layer's mixer is not re-run.
* **from the layer's input** (``start_at_layer``) with a hook that writes the
  edits into each copy's head outputs; the fallback for every other layer.

Both give the naive one-forward-per-edit numbers up to float rounding (tested
in ``tests/test_scan.py``).

With a :class:`~gather_aggregate.core.readout.ReadoutMetric` the forward stops
once the *last* layer's mixer output is in (a hook raises :class:`_Stop`) and
finishes at the metric's positions only: the rest of the last layer, the final
norm and the unembedding act on each position alone, so the rows the metric
does not read are never computed.  An edit in the last layer itself then costs
those few rows and nothing else.  Where the last mixer is attention that can
answer a few queries alone (``model.mixer_at_rows``), the forward stops at the
last layer's input instead and that mixer runs its queries at the readout
positions only (keys and values still at every position).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from gather_aggregate.core.protocol import HookedModel
from gather_aggregate.core.readout import ReadoutMetric
from gather_aggregate.interventions.ablation import Edit, edit_hook


@dataclass(frozen=True)
class Resume:
    """How to resume inside one layer: its mixer output's hook and out-projection ``W`` (``[d_model, n_heads *
    d_head]``, from ``model.mixer_resume``); ``at_rows``, set by :func:`verify` for the last layer, says its mixer
    was checked to run at the readout rows alone (``model.mixer_at_rows``)."""

    mixer_hook: str
    w_out: Tensor
    at_rows: bool = False


#: per layer: its :class:`Resume`, or ``None`` where the forward restarts from the layer's input
Plan = dict[int, "Resume | None"]
Fill = Callable[[Edit, Tensor], Tensor]


class _Stop(Exception):
    """Raised by a hook to end a forward once the last layer's mixer output is in."""


def plan(model: HookedModel, layers: Iterable[int], readout: bool = False) -> Plan:
    """The inside-the-layer resume of every layer that offers one (``None`` for the others); with ``readout``
    also of the last layer, where every forward finishes at the readout positions."""
    layers = set(layers) | ({model.n_layers - 1} if readout else set())
    out: Plan = {}
    for layer in sorted(layers):
        offered = model.mixer_resume(layer)
        out[layer] = None if offered is None else Resume(*offered)
    return out


def cache_names(model: HookedModel, plan_: Plan) -> list[str]:
    """Hooks a reference forward must cache for :func:`edited_logits`: every layer's residual input and, where
    resuming inside the layer, its mixer output and head outputs."""
    names = [model.resid_hook(layer) for layer in plan_]
    names += [n for layer, spec in plan_.items() if spec is not None for n in (spec.mixer_hook, model.head_hook(layer)[0])]
    return names


def verify(model: HookedModel, cache: Any, plan_: Plan, logits: Tensor) -> Plan:
    """Keep a layer's inside-the-layer resume only if, on the first prompt of the cached run, resuming there gives
    that run's ``logits`` and the head outputs times the out-projection give the mixer output up to a constant
    (the bias).  A layer that fails (say, a mixer hook taken after a norm, or a block form resumed wrongly) falls
    back to resuming from its input.  (One prompt: these checks are about the architecture, and their cost is mostly
    per call, so every one saved is a few percent of a small model's scan.)"""
    out: Plan = {}
    for layer, spec in plan_.items():
        ok = False
        if spec is not None:
            name, w_out = spec.mixer_hook, spec.w_out.detach()
            mixer_out, z = cache[name][:1].float(), cache[model.head_hook(layer)[0]][:1].float()
            offset = mixer_out - z.flatten(-2) @ w_out.float().T  # the bias, the same at every position
            tol = 1e-4 * (1 + float(mixer_out.abs().max()))
            ok = bool((offset - offset[:1, :1]).abs().max() <= tol)
            if ok and layer != model.n_layers - 1:  # the last layer is checked below, at the readout rows
                resumed = model.resume_after_mixer(cache[model.resid_hook(layer)][:1], cache[name][:1], layer)
                ok = bool(torch.allclose(resumed.float(), logits[:1].float(), rtol=1e-4, atol=1e-4))
            rows_ok = False
            if ok and layer == model.n_layers - 1:
                # the readout finish relies on what follows the last mixer acting on each position alone; where the
                # mixer answers a few queries alone (mixer_at_rows), one check covers both shortcuts
                rows = torch.tensor([0, logits.shape[1] - 1])
                resid, want = cache[model.resid_hook(layer)][:1], logits[:1, rows].float()
                at_rows_fn = getattr(model, "mixer_at_rows", None)  # optional in the protocol
                at_rows = at_rows_fn(resid, rows.repeat(resid.shape[0], 1).to(resid.device), layer) if (
                    at_rows_fn is not None) else None
                if at_rows is not None:
                    rows_ok = bool(torch.allclose(model.resume_after_mixer(resid[:, rows], at_rows, layer).float(),
                                                  want, rtol=1e-4, atol=1e-4))
                if not rows_ok:
                    alone = model.resume_after_mixer(resid[:, rows], cache[name][:1, rows], layer)
                    ok = bool(torch.allclose(alone.float(), want, rtol=1e-4, atol=1e-4))
        out[layer] = Resume(spec.mixer_hook, spec.w_out.detach(), rows_ok) if spec is not None and ok else None
    return out


def edited_logits(model: HookedModel, cache: Any, plan_: Plan, layer: int, edits: Sequence[Edit], fill: Fill,
                  readout: ReadoutMetric | None = None) -> Tensor:
    """Logits of ``len(edits)`` stacked copies of the cached batch, copy ``i`` with ``edits[i]`` applied in
    ``layer``; ``fill(edit, current)`` gives the replacement for the current head slice (``[batch, pos, d_head]``,
    or ``[batch, d_head]`` for an edit at one position).  With ``readout``: only the logits at its positions,
    ``[copies * batch, k, vocab]``, computed there alone when the plan has the last layer."""
    resid = cache[model.resid_hook(layer)]
    name, axis = model.head_hook(layer)
    batch = resid.shape[0]
    copies = len(edits)
    stacked = resid.repeat(copies, *([1] * (resid.dim() - 1)))
    spec = plan_.get(layer)
    if spec is None:
        hooks = [(name, edit_hook(axis, batch, edits, fill))]
        return _finish(model, plan_, stacked, readout, copies, hooks, lambda: model(stacked, start_at_layer=layer))
    mixer_name, w_out = spec.mixer_hook, spec.w_out
    z = cache[name]
    d_head = z.shape[-1]
    mixer_out = cache[mixer_name]
    out = mixer_out.repeat(len(edits), *([1] * (mixer_out.dim() - 1)))
    for i, e in enumerate(edits):
        cols = w_out[:, e.head * d_head:(e.head + 1) * d_head]
        cur = z.select(axis, e.head)  # [batch, pos, d_head]
        rows = out[i * batch:(i + 1) * batch]
        if e.position is None:
            rows += ((fill(e, cur) - cur).to(w_out.dtype) @ cols.T).to(out.dtype)
        else:
            at = cur[:, e.position]
            rows[:, e.position] += ((fill(e, at) - at).to(w_out.dtype) @ cols.T).to(out.dtype)
    last = model.n_layers - 1
    if readout is not None and layer == last:
        return model.resume_after_mixer(readout.select(stacked, copies), readout.select(out, copies), last)
    return _finish(model, plan_, stacked, readout, copies, [], lambda: model.resume_after_mixer(stacked, out, layer))


def _finish(model: HookedModel, plan_: Plan, stacked: Tensor, readout: ReadoutMetric | None, copies: int,
            hooks: list[tuple[str, Callable]], run: Callable[[], Tensor]) -> Tensor:
    """``run()`` under ``hooks``; with ``readout``, stopped after the last mixer and finished at its positions."""
    last = model.n_layers - 1
    finish = plan_.get(last)
    if readout is None or finish is None:
        with model.hooks(fwd_hooks=hooks):
            logits = run()
        return logits if readout is None else readout.select(logits, copies)
    at_rows = finish.at_rows  # verified: the last mixer can run at the readout rows
    got = {"resid": stacked}  # the last layer's input, when the run starts there

    def grab(x: Tensor, hook: Any) -> None:
        got["resid"] = x
        if at_rows:
            raise _Stop

    def stop(x: Tensor, hook: Any) -> None:
        got["mixer"] = x
        raise _Stop

    try:
        with model.hooks(fwd_hooks=[*hooks, (model.resid_hook(last), grab), (finish.mixer_hook, stop)]):
            run()
    except _Stop:
        pass
    resid = got["resid"]
    if at_rows:
        idx = readout.index(resid.shape[0] // copies, resid.shape[1], copies).to(resid.device)
        return model.resume_after_mixer(readout.select(resid, copies), model.mixer_at_rows(resid, idx, last), last)
    if "mixer" not in got:
        raise RuntimeError(f"the forward never reached {finish.mixer_hook!r}; cannot finish at the readout positions")
    return model.resume_after_mixer(readout.select(resid, copies), readout.select(got["mixer"], copies), last)
