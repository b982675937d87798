"""Issue 23: the hybrid sweep and hybrid shipped with the zoo, their figure, and the demo/report section."""

from __future__ import annotations

import json

import pytest

from gather_aggregate.studies.hybrids.shipped import (
    DEMO_HYBRID,
    SWEEP_FILE,
    recovery,
    recovery_text,
    shipped_hybrids,
    shipped_sweep,
    sweep_from_dir,
    table_rows,
)

pytestmark = pytest.mark.skipif(not SWEEP_FILE.is_file() or DEMO_HYBRID not in shipped_hybrids(),
                                reason="the hybrid sweep is not shipped")


def _row(name, strategy, k, kv, seed=0, d_state=32, kept=None):
    return {"name": name, "strategy": strategy, "k": k, "seed": seed, "d_state": d_state,
            "kept": kept if kept is not None else [[0, i] for i in range(k)], "kv": kv, "letter_mc": 0.5,
            "content_mc": 1.0, "knowledge": 1.0, "ppl": 2.0}


SYNTH = {"teacher": "t", "n_heads": 16, "d_head": 32, "eval_n": 8, "eval_seed": 0, "rows": [
    {"name": "teacher", "strategy": "teacher", "k": 16, "kv": 0.9, "letter_mc": 1.0, "content_mc": 1.0,
     "knowledge": 1.0, "ppl": 1.0},
    _row("none-k0-s0-N32", "none", 0, 0.1),
    _row("scan-k1-s0-N32", "scan", 1, 0.5), _row("scan-k2-s0-N32", "scan", 2, 0.86),  # 0.86 >= 0.95 * 0.9
    _row("scan-k2-s0-N8", "scan", 2, 0.2, d_state=8),
    _row("random-k2-s0-N32", "random", 2, 0.1), _row("random-k4-s0-N32", "random", 4, 0.85),  # 0.85 < 0.855
    _row("random-k2-s1-N32", "random", 2, 0.9, seed=1)]}


def test_recovery_is_the_fewest_heads_reaching_95_percent_of_the_teacher():
    got = {e["series"]: (e["k"], e["fraction"], e["largest_k"]) for e in recovery(SYNTH)}
    assert got == {"scan": (2, 2 / 16, 2), "random (seed 0)": (None, None, 4), "random (seed 1)": (2, 2 / 16, 2)}
    assert recovery_text(SYNTH) == "random (seed 1) 2/16, scan 2/16, random (seed 0) not within k <= 4"


def test_table_rows_are_the_sweep_rows():
    rows = table_rows(SYNTH)
    assert [r["hybrid"] for r in rows] == ["none", "scan", "random (seed 0)", "random (seed 1)", "scan",
                                          "scan, N = 8", "random (seed 0)", "teacher"]
    assert [(r["k"], r["kv"]) for r in rows] == [(0, 0.1), (1, 0.5), (2, 0.1), (2, 0.9), (2, 0.86), (2, 0.2),
                                                 (4, 0.85), (16, 0.9)]
    assert rows[-1]["attention heads"] == "all" and rows[0]["attention heads"] == "-"


def test_figure_draws_every_measured_point_from_k0():
    from gather_aggregate.viz.hybrids import hybrid_kv_curve

    fig = hybrid_kv_curve(SYNTH, chance=1 / 12)
    traces = {t.name: list(zip(t.x, t.y, strict=True)) for t in fig.data}
    assert traces == {"scan": [(0, 0.1), (1, 0.5), (2, 0.86)], "random (seed 0)": [(0, 0.1), (2, 0.1), (4, 0.85)],
                      "random (seed 1)": [(0, 0.1), (2, 0.9)], "scan, N = 8": [(2, 0.2)]}  # no k = 0 at N = 8
    assert sorted(s.y0 for s in fig.layout.shapes) == [pytest.approx(1 / 12), 0.9]  # chance, teacher


def test_sweep_from_dir_keeps_the_rows_and_reads_the_geometry(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps([{**r, "final_loss": {"orientation": 1.0}}
                                                       for r in SYNTH["rows"]]))
    (tmp_path / "none-k0-s0-N32" / "model").mkdir(parents=True)
    (tmp_path / "none-k0-s0-N32" / "model" / "config.json").write_text(
        json.dumps({"n_layers": 4, "n_heads": 4, "d_head": 32}))
    sweep = sweep_from_dir(tmp_path, "t", eval_n=8)
    assert (sweep["n_heads"], sweep["d_head"], sweep["teacher"]) == (16, 32, "t")
    assert sweep["rows"] == SYNTH["rows"]  # bookkeeping (final_loss) dropped, everything measured kept


def test_the_sweep_writer_and_the_figure_script_answer_help_and_a_wrong_directory(tmp_path, capsys):
    """docs/hybrids.md names both commands. `--help` was a NotADirectoryError traceback for the writer and, for the
    figure script, a PNG written to a file named '--help'; a directory without results.json was a traceback."""
    import subprocess
    import sys
    from pathlib import Path

    from gather_aggregate.studies.hybrids.shipped import main

    before = SWEEP_FILE.read_bytes()
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0 and "sweep_dir" in capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        main([str(tmp_path)])
    assert done.value.code == 2 and "no results.json in" in capsys.readouterr().err
    assert SWEEP_FILE.read_bytes() == before  # the shipped file is untouched
    script = Path(__file__).resolve().parents[1] / "scripts" / "hybrid_figure.py"
    run = subprocess.run([sys.executable, str(script), "--help"], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0 and "usage" in run.stdout and list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def hybrid():
    from gather_aggregate import load_model

    return load_model(shipped_hybrids()[DEMO_HYBRID])


def test_shipped_hybrid_reproduces_its_recorded_accuracies(hybrid):
    """The shipped hybrid loads with load_model and measures, on the sweep's own prompts, what the sweep recorded."""
    from gather_aggregate.cli.demo_hybrids import kept_heads
    from gather_aggregate.studies import claims
    from gather_aggregate.zoo import zoo_path

    sweep = shipped_sweep()
    row = next(r for r in sweep["rows"] if r["name"] == sweep["shipped"][DEMO_HYBRID])
    assert sorted(kept_heads(hybrid.cfg)) == sorted(row["kept"]) and hybrid.cfg.d_state == row["d_state"]
    teacher_dir = zoo_path(sweep["teacher"])
    acc = claims.accuracies(hybrid, claims.task_sets(hybrid, teacher_dir, sweep["eval_n"], seed=sweep["eval_seed"]))
    assert {t: round(a, 4) for t, a in acc.items()} == {
        "kv": row["kv"], "letter-mc": row["letter_mc"], "content-mc": row["content_mc"], "knowledge": row["knowledge"]}


def test_demo_section_shows_the_shipped_table_and_the_live_hybrid(tmp_path, hybrid):
    from gather_aggregate.cli.demo_hybrids import hybrid_demo, hybrid_lines, hybrid_sections
    from gather_aggregate.hybridise import hybridise
    from gather_aggregate.report.html import Table, write_report
    from gather_aggregate.studies import claims
    from gather_aggregate.zoo import zoo_path

    sweep = shipped_sweep()
    teacher = hybridise(zoo_path(sweep["teacher"]), "all")  # the teacher itself (its logits equal HF's, tested)
    sets = {sweep["teacher"]: claims.task_sets(teacher, zoo_path(sweep["teacher"]), 8, seed=3)}
    acc = {sweep["teacher"]: claims.accuracies(teacher, sets[sweep["teacher"]])}
    assert hybrid_demo({"other": teacher}, {"other": sets[sweep["teacher"]]}, {"other": acc[sweep["teacher"]]}) is None
    h = hybrid_demo({sweep["teacher"]: teacher}, sets, acc)
    assert h is not None
    again = claims.accuracies(hybrid, sets[sweep["teacher"]])
    assert h["accuracy"] == again  # the live numbers are the hybrid's own on the teacher's demo prompts

    lines = hybrid_lines(h, 8, 3)
    for r in table_rows(sweep):  # every shipped row is printed with its numbers
        assert any(line.split()[:1] == r["hybrid"].split()[:1] and f"{r['kv']:.3f}" in line
                   and r["attention heads"] in line for line in lines), r
    live = lines[-1].split()
    assert [float(x) for x in live[-4:]] == [round(h["accuracy"][t], 3) for t in claims.TASKS]

    sections = hybrid_sections(h, {"kv": 1 / 12}, 8)
    tables = [s for s in sections if isinstance(s, Table)]
    assert tables[0].rows == table_rows(sweep)
    assert [r["kv"] for r in tables[1].rows] == [round(h["accuracy"]["kv"], 3), round(acc[sweep["teacher"]]["kv"], 3)]
    html = write_report(tmp_path / "r.html", title="hybrids", sections=sections).read_text()
    assert "Retrieval-guided hybrids of llama-kvmc" in html and "A shipped hybrid, evaluated in this run" in html
