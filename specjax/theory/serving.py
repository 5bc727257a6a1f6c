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
from specjax.theory.serving_cost import MAX_STEP_WORK
from specjax.theory.serving_cost import ServingCost
from specjax.theory.serving_cost import _check_serving_cost
from specjax.theory.serving_cost import _step_parts
from specjax.theory.serving_cost import check_tables
from specjax.theory.serving_cost import convolution_work
from specjax.theory.serving_cost import roofline
from specjax.theory.values import exact_planned

__all__ = ["H100_KNEE", "ServingCost", "roofline", "ServingRate", "SlotWork", "slot_work",
           "slot_work_planned", "stationary_slot_work", "serving_rate", "MAX_STEP_WORK",
           "convolution_work", "check_tables", "batch_sizes", "goodput", "goodput_grid",
           "DraftAllocation", "step_time", "allocate_drafts", "BatchPolicy", "batch_lookahead",
           "threshold_decoder", "request_policy"]


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


def _goodput_arrays(masses, calls, tokens, which, draft_table, target_table, overhead,
                    baselines, *, batch_sizes: tuple, passes: tuple, scored: tuple) -> ServingRate:
    """The goodput of ``W`` slot works on one support ``(passes[i], scored[i])`` at each of
    ``batch_sizes``: fields ``(S, W)``, ``scored_law`` ``(S, W, max B * max scored + 1)`` (zeros
    past a batch size's own law). ``masses``, ``calls``, ``tokens``: ``W`` each (the masses of
    any lengths, padded here with zeros); ``which`` ``(W, N)``: each mass entry's support index;
    ``baselines`` ``(S,)``: the autoregressive rates (float64 on the host)."""
    dtype = jnp.result_type(*masses)
    width = which.shape[1]
    mass = jnp.stack([jnp.pad(jnp.asarray(m, dtype), (0, width - m.shape[0])) for m in masses])
    calls = jnp.stack([jnp.asarray(c, dtype) for c in calls])
    tokens = jnp.stack([jnp.asarray(t, dtype) for t in tokens])
    law = jax.vmap(lambda m, w, c: jnp.zeros((len(passes),), dtype).at[w].add(
        safe_ratio(m, c, 0)))(mass, which, calls)  # (W, support)
    parts = jax.vmap(lambda x: _step_parts(x, draft_table, target_table, batch_sizes=batch_sizes,
                                           passes=passes, scored=scored))(law)
    length = max(batch_sizes) * max(scored) + 1
    rows = []
    for (draft_part, target_part, total), size, baseline in zip(parts, batch_sizes, baselines):
        time_per_step = draft_part + target_part + overhead
        tokens_per_step = size * tokens / calls
        rate = tokens_per_step / time_per_step
        rows.append(ServingRate(
            tokens_per_time=rate, tokens_per_step=tokens_per_step, time_per_step=time_per_step,
            draft_time_per_step=draft_part, target_time_per_step=target_part,
            autoregressive_tokens_per_time=jnp.broadcast_to(baseline.astype(dtype), rate.shape),
            speedup=rate / baseline, scored_law=jnp.pad(total, ((0, 0),
                                                                (0, length - total.shape[1])))))
    return jax.tree.map(lambda *x: jnp.stack(x), *rows)


@functools.partial(jax.jit, static_argnames=("batch_sizes", "passes", "scored", "keep"))
def _goodput_program(*args, keep: int, **static) -> ServingRate:
    """``_goodput_arrays`` compiled, one program per support, sizes and ``keep``: the axes kept
    (2: ``(S, W)``; 1: ``(W,)``, one size; 0: one size and one work)."""
    return jax.tree.map(lambda x: x[(0,) * (2 - keep)], _goodput_arrays(*args, **static))


def _arguments(works, cost: ServingCost, sizes: tuple) -> tuple:
    """``(arguments, static)`` of ``_goodput_arrays`` for ``works`` at ``sizes``: the host-side
    facts (the distinct ``(passes, scored)`` of every work, static; the tables, checked)."""
    passes = [np.asarray(w.passes, np.int64).reshape(-1) for w in works]
    scored = [np.asarray(w.scored, np.int64).reshape(-1) for w in works]
    base = max(int(x.max()) for x in scored) + 1  # (passes, scored) as one int, in their order
    codes, inverse = np.unique(np.concatenate(passes) * base + np.concatenate(scored),
                               return_inverse=True)
    bounds = np.cumsum([0] + [len(x) for x in passes])
    which = np.zeros((len(works), max(len(x) for x in passes)), np.int32)
    for i, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:])):
        which[i, :stop - start] = inverse[start:stop]
    support = np.stack([codes // base, codes % base], axis=1)  # the distinct (passes, scored)
    draft_table, target_table = check_tables(cost, max(sizes), support[:, 0], support[:, 1])
    dtype = jnp.result_type(*(w.mass for w in works))
    tokens = tuple(t if isinstance(t, jax.Array) else np.asarray(t, dtype)
                   for t in (w.tokens for w in works))
    baselines = np.asarray([b / (target_table[b] + cost.overhead) for b in sizes], np.float64)
    return ((tuple(w.mass for w in works), tuple(w.calls for w in works), tokens, which,
             draft_table.astype(dtype), target_table.astype(dtype), cost.overhead, baselines),
            dict(batch_sizes=sizes, passes=tuple(int(x) for x in support[:, 0]),
                 scored=tuple(int(x) for x in support[:, 1])))


def goodput(work: SlotWork, cost: ServingCost, *, batch_size: int) -> ServingRate:
    """``serving_rate`` from a slot's law of work (``slot_work``): the renewal-reward ratio for
    ``batch_size`` slots. The checks and the tables on the host, then one compiled program per
    support of ``work`` and ``batch_size`` (``goodput_grid``: many works and sizes at once).

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
    arguments, static = _arguments([work], cost, (int(batch_size),))
    return _goodput_program(*arguments, keep=0, **static)


def goodput_grid(works, cost: ServingCost, *, batch_size) -> ServingRate:
    """``goodput`` of every slot work at every batch size in one compiled program: the works'
    supports ``(passes, scored)`` joined (each work's law zero elsewhere) and ``jax.vmap`` over
    the works; the squarings of the convolution powers shared by the batch sizes. A new number
    of works, support or tuple of sizes compiles a new program; new values do not. Traceable
    (``jax.grad`` through the works' arrays).

    Args:
      works: a non-empty sequence of ``SlotWork`` (``slot_work``), e.g. ``K = 0..8``.
      cost: a ``ServingCost``.
      batch_size: ``B``, a positive int, or a non-empty sequence of them (static).

    Returns:
      ``ServingRate`` whose fields have shape ``(len(works),)`` for an int ``batch_size`` and
      ``(len(batch_size), len(works))`` for a sequence; ``scored_law`` adds an axis of
      ``max B * max scored + 1`` (zeros past a work's own law). Entry ``[i, j]`` equals
      ``goodput(works[j], cost, batch_size=batch_size[i])`` to float rounding.

    Raises:
      ValueError: ``works`` empty, not a sequence or holding a non-``SlotWork``; what
        ``goodput`` raises (``cost``, ``batch_size``, a table too short for the largest size).

    Example:
      >>> import specjax
      >>> from specjax.theory import serving
      >>> draft, target = specjax.paper_instance()
      >>> works = [serving.slot_work(specjax.Autoregressive(), None, target)] + [
      ...     serving.slot_work(specjax.Speculative(lookahead=k), draft, target)
      ...     for k in (1, 2, 3)]
      >>> cost = specjax.ServingCost(0.05, serving.roofline(1.0, knee=16, size=512))
      >>> grid = serving.goodput_grid(works, cost, batch_size=(1, 32))
      >>> grid.speedup.shape
      (2, 4)
      >>> [round(float(x), 3) for x in grid.speedup[:, 3]]  # K = 3, as goodput's example
      [1.72, 0.491]
    """
    _check_serving_cost(cost)
    sizes, many = batch_sizes(batch_size)
    if isinstance(works, SlotWork):
        raise ValueError("works must be a non-empty sequence of SlotWork, got one SlotWork: "
                         "pass [work]")
    if not isinstance(works, (list, tuple)):
        raise ValueError(f"works must be a non-empty sequence of SlotWork "
                         f"(specjax.theory.serving.slot_work), got {type(works).__name__}")
    if not works:
        raise ValueError("works must be a non-empty sequence of SlotWork, got an empty one")
    for i, work in enumerate(works):
        if not isinstance(work, SlotWork):
            raise ValueError(f"works[{i}] must be a SlotWork (specjax.theory.serving.slot_work), "
                             f"got {type(work).__name__} {work!r}"[:300])
    arguments, static = _arguments(works, cost, sizes)
    return _goodput_program(*arguments, keep=2 if many else 1, **static)


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


def _rates(works, cost: ServingCost, sizes) -> np.ndarray:
    """``(sizes, works)`` float64: every work's goodput at every size (one program)."""
    return np.asarray(goodput_grid(list(works), cost, batch_size=tuple(sizes)).tokens_per_time,
                      np.float64)


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
    rates = _rates([slot_work(_fixed(k), None if k == 0 else draft, target)
                    for k in range(max_lookahead + 1)], cost, sizes)  # (sizes, K + 1)
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
        decoders = [threshold_decoder(draft, target, float(price), max_lookahead=cap)
                    for price in prices]
        grid = _rates([slot_work(d, draft, target) for d in decoders], cost, sizes)
        for price, decoder, rates in zip(prices, decoders, grid.T):  # every price in one program
            for i, rate in enumerate(rates):
                if rate > best[i].tokens_per_time * (1 + 1e-12):
                    best[i] = best[i]._replace(decoder=decoder, lookahead=decoder.max_lookahead,
                                               price=float(price), tokens_per_time=float(rate))
    return tuple(best) if many else best[0]
