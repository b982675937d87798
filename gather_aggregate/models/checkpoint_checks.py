"""What :func:`gather_aggregate.load_model` checks about a checkpoint on disk before and after HF reads it.

Each check turns a checkpoint that would load wrong (silently, or deep inside transformers) into one line of
our own errors naming the fix:

* a path that holds no ``config.json``: which of the usual look-alikes it is (a PEFT adapter, a Hugging Face
  cache folder, a folder around the checkpoint, a tokenizer alone) and what to load instead;
* a path that is a file (a weight file, ``config.json``, a GGUF file);
* a quantized checkpoint (``quantization_config``): the SSM/hybrid loader reads float tensors only;
* a config that loads into nothing (zero layers or positions);
* weights the model would not hold: keys missing from the checkpoint, or layers beyond the config's count
  (HF drops them with a warning: the model would silently lose its last layers).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from gather_aggregate.core.errors import CheckpointError, ModelLoadError, UnsupportedModelError

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model", "spiece.model")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")
_SAVE = "save the model there with model.save_pretrained(dir)"


def file_message(path: Path) -> str:
    """Why a file is not a model, and what to pass instead."""
    parent = path.parent
    if path.suffix.lower() == ".gguf":
        return (f"{str(path)!r} is a GGUF file; load_model reads Hugging Face checkpoints (a directory with "
                "config.json and safetensors weights): pass the directory of the model's original HF release")
    if (parent / "config.json").is_file() and (path.name == "config.json" or path.name.endswith(_WEIGHT_SUFFIXES)
                                               or path.name.endswith(".index.json")):
        return f"{str(path)!r} is a file of a checkpoint; pass its directory: load_model({str(parent)!r})"
    return f"{str(path)!r} is a file; pass the model directory that holds config.json"


def _hf_cache_snapshot(path: Path) -> Path | None:
    """The snapshot of a Hugging Face cache folder (``models--org--name``) that ``refs/main`` names, else the
    newest one that holds a config.json."""
    snaps = path / "snapshots"
    if not snaps.is_dir():
        return None
    ref = path / "refs" / "main"
    if ref.is_file() and (snaps / ref.read_text().strip() / "config.json").is_file():
        return snaps / ref.read_text().strip()
    found = sorted((s for s in snaps.iterdir() if (s / "config.json").is_file()), key=lambda s: s.stat().st_mtime)
    return found[-1] if found else None


def no_config_message(path: Path) -> str:
    """Why a directory without ``config.json`` is not a model, naming what to load instead."""
    shown = str(path)
    if (path / "adapter_config.json").is_file():
        try:
            base = json.loads((path / "adapter_config.json").read_text()).get("base_model_name_or_path")
        except (OSError, ValueError, AttributeError):
            base = None
        of = f" of {base!r}" if base else ""
        return (f"{shown!r} holds a PEFT adapter{of} (adapter_config.json), not a whole model; merge it into its "
                "base model and save that, e.g. PeftModel.from_pretrained(base, dir).merge_and_unload()"
                ".save_pretrained(out), then load_model(out)")
    if (path / "snapshots").is_dir():
        snap = _hf_cache_snapshot(path)
        if snap is not None:
            return f"{shown!r} is a Hugging Face cache folder; load its snapshot: load_model({str(snap)!r})"
        return f"{shown!r} is a Hugging Face cache folder without a complete snapshot; download the model again"
    if (path / "config.json").exists():  # e.g. a directory named config.json
        return f"{str(path / 'config.json')!r} is not a file; {_SAVE}"
    inner = sorted(p for p in path.iterdir() if p.is_dir() and (p / "config.json").is_file()) if path.is_dir() else []
    if inner:
        options = " or ".join(f"load_model({str(p)!r})" for p in inner[:3])
        return f"{shown!r} has no config.json, but {len(inner)} folder(s) in it do: did you mean {options}?"
    if path.is_dir() and any((path / f).is_file() for f in _TOKENIZER_FILES) and \
            not any(p.name.endswith(_WEIGHT_SUFFIXES) for p in path.iterdir()):
        return f"{shown!r} holds only a tokenizer; the model's config.json and weights are missing: {_SAVE}"
    if path.is_dir() and not any(path.iterdir()):
        return f"{shown!r} is empty (no config.json, no weights); {_SAVE}"
    return f"{shown!r} has no config.json; {_SAVE}"


def refuse_quantized(config: Any, source: str) -> None:
    """A quantized checkpoint on the SSM/hybrid path: our loader copies stored tensors as floats, so packed integer
    weights would load as nonsense (or as a misleading shape mismatch)."""
    quant = getattr(config, "quantization_config", None)
    if quant is None:
        return
    method = quant.get("quant_method") if isinstance(quant, dict) else getattr(quant, "quant_method", None)
    raise UnsupportedModelError(
        f"the checkpoint in {source!r} is quantized (quant_method {str(method)!r}); SSM and hybrid models load "
        "from float weights only: load the model's unquantized checkpoint (dtype='bfloat16' halves its memory)")


def quantized_import_error(config: Any, source: str, exc: ImportError) -> ModelLoadError:
    """transformers' ImportError for a quantized transformer's missing backend (bitsandbytes, GPTQ, AWQ, ...)."""
    quant = getattr(config, "quantization_config", None)
    method = quant.get("quant_method") if isinstance(quant, dict) else getattr(quant, "quant_method", None)
    why = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
    what = f"the checkpoint in {source!r} is quantized (quant_method {str(method)!r}) and " if quant else ""
    return ModelLoadError(f"{what}transformers cannot load it here ({why}); install that package, or load the "
                          "model's unquantized checkpoint")


#: config keys (HF's names across families) that must be positive: a model without layers or positions loads, but
#: every analysis then answers nothing (no heads) or refuses every prompt
_POSITIVE_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "max_position_embeddings", "n_positions")
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
#: a decoder layer's index in an HF key: ``model.layers.3.``, ``transformer.h.3.``, ``gpt_neox.layers.3.``
_LAYER_INDEX = re.compile(r"(?:^|\.)(?:layers|h|blocks|layer)\.(\d+)\.")


def refuse_empty(config: Any, source: str) -> None:
    for key in _POSITIVE_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value < 1:
            raise ModelLoadError(f"config.json in {source!r} has {key}={value}; it must be at least 1 (fix "
                                 "config.json or re-save the model with model.save_pretrained(dir))")


def refuse_missing(hf: Any, info: dict[str, Any], source: str) -> None:
    """Parameters the checkpoint does not hold would be random, and layers beyond the config's count would be
    dropped (HF only warns for both): one :class:`CheckpointError` each."""
    params = {name for name, _ in hf.named_parameters()}
    missing = sorted(k for k in info.get("missing_keys", ()) if k in params)
    if missing:
        raise CheckpointError(f"checkpoint in {source!r} does not match its config: missing keys ({len(missing)}): "
                              f"{', '.join(missing[:4])}{', ...' if len(missing) > 4 else ''}; the config.json and the "
                              "weights must come from the same model (re-save it with model.save_pretrained(dir))")
    key = next((k for k in _LAYER_KEYS if isinstance(getattr(hf.config, k, None), int)), None)
    if key is None:
        return
    n = int(getattr(hf.config, key))
    extra = sorted({int(m.group(1)) for k in info.get("unexpected_keys", ()) for m in [_LAYER_INDEX.search(k)]
                    if m is not None and int(m.group(1)) >= n})
    if extra:
        raise CheckpointError(f"checkpoint in {source!r} holds layers up to {extra[-1]}, but its config.json has "
                              f"{key}={n}: the model would silently lose its last layers; set {key}={extra[-1] + 1} "
                              "in config.json (or re-save the model with model.save_pretrained(dir))")


def refuse_headless(archs: list[str], what: str) -> None:
    """A base model without a language-model head (``LlamaModel``, ``Mamba2Model``: what ``AutoModel`` loads): the
    toolkit reads next-token logits.  It was refused as an architecture the bridge has no adapter for, as a bridge
    AttributeError, or as a checkpoint missing every key."""
    base = [a for a in archs if a.endswith("Model") and not a.endswith("LMHeadModel")]
    if archs and len(base) == len(archs):
        raise UnsupportedModelError(
            f"{what}{base[0]}, a base model without a language-model head; gather-aggregate reads a causal LM's "
            f"next-token logits: use {base[0].removesuffix('Model')}ForCausalLM (AutoModelForCausalLM loads and "
            "saves it; AutoModel drops the head)")


def refuse_headless_module(hf_model: Any) -> None:
    """:func:`refuse_headless` for an in-memory model: an HF base model (what ``AutoModel.from_pretrained`` gives,
    its config still naming the causal LM) has no output embeddings."""
    heads = getattr(hf_model, "get_output_embeddings", None)
    if callable(heads) and heads() is None:
        name = type(hf_model).__name__
        refuse_headless([name if name.endswith("Model") else name + "Model"], "from_hf_model got ")


def unwrap_module(hf_model: Any) -> Any:
    """The HF model inside ``torch.compile``'s ``OptimizedModule`` or (Distributed)DataParallel; a model whose
    parameters are on the meta device (built under ``init_empty_weights`` / ``device="meta"``) is refused."""
    from gather_aggregate.core.errors import InputError

    for _ in range(3):
        inner = getattr(hf_model, "_orig_mod", None) or (getattr(hf_model, "module", None)
                                                         if type(hf_model).__name__.endswith("DataParallel") else None)
        if inner is None:
            break
        hf_model = inner
    if any(p.is_meta for p in hf_model.parameters()):
        raise InputError(f"the {type(hf_model).__name__} has parameters on the meta device (no values: built under "
                         "init_empty_weights or device='meta'); load its weights first, or pass its directory to "
                         "load_model")
    return hf_model


def first_mismatch(source: Any) -> str:
    """``" (TENSOR is SHAPE in the checkpoint but SHAPE for the config; N tensors differ)"``: the checkpoint's
    safetensors headers against the HF model its config builds on the meta device; ``""`` where either cannot be
    read (HF logs its table but raises without it)."""
    try:
        import torch
        from safetensors import safe_open
        from transformers import AutoConfig, AutoModelForCausalLM

        with torch.device("meta"):
            want = {k: tuple(v.shape) for k, v in AutoModelForCausalLM.from_config(
                AutoConfig.from_pretrained(str(source))).state_dict().items()}
        got: dict[str, tuple[int, ...]] = {}
        for f in sorted(Path(source).glob("*.safetensors")):
            with safe_open(str(f), "pt") as sf:
                got.update({k: tuple(sf.get_slice(k).get_shape()) for k in sf.keys()})
        bad = [(k, got[k], want[k]) for k in sorted(got) if k in want and got[k] != want[k]]
    except Exception:  # noqa: BLE001 - only a better message is lost
        return ""
    if not bad:
        return ""
    k, g, w = bad[0]
    return f" ({k} is {g} in the checkpoint but {w} for the config; {len(bad)} tensors differ)"
