"""``HeadHybridConfig``: a Llama-family transformer in which some heads stay attention and the rest are SSM heads.

The layout is per head, not per layer: ``kept[L]`` lists the heads of layer
``L`` that stay softmax attention; every other head of that layer is a
Mamba-2-style SSM head with the attention head's value width ``d_head`` as its
channel count and ``d_state`` as its state size (see
:mod:`gather_aggregate.models.head_hybrid.layers`).  Everything else (embeddings,
norms, MLPs, output projections) is the teacher's.

Saved as ``config.json`` with ``model_type = "ga_head_hybrid"``;
:func:`gather_aggregate.load_model` loads such a directory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

from gather_aggregate.core.errors import InputError, UnsupportedModelError

MODEL_TYPE = "ga_head_hybrid"


@dataclass
class HeadHybridConfig:
    """Geometry of the teacher (Llama field meanings) plus the per-head layout and the SSM heads' sizes."""

    d_model: int
    n_layers: int
    d_vocab: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_mlp: int
    kept: tuple[tuple[int, ...], ...]  # per layer: heads that stay softmax attention
    d_state: int = 32
    d_conv: int = 4  # causal depth-wise conv on each SSM head's x, B, C (identity at init); 0: none
    norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rotary_dim: int = 0  # 0: d_head
    tie_embeddings: bool = False
    mlp_act: str = "silu"
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    teacher: str = ""
    model_type: str = MODEL_TYPE
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.kept = tuple(tuple(sorted({int(h) for h in hs})) for hs in self.kept)
        if self.rotary_dim == 0:
            self.rotary_dim = self.d_head
        self.validate()

    def validate(self) -> HeadHybridConfig:
        if len(self.kept) != self.n_layers:
            raise InputError(f"kept must list the kept heads of each of the {self.n_layers} layers, "
                             f"got {len(self.kept)} entries")
        for L, hs in enumerate(self.kept):
            bad = [h for h in hs if not 0 <= h < self.n_heads]
            if bad:
                raise InputError(f"kept heads {bad} of layer {L} out of range (0..{self.n_heads - 1})")
        if self.n_heads % self.n_kv_heads:
            raise InputError(f"n_heads={self.n_heads} must be a multiple of n_kv_heads={self.n_kv_heads}")
        if self.d_state < 1 or self.d_conv < 0:
            raise InputError(f"d_state must be >= 1 and d_conv >= 0, got {self.d_state}, {self.d_conv}")
        return self

    # ---- layout ---------------------------------------------------------------
    def ssm_heads(self, layer: int) -> tuple[int, ...]:
        """The heads of ``layer`` that are SSM heads (ascending)."""
        kept = set(self.kept[layer])
        return tuple(h for h in range(self.n_heads) if h not in kept)

    def kv_heads(self, layer: int) -> tuple[int, ...]:
        """The kv heads the kept attention heads of ``layer`` read (under GQA several share one)."""
        rep = self.n_heads // self.n_kv_heads
        return tuple(sorted({h // rep for h in self.kept[layer]}))

    @property
    def kept_heads(self) -> list[tuple[int, int]]:
        return [(L, h) for L, hs in enumerate(self.kept) for h in hs]

    @property
    def n_kept(self) -> int:
        return sum(len(hs) for hs in self.kept)

    def cache_elements(self, seq_len: int) -> tuple[int, int, int]:
        """``(kv, ssm state, conv)`` elements kept between tokens (see :mod:`.memory`)."""
        kv = sum(2 * len(self.kv_heads(L)) * self.d_head * seq_len for L in range(self.n_layers))
        n_ssm = sum(len(self.ssm_heads(L)) for L in range(self.n_layers))
        conv = n_ssm * (self.d_head + 2 * self.d_state) * self.d_conv
        return kv, n_ssm * self.d_head * self.d_state, conv

    # ---- (de)serialisation ----------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["kept"] = [list(hs) for hs in self.kept]
        return d

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> HeadHybridConfig:
        if raw.get("model_type") != MODEL_TYPE:
            raise UnsupportedModelError(f"not a {MODEL_TYPE} config (model_type {raw.get('model_type')!r})")
        names = {f.name for f in fields(cls)}
        absent = [f.name for f in fields(cls) if f.name not in raw and f.default is MISSING
                  and f.default_factory is MISSING]
        sizes = ("d_model", "n_layers", "d_vocab", "n_heads", "n_kv_heads", "d_head", "d_mlp", "d_state", "d_conv")
        wrong = [k for k in sizes if k in raw and (isinstance(raw[k], bool) or not isinstance(raw[k], int))]
        if absent or wrong:  # were KeyError / torch's TypeError deep in the model's constructor
            raise InputError(f"{'missing fields ' + str(absent) if absent else ''}"
                             f"{'; ' if absent and wrong else ''}"
                             f"{'fields that must be whole numbers: ' + str({k: raw[k] for k in wrong}) if wrong else ''}")
        kw = {k: v for k, v in raw.items() if k in names}
        kw["kept"] = tuple(tuple(hs) for hs in raw["kept"])
        return cls(**kw)

    @classmethod
    def from_llama(cls, hf_config: Any, kept: Sequence[tuple[int, int]] | Sequence[Sequence[int]] | str, *,
                   d_state: int | None = None, d_conv: int = 4, teacher: str = "") -> HeadHybridConfig:
        """The hybrid of a Llama config keeping ``kept`` heads: ``(layer, head)`` pairs, or ``"all"`` / ``"none"``.

        ``d_state`` defaults to the head dimension, where the SSM head's ``C·B`` can
        equal the attention head's ``q·k`` (MOHAWK's initialisation).
        """
        c = hf_config if isinstance(hf_config, dict) else hf_config.to_dict()
        if c.get("model_type") not in ("llama",):
            raise UnsupportedModelError(f"hybridise takes a Llama-family transformer (model_type 'llama'), got "
                                        f"{c.get('model_type')!r}")
        rp = dict(c.get("rope_parameters") or {})
        found = [what for what, bad in ((f"rope_type {rp.get('rope_type')!r}", rp.get("rope_type", "default") != "default"),
                                        ("attention_bias", c.get("attention_bias")), ("mlp_bias", c.get("mlp_bias")))
                 if bad]
        if found:
            raise UnsupportedModelError(f"hybridise supports Llamas with default RoPE and no attention/MLP biases; this "
                                        f"teacher has {', '.join(found)}")
        from gather_aggregate.core.indices import as_index

        if d_state is not None and as_index(d_state, "d_state") < 1:  # 0 was read as "the default"
            raise InputError(f"d_state must be >= 1 (or None for the head dimension), got {d_state!r}")
        d_conv = as_index(d_conv, "d_conv")  # 2.5 was a TypeError deep in torch.zeros
        n_layers, n_heads = int(c["num_hidden_layers"]), int(c["num_attention_heads"])
        d_head = int(c.get("head_dim") or int(c["hidden_size"]) // n_heads)
        per_layer = _kept_per_layer(kept, n_layers, n_heads)

        def first(v: Any) -> int | None:
            v = v[0] if isinstance(v, (list, tuple)) and v else v
            return None if v is None or isinstance(v, (list, tuple)) else int(v)

        return cls(
            d_model=int(c["hidden_size"]), n_layers=n_layers, d_vocab=int(c["vocab_size"]), n_heads=n_heads,
            n_kv_heads=int(c.get("num_key_value_heads") or n_heads), d_head=d_head,
            d_mlp=int(c["intermediate_size"]), kept=tuple(tuple(s) for s in per_layer),
            d_state=int(d_state or d_head), d_conv=d_conv, norm_eps=float(c.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rp.get("rope_theta", c.get("rope_theta", 10000.0))),
            rotary_dim=int(d_head * float(rp.get("partial_rotary_factor", 1.0))),
            tie_embeddings=bool(c.get("tie_word_embeddings", False)), mlp_act=str(c.get("hidden_act", "silu")),
            pad_token_id=first(c.get("pad_token_id")), bos_token_id=first(c.get("bos_token_id")),
            eos_token_id=first(c.get("eos_token_id")), teacher=teacher,
        )


def _kept_per_layer(kept: Any, n_layers: int, n_heads: int) -> list[set[int]]:
    """``kept`` as the kept heads of each layer: ``"all"`` / ``"none"``, or ``(layer, head)`` pairs (names such as
    ``"L1H0"``, NumPy/torch integers, an ``[n, 2]`` array; negative indices count from the end, as in scans)."""
    from gather_aggregate.core.indices import HEAD_NAME, as_index

    if isinstance(kept, str) and kept.strip().lower() in ("all", "none"):
        return [set(range(n_heads)) if kept.strip().lower() == "all" else set() for _ in range(n_layers)]
    if isinstance(kept, str) or not hasattr(kept, "__iter__"):
        raise InputError(f"kept must be (layer, head) pairs (e.g. [(1, 0), (1, 3)] or scan.top(5)), 'all' or "
                         f"'none', got {kept!r}")
    items = kept.tolist() if hasattr(kept, "tolist") else list(kept)  # a NumPy array or tensor of pairs
    per_layer: list[set[int]] = [set() for _ in range(n_layers)]
    for item in items:
        if isinstance(item, str) and HEAD_NAME.match(item.strip()):
            m = HEAD_NAME.match(item.strip())
            item = (int(m.group(1)), int(m.group(2))) if m else item
        try:
            L, h = item
        except (TypeError, ValueError):
            raise InputError(f"kept must be (layer, head) pairs or names like 'L1H0', got {item!r}") from None
        L, h = as_index(L, "kept layer"), as_index(h, "kept head")  # 1.5 was truncated to 1, True read as 1
        if not -n_layers <= L < n_layers:
            raise InputError(f"kept head ({L}, {h}): layer out of range (0..{n_layers - 1})")
        if not -n_heads <= h < n_heads:
            raise InputError(f"kept heads [{h}] of layer {L} out of range (0..{n_heads - 1})")
        per_layer[L % n_layers].add(h % n_heads)
    return per_layer


__all__ = ["HeadHybridConfig", "MODEL_TYPE"]
