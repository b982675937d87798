"""How many torch threads a command runs: the cores that are free, unless the user says.

Torch starts one intra-op thread per core.  Where other processes keep the cores busy, those threads spin against
them: the demo took 98 s on an idle 2-core machine and 698 s beside two single-thread jobs.  So a command runs

* ``--threads N``: N threads;
* else, where ``OMP_NUM_THREADS`` is set: torch's choice from it (the user decided);
* else (``auto``): the cores this process may use (``os.sched_getaffinity``) less the one-minute load average,
  rounded, at least 1.  The load average lags by about a minute: just after a heavy job ends this takes fewer
  threads than the machine has, which costs less than spinning does.
"""

from __future__ import annotations

import os


def usable_cpus() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def free_cpus() -> int:
    """The usable cores less the one-minute load average (rounded), at least 1."""
    cpus = usable_cpus()
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return cpus
    return max(1, min(cpus, cpus - int(load + 0.5)))


def choose_threads(requested: int | str | None) -> int | None:
    """The thread count for ``--threads requested`` (``None``/``"auto"``: see the module), or ``None`` to leave
    torch's own choice (``OMP_NUM_THREADS`` set)."""
    if requested not in (None, "auto"):
        return int(requested)  # type: ignore[arg-type]
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    return free_cpus()


def apply_threads(requested: int | str | None) -> int | None:
    """Set torch's intra-op thread count as :func:`choose_threads` says; returns what was set."""
    n = choose_threads(requested)
    if n is not None:
        import torch

        torch.set_num_threads(n)
    return n
