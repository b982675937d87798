"""Train a toy-zoo model on CPU with HF's own model classes and ship it with ``save_pretrained``.

    python -m gather_aggregate.training.train --arch llama --out DIR --steps 6000 --seed 0 --threads 1

Architectures: ``llama`` (``LlamaForCausalLM``), ``mamba2`` (``Mamba2ForCausalLM``),
``mamba1`` (``MambaForCausalLM`` trained through this project's chunked S6 scan,
:mod:`.mamba1_scan_forward`; ``--mamba1-scan hf`` trains through HF's own mambapy path instead), ``bamba`` (``BambaForCausalLM``: Mamba-2
layers with attention at ``--attn-layers``).  ``--init DIR`` warm-starts from a
directory this script wrote (the shipped zoo was trained in such stages; see each
model's ``LINEAGE.md``).  All share one word-level world
(:mod:`gather_aggregate.training.vocab`) and one data mixture (:mod:`gather_aggregate.training.data`).

Training: AdamW (betas 0.9/0.98, weight decay 0.1), linear warm-up then cosine
decay to 10 %, fresh data every step, cross-entropy on the target tokens only
(dense: every query of a document is supervised).  The KV dictionary size grows
from ``--kv-start`` to ``--kv-max`` pairs over the first ``--curriculum`` share of
the steps.  Every ``--eval-every`` steps the evaluation prompts (the contract
formats, first query only) are scored and the checkpoint is written, so a run
stopped by ``--max-minutes`` still leaves a complete model directory.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from gather_aggregate.training.data import Mixture, collate, length_bucketed, sample_doc
from gather_aggregate.training.quick_eval import eval_suite, suite_accuracies
from gather_aggregate.training.train_args import (
    ARCHS,
    TrainConfig,
    add_train_arguments,
    check_config,
    config_from_args,
)
from gather_aggregate.training.vocab import PAD, World, build_tokenizer, make_world, save_world

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedModel

def build_model(cfg: TrainConfig, vocab_size: int, pad_id: int, eos_id: int) -> Any:
    """A freshly initialised HF causal LM for ``cfg.arch`` (seeded by ``cfg.seed``)."""
    torch.manual_seed(cfg.seed)
    common = dict(vocab_size=vocab_size, pad_token_id=pad_id, eos_token_id=eos_id, bos_token_id=eos_id,
                  tie_word_embeddings=False)
    if cfg.arch == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        hf = LlamaConfig(hidden_size=cfg.d_model, intermediate_size=cfg.d_ff, num_hidden_layers=cfg.n_layers,
                         num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_heads,
                         max_position_embeddings=1024, **common)
        return LlamaForCausalLM(hf)
    if cfg.arch == "mamba2":
        from transformers import Mamba2Config, Mamba2ForCausalLM

        expand = 2
        hf = Mamba2Config(hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers, state_size=cfg.d_state,
                          expand=expand, num_heads=cfg.n_heads, head_dim=expand * cfg.d_model // cfg.n_heads,
                          n_groups=1, conv_kernel=4, chunk_size=64, **common)
        return Mamba2ForCausalLM(hf)
    if cfg.arch == "mamba1":
        from transformers import MambaConfig, MambaForCausalLM

        hf = MambaConfig(hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers, state_size=cfg.d_state,
                         expand=2, conv_kernel=4, use_mambapy=False, **common)
        return set_mamba1_scan(MambaForCausalLM(hf), cfg.mamba1_scan)
    if cfg.arch == "bamba":
        from transformers import BambaConfig, BambaForCausalLM

        attn = cfg.attn_layers if cfg.attn_layers is not None else [cfg.n_layers - 1]
        if any(not 0 <= i < cfg.n_layers for i in attn):
            raise ValueError(f"--attn-layers {attn} must lie in 0..{cfg.n_layers - 1}")
        hf = BambaConfig(hidden_size=cfg.d_model, intermediate_size=cfg.d_ff, num_hidden_layers=cfg.n_layers,
                         num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_heads, attn_layer_indices=attn,
                         mamba_n_heads=8, mamba_d_head="auto", mamba_n_groups=1, mamba_d_state=cfg.d_state,
                         mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=64, max_position_embeddings=1024,
                         **common)
        return BambaForCausalLM(hf)
    raise ValueError(f"unknown --arch {cfg.arch!r}; choose one of {', '.join(ARCHS)}")


def load_init(cfg: TrainConfig, vocab_size: int) -> Any:
    """Warm start from a directory this script wrote earlier (the same architecture and vocabulary)."""
    from transformers import AutoModelForCausalLM

    init = Path(str(cfg.init))
    rec = json.loads((init / "train_config.json").read_text()) if (init / "train_config.json").exists() else {}
    arch = rec.get("config", {}).get("arch")
    if arch != cfg.arch:
        raise ValueError(f"--init {init} holds a {arch!r} model, not --arch {cfg.arch!r}; "
                         "warm-start from a directory trained with the same --arch")
    model = AutoModelForCausalLM.from_pretrained(init)
    if model.config.vocab_size != vocab_size:
        raise ValueError(f"--init {init} has vocab size {model.config.vocab_size}, the world has {vocab_size}; "
                         "use the same --world-seed")
    if cfg.arch == "mamba1":
        set_mamba1_scan(model, cfg.mamba1_scan)
    if cfg.grow_to is not None:
        grow_layers(model, cfg.grow_to, cfg.seed)
    if cfg.grow_state is not None:
        grow_state(model, cfg.grow_state, cfg.seed)
    return model


def architecture_of(model: PreTrainedModel) -> dict[str, int]:
    """The size fields of :class:`TrainConfig` read off a loaded model's HF config (a warm start's real shape)."""
    c = model.config
    fields = {"d_model": "hidden_size", "n_layers": "num_hidden_layers",
              "d_ff": "intermediate_size" if c.model_type in ("llama", "bamba") else "",  # Mamba's is d_inner
              "n_heads": "num_heads" if c.model_type == "mamba2" else "num_attention_heads",
              "d_state": "mamba_d_state" if c.model_type == "bamba" else "state_size"}
    return {k: int(getattr(c, name)) for k, name in fields.items() if isinstance(getattr(c, name, None), int)}


def grow_layers(model: PreTrainedModel, n_layers: int, seed: int) -> None:
    """Append freshly initialised Llama layers up to ``n_layers`` whose output projections (attention ``o_proj``,
    MLP ``down_proj``) start at zero: each new layer adds nothing to the residual stream at first, so the grown
    model computes exactly what the warm-start checkpoint did, and gradient descent decides what the new layers
    add.  The new layers go on top, after the circuits the checkpoint already has."""
    if model.config.model_type != "llama":
        raise ValueError(f"--grow-to supports llama checkpoints only, not {model.config.model_type!r}")
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    layers = model.model.layers
    if n_layers < len(layers):
        raise ValueError(f"--grow-to {n_layers} is below the checkpoint's {len(layers)} layers")
    torch.manual_seed(seed)
    for i in range(len(layers), n_layers):
        layer = LlamaDecoderLayer(model.config, layer_idx=i)
        layer.apply(model._init_weights)
        with torch.no_grad():
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        layers.append(layer)
    model.config.num_hidden_layers = n_layers


def grow_state(model: PreTrainedModel, d_state: int, seed: int) -> None:
    """Widen every Mamba-1 mixer's SSM state from N to ``d_state`` dimensions per channel, keeping the function.

    Mamba-1 writes ``h_t[c, n] = exp(δ_t[c] A[c, n]) h_{t-1}[c, n] + δ_t[c] B_t[n] x_t[c]`` and reads
    ``y_t[c] = Σ_n C_t[n] h_t[c, n]``; ``B_t`` and ``C_t`` are rows of ``x_proj``'s output.

    1. The new ``B`` rows of ``x_proj`` are zero, so the new state dimensions are never written (``h[:, n] = 0``)
       and ``y`` is what the narrow model computed.
    2. The new ``C`` rows are random at the scale of the old ones: ``∂loss/∂B_new`` is proportional to ``C_new``,
       so the new dimensions start learning at once (both at zero would keep both at zero).
    3. The new ``A_log`` columns continue HF's S4D-real initialisation, ``A[c, n] = -(n + 1)``.
    """
    if model.config.model_type != "mamba":
        raise ValueError(f"--grow-state widens Mamba-1 checkpoints only, not {model.config.model_type!r}")
    old = int(model.config.state_size)
    if d_state < old:
        raise ValueError(f"--grow-state {d_state} is below the checkpoint's state size {old}")
    gen = torch.Generator().manual_seed(seed)
    for layer in model.backbone.layers:
        mixer = layer.mixer
        r, w = mixer.time_step_rank, mixer.x_proj.weight.detach()
        dt_rows, b_rows, c_rows = w[:r], w[r:r + old], w[r + old:]
        new_b = torch.zeros(d_state - old, w.shape[1], dtype=w.dtype)
        new_c = torch.randn(d_state - old, w.shape[1], generator=gen, dtype=w.dtype) * c_rows.std()
        mixer.x_proj.weight = torch.nn.Parameter(torch.cat([dt_rows, b_rows, new_b, c_rows, new_c]))
        mixer.x_proj.out_features = r + 2 * d_state
        a_new = torch.log(torch.arange(old + 1, d_state + 1, dtype=mixer.A_log.dtype)).expand(mixer.A_log.shape[0], -1)
        mixer.A_log = torch.nn.Parameter(torch.cat([mixer.A_log.detach(), a_new], dim=1))
        mixer.ssm_state_size = d_state
    model.config.state_size = d_state


def set_mamba1_scan(model: Any, scan: str) -> Any:
    """Train a ``MambaForCausalLM`` through the chunked scan (``"chunked"``) or HF's mambapy path (``"hf"``);
    either way the parameters and the saved checkpoint are HF's."""
    from gather_aggregate.training.mamba1_scan_forward import use_chunked_scan, use_hf_scan

    if scan == "chunked":
        model.config.use_mambapy = False
        return use_chunked_scan(model)
    if scan == "hf":
        model.config.use_mambapy = True
        return use_hf_scan(model)
    raise ValueError(f"--mamba1-scan {scan!r}: choose 'chunked' or 'hf'")


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to 10 % of ``cfg.lr`` at ``cfg.steps``."""
    assert cfg.lr is not None
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def kv_max_at(step: int, cfg: TrainConfig) -> int:
    """The largest KV dictionary size sampled at ``step`` (linear curriculum)."""
    frac = min(1.0, step / max(1, cfg.curriculum * cfg.steps))
    return round(cfg.kv_start + frac * (cfg.kv_max - cfg.kv_start))


def save_checkpoint(model: PreTrainedModel, tokenizer: Any, world: World, cfg: TrainConfig, out: Path, record: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    mambapy = getattr(model.config, "use_mambapy", None)
    if mambapy:
        model.config.use_mambapy = False  # loads anywhere; training speed is not a property of the checkpoint
    model.save_pretrained(out, safe_serialization=True)
    if mambapy:
        model.config.use_mambapy = True
    save_world(world, tokenizer, out, kv_sizes=list(range(Mixture().kv_min_pairs, cfg.kv_max + 1)))
    (out / "train_config.json").write_text(json.dumps(record, indent=1))


def train_step(model: PreTrainedModel, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One optimiser step on next-token cross-entropy (targets ``-100`` ignored), gradients clipped to norm 1;
    returns the loss."""
    logits = model(input_ids=x).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                             ignore_index=-100)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss


def _model_to_train(cfg: TrainConfig, n_vocab: int, pad_id: int, eos_id: int) -> tuple[PreTrainedModel, TrainConfig]:
    """A fresh model, or the ``--init`` checkpoint with its architecture recorded in the returned config."""
    if cfg.grow_to is not None and not cfg.init:
        raise ValueError("--grow-to needs --init (it grows a trained checkpoint)")
    if cfg.init:
        model = load_init(cfg, n_vocab)
        return model, dataclasses.replace(cfg, **architecture_of(model))  # what was trained, not the defaults
    return build_model(cfg, n_vocab, pad_id, eos_id), cfg


def _training_batches(world: World, rng: random.Random, mix: Mixture, cfg: TrainConfig, vocab: dict[str, int],
                      pad_id: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``(inputs, targets)`` of step 0, 1, ...: ``bucket`` batches are drawn at once (KV size of the step that
    draws them) and grouped by length, which pads less per step, then served in random order."""
    pending: list = []
    for step in itertools.count():
        if not pending:
            pool = [sample_doc(world, rng, mix, kv_max_at(step, cfg))[1] for _ in range(cfg.batch_size * cfg.bucket)]
            pending = length_bucketed(pool, cfg.bucket)
            rng.shuffle(pending)
        yield collate(pending.pop(), vocab, pad_id)


def train(cfg: TrainConfig) -> dict[str, Any]:
    """Train one model; returns the record written to ``train_config.json``."""
    check_config(cfg)  # before the model is built: the CLI checked it before the output folder was made
    cfg = cfg.resolved()
    torch.set_num_threads(cfg.threads)
    out = Path(cfg.out)
    world = make_world(cfg.world_seed)
    tokenizer = build_tokenizer(world)
    vocab = world.vocab()
    pad_id = vocab[PAD]
    model, cfg = _model_to_train(cfg, len(vocab), pad_id, tokenizer.eos_token_id)
    mix = Mixture(kv_max_pairs=cfg.kv_max, **cfg.mixture)
    suite = eval_suite(world, seed=10_000 + cfg.world_seed, n=cfg.eval_n)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), weight_decay=cfg.weight_decay)
    batches = _training_batches(world, random.Random(cfg.seed), mix, cfg, vocab, pad_id)
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "train_log.jsonl"
    log_path.write_text("")
    n_params = sum(p.numel() for p in model.parameters())
    record: dict[str, Any] = {"config": dataclasses.asdict(cfg), "mixture": dataclasses.asdict(mix),
                              "model_class": type(model).__name__, "n_params": n_params,
                              "torch": torch.__version__, "seeds": {"torch": cfg.seed, "data": cfg.seed,
                                                                    "world": cfg.world_seed}}
    print(f"[zoo] {type(model).__name__}: {n_params / 1e6:.3f}M params, vocab {len(vocab)}", flush=True)
    t0 = time.time()
    run_loss, run_n = 0.0, 0
    from tqdm.auto import tqdm

    bar = tqdm(total=min(cfg.steps, cfg.stop_after or cfg.steps), desc=f"training {cfg.arch}", unit="step",
               disable=not cfg.progress, dynamic_ncols=True)
    for step in range(cfg.steps):
        model.train()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        loss = train_step(model, opt, *next(batches))
        if not math.isfinite(loss.item()):
            from gather_aggregate.core.errors import NonFiniteError

            raise NonFiniteError(f"training loss is {loss.item()} at step {step + 1}; the last good checkpoint is in "
                                 f"{out} (restart from it with --init and a lower --lr)")
        run_loss += loss.item()
        run_n += 1
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
        minutes = (time.time() - t0) / 60
        last = (step == cfg.steps - 1 or minutes > cfg.max_minutes
                or (cfg.stop_after is not None and step + 1 >= cfg.stop_after))
        if (step + 1) % cfg.eval_every == 0 or last:
            metrics = suite_accuracies(model, suite, vocab, pad_id)
            row = {"step": step + 1, "minutes": round(minutes, 2), "loss": round(run_loss / run_n, 4),
                   "lr": lr_at(step, cfg), "kv_max": kv_max_at(step, cfg), **metrics}
            with log_path.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"[zoo] {json.dumps(row)}", flush=True)
            run_loss, run_n = 0.0, 0
            record.update(steps_done=step + 1, wall_minutes=round(minutes, 2), final_metrics=metrics,
                          stopped_by_time=minutes > cfg.max_minutes)
            save_checkpoint(model, tokenizer, world, cfg, out, record)
            if cfg.keep_checkpoints:
                save_checkpoint(model, tokenizer, world, cfg, out / "checkpoints" / f"step{step + 1}", record)
        elif (step + 1) % cfg.log_every == 0:
            print(f"[zoo] step {step + 1} loss {run_loss / run_n:.4f} {minutes:.1f} min", flush=True)
        if last:
            break
    bar.close()
    return record


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    p = argparse.ArgumentParser(prog="gather-aggregate zoo train", description=__doc__.split("\n\n")[0])
    add_train_arguments(p)
    return config_from_args(p.parse_args(argv))


def main(argv: list[str] | None = None) -> int:
    train(parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
