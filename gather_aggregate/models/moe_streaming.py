"""Stream a transformers checkpoint whose MoE experts HF fuses at load time into its HF class, one tensor at a time.

transformers 5 stores MoE experts fused (``experts.gate_up_proj``: ``[experts, 2 * inter, hidden]``) while
checkpoints hold them one by one (``experts.{e}.gate_proj.weight``).  ``from_pretrained`` reads every expert of a
layer, stacks them and concatenates gate and up (each step a full copy), and keeps the shards memory-mapped: its peak
resident set was 1.94x the parameter bytes on DeepSeek-V2-Lite's widths with 64 experts (2 layers), against the
loader's bar of 1.25x.  :func:`stream_fused_experts` builds the model with its parameters on the meta device, then
fills each parameter from the checkpoint by ``readinto`` straight into the final tensor (experts row by row,
:class:`~gather_aggregate.adapters.streaming.StackedTensor`), with nothing memory-mapped.

It serves only checkpoints it can map exactly: safetensors, not quantized, every parameter and persistent buffer
found under its own name, HF's renamed one, or as the experts of a conversion made only of ``MergeModulelist(dim=0)``
then an optional ``Concatenate(dim=1)`` (HF's ops), with matching shapes, and every stored tensor used or one HF
ignores.  Anything else returns ``None`` and the caller keeps ``from_pretrained``.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn


@contextlib.contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Modules built here get meta parameters (buffers, e.g. rotary frequencies, stay real)."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: Any) -> None:
        register(module, name, param)
        if param is not None and not param.is_meta:
            module._parameters[name] = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


def _fused_sources(key: str, names: list[str], converter: Any, ckpt: Any) -> Any:
    """The :class:`StackedTensor` of a fused expert tensor from its per-expert stored ``names``, or ``None``."""
    from transformers.core_model_loading import Concatenate, MergeModulelist

    from gather_aggregate.adapters.streaming import StackedTensor

    ops = list(converter.operations)
    if not (ops and type(ops[0]) is MergeModulelist and ops[0].dim == 0 and
            all(type(op) is Concatenate and op.dim == 1 for op in ops[1:2]) and len(ops) <= 2):
        return None
    patterns = [re.compile(re.escape(p).replace(r"\*", r"(\d+)") + "$") for p in converter.source_patterns]
    rows: dict[int, dict[int, Any]] = {}
    for name in names:
        hit = next(((j, m) for j, p in enumerate(patterns) if (m := p.search(name))), None)
        if hit is None or name not in ckpt:
            return None
        rows.setdefault(int(hit[1].group(1)), {})[hit[0]] = ckpt[name]
    if sorted(rows) != list(range(len(rows))) or any(len(r) != len(patterns) for r in rows.values()):
        return None
    return StackedTensor([[rows[e][j] for j in range(len(patterns))] for e in range(len(rows))])


def _sources(model: Any, ckpt: Any) -> dict[str, Any] | None:
    """Parameter / persistent-buffer name -> its stored tensor (or stacked experts), or ``None`` where any name is
    not mapped exactly or a stored tensor would be left unused (and is not one HF ignores)."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, revert_weight_conversion
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    converters = [c for c in get_model_conversion_mapping(model) if isinstance(c, WeightConverter)]
    if not converters or any(not p.is_meta for p in model.parameters()):
        return None
    state = remove_tied_weights_from_state_dict(model.state_dict(), model)
    sources: dict[str, Any] = {}
    used: set[str] = set()
    for key, t in state.items():
        names = list(revert_weight_conversion(model, {key: t}))
        src: Any
        if key in ckpt:
            src, names = ckpt[key], [key]
        else:  # fused experts (a single expert reverts to one name too), else HF's rename
            src = next((s for c in converters if (s := _fused_sources(key, names, c, ckpt)) is not None), None)
            src = ckpt.get(names[0]) if src is None and len(names) == 1 else src
        if src is None or tuple(src.shape) != tuple(t.shape):
            return None
        sources[key] = src
        used.update(names)
    ignored = [re.compile(p) for p in getattr(model, "_keys_to_ignore_on_load_unexpected", None) or []]
    if any(k not in used and not any(p.search(k) for p in ignored) for k in ckpt):
        return None
    return sources


def _fuses_weights(config: Any) -> bool:
    """Whether transformers registers a weight fusion (a ``WeightConverter``, e.g. stacked experts) for the config's
    class or model type: without one there is nothing to stream, and a dense model is not built twice (about 1 s
    at an 8B Llama's widths).  Unknown (a transformers without these helpers): False, so from_pretrained loads."""
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
        from transformers.core_model_loading import WeightConverter

        names = [*(getattr(config, "architectures", None) or []), getattr(config, "model_type", None)]
        return any(isinstance(c, WeightConverter) for n in names if n for c in get_checkpoint_conversion_mapping(n) or [])
    except Exception:  # noqa: BLE001 - private helpers of transformers: any failure means "use from_pretrained"
        return False


def stream_fused_experts(source: str | Path, config: Any, dtype: Any) -> Any:
    """An HF ``AutoModelForCausalLM`` of ``source`` read tensor by tensor, or ``None`` where this does not apply
    (no expert fusion, so ``from_pretrained``'s lazy load is already lean; or a layout not mapped exactly)."""
    from transformers import AutoModelForCausalLM

    from gather_aggregate.adapters.streaming import Checkpoint, copy_source, resolve_dtype
    from gather_aggregate.adapters.weight_files import weight_files

    d = Path(source)
    if not d.is_dir() or getattr(config, "quantization_config", None) is not None or not _fuses_weights(config):
        return None
    if any(f.suffix != ".safetensors" for f in weight_files(d)[0]):  # before any is opened: .bin is HF's to read
        return None
    ckpt = Checkpoint(d)
    dtype = resolve_dtype(dtype, config, ckpt)
    try:  # a class that cannot be built with meta parameters, a mapping HF cannot revert, or a transformers
        # without the private helpers used here: from_pretrained's
        from transformers.core_model_loading import build_glob_alternation

        with _parameters_on_meta():
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        sources = _sources(model, ckpt)
        plan = model._get_dtype_plan(dtype)  # HF's keep-in-fp32 modules (DeepSeek-V3's router bias in bf16)
        fp32 = build_glob_alternation(list(plan))[0] if plan else None
    except Exception:  # noqa: BLE001 - anything unexpected here falls back to HF's own load, which then decides
        return None
    if sources is None:
        return None
    with torch.no_grad():
        for key, src in sources.items():
            owner, _, attr = key.rpartition(".")
            module = model.get_submodule(owner)
            old = module._parameters[attr] if attr in module._parameters else module._buffers[attr]
            assert old is not None
            keep = fp32 is not None and fp32.search(key) is not None and old.is_floating_point()
            t = torch.empty(old.shape, dtype=torch.float32 if keep else old.dtype)
            copy_source(src, t)
            if attr in module._parameters:
                module._parameters[attr] = nn.Parameter(t, requires_grad=old.requires_grad)
            else:
                module._buffers[attr] = t
    model.tie_weights()
    model.config.dtype = dtype
    if model.can_generate():  # as from_pretrained: the directory's generation_config.json (TL's generate reads it)
        from transformers import GenerationConfig

        try:
            model.generation_config = GenerationConfig.from_pretrained(d)
        except OSError:  # none: the one HF derives from config.json
            model.generation_config = GenerationConfig.from_pretrained(d, config_file_name="config.json",
                                                                       _from_model_config=True)
    return model.eval()


__all__ = ["stream_fused_experts"]
