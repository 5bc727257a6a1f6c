"""The fast scan samplers against a literal transcription of the paper's pseudo-code.

On tiny instances the literal algorithms (whole draft sequences drafted up front, restart after a
rejection) are enumerated exactly over every execution path. We check, in float64:
  * the literal SD / batch SD laws equal the target's (the paper's unbiasedness theorems);
  * the per-position laws specjax samples from give exactly the same joint law of
    (tokens, rejected, calls) as the literal algorithm (the "draft when verified" equivalence);
  * Monte Carlo runs of the actual samplers fit that exact law (chi-square);
  * Algorithm 4 read literally (final token from q^{M+2}) is biased; the proof's q^{M+1} is not.
"""

from collections import defaultdict

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax.decoders import verification as _verify
import reference as ref
import stats
from conftest import random_pair


def to_chain(pair):
    init, trans = pair
    return specjax.MarkovChain(jnp.asarray(init), jnp.asarray(trans))


def kernel_law(init, root, verify, bonus, lookahead):
    """Exact law of (tokens, rejected, calls) from specjax's per-position laws."""
    horizon = verify.accepted.shape[0]
    law = defaultdict(float)
    # state: (tokens, rejected, calls, phase) -> probability
    states = {((a,), (), 0, 0): float(init[a]) for a in range(len(init)) if init[a] > 0}
    for n in range(horizon):
        new = defaultdict(float)
        for (tokens, rejected, calls, j), pr in states.items():
            row = bonus if j == lookahead else (root if j == 0 else verify)
            acc = np.asarray(row.accepted[n, tokens[-1]])
            rej = np.asarray(row.rejected[n, tokens[-1]])
            calls_next = calls + (j == 0)
            for b in range(len(acc)):
                nj = 0 if j == lookahead else j + 1
                if acc[b] > 0:
                    new[(tokens + (b,), rejected + (False,), calls_next, nj)] += pr * acc[b]
                if rej[b] > 0:
                    new[(tokens + (b,), rejected + (True,), calls_next, 0)] += pr * rej[b]
        states = new
    for (tokens, rejected, calls, _), pr in states.items():
        law[(tokens, rejected, calls)] += pr
    return dict(law)


def assert_laws_equal(a, b, atol=1e-12):
    keys = set(a) | set(b)
    worst = max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in keys)
    assert worst < atol, f"laws differ by {worst:.3g}"


def specjax_laws(draft, target, kind, **kw):
    """The (root, verify, bonus) laws the samplers and the exact theory use: the decoder's."""
    p, q = jnp.asarray(draft[1]), jnp.asarray(target[1])
    if kind == "sd":
        decoder = specjax.Speculative()
    elif kind == "batch":
        decoder = specjax.BatchSpeculative(kw["num_drafts"])
    else:  # biased, optimal residual
        decoder = specjax.BiasedSpeculative(kw["epsilon"])
    root, verify = decoder.laws(p, q)
    return root, verify, _verify.bonus_law(q)


SD_CASES = [None, 1, 2]


@pytest.mark.parametrize("lookahead", SD_CASES)
def test_literal_sd_is_unbiased_and_matches_kernel(x64, lookahead):
    draft, target = random_pair(0, 3, 3, zero_fraction=0.3)
    law = ref.enumerate_law(lambda ch: ref.sd_literal(ch, draft, target, lookahead))
    assert_laws_equal(ref.marginalise_tokens(law), ref.target_sequence_law(target))
    horizon = target[1].shape[0]
    k = horizon if lookahead is None else lookahead
    fast = kernel_law(target[0], *specjax_laws(draft, target, "sd"), k)
    assert_laws_equal(fast, law)


@pytest.mark.parametrize("num_drafts", [1, 2, 3])
def test_literal_batch_is_unbiased_and_matches_kernel(x64, num_drafts):
    draft, target = random_pair(1, 3, 2, zero_fraction=0.2)
    law = ref.enumerate_law(lambda ch: ref.batch_literal(ch, draft, target, num_drafts))
    assert_laws_equal(ref.marginalise_tokens(law), ref.target_sequence_law(target))
    fast = kernel_law(target[0], *specjax_laws(draft, target, "batch", num_drafts=num_drafts),
                      target[1].shape[0])
    assert_laws_equal(fast, law)


@pytest.mark.parametrize("lookahead", [None, 2])
def test_literal_biased_matches_kernel(x64, lookahead):
    draft, target = random_pair(2, 3, 3)
    eps = 0.15

    law = ref.enumerate_law(lambda ch: ref.general_literal(
        ch, draft, target, lambda p, q: ref.biased_accept(p, q, eps), ref.optimal_residual,
        lookahead))
    k = 3 if lookahead is None else lookahead
    fast = kernel_law(target[0], *specjax_laws(draft, target, "biased", epsilon=eps), k)
    assert_laws_equal(fast, law)


def literal_batch_bias(num_drafts, literal_reading):
    draft, target = random_pair(3, 3, 2)
    law = ref.enumerate_law(
        lambda ch: ref.batch_literal(ch, draft, target, num_drafts, literal_reading))
    tokens, exact = ref.marginalise_tokens(law), ref.target_sequence_law(target)
    return 0.5 * sum(abs(tokens.get(s, 0.0) - exact.get(s, 0.0)) for s in set(tokens) | set(exact))


@pytest.mark.parametrize("num_drafts", [1, 2])
def test_algorithm4_literal_reading_is_biased(num_drafts):
    """Line 28 of Algorithm 4 read literally draws from q^{M+2}: biased. The proof's q^{M+1}: not."""
    assert literal_batch_bias(num_drafts, literal_reading=False) < 1e-12
    assert literal_batch_bias(num_drafts, literal_reading=True) > 1e-2


def test_algorithm4_literal_reading_bias_is_visible_in_monte_carlo():
    """20,000 literal-reading runs (M = 1, TV to the target 0.030) reject the target law at level
    ALPHA: with this exact bias the non-central chi-square gives a miss probability of 1e-16.
    As many runs of the proof's version pass (false-failure rate ALPHA)."""
    draft, target = random_pair(3, 3, 2)
    exact = ref.target_sequence_law(target)
    n = 20_000
    pvalues = {}
    for literal_reading in (False, True):
        chooser = ref.RandomChooser(np.random.default_rng(1234))
        counts = defaultdict(int)
        for _ in range(n):
            tokens, _, _ = ref.batch_literal(chooser, draft, target, 1, literal_reading)
            counts[tokens] += 1
        pvalues[literal_reading] = stats.chi_square_pvalue(counts, exact, n)
    assert pvalues[False] > stats.ALPHA
    assert pvalues[True] < stats.ALPHA


def outcome_counts(trace):
    rows = np.concatenate(
        [np.asarray(trace.tokens), np.asarray(trace.rejected, np.int32),
         np.asarray(trace.num_calls)[:, None]], axis=1)
    horizon = trace.rejected.shape[1]
    counts = {}
    for row, c in stats.count_rows(rows).items():
        key = (row[: horizon + 1], tuple(bool(v) for v in row[horizon + 1: 2 * horizon + 1]),
               row[-1])
        counts[key] = c
    return counts


MC_CASES = [
    ("sd", dict(lookahead=None)),
    ("sd", dict(lookahead=1)),
    ("sd", dict(lookahead=2)),
    ("batch", dict(num_drafts=2)),
    ("batch", dict(num_drafts=3)),
    ("biased", dict(epsilon=0.15)),
]


@pytest.mark.slow  # a Monte Carlo run of 100,000 chains or more
@pytest.mark.parametrize("kind, kw", MC_CASES)
def test_samplers_fit_literal_law(kind, kw):
    """Monte Carlo of the fast samplers vs the exact law of the literal algorithm."""
    # Batch SD drafts M whole sequences per call: enumeration is kept small with T = 2.
    draft, target = random_pair(4, 3, 2 if kind == "batch" else 3, zero_fraction=0.3)
    if kind == "sd":
        law = ref.enumerate_law(lambda ch: ref.sd_literal(ch, draft, target, kw["lookahead"]))
    elif kind == "batch":
        law = ref.enumerate_law(
            lambda ch: ref.batch_literal(ch, draft, target, kw["num_drafts"]))
    else:
        eps = kw["epsilon"]
        law = ref.enumerate_law(lambda ch: ref.general_literal(
            ch, draft, target, lambda p, q: ref.biased_accept(p, q, eps), ref.optimal_residual))
    d, t = to_chain(draft), to_chain(target)
    n = 200_000
    key = jax.random.key(2024)
    if kind == "sd":
        trace = specjax.speculative_decoding(key, d, t, n, **kw)
    elif kind == "batch":
        trace = specjax.batch_speculative_decoding(key, d, t, n, **kw)
    else:
        trace = specjax.biased_speculative_decoding(key, d, t, n, residual="optimal", **kw)
    stats.assert_law(outcome_counts(trace), law, n, f"{kind} {kw}")
