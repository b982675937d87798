"""bench_family_implied's measurements at toy width, in-process: each family's implied attention rebuilds its
mixer's output, TL's gated-DeltaNet heuristic does not, TL's Mamba-2 matrix does, and TL's call on Falcon-H1
raises (its row records the error)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))
    try:
        import bench_family_implied

        yield bench_family_implied
    finally:
        sys.path.remove(str(BENCH))


def _run(bench, capsys, **spec):
    bench.child({"width": "tiny", "L": 12, **spec})
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.parametrize("family", ["llamba", "qwen3_next", "granitemoehybrid", "falcon_h1"])
def test_ours_rebuilds_the_mixer_output(bench, capsys, family):
    full = _run(bench, capsys, family=family, impl="ours")
    assert full["rebuild"] < 1e-5 and full["shape"][-2:] == [12, 12] and full["wall_s"] > 0
    assert _run(bench, capsys, family=family, impl="ours", rows=-1)["rebuild"] < 1e-5


def test_transformer_lens_rows(bench, capsys):
    assert _run(bench, capsys, family="qwen3_next", impl="tl")["rebuild"] > 0.1  # the heuristic drops key removal
    granite = _run(bench, capsys, family="granitemoehybrid", impl="tl")
    assert granite["rebuild"] < 1e-4 and granite["max_abs_diff_vs_ours"] < 1e-4


def test_transformer_lens_falcon_h1_row_records_its_error(bench, capsys):
    """TL 4.3's ``compute_ssm_effective_attention`` looks up ``blocks.0.mixer.*``; the bridge names Falcon-H1's
    Mamba-2 branch ``mamba``, so the call raises and the benchmark row carries the exception's first line."""
    row = _run(bench, capsys, family="falcon_h1", impl="tl")
    assert set(row) == {"error"} and row["error"].startswith("raises ") and "blocks.0.mixer." in row["error"]
