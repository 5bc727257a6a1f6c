"""The long run on a stationary chain: tokens per unit time of a decoder, and the best possible.

On a *stationary* chain (the same transition rows at every position, ``p`` and ``q`` of shape
``(V, V)``) and far from the end of the horizon, a call-level decoder is a Markov chain over the
token a call starts after: a call from ``a`` takes time ``tau(a)``, emits ``R(a)`` tokens in
expectation and ends on token ``y`` with probability ``P(a, y)``. By the renewal-reward theorem
the long-run time per token is ``lambda = mu . tau / mu . R``, ``mu`` the stationary law of ``P``
(``stationary_rate``); decoding ``T`` tokens takes ``lambda T + O(1)``.

The draft length that minimises ``lambda`` is an average-cost semi-Markov decision problem: each
call is one decision epoch, lasting ``R`` tokens and costing ``tau``. Its optimality equation is

    h(a) = min over stopping policies E[tau - lambda R + h(y)],

solved here by policy iteration (Howard; Puterman 1994, section 11.4): evaluate a policy exactly
(``lambda`` and the relative values ``h`` from two ``V x V`` linear systems), improve it by the
backward induction of ``specjax.theory.optimal_stopping`` with the value after a call that
emits ``j`` tokens and ends on ``y`` set to ``h(y) - lambda j``, and repeat until ``lambda``
stops decreasing. The improved policy has, as in the finite-horizon problem, a threshold form
(stop iff ``A_i <= tau(i, x_i)``): it is a ``ThresholdTable`` that does not depend on the
position. At the optimum the optimality equation holds (``OptimalRate.bellman_residual`` is its
largest violation).

Assumptions: the chain of call starts reachable from the decoder's initial call state has one
closed class (found from the transition graph; e.g. every target row positive), so the rate does
not depend on where decoding starts; otherwise it is refused. Start tokens that the chain leaves
for good (transient) get ``mu = 0`` and their own ``h``; unreachable call states get 0.

References:
  Howard 1960, "Dynamic programming and Markov processes"; Puterman 1994, "Markov decision
  processes", chapter 11 (semi-Markov decision processes, average reward); Huang, Guo & Wang
  2024, "SpecDec++" (adaptive draft lengths, the threshold form).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax.decoders.adaptive import MAX_PATHS
from specjax.decoders.adaptive import AdaptiveSpeculative
from specjax.decoders.adaptive import ThresholdTable
from specjax.decoders.base import CallDecoder
from specjax.decoders.base import check_decoder
from specjax.decoders.planning import plan_run
from specjax.models.markov import MarkovChain
from specjax.numerics import HIGHEST
from specjax.theory import adaptive as _adaptive
from specjax.theory.calls import law_from_rows
from specjax.theory.calls import next_state_table
from specjax.theory.cost import _check_cost
from specjax.theory.cost import depth_works

__all__ = ["OptimalRate", "StationaryRate", "optimal_rate", "stationary_rate"]

class StationaryRate(NamedTuple):
    """The long-run behaviour of a call-level decoder on a stationary chain
    (``specjax.theory.stationary_rate``).

    Attributes:
      tokens_per_time: ``1 / lambda``, tokens per unit time.
      time_per_token: ``lambda = mu . tau / mu . R``.
      tokens_per_call: ``mu . R``, the mean tokens a call emits (the bonus counted).
      time_per_call: ``mu . tau``.
      start_law: ``mu`` ``(V,)``, the stationary law of the token a call starts after (``(S,
        V)`` over (call state, token) for a decoder with ``S > 1`` call states, e.g.
        ``HeuristicSchedule``).
      relative_values: ``h`` (the same shape), with ``mu . h = 0``: decoding ``T`` tokens from a
        call after ``a`` takes ``lambda T + h(a) + O(1)`` (up to a constant for the end).
    """

    tokens_per_time: jax.Array
    time_per_token: jax.Array
    tokens_per_call: jax.Array
    time_per_call: jax.Array
    start_law: jax.Array
    relative_values: jax.Array


class OptimalRate(NamedTuple):
    """The stopping policy of the most tokens per unit time on a stationary chain
    (``specjax.optimal_rate``).

    Attributes:
      tokens_per_time, time_per_token: its long-run rate and its inverse.
      relative_values: ``h`` ``(V,)`` (``StationaryRate.relative_values`` of the optimum).
      thresholds: ``(K + 1, V)``: stop iff ``A_i <= thresholds[i, x_i]`` (``-1``: always go on;
        ``1``: always stop), the same at every position.
      threshold_form: whether these thresholds reproduce every decision of the improvement
        step that produced them, on every reachable path (``True`` for the starting policy).
      decoder: ``AdaptiveSpeculative(ThresholdTable(...), max_lookahead=K)``, the thresholds
        repeated over the target's ``T`` positions, to run with ``specjax.decode``,
        ``specjax.exact`` or ``specjax.theory.decoding_time`` on the given chains.
      iterations: policy-iteration steps taken.
      bellman_residual: ``max_a |min E[tau - lambda R + h(y)] - h(a)|`` for the returned policy's
        ``lambda`` and ``h``, over every start token (recurrent or transient): 0 up to rounding
        when the optimality equation holds.
      converged: whether it does (the residual within ``1000 eps`` of the values' scale): the
        policy is then optimal. ``False`` when ``max_iterations`` ran out, or when the improvement
        step's decisions are not in threshold form and the thresholds cannot follow them (the
        policy is then the best found, its ``time_per_token`` exact for it).
    """

    tokens_per_time: jax.Array
    time_per_token: jax.Array
    relative_values: jax.Array
    thresholds: jax.Array
    threshold_form: bool
    decoder: AdaptiveSpeculative
    iterations: int
    bellman_residual: jax.Array
    converged: bool


def _same_at_every_position(table) -> bool:
    """Whether a ``(T, ...)`` array repeats its first row along ``T``."""
    table = np.asarray(table)
    return bool(np.array_equal(table, np.broadcast_to(table[:1], table.shape)))


def _stationary_rows(name: str, model: MarkovChain) -> jax.Array:
    if not _same_at_every_position(model.trans):
        raise ValueError(f"{name} must be a stationary MarkovChain (the same transition rows at "
                         "every position) for the long-run rate; use decoding_time or "
                         "optimal_stopping for a non-stationary chain")
    return jax.device_put(np.asarray(model.trans)[0])  # concrete: no program to compile


def _call_rows(p, q, depth: int):
    return (jnp.broadcast_to(p, (depth,) + p.shape), jnp.broadcast_to(q, (depth,) + q.shape))


@functools.partial(jax.jit, static_argnames=("depth",))
def _call_kernel(decoder, p, q, times, *, depth: int):
    """``(P, R, tau)`` of one call of ``decoder`` from each (call state, previous token), on
    stationary rows: ``P`` ``(S V, S V)``, ``R`` and ``tau`` ``(S V,)``; ``times`` ``(K + 1,)``
    the time of a call drafting ``d`` levels. The state is traced (vmapped): one compilation."""
    num_states = q.shape[-1]
    num_call_states = decoder.num_call_states
    p_rows, q_rows = _call_rows(p, q, depth)
    moves = jnp.asarray(next_state_table(decoder, depth), q.dtype)  # (S, K + 1, S)
    random_length = decoder.has_drafted_call_law

    def one(state, a):
        start = jax.nn.one_hot(a, num_states, dtype=q.dtype)
        out = law_from_rows(decoder, start, p_rows, q_rows, q, position=1,
                            state=state if num_call_states > 1 else None,
                            with_drafted=random_length)
        if random_length:
            law, drafted = out
            time = jnp.dot(drafted, times, precision=HIGHEST)
        else:
            law, time = out, times[depth]
        ends = law.rejected + law.bonus  # (K + 1, V): i drafts kept, then the last token
        row = jnp.einsum("iv,it->tv", ends, moves[state], precision=HIGHEST)
        tokens = jnp.arange(1, depth + 2, dtype=q.dtype)
        return row.reshape(-1), jnp.dot(tokens, jnp.sum(ends, axis=-1)), time

    def from_state(state):
        return jax.lax.map(functools.partial(one, state), jnp.arange(num_states))

    parts = jax.vmap(from_state)(jnp.arange(num_call_states))
    return tuple(x.reshape((num_call_states * num_states,) + x.shape[2:]) for x in parts)


def _closure(adjacency: np.ndarray) -> np.ndarray:
    """Reachability (reflexive, transitive) of a boolean ``(n, n)`` adjacency, by squaring."""
    reach = adjacency | np.eye(len(adjacency), dtype=bool)
    while True:
        wider = (reach.astype(np.float64) @ reach.astype(np.float64)) > 0
        if np.array_equal(wider, reach):
            return reach
        reach = wider


def _recurrent_part(kernel, starts: np.ndarray, argument: str) -> np.ndarray:
    """The states reachable from ``starts`` (a boolean mask), after checking that they hold one
    closed class: otherwise the long-run rate depends on where decoding starts (``ValueError``
    naming ``argument``). An edge is a transition of probability above rounding."""
    matrix = np.asarray(kernel, np.float64)
    tiny = 64 * float(jnp.finfo(kernel.dtype).eps)
    reach = _closure(matrix > tiny)
    reachable = reach[starts].any(axis=0)
    recurrent = reachable & np.all(~reach | reach.T, axis=1)  # i reaches j => j reaches i
    classes = {tuple(np.flatnonzero(reach[i])) for i in np.flatnonzero(recurrent)}
    if len(classes) != 1:
        raise ValueError(f"{argument}: the chain of call starts has {len(classes)} closed "
                         f"classes reachable from the start, so the long-run rate depends on "
                         f"where decoding starts (e.g. a target row that never leaves a set of "
                         f"tokens, or a schedule whose length never changes)")
    return reachable


def _solve_rate(kernel, tokens, times, part: np.ndarray):
    """``(lambda, mu, h, mu . R, mu . tau, 1 / lambda)`` of the call chain restricted to ``part``
    (closed, one closed class): ``mu`` stationary, ``mu . h = 0``, ``(I - P) h = tau - lambda R``
    on ``part``; ``mu`` and ``h`` are 0 outside it."""
    return _solve_on(kernel, tokens, times, np.flatnonzero(part))


@jax.jit  # one program per size, not one per operation
def _solve_on(kernel, tokens, times, index):
    """``_solve_rate`` on the states ``index``."""
    sub = kernel[index][:, index]
    size = sub.shape[0]
    eye = jnp.eye(size, dtype=kernel.dtype)
    ones = jnp.ones((size,), kernel.dtype)
    mu = jnp.linalg.solve((eye - sub).T.at[-1].set(ones), eye[-1])
    mu = jnp.clip(mu, 0, None) / jnp.sum(jnp.clip(mu, 0, None))
    lam = (mu @ times[index]) / (mu @ tokens[index])
    h = jnp.linalg.solve(eye - sub + jnp.outer(ones, mu), times[index] - lam * tokens[index])
    zeros = jnp.zeros(kernel.shape[:1], kernel.dtype)
    mu, h = zeros.at[index].set(mu), zeros.at[index].set(h)
    return lam, mu, h, mu @ tokens, mu @ times, 1 / lam


def _evaluate(decoder, p, q, times, depth: int, argument: str):
    """``_solve_rate``'s ``(lambda, mu, h, mu . R, mu . tau, 1 / lambda)`` of a decoder's call
    chain from its initial call state."""
    # The decoder as a call at position 1 reads it (a ThresholdTable's one row): one program
    # serves the chains of every horizon.
    kernel, tokens, call_times = _call_kernel(decoder.stationary_form(), p, q, times,
                                              depth=depth)
    num_states = q.shape[-1]
    starts = np.zeros(kernel.shape[0], bool)
    first = decoder.initial_call_state * num_states
    starts[first:first + num_states] = True  # any token, in the initial call state
    part = _recurrent_part(kernel, starts, argument)
    return _solve_rate(kernel, tokens, call_times, part)


def _check_depth(argument: str, depth: int, horizon: int) -> None:
    """A call of ``K`` drafts is evaluated on the stationary rows without a horizon, but the
    decoder's own settings (a threshold table's rows, its exact checks) are those of the chains:
    they must have room for ``K`` drafts."""
    if depth > horizon:
        raise ValueError(f"{argument}: the long-run rate is for calls of up to K = {depth} "
                         f"drafts, beyond the chains' horizon T = {horizon}; give stationary "
                         f"chains with T >= K (only their rows are used)")


def _work_times(decoder, depth: int, cost, dtype) -> jax.Array:
    passes, scored = depth_works(decoder, depth)
    return jax.device_put(np.asarray([cost.call_time(draft_passes=int(d), tokens_scored=int(s))
                                      for d, s in zip(passes, scored)], dtype))


def stationary_rate(decoder, draft, target, cost) -> StationaryRate:
    """Tokens per unit time of a call-level decoder in the long run on a stationary chain.

    Args:
      decoder: a call-level decoder (``AdaptiveSpeculative``, ``HeuristicSchedule``,
        ``TokenTree``, ``DynamicTree``, ``BlockVerification``): its call law from each previous
        token (and call state) is evaluated once on the stationary rows, with
        ``K = decoder.lookahead`` drafts (no horizon). A policy is evaluated as it acts at a
        call started at position 1: a ``ThresholdTable`` whose rows differ by position is
        refused; a ``StoppingRule`` that reads ``state.position`` is taken at position 1. For
        SD with lookahead ``K`` use ``AdaptiveSpeculative(FixedLength(K), max_lookahead=K)``.
      draft, target: stationary ``MarkovChain``s (the same rows at every position; the horizon
        and the prompt's law are not used).
      cost: a ``specjax.CostModel``.

    Returns:
      ``StationaryRate``.

    Raises:
      ValueError: a decoder that is not call-level or whose settings are invalid (as
        ``specjax.exact``), a lookahead beyond the chains' ``T``, a position-dependent threshold
        table, chains that are not stationary ``MarkovChain``s, a bad ``cost`` or a table too
        short, a chain of call starts with more than one closed class reachable from the
        initial call state (the rate would depend on where decoding starts).

    Example:
      >>> import jax.numpy as jnp
      >>> import specjax
      >>> rows = jnp.asarray([[0.6, 0.4], [0.3, 0.7]])
      >>> q = specjax.MarkovChain(jnp.asarray([0.5, 0.5]), jnp.broadcast_to(rows, (8, 2, 2)))
      >>> p = specjax.MarkovChain(q.init, jnp.full((8, 2, 2), 0.5))
      >>> sd = specjax.AdaptiveSpeculative(specjax.decoders.FixedLength(3), max_lookahead=3)
      >>> rate = specjax.theory.stationary_rate(sd, p, q, specjax.CostModel(0.1, 1.0))
      >>> round(float(rate.tokens_per_call), 4)
      3.1421
    """
    check_decoder(decoder)
    if not isinstance(decoder, CallDecoder):
        raise ValueError(f"decoder must be a call-level decoder for stationary_rate, got "
                         f"{type(decoder).__name__} (for SD with lookahead K use "
                         f"AdaptiveSpeculative(FixedLength(K), max_lookahead=K))")
    decoder, draft, target, *_ = plan_run(decoder, draft, target, engine="exact")
    _check_cost(cost)
    _adaptive.check_chains(draft, target)
    p, q = _stationary_rows("draft", draft), _stationary_rows("target", target)
    depth = decoder.lookahead
    _check_depth("decoder", depth, target.horizon)
    decoder.stationary_form()  # refuses calls that differ by position (a ThresholdTable's rows)
    dtype = q.dtype
    times = _work_times(decoder, depth, cost, dtype)
    argument = "decoder" if decoder.num_call_states > 1 else "target"
    lam, mu, h, tokens_per_call, time_per_call, rate = _evaluate(decoder, p, q, times, depth,
                                                                 argument)
    shape = (decoder.num_call_states, q.shape[-1]) if decoder.num_call_states > 1 else (-1,)
    return StationaryRate(tokens_per_time=rate, time_per_token=lam,
                          tokens_per_call=tokens_per_call, time_per_call=time_per_call,
                          start_law=mu.reshape(shape), relative_values=h.reshape(shape))


@functools.partial(jax.jit, static_argnames=("depth",))
def _improve(p, q, h, lam, costs, *, depth: int):
    """One improvement step: the backward induction of one call with the value after a call
    that emits ``j + 1`` tokens and ends on ``y`` set to ``h(y) - lambda (j + 1)``; ``costs``
    the ``call_costs`` of ``depth`` drafts (traced: one program for every cost model). Returns
    ``(max |values - h|, max |h|, stop_max, go_min)``."""
    dtype = q.dtype
    p_rows, q_rows = _call_rows(p, q, depth)
    after = h[None] - lam * jnp.arange(1, depth + 2, dtype=dtype)[:, None]
    values, stop_max, go_min = _adaptive._solve_position(p_rows, q_rows, q, after, costs)
    return jnp.max(jnp.abs(values - h)), jnp.max(jnp.abs(h)), stop_max, go_min


def _policy(thresholds, horizon: int, depth: int) -> AdaptiveSpeculative:
    table = np.asarray(thresholds)
    table = jax.device_put(np.broadcast_to(table, (horizon,) + table.shape))
    return AdaptiveSpeculative(ThresholdTable(table), max_lookahead=depth)


def optimal_rate(draft, target, cost, *, max_lookahead: int,
                 max_iterations: int = 100) -> OptimalRate:
    """The adaptive draft length of the most tokens per unit time on a stationary chain.

    Policy iteration on the average-cost semi-Markov decision problem whose epochs are the target
    calls (module docstring): it starts from drafting ``K`` tokens every call and stops when the
    optimality equation holds for every start token (``converged``), when the time per token
    would increase (rounding), when the policy no longer changes, or after ``max_iterations``.

    Args:
      draft, target: stationary ``MarkovChain``s (concrete; the same rows at every position).
      cost: a ``specjax.CostModel``; a ``target_cost`` table needs entries up to
        ``max_lookahead + 1`` tokens.
      max_lookahead: ``K``, the most drafts of a call, at most the chains' ``T`` (the returned
        decoder runs on them). Each step enumerates the ``V**(K + 1)`` (previous token, drafted
        path) pairs, refused beyond ``2**22``.
      max_iterations: a bound on the policy-iteration steps (it converges in a handful).

    Returns:
      ``OptimalRate``.

    Raises:
      ValueError: chains that are not stationary ``MarkovChain``s, a bad ``cost``,
        ``max_lookahead`` (beyond ``T`` or the enumeration bound) or ``max_iterations``, a table
        too short, a call chain with more than one recurrent class.

    Example:
      >>> import jax.numpy as jnp
      >>> import specjax
      >>> rows = jnp.asarray([[0.6, 0.4], [0.3, 0.7]])
      >>> q = specjax.MarkovChain(jnp.asarray([0.5, 0.5]), jnp.broadcast_to(rows, (8, 2, 2)))
      >>> p = specjax.MarkovChain(q.init, jnp.full((8, 2, 2), 0.5))
      >>> cost = specjax.CostModel(0.1, 1.0)
      >>> best = specjax.optimal_rate(p, q, cost, max_lookahead=4)
      >>> sd = specjax.AdaptiveSpeculative(specjax.decoders.FixedLength(3), max_lookahead=3)
      >>> fixed = specjax.theory.stationary_rate(sd, p, q, cost)
      >>> bool(best.tokens_per_time >= fixed.tokens_per_time)
      True
    """
    _check_cost(cost)
    _checks.check_static_int("max_lookahead", max_lookahead)
    _adaptive.check_chains(draft, target)
    _checks.check_static_int("max_iterations", max_iterations)
    p, q = _stationary_rows("draft", draft), _stationary_rows("target", target)
    num_states, depth = q.shape[-1], max_lookahead
    cost.target_time(depth + 1)  # a table too short raises here, before any work
    _check_depth("max_lookahead", depth, target.horizon)
    if num_states ** (depth + 1) > MAX_PATHS:  # each policy is evaluated by its decoder's law
        raise ValueError(f"max_lookahead: evaluating a policy enumerates V**(K + 1) = "
                         f"{num_states}**{depth + 1} drafted paths, beyond {MAX_PATHS} (2**22); "
                         f"use a smaller max_lookahead")
    dtype = q.dtype
    eps = float(jnp.finfo(dtype).eps)
    # Start from SD with lookahead K: go on before depth K, stop there.
    start = np.full((depth + 1, num_states), -1.0, dtype)
    start[depth] = 1.0
    thresholds = jax.device_put(start)
    # The policies are evaluated as a call at position 1 reads them (one row: stationary_form).
    policy = _policy(thresholds, 1, depth)
    times = _work_times(policy, depth, cost, dtype)
    costs = _adaptive.call_costs(cost, depth, dtype)
    separated, best = True, None
    iterations = 0
    for iterations in range(1, max_iterations + 1):
        lam, _, h, _, _, rate = _evaluate(policy, p, q, times, depth, "target")
        if best is not None and float(lam) > float(best["lam"]) * (1 + 64 * eps):
            break  # no better (rounding): keep the previous policy
        residual, h_scale, stop_max, go_min = _improve(p, q, h, lam, costs, depth=depth)
        scale = max(1.0, float(h_scale), float(np.asarray(times)[-1]), float(lam) * depth)
        best = dict(lam=lam, rate=rate, h=h, thresholds=thresholds, separated=separated,
                    residual=residual, converged=float(residual) <= 1e3 * eps * scale)
        if best["converged"]:
            break  # the optimality equation holds: no policy does better
        new, separated = _adaptive._read_thresholds(stop_max, go_min)
        if np.array_equal(np.asarray(new), np.asarray(thresholds)):
            break  # the improvement does not change the policy (not in threshold form)
        thresholds = new
        policy = _policy(thresholds, 1, depth)
    lam = best["lam"]
    return OptimalRate(tokens_per_time=best["rate"], time_per_token=lam,
                       relative_values=best["h"], thresholds=best["thresholds"],
                       threshold_form=best["separated"],
                       decoder=_policy(best["thresholds"], target.horizon, depth),
                       iterations=iterations, bellman_residual=best["residual"],
                       converged=best["converged"])
