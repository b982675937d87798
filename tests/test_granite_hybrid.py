"""Granite-4 hybrids (GraniteMoeHybrid): exact to HF with μP multipliers, Mamba-2 implied attention, the protocol."""

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

from gather_aggregate.adapters.families_testing import random_granite_config, tiny_hf_granite


@pytest.mark.parametrize("seed", range(12))
def test_random_configs_match_hf(seed):
    from gather_aggregate import from_hf_model

    hf = tiny_hf_granite(seed, config=random_granite_config(seed))
    toks = tokens(61, L=[9, 33, 50][seed % 3], seed=seed)
    model, _ = check_matches_hf(hf, from_hf_model, toks)
    check_mamba2_heads_rebuilt(model, toks)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return save_and_load(tiny_hf_granite, 4, tmp_path_factory.mktemp("granite"))


def test_load_model_from_disk_and_protocol(saved):
    from gather_aggregate.adapters.families.granitemoehybrid import HookedGraniteHybrid

    _, _, hf, model, _ = saved
    assert isinstance(model, HookedGraniteHybrid)
    assert [i.kind for i in model.layers] == ["ssm", "attn", "ssm"]
    logits, cache = check_protocol_on_disk(hf, model)
    torch.testing.assert_close(model(cache["blocks.1.hook_resid_pre"], start_at_layer=1), logits)


def test_exact_scan_and_detector_run_on_granite(saved):
    check_scan_and_detector(saved, n_layers=3, n_scores=8 + 4 + 8)


def test_a_checkpoint_whose_config_disagrees_is_refused(saved, tmp_path):
    def edit(cfg):
        cfg["layer_types"] = ["mamba", "mamba", "mamba"]
        cfg["num_local_experts"] = 2

    msg = refused_config_message(saved[4], tmp_path, edit)
    assert "model.layers.1.mamba.A_log" in msg and "model.layers.1.self_attn.q_proj.weight" in msg
    assert "mis-shaped" in msg and "num_local_experts" in msg
