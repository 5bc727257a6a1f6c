"""Smoke tests: every notebook's code cells run, in order, at toy sizes (SPECJAX_NOTEBOOK_SMOKE=1).

The cells are executed by a plain Python process (no Jupyter kernel needed), from the
``notebooks`` folder as Jupyter would, with matplotlib's non-interactive backend. The notebooks
run one after another in one process, each in a fresh namespace (as one kernel restarted between
them, less the restart): their compiled programs are shared (the reproduction notebooks draw the
same instance and run the same simulations). A notebook that changes JAX's global configuration
(``jax.config.update``, e.g. float64) would leak it into the next, so it runs in a process of its
own.
"""

import json
import os
import pathlib

import pytest

from conftest import run_batch

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


def code(path: pathlib.Path) -> str:
    """A notebook's code cells, in order, as one script."""
    cells = json.loads(path.read_text())["cells"]
    return "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


RUNNER = r"""
import json
import sys
import traceback

results = {}
for name, script in json.loads(open(sys.argv[1]).read()):
    namespace = {"__name__": "__main__"}
    try:
        exec(compile(open(script).read(), script, "exec"), namespace)
        results[name] = None
    except BaseException:
        results[name] = traceback.format_exc()
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")
with open(sys.argv[2], "w") as f:
    json.dump(results, f)
"""

# The notebooks that share a process, and those that run alone (see the module docstring).
ALONE = [p for p in NOTEBOOKS if "jax.config.update" in code(p)]
GROUPS = [[p for p in NOTEBOOKS if p not in ALONE]] + [[p] for p in ALONE]
_RESULTS = {}  # group index -> {notebook name: None or the failure}, each group once per process


def run_notebooks(paths, tmp):
    """Runs the notebooks in one subprocess; ``{notebook name: None or the failure}``."""
    scripts = []
    for path in paths:
        script = tmp / f"{path.stem}.py"
        script.write_text(code(path))
        scripts.append((path.name, str(script)))
    # The repository root goes on the path as for the scripts' tests (which run from the root).
    path_entries = [str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]
    env = dict(os.environ, SPECJAX_NOTEBOOK_SMOKE="1", MPLBACKEND="Agg",
               PYTHONPATH=os.pathsep.join(path_entries))
    return run_batch("the notebook runner", RUNNER, scripts, [p.name for p in paths], tmp,
                     cwd=ROOT / "notebooks", env=env)


def _group(path) -> int:
    return next(i for i, g in enumerate(GROUPS) if path in g)


# The test ids start with the group ("group0:batch_sd.ipynb"): tests/conftest.py schedules a
# group's notebooks on one worker (SHARED_RUNS), and the workers take one group each.
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"group{_group(p)}:{p.name}")
def test_notebooks_run_at_toy_sizes(path, tmp_path_factory):
    group = _group(path)
    if group not in _RESULTS:
        tmp = tmp_path_factory.mktemp(f"notebooks{group}")
        _RESULTS[group] = run_notebooks(GROUPS[group], tmp)
    failure = _RESULTS[group][path.name]
    assert failure is None, failure
