"""The Gumbel-max list coupling (``GumbelList``, ``gumbel_list_root_law``) against independent
oracles, in float64 unless said otherwise:

* nested ``scipy.integrate.quad`` of the conditional integral (its inner integral over ``v``
  taken literally, split at the kinks of the ``max``; not the library's ``L(t)`` form) gives the
  library's ``P(Y = k, no draft is k)`` to 1e-8 (observed: ~1e-16), M = 1, 2, 3, V = 2..5;
* ``M = 1`` equals the closed form ``p_k q_k / sum_j max(p_j q_k, q_j p_k)`` to 1e-12;
* Monte Carlo of the literal coupling in NumPy (shared exponentials, ``argmin``) fits the joint
  law of (token, accepted) (chi-square, false-failure rate ``stats.ALPHA`` each);
* the acceptance is at most ``optimal_acceptance`` (i.i.d. drafts) and, at ``M = 1``, at least
  ``(1 - TV) / (1 + TV)`` (Daliri et al.'s bound);
* Monte Carlo of ``decode`` on whole sequences fits the law of (tokens, rejected, calls) from the
  decoder's per-position laws, the tokens fit the target's law, and the means fit ``exact``;
* finite values and gradients at edge rows, and the argument errors.

The coupling has continuous randomness, so the literal algorithm is not enumerated over whole
sequences; specjax's engines draw each root's (token, accepted) from the exact root law.
"""

import functools
import math
from collections import defaultdict

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate

import decoder_checks as checks
import specjax
import stats
from conftest import full_suite_only
from conftest import random_pair
from specjax.decoders.gumbel_list import MAX_GUMBEL_LIST_ELEMENTS
from specjax.decoders.gumbel_list import GumbelList
from specjax.decoders.gumbel_list import gumbel_list_root_law
from test_optimal_multi_draft import EDGE
from test_optimal_multi_draft import edge_rows

TIGHT = 1e-12
QUAD = 1e-8
DRAFTS = (1, 2, 3)


# ----------------------------------------------------------------------------- oracles
def quadrature_rejected(p, q, num_drafts, k):
    """``P(Y = k, no draft is k)`` by nested ``quad``: ``int_0^inf M e^{-Mu} [e^{-uQ} - e^{-uC}]
    [e^{-uQ} - G(u)]^{M-1} du`` with ``G(u) = int_0^inf e^{-v} exp(-sum_j max(u a_j,
    (u + v) b_j)) dv`` integrated literally (split at the kinks ``v = u (a_j / b_j - 1)``)."""
    if p[k] == 0 or q[k] == 0:
        return q[k]
    other = np.arange(len(p)) != k
    a, b = q[other] / q[k], p[other] / p[k]
    big_q, big_c = a.sum(), np.maximum(a, b).sum()
    tol = {"epsabs": 1e-14, "epsrel": 1e-12, "limit": 200}

    pairs = list(zip(a.tolist(), b.tolist()))  # plain floats: the integrand runs 10^5 times

    def inner(u):
        f = lambda v: math.exp(-v - sum([max(u * aj, (u + v) * bj) for aj, bj in pairs]))
        kinks = sorted(u * (aj / bj - 1) for aj, bj in zip(a, b) if bj > 0 and aj > bj)
        if not kinks:
            return integrate.quad(f, 0, np.inf, **tol)[0]
        head = integrate.quad(f, 0, kinks[-1], points=kinks[:-1] or None, **tol)[0]
        return head + integrate.quad(f, kinks[-1], np.inf, **tol)[0]

    def outer(u):
        first = math.exp(-u * big_q) - math.exp(-u * big_c)
        rest = (math.exp(-u * big_q) - inner(u)) ** (num_drafts - 1) if num_drafts > 1 else 1.0
        return num_drafts * math.exp(-num_drafts * u) * first * rest

    return integrate.quad(outer, 0, np.inf, **tol)[0]


def closed_form_m1(p, q):
    """``accepted(k) = p_k q_k / sum_j max(p_j q_k, q_j p_k)`` (0 where ``p_k q_k = 0``)."""
    den = np.maximum(p[None, :] * q[:, None], q[None, :] * p[:, None]).sum(-1)
    return np.where(p * q > 0, p * q / np.where(den > 0, den, 1.0), 0.0)


def literal_coupling(p, q, num_drafts, n, rng, chunk=250_000):
    """The coupling written out: ``E ~ Exp(1)`` of shape ``(n, M, V)``, ``X_i = argmin E / p``,
    ``Y`` = token of ``argmin E / q`` over all cells. Returns ``{(Y, accepted): count}``."""
    v = len(p)
    counts = defaultdict(int)
    inv_p = np.where(p > 0, 1 / np.where(p > 0, p, 1), np.inf)
    inv_q = np.where(q > 0, 1 / np.where(q > 0, q, 1), np.inf)
    for start in range(0, n, chunk):
        size = min(chunk, n - start)
        e = rng.exponential(size=(size, num_drafts, v))
        x = np.argmin(e * inv_p, axis=-1)
        y = np.argmin((e * inv_q).reshape(size, num_drafts * v), axis=-1) % v
        accepted = (x == y[:, None]).any(-1)
        # counted by bincount of 2 Y + accepted (np.unique(..., axis=0) took half the time)
        for cell, count in enumerate(np.bincount(2 * y + accepted, minlength=2 * v)):
            if count:
                counts[(cell // 2, bool(cell % 2))] += int(count)
    return counts


def _library_values(p, q):
    out = []
    for m in DRAFTS:
        law = gumbel_list_root_law(p, q, m)
        out.append((law.accepted, law.rejected, specjax.optimal_acceptance(p, q, num_drafts=m)))
    return out


_library_program = jax.jit(_library_values)


#: Rows ``library`` pads its input to (the most a test passes: 60 random rows and the 9 edge
#: rows) with uniform rows, so that the tests compile one program per V, not one per (rows, V).
LIBRARY_ROWS = 69


def library(p, q):
    """``{M: (accepted, rejected, alpha*)}`` (NumPy float64) of the rows of ``p`` and ``q``."""
    p, q = np.asarray(p), np.asarray(q)
    rows, num_states = p.shape
    pad = np.full((LIBRARY_ROWS - rows, num_states), 1 / num_states, p.dtype)
    out = _library_program(jnp.asarray(np.concatenate([p, pad])),
                           jnp.asarray(np.concatenate([q, pad])))
    return {m: tuple(np.asarray(a)[:rows] for a in v) for m, v in zip(DRAFTS, out)}


# ----------------------------------------------------------------------------- 1. exact law
QUAD_EDGE = ("zero in p", "zero in q", "zero in both", "disjoint", "p = q", "proportional",
             "ties")


@pytest.mark.parametrize("num_states", [2, 3, full_suite_only(4), full_suite_only(5)])
def test_root_law_equals_nested_quadrature(x64, num_states):
    """V = 2..5, M = 1, 2, 3, on 2 random rows with zeros and 7 edge rows (zeros in p, in q, in
    both, disjoint supports, p = q, ties of q / p): the library's rejected mass equals nested
    quadrature of the conditional integral to 1e-8."""
    p, q = edge_rows(1300 + num_states, num_states, 2)
    rows = [0, 1] + [2 + EDGE[name] for name in QUAD_EDGE]
    for m, (_, rejected, _) in library(p, q).items():
        for row in rows:
            want = [quadrature_rejected(p[row], q[row], m, k) for k in range(num_states)]
            np.testing.assert_allclose(rejected[row], want, rtol=0, atol=QUAD,
                                       err_msg=f"M = {m}, p {p[row]}, q {q[row]}")


@pytest.mark.parametrize("num_states", [2, 3, 4, 7])
def test_one_draft_closed_form_and_lossless_split(x64, num_states):
    """30 random rows with zeros and the 9 edge rows: ``M = 1`` equals the closed form to
    1e-12; for M = 1, 2, 3 ``accepted + rejected = q`` and both are non-negative; ``p = q`` at
    ``M = 1`` accepts 1, disjoint supports accept 0; the acceptance grows with ``M``."""
    p, q = edge_rows(1400 + num_states, num_states, 30)
    values = library(p, q)
    want = np.stack([closed_form_m1(p[r], q[r]) for r in range(p.shape[0])])
    np.testing.assert_allclose(values[1][0], want, rtol=0, atol=TIGHT)
    previous = None
    for m, (accepted, rejected, _) in values.items():
        np.testing.assert_allclose(accepted + rejected, q, rtol=0, atol=1e-15)
        assert (accepted >= 0).all() and (rejected >= 0).all(), m
        total = accepted.sum(-1)
        assert abs(total[30 + EDGE["disjoint"]]) < TIGHT, m
        assert abs(total[30 + EDGE["one-hot disjoint"]]) < TIGHT, m
        if previous is not None:
            assert (total >= previous - TIGHT).all(), m
        previous = total
    assert abs(values[1][0][30 + EDGE["p = q"]].sum() - 1) < TIGHT


# ----------------------------------------------------------------------------- 2. Monte Carlo
MC_ROWS = (
    (np.array([0.1, 0.2, 0.3, 0.4]), np.array([0.4, 0.05, 0.25, 0.3])),
    (np.array([0.5, 0.0, 0.3, 0.2, 0.0]), np.array([0.1, 0.3, 0.3, 0.0, 0.3])),
)


@functools.lru_cache(maxsize=None)
def mc_row_library(row):
    """``library`` of ``MC_ROWS[row]`` (float64): the program the other tests compile for its V,
    not the dozens of programs of an eager ``gumbel_list_root_law``."""
    with jax.enable_x64(True):
        p, q = MC_ROWS[row]
        return library(p[None], q[None])


@pytest.mark.slow  # a Monte Carlo run of 100,000 chains or more
@pytest.mark.parametrize("num_drafts", [2, 3])
def test_literal_coupling_fits_the_exact_joint_law(x64, num_drafts):
    """1,000,000 draws of the literal coupling (NumPy, fixed seed) per row, two rows (one with
    zeros in p and q): the joint law of (token, accepted) fits the library's (chi-square, each
    failing falsely with probability ``stats.ALPHA`` = 1e-5)."""
    rng = np.random.default_rng(1500 + num_drafts)
    n = 1_000_000
    for row, (p, q) in enumerate(MC_ROWS):
        accepted, rejected, _ = mc_row_library(row)[num_drafts]
        exact = {}
        for k in range(len(p)):
            exact[(k, True)] = float(accepted[0, k])
            exact[(k, False)] = float(rejected[0, k])
        observed = literal_coupling(p, q, num_drafts, n, rng)
        stats.assert_law(observed, exact, n, f"M = {num_drafts}, p {p}, q {q}")


# ----------------------------------------------------------------------------- 3. bounds
@pytest.mark.parametrize("num_states", [2, 4, 7])
def test_acceptance_is_bounded(x64, num_states):
    """60 random rows with zeros and the edge rows: the acceptance is at most ``alpha*``
    (``optimal_acceptance`` with replacement: the drafts are i.i.d. from ``p``), and at
    ``M = 1`` at least ``(1 - TV) / (1 + TV)``."""
    p, q = edge_rows(1600 + num_states, num_states, 60)
    values = library(p, q)
    tv = 0.5 * np.abs(p - q).sum(-1)
    for m, (accepted, _, alpha) in values.items():
        total = accepted.sum(-1)
        assert (total <= alpha + TIGHT).all(), (m, (total - alpha).max())
    total = values[1][0].sum(-1)
    assert (total >= (1 - tv) / (1 + tv) - TIGHT).all(), ((1 - tv) / (1 + tv) - total).max()


# ----------------------------------------------------------------------------- 4. sequences
def test_sampler_fits_the_exact_law_and_means():
    """200,000 chains of ``decode(GumbelList(2))`` (V = 3, T = 3, float32) against the exact
    float64 law of (tokens, rejected, calls) from the decoder's per-position laws and the tokens
    alone against the target's law: chi-square, each failing falsely with probability
    ``stats.ALPHA`` = 1e-5; mean rejections and calls within ``stats.Z`` = 4.5 standard errors
    of ``exact``."""
    decoder = GumbelList(2)
    pair = random_pair(1700, 3, 3, zero_fraction=0.2)
    law, rejections, calls = checks.exact_outcome_law(decoder, pair)
    assert abs(sum(law.values()) - 1) < TIGHT
    checks.assert_decode_fits(jax.random.key(2028), decoder, pair, law, rejections, calls)


# ----------------------------------------------------------------------------- 5. edge cases
EXACT_EDGE = {"float32": (GumbelList(2),), "float64": (GumbelList(3, lookahead=2),)}


@pytest.mark.parametrize("dtype", ["float32", full_suite_only("float64")])
def test_values_and_gradients_are_finite_at_edge_cases(dtype):
    """p = q, disjoint supports, one-hot rows, zeros, p = 0 where q > 0 (``edge_pair``): the
    root law's total acceptance (M = 1..4) lies in [0, rows] with finite gradients in p and q,
    and the exact ``E[N_rej]`` of ``GumbelList`` (M = 2 in float32, M = 3 with lookahead 2 in
    float64) and its gradient in the draft's logits are finite."""
    checks.assert_finite_at_edge_rows(dtype, gumbel_list_root_law, (1, 2, 3, 4),
                                      EXACT_EDGE[dtype])


def _weighted(lp, lq, m):
    law = gumbel_list_root_law(jax.nn.softmax(lp), jax.nn.softmax(lq), m)
    return jnp.sum(law.accepted * jnp.arange(1.0, 6.0, dtype=lp.dtype))


@jax.jit
def _values_and_gradients(lp, lq):
    """``[(value, (grad_p, grad_q))]`` for M = 1, 2, 3: one program for every M."""
    return [jax.value_and_grad(_weighted, argnums=(0, 1))(lp, lq, m) for m in DRAFTS]


def test_gradients_equal_finite_differences(x64):
    """On 8 random interior rows (V = 5, logits, M = 1, 2, 3) the gradient of a weighted sum of
    the accepted masses in the draft's and the target's logits equals central finite
    differences (step 1e-6) to 1e-7: the expansion is differentiated correctly away from ties
    of ``q / p`` (where the breakpoint order, a constant, changes)."""
    rng = np.random.default_rng(31)
    for _ in range(8):
        lp, lq = rng.normal(size=5), rng.normal(size=5)
        grads = [g for _, g in _values_and_gradients(jnp.asarray(lp), jnp.asarray(lq))]
        for which in (0, 1):
            for i in range(5):
                step = np.zeros(5)
                step[i] = 1e-6
                up, down = [lp, lq], [lp, lq]
                up[which], down[which] = up[which] + step, down[which] - step
                f_up = _values_and_gradients(*map(jnp.asarray, up))
                f_down = _values_and_gradients(*map(jnp.asarray, down))
                for m, grad, (a, _), (b, _) in zip(DRAFTS, grads, f_up, f_down):
                    fd = (float(a) - float(b)) / 2e-6
                    assert abs(fd - float(grad[which][i])) < 1e-7, (m, which, i)


def test_float32_is_close_to_float64():
    """The float32 root law (M = 1, 2, 3) is within 1e-5 of the float64 one on random rows with
    zeros and the edge rows (the expansion's cancellation stays small at V = 7, the largest V
    of this module; the float64 program is ``library``'s at V = 7, shared with the tests above)."""
    p, q = edge_rows(1800, 7, 30)
    with jax.enable_x64(True):
        exact = library(p, q)
    low = _library_program(jnp.asarray(p, jnp.float32), jnp.asarray(q, jnp.float32))
    for m, (accepted, _, _) in zip(DRAFTS, low):
        assert np.isfinite(np.asarray(accepted)).all()
        np.testing.assert_allclose(np.asarray(accepted), exact[m][0], rtol=0, atol=1e-5,
                                   err_msg=f"M = {m}")


# ----------------------------------------------------------------------------- 6. errors
def test_invalid_arguments_are_refused_naming_them():
    p = jnp.asarray([0.5, 0.5])
    q = jnp.asarray([0.25, 0.75])
    for bad in (0, -1, 1.5, "2", jnp.asarray(2), True, None):
        with pytest.raises(ValueError, match="num_drafts"):
            GumbelList(bad)
        with pytest.raises(ValueError, match="num_drafts"):
            gumbel_list_root_law(p, q, bad)
    with pytest.raises(ValueError, match="num_drafts = math.inf is not defined"):
        GumbelList(math.inf)
    with pytest.raises(ValueError, match="num_drafts = math.inf is not defined"):
        gumbel_list_root_law(p, q, math.inf)
    for bad in (0, -1, 1.5, "2", jnp.asarray(2), True):
        with pytest.raises(ValueError, match="lookahead"):
            GumbelList(2, lookahead=bad)
    with pytest.raises(ValueError, match="p rows must sum to one"):
        gumbel_list_root_law(jnp.asarray([0.5, 0.6]), q, 2)
    with pytest.raises(ValueError, match="p and q must have the same number of tokens V"):
        gumbel_list_root_law(jnp.asarray([0.2, 0.3, 0.5]), q, 2)
    # The size refusal, in the function and in the decoder's check hook.
    big = jnp.full((64,), 1 / 64)
    with pytest.raises(ValueError, match="num_drafts = 6 with the Gumbel list coupling"):
        gumbel_list_root_law(big, big, 6)
    with pytest.raises(ValueError, match="num_drafts = 4"):
        GumbelList(4).check(64, 4096)
    GumbelList(2).check(8, 64)
    assert 8 * 9 * 64 <= MAX_GUMBEL_LIST_ELEMENTS


def test_size_refusal_reaches_the_entry_points():
    """``exact`` refuses a run whose root law would exceed the size limit, naming
    ``num_drafts``, before any work."""
    rng = np.random.default_rng(0)
    v, horizon = 40, 8
    draft = specjax.MarkovChain(jnp.asarray(rng.dirichlet(np.ones(v))),
                                jnp.asarray(rng.dirichlet(np.ones(v), size=(horizon, v))))
    with pytest.raises(ValueError, match="num_drafts"):
        specjax.exact(GumbelList(4), draft, draft)


def test_label_and_pytree():
    decoder = GumbelList(3, lookahead=2)
    assert decoder.label == "Gumbel list coupling, M = 3, K = 2"
    assert GumbelList(2).label == "Gumbel list coupling, M = 2"
    assert jax.tree_util.tree_leaves(decoder) == []
    assert not decoder.same_root and isinstance(decoder, specjax.TokenwiseDecoder)
