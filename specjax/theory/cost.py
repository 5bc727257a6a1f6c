"""What decoding costs in time: a cost model, the expected time of any decoder, the best lookahead.

A target call that scores ``n`` tokens takes ``target_cost(n)`` (a number, or a table as in
Sequoia's configuration: verification is not free in the number of tokens), a draft forward pass
takes ``draft_cost``, and every call may add a fixed ``call_overhead``. Times are in whatever unit
the costs are given in; with ``target_cost = 1`` they count target calls.

What a call does is the decoder's ``call_work(depth)``: a call that
drafts ``d`` levels (``d = min(K, T - n + 1)`` at position ``n``) makes ``d`` draft passes and
one target call scoring the root and the drafted tokens: ``d + 1`` for one chain (SD, biased SD,
``RejectionRule``, block verification), ``M d + 1`` for ``M`` draft sequences (batch SD and the
multi-draft verifiers), the nodes of the truncated tree for a token tree, the budget for a dynamic
tree; autoregressive decoding scores one token per call and drafts nothing.

The expected time is then exact and linear in the probability that a call starts at each
position (``ExactDecoding.new_call``)::

    E[time] = sum_n P(a call starts at n) (d_n draft_cost + target_cost(s_n) + call_overhead),

so it is differentiable in the draft and the target wherever ``exact`` is, and the same sum over
a sampler's ``new_call`` flags is its Monte Carlo estimate. Autoregressive decoding of the same
``T`` tokens takes ``T (target_cost(1) + call_overhead)``; the speed-up is its ratio to the
expected time.

Leviathan et al. (2023) give the speed-up of SD with lookahead ``K`` as
``(1 - a^(K+1)) / ((1 - a)(K c + 1))`` for an i.i.d. acceptance ``a`` and a cost ratio ``c``: the
ratio of a call's expected tokens to its time. On a chain whose every row has acceptance ``a``
it is what ``decoding_time`` gives away from the end of the horizon (the tests check this).

References:
  Leviathan, Kalman & Matias 2023, "Fast inference from transformers via speculative decoding";
  Chen et al. 2024, "Sequoia" (a target cost per number of tokens scored).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax.decoders.autoregressive import Autoregressive
from specjax.decoders.base import CallDecoder
from specjax.decoders.base import check_decoder
from specjax.decoders.planning import plan_run
from specjax.numerics import safe_ratio
from specjax.theory.values import exact

__all__ = [
    "CostModel",
    "DecodingTime",
    "LookaheadChoice",
    "TreeBudgetChoice",
    "best_lookahead",
    "best_tree_budget",
    "call_depths",
    "call_works",
    "decoding_time",
    "depth_works",
    "drafted_law",
    "expected_time",
    "sweep_lookahead",
]


@dataclasses.dataclass(frozen=True)
class CostModel:
    """The time a decoder spends: draft passes, target calls by the tokens they score, overhead.

    A static, hashable value (the costs are Python floats), so it can be closed over or passed
    as a static argument under ``jit``.

    Args:
      draft_cost: Time of one draft forward pass (one drafted token of a chain, one level of a
        tree), a finite number ``>= 0``.
      target_cost: Time of one target call: a finite positive number (the same whatever it
        scores), or a 1-D table with ``target_cost[n]`` the time of a call scoring ``n`` tokens
        (entry 0 is unused; a longer table than needed is fine).
      call_overhead: A fixed time added to every call (keyword only), finite ``>= 0``.

    Raises:
      ValueError: a cost that is not a finite number of the right sign, or a table that is not
        1-D, is empty past entry 0, or holds a non-finite or non-positive entry at ``n >= 1``.

    Example:
      >>> import specjax
      >>> cost = specjax.CostModel(0.1, [0.0, 1.0, 1.0, 1.1, 1.2, 1.3])
      >>> cost.call_time(draft_passes=3, tokens_scored=4)
      1.5
    """

    draft_cost: float
    target_cost: float | tuple
    _: dataclasses.KW_ONLY
    call_overhead: float = 0.0

    def __post_init__(self):
        set_field = object.__setattr__  # frozen: store the validated, hashable values
        set_field(self, "draft_cost", _checks.check_finite_non_negative("draft_cost",
                                                                        self.draft_cost))
        set_field(self, "call_overhead", _checks.check_finite_non_negative(
            "call_overhead", self.call_overhead))
        set_field(self, "target_cost", _check_target_cost(self.target_cost))

    @property
    def max_tokens(self) -> float:
        """The most tokens a call may score under this model (``inf`` for a number)."""
        if isinstance(self.target_cost, tuple):
            return len(self.target_cost) - 1
        return math.inf

    def target_time(self, tokens_scored: int) -> float:
        """``target_cost(n)`` for a call scoring ``n >= 1`` tokens."""
        if not isinstance(self.target_cost, tuple):
            return self.target_cost
        if tokens_scored > self.max_tokens:
            raise ValueError(
                f"target_cost is a table of length {len(self.target_cost)}, but a call scores up "
                f"to {tokens_scored} tokens: give target_cost[n] for n = 1..{tokens_scored} "
                f"(length at least {tokens_scored + 1}; entry 0 is unused)")
        return self.target_cost[tokens_scored]

    def call_time(self, *, draft_passes: int, tokens_scored: int) -> float:
        """The time of one call: ``draft_passes * draft_cost + target_cost(tokens_scored) +
        call_overhead``."""
        return (draft_passes * self.draft_cost + self.target_time(tokens_scored)
                + self.call_overhead)


def _check_target_cost(target_cost):
    if isinstance(target_cost, jax.core.Tracer):
        raise ValueError("target_cost is a static setting: pass a Python number or a list, not "
                         "a traced value (do not pass it through jax.jit or jax.grad)")
    if isinstance(target_cost, (bool, str)) or target_cost is None:
        raise ValueError(f"target_cost must be a positive number or a 1-D table of them, got "
                         f"{target_cost!r}")
    if np.ndim(target_cost) == 0:
        cost = _checks.check_finite_non_negative("target_cost", target_cost)
        if cost <= 0:
            raise ValueError(f"target_cost must be positive (a target call takes time), got "
                             f"{target_cost!r}")
        return cost
    try:
        table = np.asarray(target_cost, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"target_cost must be a positive number or a 1-D table of them, got "
                         f"{target_cost!r}") from None
    if table.ndim != 1:
        raise ValueError(f"target_cost must be a number or a 1-D table (target_cost[n] for a "
                         f"call scoring n tokens), got shape {table.shape}")
    if table.shape[0] < 2:
        raise ValueError(f"target_cost is a table of length {table.shape[0]}: it needs "
                         "target_cost[n] for n >= 1 (entry 0 is unused)")
    used = table[1:]
    if not (np.isfinite(used).all() and (used > 0).all()):
        bad = int(np.argmax(~(np.isfinite(used) & (used > 0)))) + 1
        raise ValueError(f"target_cost must hold finite positive costs at n >= 1, got "
                         f"target_cost[{bad}] = {table[bad]!r}")
    return (0.0,) + tuple(float(x) for x in used)


class DecodingTime(NamedTuple):
    """The expected time of a decoder under a ``CostModel`` (exact; differentiable in the
    models).

    Attributes:
      expected_time: ``E[time]`` to decode the ``T`` tokens.
      autoregressive_time: ``T (target_cost(1) + call_overhead)``, the same ``T`` tokens by the
        target alone.
      speedup: ``autoregressive_time / expected_time``.
      tokens_per_time: ``T / expected_time``.
      expected_calls: ``E[target calls]``.
      expected_draft_passes: ``E[draft forward passes]``.
      expected_tokens_scored: ``E[tokens scored by the target]`` over all calls.
      call_time: ``(T,)``, the time of a call that starts at position ``n = 1..T`` (its
        expected time given that a call starts there when the draft length is random; 0 where
        no call can start).
    """

    expected_time: jax.Array
    autoregressive_time: jax.Array
    speedup: jax.Array
    tokens_per_time: jax.Array
    expected_calls: jax.Array
    expected_draft_passes: jax.Array
    expected_tokens_scored: jax.Array
    call_time: jax.Array


def depth_works(decoder, lookahead: int) -> tuple[np.ndarray, np.ndarray]:
    """``(draft passes, tokens scored)``, ``(K + 1,)`` int arrays: the decoder's
    ``call_work(d)`` for a call drafting ``d = 0..K`` levels."""
    passes, scored = zip(*(decoder.call_work(d) for d in range(lookahead + 1)))
    return np.asarray(passes, np.int64), np.asarray(scored, np.int64)


def call_depths(lookahead: int, horizon: int) -> np.ndarray:
    """``(T,)`` int array: the levels ``min(K, T - n + 1)`` a call at ``n = 1..T`` drafts."""
    return np.minimum(lookahead, horizon - np.arange(horizon))


def call_works(decoder, horizon: int, lookahead: int) -> tuple[np.ndarray, np.ndarray]:
    """``(draft passes, tokens scored)``, ``(T,)`` int arrays, of a call starting at each
    position ``n = 1..T``: the decoder's ``call_work(min(K, T - n + 1))``."""
    passes, scored = depth_works(decoder, lookahead)
    depth = call_depths(lookahead, horizon)
    return passes[depth], scored[depth]


def _check_cost(cost) -> None:
    if not isinstance(cost, CostModel):
        raise ValueError(f"cost must be a specjax.CostModel, got {type(cost).__name__} "
                         f"{cost!r}"[:300])


def decoding_time(decoder, draft, target, cost: CostModel, *,
                  horizon: int | None = None) -> DecodingTime:
    """The expected time, speed-up and work of ``decoder`` under the cost model ``cost``.

    Args:
      decoder: any decoder value (``specjax.Speculative(lookahead=4)``,
        ``specjax.TokenTree((4, 2, 1))``, ...).
      draft: the draft model ``p`` (``None`` for ``Autoregressive()``).
      target: the target model ``q``.
      cost: a ``CostModel``.
      horizon: ``T`` for ``FiniteStateModel``s (as ``exact``).

    Returns:
      ``DecodingTime``.

    Raises:
      ValueError: what ``exact`` raises; ``cost`` not a ``CostModel``; a ``target_cost`` table
        too short for the tokens a call of ``decoder`` scores; a decoder whose calls have no
        finite work (``num_drafts=math.inf``).

    Example:
      >>> import specjax
      >>> draft, target = specjax.paper_instance()
      >>> cost = specjax.CostModel(draft_cost=0.1, target_cost=1.0)
      >>> t = specjax.theory.decoding_time(specjax.Speculative(lookahead=4), draft, target, cost)
      >>> round(float(t.speedup), 3)
      1.479
    """
    check_decoder(decoder)
    _check_cost(cost)
    decoder, draft, target, _, num_positions, lookahead = plan_run(
        decoder, draft, target, engine="exact", horizon=horizon)
    if isinstance(decoder, CallDecoder) and decoder.has_drafted_call_law:  # a random length
        weights, new_call = drafted_law(decoder, draft, target, lookahead)
        passes, scored = depth_works(decoder, lookahead)
    else:  # a call at n does call_work(min(K, T - n + 1))
        passes, scored = call_works(decoder, num_positions, lookahead)
        new_call = exact(decoder, draft, target, horizon=horizon).new_call
        weights = None
    times = np.asarray([cost.call_time(draft_passes=int(d), tokens_scored=int(s))
                        for d, s in zip(passes, scored)])
    dtype = new_call.dtype
    # The per-call numbers in the models' dtype on the host: jnp.asarray would compile a
    # conversion per shape.
    times, passes, scored = (np.asarray(x, dtype) for x in (times, passes, scored))
    ar_time = np.asarray(num_positions * (cost.target_time(1) + cost.call_overhead), dtype)
    return _summary(new_call, weights, times, passes, scored, ar_time,
                    num_positions=num_positions)


@functools.partial(jax.jit, static_argnames=("num_positions",))
def _summary(new_call, weights, times, passes, scored, ar_time, *, num_positions):
    """``decoding_time``'s ``DecodingTime`` from the call law (one program, not one per
    operation): ``new_call`` ``(T,)``, ``weights`` ``(T, K + 1)`` for a random draft length
    (else ``None``), the per-call work ``(T,)`` or ``(K + 1,)``."""

    def total(per_call):
        return jnp.sum(new_call * per_call if weights is None else weights @ per_call, axis=-1)

    expected_time = total(times)
    call_time = times if weights is None else safe_ratio(weights @ times, new_call, 0)
    return DecodingTime(
        expected_time=expected_time,
        autoregressive_time=ar_time,
        speedup=ar_time / expected_time,
        tokens_per_time=num_positions / expected_time,
        expected_calls=jnp.sum(new_call, axis=-1),
        expected_draft_passes=total(passes),
        expected_tokens_scored=total(scored),
        call_time=call_time)


def drafted_law(decoder, draft, target, lookahead: int):
    """``(drafted (T, K + 1), new_call (T,))`` of a decoder whose calls draft a random number of
    tokens (``drafted_call_law_from``): ``drafted[n - 1, d]`` = P(a call starts at ``n`` and drafts
    exactly ``d``)."""
    from specjax.models.markov import MarkovChain  # noqa: PLC0415
    from specjax.theory import calls  # noqa: PLC0415

    if not isinstance(target, MarkovChain):
        raise ValueError(f"{type(decoder).__name__} has exact values on MarkovChain models only, "
                         f"got {type(target).__name__}")
    # The depths too, as engine_metrics asks for them: one compiled program serves both.
    result, _, drafted = calls.forward_calls(decoder, draft, target, lookahead=lookahead,
                                             with_depths=True, with_drafted=True)
    return drafted, result.new_call


def expected_time(decoder, draft, target, cost: CostModel, *, horizon: int | None = None):
    """Expected wall-clock time to decode the ``T`` tokens: ``decoding_time(...).expected_time``
    (in the cost model's unit; with ``target_cost = 1``, in target calls).

    Example:
      >>> import specjax
      >>> draft, target = specjax.paper_instance()
      >>> cost = specjax.CostModel(0.0, 1.0)  # free drafts: the time is the number of calls
      >>> sd = specjax.Speculative(lookahead=4)
      >>> bool(abs(specjax.expected_time(sd, draft, target, cost)
      ...          - specjax.exact(sd, draft, target).expected_calls) < 1e-4)
      True
    """
    return decoding_time(decoder, draft, target, cost, horizon=horizon).expected_time


class LookaheadChoice(NamedTuple):
    """The best fixed lookahead under a cost model.

    Attributes:
      lookahead: the ``K`` of least expected time (``0``: autoregressive decoding is fastest).
      expected_time: its expected time.
      times: ``(max_lookahead + 1,)``, the expected time of every ``K = 0..max_lookahead``.
    """

    lookahead: int
    expected_time: float
    times: np.ndarray


def best_lookahead(draft, target, cost: CostModel, *, max_lookahead: int, decoder=None,
                   horizon: int | None = None) -> LookaheadChoice:
    """The fixed lookahead ``K`` of least expected time, by exact evaluation of every ``K``.

    Args:
      draft, target: the models.
      cost: a ``CostModel``.
      max_lookahead: the largest ``K`` tried, a positive int; ``K = 0`` is autoregressive
        decoding; past the horizon ``T`` nothing changes, so the sweep stops at ``T``.
      decoder: the decoder whose ``lookahead`` field is varied (default
        ``specjax.Speculative()``; any decoder with a ``lookahead`` field, e.g.
        ``specjax.BatchSpeculative(4)``).
      horizon: ``T`` for ``FiniteStateModel``s.

    Returns:
      ``LookaheadChoice(lookahead, expected_time, times)``; ties go to the smaller ``K``.

    Example:
      >>> import specjax
      >>> draft, target = specjax.paper_instance()
      >>> choice = specjax.theory.best_lookahead(draft, target, specjax.CostModel(0.1, 1.0),
      ...                                 max_lookahead=6)
      >>> choice.lookahead
      3
    """
    _check_cost(cost)
    num_positions = plan_run(Autoregressive(), None, target, engine="exact", horizon=horizon)[4]
    return sweep_lookahead(
        decoder, max_lookahead, check_decoder,
        lambda d: expected_time(d, draft if d.uses_draft else None, target, cost,
                                horizon=horizon), horizon=num_positions)


def sweep_lookahead(decoder, max_lookahead: int, check, time_of, *,
                    horizon: int | None = None) -> LookaheadChoice:
    """The ``K = 0..max_lookahead`` of least ``time_of(decoder with lookahead K)`` (``K = 0``:
    ``Autoregressive()``), ties to the smaller ``K``; ``decoder`` (default ``Speculative()``)
    is checked with ``check`` first. Shared by ``best_lookahead`` here (exact times) and
    ``specjax.pairs.best_lookahead`` (times estimated from a recording). With ``horizon`` ``T``,
    the sweep stops at ``min(max_lookahead, T)``: a ``K`` past ``T`` drafts as ``K = T`` does
    (its time is ``T``'s), so ``times`` has ``min(max_lookahead, T) + 1`` entries."""
    from specjax.decoders.speculative import Speculative  # noqa: PLC0415

    _checks.check_static_int("max_lookahead", max_lookahead)
    if max_lookahead < 1:
        raise ValueError(f"max_lookahead must be a positive int, got {max_lookahead}")
    decoder = Speculative() if decoder is None else decoder
    check(decoder)
    if not decoder.varies_lookahead:
        raise ValueError(f"decoder must have a lookahead to vary, got {type(decoder).__name__}")
    times = [float(time_of(Autoregressive()))]
    last = max_lookahead if horizon is None else min(max_lookahead, horizon)
    for k in range(1, last + 1):
        times.append(float(time_of(decoder.with_lookahead(k))))
    times = np.asarray(times)
    best = int(np.argmin(times))
    return LookaheadChoice(lookahead=best, expected_time=float(times[best]), times=times)


class TreeBudgetChoice(NamedTuple):
    """The token-tree budget of least expected time under a cost model.

    Attributes:
      budget: the number of nodes (root included; ``1``: autoregressive decoding is fastest).
      parents: the chosen tree's parent array (``(-1,)`` for ``budget = 1``).
      expected_time: its exact expected time.
      times: ``(max_budget,)``, the exact expected time of the tree of every budget
        ``1..max_budget``.
      trees: the parent array of every budget's tree.
    """

    budget: int
    parents: tuple
    expected_time: float
    times: np.ndarray
    trees: tuple


def best_tree_budget(draft, target, cost: CostModel, *, max_budget: int, max_depth: int,
                     children: str = "iid", num_children: int = 8) -> TreeBudgetChoice:
    """The best token-tree budget for a cost model: Sequoia's tree of every budget, timed
    exactly on the chains.

    For each budget ``n = 2..max_budget``, the tree is Sequoia's (``sequoia_tree`` on the
    chains' exact ``positional_acceptance`` with ``num_children`` ranks, depth at most
    ``max_depth``); its expected time is ``expected_time(TokenTree.from_parents(parents,
    children=children), ...)``, exact on the actual context-dependent chains (not Sequoia's
    positional prediction, which ``sequoia_hardware_tree`` optimises). Budget 1 is
    autoregressive decoding.

    Args:
      draft, target: ``MarkovChain``s (concrete).
      cost: a ``CostModel``; a ``target_cost`` table needs entries up to ``max_budget``.
      max_budget: the largest tree tried (nodes, root included), an int ``>= 2``.
      max_depth: the most drafted tokens on a path, a positive int.
      children: ``"iid"``, ``"without_replacement"`` or ``"top_k"``, as in ``TokenTree``.
      num_children: the length of the positional acceptance vector (Sequoia estimates a few
        ranks; children of later ranks are never accepted by the dynamic program's reckoning).

    Returns:
      ``TreeBudgetChoice``; ties go to the smaller budget.

    Each budget's tree is a new static shape, so ``exact`` compiles once per budget (about 3 s
    each on a 2-core CPU); keep ``max_budget`` to the range you need.

    Example:
      >>> import specjax
      >>> draft, target = specjax.paper_instance()
      >>> cost = specjax.CostModel(0.1, [0.0] + [1.0 + 0.05 * n for n in range(1, 7)])
      >>> choice = specjax.theory.best_tree_budget(draft, target, cost, max_budget=4, max_depth=3)
      >>> choice.budget, choice.parents
      (3, (-1, 0, 1))
    """
    from specjax.decoders.tree import TokenTree  # noqa: PLC0415
    from specjax.theory.tree_shapes import sequoia_tree  # noqa: PLC0415
    from specjax.theory.trees import positional_acceptance  # noqa: PLC0415

    _check_cost(cost)
    _checks.check_static_int("max_budget", max_budget)
    if max_budget < 2:
        raise ValueError(f"max_budget must be an int >= 2 (the root and one draft), got "
                         f"{max_budget}")
    _checks.check_static_int("max_depth", max_depth)
    if max_depth < 1:
        raise ValueError(f"max_depth must be a positive int, got {max_depth}")
    _checks.check_static_int("num_children", num_children)
    if num_children < 1:
        raise ValueError(f"num_children must be a positive int, got {num_children}")
    if cost.max_tokens < max_budget:
        cost.target_time(max_budget)  # raises the table's ValueError
    acceptance = np.asarray(positional_acceptance(draft, target, num_children=num_children,
                                                  children=children), np.float64)
    times = [float(expected_time(Autoregressive(), None, target, cost))]
    trees = [(-1,)]
    for budget in range(2, max_budget + 1):
        _, parents = sequoia_tree(np.clip(acceptance, 0, 1), budget=budget,
                                  max_depth=max_depth)
        tree = TokenTree.from_parents(parents, children=children)
        times.append(float(expected_time(tree, draft, target, cost)))
        trees.append(tuple(int(x) for x in parents))
    times = np.asarray(times)
    best = int(np.argmin(times))
    return TreeBudgetChoice(budget=best + 1, parents=trees[best],
                            expected_time=float(times[best]), times=times, trees=tuple(trees))
