"""Issue 7: every Python code block in the docs runs (except those marked `# requires: gpu` / `hub`)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])
FENCE = re.compile(r"```python\n(.*?)```", re.S)


def blocks(path: Path) -> list[str]:
    return [b for b in FENCE.findall(path.read_text()) if not re.search(r"#\s*requires:.*\b(gpu|hub)\b", b)]


def test_docs_have_runnable_blocks():
    assert any(blocks(p) for p in DOCS), "no runnable Python blocks found in the docs"


@pytest.mark.parametrize("path", [p for p in DOCS if blocks(p)], ids=lambda p: p.name)
def test_doc_code_blocks_run(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    namespace: dict = {"__name__": f"doc_{path.stem}"}
    for i, code in enumerate(blocks(path)):
        try:
            exec(compile(code, f"{path.name}[block {i}]", "exec"), namespace)
        except Exception as exc:  # pragma: no cover - shown on failure
            raise AssertionError(f"{path.name} block {i} failed: {type(exc).__name__}: {exc}\n{code}") from exc
