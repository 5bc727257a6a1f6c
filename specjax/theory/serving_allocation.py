"""Draft lengths for a batch in lockstep: ``allocate_drafts``, ``step_time`` and the threshold
rule ``threshold_decoder`` (re-exported by ``specjax.theory.serving``, which holds
``request_policy`` and ``batch_lookahead``, the policies scored by exact goodput).

Allocation (``allocate_drafts``): given every slot's survival ``s_b(j)`` (the probability that
its first ``j`` drafts are all accepted, non-increasing in ``j``), the draft lengths ``K_b`` of
most expected tokens per unit of this step's time, SD off (every ``K_b = 0``) included. With a
draft pass time affine in the slots it runs over, ``draft_time[n] = a + c n`` for ``n >= 1``, the
step time depends on the allocation only through ``m = max K_b`` and ``D = sum K_b``
(``a m + c D + target_time[B + D] + overhead``), and for a fixed ``(m, D)`` the most tokens,
``B + sum_b sum_{j <= K_b} s_b(j)``, is a separable concave allocation: the ``D`` largest
marginal survivals ``s_b(j)`` with ``j <= m`` (greedy by marginal survival; non-increasing rows
make the chosen set a prefix of each row). Enumerating ``(m, D)`` and keeping the best ratio is
exact: the best allocation's own ``(m, D)`` is enumerated, and every enumerated value is
attained by an allocation whose time is at most the enumerated time. Under a linear cost
(``a = 0``, a linear target table) the ratio's Lagrangian decouples into one threshold per draft:
draft the ``j``-th token of slot ``b`` iff ``s_b(j) >= tau``. ``request_policy`` applies that
threshold along each request's own drafts (an ``AdaptiveSpeculative`` whose ``ThresholdTable``
stops when the next draft's probability of being accepted with all before it falls below
``tau``), with the batch-wide ``tau`` (or a fixed ``K``) of most exact goodput;
``batch_lookahead`` chooses one ``K`` for the whole batch (vLLM's dynamic SD).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax.decoders.adaptive import AdaptiveSpeculative
from specjax.decoders.adaptive import ThresholdTable
from specjax.models.markov import MarkovChain
from specjax.theory.serving_cost import ServingCost
from specjax.theory.serving_cost import _check_serving_cost

__all__ = ["DraftAllocation", "step_time", "allocate_drafts", "threshold_decoder"]


class DraftAllocation(NamedTuple):
    """The draft lengths of one step (``allocate_drafts``).

    Attributes:
      lookaheads: ``(B,)`` int, ``K_b`` for each slot (all 0: SD off this step).
      tokens: the step's expected tokens, ``B + sum_b sum_{j <= K_b} s_b(j)``.
      time: the step's time.
      tokens_per_time: ``tokens / time``, the most over every allocation.
    """

    lookaheads: np.ndarray
    tokens: float
    time: float
    tokens_per_time: float


def _check_survival(survival) -> np.ndarray:
    if isinstance(survival, jax.core.Tracer):
        raise ValueError("survival must be concrete (allocation is planning, not traced)")
    try:
        table = np.asarray(survival, np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"survival must be a (B, K) array of probabilities, got "
                         f"{survival!r}"[:300]) from None
    if table.ndim != 2 or table.shape[0] < 1:
        raise ValueError(f"survival must have shape (B, K) (B >= 1 slots, K drafts), got shape "
                         f"{table.shape}")
    if not (np.isfinite(table).all() and (table >= 0).all() and (table <= 1).all()):
        raise ValueError("survival must hold probabilities in [0, 1]")
    if (np.diff(table, axis=1) > 0).any():
        raise ValueError("survival[b, j - 1] = P(the first j drafts of slot b are accepted) must "
                         "be non-increasing in j")
    return table


def _affine_draft(cost: ServingCost, batch_size: int) -> tuple[float, float]:
    """``(a, c)`` with ``draft_time[n] = a + c n`` for ``n = 1..B``; ``ValueError`` otherwise."""
    table = cost.draft_times(batch_size)[1:]
    slope = table[1] - table[0] if batch_size > 1 else 0.0
    intercept = table[0] - slope
    fit = intercept + slope * np.arange(1, batch_size + 1)
    if not np.allclose(fit, table, rtol=1e-12, atol=1e-12 * max(1.0, float(np.abs(table).max()))):
        raise ValueError("cost.draft_time must be affine in the slots of a pass (draft_time[n] = "
                         f"a + c n for n = 1..{batch_size}) for the exact allocation; a roofline "
                         "whose knee is at or above B is (constant below the knee)")
    return float(intercept), float(slope)


def _check_lookaheads(lookaheads) -> np.ndarray:
    """``lookaheads`` as a ``(B,)`` int64 array of non-negative ints (``B >= 1``)."""
    if isinstance(lookaheads, jax.core.Tracer):
        raise ValueError("lookaheads must be concrete (a step's time is planning, not traced)")
    k = np.asarray(lookaheads)
    if k.ndim != 1 or k.size == 0 or not (np.issubdtype(k.dtype, np.integer)
                                          or (np.issubdtype(k.dtype, np.floating)
                                              and np.all(np.isfinite(k)) and np.all(k == k // 1))):
        raise ValueError(f"lookaheads must be a (B,) vector of draft lengths, one int per slot "
                         f"(B >= 1), got {np.asarray(lookaheads)!r}"[:300])
    if (k < 0).any():
        raise ValueError(f"lookaheads must be non-negative draft lengths, got {k.tolist()}"[:300])
    return k.astype(np.int64)


def step_time(lookaheads, cost: ServingCost) -> float:
    """The time of one SD step whose slots draft ``lookaheads`` (``(B,)`` ints): ``K_b`` passes
    and ``K_b + 1`` tokens scored per slot, pass ``j`` over the slots with ``K_b >= j``."""
    k = _check_lookaheads(lookaheads)
    _check_serving_cost(cost)
    batch = k.shape[0]
    draft = cost.draft_times(batch)
    counts = [(k >= j).sum() for j in range(1, int(k.max(initial=0)) + 1)]
    return (float(sum(draft[n] for n in counts))
            + float(cost.target_times(int(batch + k.sum()))[batch + k.sum()]) + cost.overhead)


def allocate_drafts(survival, cost: ServingCost) -> DraftAllocation:
    """The draft lengths of most expected tokens per unit time in one lockstep SD step.

    Slot ``b`` drafting ``K_b`` tokens emits ``1 + sum_{j <= K_b} s_b(j)`` tokens in expectation
    and makes ``K_b`` draft passes and scores ``K_b + 1`` tokens (``step_time``). The rule
    (module docstring): for every cap ``m = 0..K`` and total ``D = 0..m B``, take the ``D``
    largest marginal survivals ``s_b(j)``, ``j <= m`` (greedy by marginal survival), time it as
    ``a m + c D + target_time[B + D] + overhead``, and keep the best ratio; exact when
    ``draft_time`` is affine in ``n`` (checked), in ``O(K^2 B log(K B))``.

    Args:
      survival: ``(B, K)``, ``survival[b, j - 1] = s_b(j)``, the probability that slot ``b``'s
        first ``j`` drafts are all accepted (non-increasing in ``j``, in ``[0, 1]``).
      cost: a ``ServingCost`` whose ``draft_time`` is affine over ``n = 1..B``.

    Returns:
      ``DraftAllocation`` (ties go to the fewest drafts).

    Raises:
      ValueError: a bad ``survival`` or ``cost``, a ``draft_time`` that is not affine, a
        ``target_time`` table shorter than ``B (K + 1)``.

    Example:
      >>> import specjax
      >>> cost = specjax.ServingCost(0.1, [0.0] + [1.0] * 4 + [1.5] * 4)
      >>> best = specjax.theory.allocate_drafts([[0.9, 0.8, 0.7], [0.2, 0.1, 0.0]], cost)
      >>> best.lookaheads.tolist(), round(best.tokens_per_time, 4)
      ([2, 0], 3.0833)
    """
    table = _check_survival(survival)
    _check_serving_cost(cost)
    batch, depth = table.shape
    intercept, slope = _affine_draft(cost, batch)
    if intercept < -1e-12 * max(1.0, abs(slope)):
        raise ValueError(
            f"cost.draft_time must be a + c n with a >= 0 for the exact allocation (a pass's "
            f"fixed part; the greedy rule's optimality needs it), got a = {intercept:.6g}, c = "
            f"{slope:.6g}; with a < 0 compare the step_time of candidate lookaheads instead")
    target = cost.target_times(batch * (depth + 1))
    best = (-1.0, 0, 0)
    for cap in range(depth + 1):
        marginals = table[:, :cap].ravel()
        level = np.tile(np.arange(cap), batch)
        order = np.lexsort((level, -marginals))  # largest first, shallower first on ties
        gains = np.concatenate([[0.0], np.cumsum(marginals[order])])
        totals = np.arange(batch * cap + 1)
        times = (intercept * cap * (totals > 0) + slope * totals + target[batch + totals]
                 + cost.overhead)
        ratios = (batch + gains) / times
        first = int(np.argmax(ratios))
        if ratios[first] > best[0] * (1 + 1e-14):
            best = (float(ratios[first]), cap, first)
    _, cap, total = best
    lookaheads = np.zeros(batch, np.int64)
    if total:
        marginals = table[:, :cap].ravel()
        order = np.lexsort((np.tile(np.arange(cap), batch), -marginals))[:total]
        np.add.at(lookaheads, order // cap, 1)
    tokens = float(batch + sum(table[b, :lookaheads[b]].sum() for b in range(batch)))
    time = step_time(lookaheads, cost)
    return DraftAllocation(lookaheads=lookaheads, tokens=tokens, time=time,
                           tokens_per_time=tokens / time)



def _check_price(price) -> None:
    """A concrete ``price`` must be one finite number (a traced one is not checked)."""
    if not _checks.is_concrete(price):
        return
    try:
        value = np.asarray(price, np.float64)
    except (TypeError, ValueError):
        value = None
    if isinstance(price, bool) or value is None or value.ndim != 0 or not np.isfinite(value):
        raise ValueError(f"price must be a finite number, got {price!r}"[:300])


def threshold_decoder(draft, target, price, *, max_lookahead: int) -> AdaptiveSpeculative:
    """SD that drafts the next token while its probability of being accepted together with
    every draft before it exceeds ``price``: stop iff ``A_i alpha(x_i) <= price``, ``A_i`` the
    probability that the ``i`` drafts so far are all accepted and ``alpha(x)`` the acceptance
    rate of a draft after ``x`` at that position (``sum_y min(p, q)``); at most
    ``max_lookahead`` drafts. An ``AdaptiveSpeculative`` with a ``ThresholdTable``
    (``price / alpha``); ``price`` may be traced (a leaf).

    Example:
      >>> import specjax
      >>> draft, target = specjax.paper_instance()
      >>> sd = specjax.theory.serving.threshold_decoder(draft, target, 0.5, max_lookahead=4)
      >>> round(float(specjax.exact(sd, draft, target).expected_calls), 3)
      33.099
    """
    _checks.check_static_int("max_lookahead", max_lookahead)
    _check_price(price)
    for name, model in (("draft", draft), ("target", target)):
        if not isinstance(model, MarkovChain):
            raise ValueError(f"{name} must be a specjax.MarkovChain (the threshold table reads "
                             f"its rows by position), got {type(model).__name__}")
    _checks.check_same_shape(draft, target)
    p, q = draft.trans, target.trans
    horizon = q.shape[0]
    depth = min(max_lookahead, horizon)
    alpha = jnp.sum(jnp.minimum(p, q), axis=-1)  # (T, V)
    rows = jnp.clip(jnp.arange(horizon)[:, None] + jnp.arange(depth + 1)[None], 0, horizon - 1)
    table = jnp.where(alpha[rows] > 0, price / jnp.where(alpha[rows] > 0, alpha[rows], 1), 1.0)
    table = table.at[:, depth].set(1.0)  # A_i <= 1: always stop at the cap
    return AdaptiveSpeculative(ThresholdTable(table.astype(q.dtype)), max_lookahead=depth)
