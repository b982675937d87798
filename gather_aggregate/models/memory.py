"""Inference memory: KV-cache bytes against SSM-state bytes, computed from a model's config.

What a causal LM must keep per sequence to generate the next token, for a
prompt of ``L`` tokens (``e`` bytes per element, batch ``b``):

* an attention layer keeps its keys and values:
  ``2 · n_kv_heads · d_head · L · e · b`` (grows with ``L``);
* a Mamba-1 layer keeps its state ``d_inner · d_state`` and its conv window
  ``d_inner · k``;
* a Mamba-2 layer keeps its state ``n_heads · d_head · d_state`` and its conv
  window ``(d_inner + 2 · n_groups · d_state) · k``;
* a layer of a head-level hybrid (:mod:`gather_aggregate.models.head_hybrid.model`)
  keeps keys and values only for the kv heads its kept attention heads read,
  and per SSM head a state ``d_head · d_state`` and a conv window
  ``(d_head + 2 · d_state) · k``.

* the hybrids whose layers mix attention with SSM or linear-attention state (Zamba2, Falcon-H1, Granite-4,
  Nemotron-H, Qwen3-Next) are counted per layer kind in :mod:`gather_aggregate.models.memory_hybrids`; a
  config whose cache is not Llama-style keys and values in every layer (SSM or linear-attention keys, latent
  attention, per-layer head widths) and whose family is not listed is refused, never counted as KV.

The conv window is counted as HF allocates it (``k`` columns; ``k - 1``
would suffice), so the totals equal the tensors HF's caches hold after a
forward with ``use_cache=True`` (:func:`measured_cache_bytes`; the tests check
the zoo's Llama, Mamba-2 and Bamba models, a Mamba-1 config and every hybrid family).  Sliding
windows and cache quantisation are not modelled.

The config is an HF config object, the ``config.json`` dict of a checkpoint,
or a :class:`~gather_aggregate.models.head_hybrid.config.HeadHybridConfig`; no model
is built and nothing heavy is imported.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gather_aggregate.core.errors import InputError, UnsupportedModelError
from gather_aggregate.models.memory_hybrids import HYBRID_COUNTS

#: The prompt lengths of the paper's memory table.
DEFAULT_LENGTHS: tuple[int, ...] = (128, 2048, 4096)

_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "float64": 8}


@dataclass(frozen=True)
class CacheBytes:
    """Bytes of what one forward must keep for the next token, split by kind."""

    model: str
    seq_len: int
    batch: int
    kv_bytes: int  # attention keys and values (grow with seq_len)
    ssm_state_bytes: int  # recurrent SSM states (constant in seq_len)
    conv_bytes: int  # SSM conv windows (constant in seq_len)

    @property
    def total(self) -> int:
        return self.kv_bytes + self.ssm_state_bytes + self.conv_bytes

    def to_row(self) -> dict[str, Any]:
        return {**asdict(self), "total_bytes": self.total}


def _as_dict(config: Any) -> dict[str, Any]:
    if isinstance(config, (str, Path)):
        path = Path(config).expanduser()
        path = path / "config.json" if path.is_dir() else path
        if not path.is_file():
            raise InputError(f"no config.json at {str(path)!r}; pass a model directory or a config")
        return json.loads(path.read_text())
    if isinstance(config, dict):
        return config
    if hasattr(config, "to_dict"):
        return dict(config.to_dict())
    raise InputError(f"cache_bytes takes an HF config, a config.json dict or a model directory, "
                     f"got {type(config).__name__}")


def _elem_bytes(cfg: dict[str, Any], override: int | None) -> int:
    if override is not None:
        if override not in (1, 2, 4, 8):
            raise InputError(f"bytes_per_element must be 1, 2, 4 or 8, got {override}")
        return override
    name = str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32").replace("torch.", "")
    return _DTYPE_BYTES.get(name, 4)


def _attn_geometry(c: dict[str, Any]) -> tuple[int, int]:
    """``(n_kv_heads, d_head)`` of a Llama-style attention config."""
    n = int(c["num_attention_heads"])
    kv = int(c.get("num_key_value_heads") or n)
    d_head = int(c.get("head_dim") or int(c["hidden_size"]) // n)
    return kv, d_head


def _kv(n_kv: int, d_head: int, L: int) -> int:
    return 2 * n_kv * d_head * L


def _mamba1(d_inner: int, d_state: int, k: int) -> tuple[int, int]:
    return d_inner * d_state, d_inner * k


def _mamba2(n_heads: int, d_head: int, d_state: int, n_groups: int, k: int) -> tuple[int, int]:
    return n_heads * d_head * d_state, (n_heads * d_head + 2 * n_groups * d_state) * k


def _elements(c: dict[str, Any], L: int) -> tuple[int, int, int]:
    """``(kv, state, conv)`` element counts per sequence."""
    mt = c.get("model_type")
    if mt == "ga_head_hybrid":
        from gather_aggregate.models.head_hybrid.config import HeadHybridConfig

        return HeadHybridConfig.from_dict(c).cache_elements(L)
    if mt in ("mamba", "falcon_mamba"):
        d_inner = int(c.get("intermediate_size") or int(c.get("expand", 2) * c["hidden_size"]))
        s, v = _mamba1(d_inner, int(c["state_size"]), int(c.get("conv_kernel", 4)))
        return 0, int(c["num_hidden_layers"]) * s, int(c["num_hidden_layers"]) * v
    if mt == "mamba2":
        s, v = _mamba2(int(c["num_heads"]), int(c["head_dim"]), int(c["state_size"]), int(c.get("n_groups", 1)),
                       int(c.get("conv_kernel", 4)))
        return 0, int(c["num_hidden_layers"]) * s, int(c["num_hidden_layers"]) * v
    if mt in ("bamba", "jamba"):
        n = int(c["num_hidden_layers"])
        if mt == "bamba":  # HF derives layers_block_type from these (a property, absent from config.json)
            attn = set(c.get("attn_layer_indices") or [])
        else:
            period, offset = int(c.get("attn_layer_period", 8)), int(c.get("attn_layer_offset", 4))
            attn = {i for i in range(n) if i % period == offset}
        n_attn = len([i for i in range(n) if i in attn])
        n_ssm = n - n_attn
        kv, d_head = _attn_geometry(c)
        if mt == "bamba":
            s, v = _mamba2(int(c["mamba_n_heads"]), int(c["mamba_d_head"]), int(c["mamba_d_state"]),
                           int(c.get("mamba_n_groups", 1)), int(c.get("mamba_d_conv", 4)))
        else:
            s, v = _mamba1(int(c.get("mamba_expand", 2) * c["hidden_size"]), int(c["mamba_d_state"]),
                           int(c.get("mamba_d_conv", 4)))
        return n_attn * _kv(kv, d_head, L), n_ssm * s, n_ssm * v
    if mt in HYBRID_COUNTS:
        try:
            return HYBRID_COUNTS[mt](c, L)
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"cache_bytes cannot read the {mt} config ({type(exc).__name__}: {exc}); pass the "
                             "config.json the checkpoint was saved with") from None
    if "num_attention_heads" in c and "num_hidden_layers" in c and "state_size" not in c:
        sliding = c.get("sliding_window") and c.get("use_sliding_window", True)  # Qwen2 records one it does not use
        if sliding or c.get("layer_types") and any("sliding" in t for t in c["layer_types"]):
            raise UnsupportedModelError(f"{mt!r} uses sliding-window attention, which cache_bytes does not model")
        odd = sorted(k for k in c if k.startswith(_NOT_LLAMA_PREFIXES) or k in _NOT_LLAMA_KEYS)
        types = {str(t) for t in c.get("layer_types") or []} - {"full_attention", "attention"}
        if odd or types:  # a cache that is not 2 · kv heads · head dim per token and layer: it counted as one
            raise UnsupportedModelError(
                f"cache_bytes cannot count model_type {mt!r}'s cache ({', '.join(odd or sorted(types))}: not "
                f"Llama-style keys and values in every layer); supported: {SUPPORTED}")
        kv, d_head = _attn_geometry(c)
        return int(c["num_hidden_layers"]) * _kv(kv, d_head, L), 0, 0
    raise UnsupportedModelError(f"cache_bytes does not know model_type {mt!r}; supported: {SUPPORTED}")


#: config keys of caches that are not Llama-style keys and values in every layer (SSM or linear-attention state,
#: latent attention, per-layer head widths, Falcon's KV heads), refused rather than counted as KV
_NOT_LLAMA_PREFIXES = ("mamba", "ssm_", "linear_", "time_step")
_NOT_LLAMA_KEYS = {"layers_block_type", "hybrid_override_pattern", "attn_layer_indices", "attn_layer_period",
                   "kv_lora_rank", "global_head_dim", "num_kv_heads", "multi_query", "state_size",
                   "num_kv_shared_layers", "attention_chunk_size"}
SUPPORTED = ("Llama-style transformers, mamba, falcon_mamba, mamba2, bamba, jamba, ga_head_hybrid, "
             + ", ".join(sorted(HYBRID_COUNTS)))


def cache_bytes(config: Any, seq_len: int, *, batch: int = 1, bytes_per_element: int | None = None,
                name: str | None = None) -> CacheBytes:
    """What a model keeps between tokens after a prompt of ``seq_len`` tokens (see the module docstring)."""
    if not isinstance(seq_len, int) or seq_len < 1 or not isinstance(batch, int) or batch < 1:
        raise InputError(f"seq_len and batch must be positive ints, got {seq_len!r}, {batch!r}")
    c = _as_dict(config)
    e = _elem_bytes(c, bytes_per_element) * batch
    kv, state, conv = _elements(c, seq_len)
    label = name or str(c.get("_name_or_path") or c.get("model_type"))
    return CacheBytes(label, seq_len, batch, kv * e, state * e, conv * e)


def memory_table(configs: dict[str, Any], lengths: Sequence[int] = DEFAULT_LENGTHS, *, batch: int = 1,
                 bytes_per_element: int | None = None) -> list[dict[str, Any]]:
    """One row per model and length: ``model, seq_len, kv_bytes, ssm_state_bytes, conv_bytes, total_bytes``."""
    return [cache_bytes(cfg, L, batch=batch, bytes_per_element=bytes_per_element, name=name).to_row()
            for name, cfg in configs.items() for L in lengths]


def _human(n: int) -> str:
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """A markdown table: per model, the total cache at each length and its KV / state split."""
    lengths = sorted({r["seq_len"] for r in rows})
    models = list(dict.fromkeys(r["model"] for r in rows))
    by = {(r["model"], r["seq_len"]): r for r in rows}
    head = "| model | " + " | ".join(f"L = {L}" for L in lengths) + " | of which SSM state + conv |"
    lines = [head, "|---|" + "---|" * (len(lengths) + 1)]
    for m in models:
        cells = [_human(by[m, L]["total_bytes"]) for L in lengths]
        fixed = by[m, lengths[0]]["ssm_state_bytes"] + by[m, lengths[0]]["conv_bytes"]
        lines.append(f"| `{m}` | " + " | ".join(cells) + f" | {_human(fixed)} |")
    return "\n".join(lines)


def measured_cache_bytes(hf_model: Any, tokens: Any) -> int:
    """Bytes of every tensor in the cache an HF causal LM returns after ``model(tokens, use_cache=True)``.

    The oracle for :func:`cache_bytes`: it walks HF's cache object (``DynamicCache`` with
    ``DynamicLayer`` keys/values and ``LinearAttentionLayer`` conv/recurrent states in
    transformers 5.x) and sums the bytes of the distinct tensors it finds.
    """
    import torch

    out = hf_model(tokens, use_cache=True)
    cache = out.get("past_key_values", None) or out.get("cache_params", None)
    if cache is None:
        raise InputError(f"{type(hf_model).__name__} returned no cache; was it built with use_cache support?")
    seen: dict[int, int] = {}

    def walk(obj: Any, depth: int = 0) -> None:
        if depth > 6:
            return
        if isinstance(obj, torch.Tensor):
            seen[id(obj)] = obj.numel() * obj.element_size()
        elif isinstance(obj, dict):
            for v in obj.values():
                walk(v, depth + 1)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                walk(v, depth + 1)
        elif hasattr(obj, "__dict__") and type(obj).__module__.startswith("transformers"):
            for v in vars(obj).values():
                walk(v, depth + 1)

    walk(cache)
    return sum(seen.values())


__all__ = ["CacheBytes", "cache_bytes", "memory_table", "format_table", "measured_cache_bytes", "DEFAULT_LENGTHS"]
