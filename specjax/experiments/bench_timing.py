"""The timing of ``python -m specjax bench`` (``specjax.experiments.bench``): per-run samples of
wall time (``time.perf_counter``) and process CPU time (``time.process_time``, every thread of
the process), the functions compared taken in turn (A B A B: a ratio measured side by side,
not across a change in the machine's load between two series of runs), the first call's time
(compilation included) kept apart, and the statistics the report gives of them (median,
min / max, a bootstrap interval of a ratio of medians).

``best_time``, ``best_times``, ``timed``, ``time_against_numpy`` and ``uniform_floor`` are the
benchmark scripts' (``scripts/_timing.py``), who take the best of the repeats.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax._progress import check_interrupt

__all__ = [
    "BOOTSTRAP_LEVEL",
    "BOOTSTRAP_RESAMPLES",
    "Samples",
    "best_time",
    "best_times",
    "bootstrap_ratio",
    "floor_samples",
    "measure",
    "summary",
    "time_against_numpy",
    "timed",
    "uniform_floor",
    "verify_samples",
]

BOOTSTRAP_RESAMPLES = 2000  # resamples of a bootstrap interval
BOOTSTRAP_LEVEL = 0.95  # its coverage


class Samples(NamedTuple):
    """The times of one function over one bench run, in seconds.

    Attributes:
      wall: the wall time of each timed call, in the order run.
      cpu: the process CPU time of each (every thread: above ``wall`` where XLA runs on several
        cores; on an accelerator, the host's share).
      first_wall: the first call's wall time (compilation included), or None where there was
        no warm-up call (NumPy compiles nothing: its first call is ``wall[0]``).
      first_cpu: the first call's CPU time, or None.
    """

    wall: tuple
    cpu: tuple
    first_wall: float | None = None
    first_cpu: float | None = None

    @property
    def median(self) -> float:
        """The median wall time."""
        return float(np.median(self.wall))

    @property
    def best(self) -> float:
        """The smallest wall time."""
        return float(min(self.wall))


def _call(fn, i) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    jax.block_until_ready(fn(i))
    return time.perf_counter() - wall, time.process_time() - cpu


def measure(fns, repeats, warmup=True) -> list[Samples]:
    """Times each of ``fns`` (called ``fn(i)``, every result waited for with
    ``block_until_ready``) and returns its ``Samples``.

    First one warm-up call ``fn(0)`` of each function whose ``warmup`` is true (its time is the
    ``first_*`` of its samples: compilation included). Then rounds ``i = 1, 2, ...``: in each, every
    function that has runs left is called ``fn(i)`` in turn (A B A B), so that two functions'
    ratio is measured side by side.

    Args:
      fns: the functions.
      repeats: the timed calls of each: one count for all, or one per function.
      warmup: whether each is called once first (one flag for all, or one per function).
    """
    counts = [repeats] * len(fns) if isinstance(repeats, int) else list(repeats)
    warmups = [warmup] * len(fns) if isinstance(warmup, bool) else list(warmup)
    counts = [max(int(n), 1) for n in counts]
    firsts = [_call(fn, 0) if w else (None, None) for fn, w in zip(fns, warmups)]
    walls, cpus = [[] for _ in fns], [[] for _ in fns]
    for i in range(max(counts)):
        check_interrupt()  # a Ctrl-C lost inside JAX (specjax._progress) ends the run here
        for k, fn in enumerate(fns):
            if i < counts[k]:
                wall, cpu = _call(fn, i + 1)
                walls[k].append(wall)
                cpus[k].append(cpu)
    return [Samples(tuple(w), tuple(c), *first) for w, c, first in zip(walls, cpus, firsts)]


def summary(values) -> dict | None:
    """``{"median", "min", "max", "samples"}`` of ``values`` (None where there are none)."""
    if not values:
        return None
    values = [float(v) for v in values]
    return {"median": float(np.median(values)), "min": min(values), "max": max(values),
            "samples": values}


def bootstrap_ratio(num, den, paired: bool = True, seed: int = 0) -> tuple[float, float]:
    """A ``BOOTSTRAP_LEVEL`` percentile bootstrap interval of ``median(num) / median(den)``.

    ``paired``: ``num[i]`` and ``den[i]`` were measured side by side (one round of ``measure``),
    and a resample draws rounds (the first ``min(len)`` of each); else each sample is resampled
    on its own (two runs of a bench). One sample each: the ratio itself, both ends.

    Example:
        >>> from specjax.experiments.bench_timing import bootstrap_ratio
        >>> bootstrap_ratio([2.0, 2.0, 2.0], [1.0, 1.0, 1.0])
        (2.0, 2.0)
    """
    num, den = np.asarray(num, np.float64), np.asarray(den, np.float64)
    rng = np.random.default_rng(seed)
    if paired:
        n = min(num.size, den.size)
        num, den = num[:n], den[:n]
        idx = rng.integers(0, n, (BOOTSTRAP_RESAMPLES, n))
        ratios = np.median(num[idx], axis=1) / np.median(den[idx], axis=1)
    else:
        a = num[rng.integers(0, num.size, (BOOTSTRAP_RESAMPLES, num.size))]
        b = den[rng.integers(0, den.size, (BOOTSTRAP_RESAMPLES, den.size))]
        ratios = np.median(a, axis=1) / np.median(b, axis=1)
    tail = 100 * (1 - BOOTSTRAP_LEVEL) / 2
    lo, hi = np.percentile(ratios, [tail, 100 - tail])
    return float(lo), float(hi)


# ------------------------------------------------------------------- the scripts' best-of timing
def best_time(fn, repeats: int) -> float:
    """Smallest wall time of ``fn(i)`` for ``i = 1..repeats``, after a warm-up call ``fn(0)``
    (which compiles, and is not counted); every result is waited for (``block_until_ready``)."""
    return best_times([fn], repeats)[0]


def best_times(fns, repeats: int) -> list:
    """``best_time`` of each of ``fns``, their calls taken in turn (``fns[0](i)``, ``fns[1](i)``,
    ..., then ``i + 1``) after one warm-up call each (``measure``)."""
    return [s.best for s in measure(fns, repeats)]


def timed(fn) -> float:
    """Wall time of one call of ``fn()``."""
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start


def time_against_numpy(verify, arrays, numpy_fn, repeats: int, numpy_repeats: int | None = None):
    """A verifier timed as a user calls it (``verify(*arrays)``, its checks included) and under
    the caller's ``jit``, beside ``numpy_fn()``: ``(first call under jit, compilation included;
    checked; jitted; NumPy; the jitted output as a NumPy array)``, best of ``repeats`` (the
    checked and jitted calls and NumPy's in turn, ``measure``; NumPy: of ``numpy_repeats``,
    default ``repeats``, without a warm-up: it compiles nothing)."""
    checked, jitted, numpy, output = verify_samples(verify, arrays, numpy_fn, repeats,
                                                    numpy_repeats)
    return jitted.first_wall, checked.best, jitted.best, numpy.best, output


def verify_samples(verify, arrays, numpy_fn, repeats: int, numpy_repeats: int | None = None):
    """``time_against_numpy``'s measurement as ``Samples``: ``(checked, jitted, NumPy, the
    jitted output as a NumPy array)``; the jitted samples' first call is the compilation."""
    device = [jnp.asarray(a) for a in arrays]
    jitted = jax.jit(verify)
    numpy_repeats = repeats if numpy_repeats is None else numpy_repeats
    s_jitted, s_checked, s_numpy = measure(
        [lambda i: jitted(*device), lambda i: verify(*device), lambda i: numpy_fn()],
        [repeats, repeats, numpy_repeats], [True, True, False])
    return s_checked, s_jitted, s_numpy, np.asarray(jitted(*device))


def floor_samples(num_chains: int, horizon: int, repeats: int) -> Samples:
    """The time JAX takes to draw one uniform per chain-step, ``num_chains`` chains over
    ``horizon`` positions, accumulated inside a ``lax.scan`` (nothing materialised): the floor
    of any sampler that needs one random number per step."""
    def scan(k):
        def step(acc, n):
            return acc + jax.random.uniform(jax.random.fold_in(k, n), (num_chains,)), None
        return jax.lax.scan(step, jnp.zeros(num_chains), jnp.arange(horizon))[0]
    floor = jax.jit(scan)
    key = jax.random.key(0)
    return measure([lambda i: floor(jax.random.fold_in(key, i))], repeats)[0]


def uniform_floor(num_chains: int, horizon: int, repeats: int) -> float:
    """``floor_samples``' best time (seconds)."""
    return floor_samples(num_chains, horizon, repeats).best
