"""MOHAWK distillation of a head-level hybrid from its teacher, in three stages, resumable after a kill.

With the teacher's layer inputs ``u_L`` (after ``ln1``), attention patterns
``P_{L,h}``, mixer outputs ``m_L`` and logits ``z``:

1. **matrix orientation**: each SSM head's implied attention ``α_{L,h}(u_L)``
   is fitted to its attention head's pattern: ``mean_{b,h} ‖α_{L,h} − P_{L,h}‖_F``,
   summed over layers; only the heads' ``B``, ``C``, ``Δ``, ``A`` (and conv) train;
2. **hidden-state alignment**: each hybrid layer's mixer, run on the *teacher's*
   input ``u_L``, is fitted to the teacher's mixer output:
   ``‖mixer_L(u_L) − m_L‖² / ‖m_L‖²`` summed over layers; the mixers of layers
   with SSM heads train (their kept heads and ``o_proj`` too);
3. **end-to-end**: ``KL(softmax z ‖ softmax z_student)`` per non-pad position;
   every parameter trains.

Stages 1 and 2 are layer-local (the teacher supplies every layer's input), as in
MOHAWK.  The teacher is a :class:`HookedHeadHybrid` with every head kept (equal to
the Llama teacher, tested), so one code path serves both.  The student is
trained in place.  Every ``checkpoint_every`` steps the student, the optimiser,
the stage and the step are written atomically to ``out_dir/distill_state.pt``;
rerunning with the same arguments resumes there (data are a function of the
step, so a resumed run sees the same batches).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from gather_aggregate.core.errors import InputError, ResumeMismatchError
from gather_aggregate.models.head_hybrid.layers import implied_attention
from gather_aggregate.models.head_hybrid.model import HookedHeadHybrid

STAGES = ("orientation", "alignment", "end_to_end")
STATE = "distill_state.pt"
LOG = "distill_log.jsonl"


@dataclass
class DistillConfig:
    """Steps and learning rates of the three stages (a stage with 0 steps is skipped)."""

    steps: tuple[int, int, int] = (200, 200, 400)
    lr: tuple[float, float, float] = (1e-2, 1e-3, 3e-4)
    grad_clip: float = 1.0
    checkpoint_every: int = 50
    log_every: int = 10
    pad_id: int = 0


def _teacher_cache(teacher: HookedHeadHybrid, tokens: torch.Tensor, names: list[str]) -> tuple[torch.Tensor, Any]:
    with torch.no_grad():
        return teacher.run_with_cache(tokens, names_filter=lambda n: n in names)


def _ssm_layers(student: HookedHeadHybrid) -> list[int]:
    return [L for L, blk in enumerate(student.blocks) if blk.attn.ssm is not None]


def stage_parameters(student: HookedHeadHybrid, stage: str) -> list[torch.nn.Parameter]:
    """What trains in ``stage``."""
    if stage == "orientation":
        return [p for L in _ssm_layers(student) for n, p in student.blocks[L].attn.ssm.named_parameters()
                if not n.startswith(("x_proj", "D"))]
    if stage == "alignment":
        return [p for L in _ssm_layers(student) for p in student.blocks[L].attn.parameters()]
    if stage == "end_to_end":
        return list(student.parameters())
    raise InputError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")


def stage_loss(student: HookedHeadHybrid, teacher: HookedHeadHybrid, tokens: torch.Tensor, stage: str,
               pad_id: int = 0) -> torch.Tensor:
    """The loss of one stage on one batch (see the module docstring).  ``tokens`` may come from the CPU (the
    zoo's batches do): they are moved to the student's device, where the end-to-end stage masks the logits."""
    layers = _ssm_layers(student)
    tokens = tokens.to(student.device)
    if stage == "orientation":
        names = [f"blocks.{L}.ln1.hook_normalized" for L in layers] + [f"blocks.{L}.attn.hook_pattern" for L in layers]
        _, cache = _teacher_cache(teacher, tokens, names)
        total = tokens.new_zeros((), dtype=torch.float32)
        for L in layers:
            ssm = student.blocks[L].attn.ssm
            _, dt, B, C = ssm.inputs(cache[f"blocks.{L}.ln1.hook_normalized"])
            alpha = implied_attention(dt, ssm.A, B, C)
            target = cache[f"blocks.{L}.attn.hook_pattern"][:, student.blocks[L].attn.ssm_idx]
            total = total + (alpha - target).flatten(2).norm(dim=-1).mean()
        return total
    if stage == "alignment":
        names = [f"blocks.{L}.ln1.hook_normalized" for L in layers] + [f"blocks.{L}.hook_mixer_out" for L in layers]
        _, cache = _teacher_cache(teacher, tokens, names)
        total = tokens.new_zeros((), dtype=torch.float32)
        for L in layers:
            target = cache[f"blocks.{L}.hook_mixer_out"]
            out = student.blocks[L].attn(cache[f"blocks.{L}.ln1.hook_normalized"])
            total = total + (out - target).pow(2).sum() / target.pow(2).sum().clamp_min(1e-12)
        return total
    if stage == "end_to_end":
        with torch.no_grad():
            t_logp = torch.log_softmax(teacher(tokens), -1)
        s_logp = torch.log_softmax(student(tokens), -1)
        kl = (t_logp.exp() * (t_logp - s_logp)).sum(-1)
        mask = (tokens != pad_id).float()
        return (kl * mask).sum() / mask.sum().clamp_min(1.0)
    raise InputError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")


def _fingerprint(student: HookedHeadHybrid, cfg: DistillConfig, extra: dict[str, Any]) -> str:
    blob = json.dumps({"model": student.cfg.to_dict(), "distill": asdict(cfg), **extra}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _save_state(out: Path, state: dict[str, Any], log: list[dict[str, Any]]) -> None:
    from gather_aggregate.core.results_io import atomic_write, atomic_write_text

    atomic_write(out / STATE, lambda tmp: torch.save(state, tmp))
    atomic_write_text(out / LOG, "".join(json.dumps(r) + "\n" for r in log))


def distill(student: HookedHeadHybrid, teacher: HookedHeadHybrid, batches: Callable[[int], torch.Tensor],
            cfg: DistillConfig | None = None, *, out_dir: str | os.PathLike[str] | None = None,
            progress: bool = True, run_key: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Run the three stages on ``student`` (trained in place); returns the log rows.

    ``batches(i)`` returns the token batch ``[batch, pos]`` of global step ``i`` (a
    pure function of ``i``, so that a resumed run sees the same data).  With
    ``out_dir`` the run checkpoints and resumes there; ``run_key`` adds what else
    identifies the run (e.g. the data seed) to the resume check.
    """
    cfg = cfg or DistillConfig()
    if len(cfg.steps) != 3 or len(cfg.lr) != 3:
        raise InputError("DistillConfig.steps and .lr need one entry per stage (orientation, alignment, end_to_end)")
    if teacher.cfg.n_kept != teacher.cfg.n_layers * teacher.cfg.n_heads:
        raise InputError("the teacher must keep every head as attention: build it with hybridise(teacher, 'all')")
    fp = _fingerprint(student, cfg, run_key or {})
    out = Path(out_dir).expanduser() if out_dir is not None else None
    start_stage, start_step, opt_state, log = _resume(out, fp, student)
    base = sum(cfg.steps[:start_stage])
    for s in range(start_stage, 3):
        stage, n_steps = STAGES[s], cfg.steps[s]
        params = stage_parameters(student, stage)
        if n_steps == 0 or not params:
            start_step, opt_state = 0, None
            base += n_steps
            continue
        opt = _stage_optimizer(student, params, cfg.lr[s], opt_state if start_step > 0 else None)
        student.train()
        bar = _bar(n_steps, start_step, f"stage {s + 1} ({stage})", progress)
        t0, run, run_n = time.time(), 0.0, 0
        for i in range(start_step, n_steps):
            tokens = batches(base + i)
            loss = stage_loss(student, teacher, tokens, stage, cfg.pad_id)
            if not torch.isfinite(loss):
                raise InputError(f"stage {stage} diverged at step {i} (loss {loss.item()}); lower its learning rate")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            run, run_n = run + loss.item(), run_n + 1
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.4f}")
            done = i + 1
            if done % cfg.log_every == 0 or done == n_steps:
                log.append({"stage": stage, "step": done, "loss": round(run / run_n, 6),
                            "seconds": round(time.time() - t0, 2)})
                run, run_n = 0.0, 0
            if out is not None and (done % cfg.checkpoint_every == 0 or done == n_steps):
                nxt = (s, done, opt.state_dict()) if done < n_steps else (s + 1, 0, None)
                _save_state(out, {"fingerprint": fp, "student": student.state_dict(), "stage": nxt[0],
                                  "step": nxt[1], "optimizer": nxt[2], "log": log}, log)
        bar.close()
        start_step, opt_state = 0, None
        base += n_steps
    for p in student.parameters():
        p.requires_grad_(True)
    student.eval()
    return log


def _resume(out: Path | None, fp: str, student: HookedHeadHybrid) -> tuple[int, int, Any, list[dict[str, Any]]]:
    """``(stage, step, optimizer state, log)`` to start from: a fresh run's, or the checkpoint's in ``out``
    (after checking it belongs to this run, ``fp``, and loading its student weights)."""
    if out is None:
        return 0, 0, None, []
    out.mkdir(parents=True, exist_ok=True)
    if not (out / STATE).is_file():
        return 0, 0, None, []
    state = torch.load(out / STATE, weights_only=False)
    if state.get("fingerprint") != fp:
        raise ResumeMismatchError(f"{out / STATE} belongs to another run (other model, layout or settings); "
                                  "pass a fresh out_dir or delete it")
    student.load_state_dict(state["student"])
    return state["stage"], state["step"], state["optimizer"], state["log"]


def _stage_optimizer(student: HookedHeadHybrid, params: list[torch.nn.Parameter], lr: float,
                     opt_state: Any) -> torch.optim.Optimizer:
    """AdamW over ``params``, the only parameters of ``student`` left trainable, resumed from ``opt_state``."""
    for p in student.parameters():
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
    if opt_state is not None:
        opt.load_state_dict(opt_state)
    return opt


def _bar(total: int, initial: int, desc: str, enabled: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, disable=not enabled, leave=False)


__all__ = ["DistillConfig", "distill", "stage_loss", "stage_parameters", "STAGES"]
