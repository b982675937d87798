"""Issue 9: the example notebooks run headless (nbclient) on the shipped zoo."""

from __future__ import annotations

from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.notebook
@pytest.mark.parametrize("name", ["quickstart.ipynb", "reproduce_paper.ipynb"])
def test_notebook_runs_headless(name, tmp_path):
    import nbformat
    from nbclient import NotebookClient

    from gather_aggregate.zoo import list_zoo

    assert list_zoo(), "the toy zoo is not shipped"
    nb = nbformat.read(EXAMPLES / name, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any(o.get("output_type") in ("stream", "execute_result", "display_data") for o in outputs)
