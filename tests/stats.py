"""Statistical test helpers with stated false-failure rates (no seed tuning).

* ``assert_law``: chi-square goodness of fit of observed outcome counts to an exact law, with
  bins of small expected count pooled, plus a separate hard check that no outcome outside the
  law's support was observed (the chi-square would pass silently on those).
* ``assert_mean``: ``|mean - exact| < Z * sd / sqrt(n)``.

Each GoF test fails falsely with probability ``ALPHA``; the suite has fewer than 100 of them, so
with ALPHA = 1e-5 its family-wise false-failure rate is below 1e-3. Mean tests use Z = 4.5 (two-sided 6.8e-6 each).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

ALPHA = 1e-5
Z = 4.5


def chi_square_pvalue(observed: dict, expected_law: dict, n: int, min_expected: float = 5.0):
    """p-value of observed counts ``{outcome: count}`` against ``{outcome: probability}``."""
    keys = list(expected_law)
    exp = np.array([expected_law[k] * n for k in keys])
    obs = np.array([observed.get(k, 0) for k in keys], dtype=np.float64)
    small = exp < min_expected
    if small.any():
        exp = np.append(exp[~small], exp[small].sum())
        obs = np.append(obs[~small], obs[small].sum())
        if exp[-1] < min_expected and len(exp) > 1:  # fold the pooled bin into the smallest
            i = int(np.argmin(exp[:-1]))
            exp[i] += exp[-1]
            obs[i] += obs[-1]
            exp, obs = exp[:-1], obs[:-1]
    if len(exp) < 2:
        return 1.0
    stat = float(((obs - exp) ** 2 / exp).sum())
    return float(stats.chi2.sf(stat, df=len(exp) - 1))


def assert_law(observed: dict, expected_law: dict, n: int, what: str, alpha: float = ALPHA):
    impossible = {k: c for k, c in observed.items() if expected_law.get(k, 0.0) <= 0.0}
    assert not impossible, f"{what}: outcomes of probability zero observed: {list(impossible)[:5]}"
    pvalue = chi_square_pvalue(observed, expected_law, n)
    assert pvalue > alpha, f"{what}: chi-square p-value {pvalue:.3g} <= {alpha:g}"
    return pvalue


def assert_mean(samples, exact: float, what: str, z: float = Z):
    samples = np.asarray(samples, np.float64)
    mean = samples.mean()
    se = samples.std(ddof=1) / np.sqrt(samples.size)
    assert abs(mean - exact) <= z * se + 1e-12, (
        f"{what}: mean {mean:.6f} vs exact {exact:.6f} differs by "
        f"{abs(mean - exact) / max(se, 1e-300):.2f} standard errors (se {se:.3g})"
    )


def count_rows(rows: np.ndarray) -> dict:
    """``{tuple(row): count}`` for a 2-D integer array.

    Each row is read as one mixed-radix integer (its columns' offsets from their minima), so the
    count is a 1-D ``np.bincount`` (or ``np.unique`` for a wide range) instead of
    ``np.unique(axis=0)``'s lexicographic sort of rows (100,000 pairs: 2.4 ms against 44 ms)."""
    rows = np.asarray(rows)
    if rows.ndim != 2:
        raise ValueError(f"rows must be a 2-D array, got shape {rows.shape}")
    if rows.shape[0] == 0:
        return {}
    low = rows.min(0).astype(np.int64)
    span = rows.max(0).astype(np.int64) - low + 1
    num_keys = math.prod(int(size) for size in span)  # Python ints: no overflow
    if num_keys >= 2 ** 62:  # no room for one integer per row
        uniq, counts = np.unique(rows, axis=0, return_counts=True)
        return {tuple(int(v) for v in row): int(c) for row, c in zip(uniq, counts)}
    keys = np.zeros(rows.shape[0], np.int64)
    for column, size, offset in zip(rows.T, span, low):
        keys = keys * size + (column.astype(np.int64) - offset)
    if num_keys <= 4 * rows.shape[0] + 1024:
        counts = np.bincount(keys, minlength=num_keys)
        uniq = np.flatnonzero(counts)
        counts = counts[uniq]
    else:
        uniq, counts = np.unique(keys, return_counts=True)
    digits = []
    for size, offset in zip(span[::-1], low[::-1]):  # the last column is the lowest digit
        digits.append(uniq % size + offset)
        uniq = uniq // size
    table = np.stack(digits[::-1], axis=1)
    return {tuple(int(v) for v in row): int(c) for row, c in zip(table, counts)}
