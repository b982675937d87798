"""Issue 25: the README shows what the demo prints, number for number.

The README's block under "What the demo prints and draws" is compared with the tables a fresh
``gather-aggregate demo`` run prints (everything from "accuracy on" to the end of the Gather/Aggregate table;
the progress bars and the closing line with the wall time are not part of it).  The full run takes minutes
(eight zoo models, 32 prompts per task), so it is a slow test; the default suite checks that the block states
the demo's own defaults (prompt count and seed), so that it cannot silently describe another configuration.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def readme_block() -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text.split("## What the demo prints and draws", 1)[1]
    block = re.search(r"```\n(.*?)```", section, re.S)
    assert block, "README has no demo output block"
    return block.group(1).rstrip("\n").split("\n")


def printed_tables(stdout: str) -> list[str]:
    """The demo's summary tables: from "accuracy on" up to (not including) the report line."""
    lines = stdout.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("accuracy on"))
    end = next(i for i, line in enumerate(lines) if line.startswith("report: "))
    out = [line.rstrip() for line in lines[start:end]]
    while out and not out[-1]:
        out.pop()
    return out


def test_readme_block_states_the_demos_defaults():
    from gather_aggregate.cli.parser import build_parser

    args = build_parser().parse_args(["demo"])
    head = readme_block()[0]
    assert head == f"accuracy on {args.n} prompts per task (seed {args.seed})", head
    assert f"({args.n} prompts per task, seed {args.seed}" in (REPO / "README.md").read_text()


@pytest.mark.slow
def test_readme_block_is_what_a_fresh_demo_prints(tmp_path):
    from gather_aggregate.zoo import list_zoo

    if len(list_zoo()) < 7:
        pytest.skip("the toy zoo is not shipped")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, "-m", "gather_aggregate.cli.parser", "demo", "--out", str(tmp_path)],
                         capture_output=True, text=True, env=env, timeout=1800)
    assert run.returncode == 0, run.stderr[-2000:]
    assert printed_tables(run.stdout) == readme_block()
