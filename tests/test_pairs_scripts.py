"""Smoke tests: the scripts of "Real model pairs" run end to end at tiny sizes."""

import numpy as np
import pytest

from test_scripts import import_script

pytestmark = pytest.mark.slow


def test_pairs_variance_tiny():
    rows = import_script("pairs_variance").main(["--sequences", "4000", "--horizon", "8",
                                                 "--states", "4"])
    assert len(rows) == 15
    for row in rows:
        assert abs(row["z_estimator"]) < 4.5 and abs(row["z_counting"]) < 4.5, row
        assert row["ratio"] > 1, row  # Rao-Blackwell: never more variable than counting


def test_benchmark_pairs_tiny():
    rows = import_script("benchmark_pairs").main(["--states", "300", "--horizon", "12",
                                                  "--sequences", "40", "--rank", "4"])
    assert len(rows) == 5 and rows[0]["bytes"] < 10_000
    assert all(np.isfinite(row["seconds"]) for row in rows)
