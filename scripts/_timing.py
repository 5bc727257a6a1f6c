"""Timing helpers shared by the benchmark scripts (best of several runs, compilation excluded)."""

from __future__ import annotations

import time

import jax


def best_time(fn, repeats: int) -> float:
    """Smallest wall time of ``fn(i)`` for ``i = 1..repeats``, after a warm-up call ``fn(0)``."""
    jax.block_until_ready(fn(0))
    times = []
    for i in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(i + 1))
        times.append(time.perf_counter() - start)
    return min(times)


def timed(fn) -> float:
    """Wall time of one call of ``fn()``."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start
