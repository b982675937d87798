"""Issue 24: exact scans and ablation sweeps sharded over a local Ray cluster (2 workers).

Shows: the same numbers as one process; a worker killed mid-shard has its shard re-run with nothing lost or
counted twice; a clear error when the cluster cannot be reached; Ray imported only when a job runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")

from gather_aggregate.core import errors  # noqa: E402
from gather_aggregate.scan.distributed import connect, run_sharded  # noqa: E402
from gather_aggregate.scan.exact import exact_scan  # noqa: E402
from gather_aggregate.studies.ablation_tables import ablation_sweep  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # test helpers travel by value
    connect(None, num_cpus=2)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def task(tiny_llama_dir):
    from gather_aggregate import load_model

    model = load_model(tiny_llama_dir)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.d_vocab, (4, 12), generator=g)
    target = torch.randint(0, model.d_vocab, (4,), generator=g)

    def metric(logits):
        return logits[:, -1].log_softmax(-1).gather(1, target[:, None]).mean()

    return model, tokens, metric


def _die_once(marker: str, fn):
    """``fn``, except that the first call in any process after ``marker`` is armed kills that process."""

    def wrapped(*args):
        try:
            os.remove(marker)  # disarm (one process wins), then die without cleanup, as a killed worker does
        except FileNotFoundError:
            return fn(*args)
        os._exit(1)

    wrapped.__qualname__ = getattr(fn, "__qualname__", "metric")
    return wrapped


def test_ray_exact_scan_equals_one_process_even_when_a_worker_is_killed(cluster, task, tmp_path):
    model, tokens, metric = task
    single = exact_scan(model, tokens, metric, progress=False)
    marker = tmp_path / "kill-armed"
    marker.write_text("")
    out = tmp_path / "scan.json"
    dying = _die_once(str(marker), metric)  # the first worker to score a head dies mid-shard
    sharded = exact_scan(model, tokens, dying, progress=False, ray=True, num_workers=2, out=out)
    assert not marker.exists()  # a worker did die, and its shard was re-run on a fresh one
    assert sharded.scores() == single.scores()  # bit for bit: the same stacked forwards
    assert [(r["layer"], r["head"]) for r in sharded.rows] == [(r["layer"], r["head"]) for r in single.rows]
    saved = json.loads(out.read_text())
    keys = [(r["layer"], r["head"]) for r in saved["rows"]]
    assert sorted(keys) == sorted(model.all_heads()) and len(set(keys)) == len(keys)  # none lost, none twice
    assert saved["meta"]["complete"] and saved["meta"]["mode"] == "exact"
    assert exact_scan(model, tokens, metric, out=out, resume=True, progress=False).scores() == single.scores()


def test_ablation_sweep_on_ray_equals_one_process(cluster, task, tmp_path):
    model, tokens, metric = task
    sets = [[(0, 0)], [(0, 1), (1, 0)], [(1, 1)], [(0, 0), (0, 1)], [(1, 0)]]
    local = ablation_sweep(model, tokens, metric, sets)
    sharded = ablation_sweep(model, tokens, metric, sets, ray=True, shard_size=2, out=tmp_path / "sweep.json")
    assert [(r["heads"], r["drop"]) for r in sharded] == [(r["heads"], r["drop"]) for r in local]
    assert len(json.loads((tmp_path / "sweep.json").read_text())["rows"]) == len(sets)


def test_run_sharded_reruns_a_killed_shard_once_and_resumes(cluster, tmp_path):
    marker = tmp_path / "armed"
    marker.write_text("")

    def load():
        return {"offset": 100}

    def run(state, shard):
        if shard == 3 and marker.exists():
            marker.unlink()
            os._exit(1)
        return [{"shard": shard, "value": state["offset"] + shard, "pid": os.getpid()}]

    out = tmp_path / "table.json"
    rows = run_sharded(load, run, list(range(6)), num_workers=2, out=out, meta={"job": "t"})
    assert [r["shard"] for r in rows] == list(range(6)) and [r["value"] for r in rows] == list(range(100, 106))
    assert not marker.exists()
    saved = json.loads(out.read_text())
    assert [r["shard"] for r in saved["rows"]] == list(range(6)) and saved["meta"]["complete"]
    assert len({r["pid"] for r in rows}) >= 2  # the shards ran on more than one worker

    # resume: a table that lists shards 0-2 as done; only 3-5 run again
    partial = {"meta": {"job": "t", "done_shards": ["0", "1", "2"], "complete": False},
               "rows": saved["rows"][:3]}
    out.write_text(json.dumps(partial))
    ran = []
    resumed = run_sharded(load, run, list(range(6)), num_workers=2, out=out, meta={"job": "t"}, resume=True,
                          on_shard=ran.extend)
    assert sorted(r["shard"] for r in ran) == [3, 4, 5]
    assert [r["shard"] for r in resumed] == list(range(6))
    with pytest.raises(errors.ResumeMismatchError, match="job"):
        run_sharded(load, run, list(range(6)), out=out, meta={"job": "other"}, resume=True)


def test_unreachable_cluster_is_a_clear_error(task, tiny_llama_dir, tmp_path, capsys):
    from gather_aggregate.cli.parser import main

    model, tokens, metric = task
    with pytest.raises(errors.ClusterUnreachableError, match="ray start --head"):
        exact_scan(model, tokens, metric, progress=False, ray_address="127.0.0.1:1")
    with pytest.raises(errors.InputError, match="Ray address"):
        connect("not-an-address")
    args = ["scan", "--model", str(tiny_llama_dir), "--task", "kv", "--n", "4", "--dict-size", "4",
            "--out", str(tmp_path), "--ray", "127.0.0.1:1"]
    assert main(args) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # (above it: the loader's progress bar)
    assert last.startswith("gather-aggregate scan: error: no Ray cluster answers at '127.0.0.1:1'")
    assert "ray start --head" in last


def test_ray_is_imported_lazily():
    code = "import gather_aggregate.scan.distributed, gather_aggregate.scan.exact, sys; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parent)
    assert out.stdout.strip() == "False"
