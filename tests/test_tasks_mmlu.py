"""MMLU loading: shipped sample, local JSON / JSONL / parquet files, clear errors."""

from __future__ import annotations

import json
import warnings

import pytest

from gather_aggregate.core.errors import GAWarning, TaskError
from gather_aggregate.tasks import MMLUItem, MMLUTask, load_mmlu
from gather_aggregate.tasks.mmlu import SAMPLE_PATH

ROWS = [
    {"question": "2 + 2 =", "subject": "arithmetic", "choices": ["3", "4", "5", "22"], "answer": 1},
    {"question": "Capital of France?", "subject": "geography", "choices": ["Paris", "Rome", "Oslo", "Bern"], "answer": 0},
]


def test_shipped_sample_has_the_cais_columns():
    rows = json.loads(SAMPLE_PATH.read_text())
    assert len(rows) >= 20
    assert all(set(r) == {"question", "subject", "choices", "answer"} for r in rows)
    assert all(len(r["choices"]) == 4 and isinstance(r["answer"], int) for r in rows)
    assert len({r["subject"] for r in rows}) >= 10
    assert {r["answer"] for r in rows} == {0, 1, 2, 3}  # answers not all in one slot


def test_offline_auto_falls_back_to_sample(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.warns(GAWarning, match="22-question sample, not cais/mmlu"):  # a sample score must not pass for MMLU
        auto = load_mmlu("auto")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # choosing the sample is not warned about
        assert auto == load_mmlu("sample")
    with pytest.raises(TaskError, match="needs the network"):
        load_mmlu("hub")


def test_online_auto_falls_back_when_hub_fails(monkeypatch):
    import gather_aggregate.tasks.mmlu as mm

    for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(k, raising=False)
    calls = []

    def broken(split, subjects):
        calls.append((split, subjects))
        raise ConnectionError("no network")

    monkeypatch.setattr(mm, "_from_hub", broken)
    with pytest.warns(UserWarning, match="shipped sample"):
        items = load_mmlu("auto")
    assert calls == [("test", None)] and items == load_mmlu("sample")
    with pytest.raises(TaskError, match="could not load cais/mmlu"):
        load_mmlu("hub")


@pytest.mark.parametrize("fmt", ["json", "jsonl", "json_columns", "parquet"])
def test_local_files(tmp_path, fmt):
    if fmt == "json":
        path = tmp_path / "m.json"
        path.write_text(json.dumps(ROWS))
    elif fmt == "jsonl":
        path = tmp_path / "m.jsonl"
        path.write_text("\n".join(json.dumps(r) for r in ROWS))
    elif fmt == "json_columns":
        path = tmp_path / "m.json"
        path.write_text(json.dumps({k: [r[k] for r in ROWS] for k in ROWS[0]}))
    else:
        pa = pytest.importorskip("pyarrow")
        import pyarrow.parquet as pq

        path = tmp_path / "m.parquet"
        pq.write_table(pa.Table.from_pylist(ROWS), path)
    items = load_mmlu(path)
    assert items == [MMLUItem(r["question"], tuple(r["choices"]), r["answer"], r["subject"]) for r in ROWS]
    assert load_mmlu(path, subjects=["geography"]) == items[1:]


def test_letter_answers_are_accepted(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps([{**ROWS[0], "answer": "B"}]))
    assert load_mmlu(path)[0].answer == 1


def test_missing_columns_are_named(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps([{"question": "q", "options": ["a", "b"], "label": 0}]))
    with pytest.raises(TaskError, match=r"missing the column\(s\) \['choices', 'answer'\]") as err:
        load_mmlu(path)
    assert "options" in str(err.value)  # says what it found


def test_empty_dataset(tmp_path):
    path = tmp_path / "m.json"
    path.write_text("[]")
    with pytest.raises(TaskError, match="empty dataset"):
        load_mmlu(path)
    with pytest.raises(TaskError, match="items is empty"):
        MMLUTask(items=[])
    with pytest.raises(TaskError, match="no questions for subjects"):
        load_mmlu("sample", subjects=["underwater_basket_weaving"])


def test_bad_rows(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps([{**ROWS[0], "answer": 7}]))
    with pytest.raises(TaskError, match="row 0: answer 7 is out of range for 4 choices"):
        load_mmlu(path)
    with pytest.raises(TaskError, match="no MMLU file"):
        load_mmlu(tmp_path / "nope.json")


def test_items_and_fewshot_pool():
    items = [MMLUItem(r["question"], tuple(r["choices"]), r["answer"], r["subject"]) for r in ROWS]
    pool = load_mmlu("sample")
    specs = MMLUTask("letter", k_shot=2, items=items, fewshot=pool).specs(seed=0)
    assert [s.meta["question"] for s in specs] == [r["question"] for r in ROWS]
    assert all(s.prompt.count("Answer:") == 3 for s in specs)
    assert specs[0].prompt.startswith("The following are multiple choice questions (with answers) about arithmetic.")
