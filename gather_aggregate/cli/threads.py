"""How many CPU threads torch may use: what is free, not every core.

torch starts one intra-op thread per core.  On a machine whose cores are busy with other work, those threads spin
waiting for one another on cores they do not get, and a run is many times slower than with one thread.
``--threads auto`` (the default) takes the cores this process may use (``os.sched_getaffinity``) less the load
average of the last minute, rounded, and at least 1; ``--threads N`` sets it.  An ``OMP_NUM_THREADS`` already set
is left as it is.
"""

from __future__ import annotations

import os
import sys


def free_cores() -> int:
    """The cores this process may run on, less the runnable load of the last minute (at least 1)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = 0.0
    return max(1, min(cores, round(cores - load)))


def choose_threads(spec: str | None) -> int | None:
    """The thread count for ``--threads spec`` (``auto``/None: :func:`free_cores`, unless ``OMP_NUM_THREADS`` is
    set, then None: leave it); set for torch now if it is imported, else through the environment it reads."""
    if spec in (None, "auto") and os.environ.get("OMP_NUM_THREADS"):
        return None
    n = free_cores() if spec in (None, "auto") else int(spec)
    os.environ["OMP_NUM_THREADS"] = str(n)
    os.environ.setdefault("MKL_NUM_THREADS", str(n))
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(n)
    return n


def threads_arg(text: str) -> str:
    """``--threads``: ``auto`` or a positive int."""
    import argparse

    if text == "auto" or (text.isdigit() and int(text) >= 1):
        return text
    raise argparse.ArgumentTypeError(f"--threads must be auto or a positive number, got {text!r}")
