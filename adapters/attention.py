"""Hooked transformer sublayers for hybrid models: causal attention (RoPE, partial RoPE, GQA), gated MLP, MoE.

The attention follows the HF Llama-family math used by Bamba, Jamba and Zamba2::

    q, k, v = x W_q (+b), x W_k (+b), x W_v (+b)           # q: H heads, k/v: H_kv heads (GQA)
    q, k    = rope(q), rope(k)                              # first `rotary_dim` dims only; none if 0
    scores  = q k^T * scale  (causal: -inf above the diagonal)
    pattern = softmax(scores)  in fp32                      # query head h reads kv head h // (H / H_kv)
    z       = pattern v
    out     = z W_o (+b)

Hook points (TransformerLens names; seen from the root as ``blocks.{L}.attn.<name>``):

=====================  =========================================================
``hook_q``             ``[batch, pos, head, d_head]`` before RoPE
``hook_k``/``hook_v``  ``[batch, pos, kv_head, d_head]`` (before RoPE for k)
``hook_rot_q/_k``      after RoPE (only when the layer uses RoPE)
``hook_attn_scores``   ``[batch, head, query, key]`` scaled, causal-masked, pre-softmax
``hook_pattern``       ``[batch, head, query, key]`` softmax (post-mask); editing it
                       changes ``z`` (this is how attention heads are masked)
``hook_z``             ``[batch, pos, head, d_head]`` = ``o_proj`` input (the head hook)
=====================  =========================================================
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from gather_aggregate.core.errors import UnsupportedModelError
from gather_aggregate.core.rotary import apply_rope, default_inv_freq, rope_cos_sin

_ACTS: dict[str, Callable[[Tensor], Tensor]] = {"silu": F.silu, "swish": F.silu, "gelu": F.gelu,
                                                 "relu": F.relu, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh")}


def activation(name: str) -> Callable[[Tensor], Tensor]:
    try:
        return _ACTS[name]
    except KeyError:
        raise UnsupportedModelError(
            f"MLP activation {name!r} is not supported by the hooked hybrids; supported: {', '.join(_ACTS)}"
        ) from None


class Attention(nn.Module):
    """Causal multi-head attention with hooks; exact to HF's eager/SDPA attention in fp32."""

    def __init__(self, d_in: int, d_model: int, n_heads: int, n_kv_heads: int, d_head: int, *,
                 scale: float, rotary_dim: int = 0, rope_theta: float = 10000.0,
                 qkv_bias: bool = False, o_bias: bool = False) -> None:
        super().__init__()
        if n_heads % n_kv_heads:
            raise UnsupportedModelError(f"num_attention_heads={n_heads} must be a multiple of "
                                        f"num_key_value_heads={n_kv_heads}")
        self.n_heads, self.n_kv_heads, self.d_head = n_heads, n_kv_heads, d_head
        self.scale, self.rotary_dim = scale, rotary_dim
        self.q_proj = nn.Linear(d_in, n_heads * d_head, bias=qkv_bias)
        self.k_proj = nn.Linear(d_in, n_kv_heads * d_head, bias=qkv_bias)
        self.v_proj = nn.Linear(d_in, n_kv_heads * d_head, bias=qkv_bias)
        self.o_proj = nn.Linear(n_heads * d_head, d_model, bias=o_bias)
        self.rope_theta = float(rope_theta)  # inv_freq is recomputed in fp32 per call: no buffer to cast or load
        for name in ("q", "k", "v", "rot_q", "rot_k", "attn_scores", "pattern", "z"):
            setattr(self, f"hook_{name}", HookPoint())

    def qkv(self, x: Float[Tensor, "batch pos d_in"]) -> tuple[Tensor, Tensor, Tensor]:
        """Flat projections ``[batch, pos, heads * d_head]`` (subclasses add adapters here)."""
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)

    def forward(self, x: Float[Tensor, "batch pos d_in"]) -> Float[Tensor, "batch pos d_model"]:
        z = self.heads(x)
        return self.o_proj(z.reshape(*z.shape[:2], self.n_heads * self.d_head))

    def heads(self, x: Float[Tensor, "batch pos d_in"]) -> Float[Tensor, "batch pos head d_head"]:
        """The per-head outputs ``z`` (``hook_z``, the ``o_proj`` input): the forward without ``o_proj``."""
        b, L, _ = x.shape
        q, k, v = self.qkv(x)
        q = self.hook_q(q.view(b, L, self.n_heads, self.d_head))
        k = self.hook_k(k.view(b, L, self.n_kv_heads, self.d_head))
        v = self.hook_v(v.view(b, L, self.n_kv_heads, self.d_head))
        if self.rotary_dim:
            inv_freq = default_inv_freq(self.rotary_dim, self.rope_theta).to(x.device)
            cos, sin = rope_cos_sin(inv_freq, L, q.dtype)
            q, k = self.hook_rot_q(apply_rope(q, cos, sin)), self.hook_rot_k(apply_rope(k, cos, sin))
        rep = self.n_heads // self.n_kv_heads
        k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * self.scale
        causal = torch.ones(L, L, dtype=torch.bool, device=x.device).tril()
        scores = self.hook_attn_scores(scores.masked_fill(~causal, float("-inf")))
        pattern = self.hook_pattern(torch.softmax(scores.float(), dim=-1))
        z: Tensor = self.hook_z(torch.einsum("bhqk,bkhd->bqhd", pattern.to(v.dtype), v))
        return z

    def forward_rows(self, x: Float[Tensor, "batch pos d_in"],
                     rows: Int[Tensor, "batch k"]) -> Float[Tensor, "batch k d_model"]:
        """``forward(x)`` at the query positions ``rows`` only: keys and values at every position, queries,
        scores and outputs at ``k`` rows per prompt (``k × pos`` scores instead of ``pos × pos``).  The readout
        finish of the exact scan uses it on the last layer; no hook fires."""
        b, L, _ = x.shape
        q, k, v = self.qkv(x)
        at = torch.arange(b, device=x.device)[:, None]
        q = q.view(b, L, self.n_heads, self.d_head)[at, rows]  # [batch, k, head, d_head]
        k = k.view(b, L, self.n_kv_heads, self.d_head)
        v = v.view(b, L, self.n_kv_heads, self.d_head)
        if self.rotary_dim:
            inv_freq = default_inv_freq(self.rotary_dim, self.rope_theta).to(x.device)
            cos, sin = rope_cos_sin(inv_freq, L, q.dtype)
            q, k = apply_rope(q, cos[rows], sin[rows]), apply_rope(k, cos, sin)
        rep = self.n_heads // self.n_kv_heads
        k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * self.scale
        causal = torch.arange(L, device=x.device)[None, None, :] <= rows[:, :, None]  # [batch, k, key]
        pattern = torch.softmax(scores.masked_fill(~causal[:, None], float("-inf")).float(), dim=-1)
        z = torch.einsum("bhqk,bkhd->bqhd", pattern.to(v.dtype), v)
        return self.o_proj(z.reshape(b, rows.shape[1], self.n_heads * self.d_head))


class GatedMLP(nn.Module):
    """SwiGLU-style MLP ``down(act(gate(x)) * up(x))``; hooks ``hook_pre`` (gate), ``hook_pre_linear`` (up), ``hook_post``."""

    def __init__(self, d_model: int, d_mlp: int, act: str = "silu", bias: bool = False) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_mlp, bias=bias)
        self.up_proj = nn.Linear(d_model, d_mlp, bias=bias)
        self.down_proj = nn.Linear(d_mlp, d_model, bias=bias)
        self.act = activation(act)
        self.hook_pre, self.hook_pre_linear, self.hook_post = HookPoint(), HookPoint(), HookPoint()

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        pre, lin = self.hook_pre(self.gate_proj(x)), self.hook_pre_linear(self.up_proj(x))
        return self.down_proj(self.hook_post(self.act(pre) * lin))


def mix_experts(x: Float[Tensor, "batch pos d_model"], weights: Float[Tensor, "batch pos expert"],
                gate_up_proj: Float[Tensor, "expert two_d_mlp d_model"], down_proj: Float[Tensor, "expert d_model d_mlp"],
                act: Callable[[Tensor], Tensor]) -> Float[Tensor, "batch pos d_model"]:
    """``Σ_e w_e · down_e(act(gate_e x) ⊙ up_e x)`` with ``[gate_e; up_e] = gate_up_proj[e]``, each expert run
    on the tokens that give it a nonzero weight only."""
    out = torch.zeros_like(x)
    for e in range(gate_up_proj.shape[0]):
        sel = weights[..., e] != 0
        if bool(sel.any()):
            gate, up = F.linear(x[sel], gate_up_proj[e]).chunk(2, dim=-1)
            out[sel] = out[sel] + F.linear(act(gate) * up, down_proj[e]) * weights[..., e][sel][:, None]
    return out


class SparseMoE(nn.Module):
    """Top-k mixture of gated-MLP experts (Jamba/Mixtral routing; weights renormalised only when ``norm_topk``).

    ``p = softmax(x W_router^T)`` (fp32); each token uses its top-k experts ``e`` with
    weight ``p_e`` (``p_e / Σ_top-k p`` when ``norm_topk``): ``out = Σ_e p_e · down_e(act(gate_e x) ⊙ up_e x)``.
    Hooks: ``hook_router_logits`` ``[batch, pos, expert]`` and ``hook_expert_weights``
    ``[batch, pos, expert]`` (``p_e`` on chosen experts, 0 elsewhere).
    """

    def __init__(self, d_model: int, d_mlp: int, n_experts: int, top_k: int, act: str = "silu",
                 norm_topk: bool = False) -> None:
        super().__init__()
        self.n_experts, self.top_k, self.d_mlp, self.norm_topk = n_experts, top_k, d_mlp, norm_topk
        self.router = nn.Linear(d_model, n_experts, bias=False)
        self.gate_up_proj = nn.Parameter(torch.zeros(n_experts, 2 * d_mlp, d_model))
        self.down_proj = nn.Parameter(torch.zeros(n_experts, d_model, d_mlp))
        self.act = activation(act)
        self.hook_router_logits, self.hook_expert_weights = HookPoint(), HookPoint()

    def route(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos expert"]:
        """Each token's expert weights (zero off its top-k), through ``hook_expert_weights``."""
        logits = self.hook_router_logits(self.router(x))
        probs = torch.softmax(logits.float(), dim=-1)
        top_w, top_i = probs.topk(self.top_k, dim=-1)
        if self.norm_topk:
            top_w = top_w / top_w.sum(-1, keepdim=True)
        weights: Tensor = self.hook_expert_weights(torch.zeros_like(probs).scatter(-1, top_i, top_w).to(x.dtype))
        return weights

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        return mix_experts(x, self.route(x), self.gate_up_proj, self.down_proj, self.act)


__all__ = ["Attention", "GatedMLP", "SparseMoE", "mix_experts", "apply_rope", "rope_cos_sin", "default_inv_freq", "activation"]
