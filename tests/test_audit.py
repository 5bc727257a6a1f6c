"""``specjax.auditing``: correct rules pass, broken rules are flagged, exact mode is exact.

False failures. "A correct rule passes" tests assert per row ``not biased`` and not
``accepts_more_than_possible`` (each at the audit's ``alpha = 1e-6``) and the acceptance rate
within ``Z = 4.5`` standard errors of the optimum (6.8e-6): 30 rows, about 3e-4 in all. The
Monte Carlo-versus-exact tests (chi-square at ``ALPHA = 1e-5``, ``Z``, a TV deviation bound at
``ALPHA``) add about 2e-4, and the u = 0 test's Monte Carlo part 2.4e-4 (see there).

Power. "A broken rule is flagged" tests use biases of TV >= 0.25 with N = 20,000 drafts: the
chi-square's non-centrality is at least ``4 N TV^2 >= 5,000`` against a critical value of at most
31 at 1e-6 (3 degrees of freedom), so a miss has probability far below 1e-100; where the rule
also accepts more than the optimum, the excess is at least 0.37, over 100 standard errors.
Seeds are fixed and were never changed to make a test pass.
"""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as sps

from conftest import edge_pair
from conftest import random_rows
from specjax.auditing.audit import BROKEN_RULES
from specjax.auditing.audit import CORRECT_RULES
from specjax.auditing.audit import accept_all
from specjax.auditing.audit import accepts_at_zero_uniform
from specjax.auditing.audit import accepts_at_zero_uniform_u
from specjax.auditing.audit import audit
from specjax.auditing.audit import audit_exact
from specjax.auditing.audit import chi2_sf
from specjax.auditing.audit import from_uniform
from specjax.auditing.audit import greedy_rule
from specjax.auditing.audit import greedy_rule_u
from specjax.auditing.audit import speculative_rule
from specjax.auditing.audit import speculative_rule_u
from stats import ALPHA
from stats import Z
from stats import chi_square_pvalue
from test_scripts import import_script

AUDIT_ALPHA = 1e-6
N_CORRECT = 50_000
N_BROKEN = 20_000


def edge_rows(dtype=np.float32):
    """``(B, 4)`` draft and target rows: p = q, disjoint supports, one-hot disjoint, one-hot
    equal, a residual exhausted after two drafts, p = 0 where q > 0, and a random row with zeros
    (``tests/conftest.py``'s ``edge_pair``)."""
    (_, p), (_, q) = edge_pair()
    where = [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (2, 0)]
    rows = lambda m: np.stack([m[i, j] for i, j in where]).astype(dtype)  # noqa: E731
    return rows(p), rows(q)


def random_batch(seed, num_rows, num_tokens, dtype=np.float32):
    rng = np.random.default_rng(seed)
    p = random_rows(rng, (num_rows, num_tokens), zero_fraction=0.3)
    q = random_rows(rng, (num_rows, num_tokens), zero_fraction=0.3)
    return p.astype(dtype), q.astype(dtype)


def sd_acceptance(p, q):
    return np.minimum(np.asarray(p, np.float64), np.asarray(q, np.float64)).sum(-1)


def assert_unbiased_and_optimal(report, what, optimum=None):
    """Not flagged, and the acceptance rate within Z standard errors of ``optimum`` (default: the
    report's own, exact for ``"sample"`` and ``"greedy"`` drafting)."""
    n = report.num_samples
    opt = report.optimal_acceptance if optimum is None else optimum
    for b in range(len(report.biased)):
        assert not report.biased[b], f"{what}, row {b}:\n{report}"
        assert not report.accepts_more_than_possible[b], f"{what}, row {b}:\n{report}"
        assert report.impossible_tokens[b].sum() == 0 and report.invalid_tokens[b] == 0
        # A correct rule attains the optimum exactly: |rate - optimum| <= Z se (se under the
        # optimum, which is 0 where acceptance is certain or impossible).
        se = math.sqrt(max(opt[b] * (1 - opt[b]), 0.0) / n)
        assert abs(report.acceptance_rate[b] - opt[b]) <= Z * se + 1e-6, f"{what}, row {b}"


def draw_categorical(key, p):
    """A drafting function: ``x ~ p`` (the same law as ``drafting="sample"``)."""
    return jax.random.categorical(key, jnp.log(p))


# ---------------------------------------------------------------------------------------------
# Monte Carlo: correct rules pass on every edge case.

# speculative_rule, its traces counted (test_no_recompilation_for_new_values): the edge-row test
# audits it too, so the two share one compiled audit.
COUNTED_SPECULATIVE = chex.assert_max_traces(speculative_rule, n=2)


@pytest.mark.parametrize("name", ["speculative_rule", "greedy_rule", "speculative_rule_u"])
def test_correct_rules_pass_on_edge_rows(name):
    p, q = edge_rows()
    chex.clear_trace_counter()  # a first audit traces COUNTED_SPECULATIVE twice, a later one not
    if name.endswith("_u"):  # the uniform form through from_uniform
        verify, drafting = from_uniform(speculative_rule_u), "sample"
    elif name == "speculative_rule":
        assert CORRECT_RULES[name].verify is speculative_rule
        verify, drafting = COUNTED_SPECULATIVE, CORRECT_RULES[name].drafting
    else:
        verify, drafting = CORRECT_RULES[name].verify, CORRECT_RULES[name].drafting
    report = audit(jax.random.key(1), verify, p, q, num_samples=N_CORRECT, drafting=drafting,
                   alpha=AUDIT_ALPHA)
    assert_unbiased_and_optimal(report, name)
    greedy = np.eye(4)[np.argmax(p, -1)]
    draft_law = greedy if drafting == "greedy" else p
    np.testing.assert_allclose(report.optimal_acceptance, sd_acceptance(draft_law, q), atol=1e-6)


def test_drafting_function_estimates_the_draft_law():
    """A drafting function: the draft law is the drafts' empirical law, the rule still passes."""
    p, q = edge_rows()
    report = audit(jax.random.key(2), speculative_rule, p, q, num_samples=N_CORRECT,
                   drafting=draw_categorical, alpha=AUDIT_ALPHA)
    # The report's optimum is estimated from the drafts (biased low where p = q, by about
    # sqrt(p / N) per token); the rule attains the true one, sum min(p, q).
    assert_unbiased_and_optimal(report, "speculative_rule with a drafting function",
                                optimum=sd_acceptance(p, q))
    # |sum min(p_hat, q) - sum min(p, q)| <= sum_x |p_hat(x) - p(x)|, and each term is within 4.5
    # binomial standard errors except with probability 6.8e-6 (28 terms: below 2e-4 in all).
    tolerance = 4.5 * np.sqrt(p * (1 - p) / N_CORRECT).sum(-1)
    assert (np.abs(report.optimal_acceptance - sd_acceptance(p, q)) <= tolerance + 1e-6).all()
    assert report.drafting == "draw_categorical"


def test_no_recompilation_for_new_values():
    """New p, q and key reuse the compiled audit: the rule (a static argument) is traced twice
    by the first audit (its shape check and the simulation) and never again."""
    chex.clear_trace_counter()
    rule = COUNTED_SPECULATIVE
    p, q = edge_rows()
    audit(jax.random.key(1), rule, p, q, num_samples=N_CORRECT, alpha=AUDIT_ALPHA)
    p2, q2 = random_batch(3, *p.shape)
    audit(jax.random.key(5), rule, p2, q2, num_samples=N_CORRECT, alpha=AUDIT_ALPHA)


# ---------------------------------------------------------------------------------------------
# Broken rules are flagged, and Monte Carlo agrees with the exact law.

MISMATCH = ([0.7, 0.1, 0.1, 0.1], [0.1, 0.3, 0.3, 0.3])  # TV(p, q) = 0.6
DISJOINT = ([0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.5, 0.5])
GREEDY_MISMATCH = ([0.4, 0.3, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25])
EXHAUSTED = ([0.25, 0.25, 0.25, 0.25], [0.5, 0.5, 0.0, 0.0])

BROKEN_CASES = {
    # rule: rows on which it is biased by TV >= 0.25, and its output law in closed form.
    "accept_all": ([MISMATCH, DISJOINT], lambda p, q: p),
    "wrong_residual": ([MISMATCH, DISJOINT], lambda p, q: p),
    "greedy_scored_with_softmax": ([GREEDY_MISMATCH, EXHAUSTED], None),
}


def greedy_scored_law(p, q):
    """``b onehot(x) + (1 - b) [q - p]_+ / sum [q - p]_+``, ``x = argmax p``,
    ``b = min(1, q(x) / p(x))``."""
    x = int(np.argmax(p))
    b = min(1.0, q[x] / p[x])
    residual = np.maximum(q - p, 0)
    law = (1 - b) * residual / residual.sum() if residual.sum() > 0 else np.zeros_like(q)
    law[x] += b
    return law


@pytest.fixture(scope="module")
def broken_reports():
    out = {}
    for name, (rows, _) in BROKEN_CASES.items():
        rule = BROKEN_RULES[name]
        p = np.array([r[0] for r in rows], np.float32)
        q = np.array([r[1] for r in rows], np.float32)
        mc = audit(jax.random.key(7), rule.verify, p, q, num_samples=N_BROKEN,
                   drafting=rule.drafting, alpha=AUDIT_ALPHA)
        ex = audit_exact(rule.verify_u, p, q, drafting=rule.drafting)
        out[name] = (p, q, mc, ex)
    return out


@pytest.mark.parametrize("name", list(BROKEN_CASES))
def test_broken_rules_are_flagged(broken_reports, name):
    p, q, mc, ex = broken_reports[name]
    assert mc.biased.all() and ex.biased.all(), f"{name}:\n{mc}\n{ex}"
    assert (ex.tv_bias >= 0.25).all()
    if name != "wrong_residual":  # it accepts exactly as SD does; the others accept too often
        assert mc.accepts_more_than_possible.all() and ex.accepts_more_than_possible.all()
    assert "BIASED" in str(mc) and "BIASED" in str(ex)


@pytest.mark.parametrize("name", list(BROKEN_CASES))
def test_exact_law_of_broken_rules_is_the_closed_form(broken_reports, name):
    p, q, _, ex = broken_reports[name]
    closed = BROKEN_CASES[name][1] or greedy_scored_law
    for b in range(len(p)):
        law = closed(p[b].astype(np.float64), q[b].astype(np.float64))
        np.testing.assert_allclose(ex.output_law[b], law, atol=1e-6)


@pytest.mark.parametrize("name", list(BROKEN_CASES))
def test_monte_carlo_agrees_with_exact_on_broken_rules(broken_reports, name):
    """Counts against the exact law (chi-square, ALPHA), acceptance within Z standard errors,
    and the plug-in TV within its deviation bound ``TV(empirical, law) <= (1/2) sum
    sqrt(r (1 - r) / N) + sqrt(log(1 / alpha) / (2 N))`` (McDiarmid; fails with prob. <= alpha)."""
    _, _, mc, ex = broken_reports[name]
    n = mc.num_samples
    for b in range(len(mc.biased)):
        law = ex.output_law[b]
        counts = {t: int(round(c * n)) for t, c in enumerate(mc.output_law[b])}
        pvalue = chi_square_pvalue(counts, dict(enumerate(law)), n)
        assert pvalue > ALPHA, f"{name}, row {b}: p = {pvalue}"
        assert all(counts[t] == 0 for t in range(len(law)) if law[t] == 0)
        a = ex.acceptance_rate[b]
        assert abs(mc.acceptance_rate[b] - a) <= Z * math.sqrt(a * (1 - a) / n) + 1e-6
        bound = 0.5 * np.sqrt(law * (1 - law) / n).sum() + math.sqrt(math.log(1 / ALPHA) / (2 * n))
        assert abs(mc.tv_bias[b] - ex.tv_bias[b]) <= bound


# ---------------------------------------------------------------------------------------------
# Exact mode.


def test_exact_sd_law_is_the_target_float32():
    p, q = edge_rows()
    p2, q2 = random_batch(11, 5, 4)
    p, q = np.concatenate([p, p2]), np.concatenate([q, q2])
    report = audit_exact(speculative_rule_u, p, q)
    np.testing.assert_allclose(report.output_law, report.target, atol=1e-6)
    np.testing.assert_allclose(report.acceptance_rate, sd_acceptance(p, q), atol=1e-6)
    assert not report.biased.any() and not report.isolated_tokens.any()
    assert not report.unresolved.any() and np.isnan(report.chi2_pvalue).all()
    greedy = audit_exact(greedy_rule_u, p, q, drafting="greedy")
    np.testing.assert_allclose(greedy.output_law, greedy.target, atol=1e-6)
    np.testing.assert_allclose(greedy.acceptance_rate, q[np.arange(len(q)), np.argmax(p, -1)],
                               atol=1e-6)
    assert not greedy.biased.any()


def test_exact_sd_law_is_the_target_float64(x64):
    p, q = random_batch(12, 4, 6, dtype=np.float64)
    report = audit_exact(speculative_rule_u, p, q)
    np.testing.assert_allclose(report.output_law, report.target, atol=1e-12)
    np.testing.assert_allclose(report.acceptance_rate, sd_acceptance(p, q), atol=1e-12)
    np.testing.assert_allclose(report.optimal_acceptance, sd_acceptance(p, q), atol=1e-12)
    assert not report.biased.any()


def test_exact_catches_the_zero_uniform_bug_that_monte_carlo_cannot():
    p, q = edge_rows()
    report = audit_exact(accepts_at_zero_uniform_u, p, q)
    reachable = (p > 0) & (q == 0)  # drafts the target never produces
    np.testing.assert_array_equal(report.isolated_tokens, reachable)
    np.testing.assert_array_equal(report.biased, reachable.any(-1))
    # The law itself is exact and unbiased: u = 0.0 has measure zero; only the point check sees it.
    np.testing.assert_allclose(report.output_law, report.target, atol=1e-6)
    assert "q = 0" in str(report)
    # Monte Carlo emits the bad token only when u = 0.0 exactly, probability 2^-23 per draft in
    # float32 (the default 200,000 drafts see it with probability 2.4%; a dependable detection
    # would need about 10^8), which is why the exact mode exists.


# ---------------------------------------------------------------------------------------------
# Determinism, shapes, helpers.


def test_deterministic_and_a_single_row_equals_row_zero_of_a_batch(broken_reports):
    p, q, first, _ = broken_reports["accept_all"]
    again = audit(jax.random.key(7), accept_all, p, q, num_samples=N_BROKEN, alpha=AUDIT_ALPHA)
    for name, value in first._asdict().items():
        np.testing.assert_array_equal(value, again._asdict()[name])
    single = audit(jax.random.key(7), accept_all, p[0], q[0], num_samples=N_BROKEN,
                   alpha=AUDIT_ALPHA)
    assert single.output_law.shape == (4,) and single.biased.shape == ()
    np.testing.assert_array_equal(single.output_law, first.output_law[0])
    assert float(single.acceptance_rate) == float(first.acceptance_rate[0])


def test_chi2_survival_function_matches_scipy():
    """JAX's gammaincc in float64 (the audit's p-values), with x64 off in the caller, scalars
    and arrays, from the bulk to tails far below float32's range."""
    cases = [(0.5, 1), (3.0, 2), (40.0, 3), (10.0, 30), (200.0, 100), (1e3, 7), (0.0, 3),
             (1e-8, 1), (30.0, 40), (1.2e3, 200)]
    assert not jax.config.jax_enable_x64
    for stat, df in cases:
        value = chi2_sf(stat, df)
        assert isinstance(value, float)
        assert math.isclose(value, sps.chi2.sf(stat, df), rel_tol=1e-9, abs_tol=1e-300)
    stats, dfs = np.array(cases, np.float64).T
    values = chi2_sf(stats, dfs)
    assert values.dtype == np.float64 and values.shape == (len(cases),)
    np.testing.assert_allclose(values, sps.chi2.sf(stats, dfs), rtol=1e-9, atol=1e-300)
    assert not jax.config.jax_enable_x64  # the float64 evaluation did not leak


def bad_verify_shape(key, p, q, x):
    return jnp.ones(2, bool), x


@pytest.mark.parametrize("kwargs,match", [
    (dict(p=np.ones((2, 2, 2), np.float32) / 2), "p must be"),
    (dict(q=np.full(5, 0.2, np.float32)), "same number of tokens"),
    (dict(p=np.full((2, 4), 0.25, np.float32), q=np.full((3, 4), 0.25, np.float32)),
     "same shape"),
    (dict(p=np.array([-0.1, 0.5, 0.3, 0.3], np.float32)), "negative"),
    (dict(q=np.array([np.nan, 0.5, 0.3, 0.2], np.float32)), "NaN"),
    (dict(q=np.array([0.5, 0.5, 0.3, 0.2], np.float32)), "sum to one"),
    (dict(p=np.array([1, 0, 0, 0])), "floating"),
    (dict(num_samples=0), "num_samples"),
    (dict(num_samples=2.5), "num_samples"),
    (dict(num_samples=True), "num_samples"),
    (dict(drafting="beam"), "drafting"),
    (dict(alpha=0.0), "alpha"),
    (dict(alpha=1.5), "alpha"),
    (dict(key=0), "key"),
    (dict(verify="speculative"), "verify"),
    (dict(verify=bad_verify_shape), "verify"),
])
def test_audit_validation(kwargs, match):
    args = dict(key=jax.random.key(0), verify=speculative_rule,
                p=np.full(4, 0.25, np.float32), q=np.full(4, 0.25, np.float32))
    args.update({k: v for k, v in kwargs.items() if k in args})
    options = {k: v for k, v in kwargs.items() if k not in args}
    with pytest.raises(ValueError, match=match):
        audit(args["key"], args["verify"], args["p"], args["q"], **options)


@pytest.mark.parametrize("kwargs,match", [
    (dict(drafting=draw_categorical), "drafting"),
    (dict(drafting="beam"), "drafting"),
    (dict(grid=1), "grid"),
    (dict(tol=-1.0), "tol"),
])
def test_audit_exact_validation(kwargs, match):
    uniform = np.full(4, 0.25, np.float32)
    with pytest.raises(ValueError, match=match):
        audit_exact(speculative_rule_u, uniform, uniform, **kwargs)


def test_rule_registry_is_consistent():
    assert greedy_rule is CORRECT_RULES["greedy_rule"].verify
    assert greedy_rule_u is CORRECT_RULES["greedy_rule"].verify_u
    assert from_uniform(accepts_at_zero_uniform_u) is accepts_at_zero_uniform
    assert set(BROKEN_RULES) >= {"accept_all", "wrong_residual", "greedy_scored_with_softmax"}


# ---------------------------------------------------------------------------------------------
# The script, at toy size.


@pytest.mark.slow  # a script end to end, as tests/test_scripts.py
def test_audit_rules_script_tiny():
    script = import_script("audit_rules")
    rows = script.main(["--num-samples", "2000", "--vocab", "4", "--grid", "256",
                        "--rules", "wrong_residual"])
    assert len(rows) == 3
    verdicts = {(r["rule"], r["row"]): (r["biased"], r["exact_biased"]) for r in rows}
    # wrong_residual emits p: biased by TV(p, q) (0.2 or more here, 1 when disjoint), not at p = q.
    assert verdicts["wrong_residual", "disjoint"] == (True, True)
    assert verdicts["wrong_residual", "p = q"] == (False, False)
    assert verdicts["wrong_residual", "peaked"][1]
