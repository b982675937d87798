"""The CLI's torch thread count: the free cores unless the user says (issue 39: a busy machine made the demo 7x
slower, torch's two threads spinning on two busy cores)."""

from __future__ import annotations

import os

import pytest
import torch

from gather_aggregate.core import threads


@pytest.mark.parametrize(("cpus", "load", "expected"), [(2, 0.2, 2), (2, 1.4, 1), (2, 2.0, 1), (2, 9.0, 1),
                                                        (16, 3.6, 12), (1, 0.0, 1)])
def test_auto_takes_the_usable_cores_less_the_load(monkeypatch, cpus, load, expected):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "usable_cpus", lambda: cpus)
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    assert threads.choose_threads("auto") == threads.choose_threads(None) == expected


def test_a_number_wins_and_omp_num_threads_leaves_torch_its_choice(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads.choose_threads(5) == 5
    assert threads.choose_threads("auto") is None


def test_the_cli_runs_a_command_at_the_chosen_count_and_refuses_zero(monkeypatch, capsys):
    from gather_aggregate.cli import parser

    seen = []
    monkeypatch.setitem(parser.COMMANDS, "eval", ("test_threads:_record", "test"))
    monkeypatch.setattr("test_threads._SEEN", seen, raising=False)
    before = torch.get_num_threads()
    try:
        assert parser.main(["eval", "--model", "m", "--threads", "1"]) == 0
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        monkeypatch.setattr(threads, "usable_cpus", lambda: 2)
        monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
        assert parser.main(["eval", "--model", "m"]) == 0
    finally:
        torch.set_num_threads(before)
    assert seen == [1, 2]
    with pytest.raises(SystemExit):
        parser.main(["eval", "--model", "m", "--threads", "0"])
    assert "--threads must be at least 1, got 0" in capsys.readouterr().err


_SEEN: list[int] = []


def _record(args) -> int:
    import test_threads

    test_threads._SEEN.append(torch.get_num_threads())
    return 0
