"""Atomic result files: write to a temporary file in the same directory, then rename.

A reader (or a resumed scan) therefore sees either the previous complete file
or the new complete file, never a partial one.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gather_aggregate.core.errors import InputError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _file_above(path: Path) -> Path | None:
    """The first existing non-directory among ``path``'s parents (where a directory must be), if any."""
    return next((p for p in path.parents if p.exists() and not p.is_dir()), None)


def check_output_file(path: str | os.PathLike[str], *, twin: bool = False) -> Path:
    """Refuse, before any work and without touching the disk, a results file that cannot be written: ``path`` is a
    directory, or lies under a regular file.  ``twin=True`` (a JSON table with a CSV twin, :func:`write_table`)
    also refuses a ``.csv`` path, whose twin would be the file itself.  Each is one :class:`InputError` naming the
    fix; the one home of these rules, for :func:`atomic_write`, :func:`write_table` and a scan's ``out=``."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"cannot write {str(path)!r}: it is a directory; pass a file path in it, e.g. "
                         f"{str(path / ('scan.json' if twin else 'results.json'))!r}")
    file = _file_above(path)
    if file is not None:
        raise InputError(f"cannot write {str(path)!r} ({str(file)!r} is a file, not a directory); choose a "
                         "writable output directory (e.g. --out /tmp/ga_out)")
    if twin and path.suffix.lower() == ".csv":
        raise InputError(f"cannot write the table to {str(path)!r}: it is written as JSON with its CSV twin beside "
                         f"it, so pass the .json path, e.g. {str(path.with_suffix('.json'))!r}")
    return path


def atomic_write(path: str | os.PathLike[str], write: Callable[[Path], Any]) -> Path:
    """Let ``write(tmp)`` fill a temporary file next to ``path``, then ``os.replace`` it into place (also for
    binary writers: ``torch.save``, safetensors).  The file gets the permissions a plain ``open`` would give it
    (``mkstemp`` makes 0600; results are meant to be shared); on an error the temporary file is removed."""
    path = check_output_file(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise InputError(f"cannot write {str(path)!r} ({exc.strerror or exc}); choose a writable output "
                         "directory (e.g. --out /tmp/ga_out)") from None
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` atomically (:func:`atomic_write`)."""

    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())

    return atomic_write(path, write)


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, default=_jsonable))


def rows_to_csv(rows: Sequence[dict[str, Any]]) -> str:
    if not rows:
        return ""
    cols: list[str] = []
    for r in rows:
        cols += [c for c in r if c not in cols]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: v if isinstance(v, (str, int, float)) or v is None else json.dumps(v, default=_jsonable)
                    for k, v in r.items()})
    return buf.getvalue()


def write_csv(path: str | os.PathLike[str], rows: Sequence[dict[str, Any]]) -> Path:
    """Write ``rows`` as CSV atomically (the twin of a JSON result; nested values as JSON)."""
    return atomic_write_text(path, rows_to_csv(rows))


def write_table(rows: Sequence[dict[str, Any]], path: str | os.PathLike[str], meta: dict[str, Any] | None = None) -> Path:
    """Write ``path`` (.json with ``{"meta", "rows"}``) and a sibling ``.csv``, both atomically.

    Two files cannot be replaced in one atomic step, so the order keeps them
    consistent at every instant: the old CSV twin is removed first, then the
    JSON is replaced, then the new CSV is written.  A process killed at any
    moment (SIGKILL included) leaves a JSON that parses and either no CSV or a
    CSV with exactly the JSON's rows; the JSON is the one a resumed run reads.
    """
    if isinstance(rows, (str, bytes, dict)) or not all(isinstance(r, dict) for r in rows) \
            or not isinstance(meta, (dict, type(None))):  # rows [1, 2] failed after the JSON was replaced
        raise InputError("write_table takes rows as a list of dicts (one per row) and meta as a dict or None, got "
                         f"{type(rows).__name__} rows and {type(meta).__name__} meta")
    path = check_output_file(path, twin=True)  # before the twin goes: a directory's "<dir>.csv" is not ours
    twin = path.with_suffix(".csv")
    with contextlib.suppress(FileNotFoundError):
        twin.unlink()
    atomic_write_json(path, {"meta": meta or {}, "rows": list(rows)})
    atomic_write_text(twin, rows_to_csv(rows))
    return path


def _jsonable(v: Any) -> Any:
    try:
        import torch

        if isinstance(v, torch.Tensor):
            return v.tolist()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(v, Path):
        return str(v)
    if isinstance(v, (set, tuple)):
        return list(v)
    return str(v)


def read_json(path: Path, error: type[Exception], missing: str, invalid: str) -> Any:
    """The JSON in ``path``; a missing file raises ``error(missing)``, invalid JSON ``error`` naming the file,
    the parser's complaint and ``invalid`` (what to do about it)."""
    if not path.is_file():
        raise error(missing)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:  # both are ValueErrors: damaged or not text at all
        raise error(f"{path} is not valid JSON ({err}); {invalid}") from None


def out_dir(out: str | os.PathLike[str] | None, default: str) -> Path:
    """The output directory ``out`` (or ``default``), created and checked writable; a clear error if it is not."""
    path = Path(out or default)
    file = path if path.exists() and not path.is_dir() else _file_above(path)
    if file is not None:
        raise InputError(f"cannot write to output directory {str(path)!r} ({str(file)!r} is a file, not a "
                         "directory); pass --out with a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".ga_write_test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise InputError(f"cannot write to output directory {str(path)!r} ({exc.strerror}); "
                         "pass --out with a writable directory") from None
    return path
