"""The engines' lossy rules as decoders: typical acceptance (Medusa, vLLM), lenient SD, top-k
acceptance and SGLang's threshold verification.

Three ways: (1) each rule's per-row law equals a literal NumPy transcription of the engine's code
enumerated exactly over the drafted token (the rules are deterministic or one-uniform tests);
(2) ``exact``'s expected rejections and ``output_chain`` equal an independent NumPy forward
recursion on those literal rows; (3) Monte Carlo of ``decode`` against the output law and the
exact mean. SGLang's rule is also run on given drafts against its literal kernel, token for
token.
"""

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
from engine_reference import inverse_cdf
from reference import target_sequence_law
from sampler_cases import CASES
from sampler_cases import instance

RULES = [specjax.TypicalAcceptance(), specjax.TypicalAcceptance(0.3, 0.5, residual="optimal"),
         specjax.LenientSpeculative(0.6), specjax.LenientSpeculative(0.8, residual="optimal"),
         specjax.TopKAcceptance(2), specjax.TopKAcceptance(1, residual="target"),
         specjax.ThresholdVerification(), specjax.ThresholdVerification(0.4, 0.7)]


def _normalised(w):
    return w / w.sum() if w.sum() > 0 else w


def _residual(name, p, q, b):
    return {"standard": _normalised(np.maximum(q - p, 0)), "target": q,
            "optimal": _normalised(np.maximum(q - b * p, 0)),
            "argmax": np.eye(len(q))[int(np.argmax(q))]}[name]


def literal_row_law(rule, p, q):
    """``(accepted, rejected)`` masses of one row, enumerating the drafted token ``x ~ p`` through
    a literal transcription of the rule (the engines' code for typical acceptance and SGLang)."""
    num_tokens = len(q)
    accepted, rejected = np.zeros(num_tokens), np.zeros(num_tokens)
    if isinstance(rule, specjax.ThresholdVerification):
        single, acc = float(rule.threshold_single), float(rule.threshold_acc)
        for x in range(num_tokens):
            # coin <= prob_acc / threshold_acc or target_prob_single >= threshold_single
            b = 1.0 if q[x] >= single else min(1.0, q[x] / acc)
            accepted[x] += p[x] * b
            d = np.zeros(num_tokens)
            d[x] = q[x]  # draft_probs[x] = target_probs[x] on rejection
            rest = np.maximum(q - d, 0)  # relu(target - draft)
            if p[x] * (1 - b) > 0:
                rejected += p[x] * (1 - b) * rest / rest.sum()
        return accepted, rejected
    if isinstance(rule, specjax.TypicalAcceptance):
        entropy = -np.sum(q * np.log(q + 1e-5))
        cut = min(float(rule.threshold), float(rule.alpha) * np.exp(-entropy))
        b = (q > cut).astype(float)  # posterior_mask = candidates_prob > threshold
    elif isinstance(rule, specjax.LenientSpeculative):
        lp = float(rule.lenience) * p
        b = np.where(lp > 0, np.minimum(1.0, q / np.where(lp > 0, lp, 1.0)), 1.0)
    else:
        top = sorted(q, reverse=True)[rule.k - 1] if rule.k else np.inf
        sd = np.where(p > 0, np.minimum(1.0, q / np.where(p > 0, p, 1.0)), 1.0)
        b = np.where((q >= top) & (q > 0), 1.0, sd)
    accepted = b * p
    rejected = (1 - accepted.sum()) * _residual(rule.residual, p, q, b)
    return accepted, rejected


def literal_output_and_rejections(rule, draft, target):
    """The output chain's transitions and ``E[N_rej]`` (K = T) by a NumPy forward recursion."""
    (_, p_trans), (q_init, q_trans) = draft, target
    horizon, num_tokens, _ = q_trans.shape
    out = np.zeros_like(q_trans)
    reject = np.zeros((horizon, num_tokens))
    for n in range(horizon):
        for a in range(num_tokens):
            acc, rej = literal_row_law(rule, p_trans[n, a], q_trans[n, a])
            out[n, a] = acc + rej
            reject[n, a] = rej.sum()
    mu, total = q_init, 0.0
    for n in range(horizon):
        total += mu @ reject[n]
        mu = mu @ out[n]
    return out, total


@jax.jit
def _row_laws(row_sets):
    """Every rule's ``laws(p, q)[1]`` on each ``(p, q)`` of ``row_sets``: one program (eagerly,
    each operation of each rule compiles its own)."""
    return [[rule.laws(p, q)[1] for p, q in row_sets] for rule in RULES]


def test_row_laws_equal_the_literal_transcriptions(x64):
    rng = np.random.default_rng(0)
    p = random_rows(rng, (30, 5), zero_fraction=0.3)
    q = random_rows(rng, (30, 5), zero_fraction=0.3)
    (_, pe), (_, qe) = edge_pair()
    edge_p, edge_q = pe.reshape(-1, 4), qe.reshape(-1, 4)
    row_sets = ((p, q), (edge_p, edge_q))
    for rule, laws in zip(RULES, _row_laws(row_sets)):
        for (rows_p, rows_q), law in zip(row_sets, laws):
            law = jax.tree.map(np.asarray, law)
            for i in range(len(rows_p)):
                acc, rej = literal_row_law(rule, rows_p[i], rows_q[i])
                np.testing.assert_allclose(law.accepted[i], acc, atol=1e-12, err_msg=rule.label)
                np.testing.assert_allclose(law.rejected[i], rej, atol=1e-12, err_msg=rule.label)


def test_exact_values_equal_an_independent_recursion(x64):
    draft, target = random_pair(1, num_states=4, horizon=5, zero_fraction=0.2)
    # every rule's exact value and output chain in one program (one per rule and function costs
    # about twice the compilation)
    values = jax.jit(lambda d, t: [(specjax.exact(rule, d, t).expected_rejections,
                                    specjax.output_chain(rule, d, t).trans)
                                   for rule in RULES])(chain(draft), chain(target))
    for rule, (expected_rejections, trans) in zip(RULES, values):
        out, rejections = literal_output_and_rejections(rule, draft, target)
        np.testing.assert_allclose(expected_rejections, rejections, atol=1e-12,
                                   err_msg=rule.label)
        np.testing.assert_allclose(trans, out, atol=1e-12, err_msg=rule.label)


def test_default_threshold_verification_is_lossless_and_the_others_are_not(x64):
    draft, target = random_pair(2, num_states=4, horizon=5)
    for rule, lossless in [(specjax.ThresholdVerification(), True),
                           (specjax.ThresholdVerification(0.3, 1.0), False),
                           (specjax.TypicalAcceptance(), False), (specjax.LenientSpeculative(1.0),
                                                                 True),
                           (specjax.LenientSpeculative(0.5), False),
                           (specjax.TopKAcceptance(0), True), (specjax.TopKAcceptance(2), False)]:
        kl = float(specjax.theory.sequence_kl(
            specjax.output_chain(rule, chain(draft), chain(target)), chain(target)))
        assert (kl < 1e-12) == lossless, (rule.label, kl)


@pytest.mark.slow  # a Monte Carlo run of 100,000 chains or more
@pytest.mark.parametrize("rule", [specjax.TypicalAcceptance(0.2, 0.5),
                                  specjax.ThresholdVerification(0.5, 0.8)],
                         ids=["typical", "threshold"])
def test_monte_carlo_fits_the_exact_output_law(rule):
    """200,000 chains of ``decode`` (float32): the token sequences against the exact output
    chain's law (chi-square at the suite's ALPHA) and the rejections' mean within 4.5 SE."""
    draft, target = random_pair(3, num_states=3, horizon=3)
    with jax.enable_x64(True):
        out = specjax.output_chain(rule, chain(draft), chain(target))
        law = target_sequence_law((np.asarray(out.init), np.asarray(out.trans)))
        rejections = float(specjax.exact(rule, chain(draft), chain(target)).expected_rejections)
    to32 = lambda m: (m[0].astype(np.float32), m[1].astype(np.float32))  # noqa: E731
    num_chains = 200_000
    trace = specjax.decode(jax.random.key(5), rule, chain(to32(draft)), chain(to32(target)),
                           num_chains)
    counts = defaultdict(int)
    for row in np.asarray(trace.tokens):
        counts[tuple(int(t) for t in row)] += 1
    stats.assert_law(counts, law, num_chains, rule.label)
    stats.assert_mean(trace.num_rejections, rejections, rule.label)


def test_threshold_verification_on_given_drafts_equals_its_literal_kernel(x64):
    """SGLang's kernel for a chain, transcribed (coin <= q(x) / acc or q(x) >= single; on
    rejection relu(q - d) with d(x) = q(x), sampled by the inverse CDF at the final coin), token
    for token against ``verify_drafts`` with the same uniforms (never 0 here); and the law. At
    coin = 0 exactly the kernel's ``<=`` accepts a draft of target probability 0, which
    ``verify_drafts`` (strict ``<``) rejects: the u = 0 bug, in SGLang's kernel."""
    rule = specjax.ThresholdVerification(0.6, 0.8)
    rng = np.random.default_rng(6)
    num_requests, lookahead, num_tokens = 6, 3, 5
    q = random_rows(rng, (num_requests, lookahead + 1, num_tokens), zero_fraction=0.2)
    x = rng.integers(0, num_tokens, (num_requests, lookahead))
    for trial in range(20):
        u = rng.random((num_requests, lookahead))
        v = rng.random((num_requests, lookahead + 1))
        out = specjax.verify_drafts(None, rule, x, None, q, uniforms=(u, v))
        for b in range(num_requests):
            want = []
            for j in range(lookahead):
                tok = x[b, j]
                if u[b, j] <= q[b, j, tok] / 0.8 or q[b, j, tok] >= 0.6:
                    want.append(int(tok))
                    continue
                d = np.zeros(num_tokens)
                d[tok] = q[b, j, tok]
                want.append(inverse_cdf(v[b, j], np.maximum(q[b, j] - d, 0)))
                break
            else:
                want.append(inverse_cdf(v[b, lookahead], q[b, lookahead]))
            got = np.asarray(out.tokens[b])
            assert got[:len(want)].tolist() == want and (got[len(want):] == -1).all(), (trial, b)
    zero = q[0].copy()
    zero[0] = 0.0
    zero[0, (x[0, 0] + 1) % num_tokens] = 1.0  # q(x_0) = 0
    out = specjax.verify_drafts(None, rule, x[0], None, zero,
                                uniforms=(np.zeros(lookahead), np.full(lookahead + 1, 0.5)))
    assert int(out.num_accepted) == 0  # SGLang's coin <= 0 / acc would accept x_0
    law = specjax.verify_drafts_law(rule, x, None, q)
    b0 = [1.0 if q[0, j, x[0, j]] >= 0.6 else min(1.0, q[0, j, x[0, j]] / 0.8)
          for j in range(lookahead)]
    np.testing.assert_allclose(law.acceptance[0], b0, atol=1e-12)
    rest = q[0, 0] * (np.arange(num_tokens) != x[0, 0])
    np.testing.assert_allclose(law.outcome[0, 0], (1 - b0[0]) * rest / rest.sum(), atol=1e-12)


def test_parameters_are_validated_and_edge_rows_stay_finite():
    for make, name in [(lambda: specjax.TypicalAcceptance(1.5), "threshold"),
                       (lambda: specjax.TypicalAcceptance(0.1, -1.0), "alpha"),
                       (lambda: specjax.LenientSpeculative(0.0), "lenience"),
                       (lambda: specjax.LenientSpeculative(1.2), "lenience"),
                       (lambda: specjax.ThresholdVerification(0.0), "threshold_single"),
                       (lambda: specjax.ThresholdVerification(1.0, 2.0), "threshold_acc")]:
        # refused before any work: the chains of the edge rows below (no sampler to compile)
        draft, target = (chain(x) for x in edge_pair())
        with pytest.raises(ValueError, match=name):
            specjax.exact(make(), draft, target)
    with pytest.raises(ValueError, match="k"):
        specjax.TopKAcceptance(-1)
    with pytest.raises(ValueError, match="residual"):
        specjax.LenientSpeculative(0.5, residual="greedy")
    (p_init, p), (q_init, q) = edge_pair()
    for dtype in (jnp.float32, jnp.float64):
        with jax.enable_x64(dtype == jnp.float64):
            draft = specjax.MarkovChain(jnp.asarray(p_init, dtype), jnp.asarray(p, dtype))
            target = specjax.MarkovChain(jnp.asarray(q_init, dtype), jnp.asarray(q, dtype))
            def rejections(logits, rule):
                d = specjax.MarkovChain.from_logits(jnp.log(draft.init), logits)
                return specjax.exact(rule, d, target).expected_rejections

            # one of each class, in one program per dtype
            every = jax.jit(lambda logits: [jax.value_and_grad(rejections)(logits, rule)
                                            for rule in RULES[::2]])
            for rule, (value, grad) in zip(RULES[::2], every(jnp.log(draft.trans))):
                assert np.isfinite(value) and np.isfinite(grad).all(), (rule.label, dtype)


def test_every_entry_point_and_model_kind_runs():
    """The support table's row for these decoders: decode, decoding_statistics and exact on a
    Markov chain, its finite-state lift and (Monte Carlo) an n-gram model; equal exact values on
    the chain and its lift. The cases, instances, chain counts and chunks of test_decoders's
    support-table test (lift, n-gram, exact) and of test_scale's statistics test (Markov chains):
    their programs, which the suite's persistent compilation cache then serves."""
    draft, target = instance(num_states=3, horizon=4)
    lifted = [specjax.FiniteStateModel.from_markov_chain(m) for m in (draft, target)]
    ngram = [specjax.NGramModel(jnp.asarray(m.trans[0]), 2) for m in (draft, target)]
    key = jax.random.key(0)
    # a deterministic test, a residual given the draft
    for rule in (CASES["typical 0.2/0.3 K=4"], CASES["threshold 0.5/0.7 K=3"]):
        on_chain = specjax.exact(rule, draft, target).expected_calls
        np.testing.assert_allclose(specjax.exact(rule, *lifted, horizon=4).expected_calls,
                                   on_chain, rtol=1e-5)
        for models, kw, num, num_counted, chunk in ((lifted, dict(horizon=4), 4, 8, 4),
                                                    (ngram, dict(horizon=4), 4, 8, 4),
                                                    (instance(), {}, 3000, 3000, 1100)):
            assert specjax.decode(key, rule, *models, num, **kw).tokens.shape[0] == num
            stats_ = specjax.decoding_statistics(key, rule, *models, num_counted,
                                                 chunk_size=chunk, **kw)
            assert np.isfinite(np.asarray(stats_.rejected)).all()
