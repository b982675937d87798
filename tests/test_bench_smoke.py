"""The implied-attention benchmark's building blocks, at toy sizes: ours equals TL 4.3 and the float64 formula."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    sys.path.insert(0, str(BENCH))
    try:
        import bench_implied_attention

        yield bench_implied_attention
    finally:
        sys.path.remove(str(BENCH))
        torch.set_num_threads(before)


def test_ours_equals_transformer_lens(bench):
    r = bench.bench_tl(10, d_model=16, d_state=4)
    assert r["shape"] == [1, 32, 10, 10]
    assert r["rel_diff"] < 1e-5
    assert r["wall_s"] > 0 and r["dpeak_mib"] >= 0


@pytest.mark.parametrize("kw", [{}, {"head_size": 8}, {"rows": -1, "model_type": "falcon_mamba"}],
                         ids=["full", "groups", "last-row"])
def test_ours_matches_float64_formula(bench, kw):
    r = bench.bench_ours(10, d_model=16, d_state=4, repeats=1, **kw)
    assert r["rel_diff"] < 1e-5
