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

The value and the gradient are one compiled program per static shape (``goodput_influences``:
the works' supports, the cost, the batch sizes), reused by every call with new means; every
lookahead of ``specjax.pairs.batch_lookahead`` at every batch size is one such program
(``theory.goodput_grid`` under ``jax.grad``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax.numerics import HIGHEST
from specjax.theory.cost import call_works
from specjax.theory.serving import ServingCost
from specjax.theory.serving import SlotWork
from specjax.theory.serving import check_tables
from specjax.theory.serving import goodput_grid

__all__ = ["goodput_influence", "goodput_influences", "serving_estimate", "slot_means"]


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


@functools.partial(jax.jit, static_argnames=("works", "cost", "batch_sizes", "single"))
def _influences(per_sequences, weights, *, works: tuple, cost: ServingCost,
                batch_sizes: tuple, single: bool):
    per_sequences = jnp.stack(per_sequences)  # (W, B, T + 1)
    means = jnp.sum(weights[None, :, None] * per_sequences, axis=1) / jnp.sum(weights)

    def rates(means, size):  # (W,): every work's goodput; rates[w] reads means[w] alone
        slots = [SlotWork(tokens=m[-1], calls=jnp.sum(m[:-1]), mass=m[:-1],
                          passes=np.asarray(passes), scored=np.asarray(scored))
                 for m, (passes, scored) in zip(means, works)]
        result = goodput_grid(slots, cost, batch_size=size)
        return jnp.sum(result.tokens_per_time), (result.tokens_per_time,
                                                 result.autoregressive_tokens_per_time[0])

    values, baselines, influences = [], [], []
    for size in batch_sizes:  # one gradient per size: the sum over works, row w its own
        (_, (value, baseline)), grad = jax.value_and_grad(rates, has_aux=True)(means, size)
        values.append(value)
        baselines.append(baseline)
        influences.append(jnp.einsum("wbt,wt->wb", per_sequences - means[:, None], grad,
                                     precision=HIGHEST))
    if single:  # one work at one size: scalars and (B,)
        return values[0][0], baselines[0], influences[0][0]
    return jnp.stack(values), jnp.stack(baselines), jnp.stack(influences)


def goodput_influences(per_sequences, weights, works, cost: ServingCost, batch_sizes, *,
                       single: bool = False):
    """``(tokens_per_time (S, W), autoregressive tokens_per_time (S,), influence (S, W, B))`` of
    ``W`` decoders' means at each of ``S`` batch sizes, in one compiled program (reused for new
    means of the same shapes).

    Args:
      per_sequences: ``W`` arrays ``(B, T + 1)`` (``slot_means``'s first output per decoder).
      weights: ``(B,)``, the sequences' weights.
      works: ``W`` pairs ``(passes, scored)`` (``slot_means``'s last two outputs).
      cost: a ``ServingCost``.
      batch_sizes: the sizes, positive ints.
      single: one work at one size: ``(tokens_per_time, autoregressive, influence (B,))``.
    """
    works = tuple((tuple(int(x) for x in np.asarray(passes).reshape(-1)),
                   tuple(int(x) for x in np.asarray(scored).reshape(-1)))
                  for passes, scored in works)
    return _influences(tuple(per_sequences), weights, works=works, cost=cost,
                       batch_sizes=tuple(int(b) for b in batch_sizes), single=single)


def goodput_influence(per_sequence, weights, passes, scored, cost, batch_size: int):
    """``(tokens_per_time, autoregressive tokens_per_time, influence (B,))``: the goodput of the
    means and each sequence's linearised contribution (its standard error's terms);
    ``goodput_influences`` of one decoder at one size."""
    return goodput_influences([per_sequence], weights, [(passes, scored)], cost, [batch_size],
                              single=True)


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
