"""Adaptive draft lengths: a stopping policy decides, before each draft, whether to call the target.

A call of ``AdaptiveSpeculative(policy, max_lookahead=K)`` from position ``n`` after token
``x_{n-1}`` drafts ``x_n, x_{n+1}, ...`` one at a time from the draft ``p``. Before drafting the
``(i + 1)``-th token it asks the policy whether to stop, from what is known at that moment
(``DraftState``): the call's position, the number ``i`` of drafts so far, the last drafted token
and its draft probability, the draft's next row (its entropy and largest probability) and, for
analysis, the exact probability ``A_i = prod_{j <= i} min(1, q_j / p_j)`` that every draft so
far will be accepted. At ``i = K`` or at the end of the horizon it stops. The ``d`` drafts are then
verified by speculative sampling, token by token: draft ``j`` is kept with probability
``min(1, q / p)``; the first rejection draws from ``[q - p]_+``; when all ``d`` are kept the target
adds its bonus token. So the output law is the target's whatever the policy, and a policy that
always drafts ``K`` tokens is SD with lookahead ``K`` (``FixedLength(K)``).

The policies of the field:

* ``RejectionThreshold(threshold)``: SpecDec++ (Huang, Guo & Wang 2024): stop once the probability
  that at least one draft so far is rejected exceeds the threshold, ``1 - A_i > threshold``
  (SpecDec++ predicts ``A_i`` with a trained head; here it is exact). Its released code keeps
  ``cum_acc_prob *= acc_prob`` and stops when ``1 - cum_acc_prob > stop_threshold``, default 0.3.
* ``EntropyThreshold(threshold)``: stop when the draft is unsure of the next token, the entropy
  (nats) of its next row above the threshold (the idea behind AdaEDL and SVIP, which bound the
  acceptance by the draft's entropy).
* ``ConfidenceThreshold(threshold)``: stop when the last drafted token's draft probability is below
  the threshold (HuggingFace's ``assistant_confidence_threshold`` stops drafting on the draft's
  low confidence).
* ``StoppingRule(fn)``: any function of the ``DraftState`` returning the stop flags.
* ``ThresholdTable(thresholds)``: stop iff ``A_i <= thresholds[n - 1, i, x]`` for a call started at
  ``n`` whose last drafted token is ``x``: the form of the optimal policy
  (``specjax.theory.optimal_stopping``).

The heuristics draft at least one token (they never stop at ``i = 0``); a user rule and a
threshold table may stop there, which makes the call autoregressive (one target token).

Exact values: the call law enumerates the drafted paths, ``V**(K' + 1)`` entries for ``K'``
drafts (refused beyond ``MAX_PATHS``): the mass of calls that reach depth ``i`` with a given path
is all that verification needs, because whether draft ``j`` is kept depends only on the path up to
``j``. ``drafted_call_law_from`` gives, from the same enumeration, the law of the number drafted,
from which ``specjax.theory.decoding_time`` takes the expected time of a call. Sampler: the
call-level engine; a call uses ``2K + 1`` uniforms (the drafts, their acceptances, the last token).

References:
  Huang, Guo & Wang 2024, "SpecDec++: Boosting speculative decoding via adaptive candidate
  lengths"; Leviathan, Kalman & Matias 2023 (the bonus token).
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax.decoders.base import CallDecoder
from specjax.decoders.base import CallLaw
from specjax.decoders.base import DepthPlan
from specjax.decoders.base import array_field
from specjax.decoders.base import pytree_dataclass
from specjax.decoders.draft_state import DraftState  # served from here
from specjax.decoders.draft_state import entropy  # served from here
from specjax.decoders.draws import bernoulli
from specjax.decoders.policies import POLICIES  # served from here
from specjax.decoders.policies import ConfidenceThreshold  # served from here
from specjax.decoders.policies import EntropyThreshold  # served from here
from specjax.decoders.policies import FixedLength  # served from here
from specjax.decoders.policies import RejectionThreshold  # served from here
from specjax.decoders.policies import StoppingPolicy  # served from here
from specjax.decoders.policies import StoppingRule  # served from here
from specjax.decoders.policies import ThresholdTable  # served from here
from specjax.decoders.draws import categorical_thresholds
from specjax.decoders.draws import draw
from specjax.decoders.verification import acceptance_probability
from specjax.decoders.verification import speculative_residual
from specjax.numerics import safe_ratio

__all__ = ["AdaptiveSpeculative", "ConfidenceThreshold", "DraftState", "EntropyThreshold",
           "FixedLength", "MAX_PATHS", "POLICIES", "RejectionThreshold", "StoppingPolicy",
           "StoppingRule", "ThresholdTable", "entropy"]

MAX_PATHS = 2**22  # largest number of (previous token, drafted path) entries the exact law holds


def _refuse_policy(policy):
    hint = " (wrap a function in specjax.decoders.StoppingRule(fn))" if callable(policy) else ""
    raise ValueError(f"policy must be a stopping policy such as "
                     f"specjax.decoders.RejectionThreshold(0.3){hint}, got {policy!r}")


def _lift(row: jax.Array, rank: int) -> jax.Array:
    """A ``(V, V)`` row over (last drafted token, next token) broadcast against paths of rank
    ``rank + 1`` (previous token, x_1, .., x_rank, next)."""
    return row.reshape((1,) * (rank - 1) + row.shape)


@pytree_dataclass
class AdaptiveSpeculative(CallDecoder):
    """Speculative decoding whose draft length a stopping policy chooses call by call.

    Attributes:
      policy: a ``StoppingPolicy`` value (``RejectionThreshold(0.3)``, ``EntropyThreshold(1.0)``,
        ``StoppingRule(fn)``, ...).
      max_lookahead: ``K``, the most drafts of a call (values above ``T`` act as ``T``). The exact
        values enumerate ``V**(K' + 1)`` (previous token, drafted path) entries per call and
        refuse more than ``2**22``.

    Example:
      >>> import specjax
      >>> draft, target = specjax.paper_instance()
      >>> policy = specjax.decoders.RejectionThreshold(0.3)
      >>> spec = specjax.AdaptiveSpeculative(policy, max_lookahead=4)
      >>> round(float(specjax.exact(spec, draft, target).expected_calls), 3)
      27.536

    References:
      Huang, Guo & Wang 2024 (SpecDec++); Leviathan et al. 2023.
    """

    policy: Any = array_field()  # a subtree: its numeric settings are traced, not static
    _: dataclasses.KW_ONLY
    max_lookahead: int
    uses_position = True
    recording_reads = "path_rows"  # the policy's state is on the emitted path

    @classmethod
    def example_cases(cls) -> dict:
        return {"adaptive SpecDec++ 0.3 K<=3": cls(RejectionThreshold(0.3), max_lookahead=3)}

    def __post_init__(self):
        # Unflattening may pass placeholders for the policy subtree; refuse only what is
        # plainly not a policy here, the rest in validate (before any work).
        if isinstance(self.policy, (numbers.Number, str, bytes)) or (
                callable(self.policy) and not isinstance(self.policy, StoppingPolicy)):
            _refuse_policy(self.policy)
        _checks.check_static_int("max_lookahead", self.max_lookahead)

    def validate(self) -> None:
        if not isinstance(self.policy, StoppingPolicy):
            _refuse_policy(self.policy)
        self.policy.validate()

    @property
    def lookahead(self) -> int:
        return self.max_lookahead

    def truncate(self, lookahead: int) -> "AdaptiveSpeculative":
        del lookahead  # sample_call stops at the horizon by itself
        return self

    def depth_plan(self, horizon: int) -> DepthPlan:
        """The call-depth filter's plan (``specjax.pairs.adaptive``): one call state, the policy
        asked before each draft, at most ``K' = min(K, T)`` drafts (``FixedLength``'s set when a
        call starts: ``min(L, K', T - n + 1)`` at position ``n``)."""
        lookahead = self.resolve_lookahead(horizon)
        drafts, length = None, self.policy.fixed_length
        if length is not None:
            room = np.minimum(horizon - np.arange(horizon), lookahead)
            drafts = tuple((int(d),) for d in np.minimum(room, length))
        return DepthPlan(lookahead, (lookahead,), (0,), (0,), 0, drafts,
                         drafts is None and lookahead == 1, self.policy)

    def stationary_form(self) -> "AdaptiveSpeculative":
        """The decoder with its policy's ``stationary_form()`` (a ``ThresholdTable``'s one row)."""
        policy = self.policy.stationary_form()
        return self if policy is self.policy else AdaptiveSpeculative(
            policy, max_lookahead=self.max_lookahead)

    @property
    def label(self) -> str:
        return f"adaptive SD ({self.policy.label}, K <= {self.max_lookahead})"

    @property
    def num_uniforms(self) -> int:
        return 2 * self.max_lookahead + 1

    def check_exact(self, num_states: int, horizon: int) -> None:
        """The exact law holds ``V**(K' + 1)`` entries, ``K' = min(K, T)``."""
        self.policy.check_shapes(horizon, min(self.max_lookahead, horizon), num_states)
        depth = min(self.max_lookahead, horizon)
        if num_states ** (depth + 1) > MAX_PATHS:
            raise ValueError(
                f"max_lookahead: the exact law of an adaptive call enumerates V**(K + 1) = "
                f"{num_states}**{depth + 1} drafted paths, beyond the bound {MAX_PATHS} (2**22); "
                "use a smaller max_lookahead or Monte Carlo (specjax.decode)")

    def prepare(self, draft, target):
        p, q = draft.trans, target.trans
        # Shapes are static: a table that does not fit the models raises here, while tracing.
        horizon, num_states = q.shape[0], q.shape[-1]
        self.policy.check_shapes(horizon, min(self.max_lookahead, horizon), num_states)
        return (categorical_thresholds(p), p, q, entropy(p), jnp.max(p, axis=-1))

    def sample_call(self, tables, n, prev, u):
        """One call of one chain from position ``n`` after ``prev``: ``u`` holds ``2K + 1``
        uniforms (drafts, acceptances, the last token)."""
        p_thr, p_trans, q_trans, ent, top = tables
        horizon = p_trans.shape[0]
        k = self.max_lookahead
        fits = jnp.clip(horizon - n + 1, 0, k)  # drafts that fit before the horizon
        dtype = p_trans.dtype
        x, prob, all_acc = prev, jnp.ones((), dtype), jnp.ones((), dtype)
        live, depth = jnp.ones((), bool), jnp.zeros((), jnp.int32)
        drafts, accept = [], []
        for i in range(k):
            row = jnp.clip(n - 1 + i, 0, horizon - 1)
            state = DraftState(position=n + i, depth=i, token=x, token_prob=prob,
                               all_accepted=all_acc, next_entropy=ent[row, x],
                               next_max_prob=top[row, x])
            go = live & (i < fits) & ~self.policy.stop(state)
            nxt = draw(p_thr[row, x], u[i])
            p_x, q_x = p_trans[row, x, nxt], q_trans[row, x, nxt]
            alpha = jnp.minimum(1, safe_ratio(q_x, p_x, 1))
            drafts.append(nxt)
            accept.append(alpha)
            all_acc = jnp.where(go, all_acc * alpha, all_acc)
            prob = jnp.where(go, p_x, prob)
            x = jnp.where(go, nxt, x)
            depth = depth + go.astype(jnp.int32)
            live = go
        drafts, alphas = jnp.stack(drafts), jnp.stack(accept)
        steps = jnp.arange(k, dtype=jnp.int32)
        kept_each = bernoulli(alphas, u[k:2 * k]) | (steps >= depth)
        tau = jnp.min(jnp.where(kept_each, k, steps))  # the first rejection, k if none
        rejected = tau < depth
        tau = jnp.minimum(tau, depth)
        parents = jnp.concatenate([prev[None], drafts[:-1]])
        parent = parents[jnp.minimum(tau, k - 1)]
        row = jnp.clip(n - 1 + tau, 0, horizon - 1)
        residual = jnp.maximum(q_trans[row, parent] - p_trans[row, parent], 0)
        last_token = jnp.where(tau > 0, drafts[jnp.maximum(tau - 1, 0)], prev)
        law = jnp.where(rejected, residual, q_trans[row, last_token])
        y = draw(categorical_thresholds(law), u[2 * k])
        emitted = jnp.concatenate([drafts, y[None]]).at[tau].set(y)
        return emitted, tau, rejected

    def _enumerate(self, start, p_rows, q_rows, bonus_row, with_bonus, position, keep_start):
        """The call's law from the drafted paths: ``(CallLaw, drafted)``, ``drafted[d]`` the mass
        of calls drafting exactly ``d`` tokens. Fields keep the previous token's axis when
        ``keep_start``."""
        k, num_states, _ = p_rows.shape
        dtype = jnp.result_type(p_rows.dtype, q_rows.dtype)
        alpha = acceptance_probability(p_rows, q_rows, epsilon=0)  # SD's min(1, q / p)
        residual = speculative_residual(p_rows, q_rows)
        ent, top = entropy(p_rows), jnp.max(p_rows, axis=-1)
        tokens = jnp.arange(num_states)

        def group(mass, rank):  # sum by the last drafted token (and the start when kept)
            if rank == 0:
                return jnp.diag(mass) if keep_start else mass
            axes = tuple(range(1, rank)) if keep_start else tuple(range(rank))
            return jnp.sum(mass, axis=axes) if axes else mass

        reach = jnp.asarray(start, dtype)  # mass of calls reaching depth i with each path
        all_acc = jnp.ones_like(reach)
        prob = jnp.ones_like(reach)
        zeros = jnp.zeros(((num_states,) if keep_start else ()) + (num_states,), dtype)
        kept, rejected, bonus, drafted = [], [zeros] * (k + 1), [zeros] * (k + 1), []
        for i in range(k + 1):
            if i < k:
                token = jnp.broadcast_to(tokens, reach.shape)  # x_i: the last axis
                state = DraftState(position=position + i, depth=i, token=token, token_prob=prob,
                                   all_accepted=all_acc, next_entropy=ent[i][token],
                                   next_max_prob=top[i][token])
                stop = jnp.broadcast_to(self.policy.stop(state), reach.shape)
            else:
                stop = jnp.ones(reach.shape, bool)
            stopped = jnp.where(stop, reach, 0)
            drafted.append(jnp.sum(stopped))
            row = q_rows[i] if i < k else (bonus_row if with_bonus else None)
            if row is not None:  # every draft kept: the target's bonus token
                bonus[i] = group(stopped * all_acc, i) @ row
            if i == k:
                break
            going = jnp.where(stop, 0, reach)
            lifted = _lift(p_rows[i], i + 1)
            # Draft i + 1 rejected: the first rejection, y from the residual after token x_i.
            lost = jnp.sum(lifted * _lift(1 - alpha[i], i + 1), axis=-1)
            rejected[i] = group(going * all_acc * lost, i) @ residual[i]
            reach = going[..., None] * lifted
            all_acc = all_acc[..., None] * _lift(alpha[i], i + 1)
            prob = jnp.broadcast_to(lifted, reach.shape)
            kept.append(group(reach * all_acc, i + 1))
        law = CallLaw(kept=jnp.stack(kept), rejected=jnp.stack(rejected),
                      bonus=jnp.stack(bonus))
        return law, jnp.stack(drafted)

    def call_law(self, p_rows, q_rows, bonus_row, *, with_bonus: bool,
                 position=1) -> CallLaw:
        """The law of one call for every previous token, by enumeration of the drafted paths.

        Args:
          p_rows: ``(K', V, V)`` draft rows of the call's positions.
          q_rows: ``(K', V, V)`` target rows of the same positions.
          bonus_row: ``(V, V)`` target row after them (unused without bonus).
          with_bonus: whether that position exists (static).
          position: ``n``, the position of the call's first draft (1-based; may be traced).
        """
        start = jnp.ones((p_rows.shape[1],), p_rows.dtype)
        return self._enumerate(start, p_rows, q_rows, bonus_row, with_bonus, position,
                               keep_start=True)[0]

    def call_law_from(self, start, p_rows, q_rows, bonus_row, *, with_bonus: bool,
                      position=1) -> CallLaw:
        return self._enumerate(start, p_rows, q_rows, bonus_row, with_bonus, position,
                               keep_start=False)[0]

    def drafted_call_law_from(self, start, p_rows, q_rows, bonus_row, *, with_bonus: bool,
                              position=1) -> tuple[CallLaw, jax.Array]:
        """``(call_law_from(...), drafted)`` from one enumeration: ``drafted`` ``(K' + 1,)`` is
        the mass of calls (previous token of law ``start``) that draft exactly ``d = 0..K'``
        tokens."""
        return self._enumerate(start, p_rows, q_rows, bonus_row, with_bonus, position,
                               keep_start=False)
