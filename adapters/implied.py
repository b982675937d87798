"""SSM-implied attention: the matrix α with ``y = α @ x + D ∘ x`` for Mamba-1 and Mamba-2 layers.

Inputs are the hooked tensors of one layer (``hook_dt``, ``hook_B``, ``hook_C``)
and its ``A = -exp(A_log)``; outputs are ``[batch, head, query, key]``, raw and
signed (causal: zero above the diagonal).  ``model.pattern(..., normalize=True)``
gives the per-row normalised ``|α|`` that sharpness metrics use.

Mamba-2, head ``h`` (one scalar decay per head, ``B, C`` of the head's group)::

    α_h[t, s] = (C_t · B_s) · exp(Σ_{k=s+1..t} Δ_k[h] A_h) · Δ_s[h]                   (s ≤ t)

Mamba-1, channel ``d`` (the decay depends on the state index ``n``)::

    α_d[t, s] = Σ_n C_t[n] B_s[n] exp(A[d, n] (τ_t[d] - τ_s[d])) · Δ_s[d],   τ_t = Σ_{k≤t} Δ_k

``dt_scaling=False`` drops the trailing ``Δ_s`` (the "attention-like" form of
Ali et al.; then ``y = α @ (Δ ∘ x) + D ∘ x``).  With the default
``dt_scaling=True`` the matrix reconstructs ``y`` from the post-conv ``x``.

The formulas, their references (oracles) and fast paths live in
:mod:`.implied_mamba1` (with :mod:`.implied_mamba1_blocks`: the per-channel full
matrix and long prompts' query rows) and :mod:`.implied_mamba2`; this module
gathers them.

Decays are always ``exp`` of log-space differences of a float64 cumulative sum
(segsum), never ratios of exponentials, so they stay finite and accurate for
long prompts and large Δ·A.  The fast Mamba-1 path splits ``t ← s`` at block
boundaries: ``exp(A(τ_t-τ_s)) = exp(A(τ_t-τ_r)) · exp(A(τ_r-τ_e)) · exp(A(τ_e-τ_s))``
for block ends ``s ≤ e ≤ r ≤ t``; each factor is itself a decay in (0, 1], and
the sum over ``n`` (and, for a head of several channels with ``reduce="mean"`` or
``"sum"``, over its channels too) becomes one matmul per tile of key blocks.
A query-row request (``rows=``) costs O(rows · L · d_inner · d_state) and never
builds an L x L matrix.

Memory: every entry point estimates its bytes *before* allocating and raises
:class:`~gather_aggregate.core.errors.MemoryBudgetError` past ``max_bytes``, naming
cheaper requests (fewer rows, fewer heads, coarser channel groups, a shorter
prompt).  Mamba-1 channels are processed in chunks and reduced into their heads
on the fly, and temporaries are cache-sized tiles in reused buffers, so memory is
O(L² · heads + L · d_inner · d_state), not O(L² · d_inner · d_state).
``benchmarks/bench_implied_attention.py`` measures time and peak memory against
TransformerLens (``docs/benchmarks.md``).
"""

from __future__ import annotations

from gather_aggregate.adapters.implied_common import DEFAULT_MAX_BYTES, Reduce
from gather_aggregate.adapters.implied_mamba1 import (
    mamba1_implied_attention,
    mamba1_implied_bytes,
    mamba1_implied_reference,
)
from gather_aggregate.adapters.implied_mamba2 import (
    mamba2_implied_attention,
    mamba2_implied_bytes,
    mamba2_implied_reference,
)

__all__ = ["DEFAULT_MAX_BYTES", "Reduce", "mamba1_implied_attention", "mamba1_implied_bytes",
           "mamba1_implied_reference", "mamba2_implied_attention", "mamba2_implied_bytes", "mamba2_implied_reference"]
