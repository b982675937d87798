"""The claims driver's detector row (``gather_aggregate.studies.claims._named_heads``) says what the detector named,
including a Gather carried by an SSM layer's short convolution, and marks a model at chance as such."""

from __future__ import annotations

from gather_aggregate.studies.claims import _named_heads


def _summary(**kw):
    base = {"gather": [], "aggregate": [], "pairs": [], "evidence": [], "joint_drop": {}, "gather_conv": [],
            "reading": {"gather": "summary", "aggregate": "segment"},
            "margin": {"clean": -1.0, "chance": -2.0, "margin": 1.0}}
    return {**base, **kw}


def test_conv_gather_is_listed_beside_the_gather_heads():
    an = _summary(aggregate=[[0, 1], [0, 0]], evidence=[[0, 1, "joint"], [0, 0, "joint"]],
                  joint_drop={"aggregate": 1.23}, gather_conv=[0],
                  conv=[{"layer": 0, "loss": 1.686, "random_median": 0.001}, {"layer": 1, "loss": 0.0,
                                                                             "random_median": 0.0}])
    gather, aggregate, read, loss, pairs = _named_heads(an)
    assert gather == "conv L0 (1.69 vs 0.00)"
    assert aggregate == "[0, 1] joint, [0, 0] joint"
    assert read == "summary / segment" and loss == "aggregate 1.23" and pairs == "–"
    an = _summary(aggregate=[[1, 0]], evidence=[[1, 0, "alone"]], gather_conv=[0],  # named by sufficiency alone
                  conv=[{"layer": 0, "loss": 0.19, "random_median": float("nan"), "kept_loss": -0.02,
                         "kept_random_median": 1.79, "by": ["sufficiency"]}])
    assert _named_heads(an)[0] == "conv L0 (kept only at the read positions -0.02 vs 1.79)"
    an = _summary(gather=[[0, 2]], evidence=[[0, 2, "alone"]], gather_conv=[1])
    assert _named_heads(an)[0] == "[0, 2] alone, conv L1"


def test_a_model_at_chance_reads_as_such():
    assert _named_heads(_summary(margin={"clean": -2.0, "chance": -2.0, "margin": 0.01}))[2] == "– (at chance)"
    assert _named_heads(_summary())[0:3] == ["–", "–", "summary / segment"]  # retrieves, nothing named


def test_the_demo_names_a_conv_gather_without_a_gather_head():
    """The demo's circuit line reads "Gather layer 0's short convolution" where no head gathers (``bamba-ga``), and
    lists heads and convs together where both are named."""
    from gather_aggregate.report.demo_story import _circuit_section

    table = [{"layer": 1, "head": 0, "gather_mass": 0.1, "aggregate_on_correct": 0.9},
             {"layer": 0, "head": 2, "gather_mass": 0.8, "aggregate_on_correct": 0.1}]
    view = {"aggregate": (1, 0), "finding": "0.90 of the query row on the correct line"}
    g = {"gather": [], "gather_conv": [0], "aggregate": [[1, 0]], "evidence": [[1, 0, "alone"]], "joint_drop": {},
         "pairs": []}
    html = _circuit_section("bamba-ga", g, table, view).html
    assert "Gather layer 0's short convolution, Aggregate L1H0;" in html
    g = {**g, "gather": [[0, 2]], "evidence": [[1, 0, "alone"], [0, 2, "alone"]]}
    assert "Gather L0H2 + layer 0's short convolution, Aggregate L1H0;" in _circuit_section("m", g, table, view).html
    g = {**g, "gather": [], "gather_conv": []}
    assert "Gather none, Aggregate L1H0;" in _circuit_section("m", g, table, view).html
