"""``HybridConfig``: the SSM layers' :class:`~.config.SSMConfig` plus the attention/MLP half and the layer layout.

Each hybrid family parses its own HF config into this one dataclass (see
:mod:`gather_aggregate.adapters.families`); the helpers below are the parts
of that parsing the families share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gather_aggregate.adapters.config import SSMConfig
from gather_aggregate.core.errors import UnsupportedModelError


@dataclass
class HybridConfig(SSMConfig):
    """An :class:`SSMConfig` (the SSM layers) plus the attention/MLP half and the layer layout."""

    layer_kinds: tuple[str, ...] = ()  # "ssm" | "attn" per layer
    attn_n_heads: int = 0
    attn_n_kv_heads: int = 0
    attn_d_head: int = 0
    attn_scale: float = 1.0
    rotary_dim: int = 0  # 0: no positional encoding in attention (Jamba)
    rope_theta: float = 10000.0
    qkv_bias: bool = False
    o_bias: bool = False
    d_mlp: int = 0
    mlp_act: str = "silu"
    mlp_bias: bool = False
    layer_experts: tuple[int, ...] = ()  # per layer: 1 = dense gated MLP, >1 = MoE with that many experts
    top_k: int = 1
    ssm_inner_norm: bool = False  # Jamba: weighted RMSNorm on dt (low rank), B, C
    # Zamba2 only (see gather_aggregate.adapters.families.zamba2)
    hf_layer_types: tuple[str, ...] = ()  # per HF layer: "hybrid" (shared block + Mamba) or "mamba"
    num_mem_blocks: int = 0
    adapter_rank: int = 0
    attn_adapters: bool = False
    tied_shared: bool = True  # HF ties the uses of a shared block only when tie_word_embeddings=True

    @property
    def attn_layers(self) -> list[int]:
        return [i for i, k in enumerate(self.layer_kinds) if k == "attn"]

    @property
    def ssm_layers(self) -> list[int]:
        return [i for i, k in enumerate(self.layer_kinds) if k == "ssm"]

    @property
    def layout(self) -> str:
        """The layer layout as letters, ``A`` attention and ``S`` SSM (e.g. ``"SASS"``)."""
        return "".join("A" if k == "attn" else "S" for k in self.layer_kinds)


def first_int(v: Any) -> int | None:
    """An int from a config value that may be a list of ids (the first one), or ``None``."""
    if isinstance(v, (list, tuple)):
        v = v[0] if v else None
    return None if v is None else int(v)


def rope_of(hf_config: Any) -> tuple[float, float]:
    """``(theta, partial_rotary_factor)`` of a config; only the default RoPE is supported."""
    rp = dict(getattr(hf_config, "rope_parameters", None) or {})
    rope_type = rp.get("rope_type", "default")
    if rope_type != "default":
        raise UnsupportedModelError(
            f"rope_type {rope_type!r} is not supported by the hooked hybrids (only 'default' RoPE); "
            "set rope_parameters['rope_type']='default' or use the HF model directly"
        )
    theta = rp.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    return float(theta), float(rp.get("partial_rotary_factor", 1.0))


def attention_dims(hf_config: Any) -> tuple[int, int, int, int]:
    """``(d_model, n_layers, n_attention_heads, d_head)`` as every HF decoder config states them (``head_dim`` when
    given, else ``hidden_size // num_attention_heads``)."""
    d_model, n_attn = int(hf_config.hidden_size), int(hf_config.num_attention_heads)
    d_head = int(getattr(hf_config, "head_dim", None) or d_model // n_attn)
    return d_model, int(hf_config.num_hidden_layers), n_attn, d_head


def decoder_fields(hf_config: Any) -> dict[str, Any]:
    """The fields every attention + SSM decoder config (Bamba, Jamba) states the same way."""
    g = hf_config.__getattribute__
    d_model, n_layers, n_attn, attn_d_head = attention_dims(hf_config)
    n_kv = int(getattr(hf_config, "num_key_value_heads", None) or n_attn)
    eps = float(g("rms_norm_eps"))
    return dict(
        model_type=hf_config.model_type, d_model=d_model, n_layers=n_layers, d_vocab=int(g("vocab_size")),
        norm_eps=eps, gate_norm_eps=eps, residual_in_fp32=False,
        tie_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        hidden_act=str(g("hidden_act")), pad_token_id=first_int(getattr(hf_config, "pad_token_id", None)),
        eos_token_id=first_int(getattr(hf_config, "eos_token_id", None)),
        attn_n_heads=n_attn, attn_n_kv_heads=n_kv, attn_d_head=attn_d_head, attn_scale=attn_d_head ** -0.5,
        d_mlp=int(g("intermediate_size")), mlp_act=str(g("hidden_act")),
    )
