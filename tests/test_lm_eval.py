"""lm-evaluation-harness integration, run for real and offline on the task folder shipped in tests/data/lm_eval.

The folder was written by ``python -m gather_aggregate.lm_eval.export llama-kvmc tests/data/lm_eval --n 64``
(test_shipped_tasks_match_export checks it still is): MMLU-format questions from the zoo's facts (letter and
content), KV retrieval (choice and greedy generation), knowledge, a perplexity task and the real MMLU sample.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

pytest.importorskip("lm_eval", reason="needs the lmeval extra (pip install -e '.[lmeval]'; `make test` installs it)")

import torch  # noqa: E402

from gather_aggregate.core.errors import InputError, UnknownTokenWarning  # noqa: E402
from gather_aggregate.zoo import zoo_path  # noqa: E402

TASKS = Path(__file__).parent / "data" / "lm_eval"
ZOO = "llama-kvmc"


def _evaluate(model, tasks, limit, **kw):
    import lm_eval
    from lm_eval.tasks import TaskManager

    kw.setdefault("log_samples", True)
    return lm_eval.simple_evaluate(model=model, tasks=tasks, task_manager=TaskManager(include_path=str(TASKS)),
                                   limit=limit, bootstrap_iters=0, verbosity="ERROR", **kw)


@pytest.fixture(scope="module")
def lm():
    from gather_aggregate.lm_eval.model import GatherAggregateLM

    torch.set_num_threads(1)
    return GatherAggregateLM(pretrained=ZOO)


def _responses(res, task):
    return [[float(r[0]) if isinstance(r, (list, tuple)) else r for r in s["filtered_resps"]]
            for s in sorted(res["samples"][task], key=lambda s: s["doc_id"])]


def test_import_does_not_load_lm_eval():
    code = ("import sys, gather_aggregate, gather_aggregate.lm_eval, gather_aggregate.lm_eval.spec;"
            "print(any(m.startswith('lm_eval') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_parse_heads_formats_and_errors():
    from gather_aggregate.lm_eval.spec import parse_heads, parse_layers

    assert parse_heads("L16H22;L17H24") == [(16, 22), (17, 24)]
    assert parse_heads("16.22;17.24") == parse_heads("l16h22, 17.24") == [(16, 22), (17, 24)]
    assert parse_heads("") == [] and parse_layers("3;2") == [3, 2] and parse_layers(3) == [3]
    with pytest.raises(InputError, match="L16H20"):
        parse_heads(16.2)  # lm-eval reads ablate=16.20 as a float
    with pytest.raises(InputError, match="cannot read head"):
        parse_heads("16-22")


def test_unablated_equals_lm_eval_hf_model(lm):
    """Same checkpoint, same tasks: every response (log-likelihoods, generations, perplexities) equals --model hf."""
    tasks = ["ga_mmlu_letter", "ga_mmlu_content", "ga_kv", "ga_knowledge", "ga_facts_ppl", "ga_kv_gen"]
    ours = _evaluate(lm, tasks, 4)
    hf = _evaluate("hf", tasks, 4, model_args=f"pretrained={zoo_path(ZOO)},dtype=float32", device="cpu",
                   batch_size=8)
    for task in tasks:
        a, b = _responses(ours, task), _responses(hf, task)
        assert len(a) == len(b) == 4
        for ra, rb in zip(a, b, strict=True):
            if isinstance(ra[0], str):
                assert ra == rb, task
            else:
                assert torch.allclose(torch.tensor(ra), torch.tensor(rb), atol=1e-4, rtol=1e-5), task
        for key, value in hf["results"][task].items():
            if "," in key and "stderr" not in key:
                assert ours["results"][task][key] == pytest.approx(value, rel=1e-5), (task, key)


@pytest.mark.parametrize("args", [{"ablate": "L0H2;L1H0", "method": "mean"}, {"ablate": "0.2", "method": "resample"},
                                  {"keep": "L0H2;L1H0;L1H1;L1H2;L1H3", "prune": "3"}])
def test_ablated_equals_project_evaluate(lm, args):
    """lm-eval accuracy under an intervention == the project's evaluate with the same hooks on the same prompts."""
    from gather_aggregate.lm_eval.intervention import Intervention
    from gather_aggregate.tasks import evaluate, get_task

    ablated = lm.with_intervention(Intervention.from_args(**args))  # keep-only + pruning: both in one run
    res = _evaluate(ablated, ["ga_kv"], 8)
    rows = json.loads((TASKS / "ga_kv.json").read_text())[:8]
    examples = get_task("kv", model_dir=zoo_path(ZOO)).examples(lm.tokenizer, n=64, seed=0)[:8]
    assert [r["prompt"] for r in rows] == [e.prompt for e in examples]  # the same prompts
    ours = evaluate(lm.model, examples, fwd_hooks=ablated._hooks, progress=False)
    assert res["results"]["ga_kv"]["acc,none"] == pytest.approx(ours.accuracy), args
    for resp, ex in zip(_responses(res, "ga_kv"), ours.results, strict=True):
        assert torch.allclose(torch.tensor(resp), torch.tensor(ex.logprobs), atol=1e-4)
    assert not list(_live_hooks(lm.model))


def _live_hooks(model):
    from gather_aggregate.core.protocol import count_hooks

    return range(count_hooks(model))


def test_intervention_changes_the_answer_as_evaluate_does(lm):
    """The KV Gather head L0H2 (docs/results.md) takes letter-MC and KV down, knowledge stays; equal to evaluate."""
    from gather_aggregate.lm_eval.intervention import Intervention
    from gather_aggregate.tasks import evaluate, get_task

    ablated = lm.with_intervention(Intervention.from_args(ablate="L0H2"))
    res = _evaluate(ablated, ["ga_mmlu_letter", "ga_kv", "ga_knowledge"], 24)
    acc = {t: res["results"][t]["acc,none"] for t in ("ga_mmlu_letter", "ga_kv", "ga_knowledge")}
    assert acc["ga_kv"] < 0.3 and acc["ga_mmlu_letter"] < 0.5 and acc["ga_knowledge"] > 0.9, acc
    for task, name in (("ga_mmlu_letter", "letter-mc"), ("ga_knowledge", "knowledge")):
        rows = json.loads((TASKS / f"{task}.json").read_text())[:24]
        examples = get_task(name, model_dir=zoo_path(ZOO)).examples(lm.tokenizer, n=64, seed=0)[:24]
        assert [r["prompt"] for r in rows] == [e.prompt for e in examples]
        ours = evaluate(lm.model, examples, fwd_hooks=ablated._hooks, progress=False)
        assert acc[task] == pytest.approx(ours.accuracy), task
        for resp, ex in zip(_responses(res, task), ours.results, strict=True):
            assert torch.allclose(torch.tensor(resp), torch.tensor(ex.logprobs), atol=1e-4), task


class _Req:
    def __init__(self, args, task="t"):
        self.args, self.task_name = args, task


def test_shared_context_takes_one_forward(lm):
    """Requests whose rows are prefixes of one another are read from one row in one forward, exactly."""
    ctx = "The color of doriz is"
    conts = [" red", " red blue", " blue", " green red"]
    before = (lm.n_forwards, lm.n_rows)
    got = lm.loglikelihood([_Req((ctx, c)) for c in conts], disable_tqdm=True)
    assert lm.n_forwards - before[0] == 1 and lm.n_rows - before[1] == 2  # " red blue" and " green red" rows
    for (score, greedy), c in zip(got, conts, strict=True):  # reference: one forward per request
        ids = lm.tok_encode(ctx + c)
        n = len(ids) - len(lm.tok_encode(ctx))
        with torch.no_grad():
            lp = lm.model(torch.tensor([ids[:-1]]))[0, -n:].float().log_softmax(-1)
        target = torch.tensor(ids[-n:])
        assert score == pytest.approx(float(lp.gather(1, target[:, None]).sum()), abs=1e-4)
        assert greedy == bool((lp.argmax(-1) == target).all())
    # a task of 4-way MC: one forward per question at batch size 1
    one = lm.with_intervention(lm.intervention)
    one.batch_size = 1
    _evaluate(one, ["ga_mmlu_letter"], 4, log_samples=False)
    assert one.n_forwards == 4 and one.n_rows == 4


def test_chat_format_needs_a_template(lm):
    from gather_aggregate.lm_eval.model import DEFAULT_CHAT_TEMPLATE

    with pytest.raises(InputError, match="chat_template=default"):
        _evaluate(lm, ["ga_mmlu_letter"], 2, apply_chat_template=True)
    chat = lm.with_intervention(lm.intervention)
    chat._chat_template = "default"
    text = chat.apply_chat_template([{"role": "user", "content": "Question: hi\nAnswer:"}])
    assert text == "User: Question: hi\nAnswer:\n\nAssistant:" and "capitalize" in DEFAULT_CHAT_TEMPLATE
    res = _evaluate(chat, ["ga_mmlu_letter"], 4, apply_chat_template=True)
    prompt = res["samples"]["ga_mmlu_letter"][0]["arguments"][0][0]
    assert prompt.startswith("User: Question: What is the color of") and prompt.endswith("\n\nAssistant:")


def test_unknown_token_warning(lm):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _evaluate(lm, ["ga_mmlu_sample", "ga_mmlu_letter"], 4, log_samples=False)
    msgs = [str(w.message) for w in caught if issubclass(w.category, UnknownTokenWarning)]
    assert any("ga_mmlu_sample" in m for m in msgs) and not any("ga_mmlu_letter" in m for m in msgs)
    from gather_aggregate.tasks import MMLUTask, evaluate

    with pytest.warns(UnknownTokenWarning, match="unknown to the tokenizer"):
        evaluate(lm.model, MMLUTask(source="sample"), n=4, progress=False)


def test_registered_with_lm_eval():
    from lm_eval.api.registry import get_model

    from gather_aggregate.lm_eval import register

    cls = register()
    assert get_model("gather_aggregate") is cls and get_model("hf").__name__ == "HFLM"


@pytest.mark.slow
def test_lm_eval_cli_runs_our_model(tmp_path):
    """`python -m gather_aggregate.lm_eval` is lm-eval's CLI with --model gather_aggregate available."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "gather_aggregate.lm_eval", "--model", "gather_aggregate", "--model_args",
         f"pretrained={ZOO},ablate=L0H2;L1H0,method=mean", "--tasks", "ga_kv", "--include_path", str(TASKS),
         "--limit", "2", "--output_path", str(tmp_path)], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ga_kv" in out.stdout and "acc" in out.stdout


def test_gather_aggregate_lm_eval_command(tmp_path):
    from gather_aggregate.cli.parser import main

    out = tmp_path / "run"
    rc = main(["lm-eval", "--model", ZOO, "--tasks", "ga_mmlu_letter,ga_knowledge", "--heads", "L0H2;L1H0",
               "--schedule", "0,2,5", "--limit", "6", "--formats", "completion,chat", "--chat-template", "default",
               "--n", "8", "--out", str(out)])
    assert rc == 0
    data = json.loads((out / "lm_eval.json").read_text())
    rows = data["rows"]
    assert {r["setting"] for r in rows} == {"0 heads", "2 heads"}  # 5 clipped to the 2 heads given
    assert {r["format"] for r in rows} == {"completion", "chat"} and len(rows) == 2 * 2 * 2
    clean = [r for r in rows if r["setting"] == "0 heads"]
    assert all(r["rel_change"] == 0 for r in clean)
    assert (out / "lm_eval.csv").read_text().startswith("task,format,setting")
    assert "| ga_mmlu_letter | completion | acc |" in (out / "lm_eval.md").read_text()
    assert (out / "tasks" / "ga_mmlu_letter.yaml").is_file()  # ga_* tasks written for the model
    from gather_aggregate.report.from_results import build_report_from_dir

    html = build_report_from_dir(out, tmp_path / "report.html").read_text()
    assert "tasks x heads removed" in html


def test_shipped_tasks_match_export(tmp_path):
    from gather_aggregate.lm_eval.export import export_tasks

    names = export_tasks(zoo_path(ZOO), tmp_path, n=64)
    assert "ga_mmlu_letter" in names and "ga_kv_gen" in names
    for f in sorted(TASKS.iterdir()):
        if f.suffix in (".json", ".yaml", ".py"):
            assert (tmp_path / f.name).read_text() == f.read_text(), f.name


def test_bad_schedule_is_one_line_before_the_model_loads(tmp_path, capsys):
    from gather_aggregate.cli.parser import main

    rc = main(["lm-eval", "--model", ZOO, "--tasks", "arc_easy", "--heads", "L0H2", "--schedule", "0,ten",
               "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1  # was "error (ValueError): invalid literal for int()"
    assert "lm-eval: error: --schedule '0,ten': pass head counts" in err and "e.g. --schedule 0,10,20,30" in err


@pytest.mark.slow  # lm-eval indexes its ~14k task names (about 25 s here)
def test_unknown_lm_eval_task_is_named_with_a_suggestion():
    from gather_aggregate.core.errors import InputError
    from gather_aggregate.lm_eval.schedule import run_table

    with pytest.raises(InputError, match="unknown lm-eval task\\(s\\): 'arc_easyy' \\(did you mean 'arc_easy'\\?\\)"):
        run_table(None, ["arc_easyy"], [])  # was lm-eval's KeyError, after every model forward was set up


# ---- `python -m gather_aggregate.lm_eval` from any directory ---------------------------------------------------
def test_ga_tasks_without_include_path_are_written_for_the_model_from_any_directory(tmp_path, monkeypatch):
    """ga_* tasks asked for without --include_path are written for the pretrained= model into the user's cache
    (the same files as the shipped folder), and that folder is passed on; other arguments are left as they are."""
    from gather_aggregate.lm_eval.__main__ import task_folder, with_ga_tasks

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    argv = ["--model", "gather_aggregate", "--model_args", f"pretrained={ZOO},ablate=L0H2", "--tasks", "ga_kv"]
    out = with_ga_tasks(argv)
    folder = task_folder(ZOO)
    assert out == [*argv, "--include_path", str(folder)] and folder.is_relative_to(tmp_path / "cache")
    for name in ("ga_kv.yaml", "ga_kv.json", "utils.py"):
        assert (folder / name).read_text() == (TASKS / name).read_text(), name
    given = [*argv, "--include_path", str(TASKS)]
    assert with_ga_tasks(given) == given  # a folder the user names is used as it is
    assert with_ga_tasks(["--tasks", "mmlu"]) == ["--tasks", "mmlu"]  # no ga_* task: nothing written


def test_ga_tasks_without_a_model_directory_are_one_line():
    from gather_aggregate.core.errors import InputError
    from gather_aggregate.lm_eval.__main__ import with_ga_tasks

    with pytest.raises(InputError, match=r"pretrained=DIR_OR_ZOO_NAME, or pass --include_path"):
        with_ga_tasks(["--model", "gather_aggregate", "--tasks", "ga_kv"])
    with pytest.raises(InputError, match=r"neither a zoo name nor a model directory"):
        with_ga_tasks(["--model_args", "pretrained=no-such-model", "--tasks=ga_kv"])


def test_a_hub_only_task_offline_is_one_line():
    from gather_aggregate.lm_eval.__main__ import hub_message

    line = hub_message(ConnectionError("Couldn't reach 'allenai/ai2_arc' on the Hub (OfflineModeIsEnabled)"))
    assert line is not None and "(allenai/ai2_arc) from the HF hub" in line and "--include_path" in line
    assert hub_message(ConnectionError("connection refused")) is None and hub_message(ValueError("x")) is None


@pytest.mark.slow
def test_lm_eval_cli_from_another_directory_without_include_path(tmp_path):
    """The README's command, run outside the clone: ga_kv is found; a hub-only task ends in one line."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "XDG_CACHE_HOME": str(tmp_path / "cache")}
    base = [sys.executable, "-m", "gather_aggregate.lm_eval", "--model", "gather_aggregate", "--model_args",
            f"pretrained={ZOO}", "--limit", "2"]
    out = subprocess.run([*base, "--tasks", "ga_kv"], capture_output=True, text=True, env=env, timeout=600,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ga_kv" in out.stdout and "acc" in out.stdout
    hub = subprocess.run([*base, "--tasks", "arc_easy"], capture_output=True, text=True, env=env, timeout=600,
                         cwd=tmp_path)
    assert hub.returncode == 2 and "Traceback" not in hub.stderr
    assert hub.stderr.strip().splitlines()[-1].startswith("error: this task reads its data (allenai/ai2_arc)")
