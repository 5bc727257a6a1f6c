"""End-to-end runs of scripts/study_serving.py and scripts/benchmark_serving.py at toy sizes."""

import pytest
from test_scripts import import_script


@pytest.mark.slow
def test_study_serving_tiny(tmp_path):
    study = import_script("study_serving")
    out = tmp_path / "serving.png"
    (result,) = study.main(["--batch-sizes", "1,64", "--max-lookahead", "1", "--prices", "2",
                            "--skip-ngram", "--out", str(out)])
    assert out.stat().st_size > 0
    for row in result["rows"]:
        assert row["AR"] == pytest.approx(row["B"])  # memory-bound target: B tokens per pass
        assert row["per request"] >= row["batch K"] >= max(row["AR"], row["SD K"]) - 1e-12


def test_benchmark_serving_tiny(capsys):
    benchmark = import_script("benchmark_serving")
    goodput, allocation = benchmark.main(["--batch-sizes", "2,3", "--lookaheads", "2",
                                          "--repeats", "1"])
    assert "| K | B |" in capsys.readouterr().out
    for row in goodput:
        assert row["goodput"] == pytest.approx(row["reference"], rel=1e-10)
    for row in allocation:
        assert row["rate"] == pytest.approx(row["reference"], rel=1e-10)
