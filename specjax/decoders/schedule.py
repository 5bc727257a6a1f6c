"""HuggingFace's draft-length schedule: the lookahead carried from one call to the next.

``HeuristicSchedule(initial, max_lookahead=K)`` is speculative decoding whose lookahead ``k``
changes between calls, as ``transformers``' assisted generation does with
``num_assistant_tokens_schedule="heuristic"`` (``AssistedCandidateGenerator.
update_candidate_strategy``): the first call drafts ``initial`` tokens; after a call whose ``k``
drafts were all accepted the next one drafts ``k + 2``, after any rejection ``max(1, k - 1)``.
HuggingFace has no upper bound (its ``max_length`` truncates); here ``k`` stays in
``[minimum, K]`` so that the schedule has finitely many states. ``increase``, ``decrease`` and
``minimum`` generalise the rule. Each call is SD with lookahead ``min(k, T - n + 1)`` (near the
end HuggingFace drafts at most ``T - n``, keeping room for the target's extra token, and nothing at
the last position; specjax's calls fill the horizon as every decoder here does, so the last call's
cost may differ; the schedule's state is unaffected): draft, verify
token by token with ``min(1, q / p)``, resample ``[q - p]_+`` on the first rejection, the target's
bonus token when all are kept. So the output law is the target's.

Unlike every other decoder, a call depends on more than the previous token: the draft length is
a *call state* carried across calls (``CallDecoder``'s ``num_call_states``,
``initial_call_state``, ``next_call_state``). The sampler carries it per chain; the exact
recursion carries the mass of call starts per (state, previous token), ``K - minimum + 1`` states,
and builds every state's call law at once (vectorised over the state, which is traced), SD's
rule on the first ``k`` levels, ``O(K V^2)`` per state. The last ``K`` positions are traced one by
one (static shapes), so compiling the exact values grows with ``K``: 1.3 s at ``K = 5``, 3.7 s at
``K = 10``, 16 s at ``K = 20`` (``V = 8``, ``T = 64``, 2-core CPU; ``Speculative(lookahead=K)``
takes under a second).
``specjax.theory.decoding_time``, ``specjax.theory.engine_metrics`` and
``specjax.theory.stationary_rate`` read the drafted length from the state.

References:
  HuggingFace ``transformers``, ``generation/candidate_generator.py`` (the "heuristic"
  schedule; the blog post "Assisted generation", Gante 2023); Leviathan, Kalman & Matias 2023.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax.decoders.adaptive import AdaptiveSpeculative
from specjax.decoders.adaptive import StoppingRule
from specjax.decoders.base import CallDecoder
from specjax.decoders.base import CallLaw
from specjax.decoders.base import DepthPlan
from specjax.decoders.base import pytree_dataclass
from specjax.decoders.verification import speculative_law
from specjax.numerics import matmul_highest

__all__ = ["HeuristicSchedule"]


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
      >>> hf = specjax.decoders.HeuristicSchedule(4, max_lookahead=4)
      >>> round(float(specjax.exact(hf, draft, target).expected_calls), 3)
      27.513

    References:
      HuggingFace ``transformers`` (``num_assistant_tokens_schedule="heuristic"``).
    """

    initial: int
    _: dataclasses.KW_ONLY
    max_lookahead: int
    increase: int = 2
    decrease: int = 1
    minimum: int = 1
    recording_reads = "path_rows"  # SD's calls; the call state is known given the output

    @classmethod
    def example_cases(cls) -> dict:
        return {"HF schedule from 1, K<=3": cls(1, max_lookahead=3)}

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

    def depth_plan(self, horizon: int) -> DepthPlan:
        """The call-depth filter's plan (``specjax.pairs.adaptive``): in state ``s`` a call drafts
        ``min(k, T - n + 1)`` tokens, ``k = s + minimum``; its state moves up after a call that
        kept them all and down after a rejection."""
        lookahead = self.resolve_lookahead(horizon)
        states = range(self.num_call_states)
        ks = [s + self.minimum for s in states]
        room = np.minimum(horizon - np.arange(horizon), lookahead)
        return DepthPlan(lookahead, tuple(min(k, lookahead) for k in ks),
                         tuple(int(self.next_call_state(s, k)) for s, k in zip(states, ks)),
                         tuple(int(self.next_call_state(s, k - 1)) for s, k in zip(states, ks)),
                         self.initial_call_state,
                         tuple(tuple(int(min(k, r)) for k in ks) for r in room), False)

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

    def _drafts(self, state, depth: int):
        """The drafts of a call in (traced) ``state`` on ``depth`` rows: ``min(k, K')``."""
        return jnp.minimum(jnp.asarray(state) + self.minimum, depth)

    def _chain_law(self, reach, p_rows, q_rows, bonus_row, with_bonus, state) -> CallLaw:
        """SD's call law with ``d = min(k, K')`` drafts on the ``K'`` rows, for a (traced)
        ``state``: levels below ``d`` verify by SD's rule (``verification.speculative_law``:
        keep ``min(p, q)``, reject into ``[q - p]_+``), level ``d`` draws the bonus token (from
        row ``d``, or ``bonus_row`` when ``d = K'``), deeper levels hold no mass. ``reach``:
        ``(..., V)``, the law of the previous token (``eye(V)`` per previous token)."""
        depth = p_rows.shape[0]
        drafts = self._drafts(state, depth)
        law = speculative_law(p_rows, q_rows)
        zeros = jnp.zeros_like(reach)
        kept, rejected, bonus = [], [], []
        for i in range(depth + 1):
            row = q_rows[i] if i < depth else (bonus_row if with_bonus else None)
            last = zeros if row is None else matmul_highest(reach, row)
            bonus.append(jnp.where(drafts == i, last, zeros))
            if i == depth:
                rejected.append(zeros)
                break
            going = i < drafts
            rejected.append(jnp.where(going, matmul_highest(reach, law.rejected[i]), zeros))
            reach = jnp.where(going, matmul_highest(reach, law.accepted[i]), zeros)
            kept.append(reach)
        return CallLaw(kept=jnp.stack(kept), rejected=jnp.stack(rejected),
                       bonus=jnp.stack(bonus))

    def call_law(self, p_rows, q_rows, bonus_row, *, with_bonus: bool,
                 state=0) -> CallLaw:
        """The law of one call in ``state`` (an int, or traced) for every previous token: SD
        with lookahead ``min(k, K')``, fields ``(K', V, V)`` and ``(K' + 1, V, V)``."""
        eye = jnp.eye(p_rows.shape[-1], dtype=q_rows.dtype)
        return self._chain_law(eye, p_rows, q_rows, bonus_row, with_bonus, state)

    def call_law_from(self, start, p_rows, q_rows, bonus_row, *, with_bonus: bool,
                      state=0) -> CallLaw:
        return self._chain_law(start.astype(q_rows.dtype), p_rows, q_rows, bonus_row,
                               with_bonus, state)

    def drafted_call_law_from(self, start, p_rows, q_rows, bonus_row, *, with_bonus: bool,
                              state=0) -> tuple[CallLaw, jax.Array]:
        """``(call_law_from(...), drafted)``: a call in ``state`` drafts ``min(k, K')`` tokens."""
        law = self.call_law_from(start, p_rows, q_rows, bonus_row, with_bonus=with_bonus,
                                 state=state)
        depth = p_rows.shape[0]
        drafted = jnp.where(jnp.arange(depth + 1) == self._drafts(state, depth), jnp.sum(start), 0)
        return law, drafted.astype(law.kept.dtype)
