"""Inference memory from a config, checked against the caches HF allocates; head-choice strategies; the CLI."""

from __future__ import annotations

import pytest
import torch

from gather_aggregate.core.errors import InputError, UnsupportedModelError


@pytest.mark.parametrize("name", ["llama-kvmc", "mamba2-ga", "bamba-ga"])
@pytest.mark.parametrize("L", [7, 33])
def test_cache_bytes_equal_the_tensors_hf_allocates_on_the_zoo(name, L):
    from transformers import AutoModelForCausalLM

    from gather_aggregate.models.memory import cache_bytes, measured_cache_bytes
    from gather_aggregate.zoo import zoo_path

    hf = AutoModelForCausalLM.from_pretrained(zoo_path(name)).eval()
    with torch.no_grad():
        measured = measured_cache_bytes(hf, torch.randint(2, 300, (2, L)))
    predicted = cache_bytes(zoo_path(name), L, batch=2)
    assert predicted.total == measured
    assert (predicted.kv_bytes > 0) == (name != "mamba2-ga")


def test_cache_bytes_of_mamba1_and_the_hf_config_object():
    from transformers import MambaConfig, MambaForCausalLM

    from gather_aggregate.models.memory import cache_bytes, measured_cache_bytes

    cfg = MambaConfig(vocab_size=50, hidden_size=32, num_hidden_layers=3, state_size=8, conv_kernel=3)
    torch.manual_seed(0)
    hf = MambaForCausalLM(cfg).eval()
    with torch.no_grad():
        measured = measured_cache_bytes(hf, torch.randint(0, 50, (1, 11)))
    got = cache_bytes(cfg, 11)
    assert got.total == measured and got.kv_bytes == 0
    assert got.ssm_state_bytes == 3 * 64 * 8 * 4 and got.conv_bytes == 3 * 64 * 3 * 4
    assert cache_bytes(cfg, 4096).total == got.total  # constant in the prompt length


def test_head_hybrid_cache_counts_only_kept_kv_heads():
    from gather_aggregate.cli.memory import LLAMA_32_1B
    from gather_aggregate.models.head_hybrid.config import HeadHybridConfig
    from gather_aggregate.models.memory import cache_bytes

    # GQA: heads 0-3 read kv head 0, so keeping (0,0) and (0,1) costs one kv head; (1,31) another
    cfg = HeadHybridConfig.from_llama(LLAMA_32_1B, [(0, 0), (0, 1), (1, 31)], d_state=8)
    got = cache_bytes(cfg.to_dict() | {"dtype": "bfloat16"}, 100)
    assert got.kv_bytes == 2 * 2 * 64 * 100 * 2
    n_ssm = 16 * 32 - 3
    assert got.ssm_state_bytes == n_ssm * 64 * 8 * 2 and got.conv_bytes == n_ssm * (64 + 16) * 4 * 2
    full = cache_bytes(LLAMA_32_1B, 100)
    assert full.kv_bytes == 2 * 16 * 8 * 64 * 100 * 2


def test_cache_bytes_errors():
    from gather_aggregate.models.memory import cache_bytes

    with pytest.raises(UnsupportedModelError, match="does not know"):
        cache_bytes({"model_type": "rwkv"}, 10)
    with pytest.raises(InputError, match="positive"):
        cache_bytes({"model_type": "mamba2"}, 0)


def test_memory_cli_prints_the_table(capsys, tmp_path):
    from gather_aggregate.cli.parser import main

    assert main(["memory", "--model", "llama-kvmc", "--keep", "0,2", "--d-states", "8", "--out",
                 str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| `llama-kvmc` | 512.0 KiB | 8.0 MiB | 16.0 MiB | 0 B |" in out
    assert "llama-kvmc hybrid, 2 attn heads, N=8" in out
    assert (tmp_path / "memory.json").is_file()
    assert main(["memory", "--model", "no-such-model"]) == 2


def test_head_choice_strategies_on_the_zoo_transformer():
    from gather_aggregate.hybridise import choose_heads, hybridise
    from gather_aggregate.studies.claims import task_sets
    from gather_aggregate.studies.hybrids.choose import scan_order
    from gather_aggregate.zoo import zoo_path

    model = hybridise(zoo_path("llama-kvmc"), "all")
    kv = task_sets(model, zoo_path("llama-kvmc"), 8, seed=1)["kv"]
    order, scan = scan_order(model, kv)
    assert choose_heads(model, kv, 2, "scan", scan=scan) == order[:2]
    assert order[0] == (0, 2)  # the zoo's KV Gather head (docs/results.md) tops the exact scan
    assert choose_heads(model, kv, 3, "bottom", scan=scan) == order[::-1][:3]
    r0, r1 = (choose_heads(model, kv, 4, "random", seed=s) for s in (0, 1))
    assert len(set(r0)) == 4 and r0 != r1 and r0 == choose_heads(model, kv, 4, "random", seed=0)
    from gather_aggregate.detect.detector import find_ga_heads

    named = set(find_ga_heads(model, kv, scan).ga_heads())
    det = choose_heads(model, kv, 3, "detector", scan=scan)
    assert len(set(det)) == 3 and det[0] == (0, 2) and set(det) <= named
    assert det == [h for h in order if h in named][:3]
    assert choose_heads(model, kv, 0, "scan", scan=scan) == []
    with pytest.raises(InputError, match="strategy"):
        choose_heads(model, kv, 2, "best")
    with pytest.raises(InputError, match="k must be"):
        choose_heads(model, kv, 17, "scan", scan=scan)
