"""The layer of a head-level hybrid: some heads softmax attention, the rest Mamba-2-style SSM heads.

**SSM head** ``h`` (one per replaced attention head, ``P = d_head`` channels,
state size ``N``), on the layer input ``u`` (after the block's RMSNorm)::

    x_t, B_t, C_t = conv(u W_x, u W_B, u W_C)_t     x ∈ R^P, B, C ∈ R^N   (causal depth-wise, linear)
    Δ_t = softplus(u_t · w_Δ + b_Δ),  A = -exp(A_log)
    H_t = exp(Δ_t A) H_{t-1} + Δ_t x_t B_tᵀ          H ∈ R^{P×N}
    y_t = H_t C_t + D x_t                            (y goes into o_proj at head h's slice)

This is Mamba-2's SSD recurrence with one head per group.  Its implied
attention is ``α[t, s] = (C_t·B_s) Δ_s exp(Σ_{k=s+1..t} Δ_k A)``, so that
``y = α x + D x`` (:func:`implied_attention`).  Unlike a Mamba-2 block there is
no gate, no gated norm and no activation after the conv: the head sits where
an attention head sat, reading the values' projection and writing into the
teacher's ``o_proj``.

**MOHAWK initialisation** (see :mod:`gather_aggregate.models.head_hybrid.build`): ``W_x``
from the head's value projection, ``W_C`` from its query projection, ``W_B``
from its key projection times the softmax scale (so ``C_t·B_s = q_t·k_s/√d``,
the attention logit without RoPE), conv = identity, ``Δ ≈ 1``, slow decay.

Hooks of the mixer (``blocks.{L}.attn.<name>``): ``hook_q`` (kept heads),
``hook_k``/``hook_v`` (the kv heads they read), ``hook_rot_q/_k``,
``hook_attn_scores``, ``hook_pattern`` ``[batch, kept head, query, key]``,
``hook_z`` ``[batch, pos, head, d_head]`` (every head, in head order: the head
hook), and under ``ssm.``: ``hook_x`` ``[b, p, ssm head, P]``, ``hook_dt``
``[b, p, ssm head]``, ``hook_B``/``hook_C`` ``[b, p, ssm head, N]``, ``hook_y``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from gather_aggregate.adapters.mixers import MLPAfterMixer
from gather_aggregate.models.head_hybrid.config import HeadHybridConfig

#: Δ = softplus(bias) = 1 at initialisation.
DT_BIAS_INIT = math.log(math.e - 1.0)
#: A = -exp(A_LOG_INIT) ≈ -0.018: a slow decay (half-life ≈ 38 tokens) at initialisation.
A_LOG_INIT = -4.0


def _model_parts():  # one place that imports the project's building blocks
    from gather_aggregate.adapters.attention import GatedMLP
    from gather_aggregate.adapters.mixers import RMSNorm
    from gather_aggregate.adapters.selective_scan import mamba2_scan, mamba2_scan_ref, segsum
    from gather_aggregate.core.rotary import apply_rope, default_inv_freq, rope_cos_sin

    return dict(GatedMLP=GatedMLP, apply_rope=apply_rope, default_inv_freq=default_inv_freq,
                rope_cos_sin=rope_cos_sin, RMSNorm=RMSNorm, mamba2_scan=mamba2_scan,
                mamba2_scan_ref=mamba2_scan_ref, segsum=segsum)


def implied_attention(dt: Float[Tensor, "batch pos head"], A: Float[Tensor, " head"],
                      B: Float[Tensor, "batch pos head d_state"],
                      C: Float[Tensor, "batch pos head d_state"]) -> Float[Tensor, "batch head query key"]:
    """``α_h[t, s] = (C_t·B_s) Δ_s exp(Σ_{k=s+1..t} Δ_k A_h)`` (0 above the diagonal); differentiable.

    The dense reference used for distillation's stage 1 and as the oracle of
    :meth:`HookedHeadHybrid.pattern` (which uses the project's budgeted implementation).
    """
    segsum = _model_parts()["segsum"]
    decay = torch.exp(segsum((dt * A).transpose(1, 2)))  # [b, h, t, s]
    CB = torch.einsum("bthn,bshn->bhts", C, B)
    return CB * decay * dt.transpose(1, 2)[:, :, None, :]


class SSMHeads(nn.Module):
    """``n`` SSM heads of one layer (see the module docstring)."""

    def __init__(self, d_model: int, n: int, d_head: int, d_state: int, d_conv: int) -> None:
        super().__init__()
        self.n, self.d_head, self.d_state, self.d_conv = n, d_head, d_state, d_conv
        self.x_proj = nn.Linear(d_model, n * d_head, bias=False)
        self.B_proj = nn.Linear(d_model, n * d_state, bias=False)
        self.C_proj = nn.Linear(d_model, n * d_state, bias=False)
        ch = n * (d_head + 2 * d_state)
        self.conv_weight = nn.Parameter(torch.zeros(ch, 1, max(d_conv, 1)))
        with torch.no_grad():
            self.conv_weight[..., -1] = 1.0  # identity
        self.dt_proj = nn.Linear(d_model, n, bias=True)
        with torch.no_grad():
            self.dt_proj.weight.zero_()
            self.dt_proj.bias.fill_(DT_BIAS_INIT)
        self.A_log = nn.Parameter(torch.full((n,), A_LOG_INIT))
        self.D = nn.Parameter(torch.zeros(n))
        for name in ("x", "dt", "B", "C", "y"):
            setattr(self, f"hook_{name}", HookPoint())

    def inputs(self, u: Float[Tensor, "batch pos d_model"]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``x [b, p, n, P], Δ [b, p, n], B, C [b, p, n, N]`` (hooked)."""
        b, L, _ = u.shape
        xBC = torch.cat([self.x_proj(u), self.B_proj(u), self.C_proj(u)], -1)
        if self.d_conv:
            k = self.conv_weight.shape[-1]
            xBC = F.conv1d(xBC.transpose(1, 2), self.conv_weight, padding=k - 1, groups=xBC.shape[-1])
            xBC = xBC[..., :L].transpose(1, 2)
        x, B, C = xBC.split([self.n * self.d_head, self.n * self.d_state, self.n * self.d_state], -1)
        x = self.hook_x(x.reshape(b, L, self.n, self.d_head))
        B = self.hook_B(B.reshape(b, L, self.n, self.d_state))
        C = self.hook_C(C.reshape(b, L, self.n, self.d_state))
        dt = self.hook_dt(F.softplus(self.dt_proj(u)))
        return x, dt, B, C

    @property
    def A(self) -> Tensor:
        return -torch.exp(self.A_log)

    def forward(self, u: Float[Tensor, "batch pos d_model"], *, sequential: bool = False) -> Tensor:
        x, dt, B, C = self.inputs(u)
        parts = _model_parts()
        if sequential:
            y, _ = parts["mamba2_scan_ref"](x, dt, self.A, B, C, self.D)
        else:
            y = parts["mamba2_scan"](x, dt, self.A, B, C, self.D)
        return self.hook_y(y)


class HeadHybridMixer(nn.Module):
    """The token mixer of one layer: kept heads run softmax attention, the others are :class:`SSMHeads`."""

    def __init__(self, cfg: HeadHybridConfig, layer: int) -> None:
        super().__init__()
        d, P = cfg.d_model, cfg.d_head
        self.kept, self.ssm_idx = list(cfg.kept[layer]), list(cfg.ssm_heads(layer))
        self.kv = list(cfg.kv_heads(layer))
        rep = cfg.n_heads // cfg.n_kv_heads
        self.register_buffer("kv_of_kept", torch.tensor([self.kv.index(h // rep) for h in self.kept], dtype=torch.long),
                             persistent=False)
        order = self.kept + self.ssm_idx  # z is built as [kept | ssm] and permuted back to head order
        self.register_buffer("perm", torch.tensor([order.index(h) for h in range(cfg.n_heads)], dtype=torch.long),
                             persistent=False)
        self.n_heads, self.d_head = cfg.n_heads, P
        self.scale = P ** -0.5
        self.rotary_dim, self.rope_theta = cfg.rotary_dim, cfg.rope_theta
        self.q_proj = nn.Linear(d, len(self.kept) * P, bias=False) if self.kept else None
        self.k_proj = nn.Linear(d, len(self.kv) * P, bias=False) if self.kept else None
        self.v_proj = nn.Linear(d, len(self.kv) * P, bias=False) if self.kept else None
        self.ssm = SSMHeads(d, len(self.ssm_idx), P, cfg.d_state, cfg.d_conv) if self.ssm_idx else None
        self.o_proj = nn.Linear(cfg.n_heads * P, d, bias=False)
        self.sequential = False
        for name in ("q", "k", "v", "rot_q", "rot_k", "attn_scores", "pattern", "z"):
            setattr(self, f"hook_{name}", HookPoint())

    def attention(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos kept d_head"]:
        """The kept heads' outputs (softmax attention with RoPE, as HF Llama)."""
        parts = _model_parts()
        b, L, _ = x.shape
        q = self.hook_q(self.q_proj(x).view(b, L, len(self.kept), self.d_head))
        k = self.hook_k(self.k_proj(x).view(b, L, len(self.kv), self.d_head))
        v = self.hook_v(self.v_proj(x).view(b, L, len(self.kv), self.d_head))
        if self.rotary_dim:
            inv_freq = parts["default_inv_freq"](self.rotary_dim, self.rope_theta).to(x.device)
            cos, sin = parts["rope_cos_sin"](inv_freq, L, q.dtype)
            q = self.hook_rot_q(parts["apply_rope"](q, cos, sin))
            k = self.hook_rot_k(parts["apply_rope"](k, cos, sin))
        k, v = k[:, :, self.kv_of_kept], v[:, :, self.kv_of_kept]
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * self.scale
        causal = torch.ones(L, L, dtype=torch.bool, device=x.device).tril()
        scores = self.hook_attn_scores(scores.masked_fill(~causal, float("-inf")))
        pattern = self.hook_pattern(torch.softmax(scores.float(), dim=-1))
        return torch.einsum("bhqk,bkhd->bqhd", pattern.to(v.dtype), v)

    def heads(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos head d_head"]:
        """Every head's output in head order (the ``o_proj`` input), hooked as ``hook_z``."""
        parts = []
        if self.kept:
            parts.append(self.attention(x))
        if self.ssm is not None:
            parts.append(self.ssm(x, sequential=self.sequential).to(x.dtype))
        z = torch.cat(parts, 2)[:, :, self.perm]
        return self.hook_z(z)

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        z = self.heads(x)
        return self.o_proj(z.reshape(*z.shape[:2], self.n_heads * self.d_head))


class HeadHybridBlock(MLPAfterMixer, nn.Module):
    """Llama's pre-norm block with a :class:`HeadHybridMixer`: ``r += mixer(ln1(r)); r += mlp(ln2(r))``."""

    def __init__(self, cfg: HeadHybridConfig, layer: int) -> None:
        super().__init__()
        parts = _model_parts()
        self.hook_resid_pre = HookPoint()
        self.ln1 = parts["RMSNorm"](cfg.d_model, cfg.norm_eps)
        self.attn = HeadHybridMixer(cfg, layer)
        self.hook_mixer_out = HookPoint()
        self.hook_resid_mid = HookPoint()
        self.ln2 = parts["RMSNorm"](cfg.d_model, cfg.norm_eps)
        self.mlp = parts["GatedMLP"](cfg.d_model, cfg.d_mlp, cfg.mlp_act, False)
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(self, resid: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        resid = self.hook_resid_pre(resid)
        return self.after_mixer(resid, self.attn(self.ln1(resid)))


__all__ = ["SSMHeads", "HeadHybridMixer", "HeadHybridBlock", "implied_attention"]
