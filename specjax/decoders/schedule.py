"""HuggingFace's draft-length schedule: the lookahead carried from one call to the next.

``HeuristicSchedule(initial, max_lookahead=K)`` is speculative decoding whose lookahead ``k``
changes between calls, as ``transformers``' assisted generation does with
``num_assistant_tokens_schedule="heuristic"`` (``AssistedCandidateGenerator.
update_candidate_strategy``): the first call drafts ``initial`` tokens; after a call whose ``k``
drafts were all accepted the next one drafts ``k + 2``, after any rejection ``max(1, k - 1)``.
HuggingFace has no upper bound (its ``max_length`` truncates); here ``k`` stays in
``[minimum, K]`` so that the schedule has finitely many states. ``increase``, ``decrease`` and
``minimum`` generalise the rule. Each call is SD with lookahead ``min(k, T - n + 1)``: draft, verify
token by token with ``min(1, q / p)``, resample ``[q - p]_+`` on the first rejection, the target's
bonus token when all are kept. So the output law is the target's.

Unlike every other decoder, a call depends on more than the previous token: the draft length is
a *call state* carried across calls (``CallDecoder``'s ``num_call_states``,
``initial_call_state``, ``next_call_state``). The sampler carries it per chain; the exact
recursion carries the mass of call starts per (state, previous token), ``K - minimum + 1`` states,
and builds each state's call law as the chain tree ``TokenTree((1,) * k)`` does (``O(k V^2)``).
``specjax.decoding_time``, ``specjax.engine_metrics`` and ``specjax.stationary_rate`` read the
drafted length from the state.

References:
  HuggingFace ``transformers``, ``generation/candidate_generator.py`` (the "heuristic"
  schedule; the blog post "Assisted generation", Gante 2023); Leviathan, Kalman & Matias 2023.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax import _checks
from specjax.decoders.adaptive import AdaptiveSpeculative
from specjax.decoders.adaptive import StoppingRule
from specjax.decoders.base import CallDecoder
from specjax.decoders.base import CallLaw
from specjax.decoders.base import pytree_dataclass
from specjax.decoders.tree import TokenTree


@pytree_dataclass
class HeuristicSchedule(CallDecoder):
    """SD whose lookahead goes up by ``increase`` after a call that kept every draft and down by
    ``decrease`` after a rejection (HuggingFace's "heuristic" schedule: +2 / -1).

    Attributes:
      initial: the first call's lookahead (HuggingFace's ``num_assistant_tokens``; its default
        is 20, older versions 5), in ``[minimum, max_lookahead]``.
      max_lookahead: ``K``, the largest lookahead (keyword).
      increase: added after a call whose drafts were all kept (default 2).
      decrease: subtracted after a rejection (default 1).
      minimum: the smallest lookahead (default 1).

    All settings are static ints. The output law is the target's.

    Example:
      >>> import specjax
      >>> draft, target = specjax.paper_instance()
      >>> hf = specjax.HeuristicSchedule(5, max_lookahead=8)
      >>> round(float(specjax.exact(hf, draft, target).expected_calls), 3)
      27.051

    References:
      HuggingFace ``transformers`` (``num_assistant_tokens_schedule="heuristic"``).
    """

    initial: int
    _: dataclasses.KW_ONLY
    max_lookahead: int
    increase: int = 2
    decrease: int = 1
    minimum: int = 1

    def __post_init__(self):
        _checks.check_static_int("initial", self.initial)
        _checks.check_static_int("max_lookahead", self.max_lookahead)
        _checks.check_static_int("minimum", self.minimum)
        _checks.check_static_non_negative_int("increase", self.increase)
        _checks.check_static_non_negative_int("decrease", self.decrease)
        if self.minimum > self.max_lookahead:
            raise ValueError(f"minimum must be at most max_lookahead = {self.max_lookahead}, "
                             f"got {self.minimum}")
        if not self.minimum <= self.initial <= self.max_lookahead:
            raise ValueError(f"initial must be in [minimum, max_lookahead] = [{self.minimum}, "
                             f"{self.max_lookahead}], got {self.initial}")

    @property
    def lookahead(self) -> int:
        return self.max_lookahead

    def truncate(self, lookahead: int) -> "HeuristicSchedule":
        del lookahead  # sample_call stops at the horizon by itself
        return self

    @property
    def label(self) -> str:
        return (f"HF schedule (+{self.increase} / -{self.decrease}, K from {self.initial}, "
                f"in [{self.minimum}, {self.max_lookahead}])")

    # --- the call state: s = k - minimum --------------------------------------------------------

    @property
    def num_call_states(self) -> int:
        return self.max_lookahead - self.minimum + 1

    @property
    def initial_call_state(self) -> int:
        return self.initial - self.minimum

    def next_call_state(self, state, kept):
        """The state after a call in ``state`` that kept ``kept`` drafts (Python ints, for the
        exact recursion, or arrays, for the sampler)."""
        k = state + self.minimum
        up, down = k + self.increase, k - self.decrease
        if isinstance(state, int) and isinstance(kept, int):
            k = min(up, self.max_lookahead) if kept >= k else max(down, self.minimum)
        else:
            k = jnp.where(kept >= k, jnp.minimum(up, self.max_lookahead),
                          jnp.maximum(down, self.minimum))
        return k - self.minimum

    def _lookahead_of(self, state: int) -> int:
        return int(state) + self.minimum

    # --- sampler ------------------------------------------------------------------------------

    @property
    def num_uniforms(self) -> int:
        return 2 * self.max_lookahead + 1

    def _chain_call(self, length=None) -> AdaptiveSpeculative:
        """SD drafting ``length`` tokens (traced), as an adaptive call whose rule stops there."""
        rule = StoppingRule(lambda state: state.depth >= length, name="schedule")
        return AdaptiveSpeculative(rule, max_lookahead=self.max_lookahead)

    def prepare(self, draft, target):
        return self._chain_call().prepare(draft, target)

    def sample_call(self, tables, n, prev, u, *, state=0):
        """One call in ``state`` (lookahead ``state + minimum``), as SD with that lookahead."""
        return self._chain_call(state + self.minimum).sample_call(tables, n, prev, u)

    # --- exact law ------------------------------------------------------------------------------

    def _chain_law(self, law_of_tree, p_rows, q_rows, bonus_row, with_bonus, state):
        """A call in ``state`` drafts ``d = min(k, K')`` of the ``K'`` rows: the chain tree's law
        on the first ``d`` rows (its bonus from row ``d`` when ``d < K'``), padded to ``K'``."""
        depth = p_rows.shape[0]
        d = min(self._lookahead_of(state), depth)
        if d < depth:
            bonus_row, with_bonus = q_rows[d], True
        law = law_of_tree(TokenTree((1,) * d), p_rows[:d], q_rows[:d], bonus_row, with_bonus)
        pad = [(0, depth - d)] + [(0, 0)] * (law.kept.ndim - 1)
        return CallLaw(*(jnp.pad(x, pad) for x in law))

    def call_law(self, p_rows, q_rows, bonus_row, *, with_bonus: bool,
                 state: int = 0) -> CallLaw:
        """The law of one call in (static) ``state`` for every previous token: SD with lookahead
        ``min(k, K')``, fields ``(K', V, V)`` and ``(K' + 1, V, V)``."""
        return self._chain_law(
            lambda tree, p, q, b, w: tree.call_law(p, q, b, with_bonus=w),
            p_rows, q_rows, bonus_row, with_bonus, state)

    def call_law_from(self, start, p_rows, q_rows, bonus_row, *, with_bonus: bool,
                      state: int = 0) -> CallLaw:
        return self._chain_law(
            lambda tree, p, q, b, w: tree.call_law_from(start, p, q, b, with_bonus=w),
            p_rows, q_rows, bonus_row, with_bonus, state)

    def drafted_call_law_from(self, start, p_rows, q_rows, bonus_row, *, with_bonus: bool,
                              state: int = 0) -> tuple[CallLaw, jax.Array]:
        """``(call_law_from(...), drafted)``: a call in ``state`` drafts ``min(k, K')`` tokens."""
        law = self.call_law_from(start, p_rows, q_rows, bonus_row, with_bonus=with_bonus,
                                 state=state)
        depth = p_rows.shape[0]
        drafted = jnp.zeros((depth + 1,), law.kept.dtype)
        drafted = drafted.at[min(self._lookahead_of(state), depth)].set(jnp.sum(start))
        return law, drafted
