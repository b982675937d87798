"""``load_model``: one entry point for transformers, SSMs and hybrids.

Dispatch is on the HF ``config.model_type``:

* SSM and hybrid types go to our hooked models in :mod:`gather_aggregate.adapters`;
* every architecture TransformerLens' ``TransformerBridge`` supports comes back
  as a :class:`gather_aggregate.models.bridge.BridgeModel`.

Models load from a local directory (``save_pretrained`` layout) or, when the
hub is reachable or the files are in the local HF cache, from a hub name.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gather_aggregate.core.errors import (
    InputError,
    ModelLoadError,
    TokenizerMissingError,
    UnsupportedModelError,
)
from gather_aggregate.core.model_state import outside_inference_mode
from gather_aggregate.models.checkpoint_checks import (
    _TOKENIZER_FILES,
    file_message,
    first_mismatch,
    no_config_message,
)


def _offline() -> bool:
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes") for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def parse_dtype(dtype: Any) -> Any:
    """``None``, ``"auto"``, a ``torch.dtype`` or a name such as ``"float32"``/``"bf16"`` (one home:
    :func:`gather_aggregate.adapters.streaming.parse_dtype`)."""
    from gather_aggregate.adapters.streaming import parse_dtype as parse

    return parse(dtype)


def ssm_model_types() -> tuple[str, ...]:
    """Model types served by our hooked SSM/hybrid adapters (empty until they are installed)."""
    try:
        from gather_aggregate import adapters
    except ImportError:  # pragma: no cover
        return ()
    return tuple(getattr(adapters, "SSM_MODEL_TYPES", ())) + tuple(getattr(adapters, "HYBRID_MODEL_TYPES", ()))


def supported_model_types() -> dict[str, list[str]]:
    """What ``load_model`` accepts: SSM/hybrid ``model_type``s and the decoder-only transformer architectures it
    serves through TransformerLens' bridge (:func:`gather_aggregate.models.supported.decoder_architectures`)."""
    from gather_aggregate.models.supported import decoder_architectures

    return {"ssm_and_hybrid_model_types": sorted(ssm_model_types()),
            "transformer_architectures": decoder_architectures()}


def parse_device(device: Any) -> Any:
    """``None`` or a device this torch build can use (``cpu``, ``cuda``, ``cuda:1``, ``mps``), else a clear error."""
    import torch

    if device is None:
        return None
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise InputError(f"unknown device {device!r}; use cpu, cuda, cuda:N or mps") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"device {device!r}: this torch build or machine has no CUDA "
                             f"(torch {torch.__version__}); use --device cpu, or install a CUDA build of torch")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise InputError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) "
                             f"(cuda:0..cuda:{torch.cuda.device_count() - 1})")
    elif dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise InputError(f"device {device!r}: MPS is not available here; use --device cpu")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise InputError(f"device {device!r} is not supported; use cpu, cuda, cuda:N or mps")
    return dev


def _zoo_names() -> dict[str, Path]:
    try:
        from gather_aggregate.zoo import list_zoo
    except ImportError:  # pragma: no cover
        return {}
    return dict(list_zoo())


def _looks_like_path(name: str) -> bool:
    """A name the user meant as a local path: absolute, ``./``/``../``/``~``, or more than one ``/``."""
    return name.startswith(("/", "./", "../", "~")) or name.count("/") > 1


def resolve_source(name_or_path: str | os.PathLike[str]) -> str:
    """A zoo name (``llama-kvmc``) → its shipped directory; a path → checked; a hub name → unchanged.

    A name close to a zoo name (``llama-kvm``) or to nothing the hub could hold
    fails fast with a "did you mean" instead of a minute of hub retries.
    """
    import difflib

    if not isinstance(name_or_path, (str, os.PathLike)):
        raise ModelLoadError(f"load_model takes a model directory, a zoo name or a hub name, got "
                             f"{type(name_or_path).__name__}")
    name = str(name_or_path)
    path = Path(name).expanduser()
    if path.exists():
        return str(path)
    zoo = _zoo_names()
    if name in zoo:
        return str(zoo[name])
    if _looks_like_path(name):
        parent = path.parent if str(path.parent) not in ("", ".") else Path(".")
        near = difflib.get_close_matches(path.name, [p.name for p in parent.iterdir()] if parent.is_dir() else [], 1)
        raise ModelLoadError(f"no such model directory: {name!r}"
                             + (f"; did you mean {str(parent / near[0])!r}?" if near else
                                "; pass an existing directory that holds config.json"))
    close = difflib.get_close_matches(name, list(zoo), n=1, cutoff=0.75)
    if close and "/" not in name:
        raise ModelLoadError(f"{name!r} is neither a local directory nor a zoo model; did you mean the zoo model "
                             f"{close[0]!r}? (zoo: {', '.join(zoo)})")
    return name


def _resolve_config(name_or_path: str | os.PathLike[str]) -> tuple[Any, str]:
    from transformers import AutoConfig

    source = resolve_source(name_or_path)
    path = Path(source).expanduser()
    if path.is_file():
        raise ModelLoadError(file_message(path))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(no_config_message(path))
        return _read_config(AutoConfig, path), str(path)
    name = source
    zoo = _zoo_names()
    zoo_hint = f" (zoo models: {', '.join(zoo)})" if zoo and "/" not in name else ""
    hint = (f"download it first (e.g. `hf download {name} --local-dir ./{Path(name).name}`) and pass the local "
            f"directory, e.g. load_model('./{Path(name).name}')")
    try:
        return AutoConfig.from_pretrained(name), name
    except Exception as exc:  # noqa: BLE001 - any hub/cache failure becomes one clear message
        if _offline():
            raise ModelLoadError(f"{name!r} is not a local directory or a zoo model, and the hub is offline "
                                 f"(HF_HUB_OFFLINE=1){zoo_hint}; {hint}") from None
        raise ModelLoadError(f"could not load a config for {name!r} ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else ''}){zoo_hint}; {hint}") from None


def _read_config(auto_config: Any, path: Path) -> Any:
    """The directory's HF config; an unknown ``model_type`` or a damaged config.json is one clear error."""
    import json

    try:
        raw = json.loads((path / "config.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{str(path / 'config.json')!r} is damaged ({exc}); re-save the model with "
                             "model.save_pretrained(dir) or download it again") from None
    if not isinstance(raw, dict):
        raise ModelLoadError(f"{str(path / 'config.json')!r} holds a JSON {type(raw).__name__}, not an object of "
                             "config fields; re-save the model with model.save_pretrained(dir)")
    try:
        return auto_config.from_pretrained(str(path))
    except Exception as exc:  # noqa: BLE001 - an unknown type, or a config transformers' own checks refuse
        from transformers import CONFIG_MAPPING

        model_type = raw.get("model_type")
        if model_type is not None and model_type not in CONFIG_MAPPING:
            raise UnsupportedModelError(_unsupported_message(model_type, list(raw.get("architectures") or []))) \
                from None
        reason = _first_line(exc.__cause__ if isinstance(exc.__cause__, ValueError) else exc)
        raise ModelLoadError(f"cannot read the config in {str(path)!r} ({reason}); fix config.json or re-save "
                             "it with model.save_pretrained(dir)") from None


def _first_line(exc: BaseException) -> str:
    """``Type: first line of the message`` (messages of transformers' checks run over several lines)."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:200]}" if text else type(exc).__name__


def load_tokenizer(source: str) -> Any:
    """The model's own tokenizer, or a clear error when the directory has none."""
    from transformers import AutoTokenizer

    if Path(source).is_dir() and not any((Path(source) / f).is_file() for f in _TOKENIZER_FILES):
        raise TokenizerMissingError(
            f"no tokenizer in {source!r} (looked for {', '.join(_TOKENIZER_FILES)}); save one there with "
            "tokenizer.save_pretrained(dir), or pass tokenizer=... to load_model"
        )
    try:
        tok = AutoTokenizer.from_pretrained(source, **_config_for_tokenizer(source))
        if _replaced_tokenizer_model(source, tok):
            from transformers import PreTrainedTokenizerFast

            tok = PreTrainedTokenizerFast.from_pretrained(source)
        return tok
    except Exception as exc:  # noqa: BLE001
        from gather_aggregate.adapters.weight_files import refuse_lfs_pointers

        refuse_lfs_pointers([Path(source) / f for f in _TOKENIZER_FILES if (Path(source) / f).is_file()],
                            TokenizerMissingError)  # was "Expecting value: line 1 column 1 (char 0)"
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]  # transformers' messages run to many lines
        raise TokenizerMissingError(f"could not load the tokenizer of {source!r} ({why}); pass tokenizer= a tokenizer "
                                    "object or a directory saved with tokenizer.save_pretrained(dir)") from None


def _config_for_tokenizer(source: str) -> dict[str, Any]:
    """``config=`` for ``AutoTokenizer`` when the directory's ``config.json`` is of a type transformers does not know
    (our head-level hybrids, mamba-ssm and Llamba checkpoints): a blank config, so the tokenizer comes from
    ``tokenizer_config.json`` alone, where transformers would otherwise fall back to reading the unknown config
    and log that the checkpoint may not be compatible."""
    import json

    from transformers import CONFIG_MAPPING, PretrainedConfig

    try:
        model_type = json.loads((Path(source) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return {}
    return {} if model_type in CONFIG_MAPPING else {"config": PretrainedConfig()}


def _replaced_tokenizer_model(source: str, tok: Any) -> bool:
    """Whether ``AutoTokenizer`` swapped the directory's own ``tokenizer.json`` model for another: transformers 5
    builds a model type's own tokenizer class (e.g. ``Qwen2Tokenizer``, a BPE) from the file's vocabulary, so a
    Qwen2-typed checkpoint with a word-level ``tokenizer.json`` would silently lose every word's token."""
    import json

    path = Path(source) / "tokenizer.json"
    backend = getattr(tok, "backend_tokenizer", None)
    if not path.is_file() or backend is None:
        return False
    try:
        shipped = json.loads(path.read_text())["model"]["type"]
        loaded = type(backend.model).__name__  # tokenizers.models.BPE / WordLevel / Unigram / WordPiece
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return bool(shipped != loaded)


def _is_mamba_ssm_checkpoint(name_or_path: Any) -> bool:
    if not isinstance(name_or_path, (str, os.PathLike)) or not Path(name_or_path).is_dir():
        return False
    from gather_aggregate.adapters import is_mamba_ssm_dir

    return is_mamba_ssm_dir(Path(name_or_path))


def _is_llamba_checkpoint(name_or_path: Any) -> bool:
    if not isinstance(name_or_path, (str, os.PathLike)) or not Path(name_or_path).is_dir():
        return False
    from gather_aggregate.adapters.llamba import is_llamba_dir

    return is_llamba_dir(Path(name_or_path))


def _optional_tokenizer(source: str) -> Any:
    """The directory's tokenizer when it ships one; mamba-ssm checkpoints usually do not (GPT-NeoX's is used)."""
    if not any((Path(source) / f).is_file() for f in _TOKENIZER_FILES):
        return None
    return load_tokenizer(source)


def _check_options(kwargs: dict[str, Any]) -> None:
    """``load_model``'s extra options are the SSM adapters' (``head_size``, ``max_memory``); others are typos."""
    import inspect

    from gather_aggregate.adapters.convert import load_ssm

    known = [n for n, p in inspect.signature(load_ssm).parameters.items()
             if p.kind is p.KEYWORD_ONLY and n not in ("device", "dtype", "device_map")]
    unknown = sorted(set(kwargs) - set(known))
    if unknown:
        raise InputError(f"load_model got unknown option(s) {unknown}; its options are device, dtype, tokenizer, "
                         f"device_map and, for SSM/hybrid models, {', '.join(known)}")


def _user_tokenizer(tokenizer: Any) -> Any:
    """``tokenizer=``: a tokenizer object, a directory / hub name to load one from (checked now, not at first use),
    or ``False``: none (the checkpoint's own tokenizer files are not read)."""
    if tokenizer is False:
        return tokenizer
    if isinstance(tokenizer, (str, os.PathLike)):
        source = str(Path(tokenizer).expanduser())
        if not Path(source).exists() and _looks_like_path(str(tokenizer)):
            raise TokenizerMissingError(f"tokenizer={str(tokenizer)!r}: no such directory; pass a tokenizer object or "
                                        "a directory saved with tokenizer.save_pretrained(dir)")
        return load_tokenizer(source)
    if not isinstance(tokenizer, (bool, int, float, bytes, list, tuple, dict)):  # a tokenizer of any make
        return tokenizer
    raise InputError(f"tokenizer must be a tokenizer (e.g. AutoTokenizer.from_pretrained(dir)) or a directory, got "
                     f"{type(tokenizer).__name__}")


def load_model(name_or_path: str | os.PathLike[str], *, device: Any = None, dtype: Any = None,
               tokenizer: Any = None, device_map: Any = None, **kwargs: Any) -> Any:
    """Load a hooked model that answers the gather-aggregate protocol.

    Args:
        name_or_path: a zoo name (``"llama-kvmc"``, see :func:`gather_aggregate.zoo.list_zoo`), a local
            ``save_pretrained`` directory, or a hub name when online / cached.
        device: e.g. ``"cpu"`` or ``"cuda"``; default CPU.
        dtype: ``torch.float32``, ``torch.bfloat16``, a name such as ``"bf16"``, or ``"auto"``/``None``
            (the default, as in HF's ``from_pretrained``): the config's ``dtype``/``torch_dtype``, else
            the index's ``metadata.dtype``, else the stored weights' dtype.
        device_map: accelerate-style placement, ``"auto"`` or ``{module name: device}`` (needs the
            ``[accelerate]`` extra); SSM/hybrid parameters are read straight onto their devices.
        tokenizer: use this tokenizer (an object, or a directory to load it from) instead of the one saved with
            the model; ``False``: load no tokenizer (weights-only checks; the model then tokenises nothing).
        **kwargs: passed to the SSM adapters (e.g. ``head_size=`` for Mamba-1 channel groups; without it a
            Mamba-1 checkpoint's ``ga_head_size`` config key, else one channel per head).
    """
    device = parse_device(device)
    _check_options(kwargs)
    tokenizer = _user_tokenizer(tokenizer)
    name_or_path = resolve_source(name_or_path)
    with outside_inference_mode():  # parameters made under inference_mode would refuse every gradient estimate
        model = _load_model(name_or_path, device=device, dtype=dtype, tokenizer=tokenizer, device_map=device_map,
                            **kwargs)
    # how to load it again, for workers of a distributed job (gather_aggregate.scan.distributed.model_loader)
    spec = {"device": device, "dtype": dtype, **kwargs, **({} if tokenizer is None else {"tokenizer": tokenizer}),
            **({} if device_map is None else {"device_map": device_map})}
    model.ga_load_spec = (str(name_or_path), spec)
    return model


def _load_model(name_or_path: str | os.PathLike[str], *, device: Any = None, dtype: Any = None,
                tokenizer: Any = None, device_map: Any = None, **kwargs: Any) -> Any:
    if _is_llamba_checkpoint(name_or_path):  # Cartesia's layout: transformers has no "llamba" config class
        from gather_aggregate.adapters.llamba import load_llamba

        model = _weights(lambda: load_llamba(str(name_or_path), device=device, dtype=parse_dtype(dtype),
                                             device_map=device_map, **kwargs), name_or_path)
        model.tokenizer = tokenizer if tokenizer is not None else _optional_tokenizer(str(name_or_path))
        return model
    if _is_mamba_ssm_checkpoint(name_or_path):  # original mamba-ssm layout: config.json has no model_type
        from gather_aggregate.adapters import load_ssm

        model = _weights(lambda: load_ssm(str(name_or_path), device=device, dtype=parse_dtype(dtype),
                                          device_map=device_map, **kwargs), name_or_path)
        model.tokenizer = tokenizer if tokenizer is not None else _optional_tokenizer(str(name_or_path))
        return model
    from gather_aggregate.models.head_hybrid.model import is_head_hybrid_dir

    if is_head_hybrid_dir(name_or_path):  # a hybridised transformer (gather_aggregate.hybridise)
        from gather_aggregate.models.head_hybrid.model import load_head_hybrid

        model = load_head_hybrid(name_or_path, device=device, dtype=parse_dtype(dtype))
        model.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(str(name_or_path))
        return model
    config, source = _resolve_config(name_or_path)
    dtype = parse_dtype(dtype)
    from gather_aggregate.models.checkpoint_checks import refuse_headless

    archs = list(getattr(config, "architectures", None) or [])
    model_type = getattr(config, "model_type", None)

    if model_type in ssm_model_types():
        from gather_aggregate.adapters import load_ssm
        from gather_aggregate.models.checkpoint_checks import refuse_quantized

        refuse_headless(archs, f"the checkpoint in {source!r} is ")
        refuse_quantized(config, source)
        tok = tokenizer if tokenizer is not None else load_tokenizer(source)
        model = _weights(lambda: load_ssm(source, config, device=device, dtype=dtype, device_map=device_map, **kwargs),
                         source)
        model.tokenizer = tok
        return model
    if kwargs:
        raise UnsupportedModelError(f"options {sorted(kwargs)} apply only to SSM/hybrid models, not {model_type!r}")

    from gather_aggregate.models.bridge import BridgeModel, bridge_architecture, refuse_inexact
    from gather_aggregate.models.checkpoint_checks import quantized_import_error, refuse_empty, refuse_missing
    from gather_aggregate.models.supported import refuse_non_decoder, refuse_unservable, unbridged_message

    refuse_unservable(config, archs)
    refuse_non_decoder(config, archs)
    refuse_inexact(archs, config)
    refuse_empty(config, source)
    refuse_headless(archs, f"the checkpoint in {source!r} is ")
    if bridge_architecture(archs) is None:
        raise UnsupportedModelError(unbridged_message(model_type, archs))
    # after the refusals: a model that cannot load is refused as such, not first sent to find a tokenizer
    tok = tokenizer if tokenizer is not None else load_tokenizer(source)
    from transformers import AutoModelForCausalLM

    if device is not None and device_map is not None:
        raise ModelLoadError("pass device= or device_map=, not both")
    if Path(source).is_dir():  # no weight file, or missing shards: named here, not as a "damaged" file
        from gather_aggregate.adapters.weight_files import weight_files

        weight_files(Path(source))
    from gather_aggregate.models.moe_streaming import stream_fused_experts

    # MoE experts that HF fuses at load time: read straight into the fused tensors (HF's copies peaked at 1.9x)
    hf = None if device_map is not None else _weights(lambda: stream_fused_experts(source, config, dtype), source)
    if hf is not None:
        return BridgeModel.from_hf(hf if device is None else hf.to(device), tok, copy_model=False,
                                   name=str(name_or_path))
    try:
        hf, info = _weights(lambda: AutoModelForCausalLM.from_pretrained(
            source, dtype=dtype or "auto", output_loading_info=True,
            **({"device_map": device_map} if device_map is not None else {})), source)
    except ImportError as exc:  # a quantized checkpoint whose backend (bitsandbytes, GPTQ, ...) is not installed
        raise quantized_import_error(config, source, exc) from None
    refuse_missing(hf, info, source)
    if device is not None:
        hf = hf.to(device)
    return BridgeModel.from_hf(hf, tok, copy_model=False, name=str(name_or_path))


def _weights(load: Any, source: Any) -> Any:
    """Run a weight-loading call; a damaged or truncated weight file becomes one :class:`CheckpointError`
    (the class the streaming loader raises for the same damage), naming the file or directory."""
    from gather_aggregate.core.errors import CheckpointError, GAError

    try:
        return load()
    except GAError:
        raise
    except Exception as exc:  # noqa: BLE001 - only the kinds a damaged file raises are translated
        kinds = (OSError, RuntimeError, ValueError, EOFError, KeyError)
        if not (isinstance(exc, kinds) or type(exc).__name__ in ("SafetensorError", "UnpicklingError")):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "ignore_mismatched_sizes" in first or "size mismatch" in first:
            where = first_mismatch(source)
            raise CheckpointError(f"the weights in {str(source)!r} do not have the shapes its config.json gives"
                                  f"{where}; the config and the weights must come from the same model (restore "
                                  "config.json, or re-save it with model.save_pretrained(dir))") from None
        if "device_map" in first:
            raise InputError(f"bad device_map ({first[:200]}); pass 'auto' or {{module name: device}}") from None
        raise CheckpointError(f"cannot read the weights in {str(source)!r} ({type(exc).__name__}: {first[:200]}); "
                             "the file is damaged or truncated: download or save the model again") from None


def from_hf_model(hf_model: Any, tokenizer: Any = None, *, head_size: int | None = None) -> Any:
    """Hook an in-memory HF model without touching it (its weights are copied, never edited).

    SSM and hybrid ``model_type``s go to :func:`gather_aggregate.adapters.load_ssm`, transformers to the
    TransformerLens bridge.  ``tokenizer`` is a tokenizer object or a directory to load one from (as in
    :func:`load_model`); ``head_size`` groups Mamba-1 channels into heads
    (SSMs only: a transformer refuses it, as :func:`load_model` does).
    """
    import torch

    if not isinstance(hf_model, torch.nn.Module) or not (hasattr(hf_model, "config") or hasattr(hf_model, "module")):
        raise InputError(f"from_hf_model takes an in-memory transformers model (e.g. "
                         f"AutoModelForCausalLM.from_pretrained(dir)), got {type(hf_model).__name__}; for a directory "
                         "or zoo name use load_model(...)")
    from gather_aggregate.models.checkpoint_checks import unwrap_module

    hf_model = unwrap_module(hf_model)  # torch.compile / DataParallel were "OptimizedModule is not supported"
    tokenizer = None if tokenizer is None or tokenizer is False else _user_tokenizer(tokenizer)  # as load_model
    model_type = getattr(hf_model.config, "model_type", None)
    if model_type in ssm_model_types():
        from gather_aggregate.adapters import load_ssm
        from gather_aggregate.models.checkpoint_checks import refuse_headless_module

        refuse_headless_module(hf_model)  # AutoModel's Mamba2Model was "missing keys (21)"
        extra = {} if head_size is None else {"head_size": head_size}
        with outside_inference_mode():  # copies of inference tensors made here are normal ones (see load_model)
            model = load_ssm(hf_model, hf_model.config, **extra)
        model.tokenizer = tokenizer
        return model
    if head_size is not None:  # as load_model: an SSM option on a transformer is a mistake, not a no-op
        raise UnsupportedModelError(f"options ['head_size'] apply only to SSM/hybrid models, not {model_type!r}")
    from gather_aggregate.models.bridge import BridgeModel

    with outside_inference_mode():
        return BridgeModel.from_hf(hf_model, tokenizer, copy_model=True)


def _unsupported_message(model_type: Any, archs: list[str]) -> str:
    """The refusal of a ``model_type`` transformers itself does not know (so neither the bridge nor our adapters)."""
    import transformers

    return (f"model_type {model_type!r} (architectures {archs}) is not supported: transformers "
            f"{transformers.__version__} does not know it. Supported SSM/hybrid model types: "
            f"{', '.join(sorted(ssm_model_types())) or '(none installed)'}; transformers: every decoder-only "
            "architecture TransformerLens 4.3's bridge wraps (e.g. LlamaForCausalLM, Qwen2ForCausalLM, GPT2LMHeadModel; "
            "gather_aggregate.supported_model_types() lists them)")
