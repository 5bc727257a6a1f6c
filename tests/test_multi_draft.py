"""Deterministic (greedy) drafts and batch SD with drafts drawn without replacement.

Both are ordinary rules of the shared law table, so the samplers and the exact theory get them
together; here they are checked against literal transcriptions (``tests/reference.py``) enumerated
exactly, against closed forms, and by Monte Carlo.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import reference as ref
import specjax
import stats
from conftest import chain
from conftest import edge_pair
from conftest import random_pair
from specjax.decoders import verification as _verify
from test_literal_equivalence import assert_laws_equal
from test_literal_equivalence import kernel_law
from test_literal_equivalence import outcome_counts

TIGHT = 1e-10


# ----------------------------------------------------------------------------- greedy drafts
def test_greedy_draft_is_one_hot_argmax_with_lowest_index_ties():
    trans = jnp.asarray([[[0.2, 0.5, 0.3], [0.4, 0.4, 0.2], [0.0, 0.0, 1.0]]])
    model = specjax.MarkovChain(jnp.full(3, 1 / 3), trans)
    greedy = specjax.models.greedy_draft(model)
    np.testing.assert_array_equal(greedy.trans[0], np.eye(3)[[1, 0, 2]])
    np.testing.assert_array_equal(greedy.init, model.init)
    with pytest.raises(ValueError, match="model must be a specjax.MarkovChain"):
        specjax.models.greedy_draft(trans)


def test_verifying_a_one_hot_draft_accepts_with_q_and_resamples_q_without_x(x64):
    """SD's rule on a one-hot draft at ``x``: accepted mass ``q(x) 1_x``, rejected mass
    ``q`` with ``x`` removed (its total is ``1 - q(x)``): unbiased, no division by zero."""
    rng = np.random.default_rng(0)
    q = rng.dirichlet(np.ones(5), size=4)
    q[0] = [0, 0.5, 0.5, 0, 0]  # the greedy token has q = 0: always rejected
    x = np.array([0, 1, 2, 3])
    p = np.eye(5)[x]
    law = jax.jit(_verify.speculative_law)(jnp.asarray(p), jnp.asarray(q))  # one program
    np.testing.assert_allclose(law.accepted, q * p, atol=1e-15)
    np.testing.assert_allclose(law.rejected, q * (1 - p), atol=1e-15)


def test_greedy_rejections_closed_form(x64):
    """``E[N_rej] = sum_n E_{x_{n-1} ~ q}[1 - q_n(g_n(x_{n-1}))]``, and the enumerated literal
    SD with the greedy draft agrees, for ``K = T`` and lookahead 2."""
    draft, target = random_pair(7, 3, 3, zero_fraction=0.3)
    greedy = specjax.models.greedy_draft(chain(draft))
    g = np.asarray(greedy.trans)
    q = target[1]
    marg = ref.forward_marginals(*target)
    closed = sum(marg[n] @ (1 - (g[n] * q[n]).sum(-1)) for n in range(3))
    exact = specjax.exact(specjax.Speculative(), greedy, chain(target))
    assert abs(float(exact.expected_rejections) - closed) < TIGHT
    greedy_pair = (draft[0], g)
    for lookahead in (None, 2):
        law = ref.enumerate_law(lambda ch: ref.sd_literal(ch, greedy_pair, target, lookahead))
        assert_laws_equal(ref.marginalise_tokens(law), ref.target_sequence_law(target))
        rej, calls = ref.expected_counts_from_law(law)
        exact = specjax.exact(specjax.Speculative(lookahead), greedy, chain(target))
        assert abs(float(exact.expected_rejections) - rej) < TIGHT
        assert abs(float(exact.expected_calls) - calls) < TIGHT


@pytest.mark.slow  # a Monte Carlo run of 100,000 chains or more
def test_greedy_sampler_fits_the_literal_law():
    """Monte Carlo of ``speculative_decoding`` with a greedy draft (lookahead 2) against the exact
    law of (tokens, rejected, calls) of the literal algorithm (chi-square, alpha = 1e-5)."""
    draft, target = random_pair(8, 3, 3, zero_fraction=0.3)
    greedy = specjax.models.greedy_draft(chain(draft))
    greedy_pair = (draft[0], np.asarray(greedy.trans, np.float64))
    law = ref.enumerate_law(lambda ch: ref.sd_literal(ch, greedy_pair, target, 2))
    n = 100_000
    trace = specjax.speculative_decoding(jax.random.key(31), greedy, chain(target), n,
                                         lookahead=2)
    stats.assert_law(outcome_counts(trace), law, n, "greedy draft, K = 2")


# ----------------------------------------------------------------------------- without replacement
def root_law_reference(p, q, num_drafts):
    """The root law of drafts without replacement by brute-force recursion over the draws."""
    accepted = np.zeros_like(q)
    rejected = np.zeros_like(q)

    def visit(weight, d, r, stage):
        if d.sum() <= 0 or stage == num_drafts:
            rejected[:] += weight * r
            return
        for x in np.nonzero(d > 0)[0]:
            b = min(1.0, r[x] / d[x])
            accepted[x] += weight * d[x] * b
            if b < 1:
                d_next = d.copy()
                d_next[x] = 0.0
                visit(weight * d[x] * (1 - b), ref.positive_part(d_next),
                      ref.positive_part(r - d), stage + 1)

    visit(1.0, p, q, 0)
    return accepted, rejected


def wor_rows():
    """Random rows with zeros, plus every edge row of ``edge_pair`` (V = 4)."""
    rng = np.random.default_rng(3)
    p = np.concatenate([ref_rows(rng), edge_pair()[0][1][:2].reshape(-1, 4)])
    q = np.concatenate([ref_rows(rng), edge_pair()[1][1][:2].reshape(-1, 4)])
    return p, q


def ref_rows(rng):
    from conftest import random_rows
    return random_rows(rng, (6, 4), zero_fraction=0.3, concentration=0.7)


WOR_DRAFTS = (1, 2, 3, 4, 7, math.inf)


@jax.jit
def _wor_laws(p, q):
    """``{M: batch_without_replacement_root_law(p, q, M)}`` for every ``M`` of ``WOR_DRAFTS``
    and SD's law: one program (eagerly, each law compiles dozens)."""
    laws = {m: specjax.decoders.multi_draft.batch_without_replacement_root_law(p, q, m)
            for m in WOR_DRAFTS}
    return laws, _verify.speculative_law(p, q)


@functools.lru_cache(maxsize=None)
def wor_laws():
    """``_wor_laws`` of ``wor_rows`` in float64 (NumPy), shared by the tests below."""
    p, q = wor_rows()
    with jax.enable_x64(True):
        return jax.tree_util.tree_map(np.asarray, _wor_laws(jnp.asarray(p), jnp.asarray(q)))


@pytest.mark.parametrize("num_drafts", WOR_DRAFTS)
def test_without_replacement_root_law_equals_brute_force_and_is_unbiased(x64, num_drafts):
    p, q = wor_rows()
    law = wor_laws()[0][num_drafts]
    stages = min(4, num_drafts)
    for row in range(p.shape[0]):
        acc, rej = root_law_reference(p[row], q[row], stages)
        np.testing.assert_allclose(law.accepted[row], acc, atol=1e-12)
        np.testing.assert_allclose(law.rejected[row], rej, atol=1e-12)
    np.testing.assert_allclose(law.accepted + law.rejected, q, atol=1e-12)  # unbiased
    assert (np.asarray(law.rejected) >= 0).all() and (np.asarray(law.accepted) >= 0).all()


def test_without_replacement_one_draft_is_sd_and_all_tokens_never_reject(x64):
    p, q = wor_rows()
    laws, sd = wor_laws()
    one = laws[1]
    np.testing.assert_allclose(one.accepted, sd.accepted, atol=1e-15)
    np.testing.assert_allclose(one.rejected, sd.rejected, atol=1e-15)
    # M = V: every token the draft can propose is eventually proposed, so a rejection only
    # happens for target mass where p = 0.
    every = laws[4]
    np.testing.assert_allclose(every.rejected, np.where(p > 0, 0.0, q), atol=1e-12)


@pytest.mark.parametrize("num_drafts,horizon", [(2, 3), (3, 2)])
def test_without_replacement_equals_enumerated_literal_algorithm(x64, num_drafts, horizon):
    """The literal algorithm (whole drafts, first tokens without replacement) enumerated exactly:
    unbiased, and its joint law of (tokens, rejected, calls) is the one specjax samples from and
    sums exactly (rejections, calls, Theorem 3's ``f``)."""
    draft, target = random_pair(11, 3, horizon, zero_fraction=0.2)
    law = ref.enumerate_law(
        lambda ch: ref.batch_literal(ch, draft, target, num_drafts, replacement=False))
    assert_laws_equal(ref.marginalise_tokens(law), ref.target_sequence_law(target))
    p, q = jnp.asarray(draft[1]), jnp.asarray(target[1])
    root, verify = jax.jit(specjax.BatchSpeculative(num_drafts, replacement=False).laws)(p, q)
    assert_laws_equal(kernel_law(target[0], root, verify, _verify.bonus_law(q), horizon), law)
    rej, calls = ref.expected_counts_from_law(law)
    exact = specjax.exact(specjax.BatchSpeculative(num_drafts, replacement=False), chain(draft),
                          chain(target))
    assert abs(float(exact.expected_rejections) - rej) < TIGHT
    assert abs(float(exact.expected_calls) - calls) < TIGHT
    np.testing.assert_allclose(np.asarray(exact.rejected), ref.rejected_measure(law, 3, horizon),
                               atol=TIGHT)


@pytest.mark.slow  # a Monte Carlo run of 100,000 chains or more
def test_without_replacement_sampler_fits_the_literal_law():
    draft, target = random_pair(4, 3, 2, zero_fraction=0.3)
    law = ref.enumerate_law(lambda ch: ref.batch_literal(ch, draft, target, 2, replacement=False))
    n = 200_000
    trace = specjax.batch_speculative_decoding(jax.random.key(2025), chain(draft), chain(target),
                                               n, num_drafts=2, replacement=False)
    stats.assert_law(outcome_counts(trace), law, n, "batch M = 2 without replacement")


@pytest.mark.parametrize("lookahead", [None, 3])
def test_without_replacement_sampler_means_match_exact(lookahead):
    draft, target = specjax.paper_instance(horizon=20)
    trace = specjax.batch_speculative_decoding(jax.random.key(9), draft, target, 50_000,
                                               num_drafts=3, lookahead=lookahead,
                                               replacement=False)
    exact = specjax.exact(specjax.BatchSpeculative(3, replacement=False, lookahead=lookahead),
                          draft, target)
    stats.assert_mean(trace.num_rejections, float(exact.expected_rejections), "rejections")
    stats.assert_mean(trace.num_calls, float(exact.expected_calls), "calls")


def test_without_replacement_gradients_are_finite_at_edge_cases():
    draft, target = edge_pair()

    def total(logits, q):
        d = specjax.MarkovChain.from_logits(jnp.zeros(4), logits)
        t = specjax.MarkovChain(jnp.asarray(target[0], jnp.float32), q)
        return specjax.batch_expected_rejections(d, t, num_drafts=3, replacement=False)

    logits = jnp.log(jnp.asarray(draft[1], jnp.float32))
    value, grads = jax.jit(jax.value_and_grad(total, argnums=(0, 1)))(  # one program
        logits, jnp.asarray(target[1], jnp.float32))
    assert np.isfinite(value)
    assert all(np.isfinite(g).all() for g in grads)


def test_without_replacement_validation():
    draft, target = specjax.paper_instance(horizon=20)  # the instance of the test above
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="replacement must be True or False"):
        specjax.batch_speculative_decoding(key, draft, target, 10, num_drafts=2,
                                           replacement="no")
    with pytest.raises(ValueError, match="num_drafts"):
        specjax.exact(specjax.BatchSpeculative(0, replacement=False), draft, target)
    big = specjax.MarkovChain(jnp.full(64, 1 / 64), jnp.full((2, 64, 64), 1 / 64))
    with pytest.raises(ValueError, match="num_drafts = 4 without replacement enumerates"):
        specjax.batch_expected_rejections(big, big, num_drafts=4, replacement=False)
    with pytest.raises(ValueError, match="num_drafts = 4 without replacement enumerates"):
        specjax.batch_speculative_decoding(key, big, big, 10, num_drafts=4, replacement=False)
    ngram = specjax.NGramModel(jnp.full((8, 8), 1 / 8), order=2)  # every chain counts as a row
    with pytest.raises(ValueError, match="8\\^5 x 4,000"):
        specjax.batch_speculative_decoding(key, ngram, ngram, 4000, num_drafts=5,
                                           replacement=False, horizon=3)
