"""Smoke tests: the main command and the scripts run end to end at tiny sizes."""

import importlib
import pathlib
import subprocess
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run(*args):
    out = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_main_command_tiny():
    out = run("-m", "specjax", "--num-chains", "500", "--horizon", "6")
    assert "SD, K = T (Alg. 1)" in out and "batch SD, M = 4" in out


def import_script(name):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


def test_benchmark_samplers_tiny():
    benchmark_samplers = import_script("benchmark_samplers")
    rows = benchmark_samplers.main(["--num-chains", "20000", "--horizon", "8", "--repeats", "1",
                                    "--numpy-repeats", "1"])
    assert len(rows) == 4
    for row in rows:
        rej_jax, rej_np = row[-2], row[-1]
        # The NumPy reference implements the same decoders: means agree well within 0.1 here
        # (standard errors are about 0.01 with 20,000 chains and T = 8).
        assert abs(rej_jax - rej_np) < 0.1, row
        assert np.isfinite(row[1:]).all()


def test_benchmark_theory_tiny():
    benchmark_theory = import_script("benchmark_theory")
    out = benchmark_theory.main(["--states", "16", "--horizon", "6", "--num-drafts", "3",
                                 "--repeats", "1", "--numpy-repeats", "1"])
    # The plain NumPy recursion and specjax compute the same number.
    for row in out["rows"]:
        tol = 1e-9 if row["dtype"] == "float64" else 1e-4
        assert abs(row["value"] - out["numpy_value"]) < tol * max(1.0, out["numpy_value"])
        assert row["finite_grad"]
