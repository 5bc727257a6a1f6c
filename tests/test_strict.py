"""Strict verification (vLLM's ``rejection_sample_method="strict"``), three ways: (1) a literal
transcription of the engine's rule (the target samples ``y`` at every drafted position, the draft
is kept iff it equals ``y``, else ``y`` is emitted) enumerated exactly, against the decoder's row
laws, its given-drafts law and ``exact``'s values; (2) the acceptance ``sum p q <= sum min(p, q)``
and the equality with ``ThresholdVerification()``; (3) Monte Carlo of ``decode`` against the
target's law (lossless) and the exact means."""

from __future__ import annotations

from collections import defaultdict

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
import stats
from conftest import chain
from conftest import edge_pair
from conftest import random_pair
from conftest import random_rows
from reference import enumerate_law
from reference import expected_counts_from_law
from reference import marginalise_tokens
from reference import target_sequence_law

STRICT = specjax.decoders.StrictVerification
NUM_STATES, HORIZON = 3, 3  # one small problem for every test of this module


def strict_literal(chooser, draft, target, lookahead=None):
    """vLLM's strict rejection sampling over a whole run: each call drafts up to ``K`` tokens
    from ``p``, the target samples one token per drafted position (and the bonus position);
    drafts are kept while they equal the target's samples, the first mismatch emits the
    target's sample and ends the call. Returns ``(tokens, rejected, calls)``."""
    (_, p_trans), (q_init, q_trans) = draft, target
    horizon = q_trans.shape[0]
    k = horizon if lookahead is None else lookahead
    x = [chooser.categorical(q_init)]
    rejected, calls, n = [], 0, 1
    while n <= horizon:
        calls += 1
        last = min(n + k - 1, horizon)
        drafts, prev = [], x[-1]
        for t in range(n, last + 1):
            drafts.append(chooser.categorical(p_trans[t - 1, prev]))
            prev = drafts[-1]
        all_kept = True
        for t, tok in zip(range(n, last + 1), drafts):
            sampled = chooser.categorical(q_trans[t - 1, x[-1]])  # target_sampled[t]
            x.append(sampled)
            rejected.append(sampled != tok)
            if sampled != tok:
                all_kept = False
                break
        if all_kept and last - n + 1 == k and last < horizon:
            x.append(chooser.categorical(q_trans[last, x[-1]]))  # the bonus position
            rejected.append(False)
        n = len(x)
    return tuple(x), tuple(rejected), calls


def literal_row_law(p, q):
    """``(accepted, rejected)`` masses of one step, enumerating ``x ~ p`` and ``y ~ q``."""
    accepted, rejected = np.zeros(len(q)), np.zeros(len(q))
    for x in range(len(p)):
        for y in range(len(q)):
            if x == y:
                accepted[x] += p[x] * q[y]
            else:
                rejected[y] += p[x] * q[y]
    return accepted, rejected


def test_row_laws_equal_the_literal_rule_and_threshold_verification(x64):
    rng = np.random.default_rng(0)
    p = random_rows(rng, (20, 4), zero_fraction=0.3)
    q = random_rows(rng, (20, 4), zero_fraction=0.3)
    (_, pe), (_, qe) = edge_pair()
    p, q = np.concatenate([p, pe.reshape(-1, 4)]), np.concatenate([q, qe.reshape(-1, 4)])
    root, verify = STRICT().laws(jnp.asarray(p), jnp.asarray(q))
    threshold = specjax.ThresholdVerification().laws(jnp.asarray(p), jnp.asarray(q))[1]
    for i in range(len(p)):
        acc, rej = literal_row_law(p[i], q[i])
        for law in (root, verify, threshold):
            np.testing.assert_allclose(law.accepted[i], acc, atol=1e-12)
            np.testing.assert_allclose(law.rejected[i], rej, atol=1e-12)
    # the acceptance sum p q never exceeds SD's sum min(p, q); equal for a point mass
    strict_accept, sd_accept = (p * q).sum(-1), np.minimum(p, q).sum(-1)
    assert np.all(strict_accept <= sd_accept + 1e-15)
    point = (p.max(-1) == 1) | (q.max(-1) == 1) | (sd_accept == 0)
    np.testing.assert_allclose(strict_accept[point], sd_accept[point], atol=1e-15)
    assert np.all(strict_accept[~point] < sd_accept[~point])


@pytest.mark.parametrize("lookahead", [None, 2])
def test_exact_values_equal_the_enumerated_literal_rule(x64, lookahead):
    """``exact``'s rejections and calls, and the output law, against the literal rule enumerated
    over every execution path; the output is the target's law (lossless)."""
    draft, target = random_pair(1, NUM_STATES, HORIZON, zero_fraction=0.2)
    law = enumerate_law(lambda c: strict_literal(c, draft, target, lookahead))
    rejections, calls = expected_counts_from_law(law)
    result = specjax.exact(STRICT(lookahead=lookahead), chain(draft), chain(target))
    np.testing.assert_allclose(result.expected_rejections, rejections, atol=1e-12)
    np.testing.assert_allclose(result.expected_calls, calls, atol=1e-12)
    tokens = marginalise_tokens(law)
    want = target_sequence_law(target)
    assert set(tokens) <= set(want)
    for seq, prob in want.items():
        np.testing.assert_allclose(tokens.get(seq, 0.0), prob, atol=1e-12)
    np.testing.assert_allclose(result.marginals, specjax.marginals(chain(target)), atol=1e-12)
    sd = specjax.exact(specjax.Speculative(lookahead=lookahead), chain(draft), chain(target))
    assert result.expected_calls >= sd.expected_calls


def test_given_drafts_law_equals_the_literal_kernel(x64):
    """``verify_drafts_law`` (no draft probabilities: the rule never reads them) against the
    literal kernel on given drafts: keep ``x_j`` while ``y_j = x_j`` for ``y_j ~ q_j``."""
    rng = np.random.default_rng(2)
    num_requests, lookahead = 4, 2
    q = random_rows(rng, (num_requests, lookahead + 1, NUM_STATES), zero_fraction=0.2)
    x = rng.integers(0, NUM_STATES, (num_requests, lookahead))
    law = specjax.verify_drafts_law(STRICT(lookahead=lookahead), x, None, q)
    for b in range(num_requests):
        want = np.zeros((lookahead + 1, NUM_STATES))
        kept = 1.0
        for j in range(lookahead):
            for y in range(NUM_STATES):
                if y != x[b, j]:
                    want[j, y] += kept * q[b, j, y]
            kept *= q[b, j, x[b, j]]
        want[lookahead] = kept * q[b, lookahead]
        np.testing.assert_allclose(law.outcome[b], want, atol=1e-12)


def test_monte_carlo_is_lossless_and_fits_the_exact_means():
    """20,000 chains of ``decode`` (float32, K = 2): the token sequences against the target's
    law (chi-square at the suite's ALPHA) and the rejections' and calls' means within 4.5 SE
    of the exact values."""
    draft, target = random_pair(3, NUM_STATES, HORIZON)
    strict = STRICT(lookahead=2)
    with jax.enable_x64(True):
        exact = specjax.exact(strict, chain(draft), chain(target))
        rejections, calls = float(exact.expected_rejections), float(exact.expected_calls)
    to32 = lambda m: (m[0].astype(np.float32), m[1].astype(np.float32))  # noqa: E731
    num_chains = 20_000
    trace = specjax.decode(jax.random.key(5), strict, chain(to32(draft)), chain(to32(target)),
                           num_chains)
    counts = defaultdict(int)
    for row in np.asarray(trace.tokens):
        counts[tuple(int(t) for t in row)] += 1
    stats.assert_law(counts, target_sequence_law(target), num_chains, "strict")
    stats.assert_mean(trace.num_rejections, rejections, "strict rejections")
    stats.assert_mean(trace.num_calls, calls, "strict calls")


def test_edge_rows_give_finite_values_and_gradients():
    (p_init, p), (q_init, q) = edge_pair()
    for dtype in (jnp.float32, jnp.float64):
        with jax.enable_x64(dtype == jnp.float64):
            draft = specjax.MarkovChain(jnp.asarray(p_init, dtype), jnp.asarray(p, dtype))
            target = specjax.MarkovChain(jnp.asarray(q_init, dtype), jnp.asarray(q, dtype))

            def calls(logits, target_logits):
                d = specjax.MarkovChain.from_logits(jnp.log(draft.init), logits)
                t = specjax.MarkovChain.from_logits(jnp.log(target.init), target_logits)
                return specjax.exact(STRICT(lookahead=2), d, t).expected_calls

            value, grads = jax.value_and_grad(calls, argnums=(0, 1))(jnp.log(draft.trans),
                                                                    jnp.log(target.trans))
            assert np.isfinite(value) and all(np.isfinite(g).all() for g in grads), dtype
    with pytest.raises(ValueError, match="lookahead"):
        STRICT(lookahead=0)
