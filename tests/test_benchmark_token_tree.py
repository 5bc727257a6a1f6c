"""Smoke test: the token-tree benchmark runs end to end at a tiny size, and its NumPy reference
(exact values and sampler) agrees with specjax."""

import numpy as np
import pytest

from test_scripts import import_script

# End-to-end runs (the scripts end to end): part of the full suite, skipped by the inner loop's
# `-m "not slow"`.
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("x64", [False, True])
def test_benchmark_token_tree_tiny(capsys, x64):
    benchmark = import_script("benchmark_token_tree")
    # V = 4, T = 6: Sequoia's tree of 8 nodes (depth up to 8 > T: truncated at the horizon) and
    # a uniform tree of depth 7 > T with a branching root.
    argv = ["--states", "4", "--horizon", "6", "--num-chains", "200", "--repeats", "1",
            "--budget", "8", "--max-depth", "8", "--branching", "2", "1", "1", "1", "1", "1", "1"]
    out = benchmark.main(argv + (["--x64"] if x64 else []))
    text = capsys.readouterr().out
    assert "| tree | nodes | depth | quantity | specjax | compile | NumPy |" in text
    assert "specjax steps/s" in text and "NumPy steps/s" in text
    assert out["dtype"] == ("float64" if x64 else "float32")
    rows = out["rows"]
    assert [r["tree"] for r in rows] == ["Sequoia", "uniform (2, 1, 1, 1, 1, 1, 1)"]
    assert rows[0]["nodes"] == 8
    tol = 1e-12 if x64 else 1e-5
    for row in rows:
        # Exact values: specjax, NumPy in the chains' dtype and NumPy float64 agree.
        for name in ("al_diff", "al_numpy_diff", "calls_diff", "calls_numpy_diff",
                     "rejections_diff", "rejections_numpy_diff"):
            assert row[name] < tol, (row["tree"], name, row[name])
        assert 1 <= row["calls"] <= 6 and 0 <= row["rejections"] < row["calls"]
        # Both samplers estimate the exact expected calls (200 chains: within 5 standard errors).
        assert abs(row["z"]) < 5 and abs(row["z_numpy"]) < 5, row
        for name in ("al_s", "exact_s", "al_numpy_s", "exact_numpy_s", "sampler_s",
                     "sampler_numpy_s"):
            assert np.isfinite(row[name]) and row[name] > 0, (name, row[name])
