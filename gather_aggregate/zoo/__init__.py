"""The toy zoo: tiny models trained here (``gather_aggregate.training.train``) and shipped as package data.

Each model lives in ``gather_aggregate/zoo/<name>/`` in HF ``save_pretrained``
layout, with its tokenizer, ``facts.json``, ``zoo_tasks.json`` and
``train_config.json``; ``load_model(zoo_path(name))`` loads it like any checkpoint.
"""

from __future__ import annotations

from pathlib import Path

ZOO_DIR = Path(__file__).resolve().parent


def list_zoo() -> dict[str, Path]:
    """Shipped zoo models: name -> directory (those with a ``config.json``)."""
    return {p.name: p for p in sorted(ZOO_DIR.iterdir()) if p.is_dir() and (p / "config.json").is_file()}


#: shipped models the default demo leaves out (``gather-aggregate demo --model NAME`` runs them): ``mamba1-ga``
#: retrieves weakly (KV 0.21 at 12 pairs); the Mamba-1 that retrieves, ``mamba1-kv``, is in the demo
DEMO_SKIP = ("mamba1-ga",)


def demo_models() -> dict[str, Path]:
    """The models ``gather-aggregate demo`` runs by default: every shipped model but :data:`DEMO_SKIP`."""
    return {name: p for name, p in list_zoo().items() if name not in DEMO_SKIP}


def zoo_path(name: str) -> Path:
    """The directory of a shipped zoo model (raises, listing the shipped names, if ``name`` is not one)."""
    from gather_aggregate.core.errors import ModelLoadError

    zoo = list_zoo()
    if name not in zoo:
        raise ModelLoadError(f"no zoo model named {name!r}; shipped: {', '.join(zoo) or '(none)'}. Train one with "
                             "`gather-aggregate zoo train`, or pass a model directory")
    return zoo[name]


def resolve_model_path(name: str | None) -> str:
    """A shipped zoo name (``llama-ga``) becomes its directory; a path or hub name comes back unchanged."""
    if name is None:
        from gather_aggregate.core.errors import InputError

        raise InputError("no --model given; pass a zoo name (see `gather-aggregate zoo list`) or a model directory")
    p = list_zoo().get(name)
    return str(p) if p is not None else name
