"""The options of ``gather-aggregate zoo train`` (light: no torch), shared by the CLI and :mod:`.train`."""

from __future__ import annotations

import argparse

#: architectures ``zoo train`` builds (HF classes: Llama, Mamba-2, Mamba-1, Bamba)
ARCHS = ("llama", "mamba2", "mamba1", "bamba")


def _layers(v: str) -> list[int]:
    try:
        return [int(x) for x in v.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--attn-layers takes comma-separated layer indices, got {v!r}") from None


def add_train_arguments(p: argparse.ArgumentParser, *, out_required: bool = True) -> None:
    """Add the training options to ``p`` (every one with a help text; defaults shown by the CLI's formatter)."""
    p.add_argument("--arch", choices=ARCHS, default="llama", help="architecture to train")
    p.add_argument("--out", required=out_required, default=None,
                   help="model directory to write (created if missing)"
                        + ("" if out_required else "; default ga_out/zoo-<arch>"))
    p.add_argument("--steps", type=int, default=6000, help="training steps")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the data order")
    p.add_argument("--world-seed", type=int, default=0, help="seed of the vocabulary and facts (keep 0 for the zoo)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--batch-size", type=int, default=64, help="sequences per step")
    p.add_argument("--bucket", type=int, default=4, help="batches drawn at once and grouped by length")
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (default: per architecture)")
    p.add_argument("--warmup", type=int, default=100, help="learning-rate warm-up steps")
    for name, what in (("d-model", "model width"), ("n-layers", "layers"), ("n-heads", "heads per layer"),
                       ("d-ff", "MLP width"), ("d-state", "SSM state size")):
        p.add_argument(f"--{name}", type=int, default=None, help=f"{what} (default: per architecture)")
    p.add_argument("--kv-start", type=int, default=4, help="KV dictionary size at the start of the curriculum")
    p.add_argument("--kv-max", type=int, default=16, help="largest KV dictionary size")
    p.add_argument("--curriculum", type=float, default=0.4, help="share of the steps over which KV size grows")
    p.add_argument("--eval-every", type=int, default=250, help="steps between evaluations (and checkpoints)")
    p.add_argument("--eval-n", type=int, default=128, help="prompts per evaluation")
    p.add_argument("--max-minutes", type=float, default=90.0, help="stop after this many minutes")
    p.add_argument("--log-every", type=int, default=50, help="steps between loss lines in the log")
    p.add_argument("--mixture", type=str, default="{}", help='JSON overrides of data.Mixture, e.g. \'{"kv": 0.5}\'')
    p.add_argument("--attn-layers", type=_layers, default=None,
                   help="bamba only: comma-separated attention layer indices (default: the last layer)")
    p.add_argument("--grow-to", type=int, default=None, metavar="N",
                   help="llama with --init only: append identity-initialised layers up to N layers")
    p.add_argument("--init", default=None, help="warm-start from a model directory this script wrote (same --arch)")
    p.add_argument("--keep-checkpoints", action="store_true",
                   help="also keep every eval's checkpoint, in <out>/checkpoints/step<N> (for curriculum stages)")
    p.add_argument("--stop-after", type=int, default=None, metavar="N",
                   help="stop after N steps while the learning-rate schedule still spans --steps (a stage that "
                        "takes the step-N checkpoint of a longer run)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (the log lines stay)")
