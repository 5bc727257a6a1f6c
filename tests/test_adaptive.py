"""Adaptive draft lengths (``AdaptiveSpeculative``) and the optimal stopping policy, checked three
ways.

* Against a literal transcription (``reference.adaptive_literal``: draft one token at a time,
  ask the policy before each draft, verify in order), enumerated exactly over every execution
  path: the law of the tokens (the target's), expected calls, rejections, the per-position
  rejected masses and the expected time under a cost model (each round charged its drafts and
  target call), to 1e-12 in float64, for every policy kind.
* Against Monte Carlo: ``decode``'s joint law of (tokens, rejected flags, calls) fits the
  literal enumeration (chi-square at ``stats.ALPHA``), and a simulation of the literal policy's
  clock fits ``decoding_time`` within ``stats.Z`` standard errors.
* The optimal policy (``optimal_stopping``): equal to brute force over every deterministic
  policy on a tiny instance (its value evaluated by an independent recursion), never beaten by a
  fixed ``K`` or a heuristic on random instances, and its threshold decoder's exact time (the
  forward recursion) equal to the backward induction's value.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict

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
from conftest import float64
from conftest import full_suite_only
from conftest import random_pair

COST = specjax.CostModel(0.15, [0.0, 1.0, 1.05, 1.1, 1.2, 1.35, 1.5, 1.7], call_overhead=0.05)


def entropy(row):
    row = np.asarray(row, np.float64)
    pos = row[row > 0]
    return float(-(pos * np.log(pos)).sum())


def user_rule(state):
    """Autoregressive calls at even positions, else stop after drafting token 1."""
    return ((state.depth == 0) & (state.position % 2 == 0)) | (
        (state.depth > 0) & (state.token == 1))


# name -> (library policy, literal stop(position, depth, token, token_prob, all_accepted, row))
POLICIES = {
    "fixed 2": (specjax.decoders.FixedLength(2), lambda t, d, x, pr, a, row: d >= 2),
    "SpecDec++ 0.3": (specjax.decoders.RejectionThreshold(0.3),
                      lambda t, d, x, pr, a, row: d > 0 and 1 - a > 0.3),
    "entropy 0.8": (specjax.decoders.EntropyThreshold(0.8),
                    lambda t, d, x, pr, a, row: d > 0 and entropy(row) > 0.8),
    "confidence 0.4": (specjax.decoders.ConfidenceThreshold(0.4),
                       lambda t, d, x, pr, a, row: d > 0 and pr < 0.4),
    "user rule": (specjax.decoders.StoppingRule(user_rule),
                  lambda t, d, x, pr, a, row: (d == 0 and t % 2 == 0) or (d > 0 and x == 1)),
}
LOOKAHEAD = 3


def literal_summary(pair, stop, cost=COST, lookahead=LOOKAHEAD):
    """The literal policy enumerated: token law, (tokens, rejected, calls) law, and the expected
    calls, rejections, time, drafted and kept tokens."""
    return ref.adaptive_summary(pair, stop, cost, lookahead)


def optimal_literal_stop(thresholds):
    table = np.asarray(thresholds)
    return lambda t, d, x, pr, a, row: a <= table[t - d - 1, d, x]


def decoder_and_stop(name, draft, target):
    """``(decoder, literal stop rule, solved)`` for a name of ``POLICIES`` or ``"optimal"``
    (``solved``: the ``OptimalStopping``, else ``None``)."""
    if name == "optimal":
        solved = specjax.theory.optimal_stopping(draft, target, COST, max_lookahead=LOOKAHEAD)
        return solved.decoder, optimal_literal_stop(solved.thresholds), solved
    policy, stop = POLICIES[name]
    return specjax.AdaptiveSpeculative(policy, max_lookahead=LOOKAHEAD), stop, None


# ----------------------------------------------------------------------------- special cases
@pytest.mark.parametrize("lookahead", [1, 2, 3])
def test_fixed_length_is_speculative_decoding(lookahead, x64):
    # The instance and max_lookahead of the literal tests below (V = 3, T = 4, K = 3): the three
    # adaptive programs are theirs (fixed 2 in test_exact_matches_literal, 1 and 3 in
    # test_literal_is_sensitive), not three more of another size.
    draft, target = (chain(x) for x in random_pair(11, 3, 4, zero_fraction=0.2))
    adaptive = specjax.AdaptiveSpeculative(specjax.decoders.FixedLength(lookahead),
                                           max_lookahead=LOOKAHEAD)
    sd = specjax.Speculative(lookahead=lookahead)
    a, b = specjax.exact(adaptive, draft, target), specjax.exact(sd, draft, target)
    for field in ("marginals", "rejected", "new_call", "verified"):
        assert np.abs(np.asarray(getattr(a, field)) - np.asarray(getattr(b, field))).max() < 1e-12
    ta = specjax.theory.decoding_time(adaptive, draft, target, COST)
    tb = specjax.theory.decoding_time(sd, draft, target, COST)
    for field in ("expected_time", "expected_draft_passes", "expected_tokens_scored"):
        assert abs(float(getattr(ta, field)) - float(getattr(tb, field))) < 1e-12


# ----------------------------------------------------------------------------- literal, exact
@pytest.mark.parametrize("name", sorted(POLICIES) + ["optimal"])
def test_exact_matches_literal(name, x64):
    pair = random_pair(11, 3, 4, zero_fraction=0.2)
    draft, target = (chain(x) for x in pair)
    decoder, stop, solved = decoder_and_stop(name, draft, target)
    summary = literal_summary(pair, stop)
    checks.assert_exact_matches_adaptive_literal(decoder, pair, summary, COST)
    if solved is not None:
        assert solved.threshold_form
        assert abs(float(solved.expected_time) - summary[2]["time"]) < 1e-12


def test_literal_is_sensitive(x64):
    """The literal comparison can fail: other policies give other times on this instance."""
    pair = random_pair(11, 3, 4, zero_fraction=0.2)
    _, _, means = literal_summary(pair, POLICIES["SpecDec++ 0.3"][1])
    for policy in (specjax.decoders.RejectionThreshold(0.0), specjax.decoders.FixedLength(1),
                   specjax.decoders.FixedLength(3)):
        other = specjax.AdaptiveSpeculative(policy, max_lookahead=LOOKAHEAD)
        timed = specjax.theory.decoding_time(other, *(chain(x) for x in pair), COST)
        assert abs(float(timed.expected_time) - means["time"]) > 1e-3, policy


# ----------------------------------------------------------------------------- Monte Carlo
NUM_CHAINS = 100_000


@pytest.mark.slow  # a Monte Carlo run of 100,000 chains or more
@pytest.mark.parametrize("name", ["SpecDec++ 0.3", "user rule"])
def test_decode_matches_literal_and_exact(name):
    pair = random_pair(5, 3, 5, zero_fraction=0.2)
    policy, stop = POLICIES[name]
    decoder = specjax.AdaptiveSpeculative(policy, max_lookahead=LOOKAHEAD)
    as32 = [(init.astype(np.float32), trans.astype(np.float32)) for init, trans in pair]
    trace = specjax.decode(jax.random.key(3), decoder, chain(as32[0]), chain(as32[1]),
                           NUM_CHAINS)
    tokens = np.asarray(trace.tokens)
    flags = np.asarray(trace.rejected)
    calls = np.asarray(trace.num_calls)
    horizon = pair[1][1].shape[0]
    stats.assert_law(stats.count_rows(tokens), ref.target_sequence_law(pair[1]), NUM_CHAINS,
                     f"{name}: tokens")
    joint = defaultdict(int)
    rows = stats.count_rows(np.concatenate([tokens, flags, calls[:, None]], axis=1))
    for row, count in rows.items():
        joint[(row[:horizon + 1], tuple(bool(v) for v in row[horizon + 1:-1]), row[-1])] += count
    _, literal_joint, means = literal_summary(pair, stop)
    stats.assert_law(dict(joint), literal_joint, NUM_CHAINS, f"{name}: (tokens, rejected, calls)")
    stats.assert_mean(calls, means["calls"], f"{name}: calls")
    stats.assert_mean(flags.sum(-1), means["rejections"], f"{name}: rejections")


@pytest.mark.parametrize("name", sorted(POLICIES) + ["optimal"])
def test_literal_simulation_of_time_fits_exact(name):
    """The literal policy run with random choices; its mean clock fits ``decoding_time``.
    (V = 3, T = 6, as test_optimal_is_never_beaten: the programs of its optimum and rivals
    serve here too.)"""
    pair = random_pair(8, 3, 6)
    with jax.enable_x64(True):
        draft, target = (chain(x) for x in pair)
        decoder, stop, _ = decoder_and_stop(name, draft, target)
        exact = float(specjax.expected_time(decoder, draft, target, COST))
    chooser = ref.RandomChooser(np.random.default_rng(2024))
    times = [ref.literal_clock(
        ref.adaptive_literal(chooser, pair[0], pair[1], LOOKAHEAD, stop)[3], COST)
        for _ in range(3000)]
    stats.assert_mean(times, exact, f"{name}: time")


# ----------------------------------------------------------------------------- optimal policy
def policy_value(pair, cost, lookahead, decide):
    """Expected time of a deterministic policy ``decide(n, path) -> stop`` (``path``: the call's
    previous token then its drafts) by a direct recursion over call starts and drafted paths."""
    (_, p), (init, q) = pair
    horizon = q.shape[0]
    memo = {}

    def to_go(n, a):
        if n > horizon:
            return 0.0
        if (n, a) not in memo:
            memo[(n, a)] = drafted(n, (a,), 1.0, 0.0)
        return memo[(n, a)]

    def drafted(n, path, all_acc, committed):
        depth = len(path) - 1
        if depth == min(lookahead, horizon - n + 1) or decide(n, path):
            x, t = path[-1], n + depth
            bonus = (sum(q[t - 1, x, y] * to_go(t + 1, y) for y in range(q.shape[1]))
                     if t <= horizon else 0.0)
            return cost.target_time(depth + 1) + cost.call_overhead + committed + all_acc * bonus
        x, t = path[-1], n + depth
        resid = np.maximum(q[t - 1, x] - p[t - 1, x], 0)
        resid_value = (sum(resid[y] * to_go(t + 1, y) for y in range(len(resid))) / resid.sum()
                       if resid.sum() > 0 else 0.0)
        total = cost.draft_cost
        for y in range(p.shape[1]):
            if p[t - 1, x, y] > 0:
                acc = min(1.0, q[t - 1, x, y] / p[t - 1, x, y])
                total += p[t - 1, x, y] * drafted(
                    n, path + (y,), all_acc * acc, committed + all_acc * (1 - acc) * resid_value)
        return total

    return sum(init[a] * to_go(1, a) for a in range(len(init)) if init[a] > 0)


@pytest.mark.parametrize("cost", [specjax.CostModel(0.3, 1.0),
                                  specjax.CostModel(0.05, [0.0, 1.0, 1.4, 2.0])])
def test_optimal_equals_brute_force_over_policies(cost, x64):
    """Every deterministic policy on a tiny instance (V = 2, T = 3, K = 2, x_0 = 0: 11 decision
    points, 2,048 policies), valued by ``policy_value``: the least equals ``optimal_stopping``."""
    (_, p), (_, q) = random_pair(21, 2, 3)
    init = np.array([1.0, 0.0])
    pair = ((init, p), (init, q))
    nodes = [(1, (0,)), (1, (0, 0)), (1, (0, 1))]
    nodes += [(2, (a,)) for a in range(2)] + [(2, (a, x)) for a in range(2) for x in range(2)]
    nodes += [(3, (a,)) for a in range(2)]
    best = math.inf
    for choice in itertools.product((False, True), repeat=len(nodes)):
        decisions = dict(zip(nodes, choice))
        best = min(best, policy_value(pair, cost, 2, lambda n, path: decisions[(n, path)]))
    solved = specjax.theory.optimal_stopping(*(chain(x) for x in pair), cost, max_lookahead=2)
    assert abs(float(solved.expected_time) - best) < 1e-12
    assert abs(float(specjax.expected_time(solved.decoder, *(chain(x) for x in pair), cost))
               - best) < 1e-12


@pytest.mark.parametrize("seed", range(4))
def test_optimal_is_never_beaten(seed, x64):
    """On random chains the optimum is at most every fixed K (autoregressive included) and
    every heuristic of a grid; its decoder's forward value equals the backward induction's."""
    pair = random_pair(100 + seed, 3, 6, zero_fraction=0.1 * (seed % 2))
    draft, target = (chain(x) for x in pair)
    cost = [COST, specjax.CostModel(0.4, 1.0), specjax.CostModel(0.02, 1.0)][seed % 3]
    solved = specjax.theory.optimal_stopping(draft, target, cost, max_lookahead=LOOKAHEAD)
    optimum = float(solved.expected_time)
    assert solved.threshold_form
    assert abs(float(specjax.expected_time(solved.decoder, draft, target, cost)) - optimum) < 1e-9
    assert abs(policy_value(pair, cost, LOOKAHEAD, lambda n, path: bool(
        ref_threshold_stop(solved, n, path, pair))) - optimum) < 1e-9
    fixed = specjax.theory.best_lookahead(draft, target, cost, max_lookahead=LOOKAHEAD)
    assert optimum <= fixed.times.min() + 1e-12
    rivals = [specjax.decoders.RejectionThreshold(t) for t in (0.1, 0.3, 0.5, 0.7, 0.9)]
    rivals += [specjax.decoders.EntropyThreshold(t) for t in (0.3, 0.6, 0.9)]
    rivals += [specjax.decoders.ConfidenceThreshold(t) for t in (0.2, 0.4, 0.6)]
    rivals += [specjax.decoders.StoppingRule(user_rule)]
    for policy in rivals:
        rival = specjax.AdaptiveSpeculative(policy, max_lookahead=LOOKAHEAD)
        assert optimum <= float(specjax.expected_time(rival, draft, target, cost)) + 1e-12, policy


def ref_threshold_stop(solved, n, path, pair):
    """The threshold table's decision for a path, from the literal acceptance product."""
    (_, p), (_, q) = pair
    all_acc = 1.0
    for i in range(1, len(path)):
        t = n + i - 1
        all_acc *= min(1.0, q[t - 1, path[i - 1], path[i]] / p[t - 1, path[i - 1], path[i]])
    return all_acc <= float(solved.thresholds[n - 1, len(path) - 1, path[-1]])


def test_optimal_thresholds_depend_on_the_state(x64):
    """The paper's instance: the optimal thresholds are not one constant (a constant threshold
    is not optimal there), and the best constant SpecDec++ threshold of a fine grid is worse."""
    draft, target = float64(*specjax.paper_instance())
    cost = specjax.CostModel(0.1, 1.0)
    solved = specjax.theory.optimal_stopping(draft, target, cost, max_lookahead=3)
    grid = [specjax.AdaptiveSpeculative(specjax.decoders.RejectionThreshold(t), max_lookahead=3)
            for t in np.linspace(0.0, 1.0, 21)]
    best_constant = min(float(specjax.expected_time(d, draft, target, cost)) for d in grid)
    assert float(solved.expected_time) < best_constant - 1e-6
    table = np.asarray(solved.thresholds)[:, 1:3]
    inner = table[(table > 0) & (table < 1)]
    assert inner.size and inner.max() - inner.min() > 1e-3


# ----------------------------------------------------------------------------- JAX, edge cases
def test_threshold_is_a_leaf_under_vmap_and_jit(x64):
    # In float64: the paper instance's and the decoder's programs are those of
    # test_optimal_thresholds_depend_on_the_state (a threshold is a leaf in either dtype).
    draft, target = float64(*specjax.paper_instance())

    def calls(threshold):
        decoder = specjax.AdaptiveSpeculative(specjax.decoders.RejectionThreshold(threshold),
                                              max_lookahead=3)
        return specjax.exact(decoder, draft, target).expected_calls

    thresholds = jnp.asarray([0.1, 0.5, 0.9])
    swept = jax.jit(jax.vmap(calls))(thresholds)
    one_by_one = [float(calls(t)) for t in np.asarray(thresholds)]  # NumPy scalars, as the grid
    assert np.allclose(np.asarray(swept), one_by_one, rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, full_suite_only(np.float64)])
def test_finite_values_and_gradients_at_edge_cases(dtype, x64):
    draft, target = edge_pair(4, 4)
    d = specjax.MarkovChain(jnp.asarray(draft[0], dtype), jnp.asarray(draft[1], dtype))
    t = specjax.MarkovChain(jnp.asarray(target[0], dtype), jnp.asarray(target[1], dtype))
    for policy in (specjax.decoders.RejectionThreshold(0.3), specjax.decoders.EntropyThreshold(0.5),
                   specjax.decoders.FixedLength(3)):
        decoder = specjax.AdaptiveSpeculative(policy, max_lookahead=2)

        def value(dd, tt, decoder=decoder):
            return specjax.expected_time(decoder, dd, tt, COST)

        total, grads = jax.jit(jax.value_and_grad(value, argnums=(0, 1)))(d, t)  # one program
        assert np.isfinite(float(total))
        leaves = jax.tree_util.tree_leaves(grads)
        assert leaves and all(np.isfinite(np.asarray(g)).all() for g in leaves), policy
    same = specjax.exact(specjax.AdaptiveSpeculative(specjax.decoders.RejectionThreshold(0.3),
                                                     max_lookahead=2), t, t)
    assert abs(float(same.expected_rejections)) < 1e-6  # p = q: nothing is rejected
    solved = specjax.theory.optimal_stopping(d, t, COST, max_lookahead=2)
    assert np.isfinite(np.asarray(solved.values)).all()
    assert abs(float(specjax.expected_time(solved.decoder, d, t, COST))
               - float(solved.expected_time)) < (1e-9 if dtype == np.float64 else 1e-4)


def test_gradient_matches_finite_differences(x64):
    pair = random_pair(4, 3, 4)
    draft, target = (chain(x) for x in pair)
    decoder = specjax.AdaptiveSpeculative(specjax.decoders.RejectionThreshold(0.4), max_lookahead=3)

    def value(trans):
        return specjax.expected_time(decoder, specjax.MarkovChain(draft.init, trans), target,
                                     COST)

    def softmax(logits):  # NumPy, float64
        e = np.exp(logits - logits.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    # The gradient in one program; the values on the host's softmax run expected_time's own
    # program (test_exact_matches_literal's: V = 3, T = 4), not one of their own.
    logits = np.log(pair[0][1])
    grad = jax.jit(jax.grad(lambda x: value(jax.nn.softmax(x, axis=-1))))(logits)
    direction = np.random.default_rng(0).normal(size=logits.shape)
    h = 1e-6  # the decisions do not move for so small a step on these chains
    numeric = (float(value(softmax(logits + h * direction)))
               - float(value(softmax(logits - h * direction)))) / (2 * h)
    assert abs(float(np.sum(np.asarray(grad) * direction)) - numeric) < 1e-6


# ----------------------------------------------------------------------------- validation
def test_validation_errors():
    draft, target = specjax.paper_instance()
    with pytest.raises(ValueError, match="policy must be a stopping policy"):
        specjax.AdaptiveSpeculative(0.3, max_lookahead=3)
    with pytest.raises(ValueError, match="max_lookahead"):
        specjax.AdaptiveSpeculative(specjax.decoders.FixedLength(2), max_lookahead=0)
    with pytest.raises(ValueError, match="max_lookahead"):
        specjax.AdaptiveSpeculative(specjax.decoders.FixedLength(2), max_lookahead=jnp.asarray(2))
    with pytest.raises(ValueError, match="length"):
        specjax.decoders.FixedLength(2.5)
    with pytest.raises(ValueError, match=r"threshold must be a finite number in \[0, 1\]"):
        specjax.exact(specjax.AdaptiveSpeculative(specjax.decoders.RejectionThreshold(1.5),
                                                  max_lookahead=2), draft, target)
    with pytest.raises(ValueError, match="threshold must be a number"):
        specjax.exact(specjax.AdaptiveSpeculative(specjax.decoders.EntropyThreshold("high"),
                                                  max_lookahead=2), draft, target)
    with pytest.raises(ValueError, match="fn must be a function"):
        specjax.decoders.StoppingRule(3)
    with pytest.raises(ValueError, match="thresholds must have shape"):
        specjax.exact(specjax.AdaptiveSpeculative(specjax.decoders.ThresholdTable(jnp.zeros(3)),
                                                  max_lookahead=2), draft, target)
    with pytest.raises(ValueError, match=r"threshold must be a finite number >= 0"):
        specjax.decode(jax.random.key(0), specjax.AdaptiveSpeculative(
            specjax.decoders.EntropyThreshold(-1.0), max_lookahead=2), draft, target, 10)
    # A table that does not fit the models (here T = 2 rows for T = 50) is refused by every
    # entry point while tracing, instead of being clipped silently.
    short = specjax.AdaptiveSpeculative(specjax.decoders.ThresholdTable(jnp.zeros((2, 3, 7))),
                                        max_lookahead=2)
    cost = specjax.CostModel(0.1, 1.0)
    for run in (lambda: specjax.exact(short, draft, target),
                lambda: specjax.decode(jax.random.key(0), short, draft, target, 10),
                lambda: specjax.expected_time(short, draft, target, cost),
                lambda: specjax.theory.engine_metrics(short, draft, target)):
        with pytest.raises(ValueError, match=r"thresholds must have shape .* \(50, 3, 7\)"):
            run()
    # A user rule must return boolean flags (0.5 would be cast to True silently).
    half = specjax.AdaptiveSpeculative(specjax.decoders.StoppingRule(lambda s: 0.5 + 0 * s.depth),
                                       max_lookahead=2)
    for run in (lambda: specjax.exact(half, draft, target),
                lambda: specjax.decode(jax.random.key(0), half, draft, target, 10)):
        with pytest.raises(ValueError, match="must return boolean stop flags"):
            run()
    with pytest.raises(ValueError, match=r"max_lookahead: the exact law .*2\*\*22"):
        specjax.exact(specjax.AdaptiveSpeculative(specjax.decoders.FixedLength(2),
                                                  max_lookahead=20),
                      draft, target)
    cost = specjax.CostModel(0.1, 1.0)
    with pytest.raises(ValueError, match="cost must be a specjax.CostModel"):
        specjax.theory.optimal_stopping(draft, target, 1.0, max_lookahead=2)
    with pytest.raises(ValueError, match="max_lookahead must be a positive int"):
        specjax.theory.optimal_stopping(draft, target, cost, max_lookahead=0)
    with pytest.raises(ValueError, match="target_cost is a table of length 3"):
        specjax.theory.optimal_stopping(draft, target, specjax.CostModel(0.1, [0, 1, 1]),
                                 max_lookahead=4)
    with pytest.raises(ValueError, match="draft must be a MarkovChain"):
        specjax.theory.optimal_stopping(None, target, cost, max_lookahead=2)
    with pytest.raises(ValueError, match=r"2\*\*24"):
        specjax.theory.optimal_stopping(draft, target, cost, max_lookahead=30)
