"""Issue 9: the example notebooks run headless (nbclient) on the shipped zoo."""

from __future__ import annotations

from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


#: reproduce_paper.ipynb runs the claims on every zoo model (about 3 minutes on an idle machine): a slow test
@pytest.mark.notebook
@pytest.mark.parametrize("name", ["quickstart.ipynb",
                                  pytest.param("reproduce_paper.ipynb", marks=pytest.mark.slow)])
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
    # issue 25: every figure carries a static PNG, so it renders on GitHub and in nbconvert output
    from gather_aggregate.viz.static import chromium_path

    figures = [o for o in outputs if o.get("output_type") in ("execute_result", "display_data")
               and {"application/vnd.plotly.v1+json", "image/png", "text/html"} & set(o.get("data", {}))]
    assert figures
    if chromium_path() is not None:
        assert all("image/png" in o["data"] for o in figures)
    # and a sentence after each figure says what it shows
    cells = nb.cells
    for i, c in enumerate(cells):
        if c.cell_type == "code" and "show(" in c.source:
            assert i + 1 < len(cells) and cells[i + 1].cell_type == "markdown", i
