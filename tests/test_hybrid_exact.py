"""Exactness of the hooked hybrids (Bamba, Jamba, Zamba2) against HF, on randomised configs.

Each hypothesis example draws a layer layout (which layers are attention,
which are SSM, which carry MoE, which share a Zamba2 block), GQA, LoRA adapters, partial RoPE, SSM geometry, biases and
tying, optionally re-draws the SSM/norm/router parameters far from HF's init
("stress"), and checks our fp32 logits against HF's to 1e-4 max abs diff.
30 examples per family by default, 300 under ``-m slow``.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gather_aggregate.adapters import load_ssm
from gather_aggregate.adapters.hybrid import HookedHybrid
from gather_aggregate.adapters.hybrid_convert import load_hybrid
from gather_aggregate.core.protocol import param_checksum
from gather_aggregate.testing.tiny_hybrids import hf_hybrid_logits, tiny_hf_hybrid

TOL = 1e-4
FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])



def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def shapes(draw):
    """A batch of 1-3 prompts of one length (1-24); one example in ten is a single long prompt."""
    if draw(st.integers(0, 9)) == 0:
        return 1, draw(st.sampled_from([97, 300]))
    return draw(st.integers(1, 3)), draw(st.integers(1, 24))


@st.composite
def attention_geometry(draw, d_model: int):
    # Bamba's partial RoPE (factor 0.5) needs an even rotary dim: head_dim a multiple of 4
    n_heads = draw(st.sampled_from([h for h in _divisors(d_model) if (d_model // h) % 4 == 0]))
    n_kv = draw(st.sampled_from(_divisors(n_heads)))
    return n_heads, n_kv


@st.composite
def bamba_cases(draw):
    d_model = draw(st.sampled_from([8, 16, 24, 32]))
    n_layers = draw(st.integers(1, 4))
    n_attn, n_kv = draw(attention_geometry(d_model))
    expand = draw(st.integers(1, 2))
    d_inner = d_model * expand
    d_head = draw(st.sampled_from([h for h in (2, 4, 8, 16) if d_inner % h == 0]))
    n_heads = d_inner // d_head
    attn_idx = sorted(draw(st.sets(st.integers(0, n_layers - 1))))
    overrides = dict(
        hidden_size=d_model, num_hidden_layers=n_layers, intermediate_size=draw(st.sampled_from([8, 24, 40])),
        num_attention_heads=n_attn, num_key_value_heads=n_kv, attn_layer_indices=attn_idx or None,
        mamba_expand=expand, mamba_n_heads=n_heads, mamba_d_head=d_head,
        mamba_n_groups=draw(st.sampled_from(_divisors(n_heads))), mamba_d_state=draw(st.integers(1, 16)),
        mamba_d_conv=draw(st.integers(1, 4)), mamba_chunk_size=draw(st.sampled_from([4, 16, 64])),
        mamba_conv_bias=draw(st.booleans()), mamba_proj_bias=draw(st.booleans()),
        attention_bias=draw(st.booleans()), mlp_bias=draw(st.booleans()),
        tie_word_embeddings=draw(st.booleans()),
        time_step_limit=draw(st.sampled_from([(0.0, float("inf")), (0.01, 0.5)])),
        rope_parameters={"rope_type": "default", "rope_theta": draw(st.sampled_from([100.0, 10000.0]))},
    )
    return overrides, draw(shapes()), draw(st.booleans()), draw(st.integers(0, 2**16))


@st.composite
def jamba_cases(draw):
    d_model = draw(st.sampled_from([8, 16, 32]))
    n_layers = draw(st.integers(1, 4))
    n_attn, n_kv = draw(attention_geometry(d_model))
    attn_period, expert_period = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    n_experts = draw(st.integers(1, 4))
    overrides = dict(
        hidden_size=d_model, num_hidden_layers=n_layers, intermediate_size=draw(st.sampled_from([8, 24])),
        num_attention_heads=n_attn, num_key_value_heads=n_kv,
        attn_layer_period=attn_period, attn_layer_offset=draw(st.integers(0, attn_period - 1)),
        expert_layer_period=expert_period, expert_layer_offset=draw(st.integers(0, expert_period - 1)),
        num_experts=n_experts, num_experts_per_tok=draw(st.integers(1, n_experts)),
        mamba_d_state=draw(st.integers(1, 8)), mamba_d_conv=draw(st.integers(1, 4)),
        mamba_expand=draw(st.integers(1, 2)), mamba_dt_rank=draw(st.one_of(st.just("auto"), st.integers(1, 4))),
        mamba_conv_bias=draw(st.booleans()), mamba_proj_bias=draw(st.booleans()),
        tie_word_embeddings=draw(st.booleans()),
    )
    return overrides, draw(shapes()), draw(st.booleans()), draw(st.integers(0, 2**16))


@st.composite
def zamba2_cases(draw):
    d_model = draw(st.sampled_from([8, 16, 32]))
    # attention runs on [h ‖ e] (2·d_model); RoPE needs an even head dim
    n_attn = draw(st.sampled_from([h for h in _divisors(2 * d_model) if (2 * d_model // h) % 2 == 0]))
    expand = draw(st.integers(1, 2))
    d_inner = d_model * expand
    n_mamba = d_inner // draw(st.sampled_from([h for h in (2, 4, 8, 16) if d_inner % h == 0]))
    types = draw(st.lists(st.sampled_from(["mamba", "hybrid"]), min_size=1, max_size=5))
    adapters = draw(st.booleans())  # HF's k/v adapters are 2·d_model wide: GQA only without them
    overrides = dict(
        hidden_size=d_model, layers_block_type=types, num_hidden_layers=len(types),
        intermediate_size=draw(st.sampled_from([8, 24])), num_attention_heads=n_attn,
        num_key_value_heads=n_attn if adapters else draw(st.sampled_from(_divisors(n_attn))), mamba_expand=expand,
        n_mamba_heads=n_mamba, mamba_ngroups=draw(st.sampled_from(_divisors(n_mamba))),
        mamba_d_state=draw(st.integers(1, 16)), mamba_d_conv=draw(st.integers(1, 4)),
        chunk_size=draw(st.sampled_from([4, 16, 64])), num_mem_blocks=draw(st.integers(1, 3)),
        use_shared_attention_adapter=adapters, adapter_rank=draw(st.integers(1, 4)),
        use_mem_rope=draw(st.booleans()), hidden_act=draw(st.sampled_from(["gelu", "silu"])),
        add_bias_linear=draw(st.booleans()), tie_word_embeddings=draw(st.booleans()),
        time_step_min=draw(st.sampled_from([0.001, 0.05])),
    )
    return overrides, draw(shapes()), draw(st.booleans()), draw(st.integers(0, 2**16))


def check_against_hf(model_type: str, overrides: dict, shape: tuple[int, int], stress: bool, seed: int) -> None:
    hf = tiny_hf_hybrid(model_type, seed=seed, stress=stress, **overrides)
    before = param_checksum(hf)
    model = load_hybrid(hf)
    assert isinstance(model, HookedHybrid)
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, hf.config.vocab_size, shape, generator=g)
    ref = hf_hybrid_logits(hf, tokens)
    ours = model(tokens)
    assert ours.shape == ref.shape
    err = (ours - ref).abs().max().item()
    assert err <= TOL, f"{model_type} {overrides} shape={shape} stress={stress}: max abs diff {err:.3g}"
    assert param_checksum(hf) == before, "loading must not modify the HF model"
    kinds = ["attn" if k == "attn" else "ssm" for k in model.cfg.layer_kinds]
    assert [i.kind for i in model.layers] == kinds


@FAST
@given(bamba_cases())
def test_bamba_logits_match_hf(case):
    check_against_hf("bamba", *case)


@FAST
@given(jamba_cases())
def test_jamba_logits_match_hf(case):
    check_against_hf("jamba", *case)


@FAST
@given(zamba2_cases())
def test_zamba2_logits_match_hf(case):
    check_against_hf("zamba2", *case)


@pytest.mark.slow
@SLOW
@given(zamba2_cases())
def test_zamba2_logits_match_hf_many(case):
    check_against_hf("zamba2", *case)


@pytest.mark.slow
@SLOW
@given(bamba_cases())
def test_bamba_logits_match_hf_many(case):
    check_against_hf("bamba", *case)


@pytest.mark.slow
@SLOW
@given(jamba_cases())
def test_jamba_logits_match_hf_many(case):
    check_against_hf("jamba", *case)


def test_layouts_follow_the_config():
    bamba = load_hybrid(tiny_hf_hybrid("bamba", num_hidden_layers=4, attn_layer_indices=[0, 3]))
    assert [i.kind for i in bamba.layers] == ["attn", "ssm", "ssm", "attn"]
    jamba = load_hybrid(tiny_hf_hybrid("jamba", num_hidden_layers=4, attn_layer_period=4, attn_layer_offset=2,
                                       expert_layer_period=2, expert_layer_offset=1))
    assert [i.kind for i in jamba.layers] == ["ssm", "ssm", "attn", "ssm"]
    assert [type(b.mlp).__name__ for b in jamba.blocks] == ["GatedMLP", "SparseMoE", "GatedMLP", "SparseMoE"]


def test_load_ssm_dispatches_hybrids_and_bf16_runs():
    hf = tiny_hf_hybrid("bamba", seed=3)
    model = load_ssm(hf)  # the SSM entry point hands hybrids over
    assert isinstance(model, HookedHybrid)
    half = load_hybrid(hf, dtype=torch.bfloat16)
    tokens = torch.randint(0, 97, (2, 9))
    ref = hf_hybrid_logits(hf, tokens)
    assert half.embed.weight.dtype == torch.bfloat16
    assert (half(tokens) - ref).abs().max().item() < 0.25  # bf16 is close, not exact


@pytest.mark.parametrize("partial", [0.25, 0.5])
def test_zamba2_rope_rotates_the_whole_head_whatever_partial_rotary_factor_says(partial):
    """HF's Zamba2 attention rotates every channel of a head and never reads ``partial_rotary_factor``; a config
    that carries one must not change our logits either (it did, by 0.12, until the config fuzz drew one)."""
    hf = tiny_hf_hybrid("zamba2", seed=1, stress=True, rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                                                        "partial_rotary_factor": partial})
    tokens = torch.randint(0, 97, (2, 11), generator=torch.Generator().manual_seed(1))
    err = (load_hybrid(hf)(tokens) - hf_hybrid_logits(hf, tokens)).abs().max().item()
    assert err <= TOL, err
