"""Smoke tests: the main command and the scripts run end to end at tiny sizes."""

import importlib
import pathlib
import subprocess
import sys

import numpy as np
import pytest

# End-to-end runs (the scripts end to end): part of the full suite, skipped by the inner loop's
# `-m "not slow"`.
pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run(*args):
    out = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_simulate_command_tiny():
    # 20,000 chains: the runs of test_benchmark_samplers_tiny (SD, K = T and K = 4, batch M = 4 on
    # the paper's instance, T = 6), which find them in the persistent compilation cache
    out = run("-m", "specjax", "simulate", "--num-chains", "20000", "--horizon", "6")
    assert "SD, K = T (Alg. 1)" in out and "batch SD, M = 4" in out


# The tiny settings share instance sizes where the check allows, so that the scripts' random
# instances are drawn by one compiled program per size in this module: V = 7 (the paper's) with
# T = 6 (benchmark_samplers and its growth point, large_run, benchmark_stop_tokens) and V = 4 with T = 6 (tune_draft and
# multi_draft in float32, tuning_study and benchmark_theory in float64); each new (V, T, dtype)
# compiles JAX's Dirichlet sampler again.


def import_script(name):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


def test_benchmark_samplers_tiny():
    benchmark_samplers = import_script("benchmark_samplers")
    rows = benchmark_samplers.main(["--num-chains", "20000", "--horizon", "6", "--repeats", "1",
                                    "--numpy-repeats", "1"])
    assert len(rows) == 4
    for row in rows:
        rej_jax, rej_np = row[-2], row[-1]
        # The NumPy reference implements the same decoders: means agree well within 0.1 here
        # (standard errors are below 0.01 with 20,000 chains and T = 6).
        assert abs(rej_jax - rej_np) < 0.1, row
        assert np.isfinite(row[1:]).all()


def test_benchmark_theory_tiny():
    benchmark_theory = import_script("benchmark_theory")
    out = benchmark_theory.main(["--states", "4", "--horizon", "6", "--num-drafts", "3",
                                 "--repeats", "1", "--numpy-repeats", "1"])
    # The plain NumPy recursion and specjax compute the same number.
    for row in out["rows"]:
        tol = 1e-9 if row["dtype"] == "float64" else 1e-4
        assert abs(row["value"] - out["numpy_value"]) < tol * max(1.0, out["numpy_value"])
        assert row["finite_grad"]


def test_tune_draft_script_tiny(tmp_path):
    """Writes the table and every chain; each tuned draft is no worse than the initial draft on
    its own objective, and the Monte Carlo runs confirm the exact values."""
    import json
    tune_draft = import_script("tune_draft")
    out = tmp_path / "out"
    results = tune_draft.main(["--states", "4", "--horizon", "6", "--steps", "40",
                               "--num-chains", "4000", "--objective", "calls", "--quiet",
                               "--out", str(out)])
    on_disk = json.loads((out / "results.json").read_text())
    assert on_disk["table"] == results["table"]
    assert set(on_disk["table"]) == {"initial", "kl_fit", "tuned_sd", "tuned_batch", "tuned_calls"}
    labels = ["sd", "batch(M=4)", "calls(K=4)", "biased(eps=0.05, lambda=2)", "kl"]
    assert on_disk["objectives"] == labels
    for name in ("target", "initial", "kl_fit", "tuned_sd", "tuned_batch", "tuned_calls"):
        with np.load(out / f"{name}.npz") as f:
            assert f["init"].shape == (4,) and f["trans"].shape == (6, 4, 4)
            np.testing.assert_allclose(f["trans"].sum(-1), 1.0, rtol=1e-5)
    table = on_disk["table"]
    own = {"tuned_sd": labels[0], "tuned_batch": labels[1], "tuned_calls": labels[2]}
    for name, label in own.items():
        # Tuned from the initial draft, the best iterate is kept: never worse than the start.
        assert table[name][label] <= table["initial"][label]
        assert len(on_disk["history"][name]) == 41
        # 9 Monte Carlo estimates in all: |z| < 4.9 each has a false-failure rate below 1e-6
        # per estimate (normal approximation; 4,000 chains).
        for estimate in on_disk["monte_carlo"][name].values():
            assert abs(estimate["z"]) < 4.9, estimate


def test_tuning_study_tiny():
    tuning_study = import_script("tuning_study")
    rows, summary = tuning_study.main(["--seeds", "1", "--families", "stationary",
                                       "--num-drafts", "2", "--states", "4", "--horizon", "6",
                                       "--steps", "30"])
    assert len(rows) == 1 and len(summary) == 1
    row = rows[0]
    # Tuning starts from the KL fit and keeps the best iterate.
    assert row["sd_tuned_sd"] <= row["sd_kl_fit"] + 1e-12
    assert row["batch_tuned_batch"] <= row["batch_kl_fit"] + 1e-12


def test_benchmark_growth_points_tiny():
    """The growth table's measurement, in this process for both paths and in a subprocess with
    two forced host devices (the way ``--growth`` runs every point)."""
    benchmark_samplers = import_script("benchmark_samplers")
    for path in ("trace", "stats"):
        # 20,000 chains: the trace path is then the program of test_benchmark_samplers_tiny's
        # first row (SD, K = T on the paper's instance)
        row = benchmark_samplers.measure(path, 20000, 6, repeats=1)
        assert row["seconds"] > 0 and row["peak_rss"] > 0 and row["devices"] >= 1
    row = benchmark_samplers._point("stats", 400, 6, 2, 1)
    assert row["devices"] == 2 and row["chains"] == 400 and row["seconds"] > 0


def test_large_run_script_tiny():
    large_run = import_script("large_run")
    out = large_run.main(["--chains", "4000", "--horizon", "6", "--lookahead", "3",
                          "--chunk-size", "1500", "--no-progress"])
    # Exact and simulated agree (z-scores are O(1); 4.5 is the suite's bound).
    assert abs(out["rejections"][3]) < 4.5 and abs(out["target calls"][3]) < 4.5
    assert out["final_token_pvalue"] > 1e-5
    out = large_run.main(["--chains", "2000", "--horizon", "6", "--num-drafts", "3",
                          "--no-progress"])
    assert abs(out["rejections"][3]) < 4.5


def test_multi_draft_script_tiny():
    """The simulated means agree with the exact ones (|z| < 4.5), and M = 1 would be SD."""
    multi_draft = import_script("multi_draft")
    # 4,000 chains: with replacement, the program of test_tune_draft_script_tiny's batch run
    rows = multi_draft.main(["--chains", "4000", "--horizon", "6", "--states", "4",
                             "--seeds", "1"])
    assert len(rows) == 3
    for row in rows:
        assert all(0 <= row[f"wor{m}"] <= row["sd"] + 1e-6 for m in (2, 3, 4))
        assert abs(row["sim_wr4"][2]) < 4.5 and abs(row["sim_wor4"][2]) < 4.5


def test_benchmark_stop_tokens_tiny():
    # 20,000 chains: decode without stop tokens is the program of test_benchmark_samplers_tiny's
    # Speculative(4) row
    rows = import_script("benchmark_stop_tokens").main(["--num-chains", "20000", "--repeats", "1",
                                                        "--horizon", "6"])
    assert [row[0] for row in rows] == ["decode, Markov chains", "decode, finite-state models",
                                        "decoding_statistics", "exact"]
    assert all(row[1] > 0 and row[2] > 0 for row in rows)


def test_char_model_tiny():
    """The equinox character models train, decode on both engines within 4.5 standard errors
    of their lift's exact values, and the benchmark measures every engine (at the Monte Carlo's
    4,000 chains: two of its three engines run the programs the Monte Carlo compiled)."""
    out = import_script("char_model").main(
        ["--max-bytes", "30000", "--states", "6", "--steps", "20", "--horizon", "6",
         "--num-chains", "4000", "--bench-chains", "4000", "--repeats", "1"])
    assert all(np.isfinite(loss) for loss in out["losses"])
    for name, calls, se, exact, rej, rse, rexact in out["monte_carlo"]:
        assert abs(calls - exact) < 4.5 * se and abs(rej - rexact) < 4.5 * rse, name
    assert [row[0] for row in out["benchmark"]] == [4000]
    assert all(rate > 0 for rate in out["benchmark"][0][1:])


def test_benchmark_verify_tree_tiny():
    """specjax and the script's independent NumPy tree verification agree on every path.
    The tree (2, 2): siblings verified at the root and below it, ragged requests of 1..7 nodes
    (the default 21-node tree compiles its two programs in about 3 times the CPU)."""
    out = import_script("benchmark_verify_tree").main(["--batch", "64", "--vocab", "50",
                                                       "--branching", "2,2", "--repeats", "1"])
    assert out["same_path"] == 64 and out["agree"] >= 60
    assert out["mean_accepted"] > 0
