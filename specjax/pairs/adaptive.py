"""Adaptive draft lengths and HuggingFace's schedule from a recording (issue 47, item 2): the phase
filter with the call's depth, and the schedule's call state, as its state.

A call of ``AdaptiveSpeculative(policy, max_lookahead=K)`` started at position ``n`` asks its
policy, before drafting token ``i + 1``, whether to stop; the policy reads only what the call has
drafted so far (``DraftState``: the position, ``i``, the last drafted token and its draft
probability, the draft's next row and ``A_i = prod_{j <= i} min(1, q_j / p_j)``). Given the
output ``x``, a call that is at depth ``i`` at position ``t = n + i`` has had its ``i`` drafts
accepted, so they *are* ``x_n..x_{t-1}``: the state the policy reads is on the emitted path
(``token = x_{t-1}``, ``token_prob = p_{t-1}(x_{t-1})``, the next row ``p_t`` and the product of
``min(1, q / p)`` over the last ``i`` emitted tokens). So, as for token-wise decoders
(``specjax.pairs.calls``), the forward filter over the depth is the posterior given ``x``: at
depth ``i`` the policy stops (or ``i = K``) and ``x_t`` is the target's bonus token (a new call
at ``t + 1``), or it drafts and ``x_t`` came from a rejection with probability ``r_t = [q_t -
p_t]_+(x_t) / q_t(x_t)`` (a new call) and from an accepted draft otherwise (depth ``i + 1``).
``HeuristicSchedule`` adds its call state ``s`` (the lookahead ``k``): a call in state ``s``
stops at ``k``; a call that ended with its bonus token moves to ``up(s)``, one that ended with
a rejection to ``down(s)``: both known in the filter.

What is exact from the rows along the path, per sequence (``estimate`` averages these):

* calls, rejections and the calls keeping at least ``i`` drafts (``accepted_at``), for every
  policy and the schedule;
* the drafted tokens, hence the time under a ``CostModel`` and the goodput under a
  ``ServingCost``, when a call's draft length is set when it starts: ``FixedLength`` (SD),
  ``HeuristicSchedule`` (``min(k, T - n + 1)`` in state ``k``), and any policy with
  ``min(K, T) = 1`` (the call drafts one token unless the policy stops at depth 0, read on the
  path). Otherwise a call that rejects draft ``i + 1`` may draft more: whether it drafts ``i + 2``
  is decided from the rejected token and the draft's row after it, off the emitted path, which no
  recording of target rollouts holds. ``expected_drafted`` is then ``None`` and a cost model is
  refused (an engine's per-call trace holds what a call drafted).

What the recording must hold: the emitted tokens' probabilities serve ``FixedLength``,
``RejectionThreshold``, ``ConfidenceThreshold``, ``ThresholdTable`` and the schedule; a policy
that reads the draft's next row (``EntropyThreshold``, a user's ``StoppingRule``) needs the full
draft rows along the path (``from_arrays`` keeps small ones; ``record(..., keep_rows=True)``).
Ragged recordings (``lengths``) end a sequence's calls at its last token, as for SD; the calls'
decisions at live positions read only live rows.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax.decoders.base import CallDecoder
from specjax.decoders.base import DepthPlan
from specjax.decoders.draft_state import DraftState
from specjax.decoders.draft_state import entropy
from specjax.numerics import safe_ratio
from specjax.pairs.calls import live_positions
from specjax.pairs.recording import rows_chunk
from specjax.pairs.serving import goodput_influence
from specjax.theory.cost import depth_works
from specjax.theory.serving import check_tables

__all__ = ["call_plan", "check_drafts_known", "drafted_columns", "filtered_calls",
           "per_sequence_calls", "reads_call_depth", "serving_calls"]

def reads_call_depth(decoder) -> bool:
    """Whether ``decoder``'s estimate is this module's filter: a call-level decoder with a
    ``depth_plan`` (adaptive lengths, the schedule)."""
    return isinstance(decoder, CallDecoder) and decoder.has_depth_plan


def call_plan(decoder, horizon: int) -> DepthPlan:
    """``decoder.depth_plan(T)``: the filter's static facts and the stopping policy."""
    return decoder.depth_plan(horizon)


def check_drafts_known(decoder, horizon: int, what: str) -> None:
    """``ValueError`` naming ``what`` (``cost``) unless the drafted tokens of ``decoder``'s calls
    are exact from the rows along the path (module docstring)."""
    if not call_plan(decoder, horizon).drafts_known:
        raise ValueError(
            f"{what}: the time of {decoder.label} needs the tokens its calls draft, and after a "
            f"rejected draft the policy decides whether to draft more from the rejected token and "
            f"the draft's rows after it, off the emitted path, which a recording of target "
            f"rollouts does not hold: estimate its calls and rejections without a cost model, "
            f"take its work from an engine's per-call trace, or use "
            f"specjax.theory.decoding_time on models (FixedLength, HeuristicSchedule and "
            f"max_lookahead=1 have exact times from a recording)")


def _depths(plan: DepthPlan, horizon: int) -> np.ndarray:
    """``(T, S, 2)``: the tokens a call at ``n`` in state ``s`` drafts, when its policy stops at
    depth 0 (``[..., 0]``) or not (``[..., 1]``); 0 where a recording cannot tell."""
    num_states = len(plan.caps)
    if plan.drafts is not None:
        return np.broadcast_to(np.asarray(plan.drafts)[:, :, None], (horizon, num_states, 2))
    # K' = 1: one draft unless stopped at depth 0 (else unknown: drafted NaN in the columns)
    return np.broadcast_to(np.asarray([0, 1 if plan.first_only else 0]),
                           (horizon, num_states, 2))


def drafted_columns(decoder, horizon: int, cost) -> np.ndarray:
    """``(T, S, 2, 3)``: the weights of a call at position ``n`` in state ``s`` whose policy
    stops at depth 0 (``[..., 0, :]``) or not (``[..., 1, :]``): its count (1), drafted tokens
    (the tokens its target scores but the root) and time (``cost.call_time`` of
    ``call_work(d)``; 0 without a cost model). Drafted tokens are NaN where a recording cannot
    tell them (``check_drafts_known``)."""
    plan = call_plan(decoder, horizon)
    depths = _depths(plan, horizon)
    passes, scored = depth_works(decoder, plan.lookahead)
    times = np.zeros(plan.lookahead + 1) if cost is None else np.asarray(
        [cost.call_time(draft_passes=int(d), tokens_scored=int(s))
         for d, s in zip(passes, scored)])
    drafted = (scored - 1)[depths].astype(np.float64)
    if not plan.drafts_known:
        drafted = np.full_like(drafted, np.nan)
    return np.stack([np.ones(depths.shape), drafted, times[depths]], axis=-1)



@functools.partial(jax.jit, static_argnames=("plan",))
def _filter(policy, prev, p_x, q_x, ent, top, weights, lengths, *, plan):
    """``(rejections (c,), weighted (c, W), accepted_at (c, K'))``: previous tokens ``prev``,
    emitted tokens' probabilities ``p_x``, ``q_x``, the draft rows' entropies and largest
    entries ``ent``, ``top`` (all ``(c, T)``), ``weights`` ``(T, S, 2, W)``."""
    batch, horizon = prev.shape
    dtype = q_x.dtype
    depth_max = plan.lookahead
    num_states = len(plan.caps)
    live = live_positions(lengths, horizon, batch, dtype)  # (T, c)
    rate = jnp.where(live.T > 0, safe_ratio(jnp.maximum(q_x - p_x, 0), q_x, 0), 0)
    accept = jnp.where(live.T > 0, jnp.minimum(1, safe_ratio(q_x, p_x, 1)), 1)  # as sampled
    token_prob = jnp.concatenate([jnp.ones((batch, 1), dtype), p_x[:, :-1]], axis=1)
    depth = jnp.arange(depth_max + 1)
    forced = depth[None] >= jnp.asarray(plan.caps)[:, None]  # (S, K' + 1)
    up = jax.nn.one_hot(jnp.asarray(plan.up), num_states, dtype=dtype)  # (S, S)
    down = jax.nn.one_hot(jnp.asarray(plan.down), num_states, dtype=dtype)
    weights = jnp.asarray(weights, dtype)

    def step(carry, inputs):
        alpha, all_accepted, rejections, weighted, kept = carry  # alpha (c, S, K' + 1)
        n, x, x_prob, a_t, r_t, ent_t, top_t, w_t, on = inputs
        stop = jnp.broadcast_to(forced[None], alpha.shape)
        if policy is not None:
            state = DraftState(position=n + 1, depth=depth[None], token=x[:, None],
                               token_prob=jnp.where(depth[None] > 0, x_prob[:, None], 1),
                               all_accepted=all_accepted, next_entropy=ent_t[:, None],
                               next_max_prob=top_t[:, None])
            stops = jnp.broadcast_to(policy.stop(state), all_accepted.shape)
            stop = stop | stops[:, None, :]
        bonus = jnp.where(stop, alpha, 0)
        rejected = (alpha - bonus) * r_t[:, None, None]
        accepted = alpha - bonus - rejected
        started = alpha[:, :, 0] * on[:, None]  # (c, S)
        call = jnp.where(stop[:, :, :1], w_t[None, :, 0], w_t[None, :, 1])  # (c, S, W)
        weighted = weighted + jnp.sum(started[..., None] * call, axis=1)
        rejections = rejections + jnp.sum(rejected, axis=(1, 2)) * on
        kept = kept + jnp.sum(accepted[:, :, :-1], axis=1) * on[:, None]
        new_call = jnp.sum(rejected, axis=-1) @ down + jnp.sum(bonus, axis=-1) @ up
        nxt = jnp.concatenate([new_call[..., None], accepted[:, :, :-1]], axis=-1)
        all_accepted = jnp.concatenate([jnp.ones((batch, 1), dtype),
                                        all_accepted[:, :-1] * a_t[:, None]], axis=-1)
        return (nxt * on[:, None, None], all_accepted, rejections, weighted, kept), None

    alpha0 = jnp.zeros((batch, num_states, depth_max + 1), dtype).at[:, plan.initial, 0].set(1)
    carry = (alpha0, jnp.ones((batch, depth_max + 1), dtype), jnp.zeros((batch,), dtype),
             jnp.zeros((batch, weights.shape[-1]), dtype), jnp.zeros((batch, depth_max), dtype))
    inputs = (jnp.arange(horizon), prev.T, token_prob.T, accept.T, rate.T, ent.T, top.T,
              weights, live)
    (_, _, rejections, weighted, kept), _ = jax.lax.scan(step, carry, inputs)
    return rejections, weighted, kept


_row_features = jax.jit(lambda p: (entropy(p), jnp.max(p, axis=-1)))


def _features(plan: DepthPlan, decoder, recording):
    """``(ent, top)`` ``(B, T)`` of the draft's rows along the path (zeros when the policy does
    not read them); ``ValueError`` when it does and the recording holds no rows."""
    dtype = recording.target_prob.dtype
    zeros = jnp.zeros(recording.target_prob.shape, dtype)
    if plan.policy is None or not plan.policy.reads_draft_rows:
        return zeros, zeros
    if recording.draft_probs is None:
        raise ValueError(
            f"decoder: {decoder.label} reads the draft's next row (its entropy or largest "
            f"probability) before each draft, and this recording holds only the emitted tokens' "
            f"probabilities: build it from the rows (Recording.from_arrays keeps rows of up to "
            f"1 GiB; record(..., keep_rows=True))")
    p = recording.draft_probs
    num, horizon, num_states = p.shape
    chunk = rows_chunk(horizon, num_states, p.dtype, num, ())
    parts = [_row_features(p[start:start + chunk]) for start in range(0, num, chunk)]
    return tuple(jnp.concatenate([part[i] for part in parts]).astype(dtype) for i in range(2))


def _check_policy(plan: DepthPlan, recording) -> None:
    """The policy fits the recording (a ``ThresholdTable``: ``(T, K' + 1, V)``, every token
    below ``V``)."""
    policy = plan.policy
    if policy is None:
        return
    if recording.target_probs is not None:
        policy.check_shapes(recording.horizon, plan.lookahead, recording.target_probs.shape[-1])
    elif policy.vocabulary_size is not None:
        size = policy.vocabulary_size
        policy.check_shapes(recording.horizon, plan.lookahead, size)
        tokens = recording.tokens
        if _checks.is_concrete(tokens) and int(np.max(np.asarray(tokens))) >= size:
            raise ValueError(f"thresholds: a table over V = {size} tokens, and the "
                             f"recording holds larger token ids")


def filtered_calls(decoder, recording, weights):
    """``(rejections (B,), weighted (B, W), accepted_at (B, K'))`` of ``decoder`` along the
    recording, a call at ``n`` in state ``s`` weighted ``weights`` ``(T, S, 2, W)``
    (``drafted_columns``) or ``(T, W)`` (a weight per position, as ``estimate.filtered``'s
    columns)."""
    horizon = recording.horizon
    plan = call_plan(decoder, horizon)
    _check_policy(plan, recording)
    ent, top = _features(plan, decoder, recording)
    weights = np.asarray(weights)
    if weights.ndim == 2:
        weights = np.broadcast_to(weights[:, None, None], (horizon, len(plan.caps), 2,
                                                          weights.shape[-1]))
    dtype = recording.target_prob.dtype
    return _filter(plan.policy, recording.tokens[:, :-1], recording.draft_prob.astype(dtype),
                   recording.target_prob, ent, top, jnp.asarray(weights, dtype),
                   recording.lengths, plan=plan.static)


def per_sequence_calls(decoder, recording, cost):
    """``estimate.per_sequence`` for an ``AdaptiveSpeculative`` or ``HeuristicSchedule``:
    ``(rejections (B,), weighted (B, 3): calls, drafted tokens (NaN where unknown), time;
    accepted_at (B, K'))``; a cost model is refused where the drafted tokens are unknown."""
    if cost is not None:
        check_drafts_known(decoder, recording.horizon, "cost")
    columns = drafted_columns(decoder, recording.horizon, cost)
    if call_plan(decoder, recording.horizon).drafts_known:
        return filtered_calls(decoder, recording, columns)
    # NaN after the filter, not in it: a NaN weight would make every gradient NaN (0 * NaN).
    rejections, weighted, kept = filtered_calls(decoder, recording, np.nan_to_num(columns))
    return rejections, weighted.at[:, 1].set(jnp.nan), kept


def serving_calls(decoder, recording, cost, batch_size: int):
    """``(tokens_per_time, se, speedup, speedup_se)`` as ``specjax.pairs.serving``'s
    ``serving_estimate``, with a slot's work by drafted depth (the calls' masses drafting
    ``d = 0..K'`` tokens, as ``serving_rate`` takes a random draft length)."""
    from specjax.pairs.estimate import weighted_mean_se  # noqa: PLC0415 (estimate imports this)

    horizon = recording.horizon
    check_drafts_known(decoder, horizon, "cost")
    plan = call_plan(decoder, horizon)
    passes, scored = depth_works(decoder, plan.lookahead)
    check_tables(cost, batch_size, passes, scored)
    # (T, S, 2, K' + 1): one-hot of the tokens a call drafts
    by_depth = np.eye(plan.lookahead + 1)[_depths(plan, horizon)]
    _, mass, _ = filtered_calls(decoder, recording, by_depth)
    dtype = recording.target_prob.dtype
    tokens = (jnp.full(mass.shape[:1], horizon, dtype) if recording.lengths is None else
              recording.lengths.astype(dtype))
    weights = (jnp.ones(mass.shape[:1], dtype) if recording.weights is None else
               recording.weights.astype(dtype))
    per_sequence = jnp.concatenate([mass, tokens[:, None]], axis=1)
    value, baseline, influence = goodput_influence(per_sequence, weights, passes, scored, cost,
                                                   batch_size)
    se = weighted_mean_se(influence[:, None], weights)[1][0]
    return value, se, value / baseline, se / baseline
