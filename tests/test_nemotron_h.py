"""Nemotron-H: exact to HF (MLP/MoE layers folded into protocol layers), Mamba-2 implied attention, the protocol."""

from __future__ import annotations

import pytest
import torch
from hybrid_family_checks import HybridFamilySuite

from gather_aggregate import from_hf_model
from gather_aggregate.adapters.families.nemotron_h import HookedNemotronH
from gather_aggregate.core.errors import UnsupportedModelError
from gather_aggregate.testing.tiny_families import random_nemotron_h_config, tiny_hf_nemotron_h


class TestNemotronH(HybridFamilySuite):
    make_hf, random_config, load = tiny_hf_nemotron_h, random_nemotron_h_config, from_hf_model
    hooked_class = HookedNemotronH

    def check_saved(self, model):
        assert model.cfg.extra["hf_layers"] == [[0, 1], [2, 3], [4]]

    def edit_config(self, cfg):
        key = "layers_block_type" if "layers_block_type" in cfg else "layer_types"
        cfg[key] = ["linear_attention", "moe", "linear_attention", "mlp", "linear_attention"]
        cfg["n_routed_experts"] = 4

    def check_refusal(self, msg):
        assert "model.layers.2.mixer.A_log" in msg and "model.layers.2.mixer.q_proj.weight" in msg
        assert "mis-shaped" in msg and "n_routed_experts" in msg


@pytest.mark.parametrize(("n_exp", "n_group", "topk_group"), [(3, 3, 1), (4, 4, 1), (6, 4, 1), (4, 2, 3)])
def test_routing_that_cannot_run_is_refused_at_load(n_exp, n_group, topk_group):
    """HF's grouped router scores a group by its best two experts, so groups of one expert (and a ``topk_group``
    above ``n_group``, or groups that do not divide the experts) fail inside HF's forward; the loader says so
    before running (found by the config fuzz, ``gather_aggregate/testing/fuzz/draws.py``)."""
    hf = tiny_hf_nemotron_h(0, n_routed_experts=n_exp, n_group=n_group, topk_group=topk_group, num_experts_per_tok=1)
    with pytest.raises(UnsupportedModelError, match="n_group") as err:
        from_hf_model(hf)
    assert "\n" not in str(err.value)
    with pytest.raises(RuntimeError):  # HF cannot run it either
        hf(torch.zeros(1, 3, dtype=torch.long), use_cache=False)


@pytest.mark.parametrize("act", ["gelu", "silu"])
def test_mlp_and_experts_follow_mlp_hidden_act(act):
    """``mlp_hidden_act`` sets the MLP layers', the routed experts' and the shared expert's activation (relu² in
    released checkpoints); other values were refused until the config fuzz drew them."""
    from hybrid_family_checks import check_matches_hf, tokens

    hf = tiny_hf_nemotron_h(2, mlp_hidden_act=act)
    check_matches_hf(hf, from_hf_model, tokens(97, L=13, seed=2))
