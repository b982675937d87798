"""Group peeling (:func:`gather_aggregate.detect.causal_evidence.peel`) on circuits given as logic: a fake prober
whose retrieval is a boolean function of which heads are intact, so each of peeling's two contexts (the whole
group ablated, the head's layer's part of it) is tested on the circuit shape it is there for, and its limit stated."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gather_aggregate.detect.causal_evidence import KEEP_MIN, peel

Head = tuple[int, int]


class LogicProber:
    """``losses`` of zero-ablations: 0 where ``works(intact heads)``, 1 (retrieval at chance) where not."""

    def __init__(self, heads: Sequence[Head], works: Callable[[set[Head]], bool]):
        self.heads, self.works, self.calls = list(heads), works, 0

    def losses(self, ablations):
        self.calls += len(ablations)
        return [0.0 if self.works(set(self.heads) - set(ab)) else 1.0 for ab, _ in ablations]

    def loss(self, heads, where):
        return self.losses([(heads, where)])[0]


HEADS = [(la, h) for la in range(3) for h in range(4)]


def _peel(works, candidates):
    prober = LogicProber(HEADS, works)
    group, loss, give, _ = peel(prober, candidates, "query")
    return sorted(group), loss, give


def test_redundant_heads_in_parallel_are_all_kept():
    """Either of two heads (in different layers) is enough: each, restored alone, gives everything back."""
    group, loss, give = _peel(lambda up: (1, 0) in up or (2, 1) in up, [(1, 0), (2, 1), (2, 3)])
    assert group == [(1, 0), (2, 1)] and loss == 1.0
    assert give[(2, 3)] < KEEP_MIN <= min(give[(1, 0)], give[(2, 1)])


def test_two_stages_in_series_are_both_kept():
    """A first stage of two redundant heads in layer 1 feeds one head in layer 2: restored alone against the whole
    group, no head gives anything back (the other stage is still ablated); against its own layer's part, each does."""
    def works(up):
        return bool({(1, 0), (1, 2)} & up) and (2, 1) in up

    group, loss, give = _peel(works, [(1, 0), (1, 2), (2, 1), (2, 2)])
    assert group == [(1, 0), (1, 2), (2, 1)] and loss == 1.0
    assert give[(2, 2)] < KEEP_MIN


def test_heads_needed_together_keep_only_the_last_restored():
    """The limit, stated: three heads of one layer, each needed (any one missing costs everything).  Restoring one
    alone gives nothing back in either context, so peeling drops all but the last (documented in ``peel``)."""
    group, _, give = _peel(lambda up: {(1, 0), (1, 1), (1, 3)} <= up, [(1, 0), (1, 1), (1, 3), (1, 2)])
    assert group == [(1, 3)]
    assert give[(1, 0)] == give[(1, 1)] == give[(1, 2)] == 0.0


def test_heads_that_carry_nothing_are_all_peeled():
    group, loss, give = _peel(lambda up: True, [(0, 1), (1, 1), (2, 2)])
    assert group == [] and loss == 0.0 and max(give.values()) == 0.0
