"""Hooked gated-DeltaNet mixer (HF ``Qwen3NextGatedDeltaNet``), exact to HF's pure-torch path.

Per layer with ``n_k`` key heads of ``d_k`` and ``n_v`` value heads of ``d_v`` (``r = n_v / n_k``)::

    [q | k | v | z]_j = in_proj_qkvz(u) grouped per key head j  (d_k, d_k, r·d_v, r·d_v)
    [b | a]_j         = in_proj_ba(u) grouped per key head j      (r, r)
    q, k, v           = silu(causal_conv1d([q ‖ k ‖ v]))          (no conv bias)
    β = sigmoid(b),   g = -exp(A_log) · softplus(a + dt_bias)      (log decay per value head)
    o                 = gated delta rule(l2norm(q)/√d_k, l2norm(k), v, g, β)   (gather_aggregate.adapters.delta_rule)
    out               = out_proj(rmsnorm_w(o) ⊙ silu(z))           (per value head, norm before gate)

Hooks (``blocks.{L}.ssm.<name>``): ``hook_conv_in`` / ``hook_conv_out`` ``[b, p, 2·n_k·d_k + n_v·d_v]``
(before the conv / before its silu), ``hook_q`` / ``hook_k`` ``[b, p, n_k, d_k]`` (after the silu, before
the l2 norm), ``hook_v`` and ``hook_gate`` (``z``) ``[b, p, n_v, d_v]``, ``hook_beta`` and ``hook_g``
``[b, p, n_v]``, ``hook_y`` ``[b, p, n_v, d_v]`` (the rule's output ``o = α @ v``), ``hook_head_out``
``[b, p, n_v, d_v]`` (the ``out_proj`` input) and ``hook_state`` ``[b, p, n_v, d_v, d_k]`` (sequential only).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from gather_aggregate.adapters.delta_rule import delta_rule_chunked, delta_rule_ref, prepare_qk
from gather_aggregate.adapters.mixers import WeightedRMS, causal_conv
from gather_aggregate.core.errors import InputError

_IMPLS = ("auto", "chunked", "sequential", "kernel")


class GatedHeadNorm(WeightedRMS):
    """Per-head RMSNorm with weight, then ``⊙ silu(gate)`` (HF ``Qwen3NextRMSNormGated``)."""

    def forward(self, x: Tensor, gate: Tensor) -> Tensor:
        return (self.normalize(x) * F.silu(gate.float())).to(x.dtype)


class GatedDeltaNetMixer(nn.Module):
    """Hooked gated DeltaNet.  ``n_v`` heads of ``d_v`` channels are the protocol's heads."""

    #: "auto"/"chunked" (the chunked rule), "sequential" (the reference loop; fires hook_state); no kernel
    scan_impl: str = "auto"
    #: the hooks :meth:`masked_output` reads (see :mod:`gather_aggregate.adapters.masking`)
    mask_inputs: tuple[str, ...] = ("q", "k", "v", "g", "beta")

    def __init__(self, d_model: int, n_k: int, n_v: int, d_k: int, d_v: int, d_conv: int, eps: float) -> None:
        super().__init__()
        if n_v % n_k:
            raise InputError(f"linear_num_value_heads={n_v} must be a multiple of linear_num_key_heads={n_k}")
        self.n_k, self.n_v, self.d_k, self.d_v = n_k, n_v, d_k, d_v
        self.conv_dim = 2 * n_k * d_k + n_v * d_v
        self.in_proj_qkvz = nn.Linear(d_model, 2 * n_k * d_k + 2 * n_v * d_v, bias=False)
        self.in_proj_ba = nn.Linear(d_model, 2 * n_v, bias=False)
        self.conv_weight = nn.Parameter(torch.zeros(self.conv_dim, 1, d_conv))
        self.dt_bias = nn.Parameter(torch.ones(n_v))
        self.A_log = nn.Parameter(torch.zeros(n_v))
        self.norm = GatedHeadNorm(d_v, eps)
        self.out_proj = nn.Linear(n_v * d_v, d_model, bias=False)
        for name in ("conv_in", "conv_out", "q", "k", "v", "gate", "beta", "g", "y", "head_out", "state"):
            setattr(self, f"hook_{name}", HookPoint())

    def _split(self, u: Tensor) -> tuple[Tensor, ...]:
        """HF's per-key-head grouping of the two projections -> ``q, k, v, z, b, a``."""
        b, L, _ = u.shape
        r, dk, dv = self.n_v // self.n_k, self.d_k, self.d_v
        qkvz = self.in_proj_qkvz(u).view(b, L, self.n_k, 2 * dk + 2 * r * dv)
        q, k, v, z = qkvz.split([dk, dk, r * dv, r * dv], dim=-1)
        ba = self.in_proj_ba(u).view(b, L, self.n_k, 2 * r)
        bb, a = ba.split([r, r], dim=-1)
        return (q.reshape(b, L, -1), k.reshape(b, L, -1), v.reshape(b, L, -1), z.reshape(b, L, self.n_v, dv),
                bb.reshape(b, L, self.n_v), a.reshape(b, L, self.n_v))

    def forward(self, u: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        b, L, _ = u.shape
        q, k, v, z, bb, a = self._split(u)
        qkv = self.hook_conv_in(torch.cat([q, k, v], dim=-1))
        qkv = F.silu(self.hook_conv_out(causal_conv(qkv, self.conv_weight, None).to(u.dtype)))
        q, k, v = qkv.split([self.n_k * self.d_k, self.n_k * self.d_k, self.n_v * self.d_v], dim=-1)
        q = self.hook_q(q.reshape(b, L, self.n_k, self.d_k))
        k = self.hook_k(k.reshape(b, L, self.n_k, self.d_k))
        v = self.hook_v(v.reshape(b, L, self.n_v, self.d_v))
        z = self.hook_gate(z)
        beta = self.hook_beta(bb.sigmoid())
        g = self.hook_g(-self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias))
        qn, kn = prepare_qk(q, k, self.n_v)
        if self.scan_impl not in _IMPLS:
            raise InputError(f"scan_impl must be one of {_IMPLS}, got {self.scan_impl!r}")
        if self.scan_impl == "sequential":
            _, states = delta_rule_ref(qn, kn, v, g, beta, return_states=True)
            states = self.hook_state(states)
            o = torch.einsum("bthvk,bthk->bthv", states, qn)
        else:  # no fused kernel here: "auto" and "kernel" run the chunked rule
            o = delta_rule_chunked(qn, kn, v, g, beta)
        o = self.hook_y(o.to(u.dtype))
        heads = self.hook_head_out(self.norm(o, z))
        return self.out_proj(heads.reshape(b, L, self.n_v * self.d_v))

    def masked_output(self, y: Float[Tensor, "batch pos head d_v"], acts: dict[str, Tensor], heads: list[int],
                      masks: Float[Tensor, "batch n_heads query key"], max_bytes: int) -> Tensor:
        """``hook_y`` with value heads ``heads`` reading through ``masks``: ``o_h = (α_h ⊙ M_h) @ v_h``.

        Computed as ``o_h - (α_h ⊙ (1 - M_h)) @ v_h`` (``o_h = α_h @ v_h`` exactly), so an all-ones mask returns
        ``hook_y`` bit for bit; α is the full implied attention (float64 solve per head, O(L³))."""
        from gather_aggregate.adapters.delta_rule import delta_implied_attention

        q, k, v, g, beta = (acts[n] for n in self.mask_inputs)
        qn, kn = prepare_qk(q, k, self.n_v)
        alpha = delta_implied_attention(qn, kn, g, beta, heads=heads, max_bytes=max_bytes)
        cut = torch.einsum("bkts,bskd->btkd", alpha * (1.0 - masks), v[:, :, heads].float())
        out = y.clone()
        out[:, :, heads] = y[:, :, heads] - cut.to(y.dtype)
        return out


def masked_delta_rule_ref(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                          masks: Float[Tensor, "batch head query key"]) -> Float[Tensor, "batch pos head d_v"]:
    """The oracle of masking: ``o_t = Σ_{s≤t} M[t, s] · α[t, s] v_s`` with ``α[t, s] = β_s k_sᵀ M_{s+1} ⋯ M_t q_t``
    walked back from each query one step at a time (:func:`~.delta_rule.delta_implied_reference`), every head
    masked; ``q, k`` prepared as for :func:`~.delta_rule.delta_rule_ref`."""
    from gather_aggregate.adapters.delta_rule import delta_implied_reference

    alpha = delta_implied_reference(q, k, g, beta).double() * masks.double()
    return torch.einsum("bhts,bshd->bthd", alpha, v.double()).float()


__all__ = ["GatedDeltaNetMixer", "GatedHeadNorm", "masked_delta_rule_ref"]
