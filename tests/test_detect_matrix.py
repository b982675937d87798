"""Issue 19: the detector names exactly the planted Gather and Aggregate heads across the planted-circuit matrix
(heads per layer, heads per role, a key-mover, read position, depth, attention/SSM); a fast subset by default."""

from __future__ import annotations

import pytest
from planted_matrix import configs, run, world

CONFIGS = configs()
FAST = 4


@pytest.fixture(scope="module")
def tiny_world():
    return world()


def _check(cfg, tiny_world):
    r = run(cfg, *tiny_world)
    assert r["margin"] > 1.0, r  # the planted model really retrieves
    assert r["gather"] == r["gather_true"] and r["aggregate"] == r["aggregate_true"], r
    assert r["pairs_ok"], r


@pytest.mark.parametrize("cfg", CONFIGS[:FAST], ids=lambda c: f"cfg{c['seed']}")
def test_planted_matrix_fast(cfg, tiny_world):
    _check(cfg, tiny_world)


@pytest.mark.slow
@pytest.mark.parametrize("cfg", CONFIGS[FAST:], ids=lambda c: f"cfg{c['seed']}")
def test_planted_matrix_slow(cfg, tiny_world):
    _check(cfg, tiny_world)
