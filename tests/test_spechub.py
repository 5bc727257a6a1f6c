"""SpecHub (``SpecHub``, ``spechub_root_law``) against independent oracles, in float64 unless
said otherwise:

* a literal transcription in NumPy (the pair drawn as written: ``X_1 ~ p``, then the hub or a
  non-hub token; the transport's steps 1-5 run with their running masses, each branch taken with
  its probability), enumerated exactly over every pair and every accept/reject branch, has the
  library's joint law of (token, accepted) and the token law ``q``; so does the closed form
  written out here;
* the acceptance is at least SD's and equals the optimum for SpecHub's own pair law (all
  ``2^V`` token sets), and can exceed the i.i.d. optimum ``optimal_acceptance(M = 2)``;
* gradients of the root law equal central finite differences at interior rows;
* the literal algorithm on whole sequences, enumerated over every execution path, has the
  target's law and the law of (tokens, rejected, calls) that specjax samples from and sums
  exactly (``exact``);
* Monte Carlo of ``decode`` fits that law (chi-square, false-failure rate ``stats.ALPHA`` each)
  and its means fit ``exact`` (``stats.Z`` standard errors);
* finite values and gradients at edge rows, and the argument errors.
"""


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
from specjax.decoders.spechub import SpecHub
from specjax.decoders.spechub import spechub_root_law
from test_literal_equivalence import assert_laws_equal
from test_literal_equivalence import kernel_law
from test_optimal_multi_draft import EDGE
from test_optimal_multi_draft import ROWS
from test_optimal_multi_draft import edge_rows

TIGHT = 1e-12


# ----------------------------------------------------------------------------- oracles
def draw_pair(chooser, p):
    """SpecHub's two first tokens as the rule draws them: ``X_1 ~ p``; ``X_2 = a = argmax p``
    (first index on ties) unless ``X_1 = a``, then ``X_2 ~ p`` off ``a`` (renormalised). When
    ``p(a) = 1`` there is no other token: both drafts are the hub (our edge-case convention)."""
    hub = int(np.argmax(p))
    x1 = chooser.categorical(p)
    if x1 != hub:
        return x1, hub
    rest = np.asarray(p, np.float64).copy()
    rest[hub] = 0.0
    if rest.sum() <= 0:
        return hub, hub
    return hub, chooser.categorical(rest)


class Transport:
    """The verification's steps 1-4 run literally on the running target mass ``t``, with the
    pair masses ``Q_ia``, ``Q_ai`` read off the enumerated pair law (not from a formula):
    ``first[i]`` / ``second[i]`` accept ``i`` in a pair ``(i, a)`` / ``(a, i)``, ``hub_ai`` /
    ``hub_ia`` accept the hub after that, ``residual`` is what is left of ``t``."""

    def __init__(self, p, q):
        v = len(p)
        self.hub = a = int(np.argmax(p))
        pairs = ref.enumerate_law(lambda ch: draw_pair(ch, p))
        q_ia = np.array([pairs.get((i, a), 0.0) if i != a else 0.0 for i in range(v)])
        q_ai = np.array([pairs.get((a, i), 0.0) if i != a else 0.0 for i in range(v)])
        both_hub = pairs.get((a, a), 0.0)  # p(a) = 1: the pair (a, a) has no non-hub token
        t = np.asarray(q, np.float64).copy()
        others = [i for i in range(v) if i != a]
        self.first, self.second = np.zeros(v), np.zeros(v)
        left_ia, left_ai = np.zeros(v), np.zeros(v)
        for i in others:  # step 1: (i, a) pairs take what the target gives i
            if q_ia[i] > 0:
                self.first[i] = min(1.0, t[i] / q_ia[i])
            left_ia[i] = max(0.0, q_ia[i] - t[i])
            t[i] = max(0.0, t[i] - q_ia[i])
        for i in others:  # step 2: (a, i) pairs take what is left at i
            if q_ai[i] > 0:
                self.second[i] = min(1.0, t[i] / q_ai[i])
            left_ai[i] = max(0.0, q_ai[i] - t[i])
            t[i] = max(0.0, t[i] - q_ai[i])
        s_ai = left_ai.sum() + both_hub  # step 3: unmatched (a, i) pairs take the hub
        self.hub_ai = min(1.0, t[a] / s_ai) if s_ai > 0 else 0.0
        t[a] = max(0.0, t[a] - s_ai)
        s_ia = left_ia.sum()  # step 4: unmatched (i, a) pairs take what is left of the hub
        self.hub_ia = min(1.0, t[a] / s_ia) if s_ia > 0 else 0.0
        t[a] = max(0.0, t[a] - s_ia)
        self.residual = t
        self.q_fallback = np.asarray(q, np.float64)

    def verify(self, chooser, pair):
        """(token, rejected) for a drawn pair, branch by branch (step 5: the residual)."""
        x1, x2 = pair
        a = self.hub
        if x1 != a:  # pair (i, a)
            if chooser.bernoulli(self.first[x1]):
                return x1, False
            if chooser.bernoulli(self.hub_ia):
                return a, False
        else:  # pair (a, i), or (a, a) when p(a) = 1
            if x2 != a and chooser.bernoulli(self.second[x2]):
                return x2, False
            if chooser.bernoulli(self.hub_ai):
                return a, False
        # A residual without mass is reached only with a rounding-size probability (e.g.
        # min(1, q(a) / S_ai) = 1 - 1e-16 at p = q): draw from q there instead of dividing by 0.
        residual = self.residual if self.residual.sum() > 0 else self.q_fallback
        return chooser.categorical(residual), True


def literal_root(p, q):
    """The joint law of (token, accepted) of the literal rule, enumerated: ``(accepted (V,),
    rejected (V,), residual t (V,))``."""
    rule = Transport(p, q)
    law = ref.enumerate_law(lambda ch: rule.verify(ch, draw_pair(ch, p)))
    accepted, rejected = np.zeros(len(p)), np.zeros(len(p))
    for (token, was_rejected), pr in law.items():
        (rejected if was_rejected else accepted)[token] += pr
    return accepted, rejected, rule.residual


def closed_form(p, q):
    """The accepted masses in closed form, as stated for the rule (NumPy): ``min(q, p) +
    min([q - p]_+, Q_ai)`` off the hub, ``min(q(a), S_ai) + min([q(a) - S_ai]_+, S_ia)`` at it."""
    a = int(np.argmax(p))
    off = np.arange(len(p)) != a
    rest = p[off].sum()
    q_ai = np.where(off, p[a] * p / rest, 0.0) if rest > 0 else np.zeros(len(p))
    excess = np.where(off, np.maximum(q - p, 0.0), 0.0)
    accepted = np.minimum(q, p) + np.minimum(excess, q_ai)
    s_ai = np.maximum(q_ai - excess, 0.0)[off].sum() if rest > 0 else p[a]
    s_ia = np.maximum(p - q, 0.0)[off].sum()
    accepted[a] = min(q[a], s_ai) + min(max(q[a] - s_ai, 0.0), s_ia)
    return accepted


def pair_optimum(p, q):
    """``1 - max_H [P(pair within H) - q(H)]`` over all ``2^V`` token sets ``H``: the best
    acceptance of any lossless verifier of SpecHub's pair law (its transport LP's value by
    max-flow / min-cut)."""
    pairs = ref.enumerate_law(lambda ch: draw_pair(ch, p))
    v = len(p)
    best = 0.0
    for mask in range(1 << v):
        inside = [(mask >> y) & 1 == 1 for y in range(v)]
        cover = sum(pr for (x1, x2), pr in pairs.items() if inside[x1] and inside[x2])
        best = max(best, cover - q[np.array(inside)].sum())
    return 1.0 - best


def _library_values(p, q):
    law = spechub_root_law(p, q)
    return law.accepted, law.rejected, specjax.optimal_acceptance(p, q, num_drafts=2)


_library_program = jax.jit(_library_values)


def library(p, q):
    """``(accepted, rejected, i.i.d. optimum alpha*(M = 2))`` (NumPy float64)."""
    return tuple(np.asarray(a) for a in _library_program(jnp.asarray(p), jnp.asarray(q)))


# ----------------------------------------------------------------------------- 1. literal root
@pytest.mark.parametrize("num_states", [2, 3, 4, 5])
def test_root_law_equals_the_literal_transport(x64, num_states):
    """V = 2..5, on 12 random rows with zeros and the 9 edge rows (zeros in p or q, p = q,
    disjoint supports, one-hot rows incl. the edge case p(a) = 1, ties of p): the enumerated
    literal rule has the library's joint law of (token, accepted) to 1e-12, its residual ``t``
    equals the library's rejected masses, its token law is ``q`` (lossless), and the closed form
    agrees with both."""
    p, q = edge_rows(1300 + num_states, num_states, ROWS)
    rows = list(range(12)) + list(range(ROWS, ROWS + len(EDGE)))
    accepted, rejected, _ = library(p, q)
    np.testing.assert_allclose(accepted + rejected, q, rtol=0, atol=1e-15)
    assert (accepted >= 0).all() and (rejected >= 0).all()
    for row in rows:
        what = f"p {p[row]}, q {q[row]}"
        acc, rej, residual = literal_root(p[row], q[row])
        np.testing.assert_allclose(acc, accepted[row], rtol=0, atol=TIGHT, err_msg=what)
        np.testing.assert_allclose(rej, rejected[row], rtol=0, atol=TIGHT, err_msg=what)
        np.testing.assert_allclose(residual, rejected[row], rtol=0, atol=TIGHT, err_msg=what)
        np.testing.assert_allclose(acc + rej, q[row], rtol=0, atol=TIGHT, err_msg=what)
        np.testing.assert_allclose(closed_form(p[row], q[row]), acc, rtol=0, atol=TIGHT,
                                   err_msg=what)


def test_hub_edge_case_and_ties():
    """p(a) = 1 is SD on the one-hot draft (the hub accepted with q(a), nothing else); with ties
    in p the hub is the first index (the pair law is not symmetric, so this is visible)."""
    with jax.enable_x64(True):
        q = np.array([0.3, 0.3, 0.4])
        law = spechub_root_law(jnp.asarray([1.0, 0.0, 0.0]), jnp.asarray(q))
        np.testing.assert_allclose(np.asarray(law.accepted), [0.3, 0, 0], rtol=0, atol=TIGHT)
        np.testing.assert_allclose(np.asarray(law.rejected), [0, 0.3, 0.4], rtol=0, atol=TIGHT)
        p = np.array([0.4, 0.4, 0.2])
        q = np.array([0.0, 0.5, 0.5])
        law = spechub_root_law(jnp.asarray(p), jnp.asarray(q))
        np.testing.assert_allclose(np.asarray(law.accepted), literal_root(p, q)[0], rtol=0,
                                   atol=TIGHT)
        np.testing.assert_allclose(np.asarray(law.accepted), closed_form(p, q), rtol=0,
                                   atol=TIGHT)


# ----------------------------------------------------------------------------- 2. bounds
@pytest.mark.parametrize("num_states", [2, 4, 6])
def test_acceptance_is_the_optimum_for_its_pair_law(x64, num_states):
    """40 random rows with zeros and the 9 edge rows: SD's ``sum min(p, q)`` <= SpecHub's
    acceptance = the brute-force optimum for SpecHub's own pair law (every token set) = ``min(1,
    q(a) + sum_{i != a} min(q(i), p(i) + Q_ai(i)))``. (Equality holds in general: token ``i !=
    a`` can be served only by the pairs that contain it, mass ``p(i) + Q_ai(i)``, and the hub by
    at most ``q(a)``; the transport serves every ``i`` fully before the hub, so it meets this
    bound, or accepts everything.) Edge rows: p = q accepts 1, one-hot disjoint rows 0."""
    p, q = edge_rows(1400 + num_states, num_states, 40)
    accepted, _, _ = library(p, q)
    total = accepted.sum(-1)
    sd = np.minimum(p, q).sum(-1)
    assert (total >= sd - TIGHT).all(), (total - sd).min()
    for row in range(p.shape[0]):
        what = (p[row], q[row], total[row])
        assert abs(total[row] - pair_optimum(p[row], q[row])) < TIGHT, what
        a = int(np.argmax(p[row]))
        pairs = ref.enumerate_law(lambda ch, row=row: draw_pair(ch, p[row]))
        served = q[row, a] + sum(min(q[row, i], sum(pr for pair, pr in pairs.items() if i in pair))
                                 for i in range(num_states) if i != a)
        assert abs(total[row] - min(1.0, served)) < TIGHT, what
    assert abs(total[40 + EDGE["p = q"]] - 1) < TIGHT
    assert abs(total[40 + EDGE["one-hot disjoint"]]) < TIGHT


def test_acceptance_can_exceed_the_iid_optimum(x64):
    """The pair is not i.i.d. from p, so the i.i.d. optimum does not bound SpecHub: p = (0.5,
    0.5), q = (1, 0) always drafts both tokens and accepts with probability 1 (the pair law's
    optimum), while two i.i.d. drafts miss token 0 with probability 1/4 (alpha* = 0.75)."""
    p, q = np.array([[0.5, 0.5]]), np.array([[1.0, 0.0]])
    accepted, rejected, iid = library(p, q)
    np.testing.assert_allclose(accepted[0], [1.0, 0.0], rtol=0, atol=TIGHT)
    np.testing.assert_allclose(rejected[0], [0.0, 0.0], rtol=0, atol=TIGHT)
    assert abs(iid[0] - 0.75) < TIGHT
    assert abs(pair_optimum(p[0], q[0]) - 1) < TIGHT


# ----------------------------------------------------------------------------- 3. sequences
def draw_tail(chooser, p_trans, first, start):
    """A draft's later tokens (positions ``start + 1 .. T``) from the draft chain after its first
    token ``first`` (at position ``start``)."""
    tail, prev = [], first
    for t in range(start + 1, p_trans.shape[0] + 1):
        prev = chooser.categorical(p_trans[t - 1, prev])
        tail.append(prev)
    return tail


def spechub_literal(chooser, draft, target, rules):
    """SpecHub written out (``K = T``): at the root of a call draw the pair of first tokens
    (``draw_pair``) and both drafts' whole sequences up to ``T`` (later tokens from the draft
    chain), verify the pair literally (``Transport``; ``rules[n, root]``); follow the draft whose
    first token was accepted and verify its later tokens by SD until a rejection (resample from
    ``[q - p]_+``, end the call); after a rejection at the root the call ends."""
    _, p_trans = draft
    q_init, q_trans = target
    horizon = q_trans.shape[0]
    x = [chooser.categorical(q_init)]
    rejected = []
    calls = 0
    while len(x) <= horizon:
        calls += 1
        n0, root = len(x), x[-1]
        pair = draw_pair(chooser, p_trans[n0 - 1, root])
        drafts = [[first] + draw_tail(chooser, p_trans, first, n0) for first in pair]
        token, was_rejected = rules[n0 - 1, root].verify(chooser, pair)
        x.append(token)
        rejected.append(was_rejected)
        if was_rejected:
            continue
        ref.verify_rest(chooser, p_trans, q_trans, x, rejected, drafts[pair.index(token)])
    return tuple(x), tuple(rejected), calls


def transports(draft, target):
    """``{(n, root): Transport}`` for every row of the models."""
    horizon, num_states, _ = target[1].shape
    return {(n, a): Transport(draft[1][n, a], target[1][n, a])
            for n in range(horizon) for a in range(num_states)}


@pytest.mark.parametrize("num_states, horizon", [(3, 2), (2, 3)])
def test_enumerated_literal_algorithm_equals_the_decoder_and_exact(x64, num_states, horizon):
    """Every execution path of the literal algorithm (whole pairs of drafts): the output law is
    the target's, the joint law of (tokens, rejected, calls) is the one specjax's per-position
    laws give, and ``exact`` has its expected rejections, calls, rejected measure and
    marginals."""
    draft, target = random_pair(1500 + num_states, num_states, horizon, zero_fraction=0.2)
    result = checks.exact_and_laws(SpecHub(), chain(draft), chain(target))
    rules = transports(draft, target)
    law = ref.enumerate_law(lambda ch: spechub_literal(ch, draft, target, rules))
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
    """200,000 chains of ``decode(SpecHub())`` (V = 3, T = 3, float32) against the exact float64
    law of (tokens, rejected, calls) from the decoder's per-position laws (equal to the
    enumerated literal algorithm's, above) and the tokens alone against the target's law:
    chi-square, each failing falsely with probability ``stats.ALPHA`` = 1e-5; mean rejections
    and calls within ``stats.Z`` = 4.5 standard errors of ``exact`` (6.8e-6 each)."""
    decoder = SpecHub()
    pair = random_pair(1600, 3, 3, zero_fraction=0.2)
    law, rejections, calls = checks.exact_outcome_law(decoder, pair)
    checks.assert_decode_fits(jax.random.key(2029), decoder, pair, law, rejections, calls)


def test_gradients_equal_finite_differences(x64):
    """At 6 random dense rows (V = 4, away from kinks: no ties of p, no equalities among the
    masses the rule compares), the root law's directional derivatives along zero-sum directions
    in p and in q equal central finite differences (step 1e-6) to 1e-7."""
    rng = np.random.default_rng(1900)
    p = rng.dirichlet(np.ones(4), size=6)
    q = rng.dirichlet(np.ones(4), size=6)
    law = jax.jit(lambda p, q: spechub_root_law(p, q).accepted)
    for _ in range(3):
        dp = rng.normal(size=p.shape)
        dq = rng.normal(size=q.shape)
        dp -= dp.mean(-1, keepdims=True)
        dq -= dq.mean(-1, keepdims=True)
        _, tangent = jax.jvp(law, (jnp.asarray(p), jnp.asarray(q)),
                             (jnp.asarray(dp), jnp.asarray(dq)))
        h = 1e-6
        numeric = (np.asarray(law(p + h * dp, q + h * dq))
                   - np.asarray(law(p - h * dp, q - h * dq))) / (2 * h)
        np.testing.assert_allclose(np.asarray(tangent), numeric, rtol=0, atol=1e-7)


# ----------------------------------------------------------------------------- 5. edge cases
EXACT_EDGE = {"float32": (SpecHub(),), "float64": (SpecHub(lookahead=2),)}


def _root_law(p, q, num_drafts):
    """``spechub_root_law`` in the shared edge check's signature (``M = 2`` always)."""
    return spechub_root_law(p, q)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_values_and_gradients_are_finite_at_edge_cases(dtype):
    """p = q, disjoint supports, one-hot rows (p(a) = 1 included), zeros, p = 0 where q > 0
    (``edge_pair``), plus ``edge_rows``' edge rows at V = 4: the root law's total acceptance
    lies in [0, rows] with finite gradients in p and q, and the exact ``E[N_rej]`` of
    ``SpecHub`` (K = T in float32, lookahead 2 in float64) and its gradient in the draft's
    logits are finite."""
    checks.assert_finite_at_edge_rows(dtype, _root_law, (2,), EXACT_EDGE[dtype],
                                      extra_rows=edge_rows(1700, 4, 0))


# ----------------------------------------------------------------------------- 6. errors
def test_invalid_arguments_are_refused_naming_them():
    q = jnp.asarray([0.25, 0.75])
    for bad in (0, -1, 1.5, "2", jnp.asarray(2), True):
        with pytest.raises(ValueError, match="lookahead"):
            SpecHub(lookahead=bad)
    with pytest.raises(ValueError, match="lookahead"):
        jax.jit(lambda k: SpecHub(lookahead=k).label)(2)
    with pytest.raises(ValueError, match="p rows must sum to one"):
        spechub_root_law(jnp.asarray([0.5, 0.6]), q)
    with pytest.raises(ValueError, match="p and q must have the same number of tokens V"):
        spechub_root_law(jnp.asarray([0.2, 0.3, 0.5]), q)


def test_label_pytree_and_broadcasting(x64):
    decoder = SpecHub(lookahead=2)
    assert decoder.label == "SpecHub, M = 2, K = 2"
    assert SpecHub().label == "SpecHub, M = 2"
    assert decoder.num_drafts == 2
    assert jax.tree_util.tree_leaves(decoder) == []
    assert not decoder.same_root and isinstance(decoder, specjax.TokenwiseDecoder)
    p, q = edge_rows(1800, 3, 5)
    law = spechub_root_law(jnp.asarray(p[0]), jnp.asarray(q))  # one draft row, many targets
    for row in range(q.shape[0]):
        one = spechub_root_law(jnp.asarray(p[0]), jnp.asarray(q[row]))
        np.testing.assert_array_equal(np.asarray(law.accepted[row]), np.asarray(one.accepted))
