"""The step-time model of a serving batch: ``ServingCost`` and ``roofline`` (re-exported by
``specjax.theory.serving``, whose exact goodput they price).

Step time (``ServingCost``). Pass ``j`` of the draft runs over the ``N_j`` slots whose call makes
at least ``j`` draft passes and takes ``draft_time[N_j]``; the target forward scores the ``S``
tokens of all slots and takes ``target_time[S]``; a step adds ``overhead``::

    step time = sum_{j >= 1, N_j > 0} draft_time[N_j] + target_time[S] + overhead.

A slot's pass counts once whatever it drafts in it (one level of a tree, ``M`` sequences of batch
SD): the tables are per slot-pass and per token scored. ``roofline`` builds a table from a
memory-bound time and a knee; it is a model, not a measurement.

The expected step time of ``B`` independent slots (``check_tables``, ``convolution_work``): the
``B``-fold convolution of a slot's law of tokens scored and the binomial law of ``N_j``, by
repeated squaring, the squares shared by every batch size of one program.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax.numerics import HIGHEST

__all__ = ["H100_KNEE", "MAX_STEP_WORK", "ServingCost", "check_tables", "convolution_work",
           "roofline"]


#: The knee of an H100-class accelerator (SXM, dense bf16): about 989 TFLOP/s over 3.35 TB/s of
#: HBM3, ~295 FLOP per byte; a forward pass of ``P`` bf16 weights reads ``2P`` bytes and does
#: ``2P`` FLOP per token, so it is memory-bound below ~295 tokens per pass. Spec-sheet numbers,
#: not a measurement.
H100_KNEE = 295


def _table(name: str, value, *, positive: bool):
    """A validated step-time table (a tuple of floats, entry 0 set to 0), a constant (a float),
    or a callable (kept, validated when evaluated)."""
    if isinstance(value, jax.core.Tracer):
        raise ValueError(f"{name} is a static setting: pass a number, a table or a function, "
                         "not a traced value")
    if callable(value):
        return value
    if isinstance(value, (bool, str, bytes)) or value is None:
        raise ValueError(f"{name} must be a number, a 1-D table or a function of n, got "
                         f"{value!r}")
    if np.ndim(value) == 0:
        number = _checks.check_finite_non_negative(name, value)
        if positive and number <= 0:
            raise ValueError(f"{name} must be positive, got {value!r}")
        return number
    try:
        table = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, a 1-D table or a function of n, got "
                         f"{value!r}") from None
    if table.ndim != 1 or table.shape[0] < 2:
        raise ValueError(f"{name} must be a 1-D table with {name}[n] for n >= 1 (entry 0 is "
                         f"unused), got shape {table.shape}")
    _check_entries(name, table[1:], positive, first=1)
    return (0.0,) + tuple(float(x) for x in table[1:])


def _check_entries(name: str, used: np.ndarray, positive: bool, first: int) -> None:
    good = np.isfinite(used) & ((used > 0) if positive else (used >= 0))
    if not good.all():
        bad = int(np.argmax(~good))
        sign = "positive" if positive else "non-negative"
        raise ValueError(f"{name} must hold finite {sign} times at n >= 1, got "
                         f"{name}[{bad + first}] = {used[bad]!r}")


@dataclasses.dataclass(frozen=True)
class ServingCost:
    """Step times of a batch: a draft pass over ``n`` slots, a target forward over ``n`` tokens.

    A static, hashable value. Each time is a number (the same for every ``n``), a 1-D table
    (entry ``n`` the time for ``n``; entry 0 is unused; longer than needed is fine) or a
    function of ``n`` (a Python int ``>= 1``), evaluated where needed.

    Args:
      draft_time: ``draft_time[n]``, one draft pass over the ``n`` slots still drafting
        (finite, ``>= 0``).
      target_time: ``target_time[n]``, one target forward over ``n`` tokens (finite, ``> 0``).
      overhead: a fixed time added to every step (keyword only), finite ``>= 0``.

    Raises:
      ValueError: a time that is not finite or of the wrong sign, a table that is not 1-D.

    Example:
      >>> import specjax
      >>> cost = specjax.ServingCost(0.05, specjax.theory.roofline(1.0, knee=8, size=64))
      >>> cost.target_times(16)[[1, 8, 16]].tolist()
      [1.0, 1.0, 2.0]
    """

    draft_time: Any
    target_time: Any
    _: dataclasses.KW_ONLY
    overhead: float = 0.0

    def __post_init__(self):
        set_field = object.__setattr__  # frozen: store the validated, hashable values
        set_field(self, "draft_time", _table("draft_time", self.draft_time, positive=False))
        set_field(self, "target_time", _table("target_time", self.target_time, positive=True))
        set_field(self, "overhead", _checks.check_finite_non_negative("overhead",
                                                                      self.overhead))

    def draft_times(self, size: int) -> np.ndarray:
        """``(size + 1,)`` float64: ``draft_time[n]`` for ``n = 0..size`` (entry 0 is 0)."""
        return _evaluate("draft_time", self.draft_time, size, positive=False)

    def target_times(self, size: int) -> np.ndarray:
        """``(size + 1,)`` float64: ``target_time[n]`` for ``n = 0..size`` (entry 0 is 0)."""
        return _evaluate("target_time", self.target_time, size, positive=True)


def _evaluate(name: str, value, size: int, *, positive: bool) -> np.ndarray:
    if isinstance(value, tuple):
        if len(value) < size + 1:
            raise ValueError(f"{name} is a table of length {len(value)}, but a step needs "
                             f"{name}[n] up to n = {size} (length at least {size + 1}; entry 0 "
                             f"is unused)")
        return np.asarray(value[:size + 1], np.float64)
    if not callable(value):
        return np.concatenate([[0.0], np.full(size, float(value))])
    try:
        used = np.asarray([float(value(n)) for n in range(1, size + 1)], np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{name}(n) must return a number for n = 1..{size}: {error}") from None
    _check_entries(name, used, positive, first=1)
    return np.concatenate([[0.0], used])


def _check_serving_cost(cost) -> None:
    if not isinstance(cost, ServingCost):
        raise ValueError(f"cost must be a specjax.ServingCost, got {type(cost).__name__} "
                         f"{cost!r}"[:300])


def roofline(memory_time: float, *, knee: float, size: int) -> tuple:
    """A roofline step-time table: ``memory_time`` below the knee, proportional above it.

    ``t(n) = memory_time * max(1, n / knee)``: a forward pass over ``n`` tokens reads the weights
    once (``memory_time``, memory-bound) and does ``n`` tokens of arithmetic, which takes longer
    than the read once ``n`` passes the knee (compute-bound). A model for users without a
    measured profile (``H100_KNEE`` is an H100-class knee from spec-sheet numbers), not a
    measurement: real step times add kernel launches, attention over the context and padding.

    Args:
      memory_time: the time of a pass below the knee, finite ``> 0``.
      knee: the tokens (or sequences) per pass where compute time equals memory time, ``> 0``.
      size: the largest ``n`` in the table, a positive int.

    Returns:
      a tuple of ``size + 1`` floats (entry 0 is 0), for ``ServingCost``.

    Example:
      >>> import specjax
      >>> specjax.theory.roofline(2.0, knee=4, size=6)
      (0.0, 2.0, 2.0, 2.0, 2.0, 2.5, 3.0)
    """
    memory_time = _checks.check_finite_non_negative("memory_time", memory_time)
    knee = _checks.check_finite_non_negative("knee", knee)
    if memory_time <= 0 or knee <= 0:
        raise ValueError(f"memory_time and knee must be positive, got {memory_time}, {knee}")
    _checks.check_static_int("size", size)
    n = np.arange(1, size + 1, dtype=np.float64)
    return (0.0,) + tuple(float(x) for x in memory_time * np.maximum(1.0, n / knee))


#: The most multiply-adds the law of a step's work may take (``convolution_work``): about 20-60 s
#: on a 2-core CPU with XLA's convolutions (``batch_size = 32,000`` with calls scoring up to 3
#: tokens took 23 s), about a twentieth with ``_convolve``'s products (``batch_size = 16,000``:
#: 0.2 s against 4.3 s, compilation excluded). It grows as ``(batch_size * max scored) ** 2``.
MAX_STEP_WORK = 3 * 10**9


def convolution_work(length: int, power: int) -> int:
    """Multiply-adds of ``_convolution_powers`` of a law over ``0..length - 1`` to ``power``."""
    result, base, work = 1, length, 0
    while power:
        if power & 1:
            work += result * base
            result += base - 1
        power >>= 1
        if power:
            work += base * base
            base = 2 * base - 1
    return work


def check_tables(cost: ServingCost, batch_size: int, passes, scored):
    """The tables a batch of ``B`` needs, evaluated (a short table raises here), after checking
    that the step's law is not too costly to compute (``MAX_STEP_WORK``)."""
    most_scored, most_passes = int(np.max(scored)), int(np.max(passes))
    work = convolution_work(most_scored + 1, batch_size) + \
        most_passes * convolution_work(2, batch_size)
    if work > MAX_STEP_WORK:
        raise ValueError(
            f"batch_size = {batch_size:,} (with calls scoring up to {most_scored} tokens) needs "
            f"about {work:.2g} multiply-adds for the law of a step's scored tokens, more than "
            f"the {MAX_STEP_WORK:.2g} allowed (specjax.theory.serving.MAX_STEP_WORK; it grows as "
            f"the square of batch_size times the tokens a call scores): use a smaller "
            f"batch_size")
    return (cost.draft_times(batch_size),
            cost.target_times(batch_size * max(int(np.max(scored)), 1)))


def _convolve(a: jax.Array, b: jax.Array) -> jax.Array:
    """The full convolution of two 1-D arrays, by direct sums in one matrix product (XLA's
    convolution of long vectors is slow on CPU: 0.5 ms for two of 289 entries, here 30 us):
    ``b`` cut into ``J`` blocks of ``s ~ sqrt(len b)``; row ``j`` of ``blocks @ M``, with
    ``M[i, n] = a[n - i]``, is block ``j``'s convolution with ``a``; the rows are added at their
    offsets ``j s``. ``M`` and the offsets are pads and reshapes (row ``i`` of a flat array read
    with rows one entry shorter, or ``s`` longer, is shifted by ``i`` or ``i s``), no gathers.
    Memory ``~ 2 len(a) sqrt(len b)``."""
    m, k = a.shape[0], b.shape[0]
    if k > m:
        a, b, m, k = b, a, k, m
    s = max(1, math.isqrt(k))
    blocks = -(-k // s)
    width = m + s - 1  # M (s, width): a shifted right by i in row i
    shifted = jnp.tile(jnp.pad(a, (0, s)), s)[:s * width].reshape(s, width)
    rows = jnp.dot(jnp.pad(b, (0, blocks * s - k)).reshape(blocks, s), shifted,
                   precision=HIGHEST)  # (J, width): block j's convolution with a
    wide = width + blocks * s  # row j shifted right by j s
    skewed = jnp.pad(rows, ((0, 0), (0, blocks * s + s))).reshape(-1)[:blocks * wide]
    return jnp.sum(skewed.reshape(blocks, wide), axis=0)[:m + k - 1]


def _convolution_powers(law: jax.Array, powers: tuple) -> list:
    """The law of the sum of ``power`` independent draws of ``law`` (a pmf over 0, 1, ...) for
    each of ``powers``, by repeated squaring (``2 log2 power`` convolutions), the squares
    ``law^(2^i)`` computed once for all: each power's convolutions are those of squaring alone."""
    bases = [law]
    while (1 << len(bases)) <= max(powers):
        bases.append(_convolve(bases[-1], bases[-1]))
    results = []
    for power in powers:
        result, bit = None, 0
        while power:
            if power & 1:
                result = bases[bit] if result is None else _convolve(result, bases[bit])
            power, bit = power >> 1, bit + 1
        results.append(result)
    return results


def _step_parts(law, draft_table, target_table, *, batch_sizes: tuple, passes: tuple,
                scored: tuple) -> list:
    """For each ``B`` of ``batch_sizes``: ``(E[draft time], E[target time], law of S)`` of a step
    of ``B`` independent slots, each doing ``(passes[i], scored[i])`` with probability
    ``law[i]`` (traceable; ``passes`` and ``scored`` static)."""
    scored_law = jnp.zeros((max(scored) + 1,), law.dtype).at[jnp.asarray(scored)].add(law)
    totals = _convolution_powers(scored_law, batch_sizes)
    counts = [None] * len(batch_sizes)
    if max(passes) > 0:
        tails = jnp.clip(jnp.stack([jnp.sum(jnp.where(jnp.asarray(passes) >= j, law, 0))
                                    for j in range(1, max(passes) + 1)]), 0, 1)
        bernoulli = jnp.stack([1 - tails, tails], axis=-1)
        counts = jax.vmap(lambda b: _convolution_powers(b, batch_sizes))(bernoulli)  # (J, B + 1)
    parts = []
    for size, total, count in zip(batch_sizes, totals, counts):
        target_part = jnp.dot(total, target_table[:total.shape[0]], precision=HIGHEST)
        draft_part = (jnp.zeros((), law.dtype) if count is None else
                      jnp.sum(count @ draft_table[:size + 1]))
        parts.append((draft_part, target_part, total))
    return parts
