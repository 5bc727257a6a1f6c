"""Decoding a batch, not a request: a serving cost model, exact goodput, draft-length allocation.

A serving engine decodes ``B`` requests at once. Here ``B`` *slots* step in lockstep: every step,
each slot makes one call of the decoder on its own request (its drafts batched with the other
slots' pass by pass, then one target forward over the tokens of every slot), and a request that
has emitted its ``T`` tokens is replaced by a fresh one at the next step (continuous batching).
Every request is decoded on its own chain, independently of the others.

Step time (``ServingCost``, ``roofline``): see ``specjax.theory.serving_cost``.

Exact goodput (``serving_rate``): a renewal-reward argument. Slot ``b`` alone is a renewal
process whose cycles are its requests: a request takes ``C`` steps (its calls) and emits ``T``
tokens; by the renewal-reward theorem the fraction of the slot's steps that are calls starting at
position ``n`` (or, for a decoder with a random draft length, drafting ``d`` levels) is
``E[calls at n] / E[C]``, the decoder's exact ``new_call`` (or drafted-call law) divided by the
expected number of calls. So a slot's step draws its work ``(draft passes, tokens scored)`` from
this stationary law ``pi``, and the ``B`` slots, being independent, draw theirs independently:
the expected step time needs only ``pi``, through the ``B``-fold convolution of its law of tokens
scored (for ``E[target_time[S]]``) and the binomial law of ``N_j`` (``B`` trials of success
``P(passes >= j)``). Every slot emits ``T`` tokens per ``E[C]`` steps, so the long-run rate is the
ratio of two expectations::

    tokens_per_step = B T / E[C],   tokens_per_time = tokens_per_step / E[step time].

With ``B = 1`` this is ``T / E[time]``, ``decoding_time``'s ``tokens_per_time``. The product law of
the slots is the long-run law of the joint process when that process is ergodic, e.g. when the
number of calls a request takes is not a.s. constant; when it is (``p = q``, or ``Autoregressive``
on a fixed ``T``), slots started together stay in phase, and a step-time table that is not linear
in ``S`` sees that phase; a linear one does not.

Allocation (``allocate_drafts``, ``step_time``, the threshold rule of ``threshold_decoder``): see
``specjax.theory.serving_allocation``; ``request_policy`` and ``batch_lookahead`` are here.
"""

from __future__ import annotations

import functools
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax.decoders.autoregressive import Autoregressive
from specjax.decoders.base import CallDecoder
from specjax.decoders.base import check_decoder
from specjax.decoders.planning import plan_run
from specjax.decoders.speculative import Speculative
from specjax.numerics import HIGHEST
from specjax.numerics import safe_ratio
from specjax.theory.cost import call_works
from specjax.theory.cost import depth_works
from specjax.theory.cost import drafted_law
from specjax.theory.serving_allocation import DraftAllocation
from specjax.theory.serving_allocation import allocate_drafts
from specjax.theory.serving_allocation import step_time
from specjax.theory.serving_allocation import threshold_decoder
from specjax.theory.serving_cost import H100_KNEE
from specjax.theory.serving_cost import ServingCost
from specjax.theory.serving_cost import _check_serving_cost
from specjax.theory.serving_cost import roofline
from specjax.theory.values import exact_planned

__all__ = ["H100_KNEE", "ServingCost", "roofline", "ServingRate", "SlotWork", "slot_work",
           "slot_work_planned", "stationary_slot_work", "serving_rate", "MAX_STEP_WORK",
           "convolution_work", "check_tables", "batch_sizes", "goodput", "DraftAllocation",
           "step_time", "allocate_drafts", "BatchPolicy", "batch_lookahead", "threshold_decoder",
           "request_policy"]


class ServingRate(NamedTuple):
    """The long-run goodput of ``B`` slots decoding in lockstep (``serving_rate``).

    Attributes:
      tokens_per_time: ``tokens_per_step / time_per_step``, the goodput.
      tokens_per_step: ``B T / E[calls per request]``.
      time_per_step: ``E[step time]`` under the slots' stationary law.
      draft_time_per_step: its draft part, ``sum_j E[draft_time[N_j]]``.
      target_time_per_step: its target part, ``E[target_time[S]]``.
      autoregressive_tokens_per_time: ``B / (target_time[B] + overhead)``, the same slots
        decoding autoregressively.
      speedup: ``tokens_per_time / autoregressive_tokens_per_time``.
      scored_law: ``(B s_max + 1,)``, the law of ``S``, the tokens the target scores in a step.
    """

    tokens_per_time: jax.Array
    tokens_per_step: jax.Array
    time_per_step: jax.Array
    draft_time_per_step: jax.Array
    target_time_per_step: jax.Array
    autoregressive_tokens_per_time: jax.Array
    speedup: jax.Array
    scored_law: jax.Array


def _convolution_power(law: jax.Array, power: int) -> jax.Array:
    """The law of the sum of ``power`` independent draws of ``law`` (a pmf over 0, 1, ...), by
    repeated squaring (``2 log2 power`` convolutions)."""
    result = jnp.ones((1,), law.dtype)
    base = law
    while power:
        if power & 1:
            result = jnp.convolve(result, base, precision=HIGHEST)
        power >>= 1
        if power:
            base = jnp.convolve(base, base, precision=HIGHEST)
    return result


@functools.partial(jax.jit, static_argnames=("batch_size", "passes", "scored"))
def _expected_step(law, draft_table, target_table, *, batch_size: int, passes: tuple,
                   scored: tuple):
    """``(E[draft time], E[target time], law of S)`` of a step of ``batch_size`` independent
    slots, each doing ``(passes[i], scored[i])`` with probability ``law[i]``."""
    scored_law = jnp.zeros((max(scored) + 1,), law.dtype).at[jnp.asarray(scored)].add(law)
    total_law = _convolution_power(scored_law, batch_size)
    target_part = jnp.dot(total_law, target_table[:total_law.shape[0]], precision=HIGHEST)
    draft_part = jnp.zeros((), law.dtype)
    if max(passes) > 0:
        tails = jnp.clip(jnp.stack([jnp.sum(jnp.where(jnp.asarray(passes) >= j, law, 0))
                                    for j in range(1, max(passes) + 1)]), 0, 1)
        bernoulli = jnp.stack([1 - tails, tails], axis=-1)
        counts = jax.vmap(lambda b: _convolution_power(b, batch_size))(bernoulli)  # (J, B + 1)
        draft_part = jnp.sum(counts @ draft_table[:batch_size + 1])
    return draft_part, target_part, total_law


class SlotWork(NamedTuple):
    """One slot's stationary law of work per step (``slot_work``).

    Attributes:
      tokens: the expected tokens of a cycle: ``T`` for a request (``1 / calls`` of them per
        step); on a stationary chain without a horizon, the mean tokens of a call, with
        ``calls = 1``.
      calls: ``E[C]``, the expected calls (steps) per cycle.
      mass: the expected number of calls per request doing ``passes[i]`` draft passes and
        scoring ``scored[i]`` tokens (``new_call`` by position, or the drafted-call law by
        depth); ``mass / calls`` is the stationary law ``pi`` of a slot's step.
      passes, scored: NumPy int arrays, the work of each entry (static).
    """

    tokens: Any
    calls: jax.Array
    mass: jax.Array
    passes: np.ndarray
    scored: np.ndarray


def slot_work(decoder, draft, target, *, horizon: int | None = None) -> SlotWork:
    """One slot's stationary law of work per step: what ``serving_rate`` needs of the decoder
    and the models, whatever the batch size (compute it once, then ``goodput`` for every
    ``B``). Arguments as ``serving_rate``'s."""
    check_decoder(decoder)
    return slot_work_planned(plan_run(decoder, draft, target, engine="exact", horizon=horizon))


def slot_work_planned(run) -> SlotWork:
    """``slot_work`` of a run already planned (``plan_run(..., engine="exact")``)."""
    decoder, draft, target, _, num_positions, lookahead = run
    if isinstance(decoder, CallDecoder) and decoder.has_drafted_call_law:  # a random length
        weights, new_call = drafted_law(decoder, draft, target, lookahead)
        passes, scored = depth_works(decoder, lookahead)
        mass = jnp.sum(weights, axis=0)
    else:  # a call at n does call_work(min(K, T - n + 1))
        passes, scored = call_works(decoder, num_positions, lookahead)
        new_call = exact_planned(run).new_call
        mass = new_call
    return SlotWork(tokens=num_positions, calls=jnp.sum(new_call, axis=-1), mass=mass,
                    passes=passes, scored=scored)


def stationary_slot_work(decoder, draft, target) -> SlotWork:
    """A slot's law of work per step in the long run on a *stationary* chain, without a horizon
    (requests that never end): the calls start after a token drawn from ``stationary_rate``'s
    law ``mu``; a call drafts ``d`` levels with probability ``sum_a mu(a) P(d | a)`` (the
    drafted-call law on the stationary rows, or ``K`` for a fixed length) and emits
    ``stationary_rate``'s ``tokens_per_call`` in expectation. Call-level decoders of one call
    state, as ``stationary_rate`` takes them (SD with lookahead ``K``:
    ``AdaptiveSpeculative(FixedLength(K), max_lookahead=K)``)."""
    from specjax.theory.calls import law_from_rows  # noqa: PLC0415
    from specjax.theory.cost import CostModel  # noqa: PLC0415
    from specjax.theory.stationary import stationary_rate  # noqa: PLC0415

    rate = stationary_rate(decoder, draft, target, CostModel(0.0, 1.0))  # checks everything
    decoder, draft, target, *_ = plan_run(decoder, draft, target, engine="exact")
    if decoder.num_call_states != 1:
        raise ValueError(f"decoder: the stationary serving rate takes decoders of one call "
                         f"state, got {type(decoder).__name__} with {decoder.num_call_states}")
    depth = decoder.lookahead
    passes, scored = depth_works(decoder, depth)
    p, q = draft.trans[0], target.trans[0]
    if decoder.has_drafted_call_law:
        p_rows = jnp.broadcast_to(p, (depth,) + p.shape)
        q_rows = jnp.broadcast_to(q, (depth,) + q.shape)

        def drafted(a):
            start = jax.nn.one_hot(a, q.shape[-1], dtype=q.dtype)
            return law_from_rows(decoder, start, p_rows, q_rows, q, position=1,
                                 with_drafted=True)[1]

        mass = jnp.dot(rate.start_law, jax.lax.map(drafted, jnp.arange(q.shape[-1])),
                       precision=HIGHEST)
    else:
        mass = jax.nn.one_hot(depth, depth + 1, dtype=q.dtype)
    return SlotWork(tokens=rate.tokens_per_call, calls=jnp.ones((), q.dtype), mass=mass,
                    passes=passes, scored=scored)


def serving_rate(decoder, draft, target, cost: ServingCost, *, batch_size: int,
                 horizon: int | None = None, stationary: bool = False) -> ServingRate:
    """Exact long-run goodput of ``batch_size`` slots decoding in lockstep with ``decoder``.

    Every step each slot makes one call of ``decoder`` on its own request; a request that has
    emitted its ``T`` tokens is replaced by a fresh one (continuous batching). The rate is the
    renewal-reward ratio of the module docstring: ``B T / E[calls]`` tokens per step over the
    expected step time under the slots' independent stationary laws of work. ``Autoregressive()``
    (``K = 0``) is the baseline. ``slot_work`` then ``goodput``.

    Args:
      decoder: any decoder value (call-level or token-wise).
      draft: the draft model ``p`` (``None`` for ``Autoregressive()``).
      target: the target model ``q`` (requests are ``T`` tokens long, from its initial law).
      cost: a ``ServingCost``.
      batch_size: ``B``, the slots, a positive int (static).
      horizon: ``T`` for ``FiniteStateModel``s (as ``exact``).
      stationary: ``True``: requests without end on stationary chains (``stationary_rate``'s
        long run; ``stationary_slot_work``), for call-level decoders of one call state.

    Returns:
      ``ServingRate``.

    Raises:
      ValueError: what ``exact`` (or with ``stationary``, ``stationary_rate``) raises; ``cost``
        not a ``ServingCost``; ``batch_size`` not a
        positive int; a table shorter than a step needs (``draft_time`` up to ``B``,
        ``target_time`` up to ``B`` times the most tokens a call scores).

    Example:
      >>> import specjax
      >>> draft, target = specjax.paper_instance()
      >>> cost = specjax.ServingCost(0.05, specjax.theory.roofline(1.0, knee=16, size=512))
      >>> sd = specjax.serving_rate(specjax.Speculative(lookahead=3), draft, target, cost,
      ...                           batch_size=32)
      >>> round(float(sd.speedup), 3)
      0.491
    """
    check_decoder(decoder)
    _check_serving_cost(cost)
    _checks.check_static_int("batch_size", batch_size)
    run = plan_run(decoder, draft, target, engine="exact", horizon=horizon)  # planned once
    check_tables(cost, batch_size, *depth_works(run.decoder, run.lookahead))  # before any work
    work = (stationary_slot_work(decoder, draft, target) if stationary else
            slot_work_planned(run))
    return goodput(work, cost, batch_size=batch_size)


#: The most multiply-adds the law of a step's work may take (``convolution_work``): about 20-60 s
#: on a 2-core CPU (``batch_size = 32,000`` with calls scoring up to 3 tokens took 23 s). It grows
#: as ``(batch_size * max scored) ** 2``.
MAX_STEP_WORK = 3 * 10**9


def convolution_work(length: int, power: int) -> int:
    """Multiply-adds of ``_convolution_power`` of a law over ``0..length - 1`` to ``power``."""
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


def goodput(work: SlotWork, cost: ServingCost, *, batch_size: int) -> ServingRate:
    """``serving_rate`` from a slot's law of work (``slot_work``): the renewal-reward ratio for
    ``batch_size`` slots.

    Example:
      >>> import specjax
      >>> from specjax.theory import serving
      >>> draft, target = specjax.paper_instance()
      >>> work = serving.slot_work(specjax.Speculative(lookahead=3), draft, target)
      >>> cost = specjax.ServingCost(0.05, serving.roofline(1.0, knee=16, size=512))
      >>> tuple(round(float(serving.goodput(work, cost, batch_size=b).speedup), 3)
      ...       for b in (1, 32))
      (1.72, 0.491)
    """
    _check_serving_cost(cost)
    _checks.check_static_int("batch_size", batch_size)
    if not isinstance(work, SlotWork):
        raise ValueError(f"work must be a SlotWork (specjax.theory.serving.slot_work), got "
                         f"{type(work).__name__} {work!r}"[:300])
    draft_table, target_table = check_tables(cost, batch_size, work.passes, work.scored)
    dtype = work.mass.dtype
    works, which = np.unique(np.stack([work.passes, work.scored], axis=1), axis=0,
                             return_inverse=True)  # the distinct (passes, scored): static
    law = jnp.zeros((works.shape[0],), dtype).at[jnp.asarray(which.reshape(-1))].add(
        safe_ratio(work.mass, work.calls, 0))
    draft_part, target_part, total_law = _expected_step(
        law, jnp.asarray(draft_table, dtype), jnp.asarray(target_table, dtype),
        batch_size=batch_size, passes=tuple(int(x) for x in works[:, 0]),
        scored=tuple(int(x) for x in works[:, 1]))
    time_per_step = draft_part + target_part + cost.overhead
    tokens_per_step = batch_size * work.tokens / work.calls
    ar_rate = batch_size / (target_table[batch_size] + cost.overhead)
    rate = tokens_per_step / time_per_step
    return ServingRate(tokens_per_time=rate, tokens_per_step=tokens_per_step,
                       time_per_step=time_per_step, draft_time_per_step=draft_part,
                       target_time_per_step=target_part,
                       autoregressive_tokens_per_time=jnp.asarray(ar_rate, dtype),
                       speedup=rate / ar_rate, scored_law=total_law)


class BatchPolicy(NamedTuple):
    """A draft-length policy for a batch and its exact goodput (``batch_lookahead``,
    ``request_policy``).

    Attributes:
      decoder: the decoder every slot runs (``Autoregressive()`` when SD off is best).
      lookahead: its most drafts per call (0: SD off).
      price: ``tau`` of the per-request threshold (``None`` for a fixed ``K``).
      tokens_per_time: its exact goodput (``serving_rate``).
      fixed_rates: ``(K + 1,)``, the goodput of every fixed ``K = 0..max_lookahead``.
    """

    decoder: Any
    lookahead: int
    price: float | None
    tokens_per_time: float
    fixed_rates: np.ndarray


def _fixed(k: int):
    return Autoregressive() if k == 0 else Speculative(lookahead=k)


def batch_sizes(batch_size) -> tuple[tuple[int, ...], bool]:
    """``(sizes, many)``: ``batch_size`` (a positive int or a non-empty sequence of them) as a
    tuple of ints, and whether a sequence was given."""
    many = not isinstance(batch_size, (int, np.integer)) or isinstance(batch_size, bool)
    sizes = tuple(batch_size) if many else (batch_size,)
    if not sizes:
        raise ValueError("batch_size must be a positive int or a non-empty sequence of them")
    for size in sizes:
        _checks.check_static_int("batch_size", size)
    return tuple(int(b) for b in sizes), many


def _rates(work: SlotWork, cost: ServingCost, sizes) -> np.ndarray:
    return np.asarray([float(goodput(work, cost, batch_size=b).tokens_per_time) for b in sizes])


def batch_lookahead(draft, target, cost: ServingCost, *, batch_size, max_lookahead: int):
    """One ``K`` for the whole batch: the SD lookahead ``K = 0..max_lookahead`` of most exact
    goodput (``K = 0``: SD off; ties to the smaller ``K``), vLLM's dynamic SD with exact rates.

    Args:
      draft, target: the models.
      cost: a ``ServingCost``.
      batch_size: ``B``, a positive int, or a sequence of them (each decoder's law of work is
        computed once for all).
      max_lookahead: the largest ``K`` tried, a non-negative int (``0``: SD off, the baseline
        alone).

    Returns:
      ``BatchPolicy`` (a tuple of them, one per batch size, for a sequence).

    Example:
      >>> import specjax
      >>> draft, target = specjax.paper_instance()
      >>> cost = specjax.ServingCost(0.05, specjax.theory.roofline(1.0, knee=16, size=256))
      >>> tuple(choice.lookahead for choice in specjax.theory.batch_lookahead(
      ...     draft, target, cost, batch_size=(1, 8, 32), max_lookahead=4))
      (3, 1, 0)
    """
    _check_serving_cost(cost)
    sizes, many = batch_sizes(batch_size)
    _checks.check_static_non_negative_int("max_lookahead", max_lookahead)  # 0: SD off only
    for k in range(max_lookahead + 1):  # tables too short raise before any work
        check_tables(cost, max(sizes), *depth_works(_fixed(k), k))
    rates = np.stack([_rates(slot_work(_fixed(k), None if k == 0 else draft, target), cost, sizes)
                      for k in range(max_lookahead + 1)], axis=1)  # (sizes, K + 1)
    choices = tuple(BatchPolicy(decoder=_fixed(int(np.argmax(r))), lookahead=int(np.argmax(r)),
                                price=None, tokens_per_time=float(r.max()), fixed_rates=r)
                    for r in rates)
    return choices if many else choices[0]


def request_policy(draft, target, cost: ServingCost, *, batch_size, max_lookahead: int,
                   prices=None):
    """One draft length per request, from its own drafts: the threshold rule of the module
    docstring (``threshold_decoder``) with the cap ``k <= max_lookahead`` and price ``tau`` of
    most exact goodput, or a fixed ``K`` (SD off included) when none beats it; so never below
    ``batch_lookahead``.

    Args:
      draft, target: ``MarkovChain``s.
      cost: a ``ServingCost``.
      batch_size: ``B``, a positive int, or a sequence of them.
      max_lookahead: the largest cap tried.
      prices: the prices tried (default 24 values in ``(0, 1)``).

    Returns:
      ``BatchPolicy`` (a tuple of them for a sequence of batch sizes).

    Example:
      >>> import specjax
      >>> draft, target = specjax.paper_instance()
      >>> cost = specjax.ServingCost(0.05, specjax.theory.roofline(1.0, knee=16, size=256))
      >>> best = specjax.theory.request_policy(draft, target, cost, batch_size=8,
      ...                                      max_lookahead=2, prices=[0.3, 0.6])
      >>> bool(best.tokens_per_time >= best.fixed_rates.max())
      True
    """
    sizes, many = batch_sizes(batch_size)
    prices = np.linspace(0.04, 0.96, 24) if prices is None else np.asarray(prices, np.float64)
    if prices.ndim != 1 or not ((prices >= 0) & (prices <= 1)).all():
        raise ValueError(f"prices must be a 1-D array of numbers in [0, 1], got {prices!r}")
    best = list(batch_lookahead(draft, target, cost, batch_size=sizes,
                                max_lookahead=max_lookahead))
    for cap in range(1, max_lookahead + 1):
        for price in prices:
            decoder = threshold_decoder(draft, target, float(price), max_lookahead=cap)
            rates = _rates(slot_work(decoder, draft, target), cost, sizes)
            for i, rate in enumerate(rates):
                if rate > best[i].tokens_per_time * (1 + 1e-12):
                    best[i] = best[i]._replace(decoder=decoder, lookahead=decoder.max_lookahead,
                                               price=float(price), tokens_per_time=float(rate))
    return tuple(best) if many else best[0]
