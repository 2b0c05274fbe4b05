"""The Colab notebook runs headless at its smallest setting, so it cannot rot."""

import os

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOK = os.path.join(ROOT, "notebooks", "aepo_small_model.ipynb")


def test_notebook_executes_at_smoke_size(tmp_path, monkeypatch):
    pytest.importorskip("ipykernel")
    monkeypatch.setenv("AEPO_NOTEBOOK_SIZE", "smoke")
    monkeypatch.setenv("AEPO_NOTEBOOK_WORKDIR", str(tmp_path / "run"))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(notebook, timeout=900, kernel_name="python3", resources={"metadata": {"path": ROOT}}).execute()
    outputs = "".join(out.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                      for out in cell.get("outputs", []))
    assert "size=smoke" in outputs
    assert "global + " in outputs and "#0 [global" in outputs  # the rollout tree was printed
    assert os.path.exists(tmp_path / "run" / "aepo" / "metrics.jsonl")
