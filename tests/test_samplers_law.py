"""Output laws and mean counts of every sampler on the paper's shape (V = 7, T = 50) with zeros.

The instance has rows with exact zeros in different places for draft and target, one row with
disjoint supports and one with p = q. Laws are checked on the pair (x_{n-1}, x_n) at several
positions (chi-square against the exact target, or biased, transition), zero-probability
transitions must never appear anywhere, and mean rejections and calls must match an exact
forward recursion within 4.5 standard errors.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
import reference as ref
import stats
from conftest import random_pair

V, T, C = 7, 50, 100_000

pytestmark = pytest.mark.slow  # Monte Carlo runs of 100,000 chains
POSITIONS = (1, 2, 25, 50)


@functools.lru_cache(maxsize=None)
def instance():
    return random_pair(11, V, T, zero_fraction=0.3)


def chains():
    draft, target = instance()
    to = lambda pair: specjax.MarkovChain(jnp.asarray(pair[0], jnp.float32),  # noqa: E731
                                          jnp.asarray(pair[1], jnp.float32))
    return to(draft), to(target)


def biased_transition(draft, target, eps, residual):
    p, q = draft[1], target[1]
    b = ref.biased_accept(p, q, eps)
    if residual == "optimal":
        res = np.maximum(q - b * p, 0.0)
    elif residual == "target":
        res = q.copy()
    else:
        res = np.maximum(q - p, 0.0)
    s = res.sum(-1, keepdims=True)
    res = np.where(s > 0, res / np.where(s > 0, s, 1.0), 0.0)
    reject = 1.0 - (b * p).sum(-1, keepdims=True)
    return b * p + reject * res, reject[..., 0]


def check_pair_laws(tokens, init, trans, what):
    """Chi-square of (x_{n-1}, x_n) at POSITIONS; no zero-probability transition anywhere."""
    tokens = np.asarray(tokens)
    assert (init[tokens[:, 0]] > 0).all(), f"{what}: prompt token of probability zero"
    n_idx = np.arange(1, tokens.shape[1])
    probs = trans[n_idx - 1, tokens[:, :-1], tokens[:, 1:]]
    assert (probs > 0).all(), f"{what}: a transition of probability zero was produced"
    marg = ref.forward_marginals(init, trans)
    alpha = stats.ALPHA / len(POSITIONS)
    for n in POSITIONS:
        law = {(a, b): marg[n - 1, a] * trans[n - 1, a, b]
               for a in range(V) for b in range(V) if marg[n - 1, a] * trans[n - 1, a, b] > 0}
        observed = stats.count_rows(tokens[:, n - 1: n + 1])
        stats.assert_law(observed, law, tokens.shape[0], f"{what}, position {n}", alpha=alpha)


UNBIASED = [
    ("autoregressive", {}),
    ("sd", dict(lookahead=None)),
    ("sd", dict(lookahead=1)),
    ("sd", dict(lookahead=4)),
    ("batch", dict(num_drafts=2)),
    ("batch", dict(num_drafts=4)),
    ("batch", dict(num_drafts=3, lookahead=3)),
    ("rejection", {}),
]


def run(kind, key, kw):
    draft, target = chains()
    if kind == "autoregressive":
        return specjax.autoregressive_decoding(key, target, C)
    if kind == "sd":
        return specjax.speculative_decoding(key, draft, target, C, **kw)
    if kind == "batch":
        return specjax.batch_speculative_decoding(key, draft, target, C, **kw)
    if kind == "rejection":
        return specjax.rejection_decoding(key, draft, target, C, accept_prob=_sd_accept,
                                          residual=_sd_residual, **kw)
    return specjax.biased_speculative_decoding(key, draft, target, C, **kw)


def _sd_accept(p, q):
    return jnp.where(p > 0, jnp.minimum(1.0, q / jnp.where(p > 0, p, 1.0)), 1.0)


def _sd_residual(p, q, b):
    return jnp.maximum(q - p, 0.0)


@pytest.mark.parametrize("kind, kw", UNBIASED)
def test_output_law_is_target(kind, kw):
    draft, target = instance()
    trace = run(kind, jax.random.key(7), kw)
    check_pair_laws(trace.tokens, target[0], target[1], f"{kind} {kw}")


@pytest.mark.parametrize("residual", ["optimal", "target", "standard"])
def test_biased_output_law(residual):
    draft, target = instance()
    eps = 0.1
    trans, _ = biased_transition(draft, target, eps, residual)
    trace = run("biased", jax.random.key(8), dict(epsilon=eps, residual=residual))
    check_pair_laws(trace.tokens, target[0], trans, f"biased {residual}")


def exact_counts_for(kind, kw):
    draft, target = instance()
    if kind == "autoregressive":
        return 0.0, float(T)
    if kind in ("sd", "rejection"):
        return ref.exact_counts(draft, target, kind="sd", lookahead=kw.get("lookahead"))
    return ref.exact_counts(draft, target, kind="batch", num_drafts=kw["num_drafts"])


@pytest.mark.parametrize("kind, kw", [c for c in UNBIASED if "lookahead" not in c[1]
                                      or c[0] == "sd"])
def test_mean_rejections_and_calls_match_exact(kind, kw):
    rejections, calls = exact_counts_for(kind, kw)
    trace = run(kind, jax.random.key(9), kw)
    stats.assert_mean(trace.num_rejections, rejections, f"{kind} {kw} rejections")
    stats.assert_mean(trace.num_calls, calls, f"{kind} {kw} calls")


def test_sd_rejections_match_theorem_1():
    draft, target = instance()
    trace = run("sd", jax.random.key(10), {})
    stats.assert_mean(trace.num_rejections, ref.theorem1_rejections(draft, target), "Theorem 1")


def test_biased_rejections_match_exact():
    draft, target = instance()
    eps = 0.1
    trans, reject = biased_transition(draft, target, eps, "optimal")
    marg = ref.forward_marginals(target[0], trans)
    exact = float(sum(marg[n] @ reject[n] for n in range(T)))
    trace = run("biased", jax.random.key(11), dict(epsilon=eps))
    stats.assert_mean(trace.num_rejections, exact, "biased rejections")


def test_law_check_detects_a_perturbed_target():
    """The law check has power: a target that is off by the literal-reading bias is rejected."""
    draft, target = instance()
    trace = run("sd", jax.random.key(12), {})
    wrong = target[1].copy()
    wrong[0] = 0.9 * wrong[0] + 0.1 * np.eye(V)
    with pytest.raises(AssertionError):
        check_pair_laws(trace.tokens, target[0], wrong, "perturbed target")
