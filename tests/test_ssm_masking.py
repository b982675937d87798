"""Masked heads (the paper's masking experiment) for SSM heads and attention heads."""

from __future__ import annotations

import pytest
import torch

from gather_aggregate.adapters import load_ssm
from gather_aggregate.adapters.implied import mamba1_implied_reference, mamba2_implied_reference
from gather_aggregate.adapters.masking import mask_heads
from gather_aggregate.core.errors import IndexOutOfRangeError, InputError
from gather_aggregate.core.protocol import count_hooks, param_checksum
from gather_aggregate.testing.tiny_ssm import tiny_hf_ssm

CASES = [("mamba", {}), ("mamba", {"head_size": 4}), ("falcon_mamba", {}), ("mamba2", {})]



def toks(b=2, L=18, seed=0):
    return torch.randint(0, 97, (b, L), generator=torch.Generator().manual_seed(seed))


def segment_mask(b, L, spans):
    """Each query may read only the keys of its example's segment (plus itself)."""
    m = torch.zeros(b, L, L)
    for i, (lo, hi) in enumerate(spans):
        m[i, :, lo:hi] = 1.0
    m += torch.eye(L)
    return m.clamp(max=1.0)


@pytest.mark.parametrize("model_type,kw", CASES)
def test_all_ones_mask_reproduces_the_forward_exactly(model_type, kw):
    m = load_ssm(tiny_hf_ssm(model_type, seed=3, stress=True), **kw)
    t = toks()
    clean = m(t)
    with mask_heads(m, [(0, 1), (1, 0), (1, 2)], torch.ones(2, 18, 18)):
        masked = m(t)
    assert torch.equal(masked, clean)
    assert count_hooks(m) == 0


@pytest.mark.parametrize("model_type,kw", CASES)
def test_segment_mask_changes_only_the_masked_heads(model_type, kw):
    m = load_ssm(tiny_hf_ssm(model_type, seed=5, stress=True), **kw)
    before = param_checksum(m)
    t = toks()
    b, L = t.shape
    mask = segment_mask(b, L, [(3, 8), (10, 15)])
    heads = [(1, 0), (1, 3)]
    _, clean = m.run_with_cache(t)
    with mask_heads(m, heads, mask):
        _, masked = m.run_with_cache(t)
    assert param_checksum(m) == before and count_hooks(m) == 0
    d = m.cfg.d_head
    y0, y1 = clean["blocks.1.ssm.hook_y"], masked["blocks.1.ssm.hook_y"]
    changed = torch.zeros(m.cfg.d_inner, dtype=torch.bool)
    for _, h in heads:
        changed[h * d:(h + 1) * d] = True
    assert torch.equal(y1[..., ~changed], y0[..., ~changed])  # other heads untouched
    assert not torch.allclose(y1[..., changed], y0[..., changed])
    torch.testing.assert_close(masked["blocks.0.hook_resid_post"], clean["blocks.0.hook_resid_post"], rtol=0, atol=0)

    # the masked heads equal the brute-force (α ⊙ M) @ x + D ∘ x
    p = m.ssm_layer_params(1)
    x = clean["blocks.1.ssm.hook_x"]
    dt, B, C = (clean[f"blocks.1.ssm.hook_{n}"] for n in ("dt", "B", "C"))
    if p.family == "mamba1":
        alpha = mamba1_implied_reference(dt, p.A, B, C)  # [b, d_inner, L, L]
        want = torch.einsum("bdts,bsd->btd", alpha * mask[:, None], x) + x * p.D
    else:
        alpha = mamba2_implied_reference(dt, p.A, B, C)
        xh = x.view(b, L, p.n_heads, d)
        want = (torch.einsum("bhts,bshp->bthp", alpha * mask[:, None], xh) + xh * p.D[:, None]).reshape(b, L, -1)
    torch.testing.assert_close(y1[..., changed], want[..., changed], rtol=1e-5, atol=1e-5)


def test_zero_mask_leaves_only_the_skip_term_and_per_head_masks():
    m = load_ssm(tiny_hf_ssm("mamba2", seed=1, stress=True))
    t = toks()
    ones, zeros = torch.ones(2, 18, 18), torch.zeros(2, 18, 18)
    with mask_heads(m, [(0, 2), (0, 5)], torch.stack([zeros, ones], 1)):
        _, c = m.run_with_cache(t)
    P = m.cfg.d_head
    x = c["blocks.0.ssm.hook_x"]
    D = m.ssm_layer_params(0).D
    torch.testing.assert_close(c["blocks.0.ssm.hook_y"][..., 2 * P:3 * P], x[..., 2 * P:3 * P] * D[2], rtol=1e-5,
                               atol=1e-6)
    _, clean = m.run_with_cache(t)
    assert torch.equal(c["blocks.0.ssm.hook_y"][..., 5 * P:6 * P], clean["blocks.0.ssm.hook_y"][..., 5 * P:6 * P])


def test_mask_gradients_flow():
    m = load_ssm(tiny_hf_ssm("mamba", seed=2))
    mask = torch.full((1, 10, 10), 0.5, requires_grad=True)
    with mask_heads(m, [(0, 3)], mask):
        m(toks(1, 10)).sum().backward()
    assert mask.grad is not None and torch.isfinite(mask.grad).all() and mask.grad.abs().sum() > 0
    assert m.blocks[0].ssm.A_log.grad is not None and m.blocks[0].ssm.A_log.grad.abs().sum() > 0


def test_bad_masks():
    m = load_ssm(tiny_hf_ssm("mamba", seed=0))
    t = toks()
    with pytest.raises(InputError, match=r"\[0, 1\]"):
        with mask_heads(m, [(0, 0)], torch.full((2, 18, 18), 1.5)):
            pass
    with pytest.raises(InputError, match="one per listed head"):
        with mask_heads(m, [(0, 0), (0, 1)], torch.ones(2, 3, 18, 18)):
            pass
    with pytest.raises(InputError, match="square"):
        with mask_heads(m, [(0, 0)], torch.ones(2, 18, 17)):
            pass
    with pytest.raises(InputError, match="torch.Tensor"):
        with mask_heads(m, [(0, 0)], [[1.0]]):
            pass
    with pytest.raises(IndexOutOfRangeError):
        with mask_heads(m, [(0, 999)], torch.ones(2, 18, 18)):
            pass
    with pytest.raises(InputError, match="build the mask from the same tokens"):
        with mask_heads(m, [(1, 0)], torch.ones(2, 5, 5)):
            m(t)
    assert count_hooks(m) == 0  # removed although the forward raised
    with mask_heads(m, [(1, 0)], torch.ones(2, 18, 18, dtype=torch.bool)):  # bool masks are fine
        assert torch.equal(m(t), m.__class__.forward(m, t))


# ------------------------------------------------------------------ attention heads (same API)
@pytest.fixture(scope="module")
def bridge_model():
    from gather_aggregate.models.bridge import BridgeModel
    from gather_aggregate.testing.tiny_models import tiny_llama

    hf, tok = tiny_llama()
    return BridgeModel.from_hf(hf, tok)


def test_attention_heads_masking(bridge_model):
    m = bridge_model
    t = torch.randint(0, m.d_vocab, (2, 12), generator=torch.Generator().manual_seed(0))
    clean, cache = m.run_with_cache(t)
    with mask_heads(m, [(1, 2)], torch.ones(2, 12, 12)):
        assert torch.equal(m(t), clean)
    keep = torch.zeros(2, 12, 12)
    keep[:, :, 2:5] = 1
    with mask_heads(m, [(1, 2)], keep):
        _, masked = m.run_with_cache(t)
    pat0, pat1 = cache["blocks.1.attn.hook_pattern"], masked["blocks.1.attn.hook_pattern"]
    torch.testing.assert_close(pat1[:, 2], pat0[:, 2] * keep)  # not renormalised
    others = [h for h in range(pat0.shape[1]) if h != 2]
    torch.testing.assert_close(pat1[:, others], pat0[:, others])
    assert not torch.allclose(masked["blocks.1.attn.hook_z"][:, :, 2], cache["blocks.1.attn.hook_z"][:, :, 2])
    assert count_hooks(m) == 0


def test_gated_deltanet_heads_are_masked_as_the_sequential_oracle_says():
    """Qwen3-Next's value heads: all-ones reproduces the forward bit for bit; a segment mask gives the masked
    heads ``Σ_s M[t, s] α[t, s] v_s`` with α walked back step by step (the oracle), leaves the others alone, and
    the logits equal a forward whose ``hook_y`` holds the oracle's output."""
    from gather_aggregate import from_hf_model
    from gather_aggregate.adapters.delta_rule import prepare_qk
    from gather_aggregate.adapters.gated_deltanet import masked_delta_rule_ref
    from gather_aggregate.testing.tiny_families import tiny_hf_qwen3_next

    m = from_hf_model(tiny_hf_qwen3_next(2, linear_num_value_heads=4, linear_num_key_heads=2))
    before = param_checksum(m)
    t = toks(L=14)
    b, L = t.shape
    clean_logits, clean = m.run_with_cache(t)
    heads = [(0, 1), (2, 0), (2, 3)]
    with mask_heads(m, heads, torch.ones(b, L, L)):
        assert torch.equal(m(t), clean_logits)
    mask = segment_mask(b, L, [(2, 6), (5, 11)])
    with mask_heads(m, heads, mask):
        logits, masked = m.run_with_cache(t)
    assert param_checksum(m) == before and count_hooks(m) == 0
    assert (logits - clean_logits).abs().max() > 1e-3
    oracle_y = {}
    for layer, hs in ((0, [1]), (2, [0, 3])):  # inputs from the masked run: layer 2 reads masked layer 0
        q, k, v, g, beta = (masked[f"blocks.{layer}.ssm.hook_{n}"] for n in ("q", "k", "v", "g", "beta"))
        qn, kn = prepare_qk(q, k, m.cfg.n_heads)
        keep = torch.isin(torch.arange(m.cfg.n_heads), torch.tensor(hs))[None, :, None, None]
        want = masked_delta_rule_ref(qn, kn, v, g, beta, torch.where(keep, mask[:, None], torch.ones(b, 1, L, L)))
        torch.testing.assert_close(masked[f"blocks.{layer}.ssm.hook_y"], want, rtol=1e-5, atol=1e-5)
        oracle_y[layer] = want
    others = [h for h in range(m.cfg.n_heads) if h != 1]
    assert torch.equal(masked["blocks.0.ssm.hook_y"][:, :, others], clean["blocks.0.ssm.hook_y"][:, :, others])
    assert (masked["blocks.0.ssm.hook_y"][:, :, 1] - clean["blocks.0.ssm.hook_y"][:, :, 1]).abs().max() > 1e-2

    def put(layer):
        return lambda y, hook: oracle_y[layer].to(y.dtype)

    rebuilt = m.run_with_hooks(t, fwd_hooks=[(f"blocks.{L_}.ssm.hook_y", put(L_)) for L_ in oracle_y])
    torch.testing.assert_close(logits, rebuilt, rtol=1e-4, atol=1e-4)
