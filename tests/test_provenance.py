"""``check_provenance``: were the drafts drawn from the declared law?

Correct drafts pass at the stated false-alarm rate (over repetitions, against a binomial bound);
the two shipped bug classes are flagged: drafts sampled from a top-k-processed law while the
whole law is declared (transformers #47932) and drafts sampled with temperature and softmax in
bfloat16 while the float32 law is declared (DeepSpec #31), at a sample size derived from the
noncentral chi-square (power ``1 - 1e-5``); the statistics equal Pearson's where every row is
the same law; impossible drafts, ragged batches and bad inputs. Sampling is NumPy's inverse CDF
(no compilation)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import optimize
from scipy import stats as sp

import specjax
from specjax.auditing import check_provenance

V, K = 8, 2  # one small problem for the module


def softmax(logits):
    z = np.exp(logits - logits.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def draw(rng, rows):
    """One draw per row of ``rows`` ``(..., V)`` by the inverse CDF."""
    u = rng.random(rows.shape[:-1])
    return np.minimum((np.cumsum(rows, -1) <= u[..., None]).sum(-1), rows.shape[-1] - 1)


def top_k(rows, k):
    keep = rows >= np.sort(rows, -1)[..., -k:-k + 1]
    return np.where(keep, rows, 0) / np.where(keep, rows, 0).sum(-1, keepdims=True)


def test_correct_drafts_pass_at_the_stated_false_alarm_rate():
    """60 repetitions of 400 requests (every row a different law, ragged ``num_drafts``) at
    ``alpha = 0.05``: the number flagged is at most the binomial(60, 0.05) quantile of
    ``1 - 1e-5``; every p-value lies in ``[0, 1]``."""
    rng = np.random.default_rng(0)
    repetitions, requests, alpha = 60, 400, 0.05
    flagged = 0
    for _ in range(repetitions):
        rows = softmax(2.0 * rng.standard_normal((requests, K, V)))
        counts = rng.integers(0, K + 1, requests)
        check = check_provenance(draw(rng, rows), rows.astype(np.float32), num_drafts=counts,
                                 alpha=alpha)
        assert check.impossible == 0 and check.num_tests == 2 * (K + 1)
        assert np.all((check.pvalues >= 0) & (check.pvalues <= 1))
        np.testing.assert_array_equal(check.num_rows, [(counts > j).sum() for j in range(K)])
        flagged += check.flagged
    assert flagged <= sp.binom.ppf(1 - 1e-5, repetitions, alpha), flagged


def test_top_k_drafts_declared_whole_are_flagged():
    """transformers #47932: drafts from the top-4 of 8 tokens, the whole rows declared (TV from
    the declared law 0.07 per row on average here), 2,000 requests; the probability binning flags
    them (the noncentrality grows with the requests: about 50 at 400 requests, p about 1e-9
    pooled)."""
    rng = np.random.default_rng(1)
    rows = softmax(2.0 * rng.standard_normal((2000, K, V)))
    tv = 0.5 * np.abs(top_k(rows, 4) - rows).sum(-1)
    assert 0.02 < tv.mean() < 0.3
    check = check_provenance(draw(rng, top_k(rows, 4)), rows)
    assert check.flagged and check.impossible == 0
    assert np.all(check.pvalues[check.bins.index("probability")] < 1e-10)
    assert not check_provenance(draw(rng, rows), rows).flagged  # alpha = 1e-3: a false alarm
    # of probability at most about 1e-3


def bf16_rows():
    """A row of offset logits (bfloat16, as a model emits them), declared as the float32
    softmax at temperature 0.7, and the law DeepSpec's path samples: temperature and softmax in
    bfloat16."""
    logits = (20.0 + 4.0 * jax.random.normal(jax.random.key(0), (16,))).astype(jnp.bfloat16)
    declared = np.asarray(jax.nn.softmax(logits.astype(jnp.float32) / 0.7), np.float64)
    sampled = np.asarray(jax.nn.softmax(logits / jnp.bfloat16(0.7)).astype(jnp.float32),
                         np.float64)
    return declared / declared.sum(), sampled / sampled.sum()


def test_bfloat16_drafts_are_flagged_where_a_context_recurs():
    """DeepSpec #31 on one recurring context (V = 16, K = 1): the token binning's statistic is
    noncentral chi-square of noncentrality ``N chi2(sampled || declared)``; ``N`` is the least
    giving power ``1 - 1e-5`` at the level ``alpha / num_tests``. The same number of correct
    drafts pass."""
    declared, sampled = bf16_rows()
    tv = 0.5 * np.abs(sampled - declared).sum()
    divergence = ((sampled - declared) ** 2 / declared).sum()
    assert 0.01 < tv < 0.1
    critical = sp.chi2.isf(1e-3 / 4, 15)
    noncentrality = optimize.brentq(lambda lam: sp.ncx2.sf(critical, 15, lam) - (1 - 1e-5),
                                    1.0, 1e4)
    num = int(np.ceil(noncentrality / divergence))
    assert num < 50_000
    rng = np.random.default_rng(2)
    rows = np.broadcast_to(declared.astype(np.float32), (num, 1, 16))
    check = check_provenance(draw(rng, np.broadcast_to(sampled, (num, 1, 16))), rows)
    assert check.flagged and check.pvalues[check.bins.index("token"), 0] < 1e-3 / 4
    assert not check_provenance(draw(rng, np.broadcast_to(declared, (num, 1, 16))), rows).flagged


def test_statistics_equal_pearsons_test_when_every_row_is_the_same_law():
    rng = np.random.default_rng(3)
    row = softmax(rng.standard_normal(V))
    rows = np.broadcast_to(row, (2000, 1, V))
    drafts = draw(rng, rows)
    check = check_provenance(drafts, rows, num_bins=4)
    counts = np.bincount(drafts[:, 0], minlength=V)
    pearson = sp.chisquare(counts, 2000 * row)
    token = check.bins.index("token")
    np.testing.assert_allclose(check.statistics[token, 0], pearson.statistic, rtol=1e-9)
    np.testing.assert_allclose(check.pvalues[token, 0], pearson.pvalue, rtol=1e-6)
    assert check.dof[token, 0] == V - 1
    level = np.clip(np.floor(-np.log2(row)), 0, 3).astype(int)
    law = np.bincount(level, weights=row, minlength=4)
    observed = np.bincount(level[drafts[:, 0]], minlength=4)
    present = law > 0
    binned = sp.chisquare(observed[present], 2000 * law[present])
    probability = check.bins.index("probability")
    np.testing.assert_allclose(check.statistics[probability, 0], binned.statistic, rtol=1e-9)
    np.testing.assert_allclose(check.statistics[:, 0], check.statistics[:, 1])  # K = 1: pooled


def test_a_draft_of_declared_probability_zero_is_proof_and_padding_is_never_read():
    rng = np.random.default_rng(4)
    rows = softmax(rng.standard_normal((50, K, V)))
    rows[3, 0] = np.eye(V)[1]
    drafts = draw(rng, rows)
    drafts[3, 0] = 2  # declared probability 0
    counts = np.full(50, K)
    counts[7] = 0
    rows[7] = np.nan  # padding: never read
    drafts[7] = -5
    check = check_provenance(drafts, rows, num_drafts=counts, alpha=1e-6)
    assert check.flagged and check.impossible == 1
    assert check.impossible_examples == [(3, 0, 2)]
    assert "FLAGGED" in str(check) and np.all(np.isfinite(check.statistics))
    one = check_provenance(drafts[0], rows[0])  # one request: (K,) and (K, V)
    assert one.num_rows.tolist() == [1] * K


@pytest.mark.parametrize("change, match", [
    (dict(draft_tokens=np.zeros((4, K))), "integer"),
    (dict(draft_tokens=np.zeros((1, 4, K), int)), "shape"),
    (dict(draft_probs=None), "draft_probs"),
    (dict(draft_probs=np.full((4, K, V), 0.5)), "draft_probs"),
    (dict(draft_probs=np.full((4, K + 1, V), 1 / V)), "draft_probs"),
    (dict(draft_tokens=np.full((4, K), V)), r"\[0, V\)"),
    (dict(num_drafts=np.full(4, K + 1)), "num_drafts"),
    (dict(num_drafts=np.full(3, K)), "num_drafts"),
    (dict(alpha=1.0), "alpha"),
    (dict(bins="rank"), "bins"),
    (dict(bins=()), "bins"),
    (dict(num_bins=1), "num_bins"),
    (dict(min_variance=0.0), "min_variance"),
])
def test_bad_inputs_raise_naming_the_argument(change, match):
    args = dict(draft_tokens=np.zeros((4, K), int), draft_probs=np.full((4, K, V), 1 / V))
    args.update(change)
    with pytest.raises(ValueError, match=match):
        check_provenance(args.pop("draft_tokens"), args.pop("draft_probs"), **args)


def test_it_is_served_from_the_auditing_subpackage():
    assert specjax.auditing.check_provenance is check_provenance
    assert "check_provenance" in specjax.auditing.__all__
    assert "check_provenance" not in specjax.__all__
