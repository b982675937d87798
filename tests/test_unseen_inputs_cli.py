"""The command line as a newcomer types it: every subcommand's ``--help`` works, and missing or contradictory options
exit non-zero with one line and no traceback, before any model loads (checkpoints, hybridise, lm-eval's model and
the Ray path: ``test_unseen_inputs.py``)."""

from __future__ import annotations

import pytest

from gather_aggregate.cli.parser import COMMANDS, main


def _run(argv, capsys):
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse: --help (0) and option errors (2)
        rc = exc.code
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("argv", [[name, "--help"] for name in COMMANDS] + [["zoo", "list", "--help"],
                                                                            ["zoo", "train", "--help"], ["--help"]])
def test_every_subcommand_answers_help(argv, capsys):
    rc, out, err = _run(argv, capsys)
    assert rc == 0 and out.startswith("usage: gather-aggregate") and "Traceback" not in err


@pytest.fixture
def no_model_loads(monkeypatch):
    import gather_aggregate.models.loading as loading

    def never(*a, **k):
        raise AssertionError("a model loaded before the options were checked")

    monkeypatch.setattr(loading, "load_model", never)


@pytest.mark.parametrize("argv, needle", [
    # an estimate is one pass of gradients: --ray and --resume were ignored silently (rc 0)
    (["scan", "--model", "llama-kvmc", "--mode", "atp", "--ray"], "--ray applies to the exact scan only"),
    (["scan", "--model", "llama-kvmc", "--mode", "ig", "--resume"], "--resume applies to the exact scan only"),
    # lm-eval's numbers: -1 was islice's ValueError after the model loaded, -2 few-shot examples ran, 0 reference
    # prompts were accepted; each is now refused by the parser
    (["lm-eval", "--model", "llama-kvmc", "--limit", "-1"], "--limit must be a positive count"),
    (["lm-eval", "--model", "llama-kvmc", "--num-fewshot", "-2"], "--num-fewshot=-2: use a whole number of at least 0"),
    (["lm-eval", "--model", "llama-kvmc", "--n-reference", "0"], "--n-reference=0: use a whole number of at least 1"),
    (["lm-eval", "--model", "llama-kvmc", "--batch-size", "x"], "--batch-size='x': pass a whole number"),
    # a missing task folder was "unknown lm-eval task(s): 'ga_mmlu_letter' (did you mean 'global_mmlu_pt_other'?)",
    # a bad format was found after the model loaded
    (["lm-eval", "--model", "llama-kvmc", "--include-path", "/nope"], "--include-path '/nope' is not a folder"),
    (["lm-eval", "--model", "llama-kvmc", "--formats", "poem"], "--formats 'poem': use completion and/or chat"),
    # memory: state size 0 was read as "the head dimension"; --d-states alone, an empty --lengths and --keep on
    # models that are no Llama printed a table without what was asked
    (["memory", "--model", "llama-kvmc", "--keep", "2", "--d-states", "0"], "--d-states takes SSM state sizes >= 1"),
    (["memory", "--model", "llama-kvmc", "--d-states", "8"], "--d-states sizes the hybrids that --keep lists"),
    (["memory", "--model", "llama-kvmc", "--lengths", ""], "no --lengths given"),
    (["memory", "--model", "mamba2-ga", "--keep", "2"], "none of mamba2-ga is one"),
])
def test_options_that_ask_for_nothing_or_contradict_are_one_line(argv, needle, capsys, no_model_loads):
    rc, out, err = _run(argv, capsys)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert needle in lines[0], lines[0]


def test_memory_takes_the_comma_list_its_help_promises(tiny_llama_dir, capsys):
    """Was "'DIR,mamba2-ga' has no config.json": the list was read as one name."""
    rc, out, err = _run(["memory", "--model", f"{tiny_llama_dir},mamba2-ga", "--lengths", "16"], capsys)
    assert rc == 0, err
    assert str(tiny_llama_dir) in out and "mamba2-ga" in out


@pytest.mark.slow  # lm-eval indexes its ~14k task names (about 25 s here)
def test_lm_eval_names_an_unknown_task_before_the_model_loads(capsys, no_model_loads, tmp_path):
    """Was checked only after the model loaded (minutes for a 7B model)."""
    pytest.importorskip("lm_eval", reason="needs the lmeval extra")
    rc, out, err = _run(["lm-eval", "--model", "llama-kvmc", "--tasks", "arc_easyy", "--out", str(tmp_path)], capsys)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "did you mean 'arc_easy'" in lines[0], err
