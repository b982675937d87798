"""Per-sequence cache element counts of the hybrid families whose layers mix attention with SSM or linear-attention
state (:func:`gather_aggregate.models.memory.cache_bytes` dispatches here on ``model_type``).

Each function reads a ``config.json`` dict and returns ``(kv, state, conv)`` elements after ``L`` tokens, counted
as HF's caches hold them (the tests check each against HF's own cache after a forward):

* Zamba2: every layer has a Mamba-2 mixer; a ``hybrid`` layer also runs the shared attention block, whose heads
  are ``2 · hidden_size / num_attention_heads`` wide (it reads the residual concatenated with the embeddings);
* Falcon-H1: every layer runs attention and Mamba-2 in parallel (``mamba_d_ssm`` channels);
* Granite-4 (``granitemoehybrid``): ``layer_types``, Mamba-2 or attention per layer;
* Nemotron-H: ``hybrid_override_pattern`` (``M`` Mamba-2, ``*`` attention, ``-`` MLP, ``E`` MoE) or
  ``layers_block_type``; only Mamba-2 and attention layers keep anything;
* Qwen3-Next: ``layer_types``; a gated DeltaNet layer keeps a ``key_dim × value_dim`` state per value head and a
  conv window over its query, key and value channels.

The conv window is counted as HF allocates it (``k`` columns).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _kv_per_layer(c: dict[str, Any], L: int, d_head: int | None = None) -> int:
    n = int(c["num_attention_heads"])
    kv = int(c.get("num_key_value_heads") or n)
    d = d_head or int(c.get("head_dim") or int(c["hidden_size"]) // n)
    return 2 * kv * d * L


def _mamba2(n_heads: int, d_head: int, d_state: int, n_groups: int, k: int, d_inner: int | None = None) -> tuple[int, int]:
    return n_heads * d_head * d_state, ((d_inner or n_heads * d_head) + 2 * n_groups * d_state) * k


def _mamba2_of(c: dict[str, Any], heads: str = "mamba_n_heads", head_dim: str = "mamba_d_head") -> tuple[int, int]:
    """A ``mamba_*``-keyed Mamba-2 layer's (state, conv) elements (Bamba's keys; ``mamba_d_head="auto"``:
    ``mamba_expand · hidden_size / mamba_n_heads``)."""
    n_heads = int(c[heads])
    d_head = c.get(head_dim, "auto")
    d_inner = int(c.get("mamba_d_ssm") or int(c.get("mamba_expand", 2)) * int(c["hidden_size"]))
    d_head = d_inner // n_heads if d_head in (None, "auto") else int(d_head)
    return _mamba2(n_heads, d_head, int(c["mamba_d_state"]), int(c.get("mamba_n_groups", 1)),
                   int(c.get("mamba_d_conv", 4)), d_inner)


def zamba2(c: dict[str, Any], L: int) -> tuple[int, int, int]:
    kinds = [str(t) for t in c["layers_block_type"]]
    unknown = sorted(set(kinds) - {"mamba", "linear_attention", "hybrid"})
    if unknown:
        raise ValueError(f"layers_block_type has {unknown}")
    d_inner = int(c.get("mamba_expand", 2)) * int(c["hidden_size"])
    n_heads = int(c.get("n_mamba_heads", 8))
    d_head = int(c.get("mamba_headdim") or d_inner // n_heads)
    s, v = _mamba2(n_heads, d_head, int(c["mamba_d_state"]), int(c.get("mamba_ngroups", 1)),
                   int(c.get("mamba_d_conv", 4)), d_inner)
    attn_d_head = int(c.get("attention_head_dim") or 2 * int(c["hidden_size"]) // int(c["num_attention_heads"]))
    n_attn = kinds.count("hybrid")
    return n_attn * _kv_per_layer(c, L, attn_d_head), len(kinds) * s, len(kinds) * v


def falcon_h1(c: dict[str, Any], L: int) -> tuple[int, int, int]:
    n = int(c["num_hidden_layers"])
    s, v = _mamba2_of(c)
    return n * _kv_per_layer(c, L), n * s, n * v


def _split(kinds: list[str], attn: set[str], ssm: set[str], other: set[str]) -> tuple[int, int]:
    unknown = sorted(set(kinds) - attn - ssm - other)
    if unknown:
        raise ValueError(f"layer kinds {unknown}")
    return sum(k in attn for k in kinds), sum(k in ssm for k in kinds)


def granitemoehybrid(c: dict[str, Any], L: int) -> tuple[int, int, int]:
    kinds = [str(t) for t in c.get("layer_types") or c["layers_block_type"]]
    n_attn, n_ssm = _split(kinds, {"attention", "full_attention"}, {"mamba", "linear_attention"}, set())
    s, v = _mamba2_of(c)
    return n_attn * _kv_per_layer(c, L), n_ssm * s, n_ssm * v


def nemotron_h(c: dict[str, Any], L: int) -> tuple[int, int, int]:
    pattern = c.get("hybrid_override_pattern")
    if pattern and not c.get("layers_block_type"):
        names = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
        kinds = [names.get(ch, ch) for ch in str(pattern)]
    else:
        kinds = [str(t) for t in c["layers_block_type"]]
    n_attn, n_ssm = _split(kinds, {"attention", "full_attention"}, {"mamba", "linear_attention"}, {"mlp", "moe"})
    n_heads, d_head = int(c["mamba_num_heads"]), int(c["mamba_head_dim"])
    s, v = _mamba2(n_heads, d_head, int(c["ssm_state_size"]), int(c.get("n_groups", 1)), int(c.get("conv_kernel", 4)))
    d_attn = int(c.get("head_dim") or c.get("attention_head_dim") or int(c["hidden_size"]) // int(c["num_attention_heads"]))
    return n_attn * _kv_per_layer(c, L, d_attn), n_ssm * s, n_ssm * v


def qwen3_next(c: dict[str, Any], L: int) -> tuple[int, int, int]:
    kinds = [str(t) for t in c["layer_types"]]
    n_attn, n_lin = _split(kinds, {"full_attention"}, {"linear_attention"}, set())
    nk, nv = int(c["linear_num_key_heads"]), int(c["linear_num_value_heads"])
    dk, dv = int(c["linear_key_head_dim"]), int(c["linear_value_head_dim"])
    state, conv = nv * dk * dv, (2 * nk * dk + nv * dv) * int(c.get("linear_conv_kernel_dim", 4))
    return n_attn * _kv_per_layer(c, L), n_lin * state, n_lin * conv


#: model_type -> (config dict, L) -> (kv, state, conv) elements per sequence
HYBRID_COUNTS: dict[str, Callable[[dict[str, Any], int], tuple[int, int, int]]] = {
    "zamba2": zamba2, "falcon_h1": falcon_h1, "granitemoehybrid": granitemoehybrid, "nemotron_h": nemotron_h,
    "qwen3_next": qwen3_next,
}
