"""Hook names, shapes and faithfulness; start/stop_at_layer; the head ablation equals the Llamba column ablation."""

from __future__ import annotations

import copy

import pytest
import torch
from transformer_lens.ActivationCache import ActivationCache

from gather_aggregate.adapters import load_ssm
from gather_aggregate.core.errors import InputError, NonFiniteError
from gather_aggregate.core.protocol import count_hooks, param_checksum
from gather_aggregate.testing.tiny_ssm import hf_logits, tiny_hf_ssm

FAMILIES = ["mamba", "falcon_mamba", "mamba2"]



def make(model_type, **kw):
    hf = tiny_hf_ssm(model_type, seed=7, stress=True)
    return load_ssm(hf, **kw), hf


def tokens(seed=0, b=2, L=21):
    return torch.randint(0, 97, (b, L), generator=torch.Generator().manual_seed(seed))


def expected_shapes(m, b, L):
    c = m.cfg
    per_layer = {
        "hook_resid_pre": (b, L, c.d_model), "ln1.hook_normalized": (b, L, c.d_model),
        "ssm.hook_conv_in": (b, L, c.conv_dim), "ssm.hook_conv_out": (b, L, c.conv_dim),
        "ssm.hook_gate": (b, L, c.d_inner), "ssm.hook_x": (b, L, c.d_inner),
        "ssm.hook_y": (b, L, c.d_inner), "ssm.hook_gated": (b, L, c.d_inner),
        "ssm.hook_head_out": (b, L, c.n_heads, c.d_head),
        "hook_mixer_out": (b, L, c.d_model), "hook_resid_post": (b, L, c.d_model),
    }
    if c.family == "mamba1":
        per_layer.update({"ssm.hook_dt": (b, L, c.d_inner), "ssm.hook_B": (b, L, c.d_state),
                          "ssm.hook_C": (b, L, c.d_state)})
    else:
        per_layer.update({"ssm.hook_dt": (b, L, c.n_heads), "ssm.hook_B": (b, L, c.n_groups, c.d_state),
                          "ssm.hook_C": (b, L, c.n_groups, c.d_state)})
    out = {"hook_embed": (b, L, c.d_model), "ln_final.hook_normalized": (b, L, c.d_model)}
    for i in range(c.n_layers):
        out.update({f"blocks.{i}.{k}": v for k, v in per_layer.items()})
    return out


@pytest.mark.parametrize("model_type", FAMILIES)
def test_hook_names_and_shapes(model_type):
    m, _ = make(model_type)
    logits, cache = m.run_with_cache(tokens())
    assert isinstance(cache, ActivationCache)
    want = expected_shapes(m, 2, 21)
    assert {k: tuple(v.shape) for k, v in cache.items()} == want
    assert m.head_hook(1) == ("blocks.1.ssm.hook_head_out", 2)
    assert m.layers[0].kind == "ssm" and m.layers[0].n_heads == m.cfg.n_heads
    assert m.n_ctx is None and m.d_vocab == 97 and logits.shape == (2, 21, 97)


def test_mamba1_head_size_groups_channels():
    m, hf = make("mamba", head_size=4)
    assert (m.cfg.n_heads, m.cfg.d_head) == (m.cfg.d_inner // 4, 4)
    _, cache = m.run_with_cache(tokens())
    assert cache["blocks.0.ssm.hook_head_out"].shape == (2, 21, m.cfg.d_inner // 4, 4)
    torch.testing.assert_close(m(tokens()), hf_logits(hf, tokens()), atol=1e-4, rtol=0)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_replaying_every_cached_hook_reproduces_logits(model_type):
    m, _ = make(model_type)
    t = tokens()
    logits, cache = m.run_with_cache(t)
    replay = [(name, (lambda v: lambda act, hook: v.clone())(value)) for name, value in cache.items()]
    assert m.run_with_hooks(t, fwd_hooks=replay).equal(logits)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_every_hook_is_on_the_computation_path(model_type):
    """Patching any single hook with another prompt's activation changes the logits."""
    m, _ = make(model_type)
    a, b = tokens(0), tokens(1)
    clean, _ = m.run_with_cache(a)
    _, other = m.run_with_cache(b)
    for name in other.keys():
        patched = m.run_with_hooks(a, fwd_hooks=[(name, lambda act, hook, v=other[name]: v)])
        assert not torch.allclose(patched, clean), f"{name} is not on the computation path"


@pytest.mark.parametrize("model_type", FAMILIES)
def test_ssm_hooks_fully_determine_the_scan(model_type):
    """Patching x, Δ, B, C from prompt b makes hook_y exactly b's; patching y and z makes hook_gated b's."""
    m, _ = make(model_type)
    a, b = tokens(0), tokens(1)
    _, cb = m.run_with_cache(b)
    p = "blocks.1.ssm."
    hooks = [(p + n, lambda act, hook: cb[hook.name]) for n in ("hook_x", "hook_dt", "hook_B", "hook_C")]
    with m.hooks(fwd_hooks=hooks):
        _, ca = m.run_with_cache(a)
    torch.testing.assert_close(ca[p + "hook_y"], cb[p + "hook_y"], atol=1e-5, rtol=1e-5)
    with m.hooks(fwd_hooks=[(p + n, lambda act, hook: cb[hook.name]) for n in ("hook_y", "hook_gate")]):
        _, ca = m.run_with_cache(a)
    torch.testing.assert_close(ca[p + "hook_gated"], cb[p + "hook_gated"])
    with m.hooks(fwd_hooks=[(p + "hook_head_out", lambda act, hook: cb[hook.name])]):
        _, ca = m.run_with_cache(a)
    torch.testing.assert_close(ca["blocks.1.hook_mixer_out"], cb["blocks.1.hook_mixer_out"])


@pytest.mark.parametrize("model_type,head_size", [("mamba", 1), ("mamba", 4), ("falcon_mamba", 2), ("mamba2", None)])
def test_zeroing_a_head_equals_zeroing_out_proj_columns(model_type, head_size):
    """The paper's Llamba ablation: zero out_proj's input columns of head h (done on a copy)."""
    kw = {} if head_size is None else {"head_size": head_size}
    m, _ = make(model_type, **kw)
    t = tokens()
    layer, head = 1, 3
    name, axis = m.head_hook(layer)
    assert axis == 2

    def zero(act, hook):
        act = act.clone()
        act[:, :, head] = 0
        return act

    before = param_checksum(m)
    hooked = m.run_with_hooks(t, fwd_hooks=[(name, zero)])
    assert param_checksum(m) == before and count_hooks(m) == 0
    surgery = copy.deepcopy(m)
    d = m.cfg.d_head
    with torch.no_grad():
        surgery.blocks[layer].ssm.out_proj.weight[:, head * d:(head + 1) * d] = 0
    torch.testing.assert_close(hooked, surgery(t), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(hooked, m(t))


@pytest.mark.parametrize("model_type", ["mamba", "mamba2"])
def test_start_and_stop_at_layer(model_type):
    m, _ = make(model_type)
    t = tokens()
    logits, cache = m.run_with_cache(t)
    for layer in range(m.cfg.n_layers):
        resid = m(t, stop_at_layer=layer)
        torch.testing.assert_close(resid, cache[f"blocks.{layer}.hook_resid_pre"], atol=0, rtol=0)
        torch.testing.assert_close(m(resid, start_at_layer=layer), logits, atol=0, rtol=0)
    end = m(t, stop_at_layer=m.cfg.n_layers)
    torch.testing.assert_close(end, cache[f"blocks.{m.cfg.n_layers - 1}.hook_resid_post"])
    torch.testing.assert_close(m(t, stop_at_layer=-1), cache[f"blocks.{m.cfg.n_layers - 1}.hook_resid_pre"])
    mid = m(cache["blocks.0.hook_resid_pre"], start_at_layer=0, stop_at_layer=1)
    torch.testing.assert_close(mid, cache["blocks.0.hook_resid_post"])


def test_sequential_mode_exposes_the_state():
    for model_type, shape in [("mamba", lambda c: (2, 21, c.d_inner, c.d_state)),
                              ("mamba2", lambda c: (2, 21, c.n_heads, c.d_head, c.d_state))]:
        m, hf = make(model_type)
        _, cache = m.run_with_cache(tokens())
        assert "blocks.0.ssm.hook_state" not in cache  # default (chunked) mode: no state
        m.scan_impl = "sequential"
        logits, cache = m.run_with_cache(tokens())
        assert cache["blocks.0.ssm.hook_state"].shape == shape(m.cfg)
        torch.testing.assert_close(logits, hf_logits(hf, tokens()), atol=1e-4, rtol=0)
        # scaling the state scales the state's share of y
        with m.hooks(fwd_hooks=[("blocks.0.ssm.hook_state", lambda act, hook: act * 0)]):
            _, zeroed = m.run_with_cache(tokens(), names_filter=lambda n: n.startswith("blocks.0.ssm"))
        p = m.ssm_layer_params(0)
        x = zeroed["blocks.0.ssm.hook_x"]
        Dx = x * (p.D if p.family == "mamba1" else p.D.repeat_interleave(m.cfg.d_head))
        torch.testing.assert_close(zeroed["blocks.0.ssm.hook_y"], Dx)


def test_bad_scan_impl():
    m, _ = make("mamba")
    with pytest.raises(InputError, match="scan_impl"):
        m.scan_impl = "turbo"


# ------------------------------------------------------------------ bad input
def test_residual_input_validation():
    m, _ = make("mamba")
    resid = m(tokens(), stop_at_layer=1)
    with pytest.raises(InputError, match="float residual"):
        m(tokens(), start_at_layer=1)
    with pytest.raises(InputError, match=r"\[batch, pos, d_model=32\]"):
        m(resid[..., :5], start_at_layer=1)
    with pytest.raises(InputError, match="dtype torch.float64"):
        m(resid.double(), start_at_layer=1)
    with pytest.raises(InputError, match="meta"):
        m(resid.to("meta"), start_at_layer=1)
    bad = resid.clone()
    bad[0, 3, 1] = float("nan")
    with pytest.raises(NonFiniteError):
        m(bad, start_at_layer=1)
    with pytest.raises(InputError, match="out of range"):
        m(tokens(), stop_at_layer=7)
    with pytest.raises(InputError, match="comes before"):
        m(resid, start_at_layer=1, stop_at_layer=0)
    with pytest.raises(InputError, match="token ids must be in"):
        m(torch.tensor([[1, 2, 500]]))
    with pytest.raises(InputError, match="integer ids"):
        m(torch.randn(1, 4))


def test_check_finite_debug_flag_names_the_hook():
    m, _ = make("mamba2")
    broken = copy.deepcopy(m)
    with torch.no_grad():
        broken.blocks[1].ssm.conv_weight.fill_(float("inf"))
    out = broken(tokens())  # silently non-finite without the flag
    assert not torch.isfinite(out).all()
    broken.check_finite = True
    with pytest.raises(NonFiniteError, match="blocks.1.ssm.hook_conv_out"):
        broken(tokens())
    assert count_hooks(broken) == 0  # the checking hooks were removed even though we raised
    m.check_finite = True
    torch.testing.assert_close(m(tokens()), broken.__class__.forward(m, tokens()))
