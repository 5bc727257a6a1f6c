"""The optimal adaptive draft length: the stopping policy of least expected time, by backward
induction.

A call of speculative decoding from position ``n`` after token ``a`` drafts one token at a time
and, before each draft, may stop and call the target (``specjax.AdaptiveSpeculative``). Under a
``CostModel`` a call that drafts ``d`` tokens takes ``d draft_cost + target_cost(d + 1) +
call_overhead``. Let ``W(n, a)`` be the least expected time to finish the ``T`` tokens from a call
start at ``n`` after ``a`` (``W(T + 1, .) = 0``). Inside the call, after drafting ``x_1..x_i``, what
happens next depends on the path only through ``x_i`` and

* ``A_i = prod_{j <= i} min(1, q_j(x_j) / p_j(x_j))``, the probability that every draft so far
  is kept, and
* ``R_i``, the expected time-to-go already committed by the earlier drafts' rejections: draft ``j``
  is the first rejected with probability ``A_{j-1} (1 - min(1, q_j / p_j))``, its token is drawn
  from ``[q_j - p_j]_+`` and the next call starts at ``n + j``.

Stopping at depth ``i`` is worth ``target_cost(i + 1) + call_overhead + R_i + A_i B_i(x_i)``, with
``B_i(x) = sum_y q(y | x) W(n + i + 1, y)`` the value after the bonus token (0 past the horizon);
continuing costs ``draft_cost`` plus the expectation of the next depth's value over
``x_{i+1} ~ p``. The backward induction runs over the drafted paths of each call (``V**K'`` per
previous token, ``K' = min(K, T - n + 1)``) and over positions ``n = T..1``: ``O(T V**(K + 1))``
work, per previous token in memory.

The optimal decision has a threshold form. ``R_i`` is common to both choices, so the decision at
``(n, i, x_i)`` depends on ``A_i`` alone; the value of continuing is concave in ``A_i`` (a minimum
of affine functions, averaged and scaled), stopping is affine, so the set where stopping is better
is an interval; it contains ``A = 0`` whenever a call never gets cheaper by scoring more tokens.
So the optimum stops iff ``A_i <= tau(n, i, x_i)``: SpecDec++'s rule with a threshold that may
depend on the position, the depth and the last token. ``optimal_stopping`` reads the thresholds
off the solved decisions (midway between the largest ``A`` it stopped at and the smallest it went
on from, over every reachable path) and reports whether they reproduce every decision
(``threshold_form``); ``OptimalStopping.decoder`` runs that policy, so ``specjax.exact``,
``specjax.decode`` and ``specjax.theory.decoding_time`` evaluate it like any decoder.

References:
  Huang, Guo & Wang 2024, "SpecDec++" (the threshold form under its assumptions: a constant
  threshold on the predicted rejection probability).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax.decoders.adaptive import AdaptiveSpeculative
from specjax.decoders.adaptive import MAX_PATHS
from specjax.decoders.adaptive import ThresholdTable
from specjax.decoders.verification import acceptance_probability
from specjax.decoders.verification import speculative_residual
from specjax.models.markov import MarkovChain

__all__ = ["OptimalStopping", "call_costs", "check_chains", "optimal_stopping"]

_BATCH_ELEMENTS = 2**22  # previous tokens solved at once: at most this many path entries


class OptimalStopping(NamedTuple):
    """The stopping policy of least expected time (``specjax.theory.optimal_stopping``).

    Attributes:
      expected_time: its expected time to decode the ``T`` tokens.
      values: ``(T + 1, V)``, ``values[n - 1, a]`` the least expected time-to-go from a call
        start at ``n`` after token ``a`` (row ``T``: 0).
      thresholds: ``(T, K + 1, V)``: stop iff ``A_i <= thresholds[n - 1, i, x_i]`` (``-1``:
        always go on; ``1``: always stop).
      threshold_form: whether the thresholds reproduce every decision of the backward induction
        on every reachable path (if not, ``decoder`` is not the optimum: a tie or a cost table
        that decreases).
      decoder: ``AdaptiveSpeculative(ThresholdTable(thresholds), max_lookahead=K)``.
    """

    expected_time: jax.Array
    values: jax.Array
    thresholds: jax.Array
    threshold_form: bool
    decoder: AdaptiveSpeculative


def _solve_call(a, p_rows, q_rows, bonus_row, after, costs):
    """One call from previous token ``a``: ``(value, stop_max (K', V), go_min (K', V))``.

    ``after[j]`` is ``W(n + j + 1, .)`` for ``j = 0..K'`` (zeros past the horizon), ``costs``
    ``(draft_cost, target time of a call scoring 1..K' + 1 tokens)``; ``bonus_row`` ``None``
    past the horizon."""
    draft_cost, stop_costs = costs
    k, num_states, _ = p_rows.shape
    dtype = p_rows.dtype
    alpha = acceptance_probability(p_rows, q_rows, epsilon=0)  # SD's min(1, q / p)
    resid = speculative_residual(p_rows, q_rows)
    rejected_value = jnp.einsum("jxy,jy->jx", resid, after[:k])  # draft j + 1 rejected
    rows = [q_rows[i] for i in range(k)] + ([bonus_row] if bonus_row is not None else [])
    bonus_value = [row @ after[i] for i, row in enumerate(rows)]
    if bonus_row is None:
        bonus_value.append(jnp.zeros((num_states,), dtype))

    def take(table, i, token_axis_first):  # table (V, V)[x_i, x_{i+1}] lifted to rank i + 1
        if i == 0:
            return table[a]
        return table.reshape((1,) * (i - 1) + table.shape)

    # Forward over paths: A_i, R_i, reachable_i (arrays of rank i; scalars at depth 0).
    all_acc, committed = [jnp.ones((), dtype)], [jnp.zeros((), dtype)]
    reachable = [jnp.ones((), bool)]
    for i in range(k):
        step_alpha = take(alpha[i], i, True)
        step_p = take(p_rows[i], i, True)
        lost = (jnp.take(rejected_value[i], a) if i == 0 else
                rejected_value[i].reshape((1,) * (i - 1) + (num_states, 1)))
        committed.append(committed[-1][..., None] + all_acc[-1][..., None] * (1 - step_alpha)
                         * lost)
        all_acc.append(all_acc[-1][..., None] * step_alpha)
        reachable.append(reachable[-1][..., None] & (step_p > 0))

    def stop_value(i):
        last = (jnp.take(bonus_value[i], a) if i == 0 else
                bonus_value[i].reshape((1,) * (i - 1) + (num_states,)))
        return stop_costs[i] + committed[i] + all_acc[i] * last

    value = stop_value(k)
    stop_max, go_min = [], []
    for i in range(k - 1, -1, -1):
        step_p = take(p_rows[i], i, True)
        go = draft_cost + jnp.sum(step_p * value, axis=-1)
        stop = stop_value(i)
        stops = stop <= go
        value = jnp.minimum(stop, go)
        low, high = jnp.asarray(-jnp.inf, dtype), jnp.asarray(jnp.inf, dtype)
        stopped = jnp.where(reachable[i] & stops, all_acc[i], low)
        went = jnp.where(reachable[i] & ~stops, all_acc[i], high)
        if i == 0:
            stop_max.append(jnp.full((num_states,), low).at[a].set(stopped))
            go_min.append(jnp.full((num_states,), high).at[a].set(went))
        else:
            axes = tuple(range(i - 1))
            stop_max.append(jnp.max(stopped, axis=axes) if axes else stopped)
            go_min.append(jnp.min(went, axis=axes) if axes else went)
    return value, jnp.stack(stop_max[::-1]), jnp.stack(go_min[::-1])


def _solve_position(p_rows, q_rows, bonus_row, after, costs):
    """Every previous token of a call at one position: ``(W (V,), stop_max, go_min)``."""
    k, num_states, _ = p_rows.shape
    batch = max(1, min(num_states, _BATCH_ELEMENTS // num_states**k))
    solve = functools.partial(_solve_call, p_rows=p_rows, q_rows=q_rows, bonus_row=bonus_row,
                              after=after, costs=costs)
    values, stop_max, go_min = jax.lax.map(solve, jnp.arange(num_states), batch_size=batch)
    return values, jnp.max(stop_max, axis=0), jnp.min(go_min, axis=0)


@functools.partial(jax.jit, static_argnames=("lookahead",))
def _backward(init, draft_trans, target_trans, draft_cost, stop_costs, *, lookahead: int):
    """``(expected_time, values (T + 1, V), stop_max, go_min)``; ``(draft_cost, stop_costs)``
    the ``call_costs`` of ``K = lookahead`` drafts, traced (one program for every cost
    model)."""
    horizon, num_states, _ = target_trans.shape
    dtype = target_trans.dtype
    k = lookahead

    window = jnp.zeros((k + 1, num_states), dtype)  # W(n + 1) .. W(n + K + 1)
    values, stop_max, go_min = [], [], []
    num_full = max(horizon - k, 0)
    for n in range(horizon, num_full, -1):  # the last calls: fewer drafts, static shapes
        depth = horizon - n + 1
        w, s, g = _solve_position(draft_trans[n - 1:], target_trans[n - 1:], None,
                                  window[:depth + 1], (draft_cost, stop_costs[:depth + 1]))
        window = jnp.concatenate([w[None], window[:-1]])
        pad = ((0, k - depth), (0, 0))
        values.append(w)
        stop_max.append(jnp.pad(s, pad, constant_values=-jnp.inf))
        go_min.append(jnp.pad(g, pad, constant_values=jnp.inf))

    def step(window, n):
        p_rows = jax.lax.dynamic_slice_in_dim(draft_trans, n - 1, k)
        q_rows = jax.lax.dynamic_slice_in_dim(target_trans, n - 1, k)
        bonus_row = jax.lax.dynamic_index_in_dim(target_trans, n - 1 + k, keepdims=False)
        w, s, g = _solve_position(p_rows, q_rows, bonus_row, window, (draft_cost, stop_costs))
        return jnp.concatenate([w[None], window[:-1]]), (w, s, g)

    parts = [tuple(jnp.stack(x) for x in (values, stop_max, go_min))] if values else []
    if num_full:
        _, out = jax.lax.scan(step, window, jnp.arange(num_full, 0, -1))
        parts.append(out)
    values, stop_max, go_min = (jnp.concatenate(x)[::-1] for x in zip(*parts))
    values = jnp.concatenate([values, jnp.zeros((1, num_states), dtype)])  # position n = 1..T + 1
    return init.astype(dtype) @ values[0], values, stop_max, go_min


def call_costs(cost, depth: int, dtype):
    """``(draft_cost, stop costs)`` of ``_solve_position``: a draft pass, and ``(depth + 1,)``
    the time of the target call (and overhead) after ``d = 0..depth`` drafts."""
    stop = np.asarray([cost.call_time(draft_passes=0, tokens_scored=d + 1)
                       for d in range(depth + 1)], dtype)
    # Made on the host: jnp.asarray would compile a conversion per shape.
    return jax.device_put(np.asarray(cost.draft_cost, dtype)), jax.device_put(stop)


def _read_thresholds(stop_max, go_min):
    """``(thresholds (..., K + 1, V), threshold_form)`` from the largest ``A`` the induction
    stopped at and the smallest it went on from (``(..., K, V)``, over every reachable path):
    midway between them; ``-1`` (always go on) or ``1`` (always stop) where only one happened;
    depth ``K`` always stops."""
    both = np.isfinite(np.asarray(stop_max)) & np.isfinite(np.asarray(go_min))
    separated = bool(np.all(np.asarray(stop_max)[both] < np.asarray(go_min)[both]))
    return _midway(stop_max, go_min), separated


@jax.jit  # one program, not one per operation
def _midway(stop_max, go_min):
    """The thresholds of ``_read_thresholds``."""
    thresholds = jnp.where(
        jnp.isfinite(stop_max) & jnp.isfinite(go_min),
        jnp.where(stop_max < go_min, (stop_max + go_min) / 2, stop_max),
        jnp.where(jnp.isfinite(go_min), -1.0, 1.0)).astype(stop_max.dtype)
    last = jnp.ones(thresholds.shape[:-2] + (1, thresholds.shape[-1]), thresholds.dtype)
    return jnp.concatenate([thresholds, last], axis=-2)


def check_chains(draft, target) -> None:
    """Two ``MarkovChain``s of the same shape."""
    for name, model in (("draft", draft), ("target", target)):
        if not isinstance(model, MarkovChain):
            raise ValueError(f"{name} must be a MarkovChain, got {type(model).__name__}")
    _checks.check_same_shape(draft, target)


def optimal_stopping(draft, target, cost, *, max_lookahead: int) -> OptimalStopping:
    """The adaptive draft length of least expected time, solved exactly by backward induction.

    Args:
      draft, target: ``MarkovChain``s (concrete).
      cost: a ``specjax.CostModel``; a ``target_cost`` table needs entries up to
        ``max_lookahead + 1`` tokens.
      max_lookahead: ``K``, the most drafts of a call (values above ``T`` act as ``T``). The
        solver enumerates ``V**K'`` drafted paths per previous token and position and refuses
        ``V**(K' + 1)`` beyond ``2**22`` only per batch of previous tokens (``V = 16``, ``K = 6``
        is solved one previous token at a time).

    Returns:
      ``OptimalStopping(expected_time, values, thresholds, threshold_form, decoder)``.

    Raises:
      ValueError: models that are not ``MarkovChain``s, a bad ``cost`` or ``max_lookahead``, a
        cost table too short.

    Example:
      >>> import specjax
      >>> draft, target = specjax.paper_instance()
      >>> cost = specjax.CostModel(draft_cost=0.1, target_cost=1.0)
      >>> best = specjax.theory.optimal_stopping(draft, target, cost, max_lookahead=4)
      >>> fixed = specjax.theory.best_lookahead(draft, target, cost, max_lookahead=4)
      >>> bool(best.expected_time <= fixed.expected_time), best.threshold_form
      (True, True)
    """
    from specjax.theory.cost import _check_cost  # noqa: PLC0415

    _check_cost(cost)
    _checks.check_static_int("max_lookahead", max_lookahead)
    check_chains(draft, target)
    horizon, num_states = target.horizon, target.num_states
    k = min(max_lookahead, horizon)
    cost.target_time(k + 1)  # a table too short raises here, before any work
    if num_states**k > MAX_PATHS * 4:
        raise ValueError(f"max_lookahead: the backward induction enumerates V**K = "
                         f"{num_states}**{k} drafted paths per previous token, beyond "
                         f"{MAX_PATHS * 4} (2**24); use a smaller max_lookahead")
    expected_time, values, stop_max, go_min = _backward(
        target.init, draft.trans, target.trans, *call_costs(cost, k, target.trans.dtype),
        lookahead=k)
    thresholds, separated = _read_thresholds(stop_max, go_min)
    decoder = AdaptiveSpeculative(ThresholdTable(thresholds), max_lookahead=k)
    return OptimalStopping(expected_time=expected_time,
                           values=values, thresholds=thresholds, threshold_form=separated,
                           decoder=decoder)
