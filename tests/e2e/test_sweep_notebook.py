"""docs/sweep.ipynb runs: its code cells, in order, as one script (the plain-script form of the
notebook; no Jupyter needed), with its parameters cell replaced as papermill would — on the
tiny recipe always, on YOLOv8n (the notebook's own recipe) in the slow tier."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO, TINY_RECIPE, write_recipe

NOTEBOOK = REPO / "docs" / "sweep.ipynb"


def script(parameters: dict) -> str:
    """The notebook's code cells as one script, the cell tagged ``parameters`` replaced."""
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    code = []
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        if "parameters" in cell["metadata"].get("tags", []):
            code.append("\n".join(f"{k} = {v!r}" for k, v in parameters.items()))
        else:
            code.append("".join(cell["source"]))
    return "\n\n".join(code) + "\n"


def run(parameters: dict) -> str:
    proc = subprocess.run([sys.executable, "-c", script(parameters)], cwd=NOTEBOOK.parent,
                          capture_output=True, text=True, timeout=1800,
                          env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_the_notebook_has_one_parameters_cell_naming_what_the_test_sets():
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    tagged = [c for c in cells if "parameters" in c["metadata"].get("tags", [])]
    assert len(tagged) == 1
    assert all(f"{name} =" in "".join(tagged[0]["source"])
               for name in ("RECIPE", "FIELD", "VALUES", "BUILD_DIR", "CACHE"))


def test_the_sweep_notebook_runs_on_the_tiny_recipe(tmp_path):
    recipe = write_recipe(tmp_path, TINY_RECIPE)
    out = run({"RECIPE": str(recipe), "FIELD": "quantization.calibration.method",
               "VALUES": ["minmax", "percentile"], "BUILD_DIR": str(tmp_path / "build"),
               "CACHE": str(tmp_path / "cache")})
    assert "'minmaxx' is not one of minmax, percentile, kl, mse" in out
    assert "| minmax | pass | 0.997937 |" in out and "| percentile | pass |" in out
    assert "best quantization.calibration.method: " in out and "report.html" in out


@pytest.mark.slow
def test_the_sweep_notebook_runs_on_yolov8n(yolov8_build, shared_cache, tmp_path):
    out = run({"RECIPE": str(REPO / "recipes" / "yolov8.yaml"),
               "FIELD": "quantization.calibration.method", "VALUES": ["minmax", "percentile"],
               "BUILD_DIR": str(tmp_path / "build"), "CACHE": str(shared_cache)})
    assert "minmax      <Result yolov8n: passed" in out
    assert "percentile  <Result yolov8n@exp-" in out
    assert "best quantization.calibration.method: minmax" in out
