"""Serving from a recording: ``serving_rate``'s exact goodput of ``B`` slots in lockstep, with each
slot's law of work estimated from target rollouts (``estimate(..., cost=ServingCost, batch_size=B)``).

``specjax.serving_rate`` needs one slot's law of work per step: the expected number of calls per
request starting at each position ``n`` (each doing the decoder's ``call_work(min(K, T - n +
1))``), the expected calls ``E[C]`` and the tokens ``T`` of a request. The phase filter gives,
for each recorded sequence, the exact conditional probability that a call starts at ``n``; their
(weighted) mean is unbiased for the first, and its sum for ``E[C]``; the mean length for the
tokens (ragged requests: each sequence's own ``lengths[b]``; a call drafts what an engine drafts
there, ``min(K, T - n + 1)``). The goodput is then ``goodput``'s smooth function of these means,
so its standard error is the delta method's: the gradient of the goodput with respect to the
means (``jax.grad`` through the convolutions) dotted with each sequence's deviation. With every
sequence enumerated and weighted by its target probability the estimate equals ``serving_rate``
on the models.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax.theory.cost import call_works
from specjax.theory.serving import ServingCost
from specjax.theory.serving import SlotWork
from specjax.theory.serving import check_tables
from specjax.theory.serving import goodput

__all__ = ["goodput_influence", "serving_estimate", "slot_means"]


def slot_means(decoder, recording, filtered):
    """``(per_sequence (B, T + 1), weights (B,), passes, scored)``: each sequence's
    ``P(a call starts at n | x)``, ``n = 1..T``, and its tokens; the calls' work by position."""
    horizon = recording.horizon
    lookahead = decoder.resolve_lookahead(horizon)
    passes, scored = call_works(decoder, horizon, lookahead)
    dtype = recording.target_prob.dtype
    # One column per position: P(a call starts at n | x), n = 1..T.
    _, starts, _ = filtered(decoder, recording, np.eye(horizon))
    tokens = (jnp.full(starts.shape[:1], horizon, dtype) if recording.lengths is None else
              recording.lengths.astype(dtype))
    per_sequence = jnp.concatenate([starts, tokens[:, None]], axis=1)  # (B, T + 1)
    weights = (jnp.ones(starts.shape[:1], dtype) if recording.weights is None else
               recording.weights.astype(dtype))
    return per_sequence, weights, passes, scored


def goodput_influence(per_sequence, weights, passes, scored, cost, batch_size: int):
    """``(tokens_per_time, autoregressive tokens_per_time, influence (B,))``: the goodput of the
    means and each sequence's linearised contribution (its standard error's terms)."""

    def rate(means):
        work = SlotWork(tokens=means[-1], calls=jnp.sum(means[:-1]), mass=means[:-1],
                        passes=passes, scored=scored)
        result = goodput(work, cost, batch_size=batch_size)
        return result.tokens_per_time, result.autoregressive_tokens_per_time

    means = jnp.sum(weights[:, None] * per_sequence, axis=0) / jnp.sum(weights)
    (value, baseline), grad = jax.value_and_grad(rate, has_aux=True)(means)
    return value, baseline, (per_sequence - means[None]) @ grad


def serving_estimate(decoder, recording, cost: ServingCost, batch_size: int, filtered):
    """``(tokens_per_time, se, speedup, speedup_se)`` of ``batch_size`` slots running
    ``decoder`` under ``cost``, from a recording; ``filtered(decoder, recording, columns)`` is
    ``specjax.pairs.estimate.filtered`` (module docstring)."""
    _checks.check_static_int("batch_size", batch_size)
    horizon = recording.horizon
    check_tables(cost, batch_size, *call_works(decoder, horizon,
                                               decoder.resolve_lookahead(horizon)))  # first
    per_sequence, weights, passes, scored = slot_means(decoder, recording, filtered)
    value, baseline, influence = goodput_influence(per_sequence, weights, passes, scored, cost,
                                                   batch_size)
    from specjax.pairs.estimate import weighted_mean_se  # noqa: PLC0415 (estimate imports this)

    se = weighted_mean_se(influence[:, None], weights)[1][0]  # of the linearised goodput
    return value, se, value / baseline, se / baseline
