"""End to end: scripts/flax_pair.py's tiny run (two flax transformers, V = 8, T = 3) in a
subprocess, its printed table checked for consistency. Needs flax (the test extra)."""

import math
import pathlib
import re
import subprocess
import sys

import pytest

pytest.importorskip("flax")

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[1]
NUMBER = r"(-?\d+\.\d+)"


@pytest.fixture(scope="module")
def output():
    out = subprocess.run([sys.executable, "scripts/flax_pair.py", "--tiny", "--x64"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return out.stdout


def table(output):
    """``[(decoder, draft, {column: (value, se)} or value)]`` from the printed table."""
    rows = []
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 8 or cells[1] not in ("trained", "distilled"):
            continue
        parsed = {}
        for name, cell in zip(("calls", "rejections", "time", "speedup"), cells[2:6]):
            value, se = re.fullmatch(f"{NUMBER} ± {NUMBER}", cell).groups()
            parsed[name] = (float(value), float(se))
        parsed["exact_calls"], parsed["exact_time"] = float(cells[6]), float(cells[7])
        rows.append((cells[0], cells[1], parsed))
    return rows


def test_table_is_complete_and_finite(output):
    rows = table(output)
    chosen = int(re.search(r"trained draft (\d+), distilled draft (\d+)", output).group(1))
    assert 0 <= chosen <= 3  # best_lookahead over K <= 3 (K = 0: autoregressive decoding)
    # SD at K = 1 and at the chosen K (once if they agree), SD to the horizon, batch SD.
    labels = list(dict.fromkeys(["SD, K = 1", f"SD, K = {max(chosen, 1)}"])) \
        + ["SD (K = T)", "batch SD, M = 4, K = 4"]
    assert [(r[0], r[1]) for r in rows] == [(label, draft) for draft in ("trained", "distilled")
                                            for label in labels]
    for _, _, cells in rows:
        for name in ("calls", "rejections", "time", "speedup"):
            value, se = cells[name]
            assert math.isfinite(value) and 0 < se < 0.2, (name, cells)


def test_intervals_cover_the_exact_values(output):
    """The networks' exact values (prefix-tree lift, every sequence enumerated) lie within a
    few standard errors of the estimates from 400 recorded rollouts (fixed seeds)."""
    for label, draft, cells in table(output):
        for name in ("calls", "time"):
            value, se = cells[name]
            assert abs(value - cells[f"exact_{name}"]) < 4 * se, (label, draft, name, cells)


def test_enumerated_estimates_are_exact_and_the_dump_equals_the_direct_path(output):
    gaps = re.findall(r"largest difference (\S+)", output)
    assert len(gaps) == 3, output
    from_arrays, *exact = (float(g) for g in gaps)
    assert from_arrays <= 1e-6  # the same rows, scored by one batched forward per sequence
    assert all(gap <= 1e-10 for gap in exact)  # float64: estimate over every sequence = exact
    assert "same target rollouts: True" in output


def test_distillation_lowers_its_own_objective(output):
    before, after = map(float, re.search(r"objective (\S+) -> ([\d.]+)\)", output).groups())
    assert after < before
