"""Falcon-H1: attention and Mamba-2 in parallel in one layer, exact to HF with every μP multiplier; both head kinds
in one protocol layer (``head_kinds``), implied attention of the Mamba-2 heads, scans, detector, masking, loading."""

from __future__ import annotations

import pytest
import torch
from hybrid_family_checks import HybridFamilySuite, tokens

from gather_aggregate import from_hf_model
from gather_aggregate.adapters.families.falcon_h1 import HookedFalconH1
from gather_aggregate.core.errors import InputError
from gather_aggregate.core.protocol import count_hooks
from gather_aggregate.testing.tiny_families import random_falcon_h1_config, tiny_hf_falcon_h1


class TestFalconH1(HybridFamilySuite):
    """The checks every hybrid family runs; every Falcon-H1 layer holds attention and Mamba-2 heads side by side
    (two attention heads beside eight Mamba-2 heads in the saved model)."""

    make_hf, random_config, load = tiny_hf_falcon_h1, random_falcon_h1_config, from_hf_model
    hooked_class = HookedFalconH1
    layer_kinds = ("attn", "attn")
    saved_overrides = {"num_attention_heads": 2, "num_key_value_heads": 1}
    n_layers = 2
    n_scores = 2 * (2 + 8)
    scan_heads = (0, 1, 2, 9)  # two attention and two Mamba-2 heads per layer

    def edit_config(self, cfg):
        cfg["mamba_rms_norm"] = False  # the checkpoint has the gated norm's weights
        cfg["num_attention_heads"] = 4  # and 2 attention heads

    def check_refusal(self, msg):
        assert "model.layers.0.mamba.norm.weight" in msg and "model.layers.1.self_attn.q_proj.weight" in msg
        assert "mis-shaped" in msg and "mamba_rms_norm" in msg


def test_one_layer_holds_both_head_kinds_and_its_output_is_linear_in_them():
    model = from_hf_model(tiny_hf_falcon_h1(0, head_dim=4))  # attention heads narrower than Mamba-2 heads: padded
    info = model.layers[1]
    assert info.kind == "attn" and info.n_heads == 4 + 8 and info.d_head == 8
    assert model.head_kinds(1) == ["attn"] * 4 + ["ssm"] * 8 and info.heads_of("ssm") == list(range(4, 12))
    assert len(model.all_heads(kinds=["ssm"])) == 16 and len(model.all_heads(kinds=["attn"])) == 8
    toks = tokens(97, L=15)
    _, cache = model.run_with_cache(toks)
    z = cache["blocks.1.hook_heads"]
    assert z.shape == (2, 15, 12, 8) and float(z[:, :, :4, 4:].abs().max()) == 0.0
    torch.testing.assert_close(z[:, :, :4, :4], cache["blocks.1.attn.hook_z"])
    torch.testing.assert_close(z[:, :, 4:], cache["blocks.1.ssm.hook_head_out"])
    hook, w = model.mixer_resume(1)
    bias = model.blocks[1].mix(torch.zeros_like(z))
    torch.testing.assert_close(z.flatten(2) @ w.T + bias, cache[hook], atol=1e-5, rtol=1e-5)
    # pattern: softmax for attention heads, implied attention for Mamba-2 heads, in the order asked
    mixed = model.pattern(cache, 1, heads=[5, 0, 11])
    torch.testing.assert_close(mixed[:, 1], cache["blocks.1.attn.hook_pattern"][:, 0])
    torch.testing.assert_close(mixed[:, [0, 2]], model.pattern(cache, 1, heads=[5, 11]))
    torch.testing.assert_close(model.pattern(toks, 1, heads=[5, 0, 11]), mixed)
    full = model.pattern(cache, 1)
    torch.testing.assert_close(model.pattern(cache, 1, rows=[-1, 3]), full[:, :, [14, 3]], atol=1e-6, rtol=1e-5)
    with pytest.raises(InputError, match="SSM heads"):
        model.pattern(cache, 1, heads=[0, 5], kind="softmax")
    with pytest.raises(InputError, match="apply only to SSM layers and heads"):
        model.pattern(cache, 1, heads=[0], method="reference")


def test_masking_reaches_each_mixer_at_its_own_head_index():
    from gather_aggregate.adapters import mask_heads

    model = from_hf_model(tiny_hf_falcon_h1(1))
    toks = tokens(97, n=1, L=10)
    clean, cache = model.run_with_cache(toks)
    with mask_heads(model, [(0, 1), (0, 6)], torch.ones(1, 10, 10)):
        torch.testing.assert_close(model(toks), clean, atol=1e-5, rtol=1e-5)
    eye = torch.eye(10)[None]
    with mask_heads(model, [(0, 1), (0, 6)], eye):  # attention head 1 and Mamba-2 head 2
        _, masked = model.run_with_cache(toks, names_filter=lambda n: n.startswith("blocks.0."))
    pat, ref = masked["blocks.0.attn.hook_pattern"], cache["blocks.0.attn.hook_pattern"]
    torch.testing.assert_close(pat[:, 1], ref[:, 1] * eye)
    torch.testing.assert_close(pat[:, [0, 2, 3]], ref[:, [0, 2, 3]])
    H, P = model.cfg.n_heads, model.cfg.d_head
    y, y0 = (c["blocks.0.ssm.hook_y"].unflatten(-1, (H, P)) for c in (masked, cache))
    changed = ((y - y0).abs().amax(dim=(0, 1, 3)) > 1e-6).nonzero().flatten().tolist()
    assert changed == [2]
    x = cache["blocks.0.ssm.hook_x"].unflatten(-1, (H, P))  # the masked head is its own input's D-skip alone
    torch.testing.assert_close(y[:, :, 2], (model.pattern(cache, 0, heads=[6])[:, 0] * eye) @ x[0, :, 2]
                               + model.ssm_layer_params(0).D[2] * x[:, :, 2], atol=1e-5, rtol=1e-5)
    assert count_hooks(model) == 0


def test_mamba2_heads_agree_with_transformerlens_where_its_formula_holds():
    """TL 4.3's ``compute_ssm_effective_attention`` on its Falcon-H1 bridge looks up ``blocks.L.mixer.*`` while the
    bridge names the Mamba-2 branch ``mamba`` (so it raises), and it reads ``in_proj`` before Falcon-H1's
    ``ssm_multipliers``.  With the keys renamed and every SSM multiplier 1, its matrix equals ours."""
    from transformer_lens.model_bridge.generalized_components.ssm_protocol import find_ssm_mixer

    from gather_aggregate.models.bridge import _build_bridge

    hf = tiny_hf_falcon_h1(0, num_hidden_layers=1, ssm_in_multiplier=1.0, ssm_multipliers=[1.0] * 5)
    model = from_hf_model(hf)  # before the bridge, which wraps the HF modules in place
    bridge = _build_bridge(hf, type(hf).__name__, hf.config, None)
    mixer = find_ssm_mixer(bridge.blocks[0])
    mixer.eager_scan = True
    toks = tokens(97, n=1, L=20)
    _, tl_cache = bridge.run_with_cache(toks, use_cache=False)
    renamed = {k.replace(".mamba.", ".mixer."): v for k, v in tl_cache.items() if k.startswith("blocks.0.")}
    theirs = mixer.compute_effective_attention(renamed, 0, include_dt_scaling=True).detach()
    ours = model.pattern(toks, 0, heads=model.layers[0].heads_of("ssm"))
    assert float((theirs - ours).abs().max() / ours.abs().max()) <= 1e-5
