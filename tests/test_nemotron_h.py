"""Nemotron-H: exact to HF (MLP/MoE layers folded into protocol layers), Mamba-2 implied attention, the protocol."""

from __future__ import annotations

import pytest
import torch
from hybrid_family_checks import (
    check_mamba2_heads_rebuilt,
    check_matches_hf,
    check_protocol_on_disk,
    check_scan_and_detector,
    refused_config_message,
    save_and_load,
    tokens,
)

from gather_aggregate.adapters.families_testing import random_nemotron_h_config, tiny_hf_nemotron_h


@pytest.mark.parametrize("seed", range(12))
def test_random_configs_match_hf(seed):
    from gather_aggregate import from_hf_model

    hf = tiny_hf_nemotron_h(seed, config=random_nemotron_h_config(seed))
    toks = tokens(61, L=[9, 33, 50][seed % 3], seed=seed)
    model, _ = check_matches_hf(hf, from_hf_model, toks)
    check_mamba2_heads_rebuilt(model, toks)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return save_and_load(tiny_hf_nemotron_h, 4, tmp_path_factory.mktemp("nemotron_h"))


def test_load_model_from_disk_and_protocol(saved):
    from gather_aggregate.adapters.families.nemotron_h import HookedNemotronH

    _, _, hf, model, _ = saved
    assert isinstance(model, HookedNemotronH)
    assert [i.kind for i in model.layers] == ["ssm", "attn", "ssm"]
    logits, cache = check_protocol_on_disk(hf, model)
    torch.testing.assert_close(model(cache["blocks.1.hook_resid_pre"], start_at_layer=1), logits)


def test_exact_scan_and_detector_run_on_nemotron_h(saved):
    model = check_scan_and_detector(saved, n_layers=3, n_scores=8 + 4 + 8)
    assert model.cfg.extra["hf_layers"] == [[0, 1], [2, 3], [4]]


def test_a_checkpoint_whose_config_disagrees_is_refused(saved, tmp_path):
    def edit(cfg):
        key = "layers_block_type" if "layers_block_type" in cfg else "layer_types"
        cfg[key] = ["linear_attention", "moe", "linear_attention", "mlp", "linear_attention"]
        cfg["n_routed_experts"] = 4

    msg = refused_config_message(saved[4], tmp_path, edit)
    assert "model.layers.2.mixer.A_log" in msg and "model.layers.2.mixer.q_proj.weight" in msg
    assert "mis-shaped" in msg and "n_routed_experts" in msg
