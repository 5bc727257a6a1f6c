"""Exact theory (float64) against brute force, the paper's printed formulas and closed forms."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
import reference as ref
from conftest import chain
from conftest import full_suite_only
from conftest import random_pair
from conftest import random_rows
from conftest import theorem1_terms

TIGHT = 1e-10  # float64 exact identities


def chains(draft, target):
    return chain(draft), chain(target)


# --- brute force: the literal algorithms enumerated over every execution path ------------------

@pytest.mark.parametrize("lookahead", [full_suite_only(None), 1, 2])
def test_sd_counts_equal_enumerated_literal_algorithm(x64, lookahead):
    draft, target = random_pair(10, 3, 4, zero_fraction=0.3)
    law = ref.enumerate_law(lambda ch: ref.sd_literal(ch, draft, target, lookahead))
    rej, calls = ref.expected_counts_from_law(law)
    exact = specjax.exact(specjax.Speculative(lookahead), *chains(draft, target))
    assert abs(float(exact.expected_rejections) - rej) < TIGHT
    assert abs(float(exact.expected_calls) - calls) < TIGHT
    # Per position: E[R_n] and the law of x_n.
    for n in range(4):
        rate = sum(pr * r[n] for (_, r, _), pr in law.items())
        assert abs(float(exact.rejection_rate[n]) - rate) < TIGHT
    marg = ref.forward_marginals(*target)
    np.testing.assert_allclose(np.asarray(exact.marginals), marg, atol=TIGHT)


@pytest.mark.parametrize("num_drafts,horizon", [(1, 3), full_suite_only(2, 3), (3, 2)])
def test_batch_counts_equal_enumerated_literal_algorithm(x64, num_drafts, horizon):
    # (M = 3 at T = 3 has too many execution paths to enumerate quickly.)
    draft, target = random_pair(11, 3, horizon, zero_fraction=0.2)
    law = ref.enumerate_law(lambda ch: ref.batch_literal(ch, draft, target, num_drafts))
    rej, calls = ref.expected_counts_from_law(law)
    exact = specjax.exact(specjax.BatchSpeculative(num_drafts), *chains(draft, target))
    assert abs(float(exact.expected_rejections) - rej) < TIGHT
    assert abs(float(exact.expected_calls) - calls) < TIGHT
    # f of Theorem 3 (marginalised): P(x_n = x, rejected at n).
    np.testing.assert_allclose(np.asarray(exact.rejected), ref.rejected_measure(law, 3, horizon),
                               atol=TIGHT)


@pytest.mark.parametrize("residual", ["optimal", "target", "standard"])
@pytest.mark.parametrize("lookahead", [None, 2])
def test_biased_counts_and_output_law_equal_enumeration(x64, residual, lookahead):
    draft, target = random_pair(12, 3, 3)
    eps = 0.15
    residual_fn = {"optimal": ref.optimal_residual, "target": lambda p, q, b: q,
                   "standard": ref.sd_residual}[residual]
    law = ref.enumerate_law(lambda ch: ref.general_literal(
        ch, draft, target, lambda p, q: ref.biased_accept(p, q, eps), residual_fn, lookahead))
    rej, calls = ref.expected_counts_from_law(law)
    d, t = chains(draft, target)
    exact = specjax.exact(specjax.BiasedSpeculative(eps, residual=residual, lookahead=lookahead),
                          d, t)
    assert abs(float(exact.expected_rejections) - rej) < TIGHT
    assert abs(float(exact.expected_calls) - calls) < TIGHT
    tokens_law = ref.marginalise_tokens(law)
    for n in range(4):
        marg = np.zeros(3)
        for seq, pr in tokens_law.items():
            marg[seq[n]] += pr
        np.testing.assert_allclose(np.asarray(exact.marginals[n]), marg, atol=TIGHT)
    if lookahead is None:  # the output is a Markov chain: compare whole-sequence laws and KL
        out = specjax.theory.biased_output_chain(d, t, epsilon=eps, residual=residual)
        seq_law = ref.target_sequence_law((np.asarray(out.init), np.asarray(out.trans)))
        keys = set(seq_law) | set(tokens_law)
        assert max(abs(seq_law.get(k, 0) - tokens_law.get(k, 0)) for k in keys) < TIGHT
        kl = ref.sequence_kl(tokens_law, ref.target_sequence_law(target))
        assert abs(float(specjax.theory.sequence_kl(out, t)) - kl) < 1e-9


# --- the paper's printed formulas on larger instances ------------------------------------------

@pytest.mark.parametrize("seed", [0, 1])
def test_theorem1_formula(x64, seed):
    draft, target = random_pair(seed, 7, 50, zero_fraction=0.3)
    got = float(specjax.expected_rejections(*chains(draft, target)))
    assert abs(got - ref.theorem1_rejections(draft, target)) < 1e-9
    assert abs(got - float(theorem1_terms(*chains(draft, target)).sum())) < 1e-9


@pytest.mark.parametrize("num_drafts", [1, 2, 4, 5])
def test_theorem3_printed_formula(x64, num_drafts):
    # T = 50, test_theorem1_formula's size: M = 2's program is also
    # test_forward_recursion_matches_reference_recursion's
    draft, target = random_pair(3, 7, 50, zero_fraction=0.3)
    got = float(specjax.batch_expected_rejections(*chains(draft, target), num_drafts=num_drafts))
    assert abs(got - ref.theorem3_rejections(draft, target, num_drafts)) < 1e-9


@pytest.mark.parametrize("kind,lookahead,num_drafts", [
    ("sd", 1, 1), ("sd", 4, 1), ("sd", 7, 1), ("sd", None, 1),
    ("batch", None, 2), ("batch", None, 6),
])
def test_forward_recursion_matches_reference_recursion(x64, kind, lookahead, num_drafts):
    # T = 50: the programs of K = T (test_theorem1_formula) and of batch M = 2
    # (test_theorem3_printed_formula)
    draft, target = random_pair(4, 7, 50, zero_fraction=0.3)
    d, t = chains(draft, target)
    if kind == "sd":
        exact = specjax.exact(specjax.Speculative(lookahead), d, t)
    else:
        exact = specjax.exact(specjax.BatchSpeculative(num_drafts), d, t)
    rej, calls = ref.exact_counts(draft, target, kind=kind, lookahead=lookahead,
                                  num_drafts=num_drafts)
    assert abs(float(exact.expected_rejections) - rej) < 1e-9
    assert abs(float(exact.expected_calls) - calls) < 1e-9


def test_batch_lookahead_counts_match_enumerated_kernel_law(x64):
    """Batch SD with a finite lookahead (beyond the paper) against the samplers' own kernel law,
    enumerated exactly (the kernel itself is checked against the literal algorithms)."""
    from test_literal_equivalence import kernel_law
    from test_literal_equivalence import specjax_laws
    draft, target = random_pair(13, 3, 4, zero_fraction=0.2)
    law = kernel_law(target[0], *specjax_laws(draft, target, "batch", num_drafts=2), 2)
    rej, calls = ref.expected_counts_from_law(law)
    exact = specjax.exact(specjax.BatchSpeculative(2, lookahead=2), *chains(draft, target))
    assert abs(float(exact.expected_rejections) - rej) < TIGHT
    assert abs(float(exact.expected_calls) - calls) < TIGHT


# --- lookahead K: Leviathan et al.'s closed form -------------------------------------------------

def constant_acceptance_pair(rng, num_states, horizon, alpha):
    """Rows with ``sum min(p, q) = alpha`` everywhere: ``p`` moves mass ``1 - alpha`` from ``q``'s
    largest entry to another token."""
    q = random_rows(rng, (horizon, num_states, num_states), concentration=3.0)
    delta = 1.0 - alpha
    assert delta <= 1.0 / num_states  # so the largest entry of every row is at least delta
    p = q.copy()
    top = q.argmax(-1)
    other = (top + 1 + rng.integers(0, num_states - 1, size=top.shape)) % num_states
    np.put_along_axis(p, top[..., None], np.take_along_axis(q, top[..., None], -1) - delta, -1)
    np.put_along_axis(p, other[..., None], np.take_along_axis(q, other[..., None], -1) + delta, -1)
    init = np.full(num_states, 1.0 / num_states)
    return (init, p), (init, q)


@pytest.mark.parametrize("lookahead", [1, 3, 5])
def test_tokens_per_call_is_leviathan_closed_form(x64, lookahead):
    alpha, horizon = 0.85, 400
    draft, target = constant_acceptance_pair(np.random.default_rng(5), 5, horizon, alpha)
    exact = specjax.exact(specjax.Speculative(lookahead), *chains(draft, target))
    # Every verified draft is rejected with probability 1 - alpha; bonus tokens never are.
    # Renewal: the long-run call rate is 1 / E[tokens per call].
    per_call = (1 - alpha ** (lookahead + 1)) / (1 - alpha)
    np.testing.assert_allclose(np.asarray(exact.new_call[-50:]).mean(), 1 / per_call, rtol=1e-9)
    # Finite horizon, exactly: a phase-only renewal recursion.
    dist = np.zeros(lookahead + 1)
    dist[0] = 1.0
    calls = rejections = 0.0
    for _ in range(horizon):
        calls += dist[0]
        new = np.zeros_like(dist)
        new[0] = dist[lookahead] + (1 - alpha) * dist[:lookahead].sum()
        rejections += (1 - alpha) * dist[:lookahead].sum()
        new[1:] = alpha * dist[:lookahead]
        dist = new
    assert abs(float(exact.expected_calls) - calls) < 1e-9
    assert abs(float(exact.expected_rejections) - rejections) < 1e-9


def test_constant_acceptance_rejections_are_t_times_tv(x64):
    alpha, horizon = 0.8, 60
    draft, target = constant_acceptance_pair(np.random.default_rng(6), 4, horizon, alpha)
    got = float(specjax.expected_rejections(*chains(draft, target)))
    assert abs(got - horizon * (1 - alpha)) < 1e-9


def test_lookahead_at_least_horizon_is_the_paper_setting(x64):
    d, t = chains(*random_pair(7, 5, 10, zero_fraction=0.2))
    a = specjax.exact(specjax.Speculative(), d, t)
    for k in (10, 11, 1000):
        b = specjax.exact(specjax.Speculative(k), d, t)
        np.testing.assert_allclose(np.asarray(b.rejected), np.asarray(a.rejected), atol=1e-12)
        np.testing.assert_allclose(np.asarray(b.new_call), np.asarray(a.new_call), atol=1e-12)


# --- batch SD: closed forms and M -> infinity -------------------------------------------------

SPREAD = [(8, 2), (12, 3), (10, 5)]  # uniform p on V tokens, uniform q on the first v_small
BINARY = [(0.5, 0.5), (0.7, 0.5), (0.9, 0.2), (1.0, 0.3)]  # p = (1 - u, u), q = (1 - w, w)


@functools.partial(jax.jit, static_argnums=0)
def _closed_form_improvements(num_drafts):
    """``batch_improvement`` on the rows of SPREAD and BINARY: one program per M."""
    spread = []
    for v, v_small in SPREAD:
        p = jnp.full((v,), 1.0 / v)
        q = jnp.where(jnp.arange(v) < v_small, 1.0 / v_small, 0.0)
        spread.append(specjax.batch_improvement(p, q, num_drafts=num_drafts))
    binary = [specjax.batch_improvement(jnp.array([1 - u, u]), jnp.array([1 - w, w]),
                                        num_drafts=num_drafts) for u, w in BINARY]
    return spread, binary


@pytest.mark.parametrize("num_drafts", [1, 2, 3, 5, 10])
def test_batch_improvement_closed_forms(x64, num_drafts):
    m = num_drafts
    spread, binary = _closed_form_improvements(m)
    for (v, v_small), got in zip(SPREAD, spread):
        r = v / v_small
        expected = (1 - 1 / r) - (1 - 1 / r) ** m
        assert abs(float(got) - expected) < 1e-12
    for (u, w), got in zip(BINARY, binary):
        expected = abs(u - w) * (1 - u ** (m - 1))
        assert abs(float(got) - expected) < 1e-12


@jax.jit
def _batch_rejections_in_m(d, t):
    """Batch SD's E[N_rej] for M = 1, 2, 3, 5, 8, 13, 30, then SD's, M = infinity and M = 3000:
    one program (ten compiled one each)."""
    return ([specjax.batch_expected_rejections(d, t, num_drafts=m)
             for m in (1, 2, 3, 5, 8, 13, 30)]
            + [specjax.expected_rejections(d, t)]
            + [specjax.batch_expected_rejections(d, t, num_drafts=m) for m in (math.inf, 3000)])


def test_batch_rejections_decrease_in_m_to_a_positive_limit(x64):
    rng = np.random.default_rng(8)
    init = np.full(6, 1 / 6)
    # Concentrated Dirichlet rows: no tiny draft probabilities, so the residual chain converges
    # fast (its rate is 1 - p(x*) at the token x* maximising q / p; it can be very slow).
    d = chain((init, random_rows(rng, (20, 6, 6), concentration=5.0)))
    t = chain((init, random_rows(rng, (20, 6, 6), concentration=5.0)))
    *values, sd, limit, big = (float(x) for x in _batch_rejections_in_m(d, t))
    assert all(a >= b - 1e-12 for a, b in zip(values, values[1:]))
    assert abs(values[0] - sd) < 1e-12
    # Full supports: the product of TVs decays geometrically, so a large M reaches the limit.
    assert abs(big - limit) < 1e-9
    assert 0 < limit <= values[-1]


def test_batch_limit_with_tokens_the_draft_never_proposes(x64):
    """Where q has mass outside p's support, the residual never empties: the limit rejects
    exactly that mass (the paper's proof assumes the product of TVs tends to zero)."""
    rng = np.random.default_rng(9)
    q = rng.dirichlet(np.ones(5))
    p = rng.dirichlet(np.ones(5))
    p[0] = 0.0
    p /= p.sum()
    for m in (1, 3, 10, 100):
        w = specjax.decoders.batch_residual_mass(jnp.asarray(p), jnp.asarray(q), num_drafts=m)
        assert float(jnp.sum(w)) >= q[0] - 1e-15
    w = specjax.decoders.batch_residual_mass(jnp.asarray(p), jnp.asarray(q), num_drafts=200)
    np.testing.assert_allclose(np.asarray(w), np.where(p > 0, 0.0, q), atol=1e-15)
    lim = specjax.decoders.batch_residual_mass(jnp.asarray(p), jnp.asarray(q), num_drafts=math.inf)
    np.testing.assert_allclose(np.asarray(lim), np.where(p > 0, 0.0, q), atol=0)


def test_batch_residual_mass_equals_normalised_chain(x64):
    rng = np.random.default_rng(10)
    p = random_rows(rng, (50, 6), zero_fraction=0.3)
    q = random_rows(rng, (50, 6), zero_fraction=0.3)
    for m in (1, 2, 4, 7):
        want = np.stack([ref.batch_root_masses(pr, qr, m)[1] for pr, qr in zip(p, q)])
        got = specjax.decoders.batch_residual_mass(jnp.asarray(p), jnp.asarray(q), num_drafts=m)
        np.testing.assert_allclose(np.asarray(got), want, atol=1e-13)


# --- the framework (Theorem 2) -----------------------------------------------------------------

@jax.jit
def _scaled_rule_values(lam, d, t):
    """``exact`` and ``output_chain`` of the rule ``b = lam * min(1, q / p)`` with Theorem 4's
    residual: ``lam`` traced, so one program serves every ``lam`` (a closure per ``lam``
    compiled each anew)."""
    def accept(p, q):
        return lam * specjax.acceptance_probability(p, q, epsilon=0.0)

    rule = specjax.RejectionRule(accept, specjax.optimal_residual)
    return specjax.exact(rule, d, t), specjax.output_chain(rule, d, t)


def test_no_unbiased_rule_beats_sd(x64):
    """Random unbiased rules: ``b = lam * min(1, q/p)`` with Theorem 4's residual (which is then
    ``A``, an exact correction) are unbiased and reject at least as often as SD (Theorem 2)."""
    d, t = chains(*random_pair(14, 5, 15, zero_fraction=0.2))
    sd = float(specjax.expected_rejections(d, t))
    target_marginals = np.asarray(specjax.marginals(t))  # once (each call compiles its scan)
    rng = np.random.default_rng(15)
    for lam_value in (1.0, 0.9, 0.5, 0.0):
        lam = jnp.asarray(np.clip(lam_value + 0.05 * rng.standard_normal(5), 0, 1)) \
            if lam_value < 1 else jnp.ones(5)
        exact, out = _scaled_rule_values(lam, d, t)
        np.testing.assert_allclose(np.asarray(out.trans), np.asarray(t.trans), atol=1e-12)
        np.testing.assert_allclose(np.asarray(exact.marginals), target_marginals, atol=1e-12)
        assert float(exact.expected_rejections) >= sd - 1e-12
        if lam_value == 1.0:
            assert abs(float(exact.expected_rejections) - sd) < 1e-12


@jax.jit
def _biased_values(eps, d, t):
    """``E[N_rej]`` of ``BiasedSpeculative(eps)`` and the sequence KL of its output chain with
    the optimal and with the target residual: ``eps`` traced, one program for every ``eps``."""
    opt = specjax.exact(specjax.BiasedSpeculative(eps), d, t)
    kl_opt = specjax.theory.sequence_kl(specjax.theory.biased_output_chain(d, t, epsilon=eps), t)
    kl_uno = specjax.theory.sequence_kl(
        specjax.theory.biased_output_chain(d, t, epsilon=eps, residual="target"), t)
    return opt.expected_rejections, kl_opt, kl_uno


def test_biased_rules_trade_rejections_for_bias(x64):
    d, t = chains(*random_pair(16, 5, 15))
    sd = float(specjax.expected_rejections(d, t))
    previous = sd
    for eps in (0.05, 0.1, 0.3):
        rejections, kl_opt, kl_uno = (float(x) for x in _biased_values(jnp.asarray(eps), d, t))
        assert rejections < previous
        previous = rejections
        assert 0 < kl_opt < kl_uno


# --- Theorems 4-5 --------------------------------------------------------------------------------

@jax.jit
def _residual_tvs(p, q, epsilon, others):
    """``L*`` of the optimal biased rule at ``epsilon`` and the TV of its output with the
    optimal residual, with ``q`` (Decoding-UNO) and with each row set of ``others``."""
    b = specjax.acceptance_probability(p, q, epsilon=epsilon)
    reject = specjax.rejection_probability(p, b)

    def tv_of(residual):
        return specjax.tv_distance(b * p + reject[:, None] * residual, q)

    return (specjax.tv_loss_star(p, q, b), tv_of(specjax.optimal_residual(p, q, b)), tv_of(q),
            jnp.stack([tv_of(other) for other in others]))


def test_pareto_front_identity_and_loss_star_is_attained(x64):
    rng = np.random.default_rng(17)
    p = jnp.asarray(random_rows(rng, (20, 6), zero_fraction=0.3))
    q = jnp.asarray(random_rows(rng, (20, 6), zero_fraction=0.3))
    eps = np.linspace(0.0, 1.0, 11)
    front = jax.jit(specjax.theory.pareto_front)(p, q, eps)  # one program, not dozens
    # The checks in NumPy (each jnp operation on the results would compile a program)
    rejection, loss_star, tv = (np.asarray(x) for x in (front.rejection_probability,
                                                        front.loss_star, front.tv))
    assert rejection.shape == loss_star.shape == (11, 20)
    np.testing.assert_allclose(rejection + loss_star, np.broadcast_to(tv, (11, 20)), atol=1e-12)
    np.testing.assert_allclose(loss_star[0], 0.0, atol=1e-12)  # eps = 0 is SD
    for e in (0.05, 0.3):
        others = np.stack([random_rows(rng, (20, 6), zero_fraction=0.2) for _ in range(20)])
        loss, optimal, uno, other = (np.asarray(x) for x in _residual_tvs(p, q, e, others))
        np.testing.assert_allclose(optimal, loss, atol=1e-12)
        assert np.all(uno >= loss - 1e-12)  # Decoding-UNO
        for tv in other:  # any other rejection distribution does no better
            assert np.all(tv >= loss - 1e-12)


def test_loss_star_vanishes_below_the_sd_threshold(x64):
    rng = np.random.default_rng(18)
    p = jnp.asarray(random_rows(rng, (30, 5), zero_fraction=0.3))
    q = jnp.asarray(random_rows(rng, (30, 5), zero_fraction=0.3))

    @jax.jit  # one program (op by op, about fifteen)
    def loss_star(p, q, u):
        return specjax.tv_loss_star(p, q, specjax.acceptance_probability(p, q, epsilon=0.0) * u)

    np.testing.assert_allclose(np.asarray(loss_star(p, q, rng.random((30, 5)))), 0.0, atol=1e-12)


def test_tv_and_residual_conventions(x64):
    p = jnp.array([0.5, 0.5, 0.0])
    q = jnp.array([0.2, 0.3, 0.5])
    assert abs(float(specjax.tv_distance(p, q)) - 0.5) < 1e-15
    np.testing.assert_allclose(np.asarray(specjax.speculative_residual(p, q)), [0, 0, 1])
    np.testing.assert_array_equal(np.asarray(specjax.speculative_residual(p, p)), 0.0)
    assert float(specjax.rejection_probability(p, jnp.ones(3))) == 0.0


# --- against the samplers' Monte Carlo ------------------------------------------------------------

@pytest.mark.slow  # a Monte Carlo run of 100,000 chains or more
@pytest.mark.parametrize("case", ["sd K=4", "batch M=4", "batch M=3 K=3", "biased opt K=T",
                                  "biased uno K=4"])
def test_exact_values_match_sampler_means(case):
    """Mean rejections and calls of 100,000 chains within 4.5 standard errors of the exact value
    (false-failure rate about 7e-6 per comparison)."""
    import jax
    from stats import assert_mean
    d, t = specjax.paper_instance()
    key = jax.random.key(20)
    c = 100_000
    if case == "sd K=4":
        trace = specjax.speculative_decoding(key, d, t, c, lookahead=4)
        exact = specjax.exact(specjax.Speculative(4), d, t)
    elif case == "batch M=4":
        trace = specjax.batch_speculative_decoding(key, d, t, c, num_drafts=4)
        exact = specjax.exact(specjax.BatchSpeculative(4), d, t)
    elif case == "batch M=3 K=3":
        trace = specjax.batch_speculative_decoding(key, d, t, c, num_drafts=3, lookahead=3)
        exact = specjax.exact(specjax.BatchSpeculative(3, lookahead=3), d, t)
    elif case == "biased opt K=T":
        trace = specjax.biased_speculative_decoding(key, d, t, c, epsilon=0.1)
        exact = specjax.exact(specjax.BiasedSpeculative(0.1), d, t)
    else:
        trace = specjax.biased_speculative_decoding(key, d, t, c, epsilon=0.1, residual="target",
                                                    lookahead=4)
        exact = specjax.exact(specjax.BiasedSpeculative(0.1, residual="target", lookahead=4), d, t)
    assert_mean(np.asarray(trace.num_rejections), float(exact.expected_rejections),
                f"{case} rejections")
    assert_mean(np.asarray(trace.num_calls), float(exact.expected_calls), f"{case} calls")
    # The law of the final token against the exact marginal (chi-square, p > 1e-5).
    from stats import assert_law
    counts = np.bincount(np.asarray(trace.tokens[:, -1]), minlength=7)
    marginal = np.asarray(exact.marginals[-1], np.float64)
    assert_law({(i,): int(n) for i, n in enumerate(counts) if n},
               {(i,): float(m) for i, m in enumerate(marginal)}, c, f"{case} x_T")
