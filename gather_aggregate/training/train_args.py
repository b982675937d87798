"""What ``gather-aggregate zoo train`` takes (light: no torch): :class:`TrainConfig`, whose fields are also the
command-line options (:func:`add_train_arguments` builds them from the fields' help texts), shared by the CLI and
:mod:`.train`."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from gather_aggregate.core.errors import InputError

#: architectures ``zoo train`` builds (HF classes: Llama, Mamba-2, Mamba-1, Bamba)
ARCHS = ("llama", "mamba2", "mamba1", "bamba")

# Default sizes per architecture (overridable from the CLI).
DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": dict(d_model=128, n_layers=3, n_heads=4, d_ff=256, lr=1e-3),
    "mamba2": dict(d_model=128, n_layers=4, n_heads=8, d_state=32, lr=2e-3),
    "mamba1": dict(d_model=128, n_layers=4, d_state=16, lr=2e-3),
    # a hybrid: Mamba-2 layers with attention at ``attn_layers`` (default: the last layer)
    "bamba": dict(d_model=128, n_layers=2, n_heads=4, d_ff=256, d_state=32, lr=1e-3),
}


def _layers(v: str) -> list[int]:
    try:
        return [int(x) for x in v.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--attn-layers takes comma-separated layer indices, got {v!r}") from None


def _option(default: Any, help_text: str, *, factory: Any = None, **argparse_settings: Any) -> Any:
    """A field that is also a ``zoo train`` option ``--<name-with-dashes>``: its help text, and argparse settings
    beyond the type read off the annotation (``flag``: another option string; ``cli_default``: the option's own
    default where it is not the field's).  ``factory`` makes a mutable default."""
    metadata = {"help": help_text, **argparse_settings}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass
class TrainConfig:
    """One training run; every field but ``weight_decay`` is a ``zoo train`` option (``None``: per architecture,
    :data:`DEFAULTS`)."""

    arch: str = _option("llama", "architecture to train", choices=ARCHS)
    out: str = _option("zoo_out", "model directory to write (created if missing)", cli_default=None)
    steps: int = _option(6000, "training steps")
    seed: int = _option(0, "seed of the weights and the data order")
    world_seed: int = _option(0, "seed of the vocabulary and facts (keep 0 for the zoo)")
    threads: int = _option(1, "torch CPU threads")
    batch_size: int = _option(64, "sequences per step")
    bucket: int = _option(4, "batches drawn at once and grouped by length")
    lr: float | None = _option(None, "peak learning rate (default: per architecture)")
    warmup: int = _option(100, "learning-rate warm-up steps")
    weight_decay: float = 0.1
    d_model: int | None = _option(None, "model width (default: per architecture)")
    n_layers: int | None = _option(None, "layers (default: per architecture)")
    n_heads: int | None = _option(None, "heads per layer (default: per architecture)")
    d_ff: int | None = _option(None, "MLP width (default: per architecture)")
    d_state: int | None = _option(None, "SSM state size (default: per architecture)")
    kv_start: int = _option(4, "KV dictionary size at the start of the curriculum")
    kv_max: int = _option(16, "largest KV dictionary size")
    curriculum: float = _option(0.4, "share of the steps over which KV size grows")
    eval_every: int = _option(250, "steps between evaluations (and checkpoints)")
    eval_n: int = _option(128, "prompts per evaluation")
    max_minutes: float = _option(90.0, "stop after this many minutes")
    log_every: int = _option(50, "steps between loss lines in the log")
    mixture: dict[str, Any] = _option(None, 'JSON overrides of data.Mixture, e.g. \'{"kv": 0.5}\'', factory=dict,
                                       cli_default="{}")
    attn_layers: list[int] | None = _option(
        None, "bamba only: comma-separated attention layer indices (default: the last layer)", type=_layers)
    init: str | None = _option(None, "warm-start from a model directory this script wrote (same --arch)")
    grow_to: int | None = _option(
        None, "llama with --init only: append identity-initialised layers up to N layers", metavar="N")
    grow_state: int | None = _option(
        None, "mamba1 with --init only: widen the SSM state to N dimensions per channel, the function unchanged "
              "(new dimensions start unwritten)", metavar="N")
    keep_checkpoints: bool = _option(
        False, "also keep every eval's checkpoint, in <out>/checkpoints/step<N> (for curriculum stages)")
    stop_after: int | None = _option(
        None, "stop after N steps while the learning-rate schedule still spans --steps (a stage that takes the "
              "step-N checkpoint of a longer run)", metavar="N")
    progress: bool = _option(True, "no progress bar (the log lines stay)", flag="--no-progress")
    mamba1_scan: str = _option("chunked", "mamba1 only: train through the project's chunked S6 scan or HF's "
                                           "mambapy path", choices=("chunked", "hf"))

    def resolved(self) -> TrainConfig:
        cfg = dataclasses.replace(self)
        for k, v in DEFAULTS[self.arch].items():
            if getattr(cfg, k) is None:
                setattr(cfg, k, v)
        return cfg


#: the argparse type of an annotation's first member (``str``: argparse's own default)
_TYPES: dict[str, Any] = {"int": int, "float": float}


def add_train_arguments(p: argparse.ArgumentParser, *, out_required: bool = True) -> None:
    """Add the training options to ``p``, one per :class:`TrainConfig` field with a help text (defaults shown by
    the CLI's formatter).  A ``bool`` field is a switch that flips its default."""
    for f in dataclasses.fields(TrainConfig):
        if "help" not in f.metadata:
            continue
        settings = {k: v for k, v in f.metadata.items() if k not in ("flag", "cli_default")}
        flag = f.metadata.get("flag", "--" + f.name.replace("_", "-"))
        if f.type == "bool":
            settings["action"] = "store_true"
        else:
            settings["default"] = f.metadata.get("cli_default", f.default)
            if (kind := _TYPES.get(str(f.type).split(" | ")[0])) is not None:
                settings.setdefault("type", kind)
        if f.name == "out":
            settings["required"] = out_required
            settings["help"] += "" if out_required else "; default ga_out/zoo-<arch>"
        p.add_argument(flag, **settings)


def config_from_args(args: argparse.Namespace, **fields: Any) -> TrainConfig:
    """The :class:`TrainConfig` of parsed options (``--mixture`` read as JSON), with ``fields`` set on top."""
    try:
        mixture = json.loads(args.mixture)
    except json.JSONDecodeError as exc:
        raise InputError(f"--mixture is not JSON ({exc}); e.g. --mixture '{{\"kv\": 0.5}}'") from None
    given = vars(args)
    kw = {f.name: given[f.name] for f in dataclasses.fields(TrainConfig) if f.name in given}
    kw.update(mixture=mixture, progress=not given.get("no_progress", False), **fields)
    check_ranges(kw)
    cfg = TrainConfig(**kw)
    check_config(cfg)
    return cfg


def check_config(cfg: TrainConfig) -> None:
    """What ``zoo train`` checks before any folder is made or model built: the ``--mixture`` keys and values
    (an unknown key was a TypeError after the output folder existed), ``--attn-layers`` (bamba only, each a layer
    of the model), and ``--grow-to`` (needs ``--init``)."""
    import math

    from gather_aggregate.training.data import Mixture  # imports torch: only when a run is configured

    mix = cfg.mixture
    if not isinstance(mix, dict):
        raise InputError(f"--mixture must be a JSON object of data.Mixture fields, e.g. '{{\"kv\": 0.5}}', got "
                         f"{type(mix).__name__}")
    fields = {f.name: f for f in dataclasses.fields(Mixture)}
    for key, value in mix.items():
        if key == "kv_max_pairs":
            raise InputError("--mixture cannot set kv_max_pairs: the KV curriculum sets it; pass --kv-max instead")
        if key not in fields:
            raise InputError(f"--mixture has no field {key!r}; use some of {', '.join(k for k in fields if k != 'kv_max_pairs')}")
        kind = str(fields[key].type)
        if kind.startswith("tuple"):
            ok = isinstance(value, (list, tuple)) and len(value) == 2 and all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value) and value[0] <= value[1]
            if not ok:
                raise InputError(f"--mixture {key} is a range [low, high] of whole numbers, low <= high; got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0 \
                or (kind == "int" and not isinstance(value, int)):
            what = "a whole number >= 0" if kind == "int" else "a number >= 0"
            raise InputError(f"--mixture {key} must be {what}, got {value!r}")
    weights = ("kv", "letter_mc", "content_mc", "knowledge", "mqar", "letter_lookup", "reverse_mqar", "letter_recall")
    if sum(float(mix.get(k, fields[k].default)) for k in weights) <= 0:
        raise InputError(f"--mixture gives every document kind weight 0; give one of {', '.join(weights)} a weight > 0")
    if cfg.attn_layers is not None:
        if cfg.arch != "bamba":
            raise InputError(f"--attn-layers places attention in a bamba hybrid; --arch {cfg.arch} has none: drop it "
                             "or pass --arch bamba")
        n = cfg.n_layers if cfg.n_layers is not None else DEFAULTS["bamba"]["n_layers"]
        bad = [i for i in cfg.attn_layers if not 0 <= i < n]
        if bad or not cfg.attn_layers or len(set(cfg.attn_layers)) != len(cfg.attn_layers):
            raise InputError(f"--attn-layers {','.join(map(str, cfg.attn_layers))} must list distinct layers in "
                             f"0..{n - 1} (the model has {n} layers; --n-layers sets it)")
    for name, arch, what in (("grow_to", "llama", "appends Llama layers"),
                             ("grow_state", "mamba1", "widens a Mamba-1 state")):
        if getattr(cfg, name) is None:
            continue
        flag = "--" + name.replace("_", "-")
        if cfg.arch != arch:
            raise InputError(f"{flag} {what}; --arch {cfg.arch} cannot: drop it")
        if not cfg.init:
            raise InputError(f"{flag} needs --init (it grows a trained checkpoint)")
    if cfg.init:
        _check_init(cfg)


def _check_init(cfg: TrainConfig) -> None:
    """``--init``: a directory this script wrote, of the same ``--arch``; ``--grow-to`` (Llama only) at least its
    layer count, ``--grow-state`` (Mamba-1 only) at least its state size.  These were ValueErrors after the output folder existed."""
    from pathlib import Path

    init = Path(str(cfg.init)).expanduser()
    if not (init / "config.json").is_file():
        raise InputError(f"--init {str(init)!r} is not a model directory (no config.json); pass a directory "
                         "`gather-aggregate zoo train` wrote")
    rec_path = init / "train_config.json"
    try:
        arch = json.loads(rec_path.read_text()).get("config", {}).get("arch") if rec_path.is_file() else None
        hf = json.loads((init / "config.json").read_text())
        n_layers, d_state = hf.get("num_hidden_layers"), hf.get("state_size")
    except (OSError, ValueError, AttributeError):
        raise InputError(f"--init {str(init)!r}: its config.json or train_config.json is not readable JSON; pass a "
                         "directory `gather-aggregate zoo train` wrote") from None
    if arch != cfg.arch:
        raise InputError(f"--init {str(init)!r} holds a {arch!r} model, not --arch {cfg.arch!r}; warm-start from a "
                         "directory trained with the same --arch")
    if cfg.grow_to is not None:
        if isinstance(n_layers, int) and cfg.grow_to < n_layers:
            raise InputError(f"--grow-to {cfg.grow_to} is below the --init checkpoint's {n_layers} layers; pass "
                             f"--grow-to {n_layers} or more")
    if cfg.grow_state is not None:
        if isinstance(d_state, int) and cfg.grow_state < d_state:
            raise InputError(f"--grow-state {cfg.grow_state} is below the --init checkpoint's state size {d_state}; "
                             f"pass --grow-state {d_state} or more")


#: the least value of each numeric option (None: not given, the architecture's default); curriculum is a share
_AT_LEAST: dict[str, float] = {
    **dict.fromkeys(("steps", "threads", "batch_size", "bucket", "eval_every", "eval_n", "log_every", "kv_start",
                     "kv_max", "d_model", "n_layers", "n_heads", "d_ff", "d_state", "grow_to", "grow_state",
                     "stop_after"), 1),
    **dict.fromkeys(("seed", "world_seed", "warmup", "curriculum"), 0),
}


def check_ranges(kw: dict[str, Any]) -> None:
    """Refuse a count below its least value (``--steps -1`` trained nothing and saved the untrained model), a
    learning rate or time limit that is not positive, and a curriculum share outside ``[0, 1]``."""
    for name, least in _AT_LEAST.items():
        if kw.get(name) is not None and kw[name] < least:
            raise InputError(f"--{name.replace('_', '-')} must be at least {least}, got {kw[name]}")
    for name in ("lr", "max_minutes"):
        if kw.get(name) is not None and not kw[name] > 0:
            raise InputError(f"--{name.replace('_', '-')} must be a positive number, got {kw[name]}")
    if kw.get("curriculum") is not None and kw["curriculum"] > 1:
        raise InputError(f"--curriculum is a share of the steps, from 0 to 1; got {kw['curriculum']}")
