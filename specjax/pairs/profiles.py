"""Acceptance profiles: the per-position acceptance vector serving engines report.

vLLM counts, over a run, the speculation rounds (``num_drafts``: target calls that drafted) and,
per draft position ``i``, the rounds whose ``i``-th draft was accepted
(``num_accepted_tokens_per_pos[i - 1]``); SGLang and llama.cpp keep the same counters under other
names. Their ratio ``a_i = accepted[i - 1] / num_drafts`` is the *profile*: the fraction of calls
that kept at least ``i`` drafts (it is ``EngineMetrics.acceptance_per_position``, which
``specjax.theory.engine_metrics`` gives exactly and ``specjax.estimate`` from a recording;
``acceptance_profile`` reads it off either).

From a profile measured at lookahead ``K``, a call that drafts ``K' <= K`` tokens keeps
``sum_{i <= K'} a_i`` of them on average and emits one more, so under a ``CostModel``

    tokens per time (K') = (1 + sum_{i <= K'} a_i) / call_time(K' draft passes, K' + 1 tokens),

and ``profile_lookahead`` picks the best ``K'``; ``profile_tree`` gives Sequoia's best tree budget
from a positional (by child rank) acceptance vector.

**What a profile cannot determine.**

* *Marginal, not conditional.* ``a_i`` averages over every context a call started in; the
  conditional rates ``a_i / a_{i-1}`` are ratios of those averages, not the acceptance of any
  context, and an i.i.d. per-token rate (Leviathan's ``a``) is identified only if acceptance
  does not vary with the context. Two pairs with the same profile can have different expected
  rejections under another decoder (a multi-draft root, a tree with more than one child per
  node), which depends on the rows, not on the profile.
* *Other lookaheads only approximately.* Changing ``K`` changes where calls start, hence the
  contexts the profile averages over; ``a_1..a_{K'}`` at ``K`` is the profile at ``K'`` only when
  acceptance does not depend on the context. Nothing is known past ``K``. The horizon's end (calls
  that draft fewer tokens) is ignored: these are long-run, per-call values.
* *Per-step vs per-request means.* Engines' counters are summed over every step of every request:
  the ratio of sums weights requests by their number of calls. A mean of per-request ratios (what
  a dashboard averaging requests shows) is another number, and neither gives the variance between
  requests, so no standard error: a recording (``specjax.estimate``) gives both.
* *Time.* The profile has no costs in it; the best ``K`` is only as good as the ``CostModel``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from specjax import _checks
from specjax.theory.cost import CostModel
from specjax.theory.metrics import EngineMetrics
from specjax.theory.tree_shapes import SequoiaChoice
from specjax.theory.tree_shapes import sequoia_hardware_tree

__all__ = [
    "ProfileChoice",
    "acceptance_profile",
    "profile_accepted_length",
    "profile_lookahead",
    "profile_tree",
    "read_profile",
]


class ProfileChoice(NamedTuple):
    """The best lookahead for an acceptance profile under a cost model (long-run, per call).

    Attributes:
      lookahead: the ``K'`` of most tokens per time (``0``: autoregressive decoding).
      tokens_per_time: ``(K + 1,)``, ``(1 + sum_{i <= K'} a_i) / call_time(K')`` for every
        ``K' = 0..K``.
      tokens_per_call: ``(K + 1,)``, ``1 + sum_{i <= K'} a_i``.
      speedup: the best ``tokens_per_time`` over autoregressive decoding's.
    """

    lookahead: int
    tokens_per_time: np.ndarray
    tokens_per_call: np.ndarray
    speedup: float


def read_profile(num_accepted_tokens_per_pos, num_drafts) -> np.ndarray:
    """The profile ``a_i = num_accepted_tokens_per_pos[i - 1] / num_drafts`` from an engine's
    counters (vLLM's names; SGLang's and llama.cpp's counters are the same counts).

    Args:
      num_accepted_tokens_per_pos: ``(K,)`` counts: rounds whose ``i``-th draft was accepted;
        non-increasing (a round that kept ``i + 1`` drafts kept ``i``).
      num_drafts: the number of speculation rounds, at least the first count.

    Returns:
      ``(K,)`` float64 NumPy array in ``[0, 1]``, non-increasing.

    Raises:
      ValueError: not a non-empty 1-D vector of finite non-negative counts, counts that
        increase with the position, or ``num_drafts`` below the first count or not positive.

    Example:
      >>> import specjax.pairs
      >>> print(*specjax.pairs.read_profile([800, 500, 300], 1000))
      0.8 0.5 0.3
    """
    counts = np.asarray(num_accepted_tokens_per_pos, np.float64)
    if counts.ndim != 1 or counts.size == 0:
        raise ValueError(f"num_accepted_tokens_per_pos must be a non-empty 1-D vector (one count "
                         f"per draft position), got shape {counts.shape}")
    if not np.isfinite(counts).all() or (counts < 0).any():
        raise ValueError("num_accepted_tokens_per_pos must hold finite non-negative counts")
    if (np.diff(counts) > 0).any():
        raise ValueError(f"num_accepted_tokens_per_pos must not increase with the position (a "
                         f"round that kept i + 1 drafts kept i), got {counts.tolist()}")
    rounds = _checks.check_finite_non_negative("num_drafts", num_drafts)
    if rounds <= 0 or rounds < counts[0]:
        raise ValueError(f"num_drafts must be positive and at least the first count "
                         f"{counts[0]:g}, got {num_drafts!r}")
    return counts / rounds


def acceptance_profile(result) -> np.ndarray:
    """The profile of an exact or estimated result, as an engine would report it.

    Args:
      result: ``specjax.theory.engine_metrics(...)`` (exact) or ``specjax.estimate(...)``.

    Returns:
      ``(K,)`` float64 NumPy array: ``acceptance_per_position``.

    Example:
      >>> import specjax
      >>> draft, target = specjax.paper_instance()
      >>> m = specjax.theory.engine_metrics(specjax.Speculative(lookahead=3), draft, target)
      >>> print(*[round(float(a), 3) for a in specjax.pairs.acceptance_profile(m)])
      0.546 0.292 0.156
    """
    from specjax.pairs.estimate import Estimate  # noqa: PLC0415

    if isinstance(result, Estimate):
        result = result.metrics
    if not isinstance(result, EngineMetrics):
        raise ValueError(f"result must be specjax.theory.engine_metrics(...) or "
                         f"specjax.estimate(...), got {type(result).__name__}")
    return np.asarray(result.acceptance_per_position, np.float64)


def _check_profile(profile) -> np.ndarray:
    a = np.asarray(profile, np.float64)
    if a.ndim != 1 or a.size == 0 or not np.isfinite(a).all() or (a < 0).any() or (a > 1).any():
        raise ValueError(f"profile must be a non-empty 1-D vector of rates in [0, 1], got "
                         f"{np.asarray(profile)!r}"[:300])
    if (np.diff(a) > 0).any():
        i = int(np.argmax(np.diff(a) > 0))
        raise ValueError(f"profile must not increase with the position (a call that kept i + 1 "
                         f"drafts kept i, so a_(i+1) <= a_i), got a_{i + 1} = {a[i]:g} < "
                         f"a_{i + 2} = {a[i + 1]:g}: is it conditional rates (a_i / a_(i-1)) "
                         f"rather than the fraction of calls keeping at least i drafts?")
    return a


def profile_accepted_length(profile, lookahead: int | None = None) -> float:
    """Expected drafts kept per call, ``sum_{i <= K'} a_i`` (``K'`` = ``lookahead``, default the
    profile's length); vLLM's mean acceptance length is one more.

    Example:
      >>> import specjax.pairs
      >>> round(specjax.pairs.profile_accepted_length([0.8, 0.5, 0.3], 2), 3)
      1.3
    """
    a = _check_profile(profile)
    if lookahead is None:
        return float(a.sum())
    _checks.check_static_non_negative_int("lookahead", lookahead)
    if lookahead > a.size:
        raise ValueError(f"lookahead {lookahead} is past the profile's {a.size} positions: a "
                         f"profile says nothing of drafts it did not measure")
    return float(a[:lookahead].sum())


def profile_lookahead(profile, cost: CostModel) -> ProfileChoice:
    """The best lookahead ``K' <= K`` for a profile under a cost model (module docstring: what
    this assumes).

    Example:
      >>> import specjax
      >>> choice = specjax.pairs.profile_lookahead([0.8, 0.6, 0.45, 0.3, 0.2],
      ...                                          specjax.CostModel(0.1, 1.0))
      >>> choice.lookahead, round(choice.speedup, 3)
      (4, 2.25)
    """
    a = _check_profile(profile)
    if not isinstance(cost, CostModel):
        raise ValueError(f"cost must be a specjax.CostModel, got {cost!r}"[:300])
    tokens = 1 + np.concatenate([[0.0], np.cumsum(a)])
    times = np.asarray([cost.call_time(draft_passes=k, tokens_scored=k + 1)
                        for k in range(a.size + 1)])
    rate = tokens / times
    best = int(np.argmax(rate))
    return ProfileChoice(lookahead=best, tokens_per_time=rate, tokens_per_call=tokens,
                         speedup=float(rate[best] / rate[0]))


def profile_tree(acceptance_by_rank, cost: CostModel, *, max_budget: int,
                 max_depth: int) -> SequoiaChoice:
    """Sequoia's best tree budget and depth for a positional acceptance vector under a cost model
    (``specjax.theory.sequoia_hardware_tree`` with the model's draft cost and its target cost
    plus overhead per call).

    A per-depth profile of chains (``read_profile``) is not a positional vector: it says how
    deep a chain's drafts survive, not how often the second-ranked child of a node would be the
    accepted one. Give the per-rank acceptance (Sequoia's measurement, or
    ``specjax.theory.positional_acceptance`` on models); with the rank-1 entry alone the trees
    are chains.

    Example:
      >>> import specjax
      >>> cost = specjax.CostModel(0.05, [0.0] + [1.0 + 0.02 * n for n in range(1, 17)])
      >>> choice = specjax.pairs.profile_tree([0.6, 0.2, 0.1], cost, max_budget=16,
      ...                                     max_depth=4)
      >>> choice.budget, choice.depth
      (13, 3)
    """
    if not isinstance(cost, CostModel):
        raise ValueError(f"cost must be a specjax.CostModel, got {cost!r}"[:300])
    _checks.check_static_int("max_budget", max_budget)
    if cost.max_tokens < max_budget:
        cost.target_time(max_budget)  # raises the table's ValueError
    table = [0.0] + [cost.target_time(n) + cost.call_overhead for n in range(1, max_budget + 1)]
    return sequoia_hardware_tree(acceptance_by_rank, draft_cost=cost.draft_cost,
                                 target_cost=table, max_budget=max_budget, max_depth=max_depth)
