"""The Mamba-1 fast paths of implied_mamba1_blocks against the float64 formula (their oracle)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gather_aggregate.adapters.implied_mamba1_blocks as blocks
from gather_aggregate.adapters.implied import mamba1_implied_attention, mamba1_implied_reference
from gather_aggregate.adapters.implied_common import mapped_zeros

REL = 1e-5


def rel(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def within_fp32(out, want, mag):
    """The float32 error bound of a sum: at most REL of its largest term's size.  Each entry is a sum over the
    state index n of C_t[n] B_s[n] x decay, so ``mag`` is the formula with |B| and |C|: cancellation can make an
    entry (and its relative error) far smaller than its terms, as hypothesis found with n = 5 terms of size ~1
    summing to -0.0014."""
    return float((out - want).abs().max()) <= REL * float(mag.abs().max())


def inputs(b, L, d, n, dt_scale, seed):
    g = torch.Generator().manual_seed(seed)
    dt = torch.nn.functional.softplus(torch.randn(b, L, d, generator=g)) * dt_scale
    A = -torch.exp(torch.empty(d, n).uniform_(-2, 2, generator=g))
    return dt, A, torch.randn(b, L, n, generator=g), torch.randn(b, L, n, generator=g)


@settings(max_examples=40, deadline=None)
@given(b=st.integers(1, 2), L=st.integers(1, 300), d=st.integers(1, 6), n=st.integers(1, 5),
       dt_scale=st.sampled_from([0.01, 1.0, 30.0]), scaling=st.booleans(), zeroed=st.booleans(),
       seed=st.integers(0, 999))
def test_full_per_channel_equals_reference(b, L, d, n, dt_scale, scaling, zeroed, seed):
    """Every level of the block hierarchy (L up to 300: four levels, partial blocks at each, leaves of 16 rows and
    fewer) matches the formula, zeros above the diagonal included, with decays from negligible to far below the
    exp(-35) factor floor; into an output of NaNs every entry must be written, into a zeroed one (``zeroed``)
    those above the diagonal are left as they are."""
    dt, A, B, C = inputs(b, L, d, n, dt_scale, seed)
    ref = mamba1_implied_reference(dt, A, B, C, dt_scaling=scaling)
    out = torch.zeros(b, d, L, L) if zeroed else torch.full((b, d, L, L), float("nan"))
    blocks.full_per_channel(dt, dt if scaling else torch.ones_like(dt), A, B, C, out, zeroed=zeroed)
    assert within_fp32(out, ref, mamba1_implied_reference(dt, A, B.abs(), C.abs(), dt_scaling=scaling))
    assert torch.equal(out.triu(1), torch.zeros_like(out))


@pytest.mark.parametrize("dt_scale", [1e-3, 1.0, 30.0])
def test_full_per_channel_long_prompt_into_mapped_zeros(dt_scale):
    """A long odd prompt (L = 601: blocks of 256, 64, 16 and 4 with partial ones at every level), two prompts,
    into a zero-mapped output (as mamba1_implied_attention allocates it): tiny Δ (nothing decays), unit
    Δ and large Δ (decays underflow within a few keys, factors floored) all match the formula."""
    dt, A, B, C = inputs(2, 601, 2, 3, dt_scale, 7)
    out = mapped_zeros((2, 2, 601, 601), dt.device)
    assert out.untyped_storage().nbytes() >= 2 * 2 * 601 * 601 * 4 and not bool(out.any())
    blocks.full_per_channel(dt, dt, A, B, C, out, zeroed=True)
    ref = mamba1_implied_reference(dt, A, B, C)
    assert within_fp32(out, ref, mamba1_implied_reference(dt, A, B.abs(), C.abs()))
    assert rel(out, ref) <= REL and torch.equal(out.triu(1), torch.zeros_like(out))


def test_full_per_channel_factors_stay_normal_floats():
    """With large Δ most decays of the off-diagonal blocks are far below fp32's range: their factors are floored
    at exp(-35), so every entry is 0 or a normal float (subnormal matmul operands or results run ~50x slower),
    and each differs from the formula by less than exp(-35) times its Σ_n |C B| Δ."""
    dt, A, B, C = inputs(1, 300, 3, 4, 30.0, 3)
    out = torch.zeros(1, 3, 300, 300)
    blocks.full_per_channel(dt, dt, A, B, C, out, zeroed=True)
    tiny = (out != 0) & (out.abs() < torch.finfo(torch.float32).tiny)
    assert not bool(tiny.any())
    ref = mamba1_implied_reference(dt.double(), A.double(), B.double(), C.double())
    mag = mamba1_implied_reference(dt.double(), A.double(), B.double().abs(), C.double().abs())
    undecayed = (C[0].abs() @ B[0].abs().T).double()[None, None] * dt.double().transpose(1, 2)[:, :, None]
    assert bool(((out.double() - ref).abs() <= 1.0001 * math.exp(-35) * undecayed + REL * mag).all())


@pytest.mark.parametrize("L", [1, 2, 15, 16, 17, 65, 257])
def test_public_full_per_channel_at_block_edges(L):
    """mamba1_implied_attention's per-channel matrix (the zeroed output path) at lengths on and around the block
    edges (one row; a leaf and a leaf plus one row; a level's blocks plus one), two prompts, against the formula."""
    dt, A, B, C = inputs(2, L, 3, 4, 1.0, L)
    got = mamba1_implied_attention(dt, A, B, C)
    ref = mamba1_implied_reference(dt, A, B, C)
    assert within_fp32(got, ref, mamba1_implied_reference(dt, A, B.abs(), C.abs()))
    assert torch.equal(got.triu(1), torch.zeros_like(got))


def test_mapped_zeros():
    """Large CPU outputs come from an anonymous zero mapping (writable, freed with the tensor), small ones
    and other devices from torch.zeros; both are float32 zeros of the shape asked for."""
    for shape in [(3, 1024, 1024), (2, 3)]:
        z = mapped_zeros(shape, torch.device("cpu"))
        assert z.shape == shape and z.dtype == torch.float32 and z.is_contiguous() and not bool(z.any())
        z.view(-1)[-1] = 5.0
        assert float(z.sum()) == 5.0


def test_full_per_channel_into_a_channel_slice():
    """Writing into a strided channel slice of a larger output leaves the other channels alone."""
    dt, A, B, C = inputs(1, 70, 6, 3, 1.0, 0)
    out = torch.full((1, 9, 70, 70), 7.0)
    blocks.full_per_channel(dt[:, :, 2:5], dt[:, :, 2:5], A[2:5], B, C, out[:, 3:6])
    assert rel(out[:, 3:6], mamba1_implied_reference(dt, A, B, C)[:, 2:5]) <= REL
    assert bool((out[:, :3] == 7).all()) and bool((out[:, 6:] == 7).all())


@pytest.fixture
def small_tiles(monkeypatch):
    """Tiles of 3 channels and chunks of 7 keys, so that tiny inputs cross every tile and chunk boundary
    (the same for every generated input: nothing else changes them)."""
    monkeypatch.setattr(blocks, "_ROW_CHANNELS", 3)
    monkeypatch.setattr(blocks, "_ROW_KEYS", 7)
    monkeypatch.setattr(blocks, "_GATHER_ROWS", 2)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(b=st.integers(1, 2), L=st.integers(1, 120), d=st.integers(1, 8), n=st.integers(1, 5),
       dt_scale=st.sampled_from([0.01, 1.0, 30.0]), scaling=st.booleans(), n_rows=st.integers(1, 3),
       seed=st.integers(0, 999))
def test_rows_per_channel_equals_reference(small_tiles, b, L, d, n, dt_scale, scaling, n_rows, seed):
    """Query rows (any positions, repeated ones too) match the formula; with dt_scale 30 most decays die
    (below exp(-87)) a few keys before the query, so whole tiles are skipped and written as zeros."""
    dt, A, B, C = inputs(b, L, d, n, dt_scale, seed)
    rows = torch.randint(0, L, (b, n_rows), generator=torch.Generator().manual_seed(seed))
    ref = mamba1_implied_reference(dt, A, B, C, dt_scaling=scaling)
    want = torch.stack([ref[i][:, rows[i]] for i in range(b)])  # [b, d, R, L]
    mag = mamba1_implied_reference(dt, A, B.abs(), C.abs(), dt_scaling=scaling)
    out = torch.full((b, d, n_rows, L), float("nan"))
    blocks.rows_per_channel(dt, scaling, A, B, C, rows, out)
    assert within_fp32(out, want, torch.stack([mag[i][:, rows[i]] for i in range(b)]))


def test_rows_skip_dead_tiles_exactly(small_tiles, monkeypatch):
    """Keys whose every decay is below exp(-87) cost no exps, and come out as exact zeros."""
    dt, A, B, C = inputs(1, 200, 6, 4, 1.0, 3)
    dt[:, :150] = 5.0  # |A| Δ ≥ 0.67 per step: after ~130 steps every decay is below exp(-87)
    A = -torch.rand(6, 4) - 0.5
    rows = torch.tensor([[199]])
    calls = []
    real_exp = torch.Tensor.exp_
    monkeypatch.setattr(torch.Tensor, "exp_", lambda self: calls.append(self.numel()) or real_exp(self))
    out = torch.empty(1, 6, 1, 200)
    blocks.rows_per_channel(dt, True, A, B, C, rows, out)
    monkeypatch.undo()
    want = mamba1_implied_reference(dt, A, B, C)[:, :, 199:]
    assert rel(out, want) <= REL
    assert sum(calls) < 0.5 * 6 * 4 * 200  # most (channel, n, key) decays were never computed
    assert bool((out[0, :, 0, :20] == 0).all())


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(L=st.integers(1, 150), d=st.integers(1, 10), n=st.integers(1, 6), seed=st.integers(0, 999),
       zero_rate=st.booleans())
def test_rows_with_mixed_decay_rates(small_tiles, L, d, n, seed, zero_rate):
    """Trained-like A (rates spread over three decades, not sorted across n, some exactly 0: never dead) and Δ
    mixing fast and slow channels: tiles die in the middle of the channel order, blocks are cut inside a
    chunk, and the decays left dead inside a block are floored, all as the formula says."""
    g = torch.Generator().manual_seed(seed)
    dt = torch.nn.functional.softplus(torch.randn(1, L, d, generator=g)) * torch.exp(torch.randn(d, generator=g) * 2)
    A = -torch.exp(torch.empty(d, n).uniform_(-3, 3, generator=g))
    if zero_rate:
        A[0, -1] = 0.0
    B, C = torch.randn(1, L, n, generator=g), torch.randn(1, L, n, generator=g)
    rows = torch.tensor([[L - 1, L // 2]])
    future = torch.arange(L) > rows[0, :, None]  # [2, L]: keys after the query (the reference's 0 · -inf there)
    ref = mamba1_implied_reference(dt, A, B, C)[:, :, rows[0]].masked_fill(future, 0.0)
    mag = mamba1_implied_reference(dt, A, B.abs(), C.abs())[:, :, rows[0]].masked_fill(future, 0.0)
    out = torch.full((1, d, 2, L), float("nan"))
    blocks.rows_per_channel(dt, True, A, B, C, rows, out)
    assert within_fp32(out, ref, mag)


def test_rows_cut_dead_keys_inside_a_chunk(monkeypatch):
    """Within a chunk, the keys where every decay of a state index has died cost no exps: with Δ = 1 and
    A = -1, exactly the 88 keys with gap ≤ 87 are computed out of 200 (one chunk of 1000 keys)."""
    monkeypatch.setattr(blocks, "_ROW_KEYS", 1000)
    dt, A = torch.ones(1, 200, 1), -torch.ones(1, 1)
    B, C = torch.randn(1, 200, 1), torch.randn(1, 200, 1)
    calls = []
    real_exp = torch.Tensor.exp_
    monkeypatch.setattr(torch.Tensor, "exp_", lambda self: calls.append(self.numel()) or real_exp(self))
    out = torch.empty(1, 1, 1, 200)
    blocks.rows_per_channel(dt, True, A, B, C, torch.tensor([[199]]), out)
    monkeypatch.undo()
    assert sum(calls) == 88
    want = mamba1_implied_reference(dt, A, B, C)[:, :, 199:]
    assert rel(out, want) <= REL and bool((out[0, 0, 0, :112] == 0).all())


def test_public_rows_path_for_long_prompts(monkeypatch):
    """mamba1_implied_attention routes query rows of long prompts (L ≥ ROWS_LONG) to the chunked path."""
    monkeypatch.setattr(blocks, "ROWS_LONG", 1)
    import gather_aggregate.adapters.implied_mamba1 as m1

    monkeypatch.setattr(m1, "ROWS_LONG", 1)
    dt, A, B, C = inputs(2, 50, 5, 3, 1.0, 1)
    rows = torch.tensor([[49, 10], [0, 30]])
    got = mamba1_implied_attention(dt, A, B, C, rows=rows, heads=[4, 1, 2])
    ref = mamba1_implied_reference(dt, A, B, C)[:, [4, 1, 2]]
    assert rel(got, torch.stack([ref[i][:, rows[i]] for i in range(2)])) <= REL
