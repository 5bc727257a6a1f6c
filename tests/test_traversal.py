"""Traversal Verification (Weng et al. 2025) against a literal transcription; its theory.

* ``traversal_call_literal`` transcribes one call of the published rule in plain NumPy, as the
  module docstring of ``specjax.decoders.traversal`` states it: the whole tree drafted, the
  initial weights ``p_ini``, then the first node of the post-order tested, deleted with the
  residual update of its parent and the weights of the parent's remaining subtrees recomputed,
  until a node is accepted. Enumerated exactly over every draft tree and every test outcome
  (``reference.enumerate_law``), one call's output (continued from the target) has the target's
  law, for i.i.d. drafts and for the paper's drafts without replacement;
* its per-call law equals the decoder's ``call_law`` and ``call_law_from`` (float64, every
  truncation, with and without the bonus row);
* chained over calls by brute force it gives the law of ``(tokens, rejected, calls)``: its token
  law is the target's and ``specjax.exact``'s calls, rejections and marginals equal it;
* on chains it is ``BlockVerification``; the jitted sampler fits the brute-force law
  (chi-square) and its mean calls (4.5 standard errors); edge rows give finite values and
  gradients.
"""

import functools
from collections import defaultdict

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax.decoders.tree_structure import branching_parents
import reference as ref
import stats
from conftest import edge_pair
from conftest import full_suite_only
from conftest import random_pair


# ----------------------------------------------------------------------------- literal algorithm
def traversal_call_literal(chooser, parents, p_rows, q_rows, bonus_row, prev, children="iid"):
    """One call of Traversal Verification as published, after token ``prev``.

    ``p_rows``, ``q_rows``: ``(K', V, V)`` the rows of the call's positions (nodes deeper than
    ``K'`` are dropped); ``bonus_row``: the target's row after them, or ``None`` at the end of
    the horizon. Returns ``(emitted tokens, last token after a rejection?, tau)``.
    """
    k = len(p_rows)
    depth = [0] * len(parents)
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
    nodes = [i for i in range(len(parents)) if depth[i] <= k]
    kids = {i: [c for c in nodes if c > 0 and parents[c] == i] for i in nodes}
    token = {0: prev}
    m_b, m_s = {}, {}  # M_b(. | X), M_s(. | X): the target's and the draft's rows after X
    for i in nodes:  # parents before children: draft the tree
        if i not in token:  # absent: its draft law had no token left
            kids[i] = []
            continue
        if depth[i] < k:
            m_b[i] = np.array(q_rows[depth[i]][token[i]], np.float64)
            m_s[i] = np.array(p_rows[depth[i]][token[i]], np.float64)
        law = m_s.get(i)
        for c in list(kids[i]):
            if law.sum() <= 0:
                kids[i].remove(c)
                continue
            token[c] = chooser.categorical(law)
            if children == "without_replacement":
                law = law.copy()
                law[token[c]] = 0.0

    alpha = {0: 1.0}

    def set_weights(i):  # p_ini, and the recomputation after a deletion
        for c in kids[i]:
            if c in alive:
                t = token[c]
                ratio = m_b[i][t] / m_s[i][t] if m_s[i][t] > 0 else 0.0
                alpha[c] = min(alpha[i] * ratio, 1.0)
                set_weights(c)

    alive = set(token)
    set_weights(0)

    def first_in_post_order(i):
        live = [c for c in kids[i] if c in alive]
        return first_in_post_order(live[0]) if live else i

    while True:
        x = first_in_post_order(0)
        if chooser.bernoulli(alpha[x]):
            path, j = [], x
            while j != 0:
                path.append(token[j])
                j = parents[j]
            path = tuple(path[::-1])
            if kids[x]:  # every child deleted: Y from the node's residual
                law = m_b[x] if m_b[x].sum() > 0 else q_rows[depth[x]][token[x]]  # 0/0: null
                return path + (chooser.categorical(law),), True, len(path)
            if depth[x] < k:
                return path + (chooser.categorical(q_rows[depth[x]][token[x]]),), False, len(path)
            if bonus_row is None:
                return path, False, len(path)
            return path + (chooser.categorical(bonus_row[token[x]]),), False, len(path)
        parent = parents[x]
        a = alpha[parent]
        residual = np.maximum(a * m_b[parent] - m_s[parent], 0.0)
        s = residual.sum()
        m_b[parent] = residual / s if s > 0 else residual
        if children == "without_replacement":
            rest = m_s[parent].copy()
            rest[token[x]] = 0.0
            m_s[parent] = rest / rest.sum() if rest.sum() > 0 else rest
        alpha[parent] = s / (s + (1.0 - a)) if s + (1.0 - a) > 0 else 1.0
        alive.discard(x)
        set_weights(parent)


def call_rows(pair, n, lookahead):
    """``(p_rows, q_rows, bonus_row or None)`` of a call at position ``n`` (1-based)."""
    (_, p), (_, q) = pair
    horizon = q.shape[0]
    k = min(lookahead, horizon - n + 1)
    rows = slice(n - 1, n - 1 + k)
    return p[rows], q[rows], (q[n - 1 + k] if n + k <= horizon else None)


def literal_law(draft, target, parents, children="iid"):
    """Exact law of ``(tokens, rejected, calls)`` by brute force: every call enumerated."""
    depth = max(specjax.decoders.tree_structure.tree_shape(parents).depth)
    horizon = target[1].shape[0]

    @functools.lru_cache(maxsize=None)
    def calls(n, a):
        p_rows, q_rows, bonus = call_rows((draft, target), n, depth)
        return ref.enumerate_law(lambda c: traversal_call_literal(c, parents, p_rows, q_rows,
                                                                   bonus, a, children))

    def flagged(n, a):  # (emitted, last_rejected, tau) -> (emitted, rejected flags, tau)
        law = defaultdict(float)
        for (emitted, last_rejected, tau), pc in calls(n, a).items():
            flags = (False,) * tau + ((last_rejected,) if len(emitted) > tau else ())
            law[(emitted, flags, tau)] += pc
        return law

    return ref.chain_calls(target[0], horizon, flagged)


def to_chain(pair):
    init, trans = pair
    return specjax.MarkovChain(jnp.asarray(init), jnp.asarray(trans))


TREES = {  # parent arrays: chains, stars, uniform and irregular trees
    "(4,)": (-1, 0, 0, 0, 0),
    "(2, 1)": branching_parents((2, 1)),
    "irregular": (-1, 0, 0, 0, 1, 3),
    "deep left": (-1, 0, 0, 1, 3),
}


@functools.partial(jax.jit, static_argnames="with_bonus")
def jitted_call_law(decoder, p_rows, q_rows, bonus_row, *, with_bonus):
    """``decoder.call_law`` as one program per decoder and shape (not operation by operation)."""
    return decoder.call_law(p_rows, q_rows, bonus_row, with_bonus=with_bonus)


@jax.jit
def call_laws_both_ways(decoder, start, p_rows, q_rows, bonus_row):
    """``(call_law with the bonus row, call_law without it, call_law_from with it)``: the three
    laws of a decoder and shape as one program (not one per law, nor operation by operation)."""
    return (decoder.call_law(p_rows, q_rows, bonus_row, with_bonus=True),
            decoder.call_law(p_rows, q_rows, bonus_row, with_bonus=False),
            decoder.call_law_from(start, p_rows, q_rows, bonus_row, with_bonus=True))


def small_rows(seed, k, num_states=3):
    (_, p), (_, q) = random_pair(seed, num_states, k + 1, zero_fraction=0.3)
    return p[:k], q[:k], q[k]


# ----------------------------------------------------------------------------- the literal rule
@pytest.mark.parametrize("children", ["iid", "without_replacement"])
@pytest.mark.parametrize("tree", ["(2, 1)", "(4,)", "irregular"])
def test_literal_call_is_lossless(tree, children):
    """One call's emitted tokens, continued from the target, have the target's law."""
    parents = TREES[tree]
    k = max(specjax.decoders.tree_structure.tree_shape(parents).depth)
    p_rows, q_rows, bonus = small_rows(5, k)
    rows = list(q_rows) + [bonus]
    num_states = bonus.shape[-1]
    for prev in range(num_states):
        law = defaultdict(float)
        for (emitted, _, _), pr in ref.enumerate_law(lambda c: traversal_call_literal(
                c, parents, p_rows, q_rows, bonus, prev, children)).items():
            partial = {emitted: pr}
            for m in range(len(emitted), k + 1):
                partial = {s + (b,): w * rows[m][(s or (prev,))[-1], b]
                           for s, w in partial.items() for b in range(num_states)}
            for s, w in partial.items():
                law[s] += w
        target = {(): 1.0}
        for m in range(k + 1):
            target = {s + (b,): w * rows[m][(s or (prev,))[-1], b]
                      for s, w in target.items() for b in range(num_states)}
        assert ref.max_difference(law, target) < 1e-12, (tree, children, prev)


def literal_call_law(parents, p_rows, q_rows, bonus, num_states, children):
    """``CallLaw`` arrays ``(kept, rejected, bonus)`` of the literal call, per previous token."""
    k = len(p_rows)
    kept = np.zeros((k, num_states, num_states))
    rejected = np.zeros((k + 1, num_states, num_states))
    bonus_mass = np.zeros((k + 1, num_states, num_states))
    for a in range(num_states):
        law = ref.enumerate_law(lambda c: traversal_call_literal(c, parents, p_rows, q_rows,
                                                                 bonus, a, children))
        for (emitted, last_rejected, tau), pr in law.items():
            for i in range(tau):
                kept[i, a, emitted[i]] += pr
            if len(emitted) > tau:
                (rejected if last_rejected else bonus_mass)[tau, a, emitted[tau]] += pr
    return kept, rejected, bonus_mass


@pytest.mark.parametrize("tree, children", [
    ("(2, 1)", "iid"), ("deep left", "iid"), ("irregular", "without_replacement"),
    ("(4,)", "without_replacement")])
def test_call_law_equals_the_literal_rule(tree, children, x64):
    """The decoder's exact call law is the enumerated literal call, at every truncation, with
    and without the bonus row, and pushed from a law of the previous token (a star of 4 on 3
    tokens exhausts the draft law without replacement)."""
    parents = TREES[tree]
    decoder = specjax.TraversalVerification.from_parents(parents, children=children)
    start = np.random.default_rng(7).dirichlet(np.ones(3))
    for k in range(1, decoder.lookahead + 1):
        p_rows, q_rows, bonus = small_rows(11 + k, k)
        *laws, pushed = call_laws_both_ways(decoder, jnp.asarray(start), jnp.asarray(p_rows),
                                            jnp.asarray(q_rows), jnp.asarray(bonus))
        for with_bonus, law in zip((True, False), laws):
            literal = literal_call_law(parents, p_rows, q_rows, bonus if with_bonus else None, 3,
                                       children)
            for got, want in zip(law, literal):
                np.testing.assert_allclose(np.asarray(got), want, atol=1e-12, rtol=0)
            if with_bonus:  # the call with the bonus row, pushed from a law of the previous token
                for got, want in zip(pushed, literal):
                    np.testing.assert_allclose(np.asarray(got), np.einsum("a,iay->iy", start, want),
                                               atol=1e-12, rtol=0)


# ----------------------------------------------------------------------------- whole sequences
INSTANCES = {"random": lambda: random_pair(31, 3, 3, zero_fraction=0.3),
             "edge": lambda: edge_pair(4, 3)}


@functools.lru_cache(maxsize=None)
def cached_law(name, tree, children):
    draft, target = INSTANCES[name]()
    return literal_law(draft, target, TREES[tree], children)


@pytest.mark.parametrize("name, tree, children", [
    ("random", "(2, 1)", "iid"), ("random", "irregular", "without_replacement"),
    ("edge", "(4,)", "without_replacement")])
def test_exact_values_equal_brute_force(name, tree, children, x64):
    """The literal rule chained over calls: its token law is the target's, and ``exact``'s
    calls, rejections and marginals are its values."""
    draft, target = INSTANCES[name]()
    law = cached_law(name, tree, children)
    assert ref.max_difference(ref.marginalise_tokens(law), ref.target_sequence_law(target)) < 1e-12
    rejections, calls = ref.expected_counts_from_law(law)
    decoder = specjax.TraversalVerification.from_parents(TREES[tree], children=children)
    theory = specjax.exact(decoder, to_chain(draft), to_chain(target))
    assert abs(float(theory.expected_calls) - calls) < 1e-10
    assert abs(float(theory.expected_rejections) - rejections) < 1e-10
    np.testing.assert_allclose(np.asarray(theory.marginals),
                               ref.forward_marginals(*target), atol=1e-12)


def test_chains_are_block_verification(x64):
    """On a chain ``(1,) * K`` the call law is block verification's, at every truncation (so
    are the exact values, which push a law of the previous token through it: tested above)."""
    (_, p), (_, q) = random_pair(41, 4, 4, zero_fraction=0.3)
    traversal, block = specjax.TraversalVerification((1, 1, 1)), specjax.BlockVerification(3)
    for k, with_bonus in ((3, True), (2, False)):
        rows = (jnp.asarray(p[:k]), jnp.asarray(q[:k]), jnp.asarray(q[k]))
        for a, b in zip(jitted_call_law(traversal, *rows, with_bonus=with_bonus),
                        jitted_call_law(block, *rows, with_bonus=with_bonus)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-14, rtol=0)


# ----------------------------------------------------------------------------- the sampler
NUM_CHAINS = 20_000


@pytest.mark.parametrize("children", ["iid", full_suite_only("without_replacement")])
def test_sampler_fits_the_brute_force_law(children):
    """The sampler's joint law of (tokens, rejected, calls) fits the enumerated literal law
    (chi-square), so its output law is the target's; its mean calls fit ``exact``."""
    draft, target = INSTANCES["random"]()
    decoder = specjax.TraversalVerification((2, 1), children=children)
    d, t = (specjax.MarkovChain(jnp.asarray(x[0], jnp.float32), jnp.asarray(x[1], jnp.float32))
            for x in (draft, target))
    trace = specjax.decode(jax.random.key(35), decoder, d, t, NUM_CHAINS)
    tokens, rejected = np.asarray(trace.tokens), np.asarray(trace.rejected)
    calls = np.asarray(trace.num_calls)
    observed = defaultdict(int)
    for i in range(NUM_CHAINS):
        observed[(tuple(int(x) for x in tokens[i]), tuple(bool(r) for r in rejected[i]),
                  int(calls[i]))] += 1
    stats.assert_law(dict(observed), cached_law("random", "(2, 1)", children), NUM_CHAINS,
                     decoder.label)
    with jax.enable_x64(True):  # float64, the program test_exact_values_equal_brute_force runs
        exact_calls = float(specjax.exact(decoder, to_chain(draft), to_chain(target))
                            .expected_calls)
    stats.assert_mean(calls, exact_calls, f"mean calls of {decoder.label}")


# ----------------------------------------------------------------------------- edge cases
def test_edge_rows_give_finite_values_and_gradients(x64):
    """Zeros, ``p = q`` rows and disjoint supports (``edge_pair``): finite exact values and
    gradients in the draft and the target; with ``p = q`` every call keeps a whole path."""
    draft, target = (to_chain(x) for x in edge_pair(4, 3))
    decoder = specjax.TraversalVerification((2,))

    def calls(p_trans, q_trans):
        return specjax.exact(decoder, specjax.MarkovChain(draft.init, p_trans),
                             specjax.MarkovChain(target.init, q_trans)).expected_calls

    program = jax.jit(jax.value_and_grad(calls, argnums=(0, 1)))  # one program for both pairs
    value, grads = program(draft.trans, target.trans)
    assert np.isfinite(float(value))
    assert all(np.all(np.isfinite(np.asarray(g))) for g in grads)
    same, grads = program(target.trans, target.trans)
    assert all(np.all(np.isfinite(np.asarray(g))) for g in grads)
    assert abs(float(same) - 2.0) < 1e-12  # T = 3: a call keeps 1 draft and the bonus, then 1


def test_settings_are_validated():
    with pytest.raises(ValueError, match="children"):
        specjax.TraversalVerification((2, 2), children="top_k")
    with pytest.raises(ValueError, match="branching"):
        specjax.TraversalVerification((3, 3), children="without_replacement").check_exact(7, 50)
    with pytest.raises(ValueError, match="branching"):
        specjax.TraversalVerification(())
    with pytest.raises(ValueError, match="parents"):
        specjax.TraversalVerification.from_parents((-1, 1))
    with pytest.raises(ValueError, match="branching"):
        specjax.TraversalVerification((8, 8, 8)).check_exact(16, 10)
