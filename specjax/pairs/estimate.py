"""Estimates of what a lossless decoder costs, from a recording of target rollouts.

For each recorded sequence ``x`` the phase filter (``specjax.pairs.calls``) gives the exact
conditional expectations ``E[rejections | x]``, ``E[calls | x]``, ``E[calls keeping >= i
drafts | x]``, the drafted tokens and the time under a ``CostModel``. Their (weighted) mean over
the recording is unbiased for ``specjax.exact``'s values (exactly equal to them when every
sequence is enumerated and weighted by its target probability), and the standard errors are those
of a (weighted) mean; ratios of means (acceptance per position, accepted length per call,
speed-up) get delta-method standard errors.

Which decoders (``check_estimable``): every token-wise decoder whose output is the target's:
``Speculative`` from the emitted tokens' probabilities alone; a multi-draft root
(``BatchSpeculative``, ``OptimalMultiDraft``, ``KSequential``, ``GumbelList``,
``ImportanceWeighted``, ``SpecHub``) and any lossless ``RejectionRule`` from their rates, recorded
with ``decoders=`` or computed from kept rows; ``Autoregressive`` trivially; static token trees
(``TokenTree``) from the kept rows along the path (``specjax.pairs.trees``); adaptive draft
lengths (``AdaptiveSpeculative``) and HuggingFace's schedule (``HeuristicSchedule``) from the
emitted path (``specjax.pairs.adaptive``: their drafted tokens and time only where a call's
length is set when it starts; ``expected_drafted`` is ``None`` otherwise). Lossy rules
(``lossless = False``) and call-level decoders whose calls read rows off the path (blocks,
dynamic trees: ``recording_reads = "off_path"``) are refused.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax.decoders.base import TokenwiseDecoder
from specjax.decoders.probe import probe_decoder
from specjax.numerics import safe_ratio
from specjax.pairs.adaptive import call_plan
from specjax.pairs.adaptive import filtered_calls
from specjax.pairs.adaptive import per_sequence_calls
from specjax.pairs.adaptive import reads_call_depth
from specjax.pairs.adaptive import serving_calls
from specjax.pairs.calls import _filter
from specjax.pairs.calls import rejection_rate
from specjax.pairs.recording import Recording
from specjax.pairs.recording import check_estimable
from specjax.pairs.recording import decoder_rates
from specjax.pairs.recording import lossless_tolerance
from specjax.pairs.serving import serving_estimate
from specjax.pairs.trees import tree_per_sequence
from specjax.theory.cost import CostModel
from specjax.theory.cost import call_depths
from specjax.theory.cost import call_works
from specjax.theory.metrics import EngineMetrics
from specjax.theory.serving import ServingCost

__all__ = [
    "Estimate",
    "autoregressive_times",
    "call_columns",
    "check_cost",
    "check_inputs",
    "check_recording",
    "estimate",
    "filtered",
    "per_sequence",
    "rates",
    "ratio_se",
    "summarise",
    "weighted_mean_se",
]


class Estimate(NamedTuple):
    """A decoder's expected costs estimated from a recording, each with its standard error.

    Attributes:
      expected_rejections, expected_rejections_se: ``E[rejections]``.
      expected_calls, expected_calls_se: ``E[target calls]``.
      expected_time, expected_time_se: ``E[time]`` under the cost model (``None`` without one).
      speedup, speedup_se: autoregressive time over ``expected_time`` (``None`` without a cost
        model).
      expected_drafted, expected_drafted_se: ``E[drafted tokens]`` (the tokens a call's target
        scores but the root); ``None`` for a stopping policy whose calls may draft past a
        rejection, which a recording cannot tell (``specjax.pairs.adaptive``; then also
        ``metrics.expected_drafted`` and ``metrics.draft_acceptance_rate``).
      accepted_at, accepted_at_se: ``(K,)``, ``E[# calls keeping >= i drafts]``.
      acceptance_per_position, acceptance_per_position_se: ``(K,)``, ``accepted_at /
        expected_calls`` (vLLM's ``num_accepted_tokens_per_pos[i] / num_drafts``).
      accepted_length, accepted_length_se: drafts kept per call, ``sum(accepted_at) /
        expected_calls`` (vLLM's mean acceptance length is one more).
      metrics: ``specjax.theory.EngineMetrics`` of the estimates (vLLM's names, as
        ``engine_metrics`` gives them exactly).
      num_sequences: ``B``.
      tokens_per_time, tokens_per_time_se: with a ``ServingCost`` and ``batch_size``, the
        goodput of ``batch_size`` slots in lockstep (``specjax.serving_rate``'s
        ``tokens_per_time``; ``speedup`` is then over autoregressive serving), else ``None``.
    """

    expected_rejections: jax.Array
    expected_rejections_se: jax.Array
    expected_calls: jax.Array
    expected_calls_se: jax.Array
    expected_time: jax.Array | None
    expected_time_se: jax.Array | None
    speedup: jax.Array | None
    speedup_se: jax.Array | None
    expected_drafted: jax.Array
    expected_drafted_se: jax.Array
    accepted_at: jax.Array  # shape=(K,)
    accepted_at_se: jax.Array  # shape=(K,)
    acceptance_per_position: jax.Array  # shape=(K,)
    acceptance_per_position_se: jax.Array  # shape=(K,)
    accepted_length: jax.Array
    accepted_length_se: jax.Array
    metrics: EngineMetrics
    num_sequences: int
    tokens_per_time: jax.Array | None = None
    tokens_per_time_se: jax.Array | None = None


def rates(decoder, recording: Recording):
    """``(root_rejection, rejection)`` ``(B, T)`` of ``decoder`` along the recording: SD's from
    the emitted tokens' probabilities, any other decoder's from its recorded rates or from the
    kept rows (checking that its laws are lossless there)."""
    if decoder.recording_reads == "emitted":  # SD: the emitted tokens' probabilities
        r = rejection_rate(recording.draft_prob, recording.target_prob)
        return r, r
    if decoder.recording_reads == "nothing":
        zeros = jnp.zeros_like(recording.target_prob)
        return zeros, zeros
    entry = recording.rates_of(decoder)
    if entry is not None:
        return entry.root_rejection, entry.rejection
    if recording.target_probs is not None:
        root, inside, loss = _decoder_rates(decoder, recording.draft_probs,
                                            recording.target_probs, recording.tokens[:, 1:])
        if _checks.is_concrete(loss) and not float(loss) <= lossless_tolerance(loss.dtype):
            raise ValueError(
                f"decoder: {decoder!r} is not lossless on the recorded rows (its accepted and "
                f"rejected masses miss the target's row by {float(loss):.3g}): target rollouts "
                f"cannot estimate its cost")
        return root, inside
    raise ValueError(
        f"decoder: the recording holds no rates of {decoder!r} and no rows to compute them "
        f"from; record them with decoders=({decoder!r},) (specjax.record or "
        f"Recording.from_arrays) or keep the rows (keep_rows=True); a recording of top-k "
        f"log-probabilities (specjax.pairs.from_top_k) cannot give them: the rows' mass outside "
        f"the top-k is unknown")


def weighted_mean_se(values, weights):
    """``(mean, se)`` over the first axis of ``values`` with ``weights`` ``(B,)`` (or ``None``):
    ``sum w y / sum w`` and ``sqrt(B / (B - 1) sum (w (y - mean))^2) / sum w`` (NaN for
    ``B = 1``)."""
    w = jnp.ones(values.shape[:1], values.dtype) if weights is None else \
        weights.astype(values.dtype)
    w = w.reshape(w.shape + (1,) * (values.ndim - 1))
    total = jnp.sum(w, axis=0, keepdims=True)
    mean = jnp.sum(w * values, axis=0, keepdims=True) / total
    return mean[0], _spread(w * (values - mean), total[0])


def ratio_se(num, den, weights):
    """``(ratio, se)`` of ``mean(num) / mean(den)`` (weighted), with the delta method's standard
    error ``sqrt(B / (B - 1) sum (w (a - R b))^2) / sum w b``; 0 (and 0) where ``mean(den)``
    is 0."""
    w = jnp.ones(num.shape[:1], num.dtype) if weights is None else weights.astype(num.dtype)
    w = w.reshape(w.shape + (1,) * (num.ndim - 1))
    den = jnp.broadcast_to(den, num.shape)
    total = jnp.sum(w * den, axis=0, keepdims=True)
    ratio = safe_ratio(jnp.sum(w * num, axis=0, keepdims=True), total, 0)
    return ratio[0], safe_ratio(_spread(w * (num - ratio * den), 1.0), total[0], 0)


def _spread(terms, scale):
    count = terms.shape[0]
    if count < 2:
        return jnp.full(terms.shape[1:], jnp.nan, terms.dtype)
    return jnp.sqrt(count / (count - 1) * jnp.sum(terms ** 2, axis=0)) / scale


# Compiled, not op by op: a decoder's laws on the rows are a few dozen operations, each a
# program of its own when run eagerly (compiled again for every new shape of recording).
_decoder_rates = jax.jit(decoder_rates)


def call_columns(decoder, horizon: int, lookahead: int, cost: CostModel | None) -> np.ndarray:
    """``(T, 3)``: per position ``n``, a call's count (1), drafted tokens and time
    (``cost.call_time`` of the decoder's ``call_work(min(K, T - n + 1))``, as
    ``specjax.theory.decoding_time``; 0 without a cost model)."""
    ones = np.ones(horizon)
    if isinstance(decoder, TokenwiseDecoder) and decoder.num_drafts == math.inf:
        if cost is not None:
            decoder.call_work(1)  # raises: no finite work
        drafted = np.where(call_depths(lookahead, horizon) > 0, np.inf, 0)
        return np.stack([ones, drafted, np.zeros(horizon)], axis=-1)
    passes, scored = call_works(decoder, horizon, lookahead)
    times = np.zeros(horizon) if cost is None else np.asarray(
        [cost.call_time(draft_passes=int(d), tokens_scored=int(s))
         for d, s in zip(passes, scored)])
    return np.stack([ones, scored - 1, times], axis=-1)


def check_recording(recording) -> None:
    """``ValueError`` naming ``recording`` unless it is a ``Recording``."""
    if not isinstance(recording, Recording):
        raise ValueError(f"recording must be a specjax.Recording (Recording.from_arrays, "
                         f"Recording.from_statistics, specjax.record, Recording.load), got "
                         f"{type(recording).__name__}")


def check_inputs(decoder, recording) -> None:
    """``estimate``'s checks of ``decoder`` and ``recording``, before any work."""
    check_estimable(decoder)
    check_recording(recording)
    # A new rule's laws on probe rows (the recording's V when it holds rows; a rule's laws do not
    # depend on V): the same error as exact, decode and serving_rate give.
    probe_decoder(decoder, 8 if recording.target_probs is None else
                  recording.target_probs.shape[-1], recording.target_prob.dtype)


def check_cost(cost) -> None:
    """``ValueError`` naming ``cost`` unless it is ``None`` or a ``CostModel``."""
    if cost is not None and not isinstance(cost, CostModel):
        raise ValueError(f"cost must be None, a specjax.CostModel or a specjax.ServingCost (with "
                         f"batch_size), got {type(cost).__name__} {cost!r}"[:300])


def per_sequence(decoder, recording: Recording, cost: CostModel | None):
    """The filter's exact conditional expectations for each recorded sequence:
    ``(rejections (B,), weighted (B, 3): calls, drafted tokens, time; accepted_at (B, K))``.
    What ``estimate`` averages and a distillation objective differentiates."""
    if reads_call_depth(decoder):  # adaptive lengths, the schedule: specjax.pairs.adaptive
        return per_sequence_calls(decoder, recording, cost)
    horizon = recording.horizon
    lookahead = decoder.resolve_lookahead(horizon)
    columns = call_columns(decoder, horizon, lookahead, cost)
    return filtered(decoder, recording, columns)


def filtered(decoder, recording: Recording, columns):
    """The filter of ``decoder``'s calls along each recorded sequence with call weights
    ``columns`` ``(T, W)``: the phase filter of a token-wise decoder (its rates), or the node
    filter of a token tree (``specjax.pairs.trees``, from the rows)."""
    if reads_call_depth(decoder):
        return filtered_calls(decoder, recording, columns)
    if decoder.recording_reads == "path_rows":
        return tree_per_sequence(decoder, recording, columns)
    lookahead = decoder.resolve_lookahead(recording.horizon)
    root, inside = rates(decoder, recording)
    dtype = jnp.result_type(inside.dtype, recording.target_prob.dtype)
    return _filter(inside.astype(dtype), root.astype(dtype), lookahead=lookahead,
                   call_weights=jnp.asarray(columns, dtype), lengths=recording.lengths)


def autoregressive_times(recording: Recording, cost: CostModel):
    """``(B,)`` (or a scalar without ``lengths``): each sequence's time decoded token by token,
    one target call per emitted token."""
    per_token = cost.target_time(1) + cost.call_overhead
    if recording.lengths is None:
        return recording.horizon * per_token
    return recording.lengths.astype(recording.target_prob.dtype) * per_token


def estimate(decoder, recording: Recording, *, cost=None, batch_size=None) -> Estimate:
    """Estimates a lossless decoder's expected rejections, calls and time from target rollouts.

    Args:
      decoder: a token-wise decoder whose output is the target's (module docstring); its
        ``lookahead`` is the one estimated (``None``: draft to the horizon).
      recording: a ``Recording`` (its weights, if any, weight the mean; with ``lengths``,
        each sequence's calls end at its last emitted token, and a call drafts what an engine
        drafts there, ``min(K, T - n + 1)`` with ``T`` the recording's horizon: the engine does
        not know the request is about to end).
      cost: a ``CostModel`` for ``expected_time`` and ``speedup``; or a ``ServingCost``
        (with ``batch_size``) for ``tokens_per_time``, the goodput of ``batch_size`` slots in
        lockstep as ``specjax.serving_rate`` gives it on models, and ``speedup`` over
        autoregressive serving (``specjax.pairs.serving``); or ``None``.
      batch_size: ``B``, the slots, a positive int (with a ``ServingCost`` only).

    Returns:
      ``Estimate``: each value the (weighted) mean of the exact conditional expectations over
      the recorded sequences, with its standard error; equal to ``specjax.exact``'s values when
      every sequence is enumerated and weighted by its target probability.

    Raises:
      ValueError: a decoder refused by name (lossy, call-level, bound to the whole models), a
        decoder whose rates the recording does not hold, a bad ``recording`` or ``cost``; before
        any work.

    Example:
      >>> import jax, specjax
      >>> draft, target = specjax.paper_instance()
      >>> rec = specjax.record(jax.random.key(0), draft, target, 2000)
      >>> est = specjax.estimate(specjax.Speculative(lookahead=4), rec)
      >>> exact = specjax.exact(specjax.Speculative(lookahead=4), draft, target)
      >>> bool(abs(est.expected_calls - exact.expected_calls) < 4.5 * est.expected_calls_se)
      True
    """
    check_inputs(decoder, recording)
    serving = isinstance(cost, ServingCost)
    if serving:
        _checks.check_static_int("batch_size", batch_size)
    elif batch_size is not None:
        raise ValueError(f"batch_size applies to a ServingCost (the goodput of a batch); "
                         f"got cost={cost!r} with batch_size={batch_size!r}"[:300])
    else:
        check_cost(cost)
    if serving:
        served = serving_calls(decoder, recording, cost, batch_size) if \
            reads_call_depth(decoder) else \
            serving_estimate(decoder, recording, cost, batch_size, filtered)
        cost = None
    rejections, weighted, accepted_at = per_sequence(decoder, recording, cost)
    result = summarise(rejections, weighted, accepted_at, recording.weights,
                       autoregressive_time=None if cost is None else
                       autoregressive_times(recording, cost))
    if serving:
        rate, rate_se, speedup, speedup_se = served
        result = result._replace(tokens_per_time=rate, tokens_per_time_se=rate_se,
                                 speedup=speedup, speedup_se=speedup_se)
    if reads_call_depth(decoder) and not call_plan(decoder, recording.horizon).drafts_known:
        # drafts past a rejection are off the path: no number rather than a NaN
        result = result._replace(
            expected_drafted=None, expected_drafted_se=None,
            metrics=result.metrics._replace(expected_drafted=None, draft_acceptance_rate=None))
    return result


def summarise(rejections, weighted, accepted_at, weights, *, autoregressive_time=None):
    """An ``Estimate`` from per-sequence values: ``rejections`` ``(B,)``, ``weighted`` ``(B, 3)``
    (calls, drafted tokens, time) and ``accepted_at`` ``(B, K)``."""
    # One compiled program (op by op, the means and ratios below are about 40 programs,
    # compiled again for every new B or K); ``num_sequences`` stays a Python int.
    summary = _summarise(rejections, weighted, accepted_at, weights, autoregressive_time)
    return summary._replace(num_sequences=int(rejections.shape[0]))


@jax.jit
def _summarise(rejections, weighted, accepted_at, weights, autoregressive_time):
    calls, drafted, time = weighted[:, 0], weighted[:, 1], weighted[:, 2]
    mean = functools.partial(weighted_mean_se, weights=weights)
    rej, rej_se = mean(rejections)
    n_calls, calls_se = mean(calls)
    n_drafted, drafted_se = mean(drafted)
    at, at_se = mean(accepted_at)
    per_position, per_position_se = ratio_se(accepted_at, calls[:, None], weights)
    kept = jnp.sum(accepted_at, axis=-1)
    length, length_se = ratio_se(kept, calls, weights)
    rate, _ = ratio_se(kept, drafted, weights)
    reached = jnp.concatenate([n_calls[None], at[:-1]])
    metrics = EngineMetrics(
        expected_calls=n_calls, expected_drafted=n_drafted, accepted_at=at,
        acceptance_per_position=per_position,
        conditional_acceptance=safe_ratio(at, reached, 0),
        mean_acceptance_length=1 + length, draft_acceptance_rate=rate)
    time = time_se = speedup = speedup_se = None
    if autoregressive_time is not None:
        time, time_se = mean(weighted[:, 2])
        speedup, speedup_se = ratio_se(jnp.broadcast_to(autoregressive_time, calls.shape),
                                       weighted[:, 2], weights)
    return Estimate(
        expected_rejections=rej, expected_rejections_se=rej_se,
        expected_calls=n_calls, expected_calls_se=calls_se,
        expected_time=time, expected_time_se=time_se, speedup=speedup, speedup_se=speedup_se,
        expected_drafted=n_drafted, expected_drafted_se=drafted_se,
        accepted_at=at, accepted_at_se=at_se,
        acceptance_per_position=per_position, acceptance_per_position_se=per_position_se,
        accepted_length=length, accepted_length_se=length_se, metrics=metrics,
        num_sequences=None)
