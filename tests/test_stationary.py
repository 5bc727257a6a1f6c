"""The long-run rate on stationary chains (``stationary_rate``) and the optimal adaptive draft
length for it (``optimal_rate``, an average-cost semi-Markov decision problem), checked three ways.

* Against a literal transcription of one call (draft token by token, asking the policy before
  each draft; then verify in order, residual on the first rejection, bonus when all are kept),
  enumerated exactly over every path, and the renewal-reward ratio of its call chain (NumPy,
  float64): ``stationary_rate`` to 1e-12, and ``optimal_rate`` equal to the best of every
  deterministic path-dependent policy (brute force, 2**6 and 2**12 policies).
* Against independent recursions: the finite-horizon exact time (``decoding_time``, the forward
  recursion over positions) grows by ``lambda`` per token far from the ends; the finite-horizon
  optimum (``optimal_stopping``, backward induction over positions) grows by the optimal
  ``lambda``.
* Against Monte Carlo: the optimal decoder's simulated time per token on a long chain within
  ``stats.Z`` standard errors of its exact time.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
import stats
from conftest import chain
from conftest import edge_pair
from conftest import lift
from conftest import random_pair
from conftest import stationary_pair

COST = specjax.CostModel(0.15, [0.0, 1.0, 1.05, 1.1, 1.2, 1.35, 1.5, 1.7], call_overhead=0.05)


def literal_call(a, p, q, max_lookahead, stop):
    """One call from token ``a``, literally: ``stop(path)`` (the drafted tokens so far, a tuple)
    decides before each draft; at ``K`` drafts the call stops. Returns ``(end law (V,),
    E[tokens], E[drafts])``."""
    num_states = len(q)
    end, tokens, drafts = np.zeros(num_states), 0.0, 0.0

    def draft(path, mass):
        nonlocal drafts
        if len(path) == max_lookahead or stop(path):
            drafts += mass * len(path)
            verify(path, mass)
            return
        prev = path[-1] if path else a
        for x in range(num_states):
            if p[prev, x] > 0:
                draft(path + (x,), mass * p[prev, x])

    def verify(path, mass):
        nonlocal tokens
        prev = a
        for i, x in enumerate(path):
            keep = min(1.0, q[prev, x] / p[prev, x])
            residual = np.maximum(q[prev] - p[prev], 0)
            if keep < 1:
                end[:] += mass * (1 - keep) * residual / residual.sum()
                tokens += mass * (1 - keep) * (i + 1)
            mass *= keep
            prev = x
        end[:] += mass * q[prev]  # every draft kept: the bonus token
        tokens += mass * (len(path) + 1)

    draft((), 1.0)
    return end, tokens, drafts


def literal_call_chain(p, q, max_lookahead, stop, cost):
    """The chain of call starts of a stationary policy ``stop(a, path)``, by the literal call
    from each start token ``a`` (NumPy float64): ``(kernel, E[tokens], E[time])``."""
    num_states = len(q)
    kernel, tokens, times = np.zeros((num_states, num_states)), np.zeros(num_states), []
    for a in range(num_states):
        call_stop = (lambda path, a=a: stop(a, path))
        kernel[a], tokens[a], _ = literal_call(a, p, q, max_lookahead, call_stop)
        # The time of the call: its drafts and the tokens the target scores, path by path.
        times.append(call_time(a, p, q, max_lookahead, call_stop, cost))
    return kernel, tokens, np.asarray(times)


def renewal_rate(p, q, max_lookahead, stop, cost):
    """Time per token of a stationary policy by the renewal-reward theorem (NumPy float64), the
    stationary law an eigenvector of the call chain (irreducible)."""
    kernel, tokens, times = literal_call_chain(p, q, max_lookahead, stop, cost)
    values, vectors = np.linalg.eig(kernel.T)
    mu = np.real(vectors[:, np.argmin(np.abs(values - 1))])
    mu = mu / mu.sum()
    return float(mu @ times / (mu @ tokens))


def call_time(a, p, q, max_lookahead, stop, cost):
    num_states = len(q)

    def walk(path, mass):
        if len(path) == max_lookahead or stop(path):
            return mass * cost.call_time(draft_passes=len(path), tokens_scored=len(path) + 1)
        prev = path[-1] if path else a
        return sum(walk(path + (x,), mass * p[prev, x]) for x in range(num_states)
                   if p[prev, x] > 0)

    return walk((), 1.0)


def fixed(k):
    return specjax.AdaptiveSpeculative(specjax.decoders.FixedLength(k), max_lookahead=k)


@pytest.mark.parametrize("seed,num_states,k", [(0, 3, 3), (1, 4, 2), (2, 2, 5)])
def test_stationary_rate_of_sd_is_the_literal_renewal_ratio(x64, seed, num_states, k):
    p, q, draft, target = stationary_pair(seed, num_states)
    rate = specjax.theory.stationary_rate(fixed(k), draft, target, COST)
    expected = renewal_rate(p, q, k, lambda a, path: False, COST)
    np.testing.assert_allclose(float(rate.time_per_token), expected, rtol=1e-12)
    np.testing.assert_allclose(float(rate.tokens_per_time), 1 / expected, rtol=1e-12)
    np.testing.assert_allclose(float(jnp.sum(rate.start_law)), 1, rtol=1e-12)
    np.testing.assert_allclose(float(rate.start_law @ rate.relative_values), 0, atol=1e-12)


def test_stationary_rate_of_a_heuristic_is_the_literal_renewal_ratio(x64):
    # V = 4, K = 4: test_optimal_rate_is_never_beaten's SpecDec++ kernel serves both.
    p, q, draft, target = stationary_pair(3, 4)

    def all_accepted(a, path):
        prev, acc = a, 1.0
        for x in path:
            acc *= min(1.0, q[prev, x] / p[prev, x])
            prev = x
        return acc

    spec = specjax.AdaptiveSpeculative(specjax.decoders.RejectionThreshold(0.4), max_lookahead=4)
    rate = specjax.theory.stationary_rate(spec, draft, target, COST)
    expected = renewal_rate(p, q, 4, lambda a, path: bool(path) and
                            1 - all_accepted(a, path) > 0.4, COST)
    np.testing.assert_allclose(float(rate.time_per_token), expected, rtol=1e-12)


@pytest.mark.parametrize("decoder", [fixed(3), specjax.TokenTree((2, 1)),
                                     specjax.AdaptiveSpeculative(
                                         specjax.decoders.EntropyThreshold(0.9),
                                         max_lookahead=3)])
def test_stationary_rate_is_the_growth_of_the_finite_horizon_time(x64, decoder):
    """``decoding_time`` (forward recursion over positions) on horizons 60 and 120: the difference
    is ``60 lambda`` (the start and end effects cancel, the chain mixes fast)."""
    p, q, _, _ = stationary_pair(4, 3)
    rate = specjax.theory.stationary_rate(decoder, lift(p, 8), lift(q, 8), COST)
    times = [float(specjax.theory.decoding_time(decoder, lift(p, t), lift(q, t),
                                                COST).expected_time)
             for t in (60, 120)]
    np.testing.assert_allclose((times[1] - times[0]) / 60, float(rate.time_per_token),
                               rtol=1e-9)


@pytest.mark.parametrize("seed,num_states,k,cost", [
    (5, 3, 3, specjax.CostModel(0.1, 1.0)),
    (6, 3, 3, COST),  # V = 3 as the other cases: their programs are shared
    (7, 3, 4, specjax.CostModel(0.02, 1.0)),
    (8, 3, 3, specjax.CostModel(0.5, 1.0, call_overhead=0.2)),
])
def test_optimal_rate_is_the_growth_of_the_finite_horizon_optimum(x64, seed, num_states, k,
                                                                  cost):
    """Backward induction over positions (``optimal_stopping``, horizon 160): far from the end
    (150 tokens; the end's effect decays geometrically, below 1e-12 there on these instances)
    its value grows by the optimal ``lambda`` per token."""
    _, _, draft, target = stationary_pair(seed, num_states, horizon=160)
    best = specjax.optimal_rate(draft, target, cost, max_lookahead=k)
    finite = specjax.theory.optimal_stopping(draft, target, cost, max_lookahead=k)
    growth = np.asarray(finite.values[10] - finite.values[11])
    np.testing.assert_allclose(growth, float(best.time_per_token), rtol=1e-9)
    assert float(best.bellman_residual) < 1e-12
    assert best.threshold_form
    np.testing.assert_allclose(float(best.tokens_per_time * best.time_per_token), 1)


def path_policies(num_states, k):
    """Every deterministic stationary policy that may depend on the start token and the whole
    drafted path: one stop bit per (start token, path shorter than ``K``)."""
    nodes = [(a, path) for a in range(num_states) for depth in range(k)
             for path in itertools.product(range(num_states), repeat=depth)]
    for bits in itertools.product((False, True), repeat=len(nodes)):
        table = dict(zip(nodes, bits))
        yield lambda a, path, table=table: table[(a, path)]


@pytest.mark.parametrize("num_states,k,cost", [
    (2, 2, specjax.CostModel(0.1, 1.0)),
    (2, 2, specjax.CostModel(0.4, [0.0, 1.0, 1.5, 2.2])),
    (3, 2, specjax.CostModel(0.05, 1.0, call_overhead=0.1)),
])
def test_optimal_rate_equals_brute_force_over_deterministic_policies(x64, num_states, k, cost):
    """Every path-dependent policy (2**6 for V = 2, 2**12 for V = 3) evaluated by the literal
    call and the renewal-reward ratio: the best equals ``optimal_rate``."""
    p, q, draft, target = stationary_pair(9 + num_states, num_states)
    best = specjax.optimal_rate(draft, target, cost, max_lookahead=k)
    rates = sorted(renewal_rate(p, q, k, f, cost) for f in path_policies(num_states, k))
    np.testing.assert_allclose(float(best.time_per_token), rates[0], rtol=1e-12)
    assert rates[-1] > rates[0] * 1.01  # the search space is not trivial


def test_optimal_rate_is_never_beaten(x64):
    """Fixed lookaheads and sweeps of the three heuristics on three random instances (of one
    size, V = 4, so that each rival's program compiles once, not once per instance)."""
    for seed, num_states in ((10, 4), (11, 4), (12, 4)):
        _, _, draft, target = stationary_pair(seed, num_states, concentration=0.5)
        cost = specjax.CostModel(0.1, [0.0, 1.0, 1.05, 1.1, 1.2, 1.35])
        best = specjax.optimal_rate(draft, target, cost, max_lookahead=4)
        rivals = [fixed(k) for k in range(1, 5)] + [
            specjax.AdaptiveSpeculative(policy(t), max_lookahead=4)
            for policy, grid in ((specjax.decoders.RejectionThreshold, (0.1, 0.3, 0.5, 0.7)),
                                 (specjax.decoders.EntropyThreshold, (0.3, 0.6, 1.0)),
                                 (specjax.decoders.ConfidenceThreshold, (0.2, 0.4, 0.6)))
            for t in grid]
        for rival in rivals:
            rate = specjax.theory.stationary_rate(rival, draft, target, cost)
            assert float(rate.time_per_token) >= float(best.time_per_token) * (1 - 1e-12), (
                seed, rival.label)
        # The decoder runs the optimum: its own stationary rate is the optimal one.
        again = specjax.theory.stationary_rate(best.decoder, draft, target, cost)
        np.testing.assert_allclose(float(again.time_per_token), float(best.time_per_token),
                                   rtol=1e-12)


def threshold_stop(thresholds, p, q):
    """The literal form of a ``ThresholdTable`` policy: stop iff ``A_i <= thresholds[i, x_i]``."""
    def stop(a, path):
        prev, acc = a, 1.0
        for x in path:
            acc *= min(1.0, q[prev, x] / p[prev, x])
            prev = x
        return acc <= thresholds[len(path), prev]
    return stop


def simulate_call(rng, a, p, q, max_lookahead, stop):
    """One call drawn literally: ``(last token, tokens emitted, drafts)``."""
    path, prev = [], a
    while len(path) < max_lookahead and not stop(a, tuple(path)):
        prev = int(rng.choice(len(q), p=p[prev]))
        path.append(prev)
    prev = a
    for i, x in enumerate(path):
        if rng.random() >= min(1.0, q[prev, x] / p[prev, x]):
            residual = np.maximum(q[prev] - p[prev], 0)
            return int(rng.choice(len(q), p=residual / residual.sum())), i + 1, len(path)
        prev = x
    return int(rng.choice(len(q), p=q[prev])), len(path) + 1, len(path)


def test_literal_simulation_of_the_optimal_policy_fits_its_rate(x64):
    """A long run of the optimal policy's literal calls (40 batches of 400 calls, from the
    stationary start law): the ratio of time to tokens fits ``time_per_token`` within
    ``stats.Z`` standard errors of the batch means."""
    p, q, draft, target = stationary_pair(13, 4)
    cost = specjax.CostModel(0.1, [0.0, 1.0, 1.05, 1.1, 1.2])
    best = specjax.optimal_rate(draft, target, cost, max_lookahead=3)
    stop = threshold_stop(np.asarray(best.thresholds), p, q)
    rng = np.random.default_rng(7)
    a = int(rng.choice(4, p=np.asarray(specjax.theory.stationary_rate(best.decoder, draft, target,
                                                               cost).start_law)))
    ratios = []
    for _ in range(40):
        time = tokens = 0.0
        for _ in range(400):
            a, emitted, drafts = simulate_call(rng, a, p, q, 3, stop)
            time += cost.call_time(draft_passes=drafts, tokens_scored=drafts + 1)
            tokens += emitted
        ratios.append(time / tokens)
    stats.assert_mean(ratios, float(best.time_per_token), "time per token")
    assert len(set(ratios)) > 1


@pytest.mark.parametrize("dtype_x64", [False, True])
def test_edge_pairs_stay_finite(dtype_x64):
    """p = q, disjoint supports, one-hot rows and zeros (the rows of ``edge_pair``'s first
    position, made stationary)."""
    (_, p), (_, q) = edge_pair()
    cost = specjax.CostModel(0.1, 1.0)
    with jax.enable_x64(dtype_x64):
        draft, target = lift(0.5 * p[0] + 0.5 * q[0], 8), lift(q[0], 8)
        best = specjax.optimal_rate(draft, target, cost, max_lookahead=3)
        for value in (best.time_per_token, best.relative_values, best.thresholds,
                      best.bellman_residual):
            assert np.all(np.isfinite(np.asarray(value)))
        disjoint = specjax.theory.stationary_rate(fixed(2), lift(p[0], 8), target, cost)
        assert np.all(np.isfinite(np.asarray(disjoint.relative_values)))
        # p = q: every draft is kept, so drafting K = 3 is best: 4 tokens per 1.3.
        same = specjax.optimal_rate(target, target, cost, max_lookahead=3)
        np.testing.assert_allclose(float(same.tokens_per_time), 4 / 1.3, rtol=1e-5)


def test_validation():
    _, _, draft, target = stationary_pair(0, 3)
    cost = specjax.CostModel(0.1, 1.0)
    moving = chain(random_pair(0, 3, 40)[1])  # NumPy rows: no random program to compile
    with pytest.raises(ValueError, match="target must be a stationary MarkovChain"):
        specjax.optimal_rate(draft, moving, cost, max_lookahead=2)
    with pytest.raises(ValueError, match="draft must be a stationary MarkovChain"):
        specjax.theory.stationary_rate(fixed(2), moving, target, cost)
    with pytest.raises(ValueError, match="call-level decoder"):
        specjax.theory.stationary_rate(specjax.Speculative(lookahead=2), draft, target, cost)
    with pytest.raises(ValueError, match="max_lookahead"):
        specjax.optimal_rate(draft, target, cost, max_lookahead=0)
    with pytest.raises(ValueError, match="max_iterations"):
        specjax.optimal_rate(draft, target, cost, max_lookahead=2, max_iterations=0)
    with pytest.raises(ValueError, match="cost must be"):
        specjax.optimal_rate(draft, target, 0.1, max_lookahead=2)
    with pytest.raises(ValueError, match="static"):
        specjax.optimal_rate(draft, target, cost, max_lookahead=jnp.asarray(2))
    with pytest.raises(ValueError, match="target_cost"):
        specjax.optimal_rate(draft, target, specjax.CostModel(0.1, [0.0, 1.0, 1.0]),
                             max_lookahead=3)
    with pytest.raises(ValueError, match="max_lookahead: the long-run rate"):
        specjax.optimal_rate(lift(np.asarray(draft.trans[0]), 3),
                             lift(np.asarray(target.trans[0]), 3), cost, max_lookahead=4)
    with pytest.raises(ValueError, match="decoder: the long-run rate"):
        specjax.theory.stationary_rate(fixed(5), lift(np.asarray(draft.trans[0]), 3),
                                lift(np.asarray(target.trans[0]), 3), cost)
    big = lift(np.full((16, 16), 1 / 16), 8)
    with pytest.raises(ValueError, match="V\\*\\*\\(K \\+ 1\\)"):
        specjax.optimal_rate(big, big, cost, max_lookahead=6)
    with pytest.raises(ValueError, match="threshold must be a finite number"):
        specjax.theory.stationary_rate(
            specjax.AdaptiveSpeculative(specjax.decoders.RejectionThreshold(1.7), max_lookahead=2),
            draft, target, cost)
    moving_table = np.full((40, 3, 3), -1.0)
    moving_table[:, 2] = 1.0
    moving_table[0, 1] = 1.0  # a call at position 1 drafts one token, elsewhere two
    with pytest.raises(ValueError, match="decoder: its ThresholdTable's rows differ"):
        specjax.theory.stationary_rate(specjax.AdaptiveSpeculative(
            specjax.decoders.ThresholdTable(moving_table), max_lookahead=2), draft, target, cost)
    eye = lift(np.eye(3), 8)  # every call ends where it started: three recurrent classes
    with pytest.raises(ValueError, match="target: the chain of call starts has 3 closed"):
        specjax.theory.stationary_rate(fixed(2), eye, eye, cost)


def test_relative_values_are_the_finite_horizon_offsets(x64):
    """``h(a) - h(b)``: how much longer decoding takes from a first call after ``a`` than after
    ``b``, far from the end (horizon 120; the end's effect cancels in the difference). The
    decoders and horizon of test_stationary_rate_is_the_growth_of_the_finite_horizon_time's
    SD and entropy cases: their programs serve here too."""
    p, q, _, _ = stationary_pair(4, 3)
    for decoder in (fixed(3), specjax.AdaptiveSpeculative(specjax.decoders.EntropyThreshold(0.9),
                                                          max_lookahead=3)):
        rate = specjax.theory.stationary_rate(decoder, lift(p, 8), lift(q, 8), COST)
        times = []
        for a in range(3):
            start = jnp.zeros(3).at[a].set(1.0)
            chains = [specjax.MarkovChain(start, jnp.broadcast_to(jnp.asarray(r), (120, 3, 3)))
                      for r in (p, q)]
            times.append(float(specjax.theory.decoding_time(decoder, *chains, COST).expected_time))
        h = np.asarray(rate.relative_values)
        np.testing.assert_allclose(np.asarray(times) - times[0], h - h[0], atol=1e-9)


def test_transient_tokens_and_convergence(x64):
    """A target that never returns to token 0 (transient) and rows with zeros: the optimality
    equation holds at every start token, transient ones included, and the optimum equals brute
    force; one step of policy iteration (SD with lookahead K) has not converged."""
    rng = np.random.default_rng(21)
    q = rng.dirichlet(np.ones(3), size=3)
    q[:, 0] = 0.0
    q = q / q.sum(-1, keepdims=True)
    p = rng.dirichlet(np.full(3, 0.5), size=3)
    cost = specjax.CostModel(0.2, [0.0, 1.0, 1.2, 1.5])
    best = specjax.optimal_rate(lift(p, 8), lift(q, 8), cost, max_lookahead=2)
    assert best.converged and float(best.bellman_residual) < 1e-12
    rates = sorted(renewal_rate_from(p, q, 2, f, cost) for f in path_policies(3, 2))
    np.testing.assert_allclose(float(best.time_per_token), rates[0], rtol=1e-12)
    one = specjax.optimal_rate(lift(p, 8), lift(q, 8), cost, max_lookahead=2, max_iterations=1)
    assert one.iterations == 1 and not one.converged
    assert float(one.time_per_token) > float(best.time_per_token)


def renewal_rate_from(p, q, max_lookahead, stop, cost):
    """``renewal_rate`` with the stationary law the limit of the call chain from token 1 (a
    target with a transient token: the eigenvector may not be unique there)."""
    kernel, tokens, times = literal_call_chain(p, q, max_lookahead, stop, cost)
    mu = np.linalg.matrix_power(kernel, 4096)[1]  # from token 1: the limit law (aperiodic)
    return float(mu @ times / (mu @ tokens))


def test_constant_schedule_rate_is_that_of_its_length(x64):
    """A schedule that never changes its length (``increase = decrease = 0``) from ``initial``:
    the rate of SD with that lookahead, whatever the unreachable lengths would do."""
    _, _, draft, target = stationary_pair(4, 3)
    for initial in (2, 3):
        steady = specjax.HeuristicSchedule(initial, max_lookahead=4, increase=0, decrease=0)
        got = specjax.theory.stationary_rate(steady, draft, target, COST)
        want = specjax.theory.stationary_rate(fixed(initial), draft, target, COST)
        np.testing.assert_allclose(float(got.time_per_token), float(want.time_per_token),
                                   rtol=1e-12)
        assert float(jnp.sum(got.start_law[initial - 1])) == pytest.approx(1.0)
