"""Train holdout models for an out-of-sample check of the G&A detector: families and prompt formats that neither
the zoo nor the fresh fixtures of ``tests/fixtures/train_fixtures.py`` use.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python scripts/train_holdouts.py arrow-qwen2 --out /tmp/ho/arrow-qwen2
    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python scripts/train_holdouts.py arrow-llama --out /tmp/ho/arrow-llama
    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python scripts/train_holdouts.py arrow-mamba2 --out /tmp/ho/arrow-mamba2 --max-minutes 35
    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python scripts/train_holdouts.py ledger-llama4 --out /tmp/ho/ledger-llama4 --max-minutes 63
    HF_HUB_OFFLINE=1 python scripts/train_holdouts.py arrow-llama12 --out /tmp/ho/arrow-llama12 --device cuda --max-minutes 4.3
    HF_HUB_OFFLINE=1 python scripts/train_holdouts.py arrow-neox --out /tmp/ho/arrow-neox --device cuda --max-minutes 4

(``--ship`` copies the result into ``tests/fixtures/models/<which>``; ``--resume`` goes on from ``--out``.)

* Formats: ``tests/fixtures/holdout_formats.py``.  ``arrow``: ``map : k -> v , ... , ? k ->`` (summary token
  ``,``); ``table``: ``table : v @ k | ... | get k ?`` (the value before its key; summary token ``|``);
  ``ledger``: ``ledger : k => v & ... & ask k =>`` (summary token ``&``), for the depth check only.
* ``ledger-llama4`` / ``ledger-qwen3``: the depth check, 4 layers, d 128, 4 heads, FFN 256: ``LlamaForCausalLM``
  (seed 29, world seed 11) and ``Qwen3ForCausalLM`` (per-head q/k RMSNorms, 4 query heads on 2 key/value heads,
  head size 32; seed 31, world seed 12).
* ``arrow-llama12``: the same depth question at the size issue 24's cost bar names: ``LlamaForCausalLM``, 12 layers,
  d 128, 16 heads of 8 channels (192 heads), FFN 256; seed 37, world seed 13; meant for a GPU (``--device cuda``).
* ``*-qwen2``: ``Qwen2ForCausalLM`` (q/k/v biases, grouped-query attention: 4 query heads share 2 key/value
  heads), 2 layers, d 128, FFN 256; seed 11, world seed 6.
* ``arrow-llama``: ``LlamaForCausalLM`` (the fixtures' family, fresh seeds), 2 layers, d 128, 4 heads, FFN 256;
  seed 13, world seed 7.
* ``arrow-mamba1``: ``MambaForCausalLM`` through the project's chunked S6 scan (as the zoo's ``mamba1-ga``: 2 layers,
  d 128, N 8, lr 2e-3, batch 32; ``ga_head_size`` 32), seed 17, world seed 8.
* ``arrow-mamba2``: ``Mamba2ForCausalLM`` with the ``records-mamba2`` fixture's architecture and settings (3 layers,
  d 128, 8 SSM heads of 32 channels, N 32, one group, conv 4, chunk 64; lr 1e-3, batch 64), seed 23, world seed 10.
* ``arrow-neox`` / ``table-neox``: ``GPTNeoXForCausalLM`` (pythia's family: parallel residual, partial rotary 0.25), 2 layers,
  d 128, 4 heads, FFN 256; seeds 19 / 7, world seeds 9 / 5.

Measured (shared 2-core CPU, two runs side by side): ``arrow-qwen2`` 0.98 at step 350 (5.9 min), ``arrow-llama``
0.97 at step 550 (7.7 min), ``arrow-mamba1`` 0.76 at its 30-minute cap (step 1100), then ``--resume --max-minutes
40``: 0.89 at step 1500 (40.1 min); ``arrow-mamba2`` (``--max-minutes 35``, beside other workers' jobs) did
not learn: its MQAR warm-up stayed near chance (MQAR 0.13-0.18 at steps 300-800, where ``records-mamba2`` had 0.89
at step 800), and after it arrow stayed at 0.10-0.17 (copying some value of the prompt: 1/8) up to the cap, step
1350 (36.6 min: MQAR 0.16, arrow 0.10; not resumed, not shipped); ``arrow-neox`` stayed at chance (MQAR 0.16,
arrow 0.20 at step 1350, 26.5 min; stopped by hand).  Neither ``table`` run learnt the table format in ~20 min:
``table-qwen2`` learnt the MQAR warm-up (0.96 at step 550) but stayed at table8 0.07-0.15 (copying some value of
the prompt: 1/8) up to step 900; ``table-neox`` never left chance on MQAR in its 800 warm-up steps (table8 0.17 at
step 1150).  The value-before-key order defeats the warm-up's adjacent-pair circuit, as TOY_TRIALS Trial 3 found for
the zoo's lines; it would need the ~2k-step plateau, which this CPU could not give in the budget.  Neither 4-layer
``ledger`` run learnt (``--max-minutes 63``, two side by side beside other jobs): the MQAR warm-up stayed at chance
for its 800 steps (0.04-0.20), and to the cap (``ledger-llama4`` step 2000, ``ledger-qwen3`` step 2050) ledger stayed
at 0.06-0.20 (last 0.14 / 0.13); not shipped.  ``arrow-llama12`` (12 layers, 16 heads of 8 channels: 192 heads) on
an H100 (``--device cuda``, about 11 steps a second) did not learn in 4.3 minutes either: MQAR 0.09-0.17 and arrow
0.08-0.14 to step 2800 (docs/results.md, "Depth check"); not shipped.  ``arrow-neox`` on the same H100 (about 24
steps a second) ran its whole 4000-step schedule in 2.8 minutes and stayed at chance: MQAR 0.05-0.17, arrow
0.09-0.20 (last 0.14 / 0.16, loss 2.09); not shipped.

Training is the fixtures' recipe (TOY_TRIALS Trial 4) with the project's own pieces
(:mod:`gather_aggregate.training`): an MQAR warm-up (adjacent ``k v`` pairs, loss on every queried value) until its
first-query accuracy reaches 0.9 (at most 800 steps), then the holdout format with dense queries (every later
query is a target too; keys drawn with replacement), a third of the documents still MQAR.  AdamW (0.9/0.98,
wd 0.1), lr 1e-3 with 100 warm-up steps and cosine decay over 4000, batch 64, fresh data every step, one thread.
Stops when the held-out first-query accuracy of the format (8 pairs, 96 prompts, all 128 values as candidates)
reaches 0.95 or after ``--max-minutes``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))

from holdout_formats import FORMATS, render  # noqa: E402
from train_fixtures import _doc, mixture_training, ship, world_with_words  # noqa: E402

HOLDOUTS = {"table-neox": dict(family="neox", fmt="table", seed=7, world_seed=5),
            "table-qwen2": dict(family="qwen2", fmt="table", seed=11, world_seed=6),
            "arrow-qwen2": dict(family="qwen2", fmt="arrow", seed=11, world_seed=6),
            "arrow-llama": dict(family="llama", fmt="arrow", seed=13, world_seed=7),
            "arrow-mamba1": dict(family="mamba1", fmt="arrow", seed=17, world_seed=8, batch=32, lr=2e-3),
            "arrow-neox": dict(family="neox", fmt="arrow", seed=19, world_seed=9),
            "arrow-mamba2": dict(family="mamba2", fmt="arrow", seed=23, world_seed=10),
            "ledger-llama4": dict(family="llama", fmt="ledger", seed=29, world_seed=11, n_layers=4),
            "ledger-qwen3": dict(family="qwen3", fmt="ledger", seed=31, world_seed=12, n_layers=4),
            "arrow-llama12": dict(family="llama", fmt="arrow", seed=37, world_seed=13, n_layers=12, n_heads=16)}
N_EVAL_PAIRS = 8


def format_world(seed: int, fmt: str) -> Any:
    """The world of ``seed`` with ``fmt``'s own words in its vocabulary."""
    return world_with_words(seed, FORMATS[fmt]["words"])


def build_holdout(family: str, seed: int, vocab_size: int, pad_id: int, eos_id: int, n_layers: int = 2,
                  n_heads: int = 4) -> Any:
    """A fresh d-128 HF causal LM of ``family`` (seeded by ``seed``): ``n_layers`` layers (3 for ``mamba2``),
    ``n_heads`` attention heads (the transformers)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    common = dict(vocab_size=vocab_size, pad_token_id=pad_id, eos_token_id=eos_id, bos_token_id=eos_id,
                  tie_word_embeddings=False, hidden_size=128, intermediate_size=256, num_hidden_layers=n_layers,
                  num_attention_heads=n_heads, max_position_embeddings=1024)
    if family == "neox":
        return transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(rotary_pct=0.25, **common))
    if family == "qwen2":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(num_key_value_heads=2, **common))
    if family == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(num_key_value_heads=n_heads, **common))
    if family == "qwen3":  # q/k RMSNorms per head, grouped-query attention (4 query heads on 2 key/value heads)
        return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(num_key_value_heads=2, head_dim=32, **common))
    if family == "mamba1":  # the project's own builder (trains through its chunked S6 scan), as mamba1-ga
        from gather_aggregate.training.train import TrainConfig, build_model

        cfg = TrainConfig(arch="mamba1", out="", seed=seed, n_layers=2, d_model=128, d_state=8).resolved()
        model = build_model(cfg, vocab_size, pad_id, eos_id)
        model.config.ga_head_size = 32  # 8 channel groups of 32 per layer as the detector's heads, as mamba1-ga
        return model
    if family == "mamba2":  # the records-mamba2 fixture's architecture, through the project's builder
        from gather_aggregate.training.train import TrainConfig, build_model

        cfg = TrainConfig(arch="mamba2", out="", seed=seed, n_layers=3, d_model=128, n_heads=8,
                          d_state=32).resolved()
        return build_model(cfg, vocab_size, pad_id, eos_id)
    raise ValueError(f"unknown family {family!r}; choose neox, qwen2, qwen3, llama, mamba1 or mamba2")


def doc(world: Any, rng: random.Random, kind: str, n_pairs: int, n_queries: int) -> list[tuple[str, bool]]:
    """One training document: an MQAR sequence (``kind="mqar"``) or format ``kind``'s prompt, with ``n_queries``
    supervised queries (the fixtures' document builder with this format's renderer)."""
    if kind == "mqar":
        return _doc(world, rng, kind, n_pairs, n_queries)
    return _doc(world, rng, kind, n_pairs, n_queries, render=lambda pairs, q: render(kind, pairs, q),
                follow=FORMATS[kind]["follow"])


def eval_items(world: Any, kind: str, n: int, seed: int) -> list[tuple[str, str, list[str]]]:
    from gather_aggregate.training.data import mqar_prompt, recall_items

    def prompt(pairs: Any, key: str) -> str:
        return render(kind, pairs, key)

    items = recall_items(world, random.Random(seed), N_EVAL_PAIRS, n, mqar_prompt if kind == "mqar" else prompt)
    return [(it.prompt, it.answer, it.candidates) for it in items]


class _OnDevice:
    """Runs ``model`` (moved to ``device``) on CPU batches and returns its logits on the CPU: the recipe's training
    step and accuracy, written for the CPU, train on a GPU through it."""

    def __init__(self, model: Any, device: str) -> None:
        self.model, self.device = model.to(device), device

    def __call__(self, input_ids: Any) -> Any:
        from types import SimpleNamespace

        return SimpleNamespace(logits=self.model(input_ids=input_ids.to(self.device)).logits.float().cpu())

    def __getattr__(self, name: str) -> Any:  # train(), eval(), parameters() of the model itself
        return getattr(self.model, name)


def train(which: str, out: Path, max_minutes: float, target: float = 0.95, resume: bool = False,
          device: str = "cpu") -> dict:
    import torch

    from gather_aggregate.training.train import TrainConfig
    from gather_aggregate.training.vocab import PAD, build_tokenizer

    h = HOLDOUTS[which]
    torch.set_num_threads(1)
    fmt = h["fmt"]
    world = format_world(h["world_seed"], fmt)
    tok = build_tokenizer(world)
    vocab = world.vocab()
    pad_id = vocab[PAD]
    model = build_holdout(h["family"], h["seed"], len(vocab), pad_id, tok.eos_token_id, h.get("n_layers", 2),
                          h.get("n_heads", 4))
    log: list[dict] = []
    first, warm, done_minutes, resumed_at = 0, True, 0.0, []
    if resume:  # go on from the last checkpoint in ``out`` (weights only: the optimiser state starts afresh)
        from transformers import AutoModelForCausalLM

        rec = json.loads((out / "fixture.json").read_text())
        model = AutoModelForCausalLM.from_pretrained(out)
        if h["family"] == "mamba1":  # train through the project's chunked scan again (HF's reference is slow)
            from gather_aggregate.training.train import set_mamba1_scan

            model = set_mamba1_scan(model, "chunked")
        log, first = rec["log"], rec["steps_done"]
        log = [r for r in log if r["step"] <= first]
        warm, done_minutes = log[-1]["warmup"], log[-1]["minutes"]
        resumed_at = rec.get("resumed_at", []) + [first]
    sched = TrainConfig(arch="llama", out=str(out), steps=4000, seed=h["seed"], lr=h.get("lr", 1e-3),
                        warmup=100).resolved()
    runner = model if device == "cpu" else _OnDevice(model, device)  # moved before the optimiser sees it
    opt = torch.optim.AdamW(model.parameters(), lr=sched.lr, betas=(0.9, 0.98), weight_decay=0.1)
    rng = random.Random(h["seed"]) if first == 0 else random.Random(f"{h['seed']}:{first}")
    ev_mqar = eval_items(world, "mqar", 96, 20_001)
    ev_fmt = eval_items(world, fmt, 96, 20_002)
    out.mkdir(parents=True, exist_ok=True)
    for row, minutes in mixture_training(runner, opt, sched, rng, world, doc, fmt, ev_mqar, ev_fmt, first=first,
                                         warm=warm, minutes_done=done_minutes, batch=h.get("batch", 64)):
        log.append(row)
        done = row[f"{fmt}8"] >= target or minutes > max_minutes
        if done or row["step"] % 250 == 0:
            model.save_pretrained(out, safe_serialization=True)
            tok.save_pretrained(out)
            rec = {"arch": h["family"], "hf_class": type(model).__name__, "format": fmt,
                   "format_words": FORMATS[fmt]["words"], "summary_token": FORMATS[fmt]["summary"],
                   "seed": h["seed"],
                   "world_seed": h["world_seed"], "kv_keys": world.kv_keys, "kv_values": world.kv_values,
                   "n_params": sum(p.numel() for p in model.parameters()), "steps_done": row["step"],
                   "final": row, "log": log, "resumed_at": resumed_at,
                   "command": f"OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python scripts/train_holdouts.py {which} "
                              f"--out DIR --max-minutes {max_minutes:g}"}
            (out / "fixture.json").write_text(json.dumps(rec, indent=1))
        if done:
            break
    return log[-1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("which", choices=sorted(HOLDOUTS))
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--max-minutes", type=float, default=25.0)
    p.add_argument("--resume", action="store_true", help="go on from the checkpoint in --out (weights, step, log)")
    p.add_argument("--ship", action="store_true", help="copy the result into tests/fixtures/models/<which>")
    p.add_argument("--device", default="cpu", help="train on this device (e.g. cuda); the checkpoint is the same")
    a = p.parse_args(argv)
    train(a.which, a.out, a.max_minutes, resume=a.resume, device=a.device)
    if a.ship:
        ship(a.out, a.which)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
