"""Issue 39 (10): torch takes the cores that are free, not every core (`--threads auto`), or `--threads N`."""

from __future__ import annotations

import os

import pytest

from gather_aggregate.cli import threads


@pytest.fixture
def env(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    set_to = []
    import torch

    monkeypatch.setattr(torch, "set_num_threads", set_to.append)
    return set_to


@pytest.mark.parametrize("load,expected", [(0.0, 4), (1.2, 3), (2.0, 2), (3.6, 1), (9.0, 1)])
def test_auto_takes_the_cores_the_load_leaves(env, monkeypatch, load, expected):
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    assert threads.choose_threads("auto") == expected
    assert env == [expected] and os.environ["OMP_NUM_THREADS"] == str(expected)


def test_an_explicit_count_and_a_set_environment_win(env, monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    assert threads.choose_threads("3") == 3 and env == [3]
    assert threads.choose_threads("auto") is None and env == [3]  # OMP_NUM_THREADS is now set: kept


def test_the_option_is_checked_before_anything_runs():
    from gather_aggregate.cli.parser import main

    with pytest.raises(SystemExit) as exit_:
        main(["eval", "--model", "M", "--threads", "0"])
    assert exit_.value.code == 2
