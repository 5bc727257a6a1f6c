"""Every docstring example of the library runs.

Every module under ``specjax/`` is imported and its docstring examples (``>>>``) are run with
``doctest``, all modules in one subprocess (compiled programs are shared between modules, and the
suite's persistent compilation cache is used) with the suite's strictness: warnings are errors and
``jax_numpy_rank_promotion`` is ``"raise"``. By construction, not by a hand list: a module is found
by walking the package, and the number of examples ``doctest`` runs in a module must equal the
number of ``>>>`` prompts in its source, so an example that ``doctest`` cannot find (a docstring of
an object it does not collect) fails the test instead of being skipped silently.

Examples print rounded values (``round(float(x), 3)``) so that they hold in float32 and float64 and
on every platform.
"""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

# End-to-end run of every module's examples in a subprocess, as tests/test_docs.py runs the
# guides: part of the full suite, skipped by the inner loop's `-m "not slow"`.
pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "specjax"
PROMPT = re.compile(r"^\s*>>>", re.MULTILINE)

RUNNER = r"""
import doctest
import importlib
import json
import sys
import traceback
import warnings

warnings.simplefilter("error")  # as the suite's filterwarnings = ["error"], and its two exceptions:
warnings.filterwarnings("ignore", "Error reading persistent compilation cache entry", UserWarning)
warnings.filterwarnings("ignore", "Error writing persistent compilation cache entry", UserWarning)

import jax

jax.config.update("jax_numpy_rank_promotion", "raise")  # as tests/conftest.py

results = {}
for name in json.loads(open(sys.argv[1]).read()):
    try:
        module = importlib.import_module(name)
        finder = doctest.DocTestFinder(exclude_empty=True)
        runner = doctest.DocTestRunner(verbose=False)
        report = []
        for test in sorted(finder.find(module, name), key=lambda t: t.name):
            runner.run(test, out=report.append)
        counts = runner.summarize(verbose=False)
        results[name] = {"attempted": counts.attempted, "failed": counts.failed,
                         "report": "".join(report)}
    except BaseException:
        results[name] = {"attempted": 0, "failed": 1, "report": traceback.format_exc()}
with open(sys.argv[2], "w") as f:
    json.dump(results, f)
"""


def module_name(path: pathlib.Path) -> str:
    """``specjax/theory/cost.py`` -> ``specjax.theory.cost``; a package's ``__init__.py`` is
    the package."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# Every module of the package; `__main__` runs the command line when imported, and has no
# examples (test_every_module_is_run checks that).
MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if p.name != "__main__.py"}


def prompts(path: pathlib.Path) -> int:
    """The number of ``>>>`` examples written in a file."""
    return len(PROMPT.findall(path.read_text()))


def test_prompt_count():
    text = 'def f():\n    """Doc.\n\n    >>> 1 + 1\n    2\n    >>> print(\n    ...   3)\n    3\n    """\n'
    assert len(PROMPT.findall(text)) == 2


def test_every_module_is_run():
    assert prompts(PACKAGE / "__main__.py") == 0
    with_examples = [name for name, path in MODULES.items() if prompts(path)]
    assert len(with_examples) >= 20, with_examples  # the examples were found at all


def test_docstring_examples_run(tmp_path):
    """Runs every module's examples once, in one subprocess, and reports every failure. The
    suite's compilation cache comes with the environment (tests/conftest.py sets it)."""
    (tmp_path / "modules.json").write_text(json.dumps(sorted(MODULES)))
    (tmp_path / "runner.py").write_text(RUNNER)
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    # Run from an empty folder: an example may write files, never into the repository.
    out = subprocess.run([sys.executable, str(tmp_path / "runner.py"),
                          str(tmp_path / "modules.json"), str(tmp_path / "results.json")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    if out.returncode != 0 or not (tmp_path / "results.json").exists():
        pytest.fail(f"the doctest runner crashed:\n{out.stderr[-4000:]}")
    results = json.loads((tmp_path / "results.json").read_text())
    failures = []
    for name, path in MODULES.items():
        result, written = results[name], prompts(path)
        if result["failed"]:
            failures.append(f"{name}: {result['failed']} of {result['attempted']} examples "
                            f"failed\n{result['report']}")
        elif result["attempted"] != written:
            failures.append(f"{name}: doctest ran {result['attempted']} examples, the source "
                            f"has {written} (a docstring doctest does not collect?)")
    assert not failures, "\n".join(failures)
