"""The optimal verifier of ``M`` drafts (``optimal_acceptance``, ``OptimalMultiDraft``) against
independent oracles, in float64 unless said otherwise:

* a linear program over couplings of the draft set ``S`` with ``Y ~ q`` (scipy's HiGHS) gives the
  best acceptance, and finds a coupling with exactly the decoder's matched masses;
* the min-cut form ``1 - max_A [P(S within A) - q(A)]`` over all ``2^V`` token sets ``A`` equals
  the library's sorted-prefix form (only conjectured without replacement);
* a literal transcription (whole drafts, the LP's coupling at each call root, SD below it),
  enumerated exactly over every execution path, has the law of (tokens, rejected, calls) that
  specjax samples from and sums exactly;
* Monte Carlo of ``decode`` fits that law (chi-square, false-failure rate ``stats.ALPHA`` each)
  and its means fit ``exact`` (``stats.Z`` standard errors);
* orderings (batch SD <= optimal <= LP, monotone in ``M``), limits, finite values and gradients
  at edge cases, and the argument errors.

Draft sets are bitmasks (token ``y`` is bit ``y``); their law is enumerated in plain NumPy here,
independently of specjax.
"""

import functools
import itertools
import math
from collections import defaultdict

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.optimize import linprog

import decoder_checks as checks
import reference as ref
import specjax
from conftest import chain
from conftest import edge_pair
from conftest import full_suite_only
from conftest import random_pair
from conftest import random_rows
from specjax.decoders import multi_draft
from specjax.decoders import verification as _verify
from test_literal_equivalence import assert_laws_equal
from test_literal_equivalence import kernel_law

TIGHT = 1e-9  # float64 agreement with the linear program and the enumerations
HIGHS = dict(primal_feasibility_tolerance=1e-10, dual_feasibility_tolerance=1e-10)


# ----------------------------------------------------------------------------- oracles
def draft_set_law(p, num_drafts, replacement):
    """``{bitmask of S: P(S)}`` for the first tokens of ``M`` drafts from the row ``p``.

    i.i.d.: every ordered tuple of ``M`` tokens. Without replacement: each draw from ``p``
    restricted to the tokens not drawn yet, renormalised; drawing stops when no mass is left.
    ``math.inf``: ``S`` is the support of ``p`` (both modes, the limit ``M -> infinity``)."""
    p = np.asarray(p, np.float64)
    support = [int(y) for y in np.nonzero(p > 0)[0]]
    if num_drafts == math.inf:
        return {sum(1 << y for y in support): 1.0}
    law = defaultdict(float)
    if replacement:
        for draws in itertools.product(support, repeat=num_drafts):
            law[sum(1 << y for y in set(draws))] += float(np.prod(p[list(draws)]))
        return dict(law)

    def visit(weight, remaining, drawn, stage):
        mass = remaining.sum()
        if stage == num_drafts or mass <= 0:
            law[drawn] += weight
            return
        for y in np.nonzero(remaining > 0)[0]:
            rest = remaining.copy()
            rest[y] = 0.0
            visit(weight * remaining[y] / mass, rest, drawn | (1 << int(y)), stage + 1)

    visit(1.0, p, 0, 0)
    return dict(law)


def members(mask, num_states):
    return np.array([(mask >> y) & 1 for y in range(num_states)], bool)


def coupling_lp(p, q, num_drafts, replacement, matched=None):
    """The linear program over couplings ``x[S, y] >= 0`` of the draft set and the output.

    ``sum_y x[S, y] = P(S)``. Without ``matched``: ``sum_S x[S, y] <= q(y)`` (``<=`` so that
    rounding cannot make it infeasible) and maximise ``P(Y in S) = sum_{y in S} x[S, y]``. With
    ``matched``: ``sum_S x[S, y] = q(y)`` and ``sum_{S contains y} x[S, y] = matched(y)``, a
    feasibility problem. Returns ``(scipy result, masks, inside (num_sets, V) bool)``."""
    num_states = len(q)
    law = draft_set_law(p, num_drafts, replacement)
    masks = list(law)
    probs = np.array([law[m] for m in masks])
    inside = np.stack([members(m, num_states) for m in masks])
    num_sets = len(masks)
    per_set = np.kron(np.eye(num_sets), np.ones(num_states))  # sum over y of x[S, .]
    per_token = np.kron(np.ones(num_sets), np.eye(num_states))  # sum over S of x[., y]
    accepted = inside.reshape(-1).astype(np.float64)
    if matched is None:
        result = linprog(-accepted, A_ub=per_token, b_ub=q, A_eq=per_set, b_eq=probs,
                         bounds=(0, None), method="highs", options=HIGHS)
    else:
        a_eq = np.concatenate([per_set, per_token, per_token * accepted])
        b_eq = np.concatenate([probs, q, matched])
        result = linprog(np.zeros(num_sets * num_states), A_eq=a_eq, b_eq=b_eq,
                         bounds=(0, None), method="highs", options=HIGHS)
    return result, masks, inside


def lp_acceptance(p, q, num_drafts, replacement):
    result, _, _ = coupling_lp(p, q, num_drafts, replacement)
    assert result.status == 0, result.message
    return -result.fun


def cover_of_every_set(p, num_drafts, replacement):
    """``P(S within A)`` for every ``A`` (bitmask ``0 .. 2^V - 1``) from the enumerated law."""
    law = draft_set_law(p, num_drafts, replacement)
    masks = np.array(list(law), np.int64)
    probs = np.array(list(law.values()))
    every = np.arange(2 ** len(p), dtype=np.int64)
    within = (masks[None, :] & ~every[:, None]) == 0
    return every, within @ probs


def min_cut_acceptance(p, q, num_drafts, replacement):
    """``1 - max_A [P(S within A) - q(A)]`` over all ``2^V`` token sets ``A``."""
    every, cover = cover_of_every_set(p, num_drafts, replacement)
    in_a = (every[:, None] >> np.arange(len(q))[None, :]) & 1
    return 1.0 - np.max(cover - in_a @ q)


def edge_rows(seed, num_states, count):
    """``count`` random rows with zeros, then the edge rows: zeros in p only, in q only, in
    both, disjoint supports, p = q, one-hot rows, proportional rows (ties of ``q / p``)."""
    rng = np.random.default_rng(seed)
    p = random_rows(rng, (count, num_states), zero_fraction=0.3, concentration=0.7)
    q = random_rows(rng, (count, num_states), zero_fraction=0.3, concentration=0.7)
    v = num_states
    extra_p, extra_q = [], []
    dense_p, dense_q = rng.dirichlet(np.ones(v)), rng.dirichlet(np.ones(v))
    zp = dense_p.copy()
    zp[0] = 0.0
    extra_p.append(zp / zp.sum())  # zero in p only (q > 0 there)
    extra_q.append(dense_q)
    zq = dense_q.copy()
    zq[-1] = 0.0
    extra_p.append(dense_p)  # zero in q only
    extra_q.append(zq / zq.sum())
    both_p, both_q = dense_p.copy(), dense_q.copy()
    both_p[v // 2] = both_q[v // 2] = 0.0
    extra_p.append(both_p / both_p.sum())  # zero in both
    extra_q.append(both_q / both_q.sum())
    half = max(v // 2, 1)
    dp, dq = np.zeros(v), np.zeros(v)
    dp[:half], dq[half:] = 1.0 / half, 1.0 / (v - half)
    extra_p.append(dp)  # disjoint supports
    extra_q.append(dq)
    extra_p.append(dense_p)  # p = q
    extra_q.append(dense_p.copy())
    extra_p.append(np.eye(v)[0])  # one-hot, disjoint
    extra_q.append(np.eye(v)[v - 1])
    extra_p.append(np.eye(v)[0])  # one-hot draft, spread target
    extra_q.append(dense_q)
    extra_p.append(np.full(v, 1.0 / v))  # ties: q proportional to p on a subset
    tie = np.zeros(v)
    tie[: half] = 1.0 / half
    extra_q.append(tie)
    grid = np.array([3, 1, 2, 2, 1, 3, 1][:v], np.float64)  # repeated values: ties in q / p
    extra_p.append(grid / grid.sum())
    extra_q.append(grid[::-1] / grid[::-1].sum())
    return np.concatenate([p, np.array(extra_p)]), np.concatenate([q, np.array(extra_q)])


def prefix_acceptance(p, q, num_drafts, replacement, rng):
    """The sorted-prefix form written out in NumPy: sort by ``q / p`` ascending (``+inf`` where
    ``p = 0 < q``), ties broken at random, then ``1 - max_k [P(S within the first k) - q(first
    k)]`` with ``P(S within .)`` from the enumerated draft-set law."""
    ratio = np.where(p > 0, q / np.where(p > 0, p, 1.0), np.where(q > 0, np.inf, 0.0))
    order = np.lexsort((rng.random(len(p)), ratio))
    every, cover = cover_of_every_set(p, num_drafts, replacement)
    prefixes = [sum(1 << int(y) for y in order[:k]) for k in range(len(p) + 1)]
    q_prefix = np.concatenate([[0.0], np.cumsum(q[order])])
    return 1.0 - np.max(cover[prefixes] - q_prefix)


# ------------------------------------------------------- the library's values, compiled once
# Every test of single rows evaluates the library on ROWS + 9 rows per V through one compiled
# program of every setting (a program per setting, or eager evaluation, costs several times more
# compilation than the checks themselves). Under the caller's jit the library skips its checks
# on probability values; the error tests below call it directly.
SETTINGS = tuple((m, r) for r in (True, False) for m in (1, 2, 3, math.inf))
# At V = 7 the size check refuses M = infinity without replacement for more than 81 rows
# (V^V x rows > 2^26) although that case is computed in closed form; it is covered at V <= 5.
SETTINGS_7 = tuple(s for s in SETTINGS if s != (math.inf, False)) + ((4, True), (4, False))
ROWS = 31  # random rows per V (edge_rows adds 9 edge rows)
EDGE = {"zero in p": 0, "zero in q": 1, "zero in both": 2, "disjoint": 3, "p = q": 4,
        "one-hot disjoint": 5, "one-hot draft": 6, "proportional": 7, "ties": 8}


def _library_values(p, q, settings):
    out = []
    for m, r in settings:
        law = multi_draft.optimal_root_law(p, q, m, r)
        if r:
            batch = 1 - jnp.sum(specjax.decoders.batch_residual_mass(p, q, num_drafts=m), axis=-1)
        else:
            batch = jnp.sum(multi_draft.batch_without_replacement_root_law(p, q, m).accepted, -1)
        out.append((specjax.optimal_acceptance(p, q, num_drafts=m, replacement=r),
                    law.accepted, law.rejected, batch))
    return out


_library_program = jax.jit(_library_values, static_argnums=2)


def library(p, q, settings=SETTINGS):
    """``{(M, replacement): (alpha*, accepted, rejected, batch SD's acceptance)}`` (NumPy)."""
    out = _library_program(jnp.asarray(p), jnp.asarray(q), settings)
    return {s: tuple(np.asarray(a) for a in v) for s, v in zip(settings, out)}


def checked_rows(count=4):
    """The first ``count`` random rows and the 9 edge rows of an ``edge_rows(., ., ROWS)``."""
    return list(range(count)) + list(range(ROWS, ROWS + len(EDGE)))


# ----------------------------------------------------------------------------- 1. the LP value
@pytest.mark.parametrize("num_states", [2, 3, 4, 5])
def test_optimal_acceptance_equals_the_coupling_linear_program(x64, num_states):
    """HiGHS's optimum of the coupling LP equals ``alpha*`` to 1e-9: M = 1, 2, 3, i.i.d. and
    without replacement, 4 random rows with zeros and the 9 edge rows."""
    p, q = edge_rows(100 + num_states, num_states, ROWS)
    values = library(p, q)
    for (num_drafts, replacement), (alpha, *_) in values.items():
        if num_drafts == math.inf:
            continue
        for row in checked_rows():
            want = lp_acceptance(p[row], q[row], num_drafts, replacement)
            assert abs(alpha[row] - want) < TIGHT, (
                f"M = {num_drafts}, replacement {replacement}, row {row}: p {p[row]}, "
                f"q {q[row]}: optimal_acceptance {alpha[row]:.12f}, LP {want:.12f}")


# ----------------------------------------------------------------------------- 2. min-cut, every A
@pytest.mark.parametrize("replacement", [True, False])
def test_sorted_prefix_claim_holds_against_every_token_set(replacement):
    """The claim itself, in NumPy: for V = 2..7 and M = 1..4 and infinity, on 40 random rows
    with zeros and the edge rows per V, the maximum of ``P(S within A) - q(A)`` over all ``2^V``
    sets ``A`` is attained at a prefix of the tokens sorted by ``q / p``, whatever the order
    within ties (broken at random)."""
    rng = np.random.default_rng(1)
    for num_states in range(2, 8):
        p, q = edge_rows(200 + num_states, num_states, 40)
        for num_drafts in (1, 2, 3, 4, math.inf):
            for row in range(p.shape[0]):
                want = min_cut_acceptance(p[row], q[row], num_drafts, replacement)
                got = prefix_acceptance(p[row], q[row], num_drafts, replacement, rng)
                assert abs(got - want) < 1e-12, (
                    f"V = {num_states}, M = {num_drafts}, replacement {replacement}, "
                    f"p {p[row]}, q {q[row]}: best prefix {got:.12f}, every set {want:.12f}")


def test_optimal_acceptance_equals_the_minimum_cut_over_every_token_set(x64):
    """The library against all ``2^7`` sets on 91 random rows with zeros (effective supports
    of every size) and the edge rows, V = 7, M = 1, 2, 3, 4, both modes, and infinity."""
    p, q = edge_rows(250, 7, 91)
    values = library(p, q, SETTINGS_7)
    for (num_drafts, replacement), (alpha, *_) in values.items():
        for row in range(p.shape[0]):
            want = min_cut_acceptance(p[row], q[row], num_drafts, replacement)
            assert abs(alpha[row] - want) < TIGHT, (
                f"M = {num_drafts}, replacement {replacement}, p {p[row]}, q {q[row]}: "
                f"optimal_acceptance {alpha[row]:.12f}, every set {want:.12f}")


@pytest.mark.parametrize("num_states, count", [(3, ROWS), (5, ROWS), (7, 91)])
def test_matched_masses_are_a_maximal_point_of_the_polymatroid(x64, num_states, count):
    """``0 <= m <= q``, ``rejected = q - m``, ``m(G) <= P(S meets G)`` for every token set
    ``G`` (Hall's condition for matching ``m`` into the draft sets) and ``sum m = alpha*``."""
    p, q = edge_rows(300 + num_states, num_states, count)
    everything = (2 ** num_states) - 1
    settings = SETTINGS_7 if num_states == 7 else SETTINGS
    for (num_drafts, replacement), (alpha, accepted, rejected, _) in library(p, q,
                                                                            settings).items():
        what = f"V = {num_states}, M = {num_drafts}, replacement {replacement}"
        np.testing.assert_allclose(accepted.sum(-1), alpha, rtol=0, atol=TIGHT, err_msg=what)
        np.testing.assert_allclose(accepted + rejected, q, rtol=0, atol=1e-15, err_msg=what)
        assert (accepted >= 0).all() and (rejected >= 0).all(), what
        for row in range(p.shape[0]):
            every, cover = cover_of_every_set(p[row], num_drafts, replacement)
            in_g = (every[:, None] >> np.arange(num_states)[None, :]) & 1
            meets = 1.0 - cover[everything ^ every]  # 1 - P(S within the complement of G)
            slack = meets - in_g @ accepted[row]
            assert slack.min() > -TIGHT, (
                f"{what}: m(G) exceeds P(S meets G) by {-slack.min():.3g} for p {p[row]}, "
                f"q {q[row]}, m {accepted[row]}")


# ----------------------------------------------------------------------------- 3. realisable
def realising_coupling(p, q, num_drafts, replacement, matched):
    """The LP's coupling with the given matched masses: ``({mask: x[S, :]}, inside)``."""
    result, masks, inside = coupling_lp(p, q, num_drafts, replacement, matched=matched)
    assert result.status == 0, (f"no coupling of S and Y ~ q with matched masses {matched} "
                                f"(p {p}, q {q}, M = {num_drafts}): {result.message}")
    x = result.x.reshape(len(masks), len(q))
    return dict(zip(masks, x)), inside


@pytest.mark.parametrize("num_states", [2, 3, 4, 5])
def test_root_law_is_realised_by_a_coupling_of_the_drafts(x64, num_states):
    """An LP finds ``x[S, y] >= 0`` with margins ``P(S)`` and ``q`` whose matched masses are
    exactly the decoder's ``accepted``; the joint law of (token, accepted) read off that coupling
    by enumerating the draft sets is the decoder's root law (M = 1, 2, 3, both modes)."""
    p, q = edge_rows(400 + num_states, num_states, ROWS)
    for (num_drafts, replacement), (_, accepted, rejected, _) in library(p, q).items():
        if num_drafts == math.inf:
            continue
        for row in checked_rows():
            coupling, inside = realising_coupling(p[row], q[row], num_drafts, replacement,
                                                  accepted[row])
            x = np.stack(list(coupling.values()))
            law = draft_set_law(p[row], num_drafts, replacement)
            assert x.min() >= -HIGHS["primal_feasibility_tolerance"]
            np.testing.assert_allclose(x.sum(-1), [law[m] for m in coupling], atol=TIGHT)
            np.testing.assert_allclose((x * inside).sum(0), accepted[row], atol=TIGHT)
            np.testing.assert_allclose((x * ~inside).sum(0), rejected[row], atol=TIGHT)


# ----------------------------------------------------------------------------- 4. literal
def optimal_literal(chooser, draft, target, couplings, num_drafts, replacement):
    """Multi-draft SD with an optimal root coupling, written out: at the root of a call draft
    ``M`` whole sequences up to ``T`` (first tokens i.i.d. or without replacement), draw the
    output ``Y`` from the coupling's row ``x[S, :]`` of the draft set ``S``; if ``Y`` is in ``S``
    follow the first draft starting with ``Y`` and verify its later tokens by SD until a
    rejection (resample from ``[q - p]_+``, end the call); otherwise ``Y`` is a rejection."""
    _, p_trans = draft
    q_init, q_trans = target
    horizon = q_trans.shape[0]
    x = [chooser.categorical(q_init)]
    rejected = []
    calls = 0
    while len(x) <= horizon:
        calls += 1
        n0, root = len(x), x[-1]
        drafts, _ = ref.draw_drafts(chooser, p_trans, root, n0, num_drafts, replacement)
        mask = sum(1 << y for y in {seq[0] for seq in drafts})
        y = chooser.categorical(np.maximum(couplings[n0 - 1, root][mask], 0.0))
        x.append(y)
        if not mask >> y & 1:
            rejected.append(True)
            continue
        rejected.append(False)
        followed = next(seq for seq in drafts if seq[0] == y)
        ref.verify_rest(chooser, p_trans, q_trans, x, rejected, followed)
    return tuple(x), tuple(rejected), calls


@jax.jit
def _exact_and_laws(decoders, draft, target):
    """``exact``'s values and the per-position laws of every decoder (one compilation)."""
    out = []
    for decoder in decoders:
        e = specjax.exact(decoder, draft, target)
        root, verify = decoder.laws(draft.trans, target.trans)
        out.append(dict(rejections=e.expected_rejections, calls=e.expected_calls,
                        rejected=e.rejected, marginals=e.marginals, root=root, verify=verify))
    return out


LITERAL_SHAPES = [(3, 2), (2, 3)]


@pytest.mark.parametrize("num_states, horizon", LITERAL_SHAPES)
def test_enumerated_literal_algorithm_equals_the_decoder_and_exact(x64, num_states, horizon):
    """M = 2, both modes, every execution path of the literal algorithm with the LP's coupling
    (realising the decoder's root law) at every call root: the output law is the target's, the
    joint law of (tokens, rejected, calls) is the one specjax's per-position laws give, and
    ``exact`` has its expected rejections, calls, rejected measure and marginals."""
    draft, target = random_pair(500 + num_states, num_states, horizon, zero_fraction=0.2)
    decoders = (specjax.OptimalMultiDraft(2), specjax.OptimalMultiDraft(2, replacement=False))
    results = _exact_and_laws(decoders, chain(draft), chain(target))
    bonus = _verify.bonus_law(jnp.asarray(target[1]))
    for decoder, result in zip(decoders, results):
        accepted = np.asarray(result["root"].accepted)
        couplings = {}
        for n, a in itertools.product(range(horizon), range(num_states)):
            couplings[n, a], _ = realising_coupling(draft[1][n, a], target[1][n, a], 2,
                                                    decoder.replacement, accepted[n, a])
        law = ref.enumerate_law(lambda ch: optimal_literal(ch, draft, target, couplings, 2,
                                                           decoder.replacement))
        assert abs(sum(law.values()) - 1) < TIGHT
        assert_laws_equal(ref.marginalise_tokens(law), ref.target_sequence_law(target),
                          atol=TIGHT)
        assert_laws_equal(kernel_law(target[0], result["root"], result["verify"], bonus,
                                     horizon), law, atol=TIGHT)
        rejections, calls = ref.expected_counts_from_law(law)
        assert abs(float(result["rejections"]) - rejections) < TIGHT, decoder.label
        assert abs(float(result["calls"]) - calls) < TIGHT, decoder.label
        np.testing.assert_allclose(np.asarray(result["rejected"]),
                                   ref.rejected_measure(law, num_states, horizon), atol=TIGHT)
        np.testing.assert_allclose(np.asarray(result["marginals"]),
                                   ref.forward_marginals(*target), atol=TIGHT)


# ----------------------------------------------------------------------------- 5. Monte Carlo
# M = 2 and 3, each with and without replacement, two of them with lookahead 2. tests/
# sampler_cases.py runs OptimalMultiDraft(3) and (2, replacement=False, lookahead=2) through
# every entry point and layout (that they run and agree with each other), not against a law.
MC_CASES = (  # OptimalMultiDraft(3, lookahead=2) runs in tests/sampler_cases.py's CASES
    specjax.OptimalMultiDraft(2),
    specjax.OptimalMultiDraft(2, replacement=False, lookahead=2),
)
MC_PAIR = random_pair(600, 3, 3, zero_fraction=0.2)


@pytest.mark.parametrize("decoder", MC_CASES, ids=lambda d: d.label)
def test_sampler_fits_the_exact_law_and_means(decoder):
    """200,000 chains of ``decode`` (V = 3, T = 3, float32) against the exact float64 law of
    (tokens, rejected, calls) from the decoder's per-position laws (equal to the enumerated
    literal algorithm's, above) and the tokens alone against the target's law: chi-square, each
    failing falsely with probability ``stats.ALPHA`` = 1e-5; mean rejections and calls within
    ``stats.Z`` = 4.5 standard errors of ``exact`` (6.8e-6 each). Two cases: a family-wise
    false-failure rate below 7e-5."""
    law, rejections, calls = checks.exact_outcome_law(decoder, MC_PAIR)
    checks.assert_decode_fits(jax.random.key(2026), decoder, MC_PAIR, law, rejections, calls)


# ----------------------------------------------------------------------------- 6. orderings
@pytest.mark.parametrize("num_states", [2, 3, 4, 5])
def test_orderings_limits_and_closed_forms(x64, num_states):
    """``M = 1`` is SD's ``sum min(p, q)``; batch SD (i.i.d., and recursive rejection sampling
    without replacement) accepts at most ``alpha*``; ``alpha*`` is nondecreasing in ``M`` up to
    its limit ``q(p > 0)`` (``M = infinity``, and ``M >= V`` without replacement); drafts without
    replacement accept at least as much as i.i.d. ones (``P(S within A)`` is smaller). Edge rows:
    ``p = q`` accepts 1, disjoint supports 0, a one-hot draft at token 0 accepts ``q(0)``."""
    p, q = edge_rows(700 + num_states, num_states, ROWS)
    values = library(p, q)
    sd = np.minimum(p, q).sum(-1)
    limit = np.where(p > 0, q, 0).sum(-1)
    slack = 1e-12  # rounding: the forms differ in their order of summation
    for replacement in (True, False):
        alphas = [values[m, replacement][0] for m in (1, 2, 3, math.inf)]
        np.testing.assert_allclose(alphas[0], sd, rtol=0, atol=slack)
        np.testing.assert_allclose(alphas[-1], limit, rtol=0, atol=slack)
        for m, smaller, larger in zip((1, 2, 3), alphas, alphas[1:]):
            assert (larger >= smaller - slack).all(), (m, replacement)
        for m in (1, 2, 3, math.inf):
            alpha, _, _, batch = values[m, replacement]
            assert (alpha >= batch - slack).all(), (m, replacement, (batch - alpha).max())
            assert (alpha <= limit + slack).all()
            if not replacement and m >= num_states:
                np.testing.assert_allclose(alpha, limit, rtol=0, atol=slack)
            assert abs(alpha[ROWS + EDGE["p = q"]] - 1) < slack
            assert abs(alpha[ROWS + EDGE["disjoint"]]) < slack
            assert abs(alpha[ROWS + EDGE["one-hot disjoint"]]) < slack
            row = ROWS + EDGE["one-hot draft"]
            assert abs(alpha[row] - q[row, 0]) < slack
            np.testing.assert_allclose(values[m, replacement][1][row], q[row] * np.eye(
                num_states)[0], rtol=0, atol=slack)
    for m in (2, 3):
        assert (values[m, False][0] >= values[m, True][0] - slack).all()


def _rejections_of(decoders, init, draft_trans, target_trans):
    def one(decoder, d, t):
        return specjax.exact(decoder, specjax.MarkovChain(init, d),
                             specjax.MarkovChain(init, t)).expected_rejections
    return jnp.stack([jax.vmap(functools.partial(one, decoder))(draft_trans, target_trans)
                      for decoder in decoders])


_rejections_program = jax.jit(_rejections_of, static_argnums=0)


COUNTEREXAMPLE = (
    np.array([[[0.24, 0.58, 0.18], [0.0, 1.0, 0.0], [0.96, 0.04, 0.0]],
              [[0.3, 0.36, 0.34], [0.02, 0.1, 0.88], [0.09, 0.03, 0.88]],
              [[0.0, 0.77, 0.23], [0.94, 0.06, 0.0], [0.09, 0.91, 0.0]]]),
    np.array([[[0.67, 0.01, 0.32], [0.61, 0.39, 0.0], [0.97, 0.03, 0.0]],
              [[0.47, 0.52, 0.01], [0.01, 0.0, 0.99], [0.44, 0.0, 0.56]],
              [[0.22, 0.01, 0.78], [0.97, 0.01, 0.01], [0.78, 0.04, 0.19]]]))


def test_per_token_optimum_can_reject_more_than_batch_sd_over_a_sequence(x64):
    """The root verifier is optimal per token, not over the sequence: matching more at a root
    opens fewer new calls, and a new call's root accepts more than SD inside a call. On this
    chain (V = 3, T = 3, found among 2,000 random Dirichlet(0.3) chains, rounded to two
    decimals and renormalised) every root accepts at least as much as batch SD's, yet
    ``E[N_rej]`` of ``OptimalMultiDraft(2)`` exceeds ``BatchSpeculative(2)``'s by 6.3e-4. The
    sequence-optimal verifier, optimal over every root verifier by Bellman's equation, does not
    (``tests/test_sequence_optimal.py`` checks it against a linear program)."""
    draft_trans, target_trans = (jnp.asarray(a / a.sum(-1, keepdims=True))
                                 for a in COUNTEREXAMPLE)
    init = jnp.full(3, 1 / 3)
    decoders = (specjax.OptimalMultiDraft(2), specjax.BatchSpeculative(2),
                specjax.OptimalMultiDraft(2, sequence_optimal=True))
    best, batch, sequence = np.asarray(_rejections_program(decoders, init, draft_trans[None],
                                                           target_trans[None]))[:, 0]
    assert best - batch > 6e-4, (best, batch)
    assert sequence <= batch + 1e-12, (sequence, batch)
    alpha, batch_alpha = _root_acceptances(draft_trans, target_trans)
    assert (np.asarray(alpha) >= np.asarray(batch_alpha) - 1e-15).all()


@jax.jit
def _root_acceptances(draft_trans, target_trans):
    """``alpha*`` and batch SD's root acceptance, M = 2: one program (eagerly, two dozen)."""
    alpha = specjax.optimal_acceptance(draft_trans, target_trans, num_drafts=2)
    batch_alpha = 1 - specjax.decoders.batch_residual_mass(draft_trans, target_trans,
                                                           num_drafts=2).sum(-1)
    return alpha, batch_alpha


# ----------------------------------------------------------------------------- 7. edge cases
EDGE_SETTINGS = ((1, True), (2, True), (3, True), (math.inf, True), (2, False), (3, False),
                 (math.inf, False))
EXACT_EDGE = {"float32": (specjax.OptimalMultiDraft(2, replacement=False),),
              "float64": (specjax.OptimalMultiDraft(3, lookahead=2),)}


def _edge_values_and_gradients(p, q, logits, target, settings, decoders):
    out = []
    for m, r in settings:
        def total(p, q, m=m, r=r):
            return jnp.sum(specjax.optimal_acceptance(p, q, num_drafts=m, replacement=r))
        value = specjax.optimal_acceptance(p, q, num_drafts=m, replacement=r)
        out.append((value, jax.grad(total, argnums=(0, 1))(p, q)))
    return out + checks.exact_rejections_and_gradients(logits, target, decoders)


_edge_program = jax.jit(_edge_values_and_gradients, static_argnums=(4, 5))


@pytest.mark.parametrize("dtype", ["float32", full_suite_only("float64")])
def test_values_and_gradients_are_finite_at_edge_cases(dtype):
    """p = q, disjoint supports, one-hot rows, zeros, p = 0 where q > 0 (``edge_pair``): the
    values of ``optimal_acceptance`` lie in [0, 1] and its gradients in p and q are finite
    (M = 1, 2, 3, infinity, both modes), and so are the exact ``E[N_rej]`` of an
    ``OptimalMultiDraft`` (M = 2 without replacement in float32, M = 3 with lookahead 2 in
    float64) and its gradient in the draft's logits."""
    with jax.enable_x64(dtype == "float64"):
        draft, target = edge_pair()
        p = jnp.asarray(draft[1].reshape(-1, 4), dtype)
        q = jnp.asarray(target[1].reshape(-1, 4), dtype)
        logits = jnp.log(jnp.asarray(draft[1], dtype))
        t = specjax.MarkovChain(jnp.asarray(target[0], dtype), jnp.asarray(target[1], dtype))
        out = _edge_program(p, q, logits, t, EDGE_SETTINGS, EXACT_EDGE[dtype])
        for (m, r), (value, grads) in zip(EDGE_SETTINGS, out):
            what = f"{dtype}, M = {m}, replacement {r}"
            assert value.dtype == jnp.dtype(dtype), what
            assert np.isfinite(value).all() and (value >= -1e-6).all() \
                and (value <= 1 + 1e-6).all(), what
            assert all(np.isfinite(g).all() for g in grads), what
        for decoder, (value, grad) in zip(EXACT_EDGE[dtype], out[len(EDGE_SETTINGS):]):
            assert np.isfinite(value) and np.isfinite(grad).all(), f"{dtype}, {decoder.label}"


# ----------------------------------------------------------------------------- 8. errors
def test_invalid_arguments_are_refused_naming_them():
    p = jnp.asarray([0.5, 0.5])
    q = jnp.asarray([0.25, 0.75])
    for bad in (0, -1, 1.5, "2", jnp.asarray(2), True):
        with pytest.raises(ValueError, match="num_drafts"):
            specjax.optimal_acceptance(p, q, num_drafts=bad)
        with pytest.raises(ValueError, match="num_drafts"):
            specjax.OptimalMultiDraft(bad)
    with pytest.raises(ValueError, match="replacement must be True or False"):
        specjax.optimal_acceptance(p, q, num_drafts=2, replacement="no")
    with pytest.raises(ValueError, match="replacement must be True or False"):
        specjax.OptimalMultiDraft(2, replacement="no")
    with pytest.raises(ValueError, match="sequence_optimal must be True or False"):
        specjax.OptimalMultiDraft(2, sequence_optimal="yes")
    with pytest.raises(ValueError, match="p and q must have the same number of tokens V"):
        specjax.optimal_acceptance(jnp.asarray([0.2, 0.3, 0.5]), q, num_drafts=2)
    with pytest.raises(ValueError, match="p rows must sum to one"):
        specjax.optimal_acceptance(jnp.asarray([0.5, 0.6]), q, num_drafts=2)
    with pytest.raises(ValueError, match="q rows must sum to one"):
        specjax.optimal_acceptance(p, jnp.asarray([0.5, 0.4]), num_drafts=2, replacement=False)


def test_without_replacement_size_refusal_names_num_drafts():
    rows = jnp.full((64, 64), 1 / 64)
    with pytest.raises(ValueError, match="num_drafts = 4 without replacement enumerates"):
        specjax.optimal_acceptance(rows, rows, num_drafts=4, replacement=False)
    big = specjax.MarkovChain(jnp.full(64, 1 / 64), jnp.full((2, 64, 64), 1 / 64))
    decoder = specjax.OptimalMultiDraft(4, replacement=False)
    with pytest.raises(ValueError, match="num_drafts = 4 without replacement enumerates"):
        specjax.exact(decoder, big, big)
    with pytest.raises(ValueError, match="num_drafts = 4 without replacement enumerates"):
        specjax.decode(jax.random.key(0), decoder, big, big, 10)


@pytest.mark.parametrize("num_states", [1, 2, 7, 300, multi_draft.PACKED_SORT_MAX_STATES,
                                        multi_draft.PACKED_SORT_MAX_STATES + 1])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_packed_radix_argsort_is_numpys_stable_argsort(num_states, dtype):
    """``stable_argsort_nonnegative`` (two passes of packed int32 keys for float32 rows up to
    2^15 tokens, ``jnp.argsort`` otherwise) gives NumPy's stable permutation exactly on rows with
    many ties, zeros, ``+inf`` and values spanning every binade (and float32 subnormals on the
    packed path; XLA's CPU ``argsort``, the fallback, compares subnormals as 0), so
    ``optimal_acceptance`` and the root laws see the same token order as before."""
    rng = np.random.default_rng(num_states)
    rows = np.exp(rng.uniform(-85, 85, size=(3, num_states)))  # normal in float32
    rows[0] = np.round(rows[0] * 4) / 4  # ties
    rows[1, ::3] = 0.0
    rows[1, 1::5] = np.inf
    packed = dtype == "float32" and num_states <= multi_draft.PACKED_SORT_MAX_STATES
    rows[2, ::4] = 1e-42 if packed else 1e-30  # 1e-42: subnormal in float32
    rows[2, 1::4] = rows[2, 0]  # a tie run of one value
    x = rows.astype(dtype)
    with jax.enable_x64(dtype == "float64"):  # one program per shape, not an eager op each
        got = np.asarray(jax.jit(multi_draft.stable_argsort_nonnegative)(jnp.asarray(x)))
    np.testing.assert_array_equal(got, np.argsort(x, axis=-1, kind="stable"))
