"""Smoke tests: every notebook's code cells run, in order, at toy sizes (SPECJAX_NOTEBOOK_SMOKE=1).

The cells are executed by a plain Python process (no Jupyter kernel needed), from the
``notebooks`` folder as Jupyter would, with matplotlib's non-interactive backend.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

# End-to-end runs (the notebooks end to end): part of the full suite, skipped by the inner loop's
# `-m "not slow"`.
pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_stored_without_outputs(path):
    cells = json.loads(path.read_text())["cells"]
    for cell in cells:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_self_contained(path):
    """A notebook imports installed packages only (no sys.path edits, no helpers from the
    repository's scripts folder), so it runs outside a clone."""
    cells = json.loads(path.read_text())["cells"]
    source = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert "sys.path" not in source and "scripts" not in source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_at_toy_sizes(path, tmp_path):
    cells = json.loads(path.read_text())["cells"]
    source = "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    script = tmp_path / f"{path.stem}.py"
    script.write_text(source)
    # The repository root goes on the path as for the scripts' tests (which run from the root).
    path_entries = [str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]
    env = dict(os.environ, SPECJAX_NOTEBOOK_SMOKE="1", MPLBACKEND="Agg",
               PYTHONPATH=os.pathsep.join(path_entries))
    out = subprocess.run([sys.executable, str(script)], cwd=path.parent, env=env,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
