"""Importance-weighted selection of one draft, then SD (``ImportanceWeighted``,
``importance_weighted_root_law``, ``importance_selection_law``) against independent oracles, in
float64 unless said otherwise:

* a literal transcription in NumPy (every ordered tuple of ``M`` i.i.d. drafts with its
  probability, the selection probabilities ``w / sum w`` with ``w = q / p``, uniform when every
  ``w`` is 0, the selected token's law ``r`` summed from that enumeration, then SD of the
  selected token against ``q`` with proposal ``r``) has the library's joint law of (token,
  accepted), and the token law ``q``;
* the acceptance is at most ``optimal_acceptance`` and is SD's at ``M = 1``;
* the literal algorithm on whole sequences, enumerated over every execution path, has the
  target's output law and the law of (tokens, rejected, calls) that specjax samples from and
  sums exactly (``exact``);
* Monte Carlo of ``decode`` fits that law (chi-square, false-failure rate ``stats.ALPHA`` each)
  and its means fit ``exact`` (``stats.Z`` standard errors);
* finite values and gradients at edge rows (and a finite-difference check of the gradient at
  interior rows), and the argument errors.
"""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import decoder_checks as checks
import reference as ref
import specjax
from conftest import chain
from conftest import random_pair
from specjax.decoders import verification as _verify
from specjax.decoders.importance_weighted import MAX_IMPORTANCE_ELEMENTS
from specjax.decoders.importance_weighted import ImportanceWeighted
from specjax.decoders.importance_weighted import importance_selection_law
from specjax.decoders.importance_weighted import importance_weighted_root_law
from test_literal_equivalence import assert_laws_equal
from test_literal_equivalence import kernel_law
from test_optimal_multi_draft import EDGE
from test_optimal_multi_draft import edge_rows

TIGHT = 1e-12
DRAFTS = (1, 2, 3)
BOUND_ROWS = 60  # random rows per V (edge_rows adds the 9 edge rows)


# ----------------------------------------------------------------------------- oracles
def selection_probabilities(p, q, draws):
    """P(select draft i) for one ordered tuple of first tokens: ``w_i / sum w`` with
    ``w = q / p`` (the tokens drawn have ``p > 0``), uniform when every ``w`` is 0."""
    w = np.array([q[x] / p[x] for x in draws])
    total = w.sum()
    return w / total if total > 0 else np.full(len(draws), 1.0 / len(draws))


def literal_selection_law(p, q, num_drafts):
    """The law of the selected token, summed over every ordered tuple of ``M`` drafts from
    ``p`` (with its probability) and every selected index."""
    support = [int(y) for y in np.nonzero(p > 0)[0]]
    r = np.zeros(len(p))
    for draws in itertools.product(support, repeat=num_drafts):
        prob = float(np.prod(p[list(draws)]))
        for x, chosen in zip(draws, selection_probabilities(p, q, draws)):
            r[x] += prob * chosen
    return r


def literal_root(p, q, num_drafts):
    """Importance-weighted selection then SD, written out: every ordered tuple of ``M`` drafts
    and every selected index; the selected token ``y`` is accepted with
    ``min(1, q(y) / r(y))`` (``r`` from ``literal_selection_law``), otherwise the token is drawn
    from ``[q - r]_+`` normalised. Returns the joint law of (token, accepted): ``(accepted,
    rejected)``, each ``(V,)``."""
    r = literal_selection_law(p, q, num_drafts)
    accept = np.minimum(1.0, q / np.where(r > 0, r, 1.0))
    support = [int(y) for y in np.nonzero(p > 0)[0]]
    accepted = np.zeros(len(p))
    reject = 0.0
    for draws in itertools.product(support, repeat=num_drafts):
        prob = float(np.prod(p[list(draws)]))
        for x, chosen in zip(draws, selection_probabilities(p, q, draws)):
            accepted[x] += prob * chosen * accept[x]
            reject += prob * chosen * (1.0 - accept[x])
    return accepted, reject * ref.positive_part(q - r)


def _library_values(p, q):
    out = []
    for m in DRAFTS:
        law = importance_weighted_root_law(p, q, m)
        out.append((law.accepted, law.rejected, importance_selection_law(p, q, m),
                    specjax.optimal_acceptance(p, q, num_drafts=m),
                    1 - jnp.sum(specjax.decoders.batch_residual_mass(p, q, num_drafts=m), axis=-1)))
    return out


_library_program = jax.jit(_library_values)


def library(p, q):
    """``{M: (accepted, rejected, r, alpha*, batch SD's acceptance)}`` (NumPy float64)."""
    out = _library_program(jnp.asarray(p), jnp.asarray(q))
    return {m: tuple(np.asarray(a) for a in v) for m, v in zip(DRAFTS, out)}


# ----------------------------------------------------------------------------- 1. literal root
@pytest.mark.parametrize("num_states", [2, 3, 4, 5])
def test_root_law_equals_the_literal_selection_then_sd(x64, num_states):
    """V = 2..5, M = 1, 2, 3, on 12 random rows with zeros and the 9 edge rows (zeros in p
    or q or both, disjoint supports, p = q, one-hot rows, ties of q / p): the enumerated literal
    scheme (its own selection law) has the library's joint law of (token, accepted) and the
    library's ``r`` to 1e-12; its token law is ``q`` (lossless); ``M = 1`` has ``r = p``.
    The library's own identities are checked on all 60 random rows: at V = 2 and 4 the shapes
    of test_acceptance_is_bounded_by_the_optimum, whose compiled program this shares."""
    p, q = edge_rows(1300 + num_states, num_states, BOUND_ROWS)
    rows = list(range(12)) + list(range(BOUND_ROWS, BOUND_ROWS + len(EDGE)))
    for m, (accepted, rejected, r, _, _) in library(p, q).items():
        np.testing.assert_allclose(accepted + rejected, q, rtol=0, atol=1e-15)
        np.testing.assert_allclose(r.sum(-1), 1, rtol=0, atol=TIGHT)
        assert (accepted >= 0).all() and (rejected >= 0).all() and (r >= 0).all()
        if m == 1:
            np.testing.assert_array_equal(r, p)
        for row in rows:
            what = f"M = {m}, p {p[row]}, q {q[row]}"
            acc, rej = literal_root(p[row], q[row], m)
            np.testing.assert_allclose(literal_selection_law(p[row], q[row], m), r[row],
                                       rtol=0, atol=TIGHT, err_msg=what)
            np.testing.assert_allclose(acc, accepted[row], rtol=0, atol=TIGHT, err_msg=what)
            np.testing.assert_allclose(rej, rejected[row], rtol=0, atol=TIGHT, err_msg=what)
            np.testing.assert_allclose(acc + rej, q[row], rtol=0, atol=TIGHT, err_msg=what)


def test_selection_law_closed_cases(x64):
    """Hand-checked values: ``p = q`` selects with ``w = 1`` on the drafted tokens, so ``r = p``
    and everything is accepted; ``q = 0`` wherever ``p > 0`` selects uniformly, ``r = p``, and
    nothing is accepted; on ``V = 2`` with ``M = 2``, ``r(0) = p0^2 + 2 p0 p1 w0 / (w0 + w1)``."""
    p = jnp.asarray([[0.2, 0.3, 0.5, 0.0], [0.5, 0.5, 0.0, 0.0]])
    q = jnp.asarray([[0.2, 0.3, 0.5, 0.0], [0.0, 0.0, 0.25, 0.75]])
    for m in (2, 3, 4):
        law = importance_weighted_root_law(p, q, m)
        np.testing.assert_allclose(importance_selection_law(p, q, m), p, rtol=0, atol=TIGHT)
        np.testing.assert_allclose(law.accepted.sum(-1), [1, 0], rtol=0, atol=TIGHT)
    p0, q0 = 0.3, 0.6
    w0, w1 = q0 / p0, (1 - q0) / (1 - p0)
    r0 = p0 ** 2 + 2 * p0 * (1 - p0) * w0 / (w0 + w1)
    r = importance_selection_law(jnp.asarray([p0, 1 - p0]), jnp.asarray([q0, 1 - q0]), 2)
    np.testing.assert_allclose(r, [r0, 1 - r0], rtol=0, atol=TIGHT)


# ----------------------------------------------------------------------------- 2. bounds
@pytest.mark.parametrize("num_states", [2, 4, 7])
def test_acceptance_is_bounded_by_the_optimum(x64, num_states):
    """On 60 random rows with zeros and the 9 edge rows: the acceptance ``sum min(q, r)`` is at
    most ``alpha*`` (``optimal_acceptance``), is ``1 - TV(q, r)``, and equals SD's
    ``sum min(p, q)`` at ``M = 1``; ``p = q`` accepts 1, disjoint supports accept 0.

    Not asserted: batch SD's ``1 - sum w^{M+1}`` (computed here as ``batch``) is neither a
    lower nor an upper bound. On 209 rows with zeros per V = 2, 3, 4, 5, 7 (other seeds) and
    M = 2, 3, 4, between 1 % and 19 % of the rows accepted less than batch SD (by at most
    0.028), the rest as much or more; the mean acceptance was above batch SD's."""
    p, q = edge_rows(1400 + num_states, num_states, BOUND_ROWS)
    values = library(p, q)
    sd = np.minimum(p, q).sum(-1)
    edge = BOUND_ROWS + EDGE["p = q"], BOUND_ROWS + EDGE["disjoint"]
    for m, (accepted, _, r, alpha, _) in values.items():
        total = accepted.sum(-1)
        assert (total <= alpha + TIGHT).all(), (m, (total - alpha).max())
        np.testing.assert_allclose(total, 1 - 0.5 * np.abs(q - r).sum(-1), rtol=0, atol=TIGHT)
        assert abs(total[edge[0]] - 1) < TIGHT, m
        assert abs(total[edge[1]]) < TIGHT, m
    np.testing.assert_allclose(values[1][0].sum(-1), sd, rtol=0, atol=TIGHT)


# ----------------------------------------------------------------------------- 3. sequences
def importance_literal(chooser, draft, target, num_drafts):
    """Importance-weighted multi-draft SD written out (``K = T``): at the root of a call draft
    ``M`` whole sequences up to ``T`` (i.i.d.), select one with probability ``w / sum w`` of its
    first token (``w = q / p``; uniform if every ``w`` is 0), accept its first token ``y`` with
    ``min(1, q(y) / r(y))`` (``r`` the selected token's law, enumerated here); then follow it
    and verify its later tokens by SD until a rejection (resample from ``[q - p]_+``, end the
    call); if the first token is rejected, draw the token from ``[q - r]_+`` (a rejection)."""
    _, p_trans = draft
    q_init, q_trans = target
    horizon = q_trans.shape[0]
    x = [chooser.categorical(q_init)]
    rejected = []
    calls = 0
    while len(x) <= horizon:
        calls += 1
        n0, root = len(x), x[-1]
        p_row, q_row = p_trans[n0 - 1, root], q_trans[n0 - 1, root]
        drafts, _ = ref.draw_drafts(chooser, p_trans, root, n0, num_drafts)
        firsts = [seq[0] for seq in drafts]
        followed = drafts[chooser.categorical(selection_probabilities(p_row, q_row, firsts))]
        r = literal_selection_law(p_row, q_row, num_drafts)
        residual = ref.positive_part(q_row - r)
        y = followed[0]
        # P(reject) = sum [q - r]_+ exactly (r and q are laws); when it is 0, a q(y) / r(y)
        # just below 1 is the enumeration's rounding, and would branch into an empty residual.
        accept = 1.0 if residual.sum() == 0 else min(1.0, q_row[y] / r[y])
        if not chooser.bernoulli(accept):
            x.append(chooser.categorical(residual))
            rejected.append(True)
            continue
        x.append(y)
        rejected.append(False)
        ref.verify_rest(chooser, p_trans, q_trans, x, rejected, followed)
    return tuple(x), tuple(rejected), calls


@pytest.mark.parametrize("num_states, horizon", [(3, 2), (2, 3)])
def test_enumerated_literal_algorithm_equals_the_decoder_and_exact(x64, num_states, horizon):
    """M = 2, every execution path of the literal algorithm (whole drafts, importance
    selection, SD with proposal ``r`` at the root): the output law is the target's, the joint
    law of (tokens, rejected, calls) is the one specjax's per-position laws give, and ``exact``
    has its expected rejections, calls, rejected measure and marginals."""
    draft, target = random_pair(1500 + num_states, num_states, horizon, zero_fraction=0.2)
    result = checks.exact_and_laws(ImportanceWeighted(2), chain(draft), chain(target))
    law = ref.enumerate_law(lambda ch: importance_literal(ch, draft, target, 2))
    assert abs(sum(law.values()) - 1) < TIGHT
    assert_laws_equal(ref.marginalise_tokens(law), ref.target_sequence_law(target), atol=TIGHT)
    bonus = _verify.bonus_law(jnp.asarray(target[1]))
    assert_laws_equal(kernel_law(target[0], result["root"], result["verify"], bonus, horizon),
                      law, atol=TIGHT)
    rejections, calls = ref.expected_counts_from_law(law)
    assert abs(float(result["rejections"]) - rejections) < TIGHT
    assert abs(float(result["calls"]) - calls) < TIGHT
    np.testing.assert_allclose(np.asarray(result["rejected"]),
                               ref.rejected_measure(law, num_states, horizon), atol=TIGHT)
    np.testing.assert_allclose(np.asarray(result["marginals"]), ref.forward_marginals(*target),
                               atol=TIGHT)


# ----------------------------------------------------------------------------- 4. Monte Carlo
def test_sampler_fits_the_exact_law_and_means():
    """200,000 chains of ``decode(ImportanceWeighted(3))`` (V = 3, T = 3, float32) against the
    exact float64 law of (tokens, rejected, calls) from the decoder's per-position laws (equal
    to the enumerated literal algorithm's, above) and the tokens alone against the target's law:
    chi-square, each failing falsely with probability ``stats.ALPHA`` = 1e-5; mean rejections
    and calls within ``stats.Z`` = 4.5 standard errors of ``exact`` (6.8e-6 each). Fixed seed,
    never tuned."""
    decoder = ImportanceWeighted(3)
    pair = random_pair(1600, 3, 3, zero_fraction=0.2)
    law, rejections, calls = checks.exact_outcome_law(decoder, pair)
    checks.assert_decode_fits(jax.random.key(2028), decoder, pair, law, rejections, calls)


# ----------------------------------------------------------------------------- 5. edge cases
EDGE_DRAFTS = (1, 2, 3, 6)
EXACT_EDGE = {"float32": (ImportanceWeighted(2),),
              "float64": (ImportanceWeighted(3, lookahead=2),)}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_values_and_gradients_are_finite_at_edge_cases(dtype):
    """The rows of ``edge_pair`` (p = q, disjoint supports, one-hot rows, zeros, p = 0 where
    q > 0) and the 9 edge rows of ``edge_rows`` (V = 4): the root law's total acceptance
    (M = 1, 2, 3, 6) lies in [0, rows] with finite gradients in p and q, and the exact
    ``E[N_rej]`` of ``ImportanceWeighted`` (M = 2 in float32, M = 3 with lookahead 2 in float64)
    and its gradient in the draft's logits are finite."""
    checks.assert_finite_at_edge_rows(dtype, importance_weighted_root_law, EDGE_DRAFTS,
                                      EXACT_EDGE[dtype], extra_rows=edge_rows(1700, 4, 0))


@jax.jit
def _acceptance_and_gradients(p, q):
    def total(p, q):
        return jnp.sum(importance_weighted_root_law(p, q, 3).accepted)
    return jax.value_and_grad(total, argnums=(0, 1))(p, q)


def test_gradients_equal_finite_differences(x64):
    """At 8 interior rows (V = 4, every entry positive, no ties), M = 3: the gradient of the
    total acceptance in p and q matches central differences (step 1e-6) along random
    directions that keep the rows' sums (to 1e-7)."""
    rng = np.random.default_rng(1800)
    p = rng.dirichlet(np.ones(4), size=8)
    q = rng.dirichlet(np.ones(4), size=8)
    _, (grad_p, grad_q) = _acceptance_and_gradients(jnp.asarray(p), jnp.asarray(q))
    h = 1e-6
    for _ in range(3):
        dp = rng.normal(size=p.shape)
        dq = rng.normal(size=q.shape)
        dp -= dp.mean(-1, keepdims=True)
        dq -= dq.mean(-1, keepdims=True)
        plus, _ = _acceptance_and_gradients(jnp.asarray(p + h * dp), jnp.asarray(q + h * dq))
        minus, _ = _acceptance_and_gradients(jnp.asarray(p - h * dp), jnp.asarray(q - h * dq))
        numeric = (float(plus) - float(minus)) / (2 * h)
        analytic = float(jnp.sum(grad_p * dp) + jnp.sum(grad_q * dq))
        assert abs(numeric - analytic) < 1e-7, (numeric, analytic)


# ----------------------------------------------------------------------------- 6. errors
def test_invalid_arguments_are_refused_naming_them():
    p = jnp.asarray([0.5, 0.5])
    q = jnp.asarray([0.25, 0.75])
    for bad in (0, -1, 1.5, "2", jnp.asarray(2), True, None):
        with pytest.raises(ValueError, match="num_drafts"):
            ImportanceWeighted(bad)
        with pytest.raises(ValueError, match="num_drafts"):
            importance_weighted_root_law(p, q, bad)
        with pytest.raises(ValueError, match="num_drafts"):
            importance_selection_law(p, q, bad)
    with pytest.raises(ValueError, match="num_drafts is a static setting"):
        jax.jit(lambda m: importance_selection_law(p, q, m))(2)
    for call in (lambda: ImportanceWeighted(math.inf),
                 lambda: importance_weighted_root_law(p, q, math.inf),
                 lambda: importance_selection_law(p, q, math.inf)):
        with pytest.raises(ValueError, match="num_drafts = math.inf is not supported"):
            call()
    for bad in (0, -1, 1.5, "2", jnp.asarray(2), True):
        with pytest.raises(ValueError, match="lookahead"):
            ImportanceWeighted(2, lookahead=bad)
    with pytest.raises(ValueError, match="p rows must sum to one"):
        importance_weighted_root_law(jnp.asarray([0.5, 0.6]), q, 2)
    with pytest.raises(ValueError, match="p and q must have the same number of tokens V"):
        importance_weighted_root_law(jnp.asarray([0.2, 0.3, 0.5]), q, 2)


def test_size_refusal_names_num_drafts():
    """``V^M x rows > MAX_IMPORTANCE_ELEMENTS`` is refused before any work, naming
    ``num_drafts`` and the sizes: by the functions, by the decoder's ``check`` and so by
    ``exact`` and ``decode``; ``M = 1`` (no enumeration) and ``V = 1`` never are, and a huge
    ``M`` is refused at once."""
    assert MAX_IMPORTANCE_ELEMENTS == 2**26
    p = jnp.full((2, 10), 0.1)
    with pytest.raises(ValueError, match=r"num_drafts = 8 .* 10\^8 x 2 = "):
        importance_selection_law(p, p, 8)
    with pytest.raises(ValueError, match="num_drafts = 8"):
        importance_weighted_root_law(p, p, 8)
    importance_selection_law(p[:1], p[:1], 7)  # 10^7 x 1 elements: allowed
    with pytest.raises(ValueError, match="num_drafts = 1048576 .* more than"):
        ImportanceWeighted(2**20).check(2, 1)
    ImportanceWeighted(1).check(10**6, 10**9)
    ImportanceWeighted(2**20).check(1, 10**6)
    draft, target = random_pair(1900, 3, 2)
    with pytest.raises(ValueError, match=r"num_drafts = 16 .* 3\^16 x 6 = "):
        specjax.exact(ImportanceWeighted(16), chain(draft), chain(target))
    with pytest.raises(ValueError, match="num_drafts = 16"):
        specjax.decode(jax.random.key(0), ImportanceWeighted(16), chain(draft), chain(target),
                       4)


def test_label_and_pytree():
    decoder = ImportanceWeighted(3, lookahead=2)
    assert decoder.label == "importance-weighted, M = 3, K = 2"
    assert ImportanceWeighted(2).label == "importance-weighted, M = 2"
    assert jax.tree_util.tree_leaves(decoder) == []
    assert not decoder.same_root and isinstance(decoder, specjax.TokenwiseDecoder)
