"""The gated delta rule (gated DeltaNet, Qwen3-Next's linear attention): scans and implied attention.

Per value head ``h`` with unit-norm key ``k_t``, query ``q_t`` (l2-normalised, times ``d_k^-½``),
value ``v_t``, write strength ``β_t ∈ (0, 1)`` and log decay ``g_t ≤ 0`` (``a_t = exp(g_t)``), the state
``S_t ∈ R^{d_v × d_k}`` follows::

    S_t = a_t S_{t-1} (I - β_t k_t k_tᵀ) + β_t v_t k_tᵀ            o_t = S_t q_t

Unrolled, ``o_t = Σ_{s≤t} α[t, s] v_s`` with the **implied attention**
(``M_r = a_r (I - β_r k_r k_rᵀ)``, a symmetric matrix)::

    α[t, s] = β_s k_sᵀ M_{s+1} M_{s+2} ⋯ M_t q_t                   (s ≤ t; 0 above the diagonal)

the scalar weight token ``s``'s value gets in query ``t``'s output.  The gates are scalars, so they
factor out: ``α[t, s] = exp(G_t - G_s) · α̃[t, s]`` with ``G_t = Σ_{k≤t} g_k`` and ``α̃`` the ungated
rule's matrix, which the pseudo-values ``u = T v`` of the delta rule give in closed form::

    α̃ = tril(Q Kᵀ) · T,      T = (I + diag(β) · strict_tril(K Kᵀ))⁻¹ · diag(β)

(``u_t = β_t (v_t - S̃_{t-1} k_t)`` and ``S̃_t = Σ_{s≤t} u_s k_sᵀ``).  The fast path solves that unit
lower-triangular system; decays are ``exp`` of differences of a float64 cumulative sum, never ratios
of exponentials.  :func:`delta_implied_reference` is the oracle: it walks ``M_r`` backwards from each
query, one step at a time.  Unlike TransformerLens 4.3's ``compute_effective_attention`` for gated
DeltaNet (which drops the key-removal term ``- β k kᵀ`` and uses the un-normalised q/k), ``α``
reconstructs the layer's output exactly: ``o = α @ v``.

Key/query heads are shared by ``n_v / n_k`` consecutive value heads (``h // (n_v / n_k)``), as in HF.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from gather_aggregate.core.errors import InputError, MemoryBudgetError


def l2norm(x: Tensor, eps: float = 1e-6) -> Tensor:
    """``x / sqrt(Σ x² + eps)`` on the last axis (the FLA / HF convention)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def prepare_qk(q: Tensor, k: Tensor, n_v_heads: int) -> tuple[Tensor, Tensor]:
    """Hooked ``q, k`` ``[b, L, n_k, d_k]`` -> the rule's ``q, k`` ``[b, L, n_v, d_k]`` in fp32:
    l2-normalised, ``q`` scaled by ``d_k^-½``, each key head repeated for its value heads."""
    rep = n_v_heads // q.shape[2]
    qn = l2norm(q.float()) * q.shape[-1] ** -0.5
    kn = l2norm(k.float())
    return qn.repeat_interleave(rep, 2), kn.repeat_interleave(rep, 2)


# ============================================================================ scans
def delta_rule_ref(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *,
                   return_states: bool = False) -> tuple[Tensor, Tensor | None]:
    """The recurrence one step at a time (the oracle).  ``q, k [b, L, H, d_k]`` (prepared), ``v [b, L, H, d_v]``,
    ``g, beta [b, L, H]`` -> ``o [b, L, H, d_v]`` and optionally the states ``[b, L, H, d_v, d_k]``."""
    b, L, H, dk = k.shape
    S = v.new_zeros(b, H, v.shape[-1], dk, dtype=torch.float32)
    outs, states = [], []
    for t in range(L):
        kt, bt = k[:, t], beta[:, t].float()[..., None]
        S = torch.exp(g[:, t].float())[..., None, None] * S
        S = S + ((v[:, t].float() - torch.einsum("bhvk,bhk->bhv", S, kt)) * bt)[..., None] * kt[:, :, None, :]
        outs.append(torch.einsum("bhvk,bhk->bhv", S, q[:, t]))
        if return_states:
            states.append(S)
    return torch.stack(outs, 1), (torch.stack(states, 1) if return_states else None)


def delta_rule_chunked(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, chunk: int = 64) -> Tensor:
    """The same outputs, chunk by chunk (no loop over time steps inside a chunk).

    In a chunk with start state ``S₀`` and local log-decay sums ``Γ``, the pseudo-values solve
    ``(I + A) U = diag(β) V - diag(β e^Γ) K S₀ᵀ`` with ``A[i, j] = β_i e^{Γ_i-Γ_j} k_i·k_j`` (``j < i``); then
    ``O = (Q Kᵀ ∘ e^{Γ_i-Γ_j})_{j≤i} U + diag(e^Γ) Q S₀ᵀ`` and ``S_C = Σ_j e^{Γ_C-Γ_j} u_j k_jᵀ + e^{Γ_C} S₀``.
    Every exponent is ≤ 0.
    """
    b, L, H, dk = k.shape
    dv = v.shape[-1]
    T = min(chunk, L)
    pad = (-L) % T
    f = [t.float().transpose(1, 2) for t in (q, k, v)]  # [b, H, L, d]
    gb = [t.float().transpose(1, 2) for t in (g, beta)]  # [b, H, L]
    if pad:  # g = 0, β = 0 on the padding: no decay and no write, so real positions are untouched
        f = [torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in f]
        gb = [torch.nn.functional.pad(t, (0, pad)) for t in gb]
    qc, kc, vc = (t.reshape(b, H, -1, T, t.shape[-1]) for t in f)
    gc, bc = (t.reshape(b, H, -1, T) for t in gb)
    Gam = torch.cumsum(gc.double(), -1)  # [b, H, c, T]
    diff = Gam[..., :, None] - Gam[..., None, :]
    tri = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    dec = torch.exp(diff.masked_fill(~tri, float("-inf"))).float()  # e^{Γ_i-Γ_j}, j ≤ i
    eG = torch.exp(Gam).float()
    strict = dec.tril(-1) * bc[..., :, None] * (kc @ kc.transpose(-1, -2))
    eye = torch.eye(T, device=q.device)
    Tinv = torch.linalg.solve_triangular(eye + strict, eye.expand_as(strict), upper=False, unitriangular=True)
    qk = (qc @ kc.transpose(-1, -2)) * dec
    S = q.new_zeros(b, H, dv, dk, dtype=torch.float32)
    outs = []
    for c in range(qc.shape[2]):
        rhs = bc[:, :, c, :, None] * vc[:, :, c] - (bc[:, :, c] * eG[:, :, c])[..., None] * (kc[:, :, c] @ S.transpose(-1, -2))
        U = Tinv[:, :, c] @ rhs  # [b, H, T, dv]
        outs.append(qk[:, :, c] @ U + eG[:, :, c, :, None] * (qc[:, :, c] @ S.transpose(-1, -2)))
        w = dec[:, :, c, -1]  # e^{Γ_C - Γ_j}
        S = eG[:, :, c, -1, None, None] * S + (U * w[..., None]).transpose(-1, -2) @ kc[:, :, c]
    out = torch.stack(outs, 2).reshape(b, H, -1, dv)[:, :, :L]
    return out.transpose(1, 2)


# ============================================================================ implied attention
def delta_implied_reference(q: Tensor, k: Tensor, g: Tensor, beta: Tensor) -> Float[Tensor, "batch head query key"]:
    """``α[t, s] = β_s k_sᵀ M_{s+1} ⋯ M_t q_t`` by walking back from every query (slow; the oracle).
    Inputs prepared as for :func:`delta_rule_ref`."""
    b, L, H, _ = k.shape
    kf, qf, gf, bf = k.double(), q.double(), g.double(), beta.double()
    out = torch.zeros(b, H, L, L, dtype=torch.float64, device=q.device)
    for t in range(L):
        u = qf[:, t]  # [b, H, d_k] = M_{s+1} ⋯ M_t q_t, for s = t first
        for s in range(t, -1, -1):
            ks = kf[:, s]
            proj = (ks * u).sum(-1)
            out[:, :, t, s] = bf[:, s] * proj
            u = torch.exp(gf[:, s])[..., None] * (u - (bf[:, s] * proj)[..., None] * ks)
    return out.float()


def delta_implied_bytes(batch: int, L: int, n_heads: int, n_rows: int | None) -> int:
    """Bytes :func:`delta_implied_attention` needs: the output plus float64 ``L × L`` work per head."""
    Q = L if n_rows is None else n_rows
    return 4 * batch * n_heads * Q * L + 8 * batch * (2 * L * L + 3 * Q * L)


def delta_implied_attention(
    q: Float[Tensor, "batch pos head d_k"],
    k: Float[Tensor, "batch pos head d_k"],
    g: Float[Tensor, "batch pos head"],
    beta: Float[Tensor, "batch pos head"],
    *,
    heads: int | Sequence[int] | None = None,
    rows: Int[Tensor, "batch n_rows"] | None = None,
    max_bytes: int = 2 * 1024**3,
) -> Float[Tensor, "batch head query key"]:
    """Implied attention of gated-DeltaNet heads, ``α = exp(segsum g) ∘ (tril(Q Kᵀ) T)`` (module docstring).

    ``q, k`` are the *prepared* queries and keys (:func:`prepare_qk`: normalised, one per value head).
    ``rows`` restricts the query axis (``[batch, n_rows]`` positions): those rows are then walked back from
    their queries (the oracle's recursion, vectorised over rows and heads), O(rows · L · d_k) per head with
    no ``L × L`` matrix.  Full matrices solve the system head by head in float64, O(L³) per head.
    """
    if q.dim() != 4 or k.shape != q.shape or g.shape != q.shape[:3] or beta.shape != g.shape:
        raise InputError(f"q, k must be [batch, pos, head, d_k] and g, beta [batch, pos, head]; got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(g.shape)}, {tuple(beta.shape)}")
    b, L, H, _ = q.shape
    hs = list(range(H)) if heads is None else ([heads] if isinstance(heads, int) else [int(h) for h in heads])
    Q = L if rows is None else rows.shape[1]
    need = delta_implied_bytes(b, L, len(hs), None if rows is None else Q)
    if need > max_bytes:
        raise MemoryBudgetError(
            f"gated-DeltaNet implied attention ({b} x {len(hs)} heads x {Q} x {L}) needs about {need / 2**30:.2f} "
            f"GiB, over the budget of {max_bytes / 2**30:.2f} GiB; ask for rows=[-1] (the final query), fewer "
            "heads or a shorter prompt, or raise max_bytes= (model.max_pattern_bytes)")
    if rows is not None:
        return _rows_by_walk(q, k, g, beta, hs, rows)
    out = q.new_zeros(b, len(hs), Q, L, dtype=torch.float32)
    pos = torch.arange(L, device=q.device)
    tq = pos[None].expand(b, L) if rows is None else rows  # [b, Q]
    causal = tq[:, :, None] >= pos[None, None, :]  # [b, Q, L]
    eye = torch.eye(L, dtype=torch.float64, device=q.device)
    for i, h in enumerate(hs):
        kh, qh = k[:, :, h].double(), q[:, :, h].double()  # [b, L, d_k]
        bh = beta[:, :, h].double()
        M = eye + (bh[:, :, None] * (kh @ kh.transpose(1, 2))).tril(-1)  # I + diag(β) strict_tril(K Kᵀ)
        qr = qh if rows is None else qh.gather(1, rows[:, :, None].expand(-1, -1, qh.shape[-1]))
        QK = (qr @ kh.transpose(1, 2)).masked_fill(~causal, 0.0)  # [b, Q, L]
        # α̃ = QK M⁻¹ diag(β): solve Mᵀ Yᵀ = QKᵀ (upper triangular, unit diagonal)
        Y = torch.linalg.solve_triangular(M.transpose(1, 2), QK.transpose(1, 2), upper=True,
                                          unitriangular=True).transpose(1, 2)
        G = torch.cumsum(g[:, :, h].double(), 1)  # [b, L]
        Gq = G.gather(1, tq)
        seg = (Gq[:, :, None] - G[:, None, :]).masked_fill(~causal, float("-inf"))
        out[:, i] = (Y * bh[:, None, :] * torch.exp(seg)).float()
    return out


def _rows_by_walk(q: Tensor, k: Tensor, g: Tensor, beta: Tensor, heads: list[int], rows: Tensor) -> Tensor:
    """``α`` at a few query rows by the backward walk of the definition, all rows and heads at once (float64):
    ``u ← q_t`` when ``s`` reaches the row's ``t``, ``α[t, s] = β_s k_s·u``, then ``u ← a_s (u - β_s k_s (k_s·u))``.
    O(rows · L · d_k) per head, no L × L work."""
    b, L = q.shape[:2]
    h = torch.tensor(heads, device=q.device)
    kf, qf = k[:, :, h].double(), q[:, :, h].double()  # [b, L, H', d_k]
    bf, af = beta[:, :, h].double(), torch.exp(g[:, :, h].double())  # [b, L, H']
    R = rows.shape[1]
    U = kf.new_zeros(b, len(heads), R, kf.shape[-1])
    out = kf.new_zeros(b, len(heads), R, L)
    for s in range(int(rows.max()), -1, -1):
        start = (rows == s)[:, None, :, None]  # rows whose query is s begin here (no bool(): a GPU sync per step)
        U = torch.where(start, qf[:, s, :, None, :], U)
        ks = kf[:, s, :, None, :]  # [b, H', 1, d_k]
        proj = (U * ks).sum(-1)  # [b, H', R]
        out[..., s] = bf[:, s, :, None] * proj
        U = af[:, s, :, None, None] * (U - (bf[:, s, :, None] * proj)[..., None] * ks)
    return out.float()


__all__ = ["l2norm", "prepare_qk", "delta_rule_ref", "delta_rule_chunked", "delta_implied_reference",
           "delta_implied_attention", "delta_implied_bytes"]
