"""Multi-head latent attention (DeepSeek-V2/V3, GLM-4-MoE-Lite, Youtu) under TransformerLens 4.3's bridge: its
per-head output ``hook_z`` split into value heads (:func:`split_mla_heads`).

MLA's value heads (``v_head_dim``) are narrower or wider than its query/key heads (``qk_nope_head_dim +
qk_rope_head_dim``), and TL's config scalar ``d_head`` is HF's ``head_dim`` (= ``qk_rope_head_dim``): neither is the
width of a head's slice of the ``o_proj`` input.  Nothing here imports TransformerLens at import time.
"""

from __future__ import annotations

from typing import Any

from gather_aggregate.errors import UnsupportedModelError


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


__all__ = ["split_mla_heads"]
