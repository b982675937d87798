"""``SSMConfig``: the few hyper-parameters our hooked Mamba-1/Mamba-2 models need.

Built from an HF config (``MambaConfig``, ``FalconMambaConfig``,
``Mamba2Config``) or from the original mamba-ssm ``config.json`` (keys
``d_model``, ``n_layer``, ``ssm_cfg``, ...).  Field names follow
TransformerLens where one exists (``d_model``, ``n_layers``, ``d_vocab``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, TypeVar

from gather_aggregate.core.errors import InputError, UnsupportedModelError

Family = Literal["mamba1", "mamba2", "discrete_mamba2"]

#: HF ``model_type`` -> family.  ``load_ssm`` serves exactly these.
FAMILY_OF_MODEL_TYPE: dict[str, Family] = {"mamba": "mamba1", "falcon_mamba": "mamba1", "mamba2": "mamba2",
                                            "llamba": "discrete_mamba2"}  # Llamba: see adapters/llamba.py

_SUPPORTED_ACTS = ("silu", "swish")


_Config = TypeVar("_Config", bound="SSMConfig")  # validate() returns the subclass it is called on


@dataclass
class SSMConfig:
    """Hyper-parameters of a hooked Mamba-1 or Mamba-2 language model.

    ``head_size`` is the Mamba-1 channel-group size (``1`` = one channel per
    head, the paper's convention); for Mamba-2 the heads are the model's own
    (``n_heads`` heads of ``d_head = head_dim`` channels).
    """

    family: Family
    model_type: str
    d_model: int
    n_layers: int
    d_vocab: int
    d_inner: int
    d_state: int
    d_conv: int
    n_heads: int
    d_head: int
    dt_rank: int = 0  # Mamba-1 only
    n_groups: int = 1  # Mamba-2 only: B/C groups (and gated-norm groups)
    conv_bias: bool = True
    proj_bias: bool = False
    norm_eps: float = 1e-5
    gate_norm_eps: float | None = None  # Mamba-2 gated RMSNorm eps (None: norm_eps, as in HF)
    mixer_rms_eps: float | None = None  # FalconMamba: weightless RMSNorm on dt/B/C
    residual_in_fp32: bool = True
    tie_embeddings: bool = True
    hidden_act: str = "silu"
    time_step_limit: tuple[float, float] = (0.0, float("inf"))  # Mamba-2 Δ clamp
    chunk_size: int = 256  # the checkpoint's own Mamba-2 chunk size (ours is chosen for speed)
    pad_token_id: int | None = None
    eos_token_id: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------
    @property
    def head_size(self) -> int:
        return self.d_head

    @property
    def conv_dim(self) -> int:
        """Channels through the causal conv: x (Mamba-1) or x‖B‖C (Mamba-2)."""
        if self.family == "mamba1":
            return self.d_inner
        return self.d_inner + 2 * self.n_groups * self.d_state

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def validate(self: _Config) -> _Config:
        if self.hidden_act not in _SUPPORTED_ACTS:
            raise UnsupportedModelError(
                f"hidden_act {self.hidden_act!r} is not supported by the hooked SSM adapters; "
                f"supported: {', '.join(_SUPPORTED_ACTS)}"
            )
        if self.d_inner % self.d_head != 0:
            raise InputError(
                f"head_size {self.d_head} does not divide d_inner={self.d_inner}; pick a divisor of "
                f"{self.d_inner}, e.g. {', '.join(str(d) for d in _divisors(self.d_inner)[:8])}"
            )
        if self.family in ("mamba2", "discrete_mamba2"):
            if self.n_heads * self.d_head != self.d_inner:
                raise InputError(
                    f"Mamba-2 config is inconsistent: num_heads*head_dim = {self.n_heads}*{self.d_head} "
                    f"!= d_inner = {self.d_inner}"
                )
            if self.n_heads % self.n_groups != 0:
                raise InputError(f"n_groups={self.n_groups} must divide num_heads={self.n_heads}")
        return self


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _as_int_or_none(v: Any) -> int | None:
    if isinstance(v, (list, tuple)):
        v = v[0] if v else None
    return None if v is None else int(v)


#: Optional key of a Mamba-1 checkpoint's ``config.json``: the channel-group size its heads default to
#: (``head_size=`` given to the loader wins; without either, each channel is a head).
GA_HEAD_SIZE_KEY = "ga_head_size"


def _check_head_size(head_size: Any, d_inner: int) -> int:
    if isinstance(head_size, bool) or not isinstance(head_size, int) or head_size < 1:
        raise InputError(f"head_size must be a positive int, got {head_size!r}")
    if d_inner % head_size != 0:
        raise InputError(
            f"head_size {head_size} does not divide d_inner={d_inner}; pick a divisor of {d_inner}, "
            f"e.g. {', '.join(str(d) for d in _divisors(d_inner)[:8])}"
        )
    return head_size


def config_from_hf(hf_config: Any, *, head_size: int | None = None) -> SSMConfig:
    """``SSMConfig`` from an HF ``MambaConfig`` / ``FalconMambaConfig`` / ``Mamba2Config``."""
    model_type = getattr(hf_config, "model_type", None)
    family = FAMILY_OF_MODEL_TYPE.get(model_type)  # type: ignore[arg-type]
    if family is None:
        raise UnsupportedModelError(
            f"model_type {model_type!r} is not a Mamba model; the SSM adapters serve "
            f"{', '.join(FAMILY_OF_MODEL_TYPE)}"
        )
    if family == "discrete_mamba2":
        raise UnsupportedModelError(
            f"model_type {model_type!r} has no transformers config class; load its checkpoint directory with "
            "gather_aggregate.load_model(dir) (or gather_aggregate.adapters.llamba.load_llamba)"
        )
    g = hf_config.__getattribute__
    d_model = int(g("hidden_size"))
    common = dict(
        model_type=model_type,
        d_model=d_model,
        n_layers=int(g("num_hidden_layers")),
        d_vocab=int(g("vocab_size")),
        d_state=int(g("state_size")),
        d_conv=int(g("conv_kernel")),
        conv_bias=bool(g("use_conv_bias")),
        proj_bias=bool(g("use_bias")),
        norm_eps=float(g("layer_norm_epsilon")),
        residual_in_fp32=bool(getattr(hf_config, "residual_in_fp32", True)),
        tie_embeddings=bool(getattr(hf_config, "tie_word_embeddings", True)),
        hidden_act=str(getattr(hf_config, "hidden_act", "silu")),
        pad_token_id=_as_int_or_none(getattr(hf_config, "pad_token_id", None)),
        eos_token_id=_as_int_or_none(getattr(hf_config, "eos_token_id", None)),
    )
    if family == "mamba1":
        d_inner = int(getattr(hf_config, "intermediate_size", None) or int(g("expand") * d_model))
        rank = g("time_step_rank")
        dt_rank = math.ceil(d_model / 16) if rank == "auto" else int(rank)
        if head_size is None:  # a checkpoint may name its channel groups (the zoo's mamba1-ga: 32); else per channel
            head_size = int(getattr(hf_config, GA_HEAD_SIZE_KEY, None) or 1)
        hs = _check_head_size(head_size, d_inner)
        eps = float(g("mixer_rms_eps")) if model_type == "falcon_mamba" else None
        return SSMConfig(family="mamba1", d_inner=d_inner, n_heads=d_inner // hs, d_head=hs,
                         dt_rank=dt_rank, mixer_rms_eps=eps, **common).validate()
    if head_size is not None and head_size != int(g("head_dim")):
        raise InputError(
            f"head_size={head_size} applies to Mamba-1 channel groups only; a Mamba-2 model's heads are its "
            f"own (head_dim={int(g('head_dim'))}); drop head_size"
        )
    limit = tuple(float(v) for v in getattr(hf_config, "time_step_limit", (0.0, float("inf"))))
    return SSMConfig(
        family="mamba2", d_inner=int(g("expand") * d_model), n_heads=int(g("num_heads")), d_head=int(g("head_dim")),
        n_groups=int(g("n_groups")), time_step_limit=(limit[0], limit[1]),
        chunk_size=int(getattr(hf_config, "chunk_size", 256)), **common,
    ).validate()


def is_mamba_ssm_config(raw: dict[str, Any]) -> bool:
    """True for the original mamba-ssm ``config.json`` (``MambaConfig`` of ``mamba_ssm.models``)."""
    return (isinstance(raw, dict) and "model_type" not in raw and "d_model" in raw and "n_layer" in raw
            and "n_qk_heads" not in (raw.get("ssm_cfg") or {}))  # that is Llamba's discrete Mamba-2


def config_from_mamba_ssm(raw: dict[str, Any], state_dict_shapes: dict[str, tuple[int, ...]] | None = None,
                          *, head_size: int | None = None) -> SSMConfig:
    """``SSMConfig`` from a mamba-ssm ``config.json`` dict (defaults as in mamba-ssm 2.x).

    ``state_dict_shapes`` (tensor name -> shape) lets us read the padded vocab
    size from the embedding, since mamba-ssm pads it to ``pad_vocab_size_multiple``.
    """
    ssm_cfg = dict(raw.get("ssm_cfg") or {})
    layer = ssm_cfg.pop("layer", "Mamba1")
    if raw.get("d_intermediate", 0):
        raise UnsupportedModelError(
            "this mamba-ssm checkpoint has MLP blocks (d_intermediate > 0); only pure Mamba blocks are supported"
        )
    if raw.get("attn_layer_idx"):
        raise UnsupportedModelError("this mamba-ssm checkpoint has attention layers (a hybrid); not supported here")
    if not raw.get("rms_norm", True):
        raise UnsupportedModelError("mamba-ssm checkpoints with LayerNorm (rms_norm=false) are not supported")
    d_model = int(raw["d_model"])
    vocab = int(raw.get("vocab_size", 50277))
    mult = int(raw.get("pad_vocab_size_multiple", 8))
    if vocab % mult:
        vocab += mult - vocab % mult
    if state_dict_shapes and "backbone.embedding.weight" in state_dict_shapes:
        vocab = int(state_dict_shapes["backbone.embedding.weight"][0])
    expand = ssm_cfg.get("expand", 2)
    d_inner = int(expand * d_model)
    common = dict(
        d_model=d_model, n_layers=int(raw["n_layer"]), d_vocab=vocab, d_inner=d_inner,
        d_conv=int(ssm_cfg.get("d_conv", 4)), conv_bias=bool(ssm_cfg.get("conv_bias", True)),
        proj_bias=bool(ssm_cfg.get("bias", False)), norm_eps=float(raw.get("norm_epsilon", 1e-5)),
        residual_in_fp32=bool(raw.get("residual_in_fp32", True)),
        tie_embeddings=bool(raw.get("tie_embeddings", True)), extra={"mamba_ssm_config": raw},
    )
    if layer == "Mamba1":
        rank = ssm_cfg.get("dt_rank", "auto")
        hs = _check_head_size(1 if head_size is None else head_size, d_inner)
        return SSMConfig(family="mamba1", model_type="mamba", d_state=int(ssm_cfg.get("d_state", 16)),
                         n_heads=d_inner // hs, d_head=hs,
                         dt_rank=math.ceil(d_model / 16) if rank == "auto" else int(rank), **common).validate()
    if layer == "Mamba2":
        if ssm_cfg.get("D_has_hdim", False) or ssm_cfg.get("d_ssm") not in (None, d_inner):
            raise UnsupportedModelError("mamba-ssm Mamba2 with D_has_hdim=True or d_ssm != d_inner is not supported")
        if ssm_cfg.get("norm_before_gate", False) or not ssm_cfg.get("rmsnorm", True):
            raise UnsupportedModelError("mamba-ssm Mamba2 needs rmsnorm=True and norm_before_gate=False (the defaults)")
        headdim = int(ssm_cfg.get("headdim", 64))
        if head_size is not None and head_size != headdim:
            raise InputError(f"head_size applies to Mamba-1 only; this Mamba-2 checkpoint has headdim={headdim}")
        limit = ssm_cfg.get("dt_limit", (0.0, float("inf")))
        return SSMConfig(family="mamba2", model_type="mamba2", d_state=int(ssm_cfg.get("d_state", 128)),
                         n_heads=d_inner // headdim, d_head=headdim, n_groups=int(ssm_cfg.get("ngroups", 1)),
                         time_step_limit=(float(limit[0]), float(limit[1])), gate_norm_eps=1e-5,
                         chunk_size=int(ssm_cfg.get("chunk_size", 256)), **common).validate()
    raise UnsupportedModelError(f"mamba-ssm layer type {layer!r} is not supported (use Mamba1 or Mamba2)")
