"""Distilling a draft for what decoding costs: differentiable objectives over recorded rollouts.

A lossless decoder's output has the target's law whatever the draft, so target rollouts recorded
once serve every draft. Along a rollout ``x``, SD's expected rejections, calls and time given
``x`` are exact functions of the rates ``r_t = [q_t - p_t]_+(x_t) / q_t(x_t)``
(``specjax.pairs.call_structure``: a filter over the phase of the call), and their weighted mean
over the recording is an unbiased estimate of ``specjax.exact``'s value (exact when the recording
enumerates every sequence, weighted by its target probability). Since ``x`` does not depend on
the draft, the same mean is a differentiable objective in the draft's parameters: a draft network
can be distilled for the rejections (or time) of SD with the lookahead it will run at, not for a
divergence that ignores ``K``.

Only ``p_theta(x_t)``, the draft's probability of the recorded token, enters the objective, and
only ``q_t(x_t)`` from the target: a recording of ``V = 128,000`` rows needs one number per
position. The divergences DistillSpec compares (forward KL, total variation) need the target's
full rows (``divergence_objective``; small ``V``).

| function | static settings | call | value |
| --- | --- | --- | --- |
| ``decoding_objective(decoder, apply, measure)`` | ``Speculative(K)``, the draft, the measure, a ``CostModel`` | ``(params, tokens, target_probs, weights=None)`` | ``DistillLoss`` |
| ``divergence_objective(apply, divergence)`` | the draft, ``"kl"`` or ``"tv"`` | ``(params, tokens, target_probs, weights=None)`` | a scalar |

References:
  The paper's Theorem 1 (``K = T``: the expected rejections are the summed total variation);
  Zhou et al. 2024, "DistillSpec" (distilling drafts by KL and total variation).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax.decoders.speculative import Speculative
from specjax.pairs.calls import call_structure
from specjax.pairs.calls import expected_call_time
from specjax.pairs.calls import rejection_rate
from specjax.theory.cost import CostModel
from specjax.theory.cost import call_works

MEASURES = ("rejections", "calls", "time")
DIVERGENCES = ("kl", "tv")


class DistillLoss(NamedTuple):
    """A decoding objective's value over a recording: weighted means over its sequences.

    Attributes:
      value: the chosen measure (``expected_rejections``, ``expected_calls`` or
        ``expected_time``): what an optimiser minimises.
      expected_rejections: ``E[rejections]`` of the decoder with this draft.
      expected_calls: ``E[target calls]``.
      expected_time: ``E[time]`` under the ``CostModel`` (``None`` without one).
    """

    value: jax.Array  # shape=()
    expected_rejections: jax.Array  # shape=()
    expected_calls: jax.Array  # shape=()
    expected_time: jax.Array | None  # shape=(); None without a cost model


def _check_apply(apply) -> None:
    if not callable(apply):
        raise ValueError(f"apply must be a function apply(params, tokens) -> (B, T, V) draft "
                         f"rows, got {type(apply).__name__} {apply!r}"[:300])


def _check_logits(logits) -> bool:
    if not isinstance(logits, bool):
        raise ValueError(f"logits must be True or False, got {logits!r}")
    return logits


def check_recording(tokens, target_probs, weights, *, full_rows: bool):
    """``(tokens (B, T + 1) int, target_probs, weights (B,) or None)`` as arrays, or
    ``ValueError`` naming the argument. ``target_probs``: ``(B, T, V)`` rows, or with
    ``full_rows=False`` also ``(B, T)``, the target's probability of each recorded token."""
    tokens = jnp.asarray(tokens)
    if tokens.ndim != 2 or tokens.shape[1] < 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(f"tokens must be an integer array of shape (B, T + 1) with T >= 1 "
                         f"(x_0..x_T of B rollouts), got dtype {tokens.dtype} and shape "
                         f"{tokens.shape}")
    batch, horizon = tokens.shape[0], tokens.shape[1] - 1
    target_probs = jnp.asarray(target_probs)
    if not jnp.issubdtype(target_probs.dtype, jnp.floating):
        target_probs = target_probs.astype(jnp.result_type(float))
    shapes = "(B, T, V) rows" if full_rows else "(B, T, V) rows or (B, T) at the recorded tokens"
    if target_probs.shape[:2] != (batch, horizon) or target_probs.ndim != (
            3 if full_rows else target_probs.ndim) or target_probs.ndim not in (2, 3):
        raise ValueError(f"target_probs must have shape {shapes} with (B, T) = "
                         f"{(batch, horizon)} from tokens, got shape {target_probs.shape}")
    if _checks.is_concrete(target_probs):
        bad = ~((target_probs >= 0) & (target_probs <= 1))
        if bool(jnp.any(bad)):
            raise ValueError(f"target_probs must hold probabilities in [0, 1], got "
                             f"{float(target_probs[bad][0])!r}")
    if target_probs.ndim == 3 and _checks.is_concrete(tokens):
        if bool(jnp.any((tokens < 0) | (tokens >= target_probs.shape[-1]))):
            raise ValueError(f"tokens must lie in 0..V - 1 = {target_probs.shape[-1] - 1}, got "
                             f"values in {int(tokens.min())}..{int(tokens.max())}")
    if weights is not None:
        weights = jnp.asarray(weights)
        if not jnp.issubdtype(weights.dtype, jnp.floating):
            weights = weights.astype(jnp.result_type(float))
        if weights.shape != (batch,):
            raise ValueError(f"weights must have shape (B,) = ({batch},), got {weights.shape}")
        if _checks.is_concrete(weights) and not (bool(jnp.all(weights >= 0))
                                                  and float(jnp.sum(weights)) > 0):
            raise ValueError("weights must be finite, >= 0 and not all 0")
    return tokens, target_probs, weights


def token_probs(rows, tokens, *, logits: bool = False) -> jax.Array:
    """``(B, T)``: the probability each ``(B, T, V)`` row gives the recorded token ``x_t``
    (``tokens[:, 1:]``); with ``logits=True`` the rows are logits (a ``log_softmax`` first, so a
    ``-inf`` logit gives probability 0 with finite gradients elsewhere)."""
    targets = jnp.asarray(tokens)[:, 1:, None]
    rows = jnp.asarray(rows)
    if logits:
        return jnp.exp(jnp.take_along_axis(jax.nn.log_softmax(rows, axis=-1), targets,
                                           axis=-1)[..., 0])
    return jnp.take_along_axis(rows, targets, axis=-1)[..., 0]


def _draft_rows(apply, params, tokens):
    rows = jnp.asarray(apply(params, tokens))
    shape = (tokens.shape[0], tokens.shape[1] - 1)
    if rows.ndim != 3 or rows.shape[:2] != shape:
        raise ValueError(f"apply(params, tokens) must return (B, T, V) draft rows with (B, T) = "
                         f"{shape}, got shape {rows.shape}")
    return rows


def weighted_mean(values, weights) -> jax.Array:
    """The recording's mean of ``(B,)`` per-sequence values: plain, or ``weights``-weighted."""
    if weights is None:
        return jnp.mean(values)
    weights = weights.astype(values.dtype)
    return jnp.sum(weights * values) / jnp.sum(weights)


def _speculative_lookahead(decoder):
    if not isinstance(decoder, Speculative):
        raise ValueError(f"decoder must be specjax.Speculative(lookahead) (SD with a lookahead "
                         f"K, or None for K = T), got {decoder!r}"[:300])
    return decoder.lookahead


def decoding_objective(decoder, apply: Callable, measure: str = "rejections", *,
                       cost: CostModel | None = None, logits: bool = False) -> Callable:
    """The expected rejections, calls or time of SD with a draft ``apply(params, .)``, estimated
    on recorded target rollouts: a pure function of the parameters for ``jax.grad`` and optax.

    For each recorded sequence ``x``, ``r_t = rejection_rate(p_theta(x_t), q_t(x_t))`` along it
    and the exact ``E[. | x]`` of ``call_structure(r, K)``; the value is their (weighted) mean.

    Args:
      decoder: ``specjax.Speculative(lookahead=K)`` (``K = None``: draft to the horizon); static.
      apply: the draft, ``apply(params, tokens) -> (B, T, V)``: at index ``t - 1`` the draft's
        law of ``x_t`` given ``x_0..x_{t-1}``, along the ``(B, T + 1)`` recorded tokens (an
        equinox module's call, a flax ``model.apply``); probabilities, or logits with
        ``logits=True``. Only each row's entry at the recorded token is used.
      measure: ``"rejections"``, ``"calls"`` or ``"time"`` (needs ``cost``): the ``value`` field.
      cost: a ``specjax.CostModel`` for ``expected_time`` (a call at ``n`` drafts
        ``min(K, T - n + 1)`` tokens and scores one more, as ``specjax.theory.decoding_time``).
      logits: whether ``apply`` returns logits.

    Returns:
      ``loss(params, tokens, target_probs, weights=None) -> DistillLoss``: ``tokens``
      ``(B, T + 1)`` target rollouts, ``target_probs`` ``(B, T)`` the target's probability of each
      recorded token (or ``(B, T, V)`` its rows), ``weights`` ``(B,)`` optional (with every
      sequence enumerated and weighted by its target probability, the value is exact). Values
      and gradients are finite at ``p = q`` and at ``p_theta(x_t) = 0``.

    Raises:
      ValueError: naming the argument: a decoder other than ``Speculative``, ``apply`` not
        callable, an unknown ``measure``, ``"time"`` without a ``CostModel``; at call time,
        arrays of the wrong shape, probabilities outside ``[0, 1]``, negative weights.

    Example:
      >>> import jax, jax.numpy as jnp, specjax
      >>> from specjax.pairs.distill import decoding_objective
      >>> tokens = jnp.array([[0, 1, 1], [0, 0, 1]])        # two rollouts, T = 2
      >>> target_probs = jnp.array([[0.5, 0.8], [0.5, 0.2]])
      >>> apply = lambda params, tokens: jnp.broadcast_to(jax.nn.softmax(params), (2, 2, 2))
      >>> loss = decoding_objective(specjax.Speculative(1), apply, logits=False)
      >>> value = loss(jnp.zeros(2), tokens, target_probs).value
      >>> round(float(value), 3)
      0.375
    """
    lookahead = _speculative_lookahead(decoder)
    _check_apply(apply)
    if measure not in MEASURES:
        raise ValueError(f"measure must be one of {MEASURES}, got {measure!r}")
    if cost is not None and not isinstance(cost, CostModel):
        raise ValueError(f"cost must be None or a specjax.CostModel, got "
                         f"{type(cost).__name__} {cost!r}"[:300])
    if measure == "time" and cost is None:
        raise ValueError("measure='time' needs cost=specjax.CostModel(...)")
    logits = _check_logits(logits)

    def loss(params, tokens, target_probs, weights=None) -> DistillLoss:
        tokens, target_probs, weights = check_recording(tokens, target_probs, weights,
                                                        full_rows=False)
        horizon = tokens.shape[1] - 1
        times = None if cost is None else _call_times(cost, lookahead, horizon)
        q = target_probs if target_probs.ndim == 2 else token_probs(target_probs, tokens)
        p = token_probs(_draft_rows(apply, params, tokens), tokens, logits=logits)
        rates = rejection_rate(p, q)
        structure = call_structure(rates, lookahead)
        rejections = weighted_mean(structure.rejections, weights)
        calls = weighted_mean(structure.calls, weights)
        time = None if times is None else weighted_mean(
            expected_call_time(rates, lookahead, times.astype(rates.dtype)), weights)
        value = {"rejections": rejections, "calls": calls, "time": time}[measure]
        return DistillLoss(value=value, expected_rejections=rejections, expected_calls=calls,
                           expected_time=time)

    return loss


def _call_times(cost: CostModel, lookahead, horizon: int) -> np.ndarray:
    """``(T,)``: the time of an SD call at ``n = 1..T`` under ``cost``."""
    k = horizon if lookahead is None else min(lookahead, horizon)
    passes, scored = call_works(Speculative(lookahead), horizon, k)
    return np.asarray([cost.call_time(draft_passes=int(d), tokens_scored=int(s))
                       for d, s in zip(passes, scored)])


def divergence_objective(apply: Callable, divergence: str = "kl", *,
                         logits: bool = False) -> Callable:
    """The baselines: forward KL or total variation between the target's and the draft's rows,
    summed over positions and averaged over recorded rollouts (DistillSpec's divergences).

    ``"kl"``: ``sum_t KL(q_t || p_t)`` (maximum likelihood on the target's rows);
    ``"tv"``: ``sum_t TV(q_t, p_t)``, whose mean over rollouts is SD's expected rejections at
    ``K = T`` (Theorem 1), the same quantity ``decoding_objective(Speculative(), apply)``
    estimates from the recorded tokens alone.

    Args:
      apply: the draft, as for ``decoding_objective``.
      divergence: ``"kl"`` or ``"tv"``.
      logits: whether ``apply`` returns logits (KL then uses ``log_softmax``: finite where the
        draft's probability underflows).

    Returns:
      ``loss(params, tokens, target_probs, weights=None) -> ()`` with ``target_probs``
      ``(B, T, V)``, the target's full rows along the rollouts.

    Raises:
      ValueError: naming the argument (as ``decoding_objective``; ``target_probs`` must be rows).

    Example:
      >>> import jax.numpy as jnp
      >>> from specjax.pairs.distill import divergence_objective
      >>> tv = divergence_objective(lambda params, tokens: params, "tv")
      >>> rows = jnp.array([[[0.5, 0.5]]])
      >>> round(float(tv(jnp.array([[[0.8, 0.2]]]), jnp.array([[0, 1]]), rows)), 3)
      0.3
    """
    _check_apply(apply)
    if divergence not in DIVERGENCES:
        raise ValueError(f"divergence must be one of {DIVERGENCES}, got {divergence!r}")
    logits = _check_logits(logits)

    def loss(params, tokens, target_probs, weights=None) -> jax.Array:
        tokens, q, weights = check_recording(tokens, target_probs, weights, full_rows=True)
        rows = _draft_rows(apply, params, tokens)
        if rows.shape != q.shape:
            raise ValueError(f"apply(params, tokens) must return rows of the target's shape "
                             f"{q.shape}, got {rows.shape}")
        if divergence == "tv":
            p = jax.nn.softmax(rows, axis=-1) if logits else rows
            per_position = 0.5 * jnp.sum(jnp.abs(q - p.astype(q.dtype)), axis=-1)
        else:
            log_p = jax.nn.log_softmax(rows, axis=-1) if logits else _log(rows)
            positive = q > 0
            log_q = _log(jnp.where(positive, q, 1))
            per_position = jnp.sum(jnp.where(positive, q * (log_q - log_p.astype(q.dtype)), 0),
                                   axis=-1)
        return weighted_mean(jnp.sum(per_position, axis=-1), weights)

    return loss


def _log(x):
    """``log(x)`` with ``-inf`` at 0 and a finite reverse-mode gradient there (0)."""
    positive = x > 0
    return jnp.where(positive, jnp.log(jnp.where(positive, x, 1)), -math.inf)


__all__ = ["DistillLoss", "decoding_objective", "divergence_objective", "token_probs"]
