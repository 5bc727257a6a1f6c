"""Smoke test: the given-drafts benchmark runs end to end at a tiny size, and its independent
NumPy verification agrees with specjax.verify_drafts token for token there."""

import pytest

from test_scripts import import_script

pytestmark = pytest.mark.slow


def test_benchmark_verify_tiny(capsys):
    benchmark = import_script("benchmark_verify")
    row = benchmark.main(["--batch", "32", "--lookahead", "4", "--vocab", "50", "--repeats", "1"])
    text = capsys.readouterr().out
    assert "| implementation |" in text and "NumPy" in text
    assert row["same_accepted"] == 32 and row["agree"] == 32, row
    assert row["numpy_s"] > 0 and row["jitted_s"] > 0 and row["checked_s"] > 0
