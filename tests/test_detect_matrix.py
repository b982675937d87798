"""Issue 19: the detector names exactly the planted Gather and Aggregate heads across the planted-circuit matrix
(heads per layer, heads per role, a key-mover, read position, depth, attention/SSM/delta-rule heads, two Aggregate
stages in series); a fast subset by default (the first four configurations, the first two with delta-rule heads, and
the first with stages in series of each kind the detector gets exactly: a relay that only feeds the later stage, and
one that also writes to the output)."""

from __future__ import annotations

import pytest
from planted_matrix import configs, run, world

CONFIGS = configs()
FAST = 4
DELTA = [c for c in CONFIGS if c["kind"] == "delta"]
DELTA_FAST = 2
SERIAL = [c for c in CONFIGS if c.get("n_relay")]
# Serial configurations the detector does not get exactly (docs/results_fixtures.md, measured by
# ``tests/planted_matrix.py``).  Gather heads needed together: where a relay only feeds the later stage, whose score
# is quadratic in the gathered content, losing one of two or more Gather heads takes retrieval to chance, so peeling
# (restoring one alone) keeps only the last.  Pairs: the same configurations, and four redundant relays whose
# corrupted outputs outweigh the one restored.
NEEDED_TOGETHER = "Gather heads needed together: peeling keeps only the last restored"
MISSED = {72: NEEDED_TOGETHER, 76: NEEDED_TOGETHER, 80: NEEDED_TOGETHER, 82: NEEDED_TOGETHER,
          74: "G→relay pairs 0.00 in both contexts: four redundant relays, the others' corrupted outputs outweigh "
              "the one restored",
          77: "G→later-stage pairs 0.00 in both contexts (G→relay 2.33): the later stage's score is quadratic in "
              "what the two Gather heads write, so restoring one path with the other Gather ablated gives nothing"}
# the first serial configuration of each variant the detector gets exactly: a relay feeding the later stage only,
# and one also writing to the output
SERIAL_FAST = [next(c for c in SERIAL if c["seed"] not in MISSED and bool(c["relay_out"]) == out) for out in (0, 1)]
FAST_SET = CONFIGS[:FAST] + DELTA[:DELTA_FAST] + SERIAL_FAST


@pytest.fixture(scope="module")
def tiny_world():
    return world()


def _check(cfg, tiny_world, exact=True):
    """The named heads and pairs are exactly the planted ones (``exact=False``: no head is named that was not
    planted, and every planted Aggregate head is named)."""
    r = run(cfg, *tiny_world)
    assert r["margin"] > 1.0, r  # the planted model really retrieves
    if exact:
        assert r["gather"] == r["gather_true"] and r["aggregate"] == r["aggregate_true"], r
        assert r["pairs_ok"], r
    else:
        assert r["fp"] == 0 and r["aggregate"] == r["aggregate_true"], r


@pytest.mark.parametrize("cfg", CONFIGS[:FAST], ids=lambda c: f"cfg{c['seed']}")
def test_planted_matrix_fast(cfg, tiny_world):
    _check(cfg, tiny_world)


@pytest.mark.parametrize("cfg", DELTA[:DELTA_FAST], ids=lambda c: f"cfg{c['seed']}")
def test_planted_matrix_delta_fast(cfg, tiny_world):
    """Delta-rule heads: most of each row's |mass| lies off the segments, so the pattern gates must not read the
    mass against the whole row (issue 42)."""
    _check(cfg, tiny_world)


@pytest.mark.parametrize("cfg", SERIAL_FAST, ids=lambda c: f"cfg{c['seed']}")
def test_planted_matrix_serial_fast(cfg, tiny_world):
    """Two Aggregate stages in series: restored alone against the whole group neither stage gives anything back
    (the other is still ablated), so peeling also measures each head against its own layer's part of the group."""
    _check(cfg, tiny_world)


@pytest.mark.slow
@pytest.mark.parametrize("cfg", [c for c in CONFIGS if c not in FAST_SET], ids=lambda c: f"cfg{c['seed']}")
def test_planted_matrix_slow(cfg, tiny_world):
    _check(cfg, tiny_world, exact=cfg["seed"] not in MISSED)


@pytest.mark.slow
@pytest.mark.parametrize("cfg", [pytest.param(c, marks=pytest.mark.xfail(strict=True, reason=MISSED[c["seed"]]))
                                 for c in CONFIGS if c["seed"] in MISSED], ids=lambda c: f"cfg{c['seed']}")
def test_planted_matrix_missed(cfg, tiny_world):
    _check(cfg, tiny_world)
