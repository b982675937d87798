"""Exactness of the hooked Mamba-1 / FalconMamba / Mamba-2 models against the HF reference.

Random configs are drawn with hypothesis (50 per family in the default suite,
300 under ``-m slow``).  Each example right-pads a batch of prompts of
different lengths and checks that our logits at every real position equal the
HF model run on the unpadded prompt, to 1e-4 max abs diff in fp32.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gather_aggregate.adapters import load_ssm
from gather_aggregate.testing.tiny_ssm import hf_logits, tiny_hf_ssm

TOL = 1e-4
FAST = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def prompt_lengths(draw):
    """Mostly a batch of 1-3 short prompts (padded); one example in ten is a single long prompt (to 1024)."""
    if draw(st.integers(0, 9)) == 0:
        return [draw(st.sampled_from([97, 300, 1024]))]
    return draw(st.lists(st.integers(1, 24), min_size=1, max_size=3))


@st.composite
def mamba1_cases(draw, model_type: str):
    d_model = draw(st.sampled_from([8, 16, 24, 32]))
    overrides = dict(
        hidden_size=d_model,
        state_size=draw(st.integers(1, 16)),
        expand=draw(st.integers(1, 3)),
        conv_kernel=draw(st.integers(1, 5)),
        time_step_rank=draw(st.one_of(st.just("auto"), st.integers(1, 8))),
        tie_word_embeddings=draw(st.booleans()),
        num_hidden_layers=draw(st.integers(1, 2)),
        use_conv_bias=draw(st.booleans()),
        use_bias=draw(st.booleans()),
    )
    lens = draw(prompt_lengths())
    return overrides, lens, draw(st.booleans()), draw(st.integers(0, 2**16))


@st.composite
def mamba2_cases(draw):
    d_model = draw(st.sampled_from([8, 16, 32]))
    expand = draw(st.integers(1, 2))
    head_dim = draw(st.sampled_from([h for h in (2, 4, 8, 16) if (d_model * expand) % h == 0]))
    n_heads = d_model * expand // head_dim
    n_groups = draw(st.sampled_from([g for g in range(1, n_heads + 1) if n_heads % g == 0]))
    limit = draw(st.sampled_from([(0.0, float("inf")), (0.01, 0.5)]))
    overrides = dict(
        hidden_size=d_model, expand=expand, head_dim=head_dim, num_heads=n_heads, n_groups=n_groups,
        state_size=draw(st.integers(1, 32)), conv_kernel=draw(st.integers(1, 5)),
        chunk_size=draw(st.sampled_from([4, 16, 64, 256])), tie_word_embeddings=draw(st.booleans()),
        num_hidden_layers=draw(st.integers(1, 2)), time_step_limit=limit, use_bias=draw(st.booleans()),
    )
    lens = draw(prompt_lengths())
    return overrides, lens, draw(st.booleans()), draw(st.integers(0, 2**16))


def check_against_hf(model_type: str, overrides: dict, lens: list[int], stress: bool, seed: int) -> None:
    hf = tiny_hf_ssm(model_type, seed=seed, stress=stress, **overrides)
    ours = load_ssm(hf)
    gen = torch.Generator().manual_seed(seed)
    vocab = hf.config.vocab_size
    prompts = [torch.randint(0, vocab, (n,), generator=gen) for n in lens]
    padded = torch.randint(0, vocab, (len(lens), max(lens)), generator=gen)  # right padding with junk ids
    for i, p in enumerate(prompts):
        padded[i, : len(p)] = p
    with torch.no_grad():
        got = ours(padded)
    assert got.dtype == torch.float32
    for i, p in enumerate(prompts):
        ref = hf_logits(hf, p[None])[0]
        diff = (got[i, : len(p)] - ref).abs().max().item()
        assert diff <= TOL, f"{model_type} {overrides} len={len(p)} stress={stress}: max abs diff {diff:.3g}"


@FAST
@given(mamba1_cases("mamba"))
def test_mamba1_matches_hf(case):
    check_against_hf("mamba", *case)


@FAST
@given(mamba1_cases("falcon_mamba"))
def test_falcon_mamba_matches_hf(case):
    check_against_hf("falcon_mamba", *case)


@FAST
@given(mamba2_cases())
def test_mamba2_matches_hf(case):
    check_against_hf("mamba2", *case)


@pytest.mark.slow
@SLOW
@given(mamba1_cases("mamba"))
def test_mamba1_matches_hf_many(case):
    check_against_hf("mamba", *case)


@pytest.mark.slow
@SLOW
@given(mamba1_cases("falcon_mamba"))
def test_falcon_mamba_matches_hf_many(case):
    check_against_hf("falcon_mamba", *case)


@pytest.mark.slow
@SLOW
@given(mamba2_cases())
def test_mamba2_matches_hf_many(case):
    check_against_hf("mamba2", *case)


@pytest.mark.parametrize("model_type", ["mamba", "mamba2"])
def test_bf16_close_to_fp32_and_hf(model_type):
    """bf16 runs end to end and stays close to fp32 (bf16 has ~3 significant digits)."""
    hf = tiny_hf_ssm(model_type, seed=3)
    tokens = torch.randint(0, 97, (2, 40))
    ref = hf_logits(hf, tokens)
    ours16 = load_ssm(hf, dtype=torch.bfloat16)
    assert ours16.embed.weight.dtype == torch.bfloat16
    with torch.no_grad():
        got = ours16(tokens)
    assert torch.isfinite(got).all()
    rel = (got - ref).norm() / ref.norm()
    assert rel < 0.05, rel
    hf16 = tiny_hf_ssm(model_type, seed=3).to(torch.bfloat16)
    rel_hf = (hf_logits(hf16, tokens) - ref).norm() / ref.norm()
    assert rel < 3 * rel_hf + 1e-3, (rel, rel_hf)  # no worse than HF's own bf16 error


@pytest.mark.parametrize("model_type", ["mamba", "falcon_mamba", "mamba2"])
def test_gradients_flow(model_type):
    hf = tiny_hf_ssm(model_type, seed=1)
    ours = load_ssm(hf)
    tokens = torch.randint(0, 97, (2, 33))
    ours(tokens).logsumexp(-1).sum().backward()
    grads = {n: p.grad for n, p in ours.named_parameters()}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
    for name in ("A_log", "D", "conv_weight", "in_proj.weight", "out_proj.weight"):
        g = grads[f"blocks.0.ssm.{name}"]
        assert g.abs().sum() > 0, name
    # gradients equal those of the sequential reference scan
    ref = load_ssm(hf)
    ref.scan_impl = "sequential"
    ref(tokens).logsumexp(-1).sum().backward()
    for n, p in ref.named_parameters():
        torch.testing.assert_close(grads[n], p.grad, rtol=1e-4, atol=1e-5)
