"""Issue 2: packaging (editable + wheel expose gather_aggregate.adapters) and lazy imports."""

from __future__ import annotations

import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "transformer_lens")


def _run(code: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, **kw)


def _best_time(cmd: list[str], repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=True)
        best = min(best, time.perf_counter() - t)
    return best


def test_import_is_lazy():
    out = _run(f"import sys, gather_aggregate; print(','.join(m for m in {HEAVY!r} if m in sys.modules))")
    assert out.stdout.strip() == "", f"import gather_aggregate pulled in {out.stdout.strip()}"
    out = _run("import sys; from gather_aggregate import cli; cli.build_parser(); "
               f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))")
    assert out.stdout.strip() == ""


def test_import_and_help_are_fast_against_a_baseline():
    baseline = _best_time([sys.executable, "-c", "pass"])
    t_import = _best_time([sys.executable, "-c", "import gather_aggregate"])
    t_help = _best_time([sys.executable, "-m", "gather_aggregate.cli.parser", "--help"])
    # overhead over a bare interpreter start; targets are <2 s import and <1 s --help in total
    assert t_import - baseline < 1.0, (t_import, baseline)
    assert t_help - baseline < 0.9, (t_help, baseline)


def test_editable_install_maps_adapters():
    out = _run("import gather_aggregate.adapters as a; print(a.__file__)")
    assert Path(out.stdout.strip()) == REPO / "adapters" / "__init__.py"
    # and the top-level name `adapters` is NOT claimed by us
    out = _run("import importlib.util; s = importlib.util.find_spec('adapters'); "
               "print(s.origin if s else None)", cwd="/")
    assert str(REPO) not in out.stdout


def test_wheel_contains_and_imports_adapters(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path / "dist")], check=True, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("gather_aggregate-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "gather_aggregate/adapters/__init__.py" in names
    assert not any(n.startswith("adapters/") for n in names)
    zoo = REPO / "gather_aggregate" / "zoo"
    shipped = sorted(p.parent.name for p in zoo.glob("*/config.json"))
    for model in shipped:  # every file of every shipped zoo model is package data
        for f in (zoo / model).iterdir():
            assert f"gather_aggregate/zoo/{model}/{f.name}" in names, f"{model}/{f.name} missing from the wheel"
    for f in (zoo / "hybrids").rglob("*.*"):  # the hybrid sweep and hybrids shipped with the zoo (issue 23)
        assert f"gather_aggregate/zoo/{f.relative_to(zoo).as_posix()}" in names, f"{f} missing from the wheel"
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True)
    code = (f"import sys; sys.path.insert(0, {str(target)!r}); import gather_aggregate.adapters as a, gather_aggregate as g; "
            "print(a.__file__); print(g.__file__)")
    out = _run(code, cwd=str(tmp_path)).stdout.split()
    assert out[0].startswith(str(target)) and out[0].endswith("gather_aggregate/adapters/__init__.py")
    assert out[1].startswith(str(target))
    listed = _run(f"import sys; sys.path.insert(0, {str(target)!r}); from gather_aggregate.zoo import list_zoo; "
                  "print(','.join(list_zoo()))", cwd=str(tmp_path)).stdout.strip()
    assert listed == ",".join(shipped)


def test_cli_help_lists_subcommands():
    out = subprocess.run([sys.executable, "-m", "gather_aggregate.cli.parser", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for cmd in ("demo", "eval", "scan", "detect", "ablate", "pattern", "report", "zoo"):
        assert cmd in out.stdout


@pytest.mark.parametrize("argv", [["eval", "--model", "/nonexistent/dir"]])
def test_cli_errors_are_one_line(argv):
    out = subprocess.run([sys.executable, "-m", "gather_aggregate.cli.parser", *argv], capture_output=True, text=True,
                         env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 2
    lines = [ln for ln in out.stderr.splitlines() if ln.strip() and "warn" not in ln.lower()]
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert "no such model directory" in lines[0]
