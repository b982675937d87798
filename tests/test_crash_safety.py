"""Issue 25: a scan killed at any moment (SIGKILL) leaves result files that parse and agree, and --resume
finishes them to exactly what an uninterrupted run writes.

The child process runs :func:`gather_aggregate.scan.exact.exact_scan` with ``out=`` and
``resume=True``; its ``os.replace`` is wrapped to announce each file replacement
(before and after it, with a short pause), so the parent can SIGKILL it at chosen
points: before any write, between a JSON and its CSV twin, mid-run and late.
Each killed run is resumed by the next one; the last one finishes.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

CHILD = textwrap.dedent("""
    import os, sys, time
    import torch
    torch.set_num_threads(1)
    from gather_aggregate import load_model
    from gather_aggregate.scan.exact import exact_scan

    real = os.replace
    def announced(a, b):
        print("before", os.path.basename(b), flush=True); time.sleep(0.03)
        real(a, b)
        print("after", os.path.basename(b), flush=True); time.sleep(0.03)
    os.replace = announced

    def metric(logits):
        return logits[:, -1].log_softmax(-1)[:, 1].mean()

    model = load_model(sys.argv[1])
    tokens = torch.randint(0, 50, (4, 7), generator=torch.Generator().manual_seed(0))
    print("ready", flush=True)
    exact_scan(model, tokens, metric, out=sys.argv[2], resume=True, max_rows=4, progress=False)
    print("done", flush=True)
""")


def metric(logits):  # the same qualname as the child's: the scan's task fingerprint includes it
    return logits[:, -1].log_softmax(-1)[:, 1].mean()


def _check_consistent(path: Path) -> int:
    """Every file present parses; a CSV twin holds exactly the JSON's rows.  Returns the rows done."""
    if not path.exists():
        assert not path.with_suffix(".csv").exists(), "a CSV without its JSON"
        return 0
    data = json.loads(path.read_text())  # parses
    rows = data["rows"]
    twin = path.with_suffix(".csv")
    if twin.exists():
        with twin.open() as f:
            table = list(csv.DictReader(f))
        assert len(table) == len(rows)
        for c, j in zip(table, rows, strict=True):
            assert (int(c["layer"]), int(c["head"]), float(c["score"])) == (j["layer"], j["head"], j["score"])
    return len(rows)


def _run_until(model_dir: Path, out: Path, kill_at: int | None) -> tuple[int, list[str]]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(model_dir), str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    events: list[str] = []
    try:
        for line in proc.stdout:
            events.append(line.strip())
            if kill_at is not None and len(events) == kill_at:
                os.kill(proc.pid, signal.SIGKILL)
                break
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, events


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_killed_scans_leave_consistent_files_and_resume_exactly(tiny_llama_dir, tmp_path):
    from gather_aggregate import load_model
    from gather_aggregate.scan.exact import exact_scan

    out = tmp_path / "scan.json"
    # events: 1 = ready, then before/after each replace: 2 = the first JSON written to its temporary file but
    # not renamed (nothing in place yet), 3 = the first JSON in place and its CSV twin not written, 8 = mid-run,
    # between the third chunk's JSON and CSV
    done_rows = []
    for kill_at in (2, 3, 8):
        rc, events = _run_until(tiny_llama_dir, out, kill_at)
        assert rc == -signal.SIGKILL, events
        done_rows.append(_check_consistent(out))
    rc, events = _run_until(tiny_llama_dir, out, None)
    assert rc == 0 and events[-1] == "done", events
    assert _check_consistent(out) == 8
    assert done_rows[0] == 0 and done_rows[-1] > 0 and done_rows == sorted(done_rows)
    # exactly what an uninterrupted run writes
    ref = tmp_path / "ref" / "scan.json"
    model = load_model(tiny_llama_dir)
    tokens = torch.randint(0, 50, (4, 7), generator=torch.Generator().manual_seed(0))
    exact_scan(model, tokens, metric, out=ref, max_rows=4, progress=False)
    assert out.read_text() == ref.read_text()
    assert out.with_suffix(".csv").read_text() == ref.with_suffix(".csv").read_text()
    assert json.loads(out.read_text())["meta"]["complete"] is True
