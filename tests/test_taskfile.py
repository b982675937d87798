"""Issue 19.5: user-defined tasks from a JSONL file (--task-file) and a Python factory (--task module:callable)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gather_aggregate.cli.parser import main
from gather_aggregate.core.errors import GAError, InputError, TaskError
from gather_aggregate.tasks import annotate
from gather_aggregate.tasks.taskfile import load_factory, read_task_file

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tasks.jsonl"


def _line(**change):
    """A valid line of the crate format of examples/tasks.jsonl, with fields changed (None drops a field)."""
    obj = json.loads(EXAMPLE.read_text().splitlines()[1])
    for k, v in change.items():
        if v is None:
            obj.pop(k)
        else:
            obj[k] = v
    return obj


def _write(tmp_path, *lines, name="t.jsonl"):
    p = tmp_path / name
    p.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return p


# ---- the schema: annotation --------------------------------------------------------------------------------
def test_example_file_annotates_char_spans_to_token_spans():
    from gather_aggregate.testing.tiny_models import bpe_tokenizer

    tok = bpe_tokenizer()
    task = read_task_file(EXAMPLE)
    examples = task.examples(tok, n=100)
    assert task.name == "tasks.jsonl" and len(examples) == len(EXAMPLE.read_text().splitlines()) == 8
    lines = [json.loads(x) for x in EXAMPLE.read_text().splitlines()]
    for ex, obj in zip(examples, lines, strict=True):
        assert ex.query_pos == len(ex.input_ids) - 1
        assert ex.candidates[ex.answer] == obj["answer"] and ex.correct == obj["correct"]
        for seg, s in zip(ex.segments, obj["segments"], strict=True):
            assert tok.decode(ex.input_ids[seg.start:seg.end]) == obj["prompt"][s["start"]:s["end"]]
            if "summary" not in s:
                assert seg.summary == seg.end - 1
    seg0 = examples[0].segments[0]  # the first line names the crate letter as its summary character
    assert tok.decode([examples[0].input_ids[seg0.summary]]).strip() == "A" and seg0.summary < seg0.end - 1
    assert len(task.examples(tok, n=3)) == 3  # --n caps the count: the file's first lines


def test_offsets_by_incremental_decoding_match_the_offset_mapping():
    """A tokenizer without an offset mapping gets the same token spans from incremental decoding."""
    from gather_aggregate.testing.tiny_models import bpe_tokenizer

    tok = bpe_tokenizer()

    class NoOffsets:  # a slow tokenizer's behaviour: no return_offsets_mapping
        def __call__(self, text, **kw):
            if kw.get("return_offsets_mapping"):
                raise NotImplementedError
            return tok(text, **kw)

        def __getattr__(self, name):
            return getattr(tok, name)

    for spec in read_task_file(EXAMPLE).specs(8):
        fast, slow = annotate(spec, tok), annotate(spec, NoOffsets())
        assert fast.segments == slow.segments and fast.input_ids == slow.input_ids


# ---- malformed files: one line naming file, line and field, raised before the model loads -----------------
BAD = {
    "not JSON": ('{"prompt": "x",', "line 2: not JSON"),
    "not an object": ("[1, 2]", "line 2: expected a JSON object, got a list"),
    "missing field": (_line(segments=None), "line 2: field 'segments': missing"),
    "unknown field": (_line(anwser="dog"), "line 2: field 'anwser': not part of the schema"),
    "wrong type": (_line(correct="1"), "line 2: field 'correct': expected a whole number, got \"1\""),
    "segment not an object": (_line(segments=[[0, 4]]), "field 'segments'[0]: expected an object"),
    "span past the end": (_line(segments=[{"start": 0, "end": 400}]),
                          "field 'segments'[0]: end 400 is past the prompt's"),
    "negative start": (_line(segments=[{"start": -1, "end": 4}]), "field 'segments'[0]: start -1 is negative"),
    "empty span": (_line(segments=[{"start": 4, "end": 4}]), "field 'segments'[0]: the span [4, 4) is empty"),
    "overlap": (_line(segments=[{"start": 0, "end": 10}, {"start": 5, "end": 20}], correct=0),
                "field 'segments'[1]: [5, 20) overlaps segment 0 [0, 10)"),
    "summary outside": (_line(segments=[{"start": 0, "end": 10, "summary": 10}], correct=0),
                        "field 'segments'[0].summary: character 10 is outside the segment"),
    "correct out of range": (_line(correct=4), "field 'correct': 4 is out of range for 4 segments"),
    "answer not a candidate": (_line(answer="cat"), "field 'answer': 'cat' is not among the candidates"),
    "answer as index": (_line(answer=1), "field 'answer': expected a string, got 1; give the answer's text"),
    "one candidate": (_line(candidates=["dog"], answer="dog"), "field 'candidates': expected a list of at least two"),
    "duplicate candidates": (_line(candidates=["dog", "dog"], answer="dog"), "'dog' appears twice"),
    "candidate with a space": (_line(candidates=[" dog", "fox"], answer="fox"), "field 'candidates'[0]: ' dog' has"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_malformed_line_is_one_line_naming_line_and_field(tmp_path, case):
    bad, expected = BAD[case]
    p = _write(tmp_path, _line(), bad)
    with pytest.raises(TaskError) as err:
        read_task_file(p)
    msg = str(err.value)
    assert msg.startswith(f"{p} line 2: ") and expected in msg
    assert "\n" not in msg and ";" in msg  # one line, with the fix after the semicolon


def test_empty_and_missing_files(tmp_path):
    with pytest.raises(TaskError, match=r"e\.jsonl: the file holds no prompts"):
        read_task_file(_write(tmp_path, "", "  ", name="e.jsonl"))
    with pytest.raises(InputError, match="does not exist"):
        read_task_file(tmp_path / "nope.jsonl")


def test_duplicate_fields_byte_order_marks_unicode_separators_and_directories(tmp_path):
    line = json.dumps(_line())
    dup = line[:-1] + ', "answer": ' + json.dumps(_line()["candidates"][0]) + "}"  # json keeps the last: silent
    with pytest.raises(TaskError, match=r"d\.jsonl line 2: field 'answer': appears twice in one object; keep one"):
        read_task_file(_write(tmp_path, line, dup, name="d.jsonl"))
    bom = tmp_path / "bom.jsonl"
    bom.write_text(line + "\n", encoding="utf-8-sig")  # Windows editors write one; it was "not JSON"
    assert read_task_file(bom).spec_list == read_task_file(_write(tmp_path, line)).spec_list
    sep = _line(meta={"note": "a\u2028b\u2029c"})  # legal raw inside a JSON string; str.splitlines cut the line there
    u = tmp_path / "u.jsonl"
    u.write_text(json.dumps(sep, ensure_ascii=False) + "\n", encoding="utf-8")
    assert read_task_file(u).spec_list[0].meta == {"note": "a\u2028b\u2029c"}
    with pytest.raises(InputError, match="is a directory; pass the JSONL file itself"):  # was "does not exist"
        read_task_file(tmp_path)


def test_task_counts_and_tokenizer_arguments_are_checked():
    from gather_aggregate.tasks import get_task
    from gather_aggregate.testing.tiny_models import bpe_tokenizer

    kv = get_task("kv", n_pairs=2)
    with pytest.raises(TaskError, match="n=2.5: ask for at least one prompt"):  # was a TypeError from range()
        kv.specs(2.5)
    with pytest.raises(TaskError, match=r"got int; call task\.examples\(model\.tokenizer, n\)"):
        kv.examples(4)  # arguments swapped: was "'int' object is not callable" from inside the tokenizer call
    with pytest.raises(TaskError, match="task 'kv' takes no option 'npairs'"):  # was a TypeError of KVRetrieval
        get_task("kv", npairs=3)
    assert len(kv.examples(bpe_tokenizer(), 2)) == 2


def test_tokenizer_checks_name_line_and_field(tmp_path):
    """A candidate the tokenizer cannot read (<unk>) or two candidates with one first token are refused."""
    from gather_aggregate.tasks import word_level_tokenizer
    from gather_aggregate.testing.tiny_models import bpe_tokenizer

    good = _line()
    tok = word_level_tokenizer([good["prompt"], *good["candidates"]])
    unk = _line(candidates=["dog", "zebra"], answer="dog")
    p = _write(tmp_path, good, unk)
    assert len(read_task_file(p).examples(tok, n=1)) == 1
    with pytest.raises(TaskError, match=r"t\.jsonl line 2: answer candidate 'zebra' tokenises to the unknown token"):
        read_task_file(p).examples(tok)
    same = _line(candidates=["red", "yellow"], answer="red")  # the tiny BPE splits both as ' ' + ...
    with pytest.raises(TaskError, match=r"line 2: field 'candidates': 'red' and 'yellow' start with the same token"):
        read_task_file(_write(tmp_path, good, same)).examples(bpe_tokenizer())
    req = _line(required=[{"start": 0, "end": 4, "what": "key"}])
    tok2 = word_level_tokenizer([good["prompt"][4:], *good["candidates"]])  # the first word is unknown
    with pytest.raises(TaskError, match=r"line 2: key 'Four' tokenises to the unknown token"):
        read_task_file(_write(tmp_path, good, req)).examples(tok2)


def test_cli_errors_before_the_model_loads(tiny_llama_dir, tmp_path, monkeypatch, capsys):
    import gather_aggregate.models.loading as loading

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the task was checked")

    monkeypatch.setattr(loading, "load_model", no_load)
    p = _write(tmp_path, _line(), _line(segments=[{"start": 0, "end": 999}]))
    for cmd in ("eval", "scan", "detect", "pattern"):
        assert main([cmd, "--model", str(tiny_llama_dir), "--task-file", str(p), "--out", str(tmp_path / cmd)]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and f"{p} line 2: field 'segments'[0]: end 999 is past the prompt's" in err
    assert main(["ablate", "--model", str(tiny_llama_dir), "--task", "nomod_x:make", "--heads", "1.0"]) == 2
    assert "module 'nomod_x' not found" in capsys.readouterr().err
    assert main(["eval", "--model", str(tiny_llama_dir), "--task", "kv", "--task-file", str(p)]) == 2
    assert "pass one of them" in capsys.readouterr().err
    assert main(["eval", "--model", str(tiny_llama_dir), "--task-file", str(EXAMPLE), "--dict-size", "4"]) == 2
    assert "drop --dict-size" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["eval", "--model", str(tiny_llama_dir), "--task", "nocolon"])
    assert "MODULE:CALLABLE" in capsys.readouterr().err


# ---- factories --------------------------------------------------------------------------------------------
FACTORIES = """
from gather_aggregate.tasks import annotate
from gather_aggregate.tasks.taskfile import read_task_file
SPECS = read_task_file({path!r}).specs(8)
not_callable = 3
def specs():
    return SPECS
def examples(tokenizer):
    return [annotate(s, tokenizer) for s in SPECS]
def wrong():
    return {{"prompt": "x"}}
def empty():
    return []
def boom():
    raise RuntimeError("no data here")
"""


@pytest.fixture
def factory_module(tmp_path, monkeypatch):
    name = f"user_tasks_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(FACTORIES.format(path=str(EXAMPLE)))
    monkeypatch.chdir(tmp_path)  # the CLI imports from the current directory
    return name


def test_factory_results(factory_module, monkeypatch):
    from gather_aggregate.testing.tiny_models import bpe_tokenizer

    tok = bpe_tokenizer()
    ref = read_task_file(EXAMPLE).examples(tok)
    assert load_factory(f"{factory_module}:specs").examples(tok) == ref
    assert load_factory(f"{factory_module}:examples").examples(tok, n=3) == ref[:3]
    monkeypatch.chdir(ROOT)  # examples/ is importable from the repository root
    t = load_factory("examples.task_factory:make_task")
    assert t.name == "crates" and len(t.examples(tok, n=5, seed=1)) == 5


@pytest.mark.parametrize(("attr", "expected"), [
    ("", "not a task name nor MODULE:CALLABLE"),
    (":nothere", "has no attribute 'nothere'"),
    (":not_callable", "'not_callable' is a int, not a callable"),
    (":wrong", "the factory returned dict; return a Task"),
    (":empty", "the factory returned an empty list"),
    (":boom", "the factory raised RuntimeError: no data here"),
])
def test_bad_factory_is_one_line(factory_module, attr, expected):
    spec = f"{factory_module}{attr}"
    with pytest.raises(GAError) as err:
        load_factory(spec)
    assert expected in str(err.value) and "\n" not in str(err.value)
    assert isinstance(err.value, InputError if attr in ("", ":nothere", ":not_callable") else TaskError)


# ---- the CLI end to end on a tiny model ------------------------------------------------------------------
@pytest.fixture(scope="module")
def user_results(tiny_llama_dir, tmp_path_factory):
    import os

    out = tmp_path_factory.mktemp("user_tasks")
    model = ["--model", str(tiny_llama_dir)]
    old = os.getcwd()
    os.chdir(ROOT)  # examples.task_factory is importable from the repository root
    try:
        for src, extra in (("file", ["--task-file", str(EXAMPLE)]),
                           ("factory", ["--task", "examples.task_factory:make_task", "--n", "6"])):
            for cmd in (["eval"], ["scan"], ["detect", "--reading", "summary"], ["ablate", "--heads", "1.0,1.2"],
                        ["pattern", "--layer", "1", "--prompt", "2"]):
                assert main([*cmd, *model, *extra, "--out", str(out / src)]) == 0, (src, cmd)  # one study folder
    finally:
        os.chdir(old)
    return out


@pytest.mark.parametrize(("src", "name", "n"), [("file", "tasks.jsonl", 8), ("factory", "crates", 6)])
def test_user_task_runs_through_every_subcommand(user_results, src, name, n):
    d = user_results / src
    ev = json.loads((d / "eval.json").read_text())
    assert ev["meta"]["task_name"] == name and ev["meta"]["n"] == n and len(ev["rows"]) == n
    assert 0 <= ev["meta"]["accuracy"] <= 1
    scan = json.loads((d / "scan.json").read_text())
    assert scan["meta"]["complete"] and scan["meta"]["task_name"] == name and len(scan["rows"]) == 8
    det = json.loads((d / "detect.json").read_text())
    assert det["meta"]["task_name"] == name and all(r["rule"] for r in det["rows"])
    abl = json.loads((d / "ablate.json").read_text())["rows"]
    assert [r["task"] for r in abl] == [name] and 0 <= abl[0]["ablated"] <= 1
    pat = json.loads((d / "pattern.json").read_text())["meta"]
    assert pat["task_name"] == name and pat["prompt_index"] == 2 and len(pat["segments"]) == 4
    if src == "file":  # the pattern's prompt and segments are line 3 of the file, spans in tokens
        obj = json.loads(EXAMPLE.read_text().splitlines()[2])
        assert pat["prompt"] == obj["prompt"]
        assert [s["label"] for s in pat["segments"]] == [s["label"] for s in obj["segments"]]


def test_report_on_user_task_results(user_results):
    d = user_results / "file"
    assert main(["report", str(d)]) == 0
    html = (d / "report.html").read_text()
    model = Path(json.loads((d / "meta.json").read_text())["model_name"]).name
    assert f"{model} · tasks.jsonl: accuracy" in html and "head scan" in html
