"""Issue 39: one study, one run folder.  scan → detect → ablate → report hand their results on through the folder,
in the CLI and from Python; detect scans nothing when the study holds a scan; every result is typed and carries
its provenance; the report names the model and task in every section and renders in a real Chromium."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gather_aggregate.cli.parser import main

COMMON = ["--model", "llama-kvmc", "--task", "kv", "--n", "16", "--seed", "0", "--no-progress"]


class Counter:
    """Counts the head scans run (exact and estimated), by wrapping the functions the study calls."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import gather_aggregate.attribution.estimators as est
        import gather_aggregate.scan.exact as exact

        self.calls: list[str] = []
        for module, name in ((exact, "exact_scan"), (est, "attribution_scan")):
            real = getattr(module, name)

            def wrapped(*a, _real=real, _name=name, **k):
                self.calls.append(_name)
                return _real(*a, **k)

            monkeypatch.setattr(module, name, wrapped)


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """scan, detect, ablate and report on one study folder, counting head scans per step."""
    folder = tmp_path_factory.mktemp("study") / "llama-kvmc-kv"
    scans, printed = {}, {}
    import contextlib
    import io

    with pytest.MonkeyPatch.context() as mp:
        counter = Counter(mp)
        for step in (["scan"], ["detect"], ["ablate"]):
            before = len(counter.calls)
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                assert main([*step, *(COMMON if step != ["ablate"] else COMMON[:-1]), "--out", str(folder)]) == 0
            scans[step[0]], printed[step[0]] = len(counter.calls) - before, buf.getvalue()
        assert main(["report", str(folder)]) == 0
    return folder, scans, printed


def test_detect_runs_no_head_scan_and_says_whose_scan_it_used(chain):
    folder, scans, printed = chain
    assert scans == {"scan": 1, "detect": 0, "ablate": 0}
    assert f"detect: uses the study's scan {folder / 'scan.json'} (16 heads; no head scan run)" in printed["detect"]
    assert "ablate: the heads the study's detect named (L1H1 L1H3 L1H0 L1H2 L0H2)" in printed["ablate"]


def test_every_step_keeps_what_earlier_steps_recorded(chain):
    from gather_aggregate.studies.study_folder import StudyFolder

    folder, _, _ = chain
    study = StudyFolder(folder)
    assert study.kinds() == ["scan", "detect", "ablate"] and set(study.meta()["steps"]) == {"scan", "detect", "ablate"}
    for kind in study.kinds():
        p = study.load(kind).provenance
        assert (p.model_name, p.task_name, p.n, p.seed) == ("llama-kvmc", "kv", 16, 0), kind
        assert p.model == study.meta()["model"], kind
    det = study.load("detect")
    assert det.gather == [(0, 2)] and det.meta["scan"] == str(folder / "scan.json")
    abl = study.load("ablate")
    assert abl.rows[0]["heads"] == "L1H1 L1H3 L1H0 L1H2 L0H2" and abl.rows[0]["ablated"] < abl.rows[0]["clean"]


def _sections(html: str) -> list[str]:
    return re.findall(r'<section class="ga-section[^"]*" id="s\d+">(.*?)</section>', html, flags=re.S)


def test_report_names_model_and_task_in_every_section(chain):
    folder, _, _ = chain
    html = (folder / "report.html").read_text()
    secs = _sections(html)
    titles = re.findall(r"<h2>(.*?)</h2>", html)
    assert len(secs) == len(titles) >= 8
    assert all(t.startswith("llama-kvmc · kv: ") for t in titles), titles
    for wanted in ("the circuit", "Gather and Aggregate rows on one prompt", "head scores", "why each head was named",
                   "head scan", "accuracy with heads ablated"):
        assert any(wanted in t for t in titles), wanted
    assert "model not recorded" not in html
    # the why table is a card per named head (7 columns), the full table folded under <details>
    why = secs[[i for i, t in enumerate(titles) if "why each head" in t][0]]
    assert len(re.findall(r"<th[ >]", why)) == 7 and len(re.findall(r"<tr[ >]", why)) == 1 + 5
    assert "<details>" in html


@pytest.mark.browser
def test_every_figure_of_the_study_report_renders_in_chromium(chain):
    """Opened in headless Chromium, with no time limit and nothing waited on after the load event: every plotly
    figure drawn, the circuit and the token strips there, nothing fetched, no script error."""
    from test_report_browser import CHROMIUM, FLAGS

    if not Path(CHROMIUM).exists():
        pytest.skip(f"Debian chromium is not installed at {CHROMIUM}")
    sync_api = pytest.importorskip("playwright.sync_api")
    folder, _, _ = chain
    path = folder / "report.html"
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        try:
            page = browser.new_page()
            errors, requests = [], []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("request", lambda r: requests.append(r.url))
            page.goto(path.as_uri(), wait_until="load", timeout=0)
            # nothing waited on: at the load event every script has run (the libraries unpack synchronously)
            ready = page.evaluate("document.documentElement.dataset.gaReady")
            figs = page.evaluate("""Array.from(document.querySelectorAll('.plotly-graph-div')).map(d => ({
                svgs: d.querySelectorAll('.main-svg').length, heat: d.querySelectorAll('.hm image').length}))""")
            svg = page.evaluate("document.querySelectorAll('svg.ga-circuit, section svg').length")
            strips = page.evaluate("document.querySelectorAll('.ga-strip').length")
        finally:
            browser.close()
    assert not errors, errors
    assert ready == "1"
    assert all(u.startswith(("file://", "data:", "blob:", "about:")) for u in requests), requests
    assert len(figs) == 2 and all(f["svgs"] >= 1 and f["heat"] >= 1 for f in figs), figs
    assert svg >= 1 and strips == 2


def test_detect_refuses_a_scan_of_another_study_in_one_line(chain, tmp_path, capsys):
    folder, _, _ = chain
    args = ["detect", "--model", "llama-kvmc", "--task", "kv", "--n", "16", "--seed", "3", "--no-progress"]
    assert main([*args, "--out", str(tmp_path / "other"), "--scan", str(folder / "scan.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # (after transformers' loading bar, in a test)
    assert err.startswith("gather-aggregate detect: error: ") and "was made with another seed (0, here 3)" in err
    assert "--seed" in err


def test_a_folder_of_another_study_is_refused_naming_the_fix(chain, capsys):
    folder, _, _ = chain
    assert main(["detect", *COMMON[:4], "--n", "8", "--out", str(folder)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "another number of prompts (16, here 8)" in err and "--n 16 --seed 0" in err


def test_a_partial_scan_is_continued_or_refused_never_discarded(tiny_llama_dir, tmp_path, capsys):
    small = ["--model", str(tiny_llama_dir), "--task", "kv", "--n", "4", "--dict-size", "3", "--no-progress",
             "--out", str(tmp_path)]
    assert main(["scan", *small]) == 0
    scan = json.loads((tmp_path / "scan.json").read_text())
    scan["meta"]["complete"], scan["rows"] = False, scan["rows"][:3]  # as an interrupted scan leaves it
    (tmp_path / "scan.json").write_text(json.dumps(scan))
    capsys.readouterr()
    assert main(["scan", *small]) == 2
    err = capsys.readouterr().err
    assert "holds a partial scan (3 of 8 heads); pass --resume" in err and "--fresh" in err
    assert len(json.loads((tmp_path / "scan.json").read_text())["rows"]) == 3  # kept
    assert main(["scan", *small, "--resume"]) == 0
    done = json.loads((tmp_path / "scan.json").read_text())
    assert done["meta"]["complete"] is True and len(done["rows"]) == 8 and done["meta"]["model_name"]


def test_ctrl_c_says_what_was_kept_and_the_command_that_continues(tiny_llama_dir, tmp_path, monkeypatch, capsys):
    import gather_aggregate.interventions.layer_resume as layer_resume

    real, calls = layer_resume.edited_logits, []

    def interrupted(*a, **k):  # the first layer's heads are scanned (and saved), then the user presses Ctrl-C
        calls.append(1)
        if len(calls) > 1:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(layer_resume, "edited_logits", interrupted)
    small = ["scan", "--model", str(tiny_llama_dir), "--task", "kv", "--n", "4", "--dict-size", "3", "--out",
             str(tmp_path), "--no-progress"]
    assert main(small) == 130
    err = capsys.readouterr().err.strip().splitlines()[-2:]  # (after transformers' loading bar, in a test)
    assert err[0] == f"interrupted: kept the partial scan {tmp_path / 'scan.json'} (4 of 8 heads); continue with:"
    assert err[1].startswith("  gather-aggregate scan --model") and err[1].endswith("--no-progress --resume")


def test_the_same_study_from_python_reopened_reuses_every_result(tmp_path):
    from gather_aggregate.studies import Study

    study = Study("llama-kvmc", "kv", n=16, seed=0, folder=tmp_path)
    scan = study.scan()
    det = study.detect()
    assert det.gather == [(0, 2)] and len(det.aggregate) == 4
    again = Study.open(tmp_path)
    assert json.dumps(again.saved("scan").rows) == json.dumps(scan.rows)
    assert json.dumps(again.saved("detect").rows) == json.dumps(det.rows)
    assert again.scan() is again.saved("scan")  # the study's complete scan, not a new one
    assert "ScanResult" in repr(again.saved("scan")) and "DetectionResult" in det._repr_html_()
    assert list(det.to_pandas().columns[:3]) == ["layer", "head", "kind"]
    assert "L0H2" in repr(det) and "pattern share" in repr(det)
    view = again._repr_html_()  # the study in a notebook: whose, where, and each result's caption
    assert "llama-kvmc on kv (16 prompts, seed 0)" in view and "<code>scan</code>: 16 heads, exact" in view
    assert "<code>detect</code>: Gather L0H2, Aggregate L1H1 L1H3 L1H0 L1H2" in view


def test_each_typed_result_saves_loads_and_refuses_another_kind(tmp_path):
    from gather_aggregate.core.errors import InputError
    from gather_aggregate.studies import Study
    from gather_aggregate.studies.study_folder import RESULTS, result_type

    study = Study("llama-kvmc", "kv", n=8, seed=1, folder=tmp_path)
    made = {"eval": study.eval(), "ablate": study.ablate([(0, 2)]), "pattern": study.pattern(1, prompt=2)}
    made["ablate"] = study.ablate([(1, 1)], "mean")  # added to the first, not replacing it
    assert len(made["ablate"].rows) == 2
    for kind, result in made.items():
        back = result_type(kind).load(tmp_path / RESULTS[kind][0])
        assert back.provenance == result.provenance and back.provenance.seed == 1
        assert len(back.to_pandas()) == len(result.to_pandas()) > 0
        assert back._repr_html_().startswith("<p><b>")
    with pytest.raises(InputError, match="holds a eval result, not a ablate result"):
        result_type("ablate").load(tmp_path / "eval.json")


def test_a_folder_of_two_studies_gets_one_named_group_each(chain, tmp_path, capsys):
    """An attention study and an SSM study in one folder: a named group of sections each, and the sharp (attention)
    against smooth (SSM) Aggregate rows drawn across them."""
    import shutil

    from gather_aggregate.studies import Study

    shutil.copytree(chain[0], tmp_path / "a")
    Study("mamba2-ga", "kv", n=16, seed=0, folder=tmp_path / "b").detect()
    (tmp_path / "demo").mkdir()
    shutil.copy(chain[0] / "scan.json", tmp_path / "demo" / "scan_llama-kvmc.json")  # a loose file: said, left out
    assert main(["report", str(tmp_path)]) == 0
    assert "note: 1 result file(s) outside the 2 study folder(s) are not in the report" in capsys.readouterr().out
    html = (tmp_path / "report.html").read_text()
    titles = re.findall(r"<h2>(.*?)</h2>", html)
    assert "gather-aggregate: 2 studies" in html
    assert titles[0] == "llama-kvmc · kv" and "mamba2-ga · kv" in titles  # each group opens with its name
    assert "llama-kvmc on kv (16 prompts, seed 0)" in html and "mamba2-ga on kv (16 prompts, seed 0)" in html
    for model in ("llama-kvmc", "mamba2-ga"):
        assert f"{model} · kv: the circuit" in titles and f"{model} · kv: sharp or smooth: the Aggregate row on that prompt" in titles
    assert titles[-1] == "Sharp (attention) vs smooth (SSM): llama-kvmc · kv and mamba2-ga · kv"
    assert all(t.startswith(("llama-kvmc · kv", "mamba2-ga · kv", "Sharp")) for t in titles)


# ---- docs/getting-started.md shows what the chain prints ---------------------------------------------------------
GETTING_STARTED = Path(__file__).resolve().parents[1] / "docs" / "getting-started.md"


def _section(text: str) -> str:
    return text[text.index("## One study: scan"):]


def test_getting_started_cli_chain_prints_what_the_page_shows(tmp_path, monkeypatch, capsys):
    import shlex

    text = _section(GETTING_STARTED.read_text())
    commands = re.search(r"```bash\n(.*?)```", text, re.S).group(1).strip().splitlines()
    shown = re.search(r"```text\n(.*?)```", text, re.S).group(1).strip().splitlines()
    assert [shlex.split(c)[1] for c in commands] == ["scan", "detect", "ablate", "report"]
    monkeypatch.chdir(tmp_path)
    printed = []
    for line in commands:
        assert main(shlex.split(line)[1:]) == 0, line
        printed += capsys.readouterr().out.splitlines()
    for line in shown:
        assert line in printed, line


def test_getting_started_python_chain_prints_what_the_page_shows(tmp_path, monkeypatch, capsys):
    text = _section(GETTING_STARTED.read_text())
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    expected = [m.group(1).strip() for m in re.finditer(r"^print\(.*#\s*prints:(.*)$", code, re.M)]
    assert len(expected) == 5
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "getting-started.md", "exec"), {"__name__": "doc_getting_started"})
    assert capsys.readouterr().out.splitlines() == expected


def test_an_own_checkpoint_whose_vocabulary_lacks_the_task_words_goes_through(tmp_path, capsys):
    """A plain HF Llama saved with a borrowed word-level tokenizer: the built-in KV task's words are unknown to it,
    and the refusal names a task file and --vocab; with --vocab auto, scan → detect → report go through."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from gather_aggregate.zoo import zoo_path

    tok = PreTrainedTokenizerFast.from_pretrained(zoo_path("llama-kvmc"))
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=4)).save_pretrained(tmp_path / "own")
    tok.save_pretrained(tmp_path / "own")
    args = ["--model", str(tmp_path / "own"), "--n", "6", "--out", str(tmp_path / "study"), "--no-progress"]
    assert main(["scan", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "tokenises to the unknown token" in err and "--task-file" in err and "--vocab auto" in err
    for step in ("scan", "detect"):
        assert main([step, *args, "--vocab", "auto"]) == 0
    assert main(["report", str(tmp_path / "study")]) == 0
    assert "no Gather or Aggregate head was named" in (tmp_path / "study" / "report.html").read_text()
    assert main(["detect", *args]) == 2  # the study's words are recorded, but each step is given them
    assert "--vocab auto" in capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.browser
def test_the_reports_inflate_matches_gzip_on_every_block_type():
    """The loader's synchronous inflate against Python's gzip: empty, fixed-Huffman, stored (incompressible, over
    64 KiB: several stored blocks) and dynamic-Huffman members."""
    import base64
    import gzip
    import random

    from test_report_browser import CHROMIUM, FLAGS

    from gather_aggregate.viz.assets import unpack_loader

    if not Path(CHROMIUM).exists():
        pytest.skip(f"Debian chromium is not installed at {CHROMIUM}")
    sync_api = pytest.importorskip("playwright.sync_api")
    rng = random.Random(0)
    cases = [b"", b"abcabcabc", bytes(rng.getrandbits(8) for _ in range(70_000)),
             " ".join(rng.choice(["gather", "aggregate", "head", "L1H2", "0.95"]) for _ in range(20_000)).encode()]
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        try:
            page = browser.new_page()
            page.set_content(f"<html><head>{unpack_loader()}</head><body></body></html>")
            for data in cases:
                packed = base64.b64encode(gzip.compress(data, compresslevel=9, mtime=0)).decode()
                got = page.evaluate("""(b) => { const out = window.gaGunzip(Uint8Array.from(atob(b), c => c.charCodeAt(0)));
                    let s = ""; for (let i = 0; i < out.length; i += 8192) s += String.fromCharCode(...out.subarray(i, i + 8192));
                    return btoa(s); }""", packed)
                assert base64.b64decode(got) == data, len(data)
        finally:
            browser.close()
