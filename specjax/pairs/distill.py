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

For SD only ``p_theta(x_t)``, the draft's probability of the recorded token, enters the
objective, and only ``q_t(x_t)`` from the target: a recording of a ``V = 128,000`` target needs
one number per position. A multi-draft root (batch SD, the optimal verifier, K-SEQ) changes the
rate at a call's first position, computed from the decoder's laws on the full rows, as do the
divergences DistillSpec compares (forward KL, total variation): those need recordings that keep
the target's rows (small ``V``).

| function | static settings | returns |
| --- | --- | --- |
| ``decoding_objective(decoder, apply, measure, cost=)`` | the decoder and its ``K``, the draft, ``"rejections"`` / ``"calls"`` / ``"time"``, a ``CostModel`` | ``loss(params, recording) -> DistillLoss`` |
| ``divergence_objective(apply, divergence)`` | the draft, ``"kl"`` or ``"tv"`` | ``loss(params, recording) -> ()`` |

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
from specjax.pairs.estimate import check_cost
from specjax.pairs.estimate import check_recording
from specjax.pairs.estimate import per_sequence
from specjax.pairs.estimate import weighted_mean_se
from specjax.pairs.recording import check_estimable
from specjax.pairs.recording import probs_at
from specjax.theory.cost import CostModel

MEASURES = ("rejections", "calls", "time")
DIVERGENCES = ("kl", "tv")


class DistillLoss(NamedTuple):
    """A decoding objective's value over a recording: (weighted) means over its sequences.

    Attributes:
      value: the chosen measure (``expected_rejections``, ``expected_calls`` or
        ``expected_time``): what an optimiser minimises.
      expected_rejections: ``E[rejections]`` of the decoder with this draft.
      expected_calls: ``E[target calls]``.
      expected_time: ``E[time]`` under the ``CostModel`` (``None`` without one).
      per_sequence: ``(B,)``, the chosen measure's exact expectation given each recorded
        sequence (``value`` is their weighted mean): for standard errors and paired comparisons.
    """

    value: jax.Array  # shape=()
    expected_rejections: jax.Array  # shape=()
    expected_calls: jax.Array  # shape=()
    expected_time: jax.Array | None  # shape=(); None without a cost model
    per_sequence: jax.Array  # shape=(B,)


def _check_apply(apply) -> None:
    if not callable(apply):
        raise ValueError(f"apply must be a function apply(params, tokens) -> (B, T, V) draft "
                         f"rows, got {type(apply).__name__} {apply!r}"[:300])


def _check_logits(logits) -> bool:
    if not isinstance(logits, bool):
        raise ValueError(f"logits must be True or False, got {logits!r}")
    return logits


def _check_recording(recording, *, rows: bool, why: str = "") -> None:
    check_recording(recording)
    if rows and recording.target_probs is None:
        raise ValueError(f"recording holds no target rows: {why} needs the target's full rows "
                         f"along the rollouts (keep_rows=True in specjax.record or "
                         f"Recording.from_arrays)")


def token_probs(rows, tokens, *, logits: bool = False) -> jax.Array:
    """``(B, T)``: the probability each ``(B, T, V)`` row gives the recorded token ``x_t``
    (``tokens[:, 1:]``); with ``logits=True`` the rows are logits (a ``log_softmax`` first, so a
    ``-inf`` logit gives probability 0 with finite gradients elsewhere)."""
    targets = jnp.asarray(tokens)[:, 1:]
    rows = jnp.asarray(rows)
    if logits:
        return jnp.exp(probs_at(jax.nn.log_softmax(rows, axis=-1), targets))
    return probs_at(rows, targets)


def _draft_rows(apply, params, recording, logits: bool):
    """``apply(params, tokens)``'s ``(B, T, V)`` rows, checked: the shape; ``V`` above every
    recorded token (when the tokens are concrete); with ``logits=False``, probability rows
    (finite, non-negative, summing to one within ``row_sum_tolerance``) when their values are
    known (concrete, or under ``jax.grad`` alone), and under ``jit`` (values unknown) the rows
    that are not laws made NaN, so that the objective and its gradient are NaN rather than a
    number an optimiser could exploit (rows summing to 2 score fewer rejections than any law)."""
    rows = jnp.asarray(apply(params, recording.tokens))
    shape = recording.target_prob.shape
    if rows.ndim != 3 or rows.shape[:2] != shape:
        raise ValueError(f"apply(params, tokens) must return (B, T, V) draft rows with (B, T) = "
                         f"{shape}, got shape {rows.shape}")
    if recording.target_probs is not None and rows.shape != recording.target_probs.shape:
        raise ValueError(f"apply(params, tokens) must return rows of the target's shape "
                         f"{recording.target_probs.shape}, got {rows.shape}")
    if not jnp.issubdtype(rows.dtype, jnp.floating):
        raise ValueError(f"apply(params, tokens) must return floating-point rows, got dtype "
                         f"{rows.dtype}")
    tokens = recording.tokens
    if _checks.is_concrete(tokens) and shape[0] * shape[1]:
        high = int(np.max(np.asarray(tokens)[:, 1:]))
        if high >= rows.shape[-1]:
            raise ValueError(f"apply(params, tokens) must return rows over the recording's "
                             f"vocabulary: V = {rows.shape[-1]} from its shape {rows.shape}, "
                             f"but the recording holds token {high}")
    if logits:  # NaN or +inf logits give NaN rows: refused when known, NaN under jit
        bad = jnp.any(jnp.isnan(rows) | (rows == jnp.inf), axis=-1)
        if not _checks.is_concrete(bad):
            return rows
        bad = np.asarray(bad)
        if bad.any():
            at = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(f"apply(params, tokens) must return logits that are finite or "
                             f"-inf (a token never drafted), but its row {at} holds NaN or "
                             f"+inf")
        return rows
    tolerance = _checks.row_sum_tolerance(rows.dtype)
    sums = jnp.sum(rows.astype(jnp.promote_types(rows.dtype, jnp.float32)), axis=-1)
    negative = jnp.any(rows < 0, axis=-1)
    infinite = ~jnp.all(jnp.isfinite(rows), axis=-1)
    laws = ~negative & ~infinite & (jnp.abs(sums - 1) <= tolerance)
    if not _checks.is_concrete(laws):
        return rows * jnp.where(laws, 1, jnp.nan).astype(rows.dtype)[..., None]  # NaN grads
    laws = np.asarray(laws)  # concrete under jax.grad alone: a comparison has no tangent
    if not laws.all():
        at = tuple(int(i) for i in np.argwhere(~laws)[0])
        what = ("holds NaN or infinite entries" if bool(infinite[at]) else
                "holds a negative entry" if bool(negative[at]) else
                f"sums to {float(sums[at]):.8g}" if _checks.is_concrete(sums) else
                "does not sum to one")
        raise ValueError(f"apply(params, tokens) must return probability rows with logits=False "
                         f"(non-negative, each summing to one within {tolerance:g}), but its "
                         f"row {at} {what}; pass logits=True if apply returns logits")
    return rows


def weighted_mean(values, weights) -> jax.Array:
    """The recording's mean of ``(B,)`` per-sequence values (``weights``-weighted when given),
    as ``specjax.estimate`` takes it."""
    return weighted_mean_se(values, weights)[0]


def decoding_objective(decoder, apply: Callable, measure: str = "rejections", *,
                       cost: CostModel | None = None, logits: bool = False) -> Callable:
    """The expected rejections, calls or time of a lossless decoder with the draft
    ``apply(params, .)``, estimated on recorded target rollouts: a pure function of the
    parameters, for ``jax.grad`` and optax.

    For each recorded sequence ``x``: the rates ``r_t`` of the draft along ``x``
    (``rejection_rate(p_theta(x_t), q_t(x_t))`` for SD; a multi-draft root's from its laws on
    the full rows) and the exact ``E[. | x]`` of the phase filter
    (``specjax.pairs.call_structure``); the value is their (weighted) mean over the recording.

    Args:
      decoder: a token-wise lossless decoder with a draft, at the lookahead it will run at:
        ``specjax.Speculative(lookahead=K)`` (``K = None``: draft to the horizon), or a
        multi-draft root (``BatchSpeculative(M, lookahead=K)``, ``OptimalMultiDraft(M)``,
        ``KSequential``, a lossless ``RejectionRule``: these need the target's rows in the
        recording); static.
      apply: the draft, ``apply(params, tokens) -> (B, T, V)``: at index ``t - 1`` the draft's
        law of ``x_t`` given ``x_0..x_{t-1}``, along the ``(B, T + 1)`` recorded tokens (an
        equinox module's call, a flax ``model.apply``); probabilities, or logits with
        ``logits=True``. SD uses only each row's entry at the recorded token.
      measure: ``"rejections"``, ``"calls"`` or ``"time"`` (needs ``cost``): the ``value`` field.
      cost: a ``specjax.CostModel`` for ``expected_time`` (a call at ``n`` drafts
        ``min(K, T - n + 1)`` levels and scores the decoder's ``call_work``, as
        ``specjax.theory.decoding_time``).
      logits: whether ``apply`` returns logits: ``True`` or ``False`` (nothing else). With
        ``False`` the rows must be laws (finite, non-negative, summing to one within the dtype's
        tolerance, ``specjax._checks.row_sum_tolerance``): refused when their values are known
        (concrete, or under ``jax.grad`` alone); under ``jax.jit`` (their values unknown) a row
        that is not a law is made NaN, so the value and the gradients are NaN, never a number
        an optimiser could exploit (rows summing to 2 would score fewer rejections than any
        law). Likewise ``V`` must exceed every recorded token: refused when the tokens are
        concrete, NaN under a trace.

    Returns:
      ``loss(params, recording) -> DistillLoss`` for a ``specjax.Recording`` of target rollouts
      (``specjax.record``, ``Recording.from_arrays``, ``Recording.from_statistics``: only its
      tokens, ``target_prob``, ``weights`` and, for a multi-draft root, ``target_probs`` are
      read; its draft columns belong to the draft it was recorded with). With every sequence
      enumerated and weighted by its target probability, the value is exact. Values and
      gradients are finite at ``p = q`` and at ``p_theta(x_t) = 0``.

    Raises:
      ValueError: naming the argument: a decoder that cannot be estimated from target rollouts
        (lossy, call-level, bound to the whole models; see ``specjax.estimate``) or has no draft,
        ``apply`` not callable, an unknown ``measure``, ``"time"`` without a ``CostModel``,
        ``logits`` not a bool; at call time, not a ``Recording``, no target rows for a
        multi-draft root, draft rows of the wrong shape or too few tokens ``V`` for the
        recording, or (``logits=False``, rows whose values are known) rows that are not laws.

    Example:
      >>> import jax, jax.numpy as jnp, specjax
      >>> from specjax.pairs.distill import decoding_objective
      >>> rec = specjax.Recording.from_statistics(            # two rollouts, T = 2
      ...     jnp.array([[0, 1, 1], [0, 0, 1]]), jnp.full((2, 2), 0.5),
      ...     jnp.array([[0.5, 0.8], [0.5, 0.2]]))
      >>> apply = lambda params, tokens: jnp.broadcast_to(params, (2, 2, 2))  # context-free
      >>> loss = decoding_objective(specjax.Speculative(), apply, logits=True)  # K = T
      >>> round(float(loss(jnp.zeros(2), rec).value), 4)  # rates 0, 0.375 and 0, 0
      0.1875
      >>> grad = jax.grad(lambda params: loss(params, rec).value)(jnp.zeros(2))
    """
    check_estimable(decoder)
    if decoder.recording_reads == "nothing":
        raise ValueError("decoder: Autoregressive() has no draft to distil")
    _check_apply(apply)
    if measure not in MEASURES:
        raise ValueError(f"measure must be one of {MEASURES}, got {measure!r}")
    check_cost(cost)
    if measure == "time" and cost is None:
        raise ValueError("measure='time' needs cost=specjax.CostModel(...)")
    logits = _check_logits(logits)
    from_token = decoder.recording_reads == "emitted"  # SD: p_theta(x_t) alone

    def loss(params, recording) -> DistillLoss:
        _check_recording(recording, rows=not from_token,
                         why=f"the root law of {decoder!r}")
        rows = _draft_rows(apply, params, recording, logits)
        mine = recording._replace(  # this draft's columns; no rates of the recorded draft
            rates=(), draft_prob=token_probs(rows, recording.tokens, logits=logits),
            draft_probs=None if from_token else (
                jax.nn.softmax(rows, axis=-1) if logits else rows))
        rejections, weighted, _ = per_sequence(decoder, mine, cost)
        per = {"rejections": rejections, "calls": weighted[:, 0], "time": weighted[:, 2]}
        means = {name: weighted_mean(values, recording.weights) for name, values in per.items()}
        return DistillLoss(value=means[measure], expected_rejections=means["rejections"],
                           expected_calls=means["calls"],
                           expected_time=None if cost is None else means["time"],
                           per_sequence=per[measure])

    return loss


def divergence_objective(apply: Callable, divergence: str = "kl", *,
                         logits: bool = False) -> Callable:
    """The baselines: forward KL or total variation between the target's and the draft's rows,
    summed over positions and averaged over recorded rollouts (DistillSpec's divergences).

    ``"kl"``: ``sum_t KL(q_t || p_t)`` (maximum likelihood on the target's rows);
    ``"tv"``: ``sum_t TV(q_t, p_t)``, whose mean over rollouts is SD's expected rejections at
    ``K = T`` (Theorem 1): the quantity ``decoding_objective(Speculative(), apply)`` estimates
    from the recorded tokens alone, here averaged over each row (a smaller variance).

    Args:
      apply: the draft, as for ``decoding_objective``.
      divergence: ``"kl"`` or ``"tv"``.
      logits: whether ``apply`` returns logits (KL then uses ``log_softmax``: finite where the
        draft's probability underflows); with ``False`` the rows must be laws, checked as for
        ``decoding_objective``.

    Returns:
      ``loss(params, recording) -> ()`` for a ``specjax.Recording`` that holds the target's full
      rows (``keep_rows=True``).

    Raises:
      ValueError: naming the argument (as ``decoding_objective``; a recording without rows).

    Example:
      >>> import jax.numpy as jnp, specjax
      >>> from specjax.pairs.distill import divergence_objective
      >>> q = jnp.array([[[0.5, 0.5]]])
      >>> rec = specjax.Recording.from_arrays(jnp.array([[0, 1]]), q, q, keep_rows=True)
      >>> tv = divergence_objective(lambda params, tokens: params, "tv")
      >>> round(float(tv(jnp.array([[[0.8, 0.2]]]), rec)), 3)
      0.3
    """
    _check_apply(apply)
    if divergence not in DIVERGENCES:
        raise ValueError(f"divergence must be one of {DIVERGENCES}, got {divergence!r}")
    logits = _check_logits(logits)

    def loss(params, recording) -> jax.Array:
        _check_recording(recording, rows=True, why=f"the {divergence} divergence")
        q = recording.target_probs
        rows = _draft_rows(apply, params, recording, logits)
        if divergence == "tv":
            p = jax.nn.softmax(rows, axis=-1) if logits else rows
            per_position = 0.5 * jnp.sum(jnp.abs(q - p.astype(q.dtype)), axis=-1)
        else:
            log_p = jax.nn.log_softmax(rows, axis=-1) if logits else _log(rows)
            positive = q > 0
            log_q = _log(jnp.where(positive, q, 1))
            per_position = jnp.sum(jnp.where(positive, q * (log_q - log_p.astype(q.dtype)), 0),
                                   axis=-1)
        return weighted_mean(jnp.sum(per_position, axis=-1), recording.weights)

    return loss


def _log(x):
    """``log(x)`` with ``-inf`` at 0 and a finite reverse-mode gradient there (0)."""
    positive = x > 0
    return jnp.where(positive, jnp.log(jnp.where(positive, x, 1)), -math.inf)


__all__ = ["DistillLoss", "decoding_objective", "divergence_objective", "token_probs"]
