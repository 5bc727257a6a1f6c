"""Static token trees (``specjax.TokenTree``) against a literal transcription of a tree call.

``tree_reference`` transcribes one call (draft the whole tree, verify top-down: SpecInfer's
i.i.d. children, Sequoia's children without replacement, Medusa/EAGLE's top-k children) in plain
NumPy, independent of specjax; ``reference.enumerate_law`` gives its exact law. The tests check

* the literal algorithm itself: its law of whole sequences is the target's, for every children
  rule on chains, stars, uniform and irregular trees; drafting the whole tree first or lazily
  gives the same law; chaining enumerated calls equals enumerating whole sequences;
* ``TokenTree.call_law`` equals the literal call law (1e-12, float64), truncated calls included;
* ``specjax.exact``'s expected rejections and calls, its rejected measure and marginals, and
  ``specjax.accepted_length`` equal the literal enumeration's (1e-10);
* the special cases: a chain is speculative decoding, a star is batch SD's root (with and
  without replacement), ``(M, 1, .., 1)`` is batch SD with lookahead ``K`` (1e-9);
* ``specjax.decode``: the joint law of (tokens, rejected, calls) is the literal one (so the
  tokens' law is the target's) by chi-square, and the mean rejections and calls fit ``exact``;
* finite values and gradients at the edge pairs, and the argument checks.
"""

import functools
from collections import defaultdict

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
import reference as ref
import stats
import tree_reference as tr
from conftest import edge_pair
from conftest import full_suite_only
from conftest import random_pair

CHILDREN = tr.CHILDREN

# name -> (branching factors) or (parent array starting with -1)
TREES = {
    "chain": (1, 1, 1),
    "star": (3,),
    "(2, 2)": (2, 2),
    "(3, 1)": (3, 1),
    "irregular": (-1, 0, 0, 1, 1, 2),
    "irregular deep": (-1, 0, 1, 0, 3, 3, 1, 2),  # leaves at depths 1..3 (node 3's kids: 4, 5)
    "star of 5": (5,),  # more children than tokens (V <= 4)
}


def make_tree(name, children):
    spec = TREES[name]
    if spec[0] == -1:
        return specjax.TokenTree.from_parents(spec, children=children)
    return specjax.TokenTree(spec, children=children)


def tree_parents(name):
    spec = TREES[name]
    return spec if spec[0] == -1 else tr.branching_parents(spec)


INSTANCES = {
    "tiny": lambda: random_pair(201, 2, 2, zero_fraction=0.3),
    "random": lambda: random_pair(202, 4, 4, zero_fraction=0.3),
    "dense": lambda: random_pair(203, 4, 4),
    "edge": lambda: edge_pair(4, 4),
}
# Every instance but "tiny" has one size (V = 4, T = 4), and so do the special cases' and the
# sampler's below, so that each tree's ``exact`` program (and each operation of the op-by-op
# call laws) is compiled for one shape, not two (edge_pair's rows need V = 4). T = 4 keeps every
# kind of call of the deepest tree (depth 3): full calls with a bonus position (n = 1), calls
# that end exactly at T (n = 2) and truncated ones (n = 3, 4).


def to_chain(pair, dtype=None):
    init, trans = pair
    return specjax.MarkovChain(jnp.asarray(init, dtype), jnp.asarray(trans, dtype))


@jax.jit
def _stacked_lengths(decoder, draft, target):
    return jnp.stack([specjax.accepted_length(decoder, draft, target, position=n)
                      for n in range(1, target.horizon + 1)])


def accepted_lengths(decoder, draft, target):
    """``(T, V)``: ``specjax.accepted_length`` at every position ``1..T``. A token-wise decoder's
    positions are compiled as one program (instead of one per position); a tree's call law runs
    operation by operation, whose compiled operations every tree and position share."""
    if isinstance(decoder, specjax.TokenTree):
        return np.stack([np.asarray(specjax.accepted_length(decoder, draft, target, position=n))
                         for n in range(1, target.horizon + 1)])
    return np.asarray(_stacked_lengths(decoder, draft, target))


@functools.lru_cache(maxsize=None)
def literal(tree_name, children, instance):
    draft, target = INSTANCES[instance]()
    return tr.LiteralTree(tree_parents(tree_name), children, draft, target)


@functools.lru_cache(maxsize=None)
def literal_law(tree_name, children, instance):
    return literal(tree_name, children, instance).sequence_law()


# ----------------------------------------------------------------------------- the reference
LAW_TREES = ["chain", "star", "(2, 2)", "irregular", "irregular deep", "star of 5"]


@pytest.mark.parametrize("children", CHILDREN)
@pytest.mark.parametrize("tree_name", LAW_TREES)
def test_literal_sequence_law_is_target(tree_name, children):
    """The literal algorithm is unbiased: its tokens' law is the target's sequence law, and
    every sequence's probabilities sum to 1."""
    for instance in ("tiny", "random", "dense", "edge"):
        _, target = INSTANCES[instance]()
        law = literal_law(tree_name, children, instance)
        assert abs(sum(law.values()) - 1) < 1e-12
        tokens = ref.marginalise_tokens(law)
        assert ref.max_difference(tokens, ref.target_sequence_law(target)) < 1e-12, instance
        for (seq, rejected, calls), _ in law.items():
            assert len(seq) == len(rejected) + 1 and 1 <= calls <= len(rejected)


@pytest.mark.parametrize("children", CHILDREN)
def test_literal_drafting_order_and_chaining(children):
    """Drafting the whole tree first (the literal order) or each node's children on arrival
    gives the same call law; chaining enumerated calls equals enumerating whole sequences."""
    # V = 3 or T = 3 (the enumeration of a whole drafted tree grows as V^nodes); no program
    # is compiled here, so these sizes cost nothing elsewhere.
    for tree_name, (draft, target) in (("(2, 2)", random_pair(202, 3, 4, zero_fraction=0.3)),
                                       ("irregular", edge_pair(4, 3)),
                                       ("star of 5", random_pair(203, 3, 4))):
        parents = tree_parents(tree_name)
        eager = tr.LiteralTree(parents, children, draft, target, draft_all=True)
        lazy = tr.LiteralTree(parents, children, draft, target)
        for n in (1, 2):
            for a in range(target[0].shape[0]):
                assert ref.max_difference(eager.call(n, a), lazy.call(n, a)) < 1e-13
    draft, target = random_pair(204, 2, 3)
    parents = (-1, 0, 0, 1)
    whole = ref.enumerate_law(lambda c: tr.tree_literal(c, parents, children, draft, target))
    chained = tr.literal_sequence_law(parents, children, draft, target)
    assert ref.max_difference(whole, chained) < 1e-13


def test_literal_is_sensitive():
    """The reference can fail: verifying i.i.d. children against ``q`` instead of the residual
    (a classic bug: the residual left after a rejected sibling) biases the output."""
    draft, target = random_pair(203, 3, 3)  # T = 3: the enumeration grows as V^T
    parents = tr.branching_parents((2,))

    def wrong_call(chooser, draft_trans, target_trans, n, prev):
        p, q = draft_trans[n - 1, prev], target_trans[n - 1, prev]
        for t in (chooser.categorical(p), chooser.categorical(p)):
            if chooser.bernoulli(min(1.0, q[t] / p[t])):
                return t, False
        return chooser.categorical(ref.positive_part(q - p)), True

    def wrong(chooser):
        x, flags = [chooser.categorical(target[0])], []
        while len(x) <= target[1].shape[0]:
            y, flag = wrong_call(chooser, draft[1], target[1], len(x), x[-1])
            x.append(y)
            flags.append(flag)
        return tuple(x), tuple(flags), len(flags)

    biased = ref.marginalise_tokens(ref.enumerate_law(wrong))
    assert ref.max_difference(biased, ref.target_sequence_law(target)) > 1e-3
    right = ref.marginalise_tokens(tr.literal_sequence_law(parents, "iid", draft, target))
    assert ref.max_difference(right, ref.target_sequence_law(target)) < 1e-12


# ----------------------------------------------------------------------------- the call law
CALL_TREES = ["chain", "star", "(2, 2)", "(3, 1)", "irregular", "irregular deep", "star of 5"]


@pytest.mark.parametrize("children", CHILDREN)
@pytest.mark.parametrize("tree_name", CALL_TREES)
def test_call_law_matches_literal(tree_name, children, x64):
    """``call_law`` at every start position (full calls with a bonus position, calls that end
    exactly at ``T`` and truncated ones) equals the enumerated literal call."""
    tree = make_tree(tree_name, children)
    for instance in ("random", "edge", "dense"):
        draft, target = INSTANCES[instance]()
        horizon = target[1].shape[0]
        lit = literal(tree_name, children, instance)
        for n in range(1, horizon + 1):
            k = min(tree.lookahead, horizon - n + 1)
            with_bonus = n + k <= horizon
            law = tree.call_law(jnp.asarray(draft[1][n - 1:n - 1 + k]),
                                jnp.asarray(target[1][n - 1:n - 1 + k]),
                                jnp.asarray(target[1][n - 1 + k]) if with_bonus else None,
                                with_bonus=with_bonus)
            expected = lit.call_law(n)
            for field, got, want in zip(law._fields, law, expected):
                got = np.asarray(got)
                assert got.shape == want.shape, (instance, n, field)
                np.testing.assert_allclose(got, want, rtol=0, atol=1e-12,
                                           err_msg=f"{instance}, n = {n}, {field}")


# ----------------------------------------------------------------------------- exact values
@pytest.mark.parametrize("children", CHILDREN)
@pytest.mark.parametrize("tree_name", ["(2, 2)", "irregular", "irregular deep", "star of 5"])
def test_exact_matches_literal(tree_name, children, x64):
    """``exact``'s expected rejections and calls, its rejected measure (``P(x_n = x, R_n)``) and
    marginals, and ``accepted_length`` at every position, against the enumeration."""
    tree = make_tree(tree_name, children)
    for instance in ("random", "edge", "dense"):
        draft, target = INSTANCES[instance]()
        horizon, num_states = target[1].shape[0], target[0].shape[0]
        d, t = to_chain(draft), to_chain(target)
        law = literal_law(tree_name, children, instance)
        rejections, calls = ref.expected_counts_from_law(law)
        result = specjax.exact(tree, d, t)
        assert abs(float(result.expected_rejections) - rejections) < 1e-10, instance
        assert abs(float(result.expected_calls) - calls) < 1e-10, instance
        np.testing.assert_allclose(np.asarray(result.rejected),
                                   ref.rejected_measure(law, num_states, horizon), atol=1e-10)
        np.testing.assert_allclose(np.asarray(result.marginals),
                                   ref.forward_marginals(*target), atol=1e-10)
        for n in range(1, horizon + 1):
            np.testing.assert_allclose(np.asarray(specjax.accepted_length(tree, d, t, position=n)),
                                       literal(tree_name, children, instance).accepted_length(n),
                                       atol=1e-10, err_msg=f"{instance}, position {n}")


SPECIAL_INSTANCES = {  # the module's instances (V = 4, T = 4): each decoder is compiled once
    name: INSTANCES[name] for name in ("random", "dense", "edge")}


def assert_same_values(tree, other, what):
    for name, make in SPECIAL_INSTANCES.items():
        draft, target = make()
        d, t = to_chain(draft), to_chain(target)
        a, b = specjax.exact(tree, d, t), specjax.exact(other, d, t)
        a_lengths, b_lengths = accepted_lengths(tree, d, t), accepted_lengths(other, d, t)
        for field in ("expected_rejections", "expected_calls"):
            assert abs(float(getattr(a, field)) - float(getattr(b, field))) < 1e-9, (
                what, name, field, float(getattr(a, field)), float(getattr(b, field)))
        for n in range(1, target[1].shape[0] + 1):
            np.testing.assert_allclose(
                np.asarray(a_lengths[n - 1]), np.asarray(b_lengths[n - 1]), atol=1e-9,
                err_msg=f"{what}, {name}, accepted length at position {n}")


@pytest.mark.parametrize("children", ["iid", "without_replacement"])
@pytest.mark.parametrize("lookahead", [1, 2, 3, 6])
def test_chain_is_speculative_decoding(lookahead, children, x64):
    """A chain ``(1,) * K`` (one child per node: both rules are SD's) is SD with lookahead
    ``K``; ``K = 6 > T`` is the paper's ``K = T``."""
    tree = specjax.TokenTree((1,) * lookahead, children=children)
    assert_same_values(tree, specjax.Speculative(lookahead=lookahead), f"chain K={lookahead}")


@pytest.mark.parametrize("num_drafts", [2, 3, 5])
def test_star_is_batch_root(num_drafts, x64):
    """A star ``(M,)``: batch SD with lookahead 1, i.i.d. and without replacement (``M = 5``
    exceeds ``V``: batch SD caps ``M`` at ``V``, the tree runs out of tokens)."""
    assert_same_values(specjax.TokenTree((num_drafts,)),
                       specjax.BatchSpeculative(num_drafts, lookahead=1), f"star M={num_drafts}")
    assert_same_values(specjax.TokenTree((num_drafts,), children="without_replacement"),
                       specjax.BatchSpeculative(num_drafts, replacement=False, lookahead=1),
                       f"star w/o replacement M={num_drafts}")


@pytest.mark.parametrize("num_drafts, lookahead", [(2, 2), (3, 3), (2, 6)])
def test_root_then_chains_is_batch_sd(num_drafts, lookahead, x64):
    """``(M, 1, .., 1)``: ``M`` drafts at the root, each followed by its own chain, the accepted
    one verified by SD and a bonus after ``K`` kept drafts: batch SD with lookahead ``K``
    (Algorithm 4: each of the ``M`` drafts is a whole sequence of i.i.d. draft tokens)."""
    shape = (num_drafts,) + (1,) * (lookahead - 1)
    assert_same_values(specjax.TokenTree(shape),
                       specjax.BatchSpeculative(num_drafts, lookahead=lookahead),
                       f"batch M={num_drafts} K={lookahead}")
    assert_same_values(specjax.TokenTree(shape, children="without_replacement"),
                       specjax.BatchSpeculative(num_drafts, replacement=False,
                                                lookahead=lookahead),
                       f"batch w/o replacement M={num_drafts} K={lookahead}")


# ----------------------------------------------------------------------------- the sampler
SAMPLER_INSTANCE = "sampler"
INSTANCES[SAMPLER_INSTANCE] = lambda: random_pair(221, 4, 4, zero_fraction=0.2)  # as "random"
NUM_CHAINS = 150_000


@pytest.mark.slow  # a Monte Carlo run of 100,000 chains or more
@pytest.mark.parametrize("children", CHILDREN)
@pytest.mark.parametrize("tree_name", ["(2, 2)", "irregular"])
def test_decode_matches_literal_and_exact(tree_name, children):
    """``decode``'s joint law of (tokens, rejected flags, calls) fits the literal enumeration
    (chi-square; its token marginal is the target's law, checked too), and the mean rejections
    and calls fit ``exact`` within ``stats.Z`` standard errors."""
    draft, target = INSTANCES[SAMPLER_INSTANCE]()
    tree = make_tree(tree_name, children)
    trace = specjax.decode(jax.random.key(7), tree, to_chain(draft, np.float32),
                           to_chain(target, np.float32), NUM_CHAINS)
    tokens = np.asarray(trace.tokens)
    rejected = np.asarray(trace.rejected)
    calls = np.asarray(trace.num_calls)
    what = f"tree {tree_name}, {children}"
    assert (np.asarray(trace.num_rejections) == rejected.sum(-1)).all()
    assert (calls == np.asarray(trace.new_call).sum(-1)).all()
    stats.assert_law(stats.count_rows(tokens), ref.target_sequence_law(target), NUM_CHAINS,
                     f"{what}: tokens")
    joint = defaultdict(int)
    rows = stats.count_rows(np.concatenate([tokens, rejected, calls[:, None]], axis=1))
    horizon = target[1].shape[0]
    for row, count in rows.items():
        joint[(row[:horizon + 1], tuple(bool(v) for v in row[horizon + 1:-1]), row[-1])] += count
    stats.assert_law(dict(joint), literal_law(tree_name, children, SAMPLER_INSTANCE),
                     NUM_CHAINS, f"{what}: (tokens, rejected, calls)")
    with jax.enable_x64(True):
        exact = specjax.exact(tree, to_chain(draft), to_chain(target))
        exact_rejections, exact_calls = (float(exact.expected_rejections),
                                         float(exact.expected_calls))
    stats.assert_mean(rejected.sum(-1), exact_rejections, f"{what}: rejections")
    stats.assert_mean(calls, exact_calls, f"{what}: calls")


@pytest.mark.parametrize("children", CHILDREN)
def test_decode_in_float64(children):
    """Under ``jax_enable_x64`` with float64 chains the sampler runs (its integer carries keep
    their dtype) and its mean calls fit ``exact`` within ``stats.Z`` standard errors."""
    draft, target = INSTANCES[SAMPLER_INSTANCE]()
    tree = make_tree("irregular", children)
    with jax.enable_x64(True):
        draft64, target64 = to_chain(draft, np.float64), to_chain(target, np.float64)
        trace = specjax.decode(jax.random.key(11), tree, draft64, target64, 20_000)
        exact = specjax.exact(tree, draft64, target64)
        assert trace.tokens.dtype == jnp.int32
        stats.assert_mean(np.asarray(trace.num_calls), float(exact.expected_calls),
                          f"{children}: calls in float64")


# ----------------------------------------------------------------------------- edge cases
@pytest.mark.parametrize("dtype", [np.float32, full_suite_only(np.float64)])
@pytest.mark.parametrize("children", ["iid", "without_replacement"])
def test_finite_values_and_gradients_at_edge_cases(children, dtype, x64):
    """Finite exact values and gradients in both models at the edge pair, and at ``p = q``
    (the target as the draft), where nothing is ever rejected."""
    draft, target = edge_pair(4, 4)
    d, t = to_chain(draft, dtype), to_chain(target, dtype)
    # The irregular tree (two children at the root, two and one below) holds every kind of node
    # (2, 2) has; its gradient program is the expensive one (about 3 s to compile without
    # replacement), so it is compiled once and run at both pairs (p = q needs no other program).
    tree = make_tree("irregular", children)

    def value(dd, tt):
        result = specjax.exact(tree, dd, tt)
        return result.expected_rejections + result.expected_calls, result.expected_rejections

    program = jax.jit(jax.value_and_grad(value, argnums=(0, 1), has_aux=True))
    for what, (dd, tt) in (("edge pair", (d, t)), ("p = q", (t, t))):
        (total, rejections), grads = program(dd, tt)
        assert np.isfinite(float(total)), what
        leaves = jax.tree_util.tree_leaves(grads)
        assert leaves and all(np.isfinite(np.asarray(g)).all() for g in leaves), what
    assert abs(float(rejections)) < 1e-6  # p = q: nothing is ever rejected


# ----------------------------------------------------------------------------- validation
def test_validation_errors():
    with pytest.raises(ValueError, match="branching"):
        specjax.TokenTree(())
    for bad in ((0,), (2, -1), (2, 0, 1), (1.5,), (True,)):
        with pytest.raises(ValueError, match="branching"):
            specjax.TokenTree(bad)
    with pytest.raises(ValueError, match="branching"):
        specjax.TokenTree(jnp.asarray([2, 2]))
    with pytest.raises(ValueError, match="branching"):
        jax.jit(lambda b: specjax.TokenTree(b))(jnp.asarray([2, 2]))
    with pytest.raises(ValueError, match="branching"):
        jax.jit(lambda f: specjax.TokenTree((f, 2)))(2)
    for bad in ((0, 0, 1), (-1, 0, 2), (-1, 1), (-1, 0, -1), (), (-1, 0.5)):
        with pytest.raises(ValueError, match="parents"):
            specjax.TokenTree.from_parents(bad)
    with pytest.raises(ValueError, match="parents"):
        jax.jit(lambda p: specjax.TokenTree.from_parents(p))(jnp.asarray([-1, 0]))
    for bad in ("foo", "IID", None):
        with pytest.raises(ValueError, match="children"):
            specjax.TokenTree((2,), children=bad)
        with pytest.raises(ValueError, match="children"):
            specjax.TokenTree.from_parents((-1, 0, 0), children=bad)
    # Valid settings, and the shape facts they imply.
    tree = specjax.TokenTree.from_parents([-1, 0, 0, 1], children="top_k")
    assert tree.lookahead == 2 and tree.num_nodes == 4
    assert specjax.TokenTree((4, 2, 1)).lookahead == 3
    assert specjax.TokenTree((4, 2, 1)).num_nodes == 1 + 4 + 8 + 8
