"""The implied-attention benchmark's building blocks, at toy sizes: ours equals TL 4.3 and the float64 formula."""

from __future__ import annotations

import math
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


def test_floor_row_parts_add_up(bench):
    r = bench.bench_floor(16, d_inner=8, d_state=4, repeats=1)
    assert r["floor_s"] == pytest.approx(r["touch_s"] + r["bmm_square_s"] / 2)
    assert min(r["touch_s"], r["rewrite_s"], r["bmm_square_s"]) > 0 and r["gflops"] > 0


def test_scan_benchmark_row_on_a_random_llama():
    """bench_scan's row on a random 4-layer Llama (no zoo model of that name): the exact scan equals the naive loop
    and the per-head list carries both scores, best exact first."""
    before = torch.get_num_threads()
    sys.path.insert(0, str(BENCH))
    try:
        import bench_scan

        r = bench_scan.bench_model("random-llama", n=4, dict_size=4, threads=1, repeats=1)
    finally:
        sys.path.remove(str(BENCH))
        torch.set_num_threads(before)
    assert r["heads"] == len(r["per_head"]) and r["max_abs_diff"] <= 1e-5
    exact = [ex for _, ex, _ in r["per_head"]]
    assert exact == sorted(exact, reverse=True)
    assert r["exact_speedup"] > 0 and -1.0 <= r["spearman"] <= 1.0 and 0 <= r["top5"] <= 5


def test_shortlist_lengths_count_positions_by_magnitude_and_by_sign():
    sys.path.insert(0, str(BENCH))
    try:
        from bench_shortlist import needed
    finally:
        sys.path.remove(str(BENCH))
    exact = {(0, 0): 8.0, (0, 1): 0.5, (1, 0): 0.2, (1, 1): 0.05, (1, 2): 0.0, (1, 3): -0.1}
    # a saturated estimate: the most important head gets a large negative score
    est = {(0, 0): -3.0, (0, 1): 0.6, (1, 0): 0.1, (1, 1): 0.3, (1, 2): 0.0, (1, 3): 0.2}
    significant = [(0, 0), (1, 0)]  # the heads above two standard errors
    mag = needed(exact, est, "magnitude", significant)  # |est| order: (0,0) (0,1) (1,1) (1,3) (1,0) (1,2)
    assert mag == {"top-1": 1, "top-3": 5, "top-5": 6, "≥ 10 %": 1, "> 2 SE": 5}
    signed = needed(exact, est, "signed", [(1, 1)])  # est order: (0,1) (1,1) (1,3) (1,0) (1,2) (0,0)
    assert signed == {"top-1": 6, "top-3": 6, "top-5": 6, "≥ 10 %": 6, "> 2 SE": 2}
    assert needed(exact, est, "signed", [])["> 2 SE"] == 0  # no head above the noise: nothing to hold


def test_control_variate_with_every_prompt_scanned_is_the_exact_scan():
    """bench_attribution_cv: with S = all n prompts the correction ĉ + (c̄_S − ĉ_S) is the exact scan itself
    (ρ = 1, top-5 5/5, every resolved pair alike); with fewer prompts it is a different ranking."""
    before = torch.get_num_threads()
    sys.path.insert(0, str(BENCH))
    try:
        import bench_attribution_cv

        rows = bench_attribution_cv.bench("llama-kv", None, False, n=3, ks=[1, 3])
    finally:
        sys.path.remove(str(BENCH))
        torch.set_num_threads(before)
    by_k = {r["k"]: r["cells"] for r in rows}
    for label in ("exact on k", "AtP + cv", "AtP-softmax + cv"):
        rho, top, resolved, _ = by_k[3][label]
        assert rho == pytest.approx(1.0) and top == 5, (label, rho, top)
        assert resolved == 1.0 or math.isnan(resolved), (label, resolved)  # NaN: the scan resolves no pair
    assert by_k[1]["exact on k"][0] < 1.0  # one prompt alone is not the 3-prompt scan


def test_exact_cells_mix_at_its_limits_is_the_exact_scan_or_the_estimator():
    """bench_attribution_cells: hindsight with the whole budget, calibration and the coreset on every prompt give
    the exact means; with no budget hindsight gives AtP-softmax's means; a calibration on exact cells that are a
    fixed combination of the estimates recovers it; and on a model the per-prompt drops average to the batch's."""
    sys.path.insert(0, str(BENCH))
    before = torch.get_num_threads()
    try:
        import bench_attribution_cells as cells

        g = torch.Generator().manual_seed(0)
        heads = [(layer, h) for layer in range(3) for h in range(4)]
        E, A, S = (torch.randn(6, 12, generator=g, dtype=torch.float64) for _ in range(3))
        assert torch.allclose(cells.hindsight(E, S, heads, 1.0), E.mean(0))
        assert torch.allclose(cells.hindsight(E, S, heads, 0.0), S.mean(0))
        assert torch.allclose(cells.calibrated(E, A, S, heads, 6), E.mean(0))
        linear = 2.0 * S - 0.5 * A
        assert torch.allclose(cells.calibrated(linear, A, S, heads, 2), linear.mean(0))
        assert torch.allclose(cells.coreset(E, S, 6), E.mean(0))  # every prompt, weights 1/n: the exact means
        assert torch.allclose(cells.coreset(S, S, 2), S.mean(0))  # an exact estimator needs no correction
        row = cells.bench("llama-kv", None, False, n=3)  # asserts E and S average to the batch scan and estimate
    finally:
        sys.path.remove(str(BENCH))
        torch.set_num_threads(before)
    assert list(row["cells"]) == ["AtP-softmax", "hindsight 5%", "hindsight 10%", "hindsight 20%",
                                  "calibrated k=2", "calibrated k=4", "coreset k=2", "coreset k=4"]
    assert all(-1.0 <= rho <= 1.0 and 0 <= top <= 5 for rho, top, _ in row["cells"].values())
