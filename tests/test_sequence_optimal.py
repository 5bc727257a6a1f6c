"""``OptimalMultiDraft(M, sequence_optimal=True)``: the matched tokens of every call root chosen
by backward induction over the horizon.

The oracle is Bellman's equation solved with a linear program over the couplings themselves
(variables ``x[S, y]``: draft set ``S``, output ``y``; marginals ``P(S)`` and ``q``) at every
root, with no use of the polymatroid, the greedy or the ``q / p`` order that the library relies
on. The library's exact value must equal it; its sampler must match its exact value and output
the target's law.
"""

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.optimize import linprog

import specjax
import stats
from conftest import chain
from conftest import edge_pair
from conftest import random_pair
from conftest import uniform_chain
from specjax.decoders import multi_draft
from specjax.sampling import engine

LP_OPTIONS = dict(primal_feasibility_tolerance=1e-10, dual_feasibility_tolerance=1e-10)


def draft_set_law(p, num_drafts):
    """``{frozenset S: P(S)}`` for ``M`` i.i.d. draws from ``p``."""
    law = {}
    for draws in itertools.product(range(len(p)), repeat=num_drafts):
        prob = float(np.prod(p[list(draws)]))
        if prob > 0:
            law[frozenset(draws)] = law.get(frozenset(draws), 0.0) + prob
    return law


def best_root(p, q, cost_matched, cost_unmatched, num_drafts):
    """``min E[cost]`` over every lossless verifier of the draft set: a coupling of the set
    ``S`` with ``Y ~ q`` and a decision, to follow the draft equal to ``Y`` (possible only when
    ``Y`` is in ``S``; cost ``cost_matched[Y]``) or to end the call with ``Y`` (cost
    ``cost_unmatched[Y]``). Variables ``x[S, y, follow]``."""
    law = draft_set_law(p, num_drafts)
    sets, num_states = list(law), len(q)
    columns = [(i, y, follow) for i, s in enumerate(sets) for y in range(num_states)
               for follow in ((False, True) if y in s else (False,))]
    c = np.array([cost_matched[y] if follow else cost_unmatched[y] for _, y, follow in columns])
    a_eq, b_eq = [], []
    for i, s in enumerate(sets):
        a_eq.append(np.array([float(j == i) for j, _, _ in columns]))
        b_eq.append(law[s])
    for y in range(num_states):
        a_eq.append(np.array([float(z == y) for _, z, _ in columns]))
        b_eq.append(q[y])
    b_eq = np.array(b_eq)
    b_eq[len(sets):] *= sum(law.values()) / q.sum()  # both marginals sum to one exactly
    result = linprog(c, A_eq=np.array(a_eq), b_eq=b_eq, bounds=(0, None), method="highs",
                     options=LP_OPTIONS)
    assert result.status == 0, result.message
    return result.fun


def bellman_rejections(init, p, q, num_drafts):
    """``E[N_rej]`` of the best depth-first verifier of ``M`` drafts (``K = T``): backward
    induction, each root by ``best_root``, each in-call step SD."""
    horizon, num_states = q.shape[:2]
    r_root = np.zeros(num_states)
    r_in = np.zeros(num_states)
    for n in reversed(range(horizon)):
        new_root = np.array([best_root(p[n, x], q[n, x], r_in, 1 + r_root, num_drafts)
                             for x in range(num_states)])
        accepted = np.minimum(p[n], q[n])
        new_in = accepted @ r_in + np.maximum(q[n] - p[n], 0) @ (1 + r_root)
        r_root, r_in = new_root, new_in
    return float(init @ r_root)


@pytest.mark.parametrize("num_drafts", [2, 3])
@pytest.mark.parametrize("seed", [0, 1])
def test_exact_rejections_equal_bellman_over_every_coupling(x64, num_drafts, seed):
    """V = 4, T = 5: on these chains the sequence optimum has at least 4e-4 fewer rejections
    than the per-token optimum (asserted), so a weight or position error shows."""
    draft, target = random_pair(seed, 4, 5, zero_fraction=0.3 * seed)
    expected = bellman_rejections(target[0], draft[1], target[1], num_drafts)
    got = specjax.exact(specjax.OptimalMultiDraft(num_drafts, sequence_optimal=True),
                        chain(draft), chain(target))
    np.testing.assert_allclose(float(got.expected_rejections), expected, rtol=0, atol=1e-9)
    per_token = specjax.exact(specjax.OptimalMultiDraft(num_drafts), chain(draft), chain(target))
    assert per_token.expected_rejections - got.expected_rejections > 1e-4


def test_exact_rejections_equal_bellman_on_edge_rows(x64):
    draft, target = edge_pair(4, 5)  # the shapes above: their M = 2 program
    expected = bellman_rejections(target[0], draft[1], target[1], 2)
    got = specjax.exact(specjax.OptimalMultiDraft(2, sequence_optimal=True),
                        chain(draft), chain(target))
    np.testing.assert_allclose(float(got.expected_rejections), expected, rtol=0, atol=1e-9)


@functools.partial(jax.jit, static_argnums=0)
def _exact_of(decoders, draft, target):
    """``exact`` of each decoder: one program (nine ``exact`` programs otherwise)."""
    return [specjax.exact(decoder, draft, target) for decoder in decoders]


@pytest.mark.parametrize("seed", [0])
def test_sequence_optimum_never_loses_to_the_per_token_optimum_nor_to_batch_sd(x64, seed):
    draft, target = random_pair(10 + seed, 5, 6, zero_fraction=0.2)
    draft, target = chain(draft), chain(target)
    drafts = (2, 4, math.inf)
    values = _exact_of(tuple(d for m in drafts for d in (
        specjax.OptimalMultiDraft(m, sequence_optimal=True), specjax.OptimalMultiDraft(m),
        specjax.BatchSpeculative(m))), draft, target)
    for i, m in enumerate(drafts):
        sequence, token, batch = values[3 * i: 3 * i + 3]
        # Bellman: no root verifier beats it, batch SD's and the per-token optimum's included
        # (the per-token optimum itself can lose to batch SD over a sequence, by up to 7e-4
        # on the random chains of tests/test_optimal_multi_draft.py).
        assert sequence.expected_rejections <= token.expected_rejections + 1e-12
        assert sequence.expected_rejections <= batch.expected_rejections + 1e-12
        # Unbiased: the marginals are the target's.
        np.testing.assert_allclose(sequence.marginals, token.marginals, atol=1e-12)


def test_one_position_the_sequence_optimum_is_the_per_token_optimum(x64):
    draft, target = random_pair(3, 6, 1, zero_fraction=0.2)
    draft, target = chain(draft), chain(target)
    sequence = specjax.exact(specjax.OptimalMultiDraft(3, sequence_optimal=True), draft, target)
    token = specjax.exact(specjax.OptimalMultiDraft(3), draft, target)
    np.testing.assert_allclose(sequence.expected_rejections, token.expected_rejections,
                               atol=1e-12)


@jax.jit
def _ratio_weighted_and_per_token(p, q):
    """The accepted masses of the weighted greedy with weights ``q / p`` and of the per-token
    root law, M = 1, 2, 5, infinity: one program (eagerly, dozens)."""
    out = []
    for m in (1, 2, 5, math.inf):
        weights = q / jnp.where(p > 0, p, 1e-300)
        out.append((multi_draft.weighted_optimal_root_law(p, q, weights, m).accepted,
                    multi_draft.optimal_root_law(p, q, m).accepted))
    return out


def test_weighted_greedy_with_ratio_weights_is_the_per_token_root_law(x64):
    rng = np.random.default_rng(5)
    p = jnp.asarray(rng.dirichlet(np.full(7, 0.4), size=40))
    q = jnp.asarray(rng.dirichlet(np.full(7, 0.4), size=40))
    for weighted, per_token in _ratio_weighted_and_per_token(p, q):
        np.testing.assert_allclose(weighted, per_token, atol=1e-14)


@functools.partial(jax.jit, static_argnums=3)
def _weighted_law(p, q, weights, num_drafts):
    """``weighted_optimal_root_law``'s (accepted, rejected): one program per M."""
    law = multi_draft.weighted_optimal_root_law(p, q, weights, num_drafts)
    return law.accepted, law.rejected


def test_weighted_greedy_maximises_the_weighted_match_over_every_coupling(x64):
    """On single rows, with random weights of both signs: the greedy's ``sum m w`` equals the
    linear program's maximum over couplings."""
    rng = np.random.default_rng(6)
    for _ in range(12):
        p, q = rng.dirichlet(np.full(4, 0.5)), rng.dirichlet(np.full(4, 0.5))
        weights = rng.normal(size=4)
        for m in (2, 3):
            accepted, rejected = (np.asarray(x) for x in _weighted_law(
                jnp.asarray(p), jnp.asarray(q), jnp.asarray(weights), m))
            best = -best_root(p, q, -weights, np.zeros(4), m)
            np.testing.assert_allclose(float(accepted @ weights), best, atol=1e-9)
            np.testing.assert_allclose(accepted + rejected, q, atol=1e-15)


PLANS = (engine.TablePlan(engine.ALL_KINDS, None), engine.TablePlan(engine.ALL_KINDS, 4, 2),
         engine.TablePlan(engine.ALL_KINDS, 3))


@functools.partial(jax.jit, static_argnums=4)
def _engine_tables(decoder, per_token, draft_trans, target_trans, plans):
    """One program (eagerly, over two hundred): the bound decoder's thresholds at every
    position (``kind_thresholds`` at ``positions=n``, one position at a time), the per-token
    optimum's table, and for each plan the sampler's table at each position as its scan reads
    it (``laws.at`` in a ``lax.scan`` over ``jnp.arange(T)``, as the sampler's, the state
    carried). Loops over positions, not unrolled: a program a fraction of the size."""
    horizon = draft_trans.shape[0]
    bound = decoder.bind(draft_trans, target_trans)
    expected = jax.lax.map(lambda n: engine.kind_thresholds(
        bound, draft_trans[n], target_trans[n], engine.ALL_KINDS, positions=n),
        jnp.arange(horizon, dtype=jnp.int32))
    tables = []
    for plan in plans:
        laws = engine.markov_laws(decoder, draft_trans, target_trans, plan)

        def step(state, xs, laws=laws):
            table_n, n = xs
            got, state = laws.at(table_n, n, state)
            return state, got

        _, out = jax.lax.scan(step, laws.state, (laws.xs, jnp.arange(horizon, dtype=jnp.int32)))
        tables.append(out)
    return (expected, engine.decoder_table(per_token, draft_trans, target_trans),
            tables)


def test_engine_tables_are_the_bound_decoders_laws_at_every_position():
    """The sampler's law tables, built before the scan or per group of positions inside it,
    equal the bound decoder's laws at each position (``laws_at(n, ...)``), and differ from the
    per-token optimum's: the Monte Carlo test below cannot see a wrong weight or position (the
    sequence optimum's E[N_rej] differs from the per-token one's by 1e-3 or less)."""
    draft, target = (chain(x) for x in random_pair(1, 4, 5, zero_fraction=0.3))
    decoder = specjax.OptimalMultiDraft(2, sequence_optimal=True)
    expected, per_token, plan_tables = _engine_tables(
        decoder, specjax.OptimalMultiDraft(2), draft.trans, target.trans, PLANS)
    expected, per_token = np.asarray(expected), np.asarray(per_token)
    assert max(int(np.abs(per_token[n] - expected[n]).max()) for n in range(5)) > 2**20
    for plan, tables in zip(PLANS, plan_tables):
        tables = np.asarray(tables)
        for n in range(5):
            np.testing.assert_allclose(tables[n], expected[n], rtol=0, atol=256,
                                       err_msg=f"{plan}, position {n}")


@pytest.mark.slow  # a Monte Carlo run of 100,000 chains or more
def test_sampler_output_law_rejections_and_calls_match_the_exact_values():
    """Monte Carlo: 200,000 chains on a random chain with zeros (V = 3, T = 3): the law of the
    output sequences passes a chi-square test against the target's (false-failure rate 1e-5),
    mean rejections and calls within 4.5 standard errors of the exact values. This checks that
    the sampler is lossless and agrees with ``exact``; the weights' positions are checked by
    the table test above."""
    draft_np, target_np = random_pair(7, 3, 3, zero_fraction=0.2)
    draft, target = chain(draft_np), chain(target_np)
    decoder = specjax.OptimalMultiDraft(2, sequence_optimal=True)
    num_chains = 200_000
    trace = specjax.decode(jax.random.key(11), decoder, draft, target, num_chains)
    init, trans = target_np
    law = {}
    for seq in itertools.product(range(3), repeat=4):
        prob = init[seq[0]] * np.prod([trans[n, seq[n], seq[n + 1]] for n in range(3)])
        if prob > 0:
            law[seq] = prob
    stats.assert_law(stats.count_rows(np.asarray(trace.tokens)), law, num_chains,
                     "sequence-optimal output sequences")
    exact = specjax.exact(decoder, draft, target)
    stats.assert_mean(trace.num_rejections, float(exact.expected_rejections), "rejections")
    stats.assert_mean(trace.num_calls, float(exact.expected_calls), "calls")


def test_values_and_gradients_stay_finite_on_edge_rows():
    draft, target = edge_pair()
    draft, target = chain(draft), chain(target)
    decoder = specjax.OptimalMultiDraft(3, sequence_optimal=True)

    def rejections(logits):
        model = specjax.MarkovChain.from_logits(jnp.log(draft.init), logits)
        return specjax.exact(decoder, model, target).expected_rejections

    @jax.jit  # one program (eagerly, dozens)
    def values(logits):
        return (jax.value_and_grad(rejections)(logits),
                multi_draft.sequence_optimal_weights(draft.trans, target.trans, 3))

    (value, grad), weights = values(jnp.log(jnp.maximum(draft.trans, 1e-30)))
    assert np.isfinite(float(value)) and bool(jnp.isfinite(grad).all())
    assert bool(jnp.isfinite(weights).all())


def test_settings_it_cannot_run_are_refused_before_any_work():
    draft = target = uniform_chain(7, 50)  # refused on their sizes: no Dirichlet draw compiled
    with pytest.raises(ValueError, match="sequence_optimal=True needs replacement=True"):
        specjax.OptimalMultiDraft(2, replacement=False, sequence_optimal=True)
    with pytest.raises(ValueError, match="sequence_optimal=True needs lookahead=None"):
        specjax.OptimalMultiDraft(2, sequence_optimal=True, lookahead=3)
    with pytest.raises(ValueError, match="sequence_optimal must be True or False"):
        specjax.OptimalMultiDraft(2, sequence_optimal=1)
    with pytest.raises(ValueError, match="laws per position only"):
        specjax.OptimalMultiDraft(2, sequence_optimal=True).laws(draft.trans[0], target.trans[0])
    ngram = specjax.NGramModel.fit([np.arange(30) % 3], order=1, num_states=3)
    with pytest.raises(ValueError):
        specjax.decode(jax.random.key(0), specjax.OptimalMultiDraft(2, sequence_optimal=True),
                       ngram, ngram, 10, horizon=4)
    big = specjax.MarkovChain(jnp.full(400, 1 / 400), jnp.full((2, 400, 400), 1 / 400))
    with pytest.raises(ValueError, match="sequence_optimal"):
        specjax.exact(specjax.OptimalMultiDraft(2, sequence_optimal=True), big, big)
