"""Issue 7: every subcommand runs on a tiny config model and writes its outputs; errors are one line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from gather_aggregate.cli.parser import main


@pytest.fixture(scope="module")
def results(tiny_llama_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "study"  # issue 39: every step of one study writes into its folder
    common = ["--model", str(tiny_llama_dir), "--task", "kv", "--n", "6", "--dict-size", "4", "--seed", "1"]
    for cmd in (["eval"], ["scan"], ["detect", "--reading", "summary"], ["ablate", "--heads", "1.0,1.2"],
                ["pattern", "--layer", "1"]):
        assert main([*cmd, *common, "--out", str(out)]) == 0
    return out


def test_eval_writes_accuracy(results):
    data = json.loads((results / "eval.json").read_text())
    assert data["meta"]["n"] == 6 and 0.0 <= data["meta"]["accuracy"] <= 1.0 and len(data["rows"]) == 6


def test_scan_writes_a_ranked_table(results):
    data = json.loads((results / "scan.json").read_text())
    assert data["meta"]["complete"] is True
    assert sorted(r["rank"] for r in data["rows"]) == list(range(1, 9))
    assert (results / "scan.csv").read_text().startswith("layer,head,kind,score")


def test_detect_and_ablate_and_pattern(results):
    det = json.loads((results / "detect.json").read_text())
    assert {"gather", "aggregate", "aggregate_hit", "ablation_drop", "role", "evidence", "rule", "gather_alone",
            "aggregate_alone"} <= set(det["rows"][0])
    assert det["meta"]["reading"] == {"gather": "summary", "aggregate": "segment"}  # --reading summary
    assert all(r["evidence"] in ("alone", "joint") for r in det["rows"] if r["role"])
    assert all(r["rule"] for r in det["rows"])  # every decision explained
    # the Aggregate gate's numbers: the rank at the slot and what a random ranking scores
    assert {"aggregate_selectivity", "aggregate_slot_first", "aggregate_slot_chance"} <= set(det["rows"][0])
    assert all(0.0 <= r["aggregate_slot_first"] <= 1.0 for r in det["rows"])  # a share of prompts
    assert all(0.0 < r["aggregate_slot_chance"] <= 0.5 for r in det["rows"])  # 1 / segments, at least two
    assert det["meta"]["gather_conv"] == [] and det["meta"]["conv"] == []  # a transformer has no short conv
    abl = json.loads((results / "ablate.json").read_text())["rows"]
    assert abl[0]["head_list"] == [[1, 0], [1, 2]] and abl[0]["task"] == "kv" and 0 <= abl[0]["ablated"] <= 1
    pat = json.loads((results / "pattern.json").read_text())["meta"]
    assert len(pat["pattern"]) == 4 and len(pat["pattern"][0]) == len(pat["tokens"])


def test_detect_does_not_reuse_a_scan_of_other_prompts(results, tiny_llama_dir, tmp_path, capsys):
    """A scan.json left in --out by another seed and prompt count is neither reused nor discarded: refused in one
    line naming the fix, and left as it was."""
    import shutil

    shutil.copy(results / "scan.json", tmp_path / "scan.json")  # seed 1, 6 prompts
    before = (tmp_path / "scan.json").read_text()
    args = ["detect", "--model", str(tiny_llama_dir), "--task", "kv", "--n", "5", "--dict-size", "4", "--seed", "2"]
    assert main([*args, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # (after transformers' loading bar, in a test)
    assert err.startswith("gather-aggregate detect: error: ") and "another number of prompts (6, here 5)" in err
    assert "--fresh" in err and (tmp_path / "scan.json").read_text() == before


def test_report_from_results(results):
    assert main(["report", str(results)]) == 0
    html = (results / "report.html").read_text()
    assert "head scan" in html and "head scores" in html and "<script" in html
    # issue 25: results say which model they are from, heads read L0H2, no Python reprs
    model = os.path.basename(json.loads((results / "meta.json").read_text())["model_name"])
    assert f"{model} · kv: head scan" in html and f"{model} · kv: accuracy" in html and "L1H0 L1H2" in html
    text = re.sub(r"<script.*?</script>", "", html, flags=re.S)
    assert not re.search(r"\[\[\d|\(\d+, \d+\)|\{'|\{\}", text)
    assert not re.search(r"<(script|link)[^>]+(src|href)=[\"']https?:", html)  # JS inlined, nothing fetched


def test_report_names_a_result_file_it_cannot_read(tmp_path, capsys):
    (tmp_path / "scan.json").write_text('{"meta": {}, "rows": [{"x": 1}]}')  # was "error (KeyError): 'layer'"
    assert main(["report", "--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "report: error: scan.json is not a scan result" in err
    assert "rerun the subcommand that wrote it" in err


def test_zoo_list(capsys):
    from gather_aggregate.zoo import list_zoo

    assert main(["zoo", "list"]) == 0
    assert capsys.readouterr().out.split() == [w for name, path in list_zoo().items() for w in (name, str(path))]


def _cli(*argv, env_extra=None):
    env = {k: v for k, v in os.environ.items()  # an in-process main() above set the quiet defaults
           if k not in ("HF_HUB_DISABLE_PROGRESS_BARS", "TRANSFORMERS_VERBOSITY")}
    env = {**env, "HF_HUB_OFFLINE": "1", **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "gather_aggregate.cli.parser", *argv], capture_output=True, text=True, env=env)


@pytest.mark.parametrize("argv,needle", [
    (["eval", "--model", "/no/such/model"], "no such model directory"),
    (["eval", "--model", "llama-kvm"], "did you mean the zoo model 'llama-kvmc'"),
    (["eval", "--model", "TINY", "--device", "banana"], "unknown device 'banana'"),
    (["eval", "--model", "TINY", "--device", "cuda"], "no CUDA"),
    (["eval", "--model", "TINY", "--task", "nonsense"], "unknown task 'nonsense'; choose one of kv"),
    (["eval", "--model", "TINY", "--out", "/proc/forbidden"], "writable"),
    (["ablate", "--model", "TINY", "--heads", "9.9"], "out of range"),
])
def test_errors_are_one_line_with_the_fix(argv, needle, tiny_llama_dir):
    import torch

    if "cuda" in argv and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    argv = [str(tiny_llama_dir) if a == "TINY" else a for a in argv]
    out = _cli(*argv)
    assert out.returncode == 2, out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("gather-aggregate")]
    assert len(lines) == 1 and needle in lines[0], out.stderr
    assert "Traceback" not in out.stderr
    if "unknown task" not in needle:  # option values are refused by the parser, before anything runs
        debug = _cli(*argv, "--debug")
        assert "Traceback" in debug.stderr


@pytest.mark.skipif(not __import__("gather_aggregate.zoo", fromlist=["list_zoo"]).list_zoo(),
                    reason="the toy zoo is not shipped in this checkout")
def test_demo_on_a_zoo_model_writes_report_and_summary(tmp_path, capsys):
    from gather_aggregate.zoo import list_zoo

    name = next(iter(list_zoo()))
    assert main(["demo", "--model", name, "--fast", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["models"] == [name] and summary["scan_task"] in ("kv", "letter-mc")
    assert set(summary["accuracy"][name]) == {"kv", "letter-mc", "content-mc", "knowledge"}
    assert [r["k"] for r in summary["cumulative_ablation"][name]] == [0, 1, 2, 4]
    ga = summary["ga_heads"][name]
    assert {"gather", "aggregate", "pairs", "reading", "evidence", "joint_drop", "groups", "decisions"} <= set(ga)
    assert all(d["rule"] for d in ga["decisions"])  # every head's decision explained
    why = {(la, h): ev for la, h, ev in ga["evidence"]}
    assert {tuple(hd) for hd in ga["gather"] + ga["aggregate"]} == set(why) and set(why.values()) <= {"alone", "joint"}
    assert all(g[0] < a[0] for g, a in ga["pairs"])
    html = (tmp_path / "report.html").read_text()
    assert f"{name}: the circuit" in html and "ga-circuit" in html
    assert "<html" in html.lower() and name in html and '<script src="http' not in html  # self-contained
    assert (tmp_path / f"scan_{name}.json").is_file()
    printed = capsys.readouterr().out
    assert "accuracy on 24 prompts per task (seed 0)" in printed
    # the console tables fit their columns: every row of a table is as wide as its header or narrower
    acc = printed.split("accuracy on")[1].split("\n\n")[0].splitlines()[1:]
    assert len({ln.index("kv") for ln in acc[:1]}) == 1 and all(len(ln) <= len(acc[0]) + 1 for ln in acc)
    if not ga["aggregate"]:
        assert "no Aggregate head named" in printed


# ---- issue 25: options, quiet output, CSV twins -------------------------------------------------------------
@pytest.mark.parametrize("argv,needle", [
    (["eval", "--model", "M", "--dict-size", "0"], "--dict-size must be at least 1, got 0"),
    (["scan", "--model", "M", "--workers", "0"], "--workers must be at least 1, got 0"),
    (["detect", "--model", "M", "--reading", "nowhere"], "reading must be 'auto', 'summary', 'last', 'last-K'"),
    (["pattern", "--model", "M", "--layer", "-1"], "--layer must be at least 0, got -1"),
    (["ablate", "--model", "M", "--heads", "a,b"], "cannot read head 'a'"),
    (["scan", "--model", "M", "--resume", "--fresh"], "argument --fresh: not allowed with argument --resume"),
    (["scan", "--model", "M", "--n", "0"], "--n must be at least 1"),
    (["eval", "--task", "kv"], "the following arguments are required: --model"),
    (["zoo", "train", "--arch", "mamba"], "invalid choice: 'mamba'"),
    (["pattern", "--model", "M", "--heads", ","], "no head indices given"),  # was every head, silently
    (["demo", "--n", "1000"], "--n must be at most 64, got 1000"),  # was clamped to 64, silently
])
def test_option_values_are_checked_before_any_model_loads(argv, needle):
    # M does not exist: the error must be about the option, found before any loading
    out = _cli(*argv)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "--help" in lines[0], out.stderr


def test_each_subcommand_lists_only_its_own_options():
    import gather_aggregate.cli.parser as cli
    from gather_aggregate.attribution.estimators import ESTIMATORS
    from gather_aggregate.cli.parser import build_parser
    from gather_aggregate.tasks.registry import TASK_NAMES
    from gather_aggregate.training.train_args import ARCHS

    assert tuple(cli.TASKS) == tuple(TASK_NAMES)
    assert cli.MODES == ("exact", *ESTIMATORS)  # the CLI spells them out so that parsing needs no torch
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, __import__("argparse")._SubParsersAction)).choices

    def options(name):
        return {o for a in sub[name]._actions for o in a.option_strings}

    assert "--model" not in options("report") and "--task" not in options("report")
    assert "--z" not in options("eval") and "--layer" not in options("scan") and "--heads" not in options("eval")
    assert "--reading" in options("detect") and "--z" not in options("detect")  # the detector has no z setting
    assert {"--layer", "--prompt"} <= options("pattern") and {"--ray", "--workers"} <= options("scan")
    for name, p in sub.items():
        for a in p._actions:
            assert a.help or not a.option_strings, (name, a.option_strings)  # every option has a help text
    assert "comma list" in sub["demo"].format_help()
    assert "default ga_out/<model>-<task>" in " ".join(sub["eval"].format_help().split())  # the study folder
    zoo_help = " ".join(sub["zoo"].format_help().split())
    assert "--arch {" + ",".join(ARCHS) + "}" in zoo_help and "--steps" in zoo_help
    for name, p in sub.items():  # an empty default is not shown as "(default: )"; a zero one is
        assert "(default: )" not in p.format_help(), name
    assert "(default: 0)" in " ".join(sub["eval"].format_help().split())
    from gather_aggregate.zoo import DEMO_SKIP

    assert all(name in " ".join(sub["demo"].format_help().split()) for name in DEMO_SKIP)  # what demo leaves out


def test_quiet_by_default_and_verbose_shows_loading_bars(tiny_llama_dir, tmp_path):
    argv = ["eval", "--model", str(tiny_llama_dir), "--n", "2", "--dict-size", "2", "--out", str(tmp_path)]
    quiet = _cli(*argv)
    assert quiet.returncode == 0, quiet.stderr
    assert "Loading weights" not in quiet.stderr
    loud = _cli(*argv, "-v")
    assert loud.returncode == 0 and "Loading weights" in loud.stderr


def test_eval_ablate_pattern_write_csv_twins_and_pattern_says_which_prompt(results, capsys, tiny_llama_dir):
    import csv

    ev = json.loads((results / "eval.json").read_text())
    rows = list(csv.DictReader((results / "eval.csv").open()))
    assert len(rows) == ev["meta"]["n"] == 6 and [r["correct"] for r in rows] == [str(e["correct"]) for e in ev["rows"]]
    abl = list(csv.DictReader((results / "ablate.csv").open()))
    assert abl[0]["task"] == "kv" and abl[0]["heads"] == "L1H0 L1H2"
    pat = json.loads((results / "pattern.json").read_text())["meta"]
    assert pat["prompt_index"] == 0 and pat["prompt"].startswith("Memorize")
    cells = list(csv.DictReader((results / "pattern.csv").open()))
    n = len(pat["tokens"])
    assert len(cells) == len(pat["heads"]) * n * (n + 1) // 2
    out = str(results / "pattern2")
    assert main(["pattern", "--model", str(tiny_llama_dir), "--n", "3", "--prompt", "2", "--layer", "1",
                 "--out", out]) == 0
    assert "pattern of prompt 2 of 3 (kv, seed 0" in capsys.readouterr().out
    assert main(["pattern", "--model", str(tiny_llama_dir), "--n", "3", "--prompt", "3", "--out", out]) == 2


def test_scan_with_a_prompt_coreset(tiny_llama_dir, tmp_path, capsys):
    """--exact-prompts K: the estimate corrected by K exact prompts (recorded in the table); K = n gives the exact
    scan's scores; with a mode that has no per-prompt estimates it is one line naming the modes that do."""
    common = ["--model", str(tiny_llama_dir), "--task", "kv", "--n", "3", "--dict-size", "4", "--seed", "1"]
    assert main(["scan", *common, "--out", str(tmp_path / "exact")]) == 0
    assert main(["scan", *common, "--mode", "atp-softmax", "--exact-prompts", "3", "--out", str(tmp_path / "c")]) == 0
    rows = json.loads((tmp_path / "exact" / "scan.json").read_text())["rows"]
    exact = {(r["layer"], r["head"]): r["score"] for r in rows}
    data = json.loads((tmp_path / "c" / "scan.json").read_text())
    assert sorted(data["meta"]["exact_prompts"]) == [0, 1, 2]
    for r in data["rows"]:
        assert r["score"] == pytest.approx(exact[(r["layer"], r["head"])], abs=1e-5)
    assert main(["scan", *common, "--mode", "ig", "--exact-prompts", "2", "--out", str(tmp_path / "bad")]) == 2
    assert "use it with --mode atp, atp-softmax or atp*-softmax" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()  # refused before anything is written
