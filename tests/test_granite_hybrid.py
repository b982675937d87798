"""Granite-4 hybrids (GraniteMoeHybrid): exact to HF with μP multipliers, Mamba-2 implied attention, the protocol."""

from __future__ import annotations

import pytest
from hybrid_family_checks import HybridFamilySuite

from gather_aggregate import from_hf_model
from gather_aggregate.adapters.families.granitemoehybrid import HookedGraniteHybrid
from gather_aggregate.testing.tiny_families import random_granite_config, tiny_hf_granite


class TestGranite(HybridFamilySuite):
    make_hf, random_config, load = tiny_hf_granite, random_granite_config, from_hf_model
    hooked_class = HookedGraniteHybrid

    def edit_config(self, cfg):
        cfg["layer_types"] = ["mamba", "mamba", "mamba"]
        cfg["num_local_experts"] = 2

    def check_refusal(self, msg):
        assert "model.layers.1.mamba.A_log" in msg and "model.layers.1.self_attn.q_proj.weight" in msg
        assert "mis-shaped" in msg and "num_local_experts" in msg


@pytest.mark.parametrize("partial", [0.25, 0.5])
def test_rope_rotates_the_whole_head_whatever_partial_rotary_factor_says(partial):
    """HF's Granite-4 attention rotates every channel of a head and never reads ``partial_rotary_factor``; a config
    that carries one must not change our logits either (it did, by 0.8, until the config fuzz drew one)."""
    from hybrid_family_checks import check_matches_hf, tokens

    hf = tiny_hf_granite(1, rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                             "partial_rotary_factor": partial})
    check_matches_hf(hf, from_hf_model, tokens(97, L=11, seed=1))
