"""HuggingFace's draft-length schedule (``HeuristicSchedule``: +2 after a call that kept every
draft, -1 after a rejection), whose lookahead is a state carried from call to call, checked three
ways.

* Against a literal transcription (``reference.adaptive_literal`` with a schedule: the next call's
  length is updated after each call by the rule of ``transformers``'
  ``update_candidate_strategy``),
  enumerated exactly over every execution path: the law of the tokens (the target's), expected
  calls, rejections, per-position rejected masses, the expected time under a cost model and the
  engine metrics, to 1e-12 in float64.
* Against Monte Carlo: ``decode``'s joint law of (tokens, rejected flags, calls) fits the literal
  enumeration (chi-square at ``stats.ALPHA``); a simulation of the literal schedule's clock fits
  ``decoding_time`` within ``stats.Z`` standard errors.
* Against independent recursions on stationary chains: ``stationary_rate`` (the renewal-reward
  ratio of the chain over (lookahead, token)) is the growth of the finite-horizon exact time, and
  ``optimal_rate`` is never beaten by the schedule.
"""

from __future__ import annotations

from collections import defaultdict
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import decoder_checks as checks
import reference as ref
import specjax
import stats
from conftest import chain
from conftest import edge_pair
from conftest import random_pair
from conftest import stationary_pair

COST = specjax.CostModel(0.15, [0.0, 1.0, 1.05, 1.1, 1.2, 1.35, 1.5, 1.7], call_overhead=0.05)


def hf_update(increase, decrease, minimum, maximum):
    """The literal update: ``transformers`` adds 2 when ``num_matches == num_assistant_tokens``
    (every draft kept), else ``max(1, k - 1)``; here with a cap at ``maximum``."""
    def update(k, kept):
        if kept == k:
            return min(k + increase, maximum)
        return max(minimum, k - decrease)
    return update


# name -> (decoder, (initial, literal update), max lookahead for the literal)
SCHEDULES = {
    "HF +2/-1 from 1": (specjax.HeuristicSchedule(1, max_lookahead=3),
                        (1, hf_update(2, 1, 1, 3)), 3),
    "HF +2/-1 from 3": (specjax.HeuristicSchedule(3, max_lookahead=4),
                        (3, hf_update(2, 1, 1, 4)), 4),
    "+1/-2, at least 2": (specjax.HeuristicSchedule(3, max_lookahead=4, increase=1, decrease=2,
                                                    minimum=2),
                          (3, hf_update(1, 2, 2, 4)), 4),
}


def literal_summary(pair, schedule, max_lookahead, cost=COST):
    """The literal schedule enumerated (``reference.adaptive_summary``, a policy that never stops
    a call before its length)."""
    return ref.adaptive_summary(pair, lambda *state: False, cost, max_lookahead,
                                schedule=schedule)


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_exact_matches_literal(name, x64):
    pair = random_pair(11, 3, 5, zero_fraction=0.2)
    decoder, schedule, lookahead = SCHEDULES[name]
    exact = checks.assert_exact_matches_adaptive_literal(
        decoder, pair, literal_summary(pair, schedule, lookahead), COST)
    np.testing.assert_allclose(np.asarray(exact.marginals),
                               np.asarray(specjax.marginals(chain(pair[1]))), atol=1e-12)


def test_literal_is_sensitive(x64):
    """The comparison can fail: a schedule's state matters (fixed lookaheads and the other
    schedules give other times on this instance)."""
    pair = random_pair(11, 3, 5, zero_fraction=0.2)
    _, schedule, lookahead = SCHEDULES["HF +2/-1 from 1"]
    _, _, means = literal_summary(pair, schedule, lookahead)
    others = [specjax.Speculative(lookahead=k) for k in (1, 2, 3)] + [
        SCHEDULES[name][0] for name in SCHEDULES if name != "HF +2/-1 from 1"]
    for other in others:
        timed = specjax.theory.decoding_time(other, *(chain(x) for x in pair), COST)
        assert abs(float(timed.expected_time) - means["time"]) > 1e-3, other


@functools.lru_cache(maxsize=None)
def _constant_schedules():
    """``exact`` of SD and the two constant schedules at ``k`` on the pair of
    ``test_literal_is_sensitive`` (float64), all three ``k`` in one program (one per decoder
    costs about twice the compilation)."""
    with jax.enable_x64(True):
        draft, target = (chain(x) for x in random_pair(11, 3, 5, zero_fraction=0.2))
        values = jax.jit(lambda d, t: {j: [specjax.exact(decoder, d, t) for decoder in (
            specjax.Speculative(lookahead=j),
            specjax.HeuristicSchedule(j, max_lookahead=4, increase=0, decrease=0),
            specjax.HeuristicSchedule(j, max_lookahead=j, minimum=j))] for j in (1, 2, 3)})(
                draft, target)
    return jax.tree.map(np.asarray, values)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_constant_schedule_is_speculative_decoding(k, x64):
    """No change (``increase = decrease = 0``) or one state (``minimum = max_lookahead``): SD with
    lookahead ``k``. (The pair of ``test_literal_is_sensitive``.)"""
    sd, *constant = _constant_schedules()[k]
    for got in constant:
        for field in ("marginals", "rejected", "new_call", "verified"):
            np.testing.assert_allclose(np.asarray(getattr(got, field)),
                                       np.asarray(getattr(sd, field)), atol=1e-12)


# ----------------------------------------------------------------------------- Monte Carlo
NUM_CHAINS = 100_000


@pytest.mark.slow  # a Monte Carlo run of 100,000 chains or more
def test_decode_matches_literal_and_exact():
    pair = random_pair(5, 3, 5, zero_fraction=0.2)
    decoder, schedule, lookahead = SCHEDULES["HF +2/-1 from 1"]
    as32 = [(init.astype(np.float32), trans.astype(np.float32)) for init, trans in pair]
    trace = specjax.decode(jax.random.key(3), decoder, chain(as32[0]), chain(as32[1]),
                           NUM_CHAINS)
    tokens, flags = np.asarray(trace.tokens), np.asarray(trace.rejected)
    calls = np.asarray(trace.num_calls)
    horizon = pair[1][1].shape[0]
    stats.assert_law(stats.count_rows(tokens), ref.target_sequence_law(pair[1]), NUM_CHAINS,
                     "HF schedule: tokens")
    joint = defaultdict(int)
    rows = stats.count_rows(np.concatenate([tokens, flags, calls[:, None]], axis=1))
    for row, count in rows.items():
        joint[(row[:horizon + 1], tuple(bool(v) for v in row[horizon + 1:-1]), row[-1])] += count
    _, literal_joint, means = literal_summary(pair, schedule, lookahead)
    stats.assert_law(dict(joint), literal_joint, NUM_CHAINS,
                     "HF schedule: (tokens, rejected, calls)")
    stats.assert_mean(calls, means["calls"], "HF schedule: calls")
    stats.assert_mean(flags.sum(-1), means["rejections"], "HF schedule: rejections")


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_literal_simulation_of_time_fits_exact(name):
    # The pair of test_exact_matches_literal, whose expected-time programs this shares.
    pair = random_pair(11, 3, 5, zero_fraction=0.2)
    decoder, schedule, lookahead = SCHEDULES[name]
    with jax.enable_x64(True):
        exact = float(specjax.expected_time(decoder, *(chain(x) for x in pair), COST))
    chooser = ref.RandomChooser(np.random.default_rng(2024))
    times = [ref.literal_clock(ref.adaptive_literal(chooser, pair[0], pair[1], lookahead,
                                                    lambda *state: False,
                                                    schedule=schedule)[3], COST)
             for _ in range(3000)]
    stats.assert_mean(times, exact, f"{name}: time")


# ----------------------------------------------------------------------------- long run
def stationary(seed, num_states, horizon):
    """The stationary ``(draft, target)`` of ``conftest.stationary_pair``."""
    return stationary_pair(seed, num_states, horizon)[2:]


def test_stationary_rate_is_the_growth_of_the_finite_horizon_time(x64):
    # HF's rule from 1 in [1, 3] (three call states): the finite-horizon programs compile the
    # call law K + 1 times (forward_calls), twice as many ops at K = 5 as at K = 3.
    decoder = specjax.HeuristicSchedule(1, max_lookahead=3)
    rate = specjax.theory.stationary_rate(decoder, *stationary(4, 3, 8), COST)
    assert rate.start_law.shape == (3, 3)
    # The start and end effects cancel in the difference up to terms that decay geometrically
    # in the horizon (relative 2e-5 at 40 / 80, 2e-8 at 80 / 160, 4e-11 at 120 / 240, 9e-14 at
    # 160 / 320).
    times = [float(specjax.theory.decoding_time(decoder, *stationary(4, 3, t), COST).expected_time)
             for t in (160, 320)]
    np.testing.assert_allclose((times[1] - times[0]) / 160, float(rate.time_per_token),
                               rtol=1e-10)


def test_optimal_rate_beats_the_schedule(x64):
    for seed in (1, 2, 3):
        draft, target = stationary(seed, 3, 8)
        best = specjax.optimal_rate(draft, target, COST, max_lookahead=5)
        for initial in (1, 3, 5):
            hf = specjax.HeuristicSchedule(initial, max_lookahead=5)
            rate = specjax.theory.stationary_rate(hf, draft, target, COST)
            assert float(rate.time_per_token) >= float(best.time_per_token) * (1 - 1e-12)


# ----------------------------------------------------------------------------- edge cases
@pytest.mark.parametrize("use_x64", [False, True])
def test_edge_pairs_values_and_gradients_stay_finite(use_x64):
    (init, p), (_, q) = edge_pair()
    decoder = specjax.HeuristicSchedule(1, max_lookahead=3)
    with jax.enable_x64(use_x64):
        dtype = jnp.float64 if use_x64 else jnp.float32
        target = specjax.MarkovChain(jnp.asarray(init, dtype), jnp.asarray(q, dtype))

        def calls(trans):
            draft = specjax.MarkovChain(jnp.asarray(init, dtype), trans)
            time = specjax.theory.decoding_time(decoder, draft, target, COST).expected_time
            return time, specjax.exact(decoder, draft, target).expected_rejections

        # One compiled program for both drafts.
        value_and_grad = jax.jit(jax.value_and_grad(calls, has_aux=True))
        (value, _), grad = value_and_grad(jnp.asarray(p, dtype))
        assert np.isfinite(float(value))
        assert np.all(np.isfinite(np.asarray(grad)))
        (_, rejections), _ = value_and_grad(target.trans)  # p = q: nothing is rejected
        assert abs(float(rejections)) < 1e-6


def test_validation():
    with pytest.raises(ValueError, match="initial must be in"):
        specjax.HeuristicSchedule(5, max_lookahead=4)
    with pytest.raises(ValueError, match="initial must be in"):
        specjax.HeuristicSchedule(1, max_lookahead=4, minimum=2)
    with pytest.raises(ValueError, match="minimum must be at most"):
        specjax.HeuristicSchedule(3, max_lookahead=2, minimum=3)
    with pytest.raises(ValueError, match="increase must be a non-negative integer"):
        specjax.HeuristicSchedule(1, max_lookahead=4, increase=-1)
    with pytest.raises(ValueError, match="decrease must be a non-negative integer"):
        specjax.HeuristicSchedule(1, max_lookahead=4, decrease=1.5)
    with pytest.raises(ValueError, match="initial is a static setting"):
        specjax.HeuristicSchedule(jnp.asarray(2), max_lookahead=4)
    draft, target = (chain(x) for x in random_pair(3, 3, 6))
    with pytest.raises(ValueError, match="earlier calls"):
        specjax.accepted_length(specjax.HeuristicSchedule(1, max_lookahead=3), draft, target)
