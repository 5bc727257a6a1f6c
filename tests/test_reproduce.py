"""The paper's reproduction (``python -m specjax reproduce``): runs end to end at toy sizes, writes
every figure and the summary, and every check of the theory holds."""

import json
import subprocess
import sys

import matplotlib.image
import numpy as np
import pytest

from specjax.experiments import reproduce
from test_scripts import ROOT

# End-to-end runs (the paper's reproduction end to end): part of the full suite, skipped by
# the inner loop's `-m "not slow"`.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("figures")
    proc = subprocess.run([sys.executable, "-m", "specjax", "reproduce", "--quick", "--out",
                           str(out)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out, proc


def test_writes_every_figure_and_the_summary(quick_run):
    out, proc = quick_run
    for name in reproduce.FIGURES:
        image = matplotlib.image.imread(out / name)
        assert image.ndim == 3 and image.shape[0] > 300 and image.shape[1] > 500, name
        assert image[..., :3].std() > 0.01, f"{name} is blank"
    summary = (out / "summary.md").read_text()
    for heading in ("Figure 2", "Figure 3", "Figure 4", "Table 1", "Appendix figure: T = 10",
                    "Checks"):
        assert heading in summary
    assert "16.41" in summary and "3.05" in summary  # the paper's numbers beside ours
    assert "checks:" in proc.stdout and "FAILED" not in proc.stdout
    # One progress bar from the first simulation to the last figure: its final state is full and
    # labelled with the figures (it used to fill before the exact appendix values, Table 1, the
    # summary and the figures were done, then go quiet). A bar closes at its last step, so a
    # step count off either way fails here: short of full, or full with an earlier label.
    steps = reproduce.reproduce_steps(reproduce.Settings.quick())
    final = proc.stderr.rstrip().split("\r")[-1]
    assert f"{steps}/{steps}" in final and "figures written" in final, final


def test_summary_json_holds_every_number_and_the_checks_hold(quick_run):
    out, _ = quick_run
    data = json.loads((out / "summary.json").read_text())
    assert {"settings", "paper", "convergence", "scaling", "tradeoff", "improvement",
            "long_convergence", "long_scaling", "table1", "checks"} <= set(data)
    assert data["settings"]["horizon"] == 8 and data["settings"]["long_horizon"] == 10
    failed = [c for c in data["checks"] if not c["ok"]]
    assert not failed
    # The statistical checks use |z| < 4.5: with about 20 of them the suite's false-failure rate
    # is about 1.4e-4 (normal approximation).
    assert len(data["checks"]) >= 30
    sd = data["convergence"]["sd"]
    assert set(sd) == {"exact", "mean", "se", "running_mean_at"}
    assert [r["epsilon"] for r in data["table1"]] == [0.1, 0.2, 0.4, 0.8]
    for row in data["table1"]:
        assert row["max_row_tv_opt_minus_uno"] <= 1e-6
        assert np.isfinite([row["opt_kl"], row["uno_kl"]]).all()


def test_running_mean_and_standard_error():
    rng = np.random.default_rng(0)
    x = rng.poisson(3.0, size=500)
    mean, se = reproduce.running_mean(x)
    for n in (2, 17, 500):
        assert mean[n - 1] == pytest.approx(x[:n].mean(), rel=1e-12)
        assert se[n - 1] == pytest.approx(x[:n].std(ddof=1) / np.sqrt(n), rel=1e-9)
    assert reproduce.mean_se(x) == pytest.approx((mean[-1], se[-1]), rel=1e-9)


def test_one_token_chains_verify_one_token():
    p = np.array([0.5, 0.25, 0.25])
    q = np.array([0.2, 0.2, 0.6])
    draft, target = reproduce.one_token_chains(p, q)
    assert draft.horizon == 1 and float(draft.init[0]) == 1.0
    np.testing.assert_allclose(np.asarray(draft.trans[0, 0]), p, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(target.trans[0, 0]), q, rtol=1e-6)


def test_summary_tables_have_consistent_columns(quick_run):
    """Every markdown table row has as many cells as its header (else renderers drop cells)."""
    out, _ = quick_run
    lines = (out / "summary.md").read_text().splitlines()
    header_cells = None
    for line in lines:
        if not line.startswith("|"):
            header_cells = None
            continue
        cells = line.replace("\\|", "").count("|") - 1
        if header_cells is None:
            header_cells = cells
        assert cells == header_cells, line


def test_tv_deviation_bound_holds_in_repeated_draws():
    """The bound fails with probability at most delta; at delta = 0.05 it holds in (far) more
    than 80 of 100 independent experiments (a binomial tail below 1e-6 under the bound's
    guarantee)."""
    rng = np.random.default_rng(1)
    law = np.array([0.5, 0.3, 0.15, 0.05, 0.0])
    q = np.array([0.2, 0.2, 0.2, 0.2, 0.2])
    exact = 0.5 * np.abs(law - q).sum()
    n = 2000
    bound = reproduce.tv_deviation_bound(law, n, delta=0.05)
    held = sum(abs(0.5 * np.abs(rng.multinomial(n, law) / n - q).sum() - exact) <= bound
               for _ in range(100))
    assert held >= 80
    assert reproduce.tv_deviation_bound(law, 4 * n) < bound  # shrinks like 1 / sqrt(n)


@pytest.mark.parametrize("args,message", [
    (["reproduce", "--num-runs", "1"], "--num-runs must be at least 2"),
    (["reproduce", "--out", "README.md"], "exists and is not a folder"),
    (["simulate", "--num-chains", "0"], "--num-chains must be at least 2"),
])
def test_command_line_errors_are_usage_messages(args, message):
    proc = subprocess.run([sys.executable, "-m", "specjax", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def test_z_score_with_zero_standard_error():
    from specjax.experiments.report import z_score
    assert z_score(0.0, 0.0, 0.0) == 0.0
    assert z_score(1.0, 0.0, 0.5) == float("inf")
    assert z_score(1.2, 0.1, 1.0) == pytest.approx(2.0)
