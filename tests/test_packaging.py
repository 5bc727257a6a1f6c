"""Packaging: ``python -m build`` gives a wheel with every subpackage and ``py.typed``, and an sdist
that carries the whole test suite and what it reads (helpers, ``tests/data``, docs, scripts,
notebooks), so that the unpacked sdist collects every test the checkout collects.

The build runs without build isolation (``--no-isolation``: no download, the ``test`` extra
installs ``build`` and ``setuptools>=77``) on a copy of the source tree, so the checkout is not
touched (no ``build/``, no rewritten ``specjax.egg-info``).
"""

import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

SUBPACKAGES = ["", "models", "decoders", "sampling", "theory", "tuning", "auditing",
               "experiments", "pairs"]
TEST_HELPERS = ["conftest.py", "compile_flags.py", "reference.py", "stats.py",
                "sampler_cases.py", "sharded_check.py"]
# Not part of a source distribution: environments, caches, build outputs, local results.
IGNORED = shutil.ignore_patterns(".git", ".venv", "venv", ".ci", "build", "dist", "*.egg-info",
                                 "__pycache__", ".pytest_cache", ".ipynb_checkpoints",
                                 "figures", "results", "tune_draft_out")


def _setuptools_version():
    from importlib.metadata import version
    return tuple(int(part) for part in version("setuptools").split(".")[:2])


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    """``(sdist, wheel)``: the paths of the archives ``python -m build`` makes of the source."""
    if importlib.util.find_spec("build") is None:
        pytest.skip("the build package is not installed (pip install -e '.[test]')")
    if _setuptools_version() < (77, 0):
        pytest.skip("setuptools >= 77 is needed to build (SPDX license expression)")
    tmp = tmp_path_factory.mktemp("packaging")
    source, out = tmp / "source", tmp / "dist"
    shutil.copytree(ROOT, source, ignore=IGNORED)
    result = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir",
                             str(out), str(source)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (sdist,), (wheel,) = out.glob("*.tar.gz"), out.glob("*.whl")
    return sdist, wheel


@pytest.mark.slow
def test_wheel_has_every_subpackage_and_py_typed(dists):
    _, wheel = dists
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "specjax/py.typed" in names
    for sub in SUBPACKAGES:
        init = "/".join(filter(None, ["specjax", sub, "__init__.py"]))
        assert init in names, f"{init} is missing from the wheel"
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(metadata).decode()
    assert "License-Expression: Apache-2.0" in text
    assert "Requires-Dist: tqdm" in text
    assert not any(name.startswith("tests/") for name in names)


def _collect(root, env):
    """Starts ``pytest --collect-only`` of the whole suite in ``root`` (one process, no cache)."""
    return subprocess.Popen([sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0",
                             "-p", "no:cacheprovider", "tests"],
                            cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _collected(proc, where):
    """The node ids a ``_collect`` process printed; fails on a collection error."""
    stdout, stderr = proc.communicate(timeout=600)
    ids = {line for line in stdout.splitlines() if line.startswith("tests/") and "::" in line}
    report = "\n".join(line for line in stdout.splitlines() if line not in ids)
    assert proc.returncode == 0, f"{where}: " + report[-3000:] + stderr[-3000:]
    return ids


@pytest.mark.slow
def test_sdist_carries_the_whole_suite_and_it_collects(dists, tmp_path):
    sdist, _ = dists
    with tarfile.open(sdist) as archive:
        names = archive.getnames()
        top = names[0].split("/")[0]
        for helper in TEST_HELPERS + ["test_scripts.py", "data/golden_0925acd.npz",
                                      "data/golden_0925acd_instance.npz"]:
            assert f"{top}/tests/{helper}" in names, f"tests/{helper} is missing from the sdist"
        assert f"{top}/specjax/py.typed" in names
        if sys.version_info >= (3, 12):
            archive.extractall(tmp_path, filter="data")
        else:
            archive.extractall(tmp_path)
    unpacked = tmp_path / top
    # `python -m pytest` from the unpacked root imports specjax from the sdist (the root comes
    # first on sys.path), with the sdist's pyproject.toml as pytest's configuration. The checkout
    # collects beside it, in the same environment.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    in_sdist, in_checkout = _collect(unpacked, env), _collect(ROOT, env)
    sdist_ids, checkout_ids = _collected(in_sdist, "sdist"), _collected(in_checkout, "checkout")
    assert len(checkout_ids) > 1000 and "tests/test_packaging.py::" + \
        "test_sdist_carries_the_whole_suite_and_it_collects" in checkout_ids
    # Every test the checkout collects, and no other (a parametrisation over the docs pages,
    # notebooks or scripts would lose cases silently if their files were missing).
    assert sdist_ids == checkout_ids, (sorted(checkout_ids - sdist_ids)[:20],
                                       sorted(sdist_ids - checkout_ids)[:20])
    # The package the tests import is the sdist's own.
    where = subprocess.run([sys.executable, "-c", "import specjax; print(specjax.__file__)"],
                           cwd=unpacked, env=env, capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, where.stderr
    assert pathlib.Path(where.stdout.strip()).resolve().is_relative_to(unpacked.resolve())
