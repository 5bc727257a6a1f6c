"""The best fixed lookahead from a recording, with standard errors: every ``K`` in one program.

The phase filter (``specjax.pairs.calls.phase_filter``) takes a traced ``K`` over a phase vector
of ``K_max + 1`` entries: phases ``j < K`` draft, phase ``K`` is the bonus token that opens the
next call, and the phases above ``K`` stay empty. ``jax.vmap`` over ``K = 1..K_max`` then gives
every lookahead's exact conditional expected time of every recorded sequence in one compiled
program (one per ``K_max`` and recording shape, where ``estimate`` at each ``K`` compiled one per
``K``).

Each ``K``'s time is a (weighted) mean over the same sequences, so the difference between two
lookaheads is a mean of per-sequence differences: its standard error (``difference_se``) is
that of the paired differences, far below either time's own (the sequences' variation cancels).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax.decoders.speculative import Speculative
from specjax.pairs.calls import phase_filter
from specjax.pairs.estimate import autoregressive_times
from specjax.pairs.estimate import call_columns
from specjax.pairs.estimate import check_recording
from specjax.pairs.estimate import rates
from specjax.pairs.recording import Recording
from specjax.pairs.recording import check_estimable
from specjax.theory.cost import CostModel

__all__ = ["BatchLookahead", "LookaheadEstimate", "batch_lookahead", "best_lookahead",
           "least_time"]


class LookaheadEstimate(NamedTuple):
    """The fixed lookahead of least estimated time (``best_lookahead``).

    Attributes:
      lookahead: the ``K`` of least estimated time (``0``: autoregressive decoding).
      expected_time: its estimated expected time.
      times: ``(K_max + 1,)``, the estimated time of every ``K = 0..K_max``.
      times_se: ``(K_max + 1,)``, their standard errors.
      runner_up: the ``K`` of the second least time (``-1`` when only one was tried).
      difference: ``times[runner_up] - times[lookahead]`` (``>= 0``).
      difference_se: its standard error, from the paired per-sequence differences.
    """

    lookahead: int
    expected_time: float
    times: np.ndarray
    times_se: np.ndarray
    runner_up: int
    difference: float
    difference_se: float


def decoder_to_vary(decoder):
    """``decoder`` (default ``Speculative()``) checked for an estimate from a recording and for
    a ``lookahead`` to vary."""
    decoder = Speculative() if decoder is None else decoder
    check_estimable(decoder)
    if not decoder.varies_lookahead:
        raise ValueError(f"decoder must have a lookahead to vary, got {type(decoder).__name__}")
    return decoder


@functools.partial(jax.jit, static_argnames=("max_lookahead",))
def _times(rejection, root_rejection, times, lengths, *, max_lookahead: int):
    """``(K_max, B)``: every ``K = 1..K_max``'s expected time of each sequence (one program);
    ``times`` ``(K_max, T)``: a call's time at each position for each ``K``."""
    dtype = jnp.result_type(rejection.dtype, root_rejection.dtype, times.dtype)
    rejection, root_rejection = rejection.astype(dtype), root_rejection.astype(dtype)
    ks = jnp.arange(1, max_lookahead + 1)

    def one(k, call_times):  # the phase filter at a traced K (phases past it stay empty)
        return phase_filter(rejection, root_rejection, max_lookahead, call_times[:, None],
                            lengths, k=k)[1][:, 0]

    return jax.vmap(one)(ks, times)


def best_lookahead(recording: Recording, cost: CostModel, *, max_lookahead: int,
                   decoder=None) -> LookaheadEstimate:
    """The fixed lookahead of least estimated time, as ``specjax.theory.best_lookahead`` from a
    recording, with standard errors: every ``K = 0..min(max_lookahead, T)`` (``K = 0``:
    autoregressive decoding; past the horizon ``T`` nothing changes) in one compiled program.

    Args:
      recording: a ``Recording`` (ragged ones too).
      cost: a ``CostModel``.
      max_lookahead: the largest ``K`` tried, a positive int.
      decoder: the token-wise decoder whose ``lookahead`` is varied (default
        ``Speculative()``).

    Returns:
      ``LookaheadEstimate``: the choice, every ``K``'s time with its standard error, and the
      runner-up with the paired difference and its standard error. Ties go to the smaller
      ``K``. Each time equals ``estimate(decoder with lookahead K, recording,
      cost=cost).expected_time``.

    Raises:
      ValueError: a bad ``recording``, ``cost`` or ``max_lookahead``; a decoder ``estimate``
        refuses or without a ``lookahead`` to vary.

    Example:
      >>> import jax, specjax
      >>> draft, target = specjax.paper_instance()
      >>> rec = specjax.record(jax.random.key(0), draft, target, 500)
      >>> choice = specjax.pairs.best_lookahead(rec, specjax.CostModel(0.1, 1.0),
      ...                                       max_lookahead=4)
      >>> choice.lookahead, choice.runner_up
      (3, 2)
      >>> bool(choice.difference > 2 * choice.difference_se)  # paired: K = 3 beats K = 2
      True
    """
    check_recording(recording)
    if not isinstance(cost, CostModel):
        raise ValueError(f"cost must be a specjax.CostModel, got {cost!r}"[:300])
    _checks.check_static_int("max_lookahead", max_lookahead)
    decoder = decoder_to_vary(decoder)
    horizon = recording.horizon
    kmax = min(max_lookahead, horizon)
    root, inside = rates(decoder, recording)
    dtype = jnp.result_type(inside.dtype, recording.target_prob.dtype)
    columns = np.stack([call_columns(decoder.with_lookahead(k), horizon, k,
                                     cost)[:, 2] for k in range(1, kmax + 1)])  # (K_max, T)
    # Only the sweep is compiled (NumPy arrays go in as they are; the rest is NumPy): a new
    # K_max or recording shape compiles one program.
    per_k = np.asarray(_times(inside, root, columns.astype(dtype), recording.lengths,
                              max_lookahead=kmax), np.float64)  # (K_max, B)
    baseline = np.broadcast_to(np.asarray(autoregressive_times(recording, cost), np.float64),
                               per_k.shape[1:])
    per_sequence = np.concatenate([baseline[None], per_k])  # (K_max + 1, B)
    best, means, ses, second, difference, difference_se = least_time(per_sequence,
                                                                     recording.weights)
    return LookaheadEstimate(best, float(means[best]), means, ses, second, difference,
                             difference_se)


def least_time(per_sequence, weights):
    """``(best, means, ses, runner_up, difference, difference_se)`` of candidates' times
    ``per_sequence`` ``(N, B)`` on the same sequences (``weights`` ``(B,)`` or ``None``): the
    least mean (ties to the earlier candidate), every mean with its standard error, and the
    runner-up's paired difference (``-1``, 0, 0 for one candidate)."""
    per_sequence = np.asarray(per_sequence, np.float64)
    weights = (np.ones(per_sequence.shape[1]) if weights is None else
               np.asarray(weights, np.float64))
    means, ses = _mean_se(per_sequence, weights)
    order = np.argsort(means, kind="stable")
    best = int(order[0])
    if len(order) == 1:
        return best, means, ses, -1, 0.0, 0.0
    second = int(order[1])
    difference, difference_se = _mean_se(per_sequence[second] - per_sequence[best], weights)
    return best, means, ses, second, float(difference), float(difference_se)


def _mean_se(values, weights):
    """``weighted_mean_se`` in NumPy float64, over the last axis of ``values``."""
    total = weights.sum()
    mean = (values * weights).sum(-1) / total
    count = weights.shape[0]
    if count < 2:
        return mean, np.full_like(mean, np.nan)
    spread = (weights * (values - mean[..., None])) ** 2
    return mean, np.sqrt(count / (count - 1) * spread.sum(-1)) / total


class BatchLookahead(NamedTuple):
    """The SD lookahead of most estimated goodput for one batch size (``batch_lookahead``).

    Attributes:
      batch_size: ``B``, the slots.
      lookahead: the ``K`` of most tokens per time (``0``: SD off).
      tokens_per_time: its estimated goodput (``specjax.serving_rate``'s ``tokens_per_time``).
      rates, rates_se: ``(K_max + 1,)``, every ``K``'s goodput and its standard error.
      runner_up: the ``K`` of the second most goodput (``-1`` when only one was tried).
      difference, difference_se: ``rates[lookahead] - rates[runner_up]`` (``>= 0``) and its
        standard error from the paired per-sequence terms.
    """

    batch_size: int
    lookahead: int
    tokens_per_time: float
    rates: np.ndarray
    rates_se: np.ndarray
    runner_up: int
    difference: float
    difference_se: float


def batch_lookahead(recording: Recording, cost, *, batch_size, max_lookahead: int,
                    decoder=None):
    """One ``K`` for a batch of ``batch_size`` slots, as ``specjax.theory.batch_lookahead`` from
    a recording: each ``K = 0..min(max_lookahead, T)``'s goodput (``estimate(...,
    cost=ServingCost, batch_size=B)``) with its standard error, and the paired difference to the
    runner-up (the same sequences decide every ``K``).

    Args:
      recording: a ``Recording``.
      cost: a ``specjax.ServingCost``.
      batch_size: ``B``, a positive int, or a sequence of them (each ``K``'s filter runs once
        for all).
      max_lookahead: the largest ``K`` tried, a non-negative int (``0``: SD off alone).
      decoder: the token-wise decoder whose ``lookahead`` is varied (default
        ``Speculative()``).

    Returns:
      ``BatchLookahead`` (a tuple of them for a sequence of batch sizes); ties go to the
      smaller ``K``.

    Example:
      >>> import jax, specjax
      >>> draft, target = specjax.paper_instance()
      >>> rec = specjax.record(jax.random.key(0), draft, target, 500)
      >>> cost = specjax.ServingCost(0.05, specjax.theory.roofline(1.0, knee=16, size=256))
      >>> [c.lookahead for c in specjax.pairs.batch_lookahead(rec, cost, batch_size=(1, 32),
      ...                                                     max_lookahead=4)]
      [3, 0]
    """
    from specjax.decoders.autoregressive import Autoregressive  # noqa: PLC0415
    from specjax.pairs.estimate import filtered  # noqa: PLC0415
    from specjax.pairs.serving import goodput_influences  # noqa: PLC0415
    from specjax.pairs.serving import slot_means  # noqa: PLC0415
    from specjax.theory.serving import ServingCost  # noqa: PLC0415
    from specjax.theory.serving import batch_sizes  # noqa: PLC0415
    from specjax.theory.serving import check_tables  # noqa: PLC0415
    from specjax.theory.cost import call_works  # noqa: PLC0415

    check_recording(recording)
    if not isinstance(cost, ServingCost):
        raise ValueError(f"cost must be a specjax.ServingCost, got {cost!r}"[:300])
    sizes, many = batch_sizes(batch_size)
    _checks.check_static_non_negative_int("max_lookahead", max_lookahead)
    decoder = decoder_to_vary(decoder)
    horizon = recording.horizon
    decoders = [Autoregressive()] + [decoder.with_lookahead(k)
                                     for k in range(1, min(max_lookahead, horizon) + 1)]
    for d in decoders:  # short tables or huge batches: before any work
        check_tables(cost, max(sizes), *call_works(d, horizon, d.resolve_lookahead(horizon)))
    means = [slot_means(d, recording, filtered) for d in decoders]
    # Every K at every batch size: one compiled program (value and gradient).
    values, _, influences = goodput_influences([m[0] for m in means], means[0][1],
                                               [m[2:] for m in means], cost, sizes)
    values, influences = np.asarray(values, np.float64), np.asarray(influences, np.float64)
    weights = np.asarray(means[0][1], np.float64)
    choices = []
    for size, rates, influence in zip(sizes, values, influences):  # (K + 1,), (K + 1, B)
        ses = np.asarray([_mean_se(x, weights)[1] for x in influence])
        order = np.argsort(-rates, kind="stable")  # most goodput first, ties to the smaller K
        best = int(order[0])
        second = int(order[1]) if len(order) > 1 else -1
        difference = float(rates[best] - rates[second]) if second >= 0 else 0.0
        difference_se = (float(_mean_se(influence[best] - influence[second], weights)[1])
                         if second >= 0 else 0.0)
        choices.append(BatchLookahead(int(size), best, float(rates[best]), rates, ses, second,
                                      difference, difference_se))
    return tuple(choices) if many else choices[0]
