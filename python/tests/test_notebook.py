"""docs/python.ipynb, executed: it runs without an error, and each cell tagged `checked` gives the
text it gave when the notebook was written (python/notebook/make.py)."""

from __future__ import annotations

import copy

import pytest

from conftest import ROOT


def texts(cell) -> list:
    """A code cell's results, as text (`text/plain`); printed streams (progress, warnings) are
    not compared."""
    out = []
    for output in cell.get("outputs", []):
        if output.get("output_type") in ("execute_result", "display_data"):
            out.append(output.get("data", {}).get("text/plain", ""))
    return out


@pytest.mark.torch
def test_the_notebook_runs_and_gives_its_outputs():
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("transformers")
    committed = nbformat.read(ROOT / "docs" / "python.ipynb", as_version=4)
    fresh = copy.deepcopy(committed)
    for cell in fresh.cells:
        if cell.cell_type == "code":
            cell.outputs = []
    nbclient.NotebookClient(fresh, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    checked = 0
    for old, new in zip(committed.cells, fresh.cells):
        if old.cell_type != "code":
            continue
        assert not any(o.get("output_type") == "error" for o in new.outputs), new.source
        if "checked" in old.metadata.get("tags", []):
            assert texts(new) == texts(old), new.source
            checked += 1
    assert checked >= 4
