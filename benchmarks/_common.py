"""Shared helpers of the benchmark scripts: single-threaded runs, memory-capped children, peak-RSS probes.

Each measurement that may use a lot of memory runs in a fresh child process whose address space is capped
with ``RLIMIT_AS``, so an oversized request fails there with ``MemoryError`` (reported as such) instead of
waking the kernel's OOM killer.  Peak memory is the growth of the child's resident set during the measured
call: free heap memory is first handed back to the kernel (``malloc_trim``), then the kernel's high-water mark
(``VmHWM``) is reset through ``/proc/self/clear_refs``, just before the call.
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

GiB = 1024**3
MiB = 1024**2
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def single_thread() -> None:
    """Pin torch (and the BLAS libraries it may load) to one thread."""
    for var in THREAD_VARS:
        os.environ.setdefault(var, "1")
    import torch

    torch.set_num_threads(1)


def limit_address_space(gib: float) -> None:
    """Cap this process' virtual address space (RLIMIT_AS) at ``gib`` GiB."""
    limit = int(gib * GiB)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _status_kib(field: str) -> int | None:
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    m = re.search(rf"^{field}:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) if m else None


def rss_mib() -> float | None:
    kib = _status_kib("VmRSS")
    return None if kib is None else kib / 1024


def _malloc_trim() -> None:
    """Return free glibc heap memory to the kernel (no-op elsewhere)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class PeakRSS:
    """Context manager: ``delta_mib`` = peak RSS during the block minus RSS at its start (Linux).

    Falls back to ``ru_maxrss`` (the whole process' peak, ``exact=False``) where the high-water mark
    cannot be reset.
    """

    def __enter__(self) -> PeakRSS:
        import gc

        gc.collect()
        _malloc_trim()  # hand freed heap pages back, so that reused free memory does not hide the call's needs
        self.start_mib = rss_mib()
        try:
            Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
            self.exact = True
        except OSError:
            self.exact = False
        return self

    def __exit__(self, *exc: Any) -> None:
        hwm = _status_kib("VmHWM") if self.exact else None
        if hwm is None:
            self.exact = False
            hwm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        self.peak_mib = hwm / 1024
        self.delta_mib = self.peak_mib - (self.start_mib or 0.0)


def measure(fn: Callable[[], Any], repeats: int = 1) -> tuple[dict[str, float], Any]:
    """Run ``fn`` ``repeats`` times: min (and first) wall and CPU seconds, and the peak RSS growth over all runs."""
    walls, cpus = [], []
    out = None
    with PeakRSS() as mem:
        for _ in range(repeats):
            out = None  # free the previous result before the next call allocates its own
            w, c = time.perf_counter(), time.process_time()
            out = fn()
            walls.append(time.perf_counter() - w)
            cpus.append(time.process_time() - c)
    return {"wall_s": min(walls), "cpu_s": min(cpus), "first_wall_s": walls[0], "dpeak_mib": mem.delta_mib,
            "peak_mib": mem.peak_mib, "peak_exact": mem.exact}, out


def run_child(script: str | Path, spec: dict[str, Any], *, max_gib: float, timeout: float = 3600) -> dict[str, Any]:
    """Run ``script --child JSON`` in a fresh, single-threaded process capped at ``max_gib`` GiB.

    The child prints one JSON object as its last stdout line.  A failure (a ``MemoryError`` under the cap,
    any other error, a timeout) comes back as ``{"error": "..."}``.
    """
    env = dict(os.environ, HF_HUB_OFFLINE="1", **{v: "1" for v in THREAD_VARS})
    cmd = [sys.executable, str(script), "--child", json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout,
                              preexec_fn=lambda: limit_address_space(max_gib))
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode == 0 and lines:
        return json.loads(lines[-1])
    tail = (proc.stderr.strip().splitlines() or ["(no stderr)"])[-1]
    if "MemoryError" in proc.stderr or "DefaultCPUAllocator: can't allocate memory" in proc.stderr:
        return {"error": f"failed under the {max_gib:g} GiB limit (MemoryError)", "detail": tail}
    return {"error": f"exit code {proc.returncode}: {tail}"}


def machine() -> str:
    """One line describing where the numbers come from."""
    import platform

    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        load = " load avg " + " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        load = ""
    return (f"{cpu}, {os.cpu_count()} cores,{load}; torch {torch.__version__}, "
            f"{torch.get_num_threads()} thread(s); {time.strftime('%Y-%m-%d %H:%M')}")
