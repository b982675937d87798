"""Multi-head latent attention (DeepSeek-V2/V3, GLM-4-MoE-Lite, Youtu) under TransformerLens 4.3's bridge: its
per-head output ``hook_z`` split into value heads (:func:`split_mla_heads`), and its output at a few query rows
alone (:func:`mla_at_rows`, the exact scan's readout-rows finish).

MLA's value heads (``v_head_dim``) are narrower or wider than its query/key heads (``qk_nope_head_dim +
qk_rope_head_dim``), and TL's config scalar ``d_head`` is HF's ``head_dim`` (= ``qk_rope_head_dim``): neither is the
width of a head's slice of the ``o_proj`` input.  Nothing here imports TransformerLens at import time.
"""

from __future__ import annotations

from typing import Any

from gather_aggregate.core.errors import UnsupportedModelError


def split_mla_heads(bridge: Any) -> dict[int, int]:
    """Split each multi-head latent attention layer's ``hook_z`` into its value heads; ``{layer: v_head_dim}``.

    TL 4.3 views the ``o_proj`` input (``[batch, pos, n_heads * v_head_dim]``, HF's layout: head after head) as heads
    of the config's ``head_dim`` (HF's ``qk_rope_head_dim``) wherever that divides the width, and leaves it flat
    otherwise.  The flat tensor and what a hook returns to ``o_proj`` are right; only the view is wrong (the right
    numbers in the wrong heads).  The conversion on the bridge's private ``o.hook_in`` is replaced by the split into
    ``n_heads`` heads of ``v_head_dim`` (the same for forward and backward hooks; a returned ``[..., head, v]``
    tensor is flattened back)."""
    from transformer_lens.conversion_utils.conversion_steps.base_tensor_conversion import BaseTensorConversion

    class ValueHeads(BaseTensorConversion):  # type: ignore[misc]
        splits_attention_heads = True  # TL's marker of a [batch, pos, head, d_head] layout

        def __init__(self, n_heads: int, d_head: int) -> None:
            super().__init__()
            self.n_heads, self.d_head = n_heads, d_head

        def handle_conversion(self, x: Any, *_: Any) -> Any:
            return x.unflatten(-1, (self.n_heads, self.d_head)) if x.dim() == 3 and x.shape[-1] == (
                self.n_heads * self.d_head) else x

        def revert(self, x: Any, *_: Any) -> Any:
            return x.flatten(-2) if x.dim() == 4 and tuple(x.shape[-2:]) == (self.n_heads, self.d_head) else x

    out = {}
    for i, block in enumerate(bridge.blocks):
        attn = getattr(block, "attn", None)
        hf_attn, o = getattr(attn, "original_component", None), getattr(attn, "o", None)
        v = getattr(hf_attn, "v_head_dim", None)
        if not (v and hasattr(hf_attn, "kv_b_proj") and o is not None and hasattr(o, "hook_in")):
            continue
        width = int(o.original_component.in_features)
        if width != int(bridge.cfg.n_heads) * int(v):
            raise UnsupportedModelError(f"layer {i}'s latent attention has an o_proj input of {width}, not n_heads "
                                        f"{bridge.cfg.n_heads} x v_head_dim {v}, so its heads cannot be told apart; "
                                        "load a checkpoint whose config matches its o_proj weights")
        o.hook_in.hook_conversion = ValueHeads(int(bridge.cfg.n_heads), int(v))
        out[i] = int(v)
    return out


def _rotate(x: Any, emb: Any, interleave: bool) -> Any:
    """RoPE on ``x`` (``[batch, pos, head, d]``) at the positions of ``emb``: DeepSeek-V2's complex frequencies
    (``[batch, pos, d / 2]``, rotating pairs ``(x0, x1), ...``), or V3's ``(cos, sin)`` (``[batch, pos, d]``) on
    interleaved pairs (out: the pairs' first then second parts, as HF's) or on halves (``rotate_half``)."""
    import torch

    if isinstance(emb, torch.Tensor):
        pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(pairs * emb[:, :, None]).flatten(-2).type_as(x)
    cos, sin = emb[0][:, :, None], emb[1][:, :, None]
    if interleave:
        cos, sin = cos[..., : cos.shape[-1] // 2], sin[..., : sin.shape[-1] // 2]
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def mla_at_rows(attn: Any, rotary: Any, x: Any, rows: Any) -> Any:
    """Multi-head latent attention's output at query positions ``rows`` (``[batch, k]``) only, from the normed layer
    input ``x`` (``[batch, pos, d_model]``): latent keys and values at every position, queries, scores and outputs at
    the ``k`` rows (HF's DeepSeek-V2/V3 attention: query LoRA or not, RoPE on the ``qk_rope_head_dim`` part only,
    complex, interleaved or half-split, the module's ``scaling`` with yarn's mscale).  ``None`` for a module that
    is not written so (the exact scan checks it against the full forward before using it)."""
    import torch

    names = ("kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj", "qk_nope_head_dim", "qk_rope_head_dim",
             "v_head_dim", "kv_lora_rank", "scaling")
    if not all(hasattr(attn, n) for n in names) or (getattr(attn, "q_proj", None) is None and getattr(
            attn, "q_b_proj", None) is None) or getattr(attn, "indexer", None) is not None:  # GLM-5's sparse keys
        return None
    b, n_pos, _ = x.shape
    nope, rope, v_dim = attn.qk_nope_head_dim, attn.qk_rope_head_dim, attn.v_head_dim
    at = torch.arange(b, device=x.device)[:, None]
    xr = x[at, rows]
    q = attn.q_proj(xr) if getattr(attn, "q_proj", None) is not None else attn.q_b_proj(
        attn.q_a_layernorm(attn.q_a_proj(xr)))
    q_pass, q_rot = q.view(b, rows.shape[1], -1, nope + rope).split([nope, rope], dim=-1)  # [batch, k, head, d]
    latent, k_rot = attn.kv_a_proj_with_mqa(x).split([attn.kv_lora_rank, rope], dim=-1)
    k_pass, v = attn.kv_b_proj(attn.kv_a_layernorm(latent)).view(b, n_pos, -1, nope + v_dim).split([nope, v_dim], -1)
    emb = rotary(x, torch.arange(n_pos, device=x.device)[None].expand(b, n_pos))
    interleave = bool(getattr(getattr(attn, "config", None), "rope_interleave", False))
    at_rows = emb[at, rows] if isinstance(emb, torch.Tensor) else (emb[0][at, rows], emb[1][at, rows])
    q = torch.cat([q_pass, _rotate(q_rot, at_rows, interleave)], dim=-1)
    k_rot = _rotate(k_rot[:, :, None], emb, interleave).expand(-1, -1, k_pass.shape[2], -1)
    k = torch.cat([k_pass, k_rot], dim=-1)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * attn.scaling
    causal = torch.arange(n_pos, device=x.device)[None, None, :] <= rows[:, :, None]
    pattern = torch.softmax(scores.masked_fill(~causal[:, None], float("-inf")).float(), dim=-1).to(v.dtype)
    return attn.o_proj(torch.einsum("bhqk,bkhd->bqhd", pattern, v).reshape(b, rows.shape[1], -1))


__all__ = ["split_mla_heads", "mla_at_rows"]
