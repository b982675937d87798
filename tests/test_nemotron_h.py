"""Nemotron-H: exact to HF (MLP/MoE layers folded into protocol layers), Mamba-2 implied attention, the protocol."""

from __future__ import annotations

from hybrid_family_checks import HybridFamilySuite

from gather_aggregate import from_hf_model
from gather_aggregate.adapters.families.nemotron_h import HookedNemotronH
from gather_aggregate.adapters.families_testing import random_nemotron_h_config, tiny_hf_nemotron_h


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
