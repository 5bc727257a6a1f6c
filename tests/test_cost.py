"""The cost model: expected time of a decoder, checked three ways.

* against a literal SD (``reference.sd_rounds_literal``) with a clock (each round charged its
  draft passes and target call), enumerated exactly over every execution path on small chains;
* against Leviathan et al.'s closed form on chains whose every row has the same acceptance
  ``a``, through an independent renewal recursion over the tokens left (exact at every ``T``)
  and per call (tokens per call over time per call);
* against Monte Carlo: the same sum over ``decode``'s ``new_call`` flags, mean within ``stats.Z``
  standard errors, for SD, batch SD, a token tree and a dynamic tree.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
import reference as ref
import stats
from conftest import chain
from conftest import full_suite_only
from conftest import random_pair

COSTS = {
    "flat": specjax.CostModel(0.2, 1.0),
    "table": specjax.CostModel(0.05, [0.0, 1.0, 1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0, 3.6, 4.3],
                               call_overhead=0.1),
}


# ----------------------------------------------------------------------------- literal SD
def literal_time(rounds, cost):
    """The clock of a literal SD run: each round drafts ``K'`` tokens (``K'`` draft passes) and
    the target scores the root and the drafts (``K' + 1`` tokens)."""
    total = 0.0
    for drafted, _ in rounds:
        table = cost.target_cost
        target_time = table[drafted + 1] if isinstance(table, tuple) else table
        total += drafted * cost.draft_cost + target_time + cost.call_overhead
    return total


@pytest.mark.parametrize("cost_name", sorted(COSTS))
@pytest.mark.parametrize("lookahead", [1, 2, full_suite_only(3)])
def test_expected_time_matches_literal_sd(lookahead, cost_name, x64):
    cost = COSTS[cost_name]
    draft, target = random_pair(5, 3, 4, zero_fraction=0.2)
    law = ref.enumerate_law(lambda c: ref.sd_rounds_literal(c, draft, target, lookahead))
    literal = sum(literal_time(rounds, cost) * prob for rounds, prob in law.items())
    got = specjax.theory.decoding_time(specjax.Speculative(lookahead=lookahead), chain(draft),
                                chain(target), cost)
    assert abs(float(got.expected_time) - literal) < 1e-12
    assert abs(float(got.speedup) - float(got.autoregressive_time) / literal) < 1e-12


# ----------------------------------------------------------------------------- Leviathan
def constant_acceptance_pair(acceptance: float, horizon: int):
    """Every row: target (1/2, 1/2, 0, 0), draft (a/2, a/2, (1 - a)/2, (1 - a)/2), so
    ``sum min(p, q) = a`` whatever the previous token."""
    a = acceptance
    q = np.broadcast_to(np.array([0.5, 0.5, 0, 0]), (horizon, 4, 4)).copy()
    p = np.broadcast_to(np.array([a / 2, a / 2, (1 - a) / 2, (1 - a) / 2]), (horizon, 4, 4)).copy()
    init = np.full(4, 0.25)
    return (init, p), (init, q)


def renewal_time(acceptance, lookahead, horizon, cost):
    """E[time] to produce ``t`` tokens when every draft is accepted with probability ``a``
    independently: ``f(t) = time(K'_t) + sum_i P(i accepted) f(t - emitted_i)``."""
    a, f = acceptance, [0.0]
    for t in range(1, horizon + 1):
        k = min(lookahead, t)
        total = cost.call_time(draft_passes=k, tokens_scored=k + 1)
        for i in range(k + 1):
            prob = a**i * (1 - a) if i < k else a**k
            emitted = i + 1 if (i < k or k < t) else t
            total += prob * f[t - emitted]
        f.append(total)
    return f[horizon]


@pytest.mark.parametrize("acceptance", [0.3, 0.8, 1.0])
@pytest.mark.parametrize("lookahead", [1, 3, 5])
def test_leviathan_closed_form(acceptance, lookahead, x64):
    # T = 400: the chains of test_best_lookahead_matches_leviathan_on_long_constant_chains, whose
    # exact programs for K = 1, 3, 5 these then are (a horizon of its own compiled them again).
    horizon, c = 400, 0.1
    cost = specjax.CostModel(c, 1.0)
    draft, target = (chain(m) for m in constant_acceptance_pair(acceptance, horizon))
    sd = specjax.Speculative(lookahead=lookahead)
    got = specjax.theory.decoding_time(sd, draft, target, cost)
    assert abs(float(got.expected_time) - renewal_time(acceptance, lookahead, horizon, cost)) \
        < 1e-10
    # Per call away from the horizon: tokens per call over time per call is Leviathan's speed-up.
    a, k = acceptance, lookahead
    tokens = k + 1 if a == 1 else (1 - a**(k + 1)) / (1 - a)
    per_call = (float(specjax.accepted_length(sd, draft, target)[0]) + 1) / float(got.call_time[0])
    assert abs(per_call - tokens / (k * c + 1)) < 1e-12
    # Over the whole horizon the speed-up approaches it; a renewal process's count of calls is
    # within one call's worth of T / E[tokens per call] (the last call is cut by the horizon).
    assert abs(float(got.expected_time) - horizon / tokens * (k * c + 1)) <= 2 * (k * c + 1)


def test_best_lookahead_matches_leviathan_on_long_constant_chains(x64):
    """On a long chain of constant acceptance the best fixed K is the argmax of Leviathan's
    speed-up (0 when drafting cannot pay)."""
    horizon = 400
    for acceptance, c in [(0.8, 0.05), (0.6, 0.2), (0.9, 0.02), (0.2, 0.9)]:
        draft, target = (chain(m) for m in constant_acceptance_pair(acceptance, horizon))
        choice = specjax.theory.best_lookahead(draft, target, specjax.CostModel(c, 1.0),
                                        max_lookahead=10)
        speedups = [1.0] + [(1 - acceptance**(k + 1)) / ((1 - acceptance) * (k * c + 1))
                            for k in range(1, 11)]
        assert choice.lookahead == int(np.argmax(speedups)), (acceptance, c, choice)
        assert choice.expected_time == pytest.approx(choice.times.min())
        assert choice.times[0] == pytest.approx(horizon)


# ----------------------------------------------------------------------------- Monte Carlo
MC_DECODERS = {
    "SD K=3": specjax.Speculative(lookahead=3),
    "batch M=2 K=2": specjax.BatchSpeculative(2, lookahead=2),
    "tree (2, 2)": specjax.TokenTree((2, 2)),
    "dynamic tree": specjax.DynamicTree(budget=4, max_depth=2),
}


@pytest.mark.parametrize("name", sorted(MC_DECODERS))
def test_expected_time_matches_monte_carlo(name):
    decoder = MC_DECODERS[name]
    draft, target = (chain(m) for m in random_pair(17, 4, 8))
    cost = COSTS["table"]
    got = specjax.theory.decoding_time(decoder, draft, target, cost)
    trace = specjax.decode(jax.random.key(3), decoder, draft, target, 20_000)
    times = np.asarray(trace.new_call, np.float64) @ np.asarray(got.call_time, np.float64)
    stats.assert_mean(times, float(got.expected_time), f"{name}: time")
    stats.assert_mean(np.asarray(trace.num_calls), float(got.expected_calls), f"{name}: calls")


# ----------------------------------------------------------------------------- tree budgets
def test_best_tree_budget_of_stars_is_batch_sd(x64):
    """With depth 1 Sequoia's tree of ``n`` nodes is a star of ``n - 1`` i.i.d. children, which
    is batch SD's root with lookahead 1 (``M = n - 1`` drafts, ``M + 1`` tokens scored): the
    times agree with that decoder's, and the choice is their argmin."""
    draft, target = (chain(m) for m in random_pair(23, 4, 6))
    cost = specjax.CostModel(0.2, [0.0] + [1.0 + 0.15 * n for n in range(1, 8)])
    choice = specjax.theory.best_tree_budget(draft, target, cost, max_budget=5, max_depth=1)
    assert choice.trees[3] == (-1, 0, 0, 0)
    assert choice.times[0] == pytest.approx(6 * 1.15)
    for n in range(2, 6):
        batch = specjax.expected_time(specjax.BatchSpeculative(n - 1, lookahead=1), draft,
                                      target, cost)
        assert abs(choice.times[n - 1] - float(batch)) < 1e-10, n
    assert choice.budget == int(np.argmin(choice.times)) + 1
    assert choice.parents == choice.trees[choice.budget - 1]
    assert choice.expected_time == choice.times.min()


def test_best_tree_budget_times_are_the_trees_exact_times(x64):
    draft, target = specjax.paper_instance()
    cost = specjax.CostModel(0.1, 1.0)
    choice = specjax.theory.best_tree_budget(draft, target, cost, max_budget=4, max_depth=3,
                                      children="without_replacement", num_children=3)
    for n in range(2, 5):
        tree = specjax.TokenTree.from_parents(choice.trees[n - 1], children="without_replacement")
        assert len(choice.trees[n - 1]) == n
        assert choice.times[n - 1] == pytest.approx(
            float(specjax.expected_time(tree, draft, target, cost)), abs=1e-12)


# ----------------------------------------------------------------------------- what a call does
def test_call_work():
    assert specjax.Autoregressive().call_work(0) == (0, 1)
    assert specjax.Speculative(lookahead=4).call_work(4) == (4, 5)
    assert specjax.Speculative(lookahead=4).call_work(2) == (2, 3)  # cut by the horizon
    assert specjax.BatchSpeculative(3, lookahead=2).call_work(2) == (2, 7)
    assert specjax.OptimalMultiDraft(2, lookahead=3).call_work(3) == (3, 7)
    assert specjax.BlockVerification(3).call_work(3) == (3, 4)
    tree = specjax.TokenTree((2, 2))
    assert tree.call_work(2) == (2, 7)
    assert tree.call_work(1) == (1, 3)
    assert specjax.TokenTree.from_parents((-1, 0, 0, 1)).call_work(5) == (2, 4)
    assert specjax.DynamicTree(budget=6, max_depth=3).call_work(2) == (2, 6)


def test_autoregressive_and_free_drafts(x64):
    draft, target = specjax.paper_instance()
    horizon = target.horizon
    cost = specjax.CostModel(0.3, 2.0, call_overhead=0.5)
    ar = specjax.theory.decoding_time(specjax.Autoregressive(), None, target, cost)
    assert float(ar.expected_time) == pytest.approx(horizon * 2.5)
    assert float(ar.speedup) == pytest.approx(1.0)
    assert float(ar.expected_draft_passes) == 0
    free = specjax.CostModel(0.0, 1.0)
    for decoder in [specjax.Speculative(lookahead=3), specjax.TokenTree((2, 1))]:
        got = specjax.theory.decoding_time(decoder, draft, target, free)
        calls = specjax.exact(decoder, draft, target).expected_calls
        assert float(got.expected_time) == pytest.approx(float(calls), abs=1e-10)
        assert float(got.tokens_per_time) == pytest.approx(horizon / float(calls))


def test_finite_state_models_with_a_horizon(x64):
    """n-grams lifted to one state space: the time with free drafts is the expected calls, and a
    call near the horizon drafts fewer tokens."""
    from specjax.models import NGramModel
    rng = np.random.default_rng(0)
    draft = NGramModel(jnp.asarray(rng.dirichlet(np.ones(3), size=3)), 2).as_finite_state(3)
    target = NGramModel(jnp.asarray(rng.dirichlet(np.ones(3), size=9)), 3).as_finite_state(3)
    sd = specjax.Speculative(lookahead=2)
    got = specjax.theory.decoding_time(sd, draft, target, specjax.CostModel(0.0, 1.0), horizon=6)
    calls = specjax.exact(sd, draft, target, horizon=6).expected_calls
    assert float(got.expected_time) == pytest.approx(float(calls), abs=1e-12)
    timed = specjax.theory.decoding_time(sd, draft, target, specjax.CostModel(0.5, 1.0), horizon=6)
    np.testing.assert_allclose(np.asarray(timed.call_time), [2, 2, 2, 2, 2, 1.5])


def test_gradient_is_finite_and_matches_central_differences(x64):
    draft, target = specjax.paper_instance()
    cost = COSTS["table"]
    sd = specjax.Speculative(lookahead=3)
    logits = jnp.log(jnp.clip(draft.trans, 1e-12))

    def f(lg):
        return specjax.expected_time(sd, specjax.MarkovChain.from_logits(
            jnp.log(draft.init), lg), target, cost)

    grad = jax.jit(jax.grad(f))(logits)
    assert bool(jnp.all(jnp.isfinite(grad)))
    direction = jax.random.normal(jax.random.key(0), logits.shape, logits.dtype)
    h = 1e-5
    numeric = (f(logits + h * direction) - f(logits - h * direction)) / (2 * h)
    assert float(jnp.vdot(grad, direction)) == pytest.approx(float(numeric), rel=1e-6, abs=1e-8)


def test_jit_and_vmap():
    draft, target = specjax.paper_instance()
    cost = COSTS["flat"]
    sd = specjax.Speculative(lookahead=2)
    eager = specjax.expected_time(sd, draft, target, cost)
    jitted = jax.jit(specjax.expected_time, static_argnums=(0, 3))(sd, draft, target, cost)
    assert float(jitted) == pytest.approx(float(eager), rel=1e-6)
    # Two random pairs drawn with NumPy (random_markov_chain compiles a Dirichlet draw of its
    # own for this shape), float32 as the paper instance above.
    pairs = [random_pair(seed, 4, 6) for seed in (1, 2)]
    pair = [chain(pairs[0][0]), chain(pairs[1][0]), chain(pairs[0][1]), chain(pairs[1][1])]
    drafts = jax.tree.map(lambda *xs: np.stack(xs), pair[0], pair[1])
    targets = jax.tree.map(lambda *xs: np.stack(xs), pair[2], pair[3])
    batched = jax.vmap(lambda d, t: specjax.expected_time(sd, d, t, cost))(drafts, targets)
    for i in range(2):
        one = specjax.expected_time(sd, pair[i], pair[2 + i], cost)
        assert float(batched[i]) == pytest.approx(float(one), rel=1e-6)


# ----------------------------------------------------------------------------- validation
@pytest.mark.parametrize("args, kwargs, match", [
    ((-1.0, 1.0), {}, "draft_cost"),
    ((math.nan, 1.0), {}, "draft_cost"),
    ((0.1, 0.0), {}, "target_cost must be positive"),
    ((0.1, "fast"), {}, "target_cost"),
    ((0.1, None), {}, "target_cost"),
    ((0.1, [[1.0, 2.0]]), {}, "1-D"),
    ((0.1, [0.0]), {}, "length 1"),
    ((0.1, [0.0, 1.0, -2.0]), {}, r"target_cost\[2\]"),
    ((0.1, [0.0, 1.0, math.inf]), {}, r"target_cost\[2\]"),
    ((0.1, 1.0), {"call_overhead": -0.5}, "call_overhead"),
])
def test_cost_model_validation(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        specjax.CostModel(*args, **kwargs)


def test_entry_point_validation():
    draft, target = specjax.paper_instance()
    with pytest.raises(ValueError, match="cost must be a specjax.CostModel"):
        specjax.expected_time(specjax.Speculative(), draft, target, (0.1, 1.0))
    short = specjax.CostModel(0.1, [0.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="target_cost is a table of length 3.*up to 5"):
        specjax.expected_time(specjax.Speculative(lookahead=4), draft, target, short)
    with pytest.raises(ValueError, match="num_drafts=math.inf"):
        specjax.expected_time(specjax.BatchSpeculative(math.inf, lookahead=2), draft, target,
                              COSTS["flat"])
    with pytest.raises(ValueError, match="max_lookahead"):
        specjax.theory.best_lookahead(draft, target, COSTS["flat"], max_lookahead=0)
    with pytest.raises(ValueError, match="lookahead to vary"):
        specjax.theory.best_lookahead(draft, target, COSTS["flat"], max_lookahead=2,
                               decoder=specjax.TokenTree((2,)))
    with pytest.raises(ValueError, match="static setting"):
        jax.jit(lambda c: specjax.CostModel(c, 1.0))(0.1)
    with pytest.raises(ValueError, match="max_budget"):
        specjax.theory.best_tree_budget(draft, target, COSTS["flat"], max_budget=1, max_depth=2)
    with pytest.raises(ValueError, match="max_depth"):
        specjax.theory.best_tree_budget(draft, target, COSTS["flat"], max_budget=4, max_depth=0)
    with pytest.raises(ValueError, match="target_cost is a table of length 3"):
        specjax.theory.best_tree_budget(draft, target, short, max_budget=4, max_depth=2)


def test_cost_model_is_hashable_and_tables_are_stored_as_tuples():
    a = specjax.CostModel(0.1, np.array([0.0, 1.0, 1.5]))
    b = specjax.CostModel(0.1, [0, 1, 1.5])
    assert a == b and hash(a) == hash(b)
    assert a.target_cost == (0.0, 1.0, 1.5)
    assert a.max_tokens == 2
