"""Adaptive draft lengths and HuggingFace's schedule from a recording (issue 47, item 2): the
phase filter over the call's depth and the schedule's call state (``specjax.pairs.adaptive``).

* exactness: on a V = 3, T = 4 pair with zeros, disjoint supports and p = q rows, every sequence
  enumerated and weighted by its target probability, ``estimate`` of ``AdaptiveSpeculative``
  (fixed length, SpecDec++'s rejection threshold, entropy and confidence thresholds, a random
  threshold table, the optimal policy's table, a user's rule, ``max_lookahead=1``) and of
  ``HeuristicSchedule`` equals ``exact`` and ``engine_metrics`` to 1e-10 in float64, through
  full rows, log-probability rows (``logits=True``) and, for policies that read no row, the
  emitted tokens' log-probabilities (``log=True``); where a call's length is set when it starts
  (fixed length, the schedule, ``max_lookahead=1``) the drafted tokens, ``decoding_time`` and
  ``serving_rate`` too;
* ragged requests: every sequence up to its first stop token (``lengths=``, ``eos=``, log rows),
  against a literal transcription (``reference.adaptive_literal``) enumerated over every
  execution path and cut at the stop token as ``decode`` cuts a run;
* Monte Carlo: from 1,000 recorded rollouts each estimate is within 4.5 standard errors of
  ``exact`` (a false-failure rate of 7e-6 per comparison); with a stop token, of ``decode``'s
  mean;
* a distillation objective (``decoding_objective``) has finite gradients through the filter;
* refusals: a cost model where the drafted tokens are off the path, a policy reading the draft's
  next row without rows, a table that does not fit, an adaptive decoder among ``decoders=``.
"""

from __future__ import annotations

from collections import defaultdict

import jax
import numpy as np
import pytest

import reference as ref
import specjax
from conftest import every_ragged_sequence
from conftest import every_sequence
from specjax.pairs import Recording
from specjax.pairs.distill import decoding_objective

D = specjax.decoders
V, T, K, STOP = 3, 4, 3, 2
COST = specjax.CostModel(0.1, [0.0] + [1.0 + 0.1 * n for n in range(40)], call_overhead=0.05)
SERVING = specjax.ServingCost(0.05, specjax.theory.roofline(1.0, knee=4, size=512), overhead=0.1)


def _entropy(row):
    pos = np.asarray(row, np.float64)[np.asarray(row) > 0]
    return float(-(pos * np.log(pos)).sum())


def user_rule(state):
    """Autoregressive calls at even positions, else stop after drafting token 1."""
    return ((state.depth == 0) & (state.position % 2 == 0)) | (
        (state.depth > 0) & (state.token == 1))


TABLE = np.random.default_rng(7).uniform(0, 1, size=(T, K + 1, V))

# name -> (decoder, literal stop(position, depth, token, token_prob, all_accepted, row) or a
# schedule (initial, update), whether a call's length is known when it starts)
CASES = {
    "fixed 2": (specjax.AdaptiveSpeculative(D.FixedLength(2), max_lookahead=K),
                lambda t, d, x, pr, a, row: d >= 2, True),
    "SpecDec++ 0.3": (specjax.AdaptiveSpeculative(D.RejectionThreshold(0.3), max_lookahead=K),
                      lambda t, d, x, pr, a, row: d > 0 and 1 - a > 0.3, False),
    "entropy 0.8": (specjax.AdaptiveSpeculative(D.EntropyThreshold(0.8), max_lookahead=K),
                    lambda t, d, x, pr, a, row: d > 0 and _entropy(row) > 0.8, False),
    "confidence 0.4": (specjax.AdaptiveSpeculative(D.ConfidenceThreshold(0.4), max_lookahead=K),
                       lambda t, d, x, pr, a, row: d > 0 and pr < 0.4, False),
    "table": (specjax.AdaptiveSpeculative(D.ThresholdTable(TABLE), max_lookahead=K),
              lambda t, d, x, pr, a, row: a <= TABLE[t - d - 1, d, x], False),
    "user rule": (specjax.AdaptiveSpeculative(D.StoppingRule(user_rule), max_lookahead=K),
                  lambda t, d, x, pr, a, row: (d == 0 and t % 2 == 0) or (d > 0 and x == 1),
                  False),
    "user rule K = 1": (specjax.AdaptiveSpeculative(D.StoppingRule(user_rule), max_lookahead=1),
                        lambda t, d, x, pr, a, row: d == 0 and t % 2 == 0, True),
    "HF schedule": (D.HeuristicSchedule(1, max_lookahead=K),
                    (1, lambda k, kept: min(k + 2, K) if kept >= k else max(k - 1, 1)), True),
    "schedule +1 / -2 from 3": (
        D.HeuristicSchedule(3, max_lookahead=4, increase=1, decrease=2),
        (3, lambda k, kept: min(k + 1, 4) if kept >= k else max(k - 2, 1)), True),
}
READS_ROWS = ("entropy 0.8", "user rule", "user rule K = 1")


def _pair():
    rng = np.random.default_rng(1)
    init = rng.dirichlet(np.ones(V))
    p = rng.dirichlet(np.ones(V), size=(T, V))
    q = rng.dirichlet(np.ones(V), size=(T, V))
    q[1, 2] = [0.0, 0.3, 0.7]
    p[1, 2] = [1.0, 0.0, 0.0]  # disjoint supports
    p[2, 0] = q[2, 0]  # p = q
    return init, p, q


def _models():
    init, p, q = _pair()
    return specjax.MarkovChain(init, p), specjax.MarkovChain(init, q)


def _at(seqs, rows):
    return np.take_along_axis(np.nan_to_num(rows), np.maximum(seqs[:, 1:], 0)[..., None],
                              -1)[..., 0]


def _recordings(seqs, weights, p_rows, q_rows, lengths=None):
    """The same sequences through full rows, log rows and the emitted tokens' log-probabilities."""
    with np.errstate(divide="ignore"):
        log_p, log_q = np.log(p_rows), np.log(q_rows)
        stats = np.log(_at(seqs, p_rows)), np.log(_at(seqs, q_rows))
    return {
        "rows": Recording.from_arrays(seqs, p_rows, q_rows, weights=weights, lengths=lengths),
        "log rows": Recording.from_arrays(seqs, log_p, log_q, weights=weights, lengths=lengths,
                                          logits=True),
        "log statistics": Recording.from_statistics(seqs, *stats, weights=weights,
                                                    lengths=lengths, log=True),
    }


def _decoder(name, draft, target):
    if name == "optimal":
        return specjax.theory.optimal_stopping(draft, target, COST, max_lookahead=K).decoder
    return CASES[name][0]


@pytest.mark.parametrize("name", sorted(CASES) + ["optimal"])
def test_every_sequence_weighted_equals_exact(x64, name):
    draft, target = _models()
    seqs, weights, p_rows, q_rows = every_sequence(*_pair())
    decoder = _decoder(name, draft, target)
    known = CASES[name][2] if name in CASES else False
    exact = specjax.exact(decoder, draft, target)
    metrics = specjax.theory.engine_metrics(decoder, draft, target)
    recordings = _recordings(seqs, weights, p_rows, q_rows)
    for how, rec in recordings.items():
        if how == "log statistics" and name in READS_ROWS:
            with pytest.raises(ValueError, match="reads the draft's next row"):
                specjax.estimate(decoder, rec)
            continue
        est = specjax.estimate(decoder, rec)
        assert abs(float(est.expected_calls - exact.expected_calls)) < 1e-10, how
        assert abs(float(est.expected_rejections - exact.expected_rejections)) < 1e-10, how
        for field in ("accepted_at", "acceptance_per_position", "mean_acceptance_length",
                      "conditional_acceptance"):
            np.testing.assert_allclose(getattr(est.metrics, field), getattr(metrics, field),
                                       rtol=0, atol=1e-10, err_msg=f"{field} {how}")
        if not known:
            assert est.expected_drafted is None and est.metrics.draft_acceptance_rate is None, how
            continue
        assert abs(float(est.expected_drafted - metrics.expected_drafted)) < 1e-10, how
        timed = specjax.estimate(decoder, rec, cost=COST)
        time = specjax.theory.decoding_time(decoder, draft, target, COST)
        assert abs(float(timed.expected_time - time.expected_time)) < 1e-10, how
        assert abs(float(timed.speedup - time.speedup)) < 1e-10, how
    rec = recordings["rows"]
    if known:
        got = specjax.estimate(decoder, rec, cost=SERVING, batch_size=4)
        want = specjax.serving_rate(decoder, draft, target, SERVING, batch_size=4)
        assert abs(float(got.tokens_per_time - want.tokens_per_time)) < 1e-10
        assert abs(float(got.speedup - want.speedup)) < 1e-10
    else:
        with pytest.raises(ValueError, match="off the emitted path"):
            specjax.estimate(decoder, rec, cost=COST)
        with pytest.raises(ValueError, match="off the emitted path"):
            specjax.estimate(decoder, rec, cost=SERVING, batch_size=4)


def test_fixed_length_is_speculative_decoding(x64):
    seqs, weights, p_rows, q_rows = every_sequence(*_pair())
    rec = Recording.from_arrays(seqs, p_rows, q_rows, weights=weights)
    adaptive = specjax.estimate(CASES["fixed 2"][0], rec, cost=COST)
    sd = specjax.estimate(specjax.Speculative(lookahead=2), rec, cost=COST)
    for field in ("expected_calls", "expected_rejections", "expected_time", "expected_drafted",
                  "expected_calls_se", "expected_time_se"):
        assert abs(float(getattr(adaptive, field) - getattr(sd, field))) < 1e-12, field


def test_a_schedule_over_a_longer_horizon(x64):
    """T = 7 (V = 2): the call state goes up and down several times (at T = 4 the schedule's
    calls can coincide with SD's)."""
    rng = np.random.default_rng(3)
    init = rng.dirichlet(np.ones(2))
    p, q = (rng.dirichlet(np.ones(2), size=(7, 2)) for _ in range(2))
    draft, target = specjax.MarkovChain(init, p), specjax.MarkovChain(init, q)
    seqs, weights, p_rows, q_rows = every_sequence(init, p, q)
    rec = Recording.from_arrays(seqs, p_rows, q_rows, weights=weights)
    schedule = D.HeuristicSchedule(2, max_lookahead=4)
    exact = specjax.exact(schedule, draft, target)
    metrics = specjax.theory.engine_metrics(schedule, draft, target)
    time = specjax.theory.decoding_time(schedule, draft, target, COST)
    est = specjax.estimate(schedule, rec, cost=COST)
    assert abs(float(est.expected_calls - exact.expected_calls)) < 1e-10
    assert abs(float(est.expected_rejections - exact.expected_rejections)) < 1e-10
    assert abs(float(est.expected_drafted - metrics.expected_drafted)) < 1e-10
    assert abs(float(est.expected_time - time.expected_time)) < 1e-10
    np.testing.assert_allclose(est.accepted_at, metrics.accepted_at, rtol=0, atol=1e-10)
    for k in range(1, 5):  # not any fixed lookahead's
        sd = specjax.estimate(specjax.Speculative(lookahead=k), rec)
        assert abs(float(sd.expected_calls - est.expected_calls)) > 1e-3, k


# ----------------------------------------------------------------------------- ragged requests
def _ragged():
    """Every sequence up to its first stop token: tokens (padding -1), lengths, weights, and the
    rows along it (padding NaN)."""
    return every_ragged_sequence(*_pair(), STOP)


def _literal_with_stop(name, lookahead):
    """The literal decoder enumerated, each run cut after its first stop token as ``decode``
    cuts it (the call that emits it counts, later calls, rejections and kept drafts do not):
    the means of the calls, rejections, drafted tokens, time and calls keeping >= i drafts."""
    init, p, q = _pair()
    rule = CASES[name][1]
    stop, schedule = (rule, None) if callable(rule) else ((lambda *state: False), rule)
    k = CASES[name][0].max_lookahead

    def run(chooser):
        x, flags, _, rounds = ref.adaptive_literal(chooser, (init, p), (init, q), k, stop,
                                                   schedule=schedule)
        end = next((i for i in range(1, T + 1) if x[i] == STOP), T)
        calls, drafted, kept_at, n = 0, 0, [0] * lookahead, 1
        time = 0.0
        for d, kept in rounds:
            if n <= end:
                calls += 1
                drafted += d
                time += ref.literal_clock([(d, kept)], COST)
                for i in range(min(kept, end - n + 1)):
                    kept_at[i] += 1
            n += kept + 1
        return calls, sum(flags[:end]), drafted, time, tuple(kept_at)

    means = defaultdict(float)
    for (calls, rejections, drafted, time, kept_at), prob in ref.enumerate_law(run).items():
        means["calls"] += prob * calls
        means["rejections"] += prob * rejections
        means["drafted"] += prob * drafted
        means["time"] += prob * time
        means["accepted_at"] = means.get("accepted_at", 0) + prob * np.asarray(kept_at, float)
    return means


@pytest.mark.parametrize("name", ["fixed 2", "SpecDec++ 0.3", "entropy 0.8", "table",
                                  "user rule K = 1", "HF schedule", "schedule +1 / -2 from 3"])
def test_every_ragged_sequence_weighted_equals_the_literal_decoder(x64, name):
    seqs, lengths, weights, p_rows, q_rows = _ragged()
    assert abs(weights.sum() - 1) < 1e-12
    decoder, _, known = CASES[name]
    want = _literal_with_stop(name, min(decoder.max_lookahead, T))
    recordings = _recordings(seqs, weights, p_rows, q_rows, lengths=lengths)
    recordings["eos"] = Recording.from_arrays(np.where(seqs < 0, STOP, seqs), p_rows, q_rows,
                                              weights=weights, eos=STOP)
    if name in READS_ROWS:
        del recordings["log statistics"]
    for how, rec in recordings.items():
        est = specjax.estimate(decoder, rec, cost=COST if known else None)
        assert abs(float(est.expected_calls) - want["calls"]) < 1e-10, how
        assert abs(float(est.expected_rejections) - want["rejections"]) < 1e-10, how
        np.testing.assert_allclose(est.accepted_at, want["accepted_at"], rtol=0, atol=1e-10,
                                   err_msg=how)
        if known:
            assert abs(float(est.expected_drafted) - want["drafted"]) < 1e-10, how
            assert abs(float(est.expected_time) - want["time"]) < 1e-10, how


# ----------------------------------------------------------------------------- Monte Carlo
MC_DECODERS = (
    specjax.AdaptiveSpeculative(D.RejectionThreshold(0.3), max_lookahead=3),
    specjax.AdaptiveSpeculative(D.EntropyThreshold(1.0), max_lookahead=3),
    specjax.AdaptiveSpeculative(D.ConfidenceThreshold(0.3), max_lookahead=3),
    D.HeuristicSchedule(2, max_lookahead=5),
)


def test_recorded_rollouts_are_within_the_standard_error():
    draft, target = specjax.paper_instance(num_states=5, horizon=30)
    rec = specjax.record(jax.random.key(3), draft, target, 1000, keep_rows=True)
    for decoder in MC_DECODERS:
        est = specjax.estimate(decoder, rec)
        exact = specjax.exact(decoder, draft, target)
        for field in ("expected_calls", "expected_rejections"):
            z = (float(getattr(est, field)) - float(getattr(exact, field))) / float(
                getattr(est, field + "_se"))
            assert abs(z) < 4.5, (decoder.label, field, z)


def test_a_ragged_estimate_agrees_with_decode():
    draft, target = specjax.paper_instance(num_states=5, horizon=30)
    rec = specjax.record(jax.random.key(4), draft, target, 1000, keep_rows=True, stop_tokens=3)
    assert rec.lengths is not None and int(np.min(rec.lengths)) < rec.horizon
    for decoder in (MC_DECODERS[0], MC_DECODERS[-1]):
        est = specjax.estimate(decoder, rec)
        trace = specjax.decode(jax.random.key(5), decoder, draft, target, 2000, stop_tokens=3)
        for field, counts in (("expected_calls", trace.num_calls),
                              ("expected_rejections", trace.num_rejections)):
            counts = np.asarray(counts, np.float64)
            se = np.hypot(float(getattr(est, field + "_se")), counts.std(ddof=1) /
                          np.sqrt(counts.size))
            assert abs(float(getattr(est, field)) - counts.mean()) < 4.5 * se, (decoder.label,
                                                                                field)


def test_a_distillation_objective_differentiates_through_the_filter():
    draft, target = specjax.paper_instance(num_states=5, horizon=20)
    rec = specjax.record(jax.random.key(0), draft, target, 200, keep_rows=True)

    def apply(params, tokens):
        return jax.numpy.broadcast_to(params, tokens[:, :-1].shape + (5,))

    for decoder in (MC_DECODERS[1], MC_DECODERS[-1]):
        loss = decoding_objective(decoder, apply, logits=True, measure="rejections")
        grad = jax.grad(lambda params: loss(params, rec).value)(jax.numpy.zeros(5))
        assert np.isfinite(np.asarray(grad)).all() and np.abs(np.asarray(grad)).max() > 0
    timed = decoding_objective(MC_DECODERS[1], apply, logits=True, measure="time", cost=COST)
    with pytest.raises(ValueError, match="off the emitted path"):
        timed(jax.numpy.zeros(5), rec)


# ----------------------------------------------------------------------------- refusals
def test_what_a_recording_cannot_tell_is_refused():
    seqs, weights, p_rows, q_rows = every_sequence(*_pair())
    rec = Recording.from_arrays(seqs, p_rows, q_rows, weights=weights)
    stats = Recording.from_statistics(rec.tokens, rec.draft_prob, rec.target_prob,
                                      weights=rec.weights)
    spec = CASES["SpecDec++ 0.3"][0]
    with pytest.raises(ValueError, match=r"cost: the time of adaptive SD .* off the emitted path"):
        specjax.estimate(spec, rec, cost=COST)
    with pytest.raises(ValueError, match="reads the draft's next row"):
        specjax.estimate(CASES["entropy 0.8"][0], stats)
    with pytest.raises(ValueError, match="reads the draft's next row"):
        specjax.estimate(CASES["user rule"][0], stats)
    assert float(specjax.estimate(spec, stats).expected_calls) == pytest.approx(
        float(specjax.estimate(spec, rec).expected_calls), abs=1e-6)
    small = specjax.AdaptiveSpeculative(D.ThresholdTable(TABLE[:, :2]), max_lookahead=K)
    for recording in (rec, stats):
        with pytest.raises(ValueError, match=r"thresholds must have shape \(T, K \+ 1, V\)"):
            specjax.estimate(small, recording)
    with pytest.raises(ValueError, match="no per-position rates to record"):
        Recording.from_arrays(seqs, p_rows, q_rows, decoders=(spec,))
    with pytest.raises(ValueError, match="off the recorded path"):
        specjax.estimate(specjax.BlockVerification(2), rec)
