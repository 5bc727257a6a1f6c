"""SpecTr's k-sequential selection (``KSequential``, ``k_sequential_root_law``) against
independent oracles, in float64 unless said otherwise:

* a literal transcription in NumPy (every ordered tuple of ``M`` i.i.d. drafts, tried in turn
  with ``min(1, q / (rho p))`` at the library's ``rho``, then the residual ``q - a`` with ``a``
  from the closed form written out here) has the library's joint law of (token, accepted), and
  the token law ``q``;
* ``rho`` lies in ``[1, M]``, is 1 at ``M = 1`` and is minimal (just below it the residual would
  be negative); the acceptance is at most ``optimal_acceptance`` and is SD's at ``M = 1``;
* the literal algorithm on whole sequences, enumerated over every execution path, has the law of
  (tokens, rejected, calls) that specjax samples from and sums exactly (``exact``);
* Monte Carlo of ``decode`` fits that law (chi-square, false-failure rate ``stats.ALPHA`` each)
  and its means fit ``exact`` (``stats.Z`` standard errors);
* finite values and gradients at edge rows, and the argument errors.
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
from conftest import full_suite_only
from conftest import random_pair
from specjax.decoders import verification as _verify
from specjax.decoders.k_sequential import KSequential
from specjax.decoders.k_sequential import k_sequential_rho
from specjax.decoders.k_sequential import k_sequential_root_law
from test_literal_equivalence import assert_laws_equal
from test_literal_equivalence import kernel_law
from test_optimal_multi_draft import EDGE
from test_optimal_multi_draft import ROWS
from test_optimal_multi_draft import edge_rows

TIGHT = 1e-12
DRAFTS = (1, 2, 3)


# ----------------------------------------------------------------------------- oracles
def closed_form(p, q, rho, num_drafts):
    """``a = min(p, q / rho) c`` with ``c = sum_{i < M} (1 - beta)^i`` (the geometric series,
    not the library's ``expm1`` form), in NumPy float64."""
    capped = np.minimum(p, q / rho)
    beta = capped.sum()
    c = sum((1.0 - beta) ** i for i in range(num_drafts))
    return capped * c


def literal_root(p, q, rho, num_drafts):
    """k-sequential selection written out: every ordered tuple of ``M`` drafts from ``p`` with
    its probability; draft ``i`` accepted with ``min(1, q / (rho p))`` if no earlier one was;
    otherwise the residual ``q - a`` (normalised). Returns ``(accepted (V,), rejected (V,),
    q - a)``: the joint law of (token, accepted) and the residual's un-normalised masses."""
    support = [int(y) for y in np.nonzero(p > 0)[0]]
    accept = np.minimum(1.0, q / (rho * np.where(p > 0, p, 1.0)))
    accepted = np.zeros(len(p))
    none = 0.0
    for draws in itertools.product(support, repeat=num_drafts):
        alive = float(np.prod(p[list(draws)]))
        for x in draws:
            accepted[x] += alive * accept[x]
            alive *= 1.0 - accept[x]
        none += alive
    residual = q - closed_form(p, q, rho, num_drafts)
    return accepted, none * ref.positive_part(residual), residual


def _library_values(p, q):
    out = []
    for m in DRAFTS:
        law = k_sequential_root_law(p, q, m)
        out.append((law.accepted, law.rejected, k_sequential_rho(p, q, m)[..., 0],
                    specjax.optimal_acceptance(p, q, num_drafts=m),
                    1 - jnp.sum(specjax.decoders.batch_residual_mass(p, q, num_drafts=m), axis=-1)))
    return out


_library_program = jax.jit(_library_values)


def library(p, q):
    """``{M: (accepted, rejected, rho, alpha*, batch SD's acceptance)}`` (NumPy float64)."""
    out = _library_program(jnp.asarray(p), jnp.asarray(q))
    return {m: tuple(np.asarray(a) for a in v) for m, v in zip(DRAFTS, out)}


# ----------------------------------------------------------------------------- 1. literal root
@pytest.mark.parametrize("num_states", [2, 3, 4])
def test_root_law_equals_the_literal_sequential_selection(x64, num_states):
    """V = 2, 3, 4, M = 1, 2, 3, on 12 random rows with zeros and the 9 edge rows (zeros in p
    or q, p = q, disjoint supports, one-hot rows, ties of q / p): the enumerated literal rule at
    the library's ``rho`` has the library's joint law of (token, accepted) to 1e-12; its token
    law is ``q`` (lossless); the residual ``q - a`` is never negative."""
    p, q = edge_rows(800 + num_states, num_states, ROWS)
    rows = list(range(12)) + list(range(ROWS, ROWS + len(EDGE)))
    for m, (accepted, rejected, rho, _, _) in library(p, q).items():
        np.testing.assert_allclose(accepted + rejected, q, rtol=0, atol=1e-15)
        assert (accepted >= 0).all() and (rejected >= 0).all()
        for row in rows:
            what = f"M = {m}, p {p[row]}, q {q[row]}, rho {rho[row]!r}"
            acc, rej, residual = literal_root(p[row], q[row], rho[row], m)
            assert residual.min() > -TIGHT, f"{what}: residual {residual}"
            np.testing.assert_allclose(acc, accepted[row], rtol=0, atol=TIGHT, err_msg=what)
            np.testing.assert_allclose(rej, rejected[row], rtol=0, atol=TIGHT, err_msg=what)
            np.testing.assert_allclose(acc + rej, q[row], rtol=0, atol=TIGHT, err_msg=what)


# ----------------------------------------------------------------------------- 2. rho, bounds
@pytest.mark.parametrize("num_states", [2, 4, 7])
def test_rho_is_minimal_and_acceptance_is_bounded(x64, num_states):
    """``rho`` in ``[1, M]``, exactly 1 at ``M = 1``; where ``rho > 1``, the closed form at
    ``rho - 1e-6`` has a negative residual (``rho`` is the smallest valid value, so the best of
    any k-sequential rule); the acceptance is ``1 - (1 - beta)^M``, at most ``alpha*``
    (``optimal_acceptance``) and equal to SD's ``sum min(p, q)`` at ``M = 1``. Edge rows:
    ``p = q`` accepts 1 with ``rho = 1``, disjoint supports accept 0. Observed on these rows
    (no proof here): the acceptance is at least batch SD's ``1 - sum w^{M+1}``."""
    p, q = edge_rows(900 + num_states, num_states, 60)
    values = library(p, q)
    sd = np.minimum(p, q).sum(-1)
    edge = 60 + EDGE["p = q"], 60 + EDGE["disjoint"]
    for m, (accepted, _, rho, alpha, batch) in values.items():
        total = accepted.sum(-1)
        assert (rho >= 1).all() and (rho <= m).all(), m
        assert (total <= alpha + TIGHT).all(), (m, (total - alpha).max())
        assert (total >= batch - TIGHT).all(), (m, (batch - total).max())
        assert abs(total[edge[0]] - 1) < TIGHT and rho[edge[0]] == 1, m
        assert abs(total[edge[1]]) < TIGHT, m
        for row in range(p.shape[0]):
            beta = np.minimum(p[row], q[row] / rho[row]).sum()
            assert abs(total[row] - (1 - (1 - beta) ** m)) < TIGHT, (m, row)
            if rho[row] > 1 + 1e-6:
                below = q[row] - closed_form(p[row], q[row], rho[row] - 1e-6, m)
                assert below.min() < -1e-12, (f"M = {m}, p {p[row]}, q {q[row]}: rho "
                                         f"{rho[row]!r} is not minimal")
    np.testing.assert_array_equal(values[1][2], 1.0)
    np.testing.assert_allclose(values[1][0].sum(-1), sd, rtol=0, atol=TIGHT)


# ----------------------------------------------------------------------------- 3. sequences
def k_sequential_literal(chooser, draft, target, num_drafts, rhos):
    """k-sequential multi-draft SD written out (``K = T``): at the root of a call draft ``M``
    whole sequences up to ``T`` (i.i.d.), try their first tokens in turn with
    ``min(1, q / (rho p))`` (``rho = rhos[n, root]``); follow the first accepted draft and verify
    its later tokens by SD until a rejection (resample from ``[q - p]_+``, end the call); if no
    first token is accepted, draw the token from the residual ``q - a`` (a rejection)."""
    _, p_trans = draft
    q_init, q_trans = target
    horizon = q_trans.shape[0]
    x = [chooser.categorical(q_init)]
    rejected = []
    calls = 0
    while len(x) <= horizon:
        calls += 1
        n0, root = len(x), x[-1]
        p_row, q_row, rho = p_trans[n0 - 1, root], q_trans[n0 - 1, root], rhos[n0 - 1, root]
        drafts, _ = ref.draw_drafts(chooser, p_trans, root, n0, num_drafts)
        followed = None
        for seq in drafts:
            if chooser.bernoulli(min(1.0, q_row[seq[0]] / (rho * p_row[seq[0]]))):
                followed = seq
                break
        if followed is None:
            residual = q_row - closed_form(p_row, q_row, rho, num_drafts)
            x.append(chooser.categorical(ref.positive_part(residual)))
            rejected.append(True)
            continue
        x.append(followed[0])
        rejected.append(False)
        ref.verify_rest(chooser, p_trans, q_trans, x, rejected, followed)
    return tuple(x), tuple(rejected), calls


def _exact_and_laws(decoder, draft, target):
    """``checks.exact_and_laws`` with the library's ``rho`` per context."""
    rho = k_sequential_rho(draft.trans, target.trans, decoder.num_drafts)[..., 0]
    return dict(checks.exact_and_laws(decoder, draft, target), rho=rho)


@pytest.mark.parametrize("num_states, horizon", [(3, 2), (2, 3)])
def test_enumerated_literal_algorithm_equals_the_decoder_and_exact(x64, num_states, horizon):
    """M = 2, every execution path of the literal algorithm (whole drafts, the library's
    ``rho`` per context): the output law is the target's, the joint law of (tokens, rejected,
    calls) is the one specjax's per-position laws give, and ``exact`` has its expected
    rejections, calls, rejected measure and marginals."""
    draft, target = random_pair(1000 + num_states, num_states, horizon, zero_fraction=0.2)
    result = _exact_and_laws(KSequential(2), chain(draft), chain(target))
    rhos = np.asarray(result["rho"])
    law = ref.enumerate_law(lambda ch: k_sequential_literal(ch, draft, target, 2, rhos))
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
    """200,000 chains of ``decode(KSequential(3))`` (V = 3, T = 3, float32) against the exact
    float64 law of (tokens, rejected, calls) from the decoder's per-position laws (equal to the
    enumerated literal algorithm's, above) and the tokens alone against the target's law:
    chi-square, each failing falsely with probability ``stats.ALPHA`` = 1e-5; mean rejections
    and calls within ``stats.Z`` = 4.5 standard errors of ``exact`` (6.8e-6 each)."""
    decoder = KSequential(3)
    pair = random_pair(1100, 3, 3, zero_fraction=0.2)
    law, rejections, calls = checks.exact_outcome_law(decoder, pair)
    checks.assert_decode_fits(jax.random.key(2027), decoder, pair, law, rejections, calls)


# ----------------------------------------------------------------------------- 5. edge cases
EXACT_EDGE = {"float32": (KSequential(2),), "float64": (KSequential(3, lookahead=2),)}


@pytest.mark.parametrize("dtype", ["float32", full_suite_only("float64")])
def test_values_and_gradients_are_finite_at_edge_cases(dtype):
    """p = q, disjoint supports, one-hot rows, zeros, p = 0 where q > 0 (``edge_pair``): the
    root law's total acceptance (M = 1, 2, 3, 8) lies in [0, rows] with finite gradients in p and
    q, and the exact ``E[N_rej]`` of ``KSequential`` (M = 2 in float32, M = 3 with lookahead 2
    in float64) and its gradient in the draft's logits are finite."""
    checks.assert_finite_at_edge_rows(dtype, k_sequential_root_law, (1, 2, 3, 8),
                                      EXACT_EDGE[dtype])


# ----------------------------------------------------------------------------- 6. errors
def test_invalid_arguments_are_refused_naming_them():
    p = jnp.asarray([0.5, 0.5])
    q = jnp.asarray([0.25, 0.75])
    for bad in (0, -1, 1.5, "2", jnp.asarray(2), True, None):
        with pytest.raises(ValueError, match="num_drafts"):
            KSequential(bad)
        with pytest.raises(ValueError, match="num_drafts"):
            k_sequential_root_law(p, q, bad)
    with pytest.raises(ValueError, match="num_drafts = math.inf is not defined"):
        KSequential(math.inf)
    with pytest.raises(ValueError, match="num_drafts = math.inf is not defined"):
        k_sequential_root_law(p, q, math.inf)
    for bad in (0, -1, 1.5, "2", jnp.asarray(2), True):
        with pytest.raises(ValueError, match="lookahead"):
            KSequential(2, lookahead=bad)
    with pytest.raises(ValueError, match="p rows must sum to one"):
        k_sequential_root_law(jnp.asarray([0.5, 0.6]), q, 2)
    with pytest.raises(ValueError, match="p and q must have the same number of tokens V"):
        k_sequential_root_law(jnp.asarray([0.2, 0.3, 0.5]), q, 2)


def test_label_and_pytree():
    decoder = KSequential(3, lookahead=2)
    assert decoder.label == "k-sequential, M = 3, K = 2"
    assert KSequential(2).label == "k-sequential, M = 2"
    assert jax.tree_util.tree_leaves(decoder) == []
    assert not decoder.same_root and isinstance(decoder, specjax.TokenwiseDecoder)
