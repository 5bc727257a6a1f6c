"""Smoke test: the optimal-stopping benchmark runs end to end at a tiny size, and its independent
NumPy backward induction agrees with specjax.theory.optimal_stopping."""

import pytest

from test_scripts import import_script

# End-to-end runs (the scripts end to end): part of the full suite, skipped by the inner loop's
# `-m "not slow"`.
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("x64", [False, True])
def test_benchmark_adaptive_tiny(capsys, x64):
    benchmark = import_script("benchmark_adaptive")
    # The long run at K = 2 (the script's default is 4): three policies to evaluate (fixed 1 and 2
    # and the optimum's table), not five, and the sizes of test_stationary's programs.
    argv = ["--states", "3", "--horizon", "6", "--max-lookahead", "3", "--repeats", "1",
            "--rate-lookahead", "2"]
    row = benchmark.main(argv + (["--x64"] if x64 else []))
    text = capsys.readouterr().out
    assert "| solve |" in text and "| expected time |" in text
    assert row["dtype"] == ("float64" if x64 else "float32")
    tol = 1e-12 if x64 else 1e-5
    assert row["diff"] < tol and row["values_diff"] < tol, row
    assert row["threshold_form"]
    # The optimum is never slower than the best fixed lookahead (up to rounding).
    assert row["expected_time"] <= row["best_fixed_time"] + tol
    assert row["numpy_s"] > 0 and row["specjax_s"] > 0
    # The long run: the optimum's time per token is never above the best fixed lookahead's.
    assert "Long run" in text
    assert row["rate_time_per_token"] <= row["rate_best_fixed"] * (1 + tol)
    assert row["rate_bellman_residual"] < tol
