"""Timing helpers shared by the benchmark scripts (best of several runs, compilation excluded)."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np


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


def time_against_numpy(verify, arrays, numpy_fn, repeats: int):
    """A verifier timed as a user calls it (``verify(*arrays)``, its checks included) and under
    the caller's ``jit``, beside ``numpy_fn()``: ``(first call under jit, compilation included;
    checked; jitted; NumPy; the jitted output as a NumPy array)``, best of ``repeats``."""
    device = [jnp.asarray(a) for a in arrays]
    jitted = jax.jit(verify)
    start = time.perf_counter()
    jax.block_until_ready(jitted(*device))
    first = time.perf_counter() - start
    t_checked = best_time(lambda i: verify(*device), repeats)
    t_jitted = best_time(lambda i: jitted(*device), repeats)
    t_numpy = best_time(lambda i: numpy_fn(), repeats)
    return first, t_checked, t_jitted, t_numpy, np.asarray(jitted(*device))


def print_speed_table(rows, batch: int, t_numpy: float) -> None:
    """The Markdown table of ``(implementation, seconds per batch)`` rows: time, requests per
    second and speed against NumPy."""
    print("| implementation | time per batch | requests per second | vs NumPy |")
    print("| --- | --- | --- | --- |")
    for name, t in rows:
        print(f"| {name} | {t * 1e3:.2f} ms | {batch / t:,.0f} | {t_numpy / t:.2f}x |")
