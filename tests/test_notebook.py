"""notebooks/replay.ipynb: committed without outputs, and it runs under papermill on the seed case."""
from __future__ import annotations

import os
import sys

import pytest

from conftest import ROOT

NOTEBOOK = ROOT / "notebooks" / "replay.ipynb"


def test_committed_notebook_has_no_outputs():
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, "no code cells"
    dirty = [i for i, c in enumerate(code) if c.outputs or c.execution_count is not None]
    assert not dirty, f"code cells {dirty} carry outputs: clear them before committing"
    tagged = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and "case_path" in tagged[0].source and "backends" in tagged[0].source


def test_notebook_runs_under_papermill(seed_case_path, tmp_path, monkeypatch):
    papermill = pytest.importorskip("papermill")
    nbformat = pytest.importorskip("nbformat")
    # the kernel is started as `python` from PATH and must import this checkout's kdkit
    monkeypatch.setenv("PATH", os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    out = tmp_path / "replay-out.ipynb"
    papermill.execute_notebook(
        str(NOTEBOOK), str(out), cwd=str(NOTEBOOK.parent), progress_bar=False, kernel_name="python3",
        parameters={"case_path": str(seed_case_path), "backends": "oracle,torch"})
    nb = nbformat.read(out, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code), "a cell did not run"
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    text = "".join(o.get("text", "") for c in code for o in c.outputs if o.output_type == "stream")
    assert "lint: clean" in text and "max_abs_diff=" in text and "PASS" in text
    figures = [o for c in code for o in c.outputs
               if o.output_type == "display_data" and "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert len(figures) >= 2, "the figures were not drawn"
