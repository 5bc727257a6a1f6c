"""Smoke test of scripts/adaptive_study.py on a tiny setting: the optimum is never beaten, and the
simulated calls agree with the exact ones."""

import pytest

from test_scripts import import_script

# End-to-end runs (the scripts end to end): part of the full suite, skipped by the inner loop's
# `-m "not slow"`.
pytestmark = pytest.mark.slow


def test_adaptive_study_tiny(tmp_path, capsys):
    study = import_script("adaptive_study")
    out = tmp_path / "adaptive.png"
    results = study.main(["--costs", "0.05,0.3", "--max-lookahead", "2", "--grid", "3",
                          "--sim-cost", "0.05", "--num-chains", "300", "--skip-ngram",
                          "--out", str(out)])
    assert out.stat().st_size > 0
    text = capsys.readouterr().out
    assert "| c | best fixed K |" in text and "Regret" in text
    (res,) = results
    for c, row in res["rows"].items():
        optimal = row["optimal"][0]
        times = {n: v[0] for n, v in row.items() if not n.startswith("_")}
        # No policy with at most K drafts beats the optimum (fixed K and the tuned heuristics).
        assert all(t >= optimal - 1e-9 for t in times.values()), (c, times)
        assert row["best fixed K"][0] == min(times["fixed K = 1"], times["fixed K = 2"])
        assert row["optimal"][1]  # the thresholds reproduce the solved decisions
    for c, row in res["long_run"].items():
        optimal = row["optimal"][0]
        rates = {n: v[0] for n, v in row.items()}
        # Nothing beats the optimal time per token in the long run (HF's schedule included).
        assert all(r >= optimal * (1 - 1e-12) for r in rates.values()), (c, rates)
        assert row["optimal"][1]
    assert "Long run" in text and "HF +2/-1" in text
    for label, (exact, mean, se, z) in res["sims"].items():
        assert abs(mean - exact) < 5 * se, (label, exact, mean, se)
