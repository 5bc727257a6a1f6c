"""Recordings from engines' top-``k`` log-probabilities (issue 47, item 1).

Engines return log-probabilities, and often only the ``k`` largest of a row: vLLM's ``logprobs=k``
(sampled tokens) and ``prompt_logprobs=k`` (scored prompts) at most 20 by default
(``max_logprobs``), SGLang's ``top_logprobs_num``, OpenAI-style ``top_logprobs``. vLLM and
SGLang add the **sampled or scored token's** log-probability to the top ``k`` whatever ``k``, so
each position's entries hold the emitted token's probability: ``p_t(x_t)`` and ``q_t(x_t)``
exactly, which is what SD needs. ``from_top_k`` takes, per sequence and position, the ids and
(log-)probabilities the engine gave for the draft and for the target (``(B, T, k)``; ``k`` may
differ between them; ``-1`` marks an empty slot, since an engine gives ``k`` entries where the
emitted token is in the top ``k`` and ``k + 1`` where it is not), and builds the recording
``Recording.from_statistics`` builds from the emitted tokens' probabilities, with the mass outside
the given entries (``1 - sum``, per position and side) as a diagnostic. ``pack_top_k`` turns an
engine's per-position dicts (``{id: logprob}`` or vLLM's ``{id: Logprob}``) into those arrays.

**What such a recording serves** (``TopKRecording.estimate`` refuses the rest, naming why):

* ``Speculative`` at any ``K`` and ``Autoregressive``: exactly as from the full rows;
* ``HeuristicSchedule`` and ``AdaptiveSpeculative`` with a policy that reads no row
  (``FixedLength``, ``RejectionThreshold``, ``ConfidenceThreshold``, ``ThresholdTable``):
  likewise (time and goodput where ``specjax.pairs.adaptive`` gives them from the rows);
* not multi-draft roots (``BatchSpeculative``, ``OptimalMultiDraft``, ``SpecHub``,
  ``KSequential``, ...) nor a ``RejectionRule``: their rates need the whole rows;
* not ``TokenTree``: a node's children are drafted from the draft's whole row;
* not ``EntropyThreshold`` nor a ``StoppingRule``: they read the draft's next row.

Why not the rest: **top-k rows do not give the mass of the tokens outside the top-k**, only its
total. A multi-draft root's rejection rate reads the overlap ``sum_v min(p_t(v), q_t(v))``, the
residual ``[q_t - p_t]_+`` normalised over every token, and the law of ``M`` drafts, all sums over
the whole row; a tree's children are drafted from the whole row and verified against the residual;
an entropy sums over every token. These could be **bounded** from the top ``k`` and the outside
masses ``m`` (the overlap lies between the ``min`` summed over the tokens listed on both sides
and that plus both sides' ``m``; the entropy between the listed terms plus ``m log(1 / p_min)``,
``p_min`` the smallest listed probability, and the listed terms plus ``m log((V - k) / m)``), but
the bounds are not computed: the estimates here are exact or refused. A policy reading only the
draft's largest probability could be served (it is the top-1 entry) but is not: a recording has
no field for it. Lossy rules and call-level decoders that read rows off the path are refused as
``estimate`` refuses them.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import numpy as np

from specjax import _checks
from specjax.pairs.adaptive import call_plan
from specjax.pairs.adaptive import reads_call_depth
from specjax.pairs.estimate import Estimate
from specjax.pairs.estimate import estimate
from specjax.pairs.recording import Recording
from specjax.pairs.recording import check_estimable
from specjax.pairs.recording_checks import check_lengths
from specjax.pairs.recording_checks import check_sizes
from specjax.pairs.recording_checks import check_tokens
from specjax.pairs.recording_checks import check_weights

__all__ = ["MISSING_MASS", "SUM_TOLERANCE", "TopKRecording", "check_top_k_decoder",
           "from_top_k", "pack_top_k"]

#: The least tolerance on a position's top-``k`` sum exceeding 1: engines compute
#: log-probabilities in float32 (or lower), so ``exp`` of what they return sums to ``1 + 1e-7``
#: or so even when stored in float64 (narrower dtypes get ``row_sum_tolerance``'s).
SUM_TOLERANCE = 1e-4

#: The reason every refusal from a top-``k`` recording gives.
MISSING_MASS = "top-k rows do not give the mass of the tokens outside the top-k"


def check_top_k_decoder(decoder, horizon: int) -> None:
    """``ValueError`` naming ``decoder`` and what it reads unless a recording built from top-``k``
    log-probabilities serves it (module docstring): SD, ``Autoregressive``, the schedule and the
    stopping policies that read no row. ``estimate``'s own refusals (lossy rules, call-level
    decoders reading rows off the path, rules bound to the whole models) come first."""
    check_estimable(decoder)
    name = type(decoder).__name__
    if reads_call_depth(decoder):
        policy = call_plan(decoder, horizon).policy
        if policy is not None and policy.reads_draft_rows:
            raise ValueError(
                f"decoder: {name} with {type(policy).__name__} reads the draft's next row (its "
                f"entropy or largest probability) before each draft, and {MISSING_MASS} (an "
                f"entropy sums over every token): dump the full draft rows "
                f"(Recording.from_arrays), or use a policy that reads no row (FixedLength, "
                f"RejectionThreshold, ConfidenceThreshold, ThresholdTable)")
        return
    if decoder.recording_reads in ("emitted", "nothing"):
        return
    if decoder.recording_reads == "path_rows":
        what = ("a tree's nodes are drafted from the draft's whole row at their context and "
                "verified against the target's residual over every token")
    else:
        what = ("its rejection rate reads the whole rows: the overlap sum_v min(p_t(v), "
                "q_t(v)), the residual [q_t - p_t]_+ normalised over every token and the law of "
                "its drafts")
    raise ValueError(
        f"decoder: {name} cannot be estimated from top-k log-probabilities: {MISSING_MASS}, and "
        f"{what} (these sums could be bounded from the outside mass, but are not computed): dump "
        f"the full rows "
        f"(Recording.from_arrays), or record the decoder's rates where the rows are "
        f"(specjax.record or Recording.from_arrays with decoders=...)")


class TopKRecording(NamedTuple):
    """A recording built from top-``k`` log-probabilities (``from_top_k``), and the row mass
    the engine did not give.

    Attributes:
      recording: the ``Recording`` of the emitted tokens' probabilities (exactly what
        ``Recording.from_statistics`` builds from them; no rows): pass it to ``specjax.estimate``
        or ``specjax.pairs.best_lookahead`` for SD, or call ``estimate`` below.
      draft_outside_mass: ``(B, T)``, ``1 - sum`` of the draft's given probabilities at each
        position (clipped at 0; 0 at ragged padding): the mass of the tokens the engine left out.
      target_outside_mass: ``(B, T)``, the target's.
    """

    recording: Recording
    draft_outside_mass: jax.Array  # shape=(B, T)
    target_outside_mass: jax.Array  # shape=(B, T)

    def estimate(self, decoder, **kwargs) -> Estimate:
        """``specjax.estimate(decoder, self.recording, **kwargs)`` after refusing, before any work,
        a decoder that top-``k`` rows do not serve (``check_top_k_decoder``: multi-draft roots,
        token trees, policies reading the draft's row), with the reason: ``MISSING_MASS``."""
        check_top_k_decoder(decoder, self.recording.horizon)
        return estimate(decoder, self.recording, **kwargs)


def _first(mask) -> tuple[int, int]:
    b, t = np.argwhere(mask)[0][:2]
    return int(b), int(t)


def _check_arrays(side: str, ids, values, log: bool):
    """``(ids, values)`` of one side as NumPy arrays, their shapes and dtypes checked."""
    ids_name, values_name = f"{side}_ids", f"{side}_logprobs"
    ids, values = np.asarray(ids), np.asarray(values)
    if ids.ndim != 3 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"{ids_name} must be integers of shape (B, T, k): the ids of the "
                         f"entries the engine gave at each position, got {ids.shape} {ids.dtype}")
    if ids.shape[-1] == 0:
        raise ValueError(f"{ids_name} hold no entries (k = 0): each position needs at least the "
                         f"emitted token's")
    if values.shape != ids.shape or not np.issubdtype(values.dtype, np.floating):
        kind = "log-probabilities" if log else "probabilities (log=False)"
        raise ValueError(f"{values_name} must be float {kind} of the shape of {ids_name}, "
                         f"{ids.shape}, got {values.shape} {values.dtype}")
    return ids, values


def _side(side: str, ids, values, emitted, live, log: bool):
    """``(prob (B, T), outside (B, T))`` of one side: the emitted tokens' probabilities (1 at
    padding) and the mass outside the given entries (0 at padding), every live entry checked."""
    ids_name, values_name = f"{side}_ids", f"{side}_logprobs"
    ids = np.where(live[..., None], ids, -1)  # padding is never read
    if (ids < -1).any():
        b, t = _first((ids < -1).any(-1))
        raise ValueError(f"{ids_name} must be token ids >= 0, or -1 for an empty slot; sequence "
                         f"{b}, position t = {t + 1} holds {int(ids[b, t].min())}")
    if ids.max() > np.iinfo(np.int32).max:
        raise ValueError(f"{ids_name} must be int32 ids, below 2**31, got {int(ids.max())}")
    filled = ids >= 0
    raw = values.astype(np.float64)
    with np.errstate(over="ignore"):
        probs = np.exp(raw) if log else raw
    bad = filled & ~((raw <= 0) if log else ((raw >= 0) & (raw <= 1)))  # NaN is bad too
    if bad.any():
        b, t = _first(bad.any(-1))
        what = "log-probabilities in [-inf, 0]" if log else "probabilities in [0, 1] (log=False)"
        raise ValueError(f"{values_name} must hold {what}; sequence {b}, position t = {t + 1} "
                         f"holds {raw[b, t][bad[b, t]][0]!r}")
    ordered = np.sort(ids, axis=-1)
    twice = (ordered[..., 1:] == ordered[..., :-1]) & (ordered[..., 1:] >= 0)
    if twice.any():
        b, t = _first(twice.any(-1))
        token = int(ordered[b, t, 1:][twice[b, t]][0])
        raise ValueError(f"{ids_name}: token {token} appears twice at sequence {b}, position t = "
                         f"{t + 1}; an engine's entries name distinct tokens")
    match = ids == emitted[..., None]
    missing = live & ~match.any(-1)
    if missing.any():
        b, t = _first(missing)
        raise ValueError(
            f"{ids_name}: the emitted token x_{t + 1} = {int(emitted[b, t])} of sequence {b} "
            f"(position t = {t + 1}, index {t}) is not among the ids given there "
            f"({sorted(int(i) for i in ids[b, t] if i >= 0)}); pass the engine's entry of the "
            f"emitted token with the top k (vLLM's logprobs and prompt_logprobs, SGLang's "
            f"output_token_logprobs and input_token_logprobs hold it whatever k): it is the "
            f"entry SD reads")
    total = np.sum(np.where(filled, probs, 0.0), axis=-1)
    tolerance = max(SUM_TOLERANCE, _checks.row_sum_tolerance(values.dtype))
    over = total > 1 + tolerance
    if over.any():
        b, t = _first(over)
        raise ValueError(f"{values_name}: the probabilities given at sequence {b}, position t = "
                         f"{t + 1} sum to {total[b, t]:.6g} > 1: not the entries of one law (an "
                         f"entry of another position or model mixed in?)")
    prob = np.where(live, np.sum(np.where(match, probs, 0.0), axis=-1), 1.0)
    outside = np.where(live, np.clip(1.0 - total, 0.0, 1.0), 0.0)
    return prob, outside


def from_top_k(tokens, draft_ids, draft_logprobs, target_ids, target_logprobs, *, weights=None,
               lengths=None, eos=None, log=True) -> TopKRecording:
    """A recording from an engine's top-``k`` log-probabilities, each position's entries holding
    the emitted token's (module docstring).

    Args:
      tokens: ``(B, T + 1)`` ints, ``x_0..x_T`` of ``B`` target rollouts (``x_0`` the prompt's
        last token).
      draft_ids: ``(B, T, k)`` ints: at index ``t - 1`` the ids of the entries the draft's engine
        gave for position ``t`` (its top ``k`` and the emitted token ``x_t``, in any order;
        ``-1`` for an empty slot); vLLM's ``prompt_logprobs`` of the prompt and generated ids.
      draft_logprobs: ``(B, T, k)`` floats: their natural log-probabilities (``-inf`` for 0;
        probabilities with ``log=False``); empty slots are not read.
      target_ids: ``(B, T, k')`` ints: the target's, likewise (``k'`` may differ from ``k``);
        vLLM's ``logprobs`` of the sampled tokens.
      target_logprobs: ``(B, T, k')`` floats.
      weights, lengths, eos: as ``Recording.from_arrays``'s (ragged requests: the entries past a
        sequence's length are padding, never read).
      log: ``True`` (default): the values are log-probabilities; ``False``: probabilities.

    Returns:
      ``TopKRecording``: the ``Recording`` ``Recording.from_statistics`` builds from the emitted
      tokens' probabilities, and each side's mass outside the given entries.

    Raises:
      ValueError: shapes that do not match; ids below -1 or not ints; log-probabilities above 0
        or NaN (probabilities outside ``[0, 1]``); a token given twice at a position; a
        position's probabilities summing over 1 (``SUM_TOLERANCE``); the emitted token missing
        from a position's ids (naming the sequence and the position); what
        ``Recording.from_statistics`` refuses (bad weights or lengths, a recorded token of target
        probability 0). All before any work.

    Example:
      >>> import numpy as np, specjax
      >>> tokens = np.array([[0, 2, 1]])               # B = 1, T = 2: x_1 = 2, x_2 = 1
      >>> q_ids = np.array([[[2, 0], [0, 1]]])         # the target's top 2 at t = 1, 2
      >>> q_logp = np.log([[[0.6, 0.3], [0.5, 0.4]]])
      >>> p_ids = np.array([[[0, 2], [1, 2]]])
      >>> p_logp = np.log([[[0.5, 0.25], [0.7, 0.2]]])
      >>> dump = specjax.pairs.from_top_k(tokens, p_ids, p_logp, q_ids, q_logp)
      >>> print(*[round(float(v), 3) for v in dump.recording.draft_prob[0]])
      0.25 0.7
      >>> print(*[round(float(v), 3) for v in dump.target_outside_mass[0]])
      0.1 0.1
    """
    _checks.check_bool("log", log)
    draft = _check_arrays("draft", draft_ids, draft_logprobs, log)
    target = _check_arrays("target", target_ids, target_logprobs, log)
    if draft[0].shape[:2] != target[0].shape[:2]:
        raise ValueError(f"draft_ids and target_ids must share (B, T) (k may differ), got "
                         f"{draft[0].shape} and {target[0].shape}")
    num, horizon = target[0].shape[:2]
    check_sizes("draft_ids and target_ids", num, horizon)
    tokens, lengths, live = check_lengths(tokens, lengths, eos, num, horizon)
    tokens = np.asarray(check_tokens(tokens, num, horizon, None))
    check_weights(weights, num)
    live = np.ones((num, horizon), bool) if live is None else live
    emitted = tokens[:, 1:]
    draft_prob, draft_outside = _side("draft", *draft, emitted, live, log)
    target_prob, target_outside = _side("target", *target, emitted, live, log)
    recording = Recording.from_statistics(
        tokens, _checks.host_array(draft_prob), _checks.host_array(target_prob), weights=weights,
        lengths=None if lengths is None else np.asarray(lengths))
    return TopKRecording(recording, *(_checks.device_array(x)
                                      for x in (draft_outside, target_outside)))


def pack_top_k(steps, *, horizon=None):
    """``(ids, logprobs)`` ``(B, T, k)`` arrays for ``from_top_k`` from an engine's per-position
    entries: ``steps[b][t - 1]`` a dict from token id to its log-probability (a float, or an
    object with a ``logprob`` attribute: vLLM's ``Logprob``), e.g. ``output.outputs[0].logprobs``
    of each request, or its ``prompt_logprobs[len(prompt):]`` (entry 0 of ``prompt_logprobs``,
    ``None``, is the first prompt token's). ``k`` is the largest number of entries at a position;
    ``T`` the longest sequence (or ``horizon``); missing slots and positions are id ``-1`` and
    ``-inf`` (a shorter sequence's positions are padding: give its ``lengths``).

    Raises:
      ValueError: ``steps`` not a non-empty list of lists of dicts (naming the sequence and
        position), an id that is not an int, a value that is not a number, ``horizon`` shorter
        than a sequence.
    """
    if not isinstance(steps, (list, tuple)) or not steps:
        raise ValueError("steps must be a non-empty list (one entry per sequence) of lists (one "
                         "per position) of dicts {token id: log-probability}")
    for b, sequence in enumerate(steps):
        if not isinstance(sequence, (list, tuple)):
            raise ValueError(f"steps: sequence {b} must be a list of dicts (one per position), "
                             f"got {type(sequence).__name__}")
        for t, entries in enumerate(sequence):
            if not isinstance(entries, dict):
                raise ValueError(f"steps: sequence {b}, position t = {t + 1} must be a dict "
                                 f"{{token id: log-probability}}, got {type(entries).__name__} "
                                 f"(drop prompt_logprobs' leading None)")
    longest = max(len(sequence) for sequence in steps)
    if longest == 0:
        raise ValueError("steps hold no positions: each sequence needs its emitted tokens' "
                         "entries")
    if horizon is None:
        horizon = longest
    _checks.check_static_int("horizon", horizon)
    if horizon < longest:
        raise ValueError(f"horizon must be at least the longest sequence, {longest}, got "
                         f"{horizon}")
    width = max(1, max((len(e) for sequence in steps for e in sequence), default=1))
    ids = np.full((len(steps), horizon, width), -1, np.int64)
    values = np.full((len(steps), horizon, width), -np.inf, np.float64)
    for b, sequence in enumerate(steps):
        for t, entries in enumerate(sequence):
            for j, (token, value) in enumerate(entries.items()):
                if isinstance(token, bool) or not isinstance(token, (int, np.integer)):
                    raise ValueError(f"steps: sequence {b}, position t = {t + 1}: token ids "
                                     f"must be ints, got {token!r}"[:300])
                value = getattr(value, "logprob", value)
                if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
                    raise ValueError(f"steps: sequence {b}, position t = {t + 1}: the value of "
                                     f"token {token} must be a number, got {value!r}"[:300])
                ids[b, t, j], values[b, t, j] = token, value
    return ids, values
