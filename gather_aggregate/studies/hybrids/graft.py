"""The reverse graft: one head of a Mamba-2 model becomes a softmax-attention head.

The paper's last claim runs the hybrid recipe backwards: replace one G&A head of
a pretrained SSM with attention, and retrieval improves.  Head ``h`` of Mamba-2
layer ``L`` (group ``g``) computes, from its post-conv inputs ``x``, ``B``, ``C``
and step ``Δ`` (``hook_x``, ``hook_B``, ``hook_C``, ``hook_dt``)

    y_t = Σ_{s ≤ t} (C_t · B_s) exp(A Σ_{r=s+1..t} Δ_r) Δ_s x_s + D x_t          (SSD)

a linear attention whose query is ``C``, key ``B`` and value ``Δ x``, weighted by
a decay.  The graft keeps those inputs and swaps the decayed linear attention
for softmax attention (the MOHAWK correspondence run backwards: ``C`` is the
query, ``B`` the key, ``x`` the value):

    y_t = Σ_{s ≤ t} softmax_s(τ (W_q C_t) · (W_k B_s)) (W_v x_s) + D x_t           (graft)

with ``W_q = W_k = W_v = I`` and ``τ = 1/√N`` at the start.  Only ``W_q``, ``W_k``,
``W_v`` and ``log τ`` train (:func:`train_graft`); the model's own weights never
change.  The graft is a set of forward hooks on the model (``with
model.hooks(fwd_hooks=graft.hooks())``, or ``evaluate(..., fwd_hooks=graft.hooks())``),
so every analysis runs on the grafted model and nothing is left on it afterwards.
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gather_aggregate.core.errors import InputError
from gather_aggregate.core.results_io import atomic_write

if TYPE_CHECKING:
    from gather_aggregate.adapters.model import HookedSSM


class AttentionGraft(nn.Module):
    """Softmax attention in place of SSM head ``head`` of Mamba-2 layer ``layer`` (see the module docstring)."""

    def __init__(self, model: HookedSSM, layer: int, head: int) -> None:
        super().__init__()
        info = model.check_layer(layer)
        cfg = getattr(model, "cfg", None)
        if info.kind != "ssm" or getattr(cfg, "family", None) != "mamba2" or cfg is None:
            raise InputError(f"layer {layer} is not a Mamba-2 layer ({info.kind}); the graft replaces a Mamba-2 "
                             "head: load a Mamba-2 model (e.g. the zoo's mamba2-ga)")
        if not isinstance(head, int) or not 0 <= head < info.n_heads:
            raise InputError(f"head must be an int in 0..{info.n_heads - 1} for layer {layer}, got {head!r}")
        self.layer, self.head = info.index, head
        self.n_heads, self.d_head = info.n_heads, info.d_head
        self.n_state, self.group = cfg.d_state, head // (info.n_heads // cfg.n_groups)
        self.D = float(model.ssm_layer_params(layer).D[head])
        dev = model.device  # the hooks compute with the model's activations, on its device
        self.W_q = nn.Parameter(torch.eye(self.n_state, device=dev))
        self.W_k = nn.Parameter(torch.eye(self.n_state, device=dev))
        self.W_v = nn.Parameter(torch.eye(self.d_head, device=dev))
        self.log_tau = nn.Parameter(torch.tensor(-0.5 * math.log(self.n_state), device=dev))
        self._acts: dict[str, Tensor] = {}

    def attend(self, x: Tensor, B: Tensor, C: Tensor) -> Tensor:
        """The grafted head's output ``[batch, pos, d_head]`` from its ``x`` ``[b, p, d_head]`` and its group's
        ``B``, ``C`` ``[b, p, N]`` (causal softmax attention, plus the head's ``D x`` skip)."""
        q, k, v = C @ self.W_q.T, B @ self.W_k.T, x @ self.W_v.T
        scores = torch.einsum("btn,bsn->bts", q, k) * self.log_tau.exp()
        causal = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()
        pattern = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        return torch.einsum("bts,bsd->btd", pattern, v) + self.D * x

    def hooks(self) -> list[tuple[str, Callable]]:
        """Forward hooks that run the graft: read ``x``, ``B``, ``C`` of the layer, replace the head's slice of
        ``hook_y`` (the SSM output before the gate and norm)."""
        pre = f"blocks.{self.layer}.ssm."
        P, g = self.d_head, self.group

        def keep(name: str) -> Callable:
            def hook(t: Tensor, hook: Any) -> None:
                self._acts[name] = t

            return hook

        def replace(y: Tensor, hook: Any) -> Tensor:
            x = self._acts["x"][..., self.head * P:(self.head + 1) * P].float()
            B, C = self._acts["B"][:, :, g].float(), self._acts["C"][:, :, g].float()
            out = self.attend(x, B, C).to(y.dtype)
            self._acts.clear()
            return torch.cat([y[..., :self.head * P], out, y[..., (self.head + 1) * P:]], dim=-1)

        return [(pre + "hook_x", keep("x")), (pre + "hook_B", keep("B")), (pre + "hook_C", keep("C")),
                (pre + "hook_y", replace)]


def _answer_loss(model: HookedSSM, graft: AttentionGraft, x: Tensor, y: Tensor) -> Tensor:
    with model.hooks(fwd_hooks=graft.hooks()):
        logits = model(x)
    y = y.to(logits.device)  # the model moves x to its device; the labels follow
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=-100)


def train_graft(model: HookedSSM, graft: AttentionGraft, batches: Callable[[int], tuple[Tensor, Tensor]],
                steps: int, *, lr: float = 3e-3, out_dir: str | os.PathLike[str] | None = None,
                checkpoint_every: int = 50, progress: bool = True) -> list[dict[str, float]]:
    """Train the graft's parameters alone on ``batches(step) -> (tokens, labels)`` (labels -100 where no loss)
    for ``steps`` steps with Adam; the model's parameters get no gradient and do not change.

    With ``out_dir`` the graft, the optimiser and the step are saved atomically every ``checkpoint_every`` steps
    to ``out_dir/graft_state.pt``, and a rerun resumes there (batches are a function of the step)."""
    from tqdm.auto import tqdm

    opt = torch.optim.Adam(graft.parameters(), lr=lr)
    start, log = 0, []
    state_path = Path(out_dir) / "graft_state.pt" if out_dir is not None else None
    if state_path is not None and state_path.is_file():
        state = torch.load(state_path, weights_only=False)
        if (state["layer"], state["head"]) != (graft.layer, graft.head):
            raise InputError(f"{state_path} holds a graft of L{state['layer']}H{state['head']}, not "
                             f"L{graft.layer}H{graft.head}; use another out_dir")
        graft.load_state_dict(state["graft"])
        opt.load_state_dict(state["opt"])
        start, log = state["step"], state["log"]
    params = list(graft.parameters())
    bar = tqdm(total=steps, initial=start, desc=f"graft L{graft.layer}H{graft.head}", disable=not progress)
    for step in range(start, steps):
        x, y = batches(step)
        loss = _answer_loss(model, graft, x, y)
        # gradients of the graft's parameters only: the model's weights get none, and their flags stay as they are
        for p, g in zip(params, torch.autograd.grad(loss, params)):
            p.grad = g
        opt.step()
        log.append({"step": step + 1, "loss": float(loss.detach()), "time": time.time()})
        bar.update(1)
        if state_path is not None and ((step + 1) % checkpoint_every == 0 or step + 1 == steps):
            state = {"layer": graft.layer, "head": graft.head, "graft": graft.state_dict(),
                     "opt": opt.state_dict(), "step": step + 1, "log": log}
            atomic_write(state_path, functools.partial(torch.save, state))
    bar.close()
    return log



__all__ = ["AttentionGraft", "train_graft"]
