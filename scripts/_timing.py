"""Timing helpers shared by the benchmark scripts (best of several runs, compilation excluded).

The timing itself is ``specjax.experiments.bench``'s (``python -m specjax bench`` uses the same
functions); this module adds the scripts' speed table."""

from __future__ import annotations

from specjax.experiments.bench import best_time  # noqa: F401 - re-exported for the scripts
from specjax.experiments.bench import time_against_numpy  # noqa: F401
from specjax.experiments.bench import timed  # noqa: F401


def print_speed_table(rows, batch: int, t_numpy: float) -> None:
    """The Markdown table of ``(implementation, seconds per batch)`` rows: time, requests per
    second and speed against NumPy."""
    print("| implementation | time per batch | requests per second | vs NumPy |")
    print("| --- | --- | --- | --- |")
    for name, t in rows:
        print(f"| {name} | {t * 1e3:.2f} ms | {batch / t:,.0f} | {t_numpy / t:.2f}x |")
