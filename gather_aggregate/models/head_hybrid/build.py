"""Build a head-level hybrid from a Llama-family teacher, with MOHAWK's initialisation of the SSM heads.

MOHAWK (Bick et al., 2024) initialises an SSM head from the attention head it
replaces, so that the SSM's mixing matrix starts as the attention's logits
without the softmax.  For head ``h`` (reading kv head ``g``) with
``q = u W_q[h]``, ``k = u W_k[g]``, ``v = u W_v[g]``:

* ``W_x = W_v[g]`` (the SSM's input is the head's values);
* ``d_state = d_head``: ``W_C = W_q[h]``, ``W_B = W_k[g] / √d_head``, so ``C_t·B_s = q_t·k_s / √d_head``
  (RoPE is dropped: the SSM's position signal is its decay);
* ``d_state < d_head``: the best rank-``d_state`` factorisation of the bilinear form
  ``W_q[h]ᵀ W_k[g] / √d_head = U S Vᵀ``: ``W_C = √S_r U_rᵀ``, ``W_B = √S_r V_rᵀ``;
* ``d_state > d_head``: the ``d_head`` rows as above and the extra rows small random
  (all-zero extra rows would be a saddle: their gradients vanish);
* output projection, norms, MLPs and embeddings: the teacher's.

``init="random"`` leaves the SSM heads at PyTorch's default initialisation
(a baseline for MOHAWK's).  The teacher is never modified.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from gather_aggregate.core.errors import InputError
from gather_aggregate.models.head_hybrid.config import HeadHybridConfig
from gather_aggregate.models.head_hybrid.model import HookedHeadHybrid

#: Standard deviation of the extra B/C rows when d_state > d_head.
EXTRA_ROW_STD = 1e-2


def _teacher_parts(teacher: Any) -> tuple[Any, dict[str, torch.Tensor], Any, str]:
    """``(hf_config, state_dict, tokenizer, name)`` of a directory, an HF ``LlamaForCausalLM`` or a
    :class:`~gather_aggregate.models.bridge.BridgeModel` / hooked model holding one."""
    if isinstance(teacher, (str, os.PathLike)):
        from transformers import AutoConfig

        from gather_aggregate.adapters.checkpoint import read_state_dict
        from gather_aggregate.models.checkpoint_checks import file_message, no_config_message
        from gather_aggregate.models.loading import load_tokenizer, resolve_source

        d = Path(resolve_source(teacher)).expanduser()  # a zoo name, `~`; a near miss gets a "did you mean"
        if d.is_file():
            raise InputError(file_message(d))
        if not d.is_dir():
            raise InputError(f"hybridise takes a local Llama checkpoint directory or a zoo name; {str(teacher)!r} is "
                             "neither (download a hub model first and pass its directory)")
        if not (d / "config.json").is_file():
            raise InputError(no_config_message(d))
        return AutoConfig.from_pretrained(str(d)), read_state_dict(d), load_tokenizer(str(d)), str(d)
    hf = teacher
    bridged = getattr(getattr(teacher, "module", None), "original_model", None)  # a BridgeModel from load_model
    if bridged is not None and hasattr(bridged, "config"):
        # TransformerLens wraps each HF submodule: its parameters are HF's own, named with "._original_component"
        sd = {k.replace("._original_component", ""): v.detach() for k, v in bridged.state_dict().items()}
        return bridged.config, sd, getattr(teacher, "tokenizer", None), str(getattr(teacher, "name", "") or "")
    for attr in ("hf_model", "original_model", "model"):  # a wrapper holding the HF model
        if not hasattr(hf, "config") and hasattr(hf, attr):
            hf = getattr(hf, attr)
    if not hasattr(hf, "config") or not hasattr(hf, "state_dict"):
        raise InputError(f"hybridise takes a Llama directory, a zoo name, an HF LlamaForCausalLM or load_model's "
                         f"model of one, got {type(teacher).__name__}")
    return hf.config, {k: v.detach() for k, v in hf.state_dict().items()}, getattr(teacher, "tokenizer", None), \
        str(getattr(hf.config, "_name_or_path", ""))


def _mohawk_bc(Wq: torch.Tensor, Wk: torch.Tensor, d_state: int, scale: float,
               gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``(W_C, W_B)`` ``[d_state, d_model]`` with ``W_Cᵀ W_B ≈ scale · W_qᵀ W_k`` (exact when d_state ≥ d_head)."""
    P, d = Wq.shape
    if d_state == P:
        return Wq.clone(), Wk * scale
    if d_state > P:
        extra = lambda: torch.randn(d_state - P, d, generator=gen) * EXTRA_ROW_STD  # noqa: E731
        return torch.cat([Wq, extra()]), torch.cat([Wk * scale, extra()])
    U, S, Vh = torch.linalg.svd(Wq.double().T @ (Wk.double() * scale), full_matrices=False)  # [d, d]
    r = S[:d_state].sqrt()
    return (r[:, None] * U[:, :d_state].T).float(), (r[:, None] * Vh[:d_state]).float()


def hybridise(teacher: Any, kept: Sequence[tuple[int, int]] | str, *, d_state: int | None = None,
              d_conv: int = 4, init: str = "mohawk", seed: int = 0) -> HookedHeadHybrid:
    """A :class:`HookedHeadHybrid` of ``teacher`` keeping the heads ``kept`` as softmax attention.

    Args:
        teacher: a Llama checkpoint directory or an HF ``LlamaForCausalLM`` (copied, never modified).
        kept: ``(layer, head)`` pairs, or ``"all"`` (the teacher itself, exactly) / ``"none"``.
        d_state: the SSM heads' state size (default: the head dimension).
        d_conv: the SSM heads' causal conv width (identity at init; 0 for none).
        init: ``"mohawk"`` (from the attention heads) or ``"random"``.
        seed: for the random parts of the initialisation.
    """
    from gather_aggregate.core.indices import as_index

    if init not in ("mohawk", "random"):
        raise InputError(f"init must be 'mohawk' or 'random', got {init!r}")
    seed = as_index(seed, "seed")  # a string was torch's "manual_seed expected a long"
    hf_cfg, sd, tokenizer, name = _teacher_parts(teacher)
    cfg = HeadHybridConfig.from_llama(hf_cfg, kept, d_state=d_state, d_conv=d_conv, teacher=name)
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = HookedHeadHybrid(cfg)
    P, rep = cfg.d_head, cfg.n_heads // cfg.n_kv_heads

    def get(key: str) -> torch.Tensor:
        if key not in sd:
            raise InputError(f"the teacher's weights lack {key!r}; is it a LlamaForCausalLM checkpoint?")
        value = sd[key]  # a tensor, or a checkpoint's StoredTensor read only now (read_state_dict streams)
        return (value if isinstance(value, torch.Tensor) else value.load()).detach().float()

    def rows(W: torch.Tensor, heads: Sequence[int]) -> torch.Tensor:
        return torch.cat([W[h * P:(h + 1) * P] for h in heads]) if heads else W[:0]

    with torch.no_grad():
        model.embed.weight.copy_(get("model.embed_tokens.weight"))
        model.ln_final.weight.copy_(get("model.norm.weight"))
        if model.unembed is not None:
            model.unembed.weight.copy_(get("lm_head.weight") if "lm_head.weight" in sd
                                       else get("model.embed_tokens.weight"))
        for L, blk in enumerate(model.blocks):
            p = f"model.layers.{L}."
            blk.ln1.weight.copy_(get(p + "input_layernorm.weight"))
            blk.ln2.weight.copy_(get(p + "post_attention_layernorm.weight"))
            for part in ("gate_proj", "up_proj", "down_proj"):
                getattr(blk.mlp, part).weight.copy_(get(p + f"mlp.{part}.weight"))
            Wq, Wk, Wv = (get(p + f"self_attn.{n}_proj.weight") for n in ("q", "k", "v"))
            mix = blk.attn
            mix.o_proj.weight.copy_(get(p + "self_attn.o_proj.weight"))
            if mix.kept:
                mix.q_proj.weight.copy_(rows(Wq, mix.kept))
                mix.k_proj.weight.copy_(rows(Wk, mix.kv))
                mix.v_proj.weight.copy_(rows(Wv, mix.kv))
            if mix.ssm is not None and init == "mohawk":
                N = cfg.d_state
                for i, h in enumerate(mix.ssm_idx):
                    g = h // rep
                    Wc, Wb = _mohawk_bc(Wq[h * P:(h + 1) * P], Wk[g * P:(g + 1) * P], N, P ** -0.5, gen)
                    mix.ssm.x_proj.weight[i * P:(i + 1) * P] = Wv[g * P:(g + 1) * P]
                    mix.ssm.C_proj.weight[i * N:(i + 1) * N] = Wc
                    mix.ssm.B_proj.weight[i * N:(i + 1) * N] = Wb
    model.tokenizer = tokenizer
    return model.eval()


__all__ = ["hybridise"]
