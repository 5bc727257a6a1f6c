"""The step-time model of a serving batch: ``ServingCost`` and ``roofline`` (re-exported by
``specjax.theory.serving``, whose exact goodput they price).

Step time (``ServingCost``). Pass ``j`` of the draft runs over the ``N_j`` slots whose call makes
at least ``j`` draft passes and takes ``draft_time[N_j]``; the target forward scores the ``S``
tokens of all slots and takes ``target_time[S]``; a step adds ``overhead``::

    step time = sum_{j >= 1, N_j > 0} draft_time[N_j] + target_time[S] + overhead.

A slot's pass counts once whatever it drafts in it (one level of a tree, ``M`` sequences of batch
SD): the tables are per slot-pass and per token scored. ``roofline`` builds a table from a
memory-bound time and a knee; it is a model, not a measurement.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from specjax import _checks

__all__ = ["H100_KNEE", "ServingCost", "roofline"]


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
