"""Dynamic trees (EAGLE-2) and the speed of light; Sequoia's positional vector and the best tree.

Three ways, as for every decoder:

* the tree, built here by brute force (every prefix of every depth, sorted by path probability,
  ties to the shallower prefix), and the expected drafts kept per call as the sum of target path
  probabilities over its nodes: against ``specjax.accepted_length``;
* the literal algorithm (build the tree by brute force, then draw from the target at each node
  and descend while the draw is a child), enumerated exactly over whole sequences with
  ``reference.enumerate_law``: the output law is the target's, and ``specjax.exact``'s expected
  rejections and calls equal the enumeration's;
* Monte Carlo: ``specjax.decode``'s joint law of (tokens, rejected, calls) against the
  enumeration, means within ``stats.Z`` standard errors.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import defaultdict

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import reference as ref
import specjax
import stats
from conftest import edge_pair
from conftest import full_suite_only
from conftest import random_pair
from specjax.theory import trees


def to_chain(pair):
    init, trans = pair
    return specjax.MarkovChain(jnp.asarray(init), jnp.asarray(trans))


@functools.partial(jax.jit, static_argnames="positions")
def accepted_lengths(decoders, draft, target, positions=(1,)):
    """``specjax.accepted_length`` of each decoder at each position (``[decoder][position]``),
    compiled as one program: called one by one, each decoder's call law runs operation by
    operation (100+ compiles per decoder; 360 for the speed-of-light test's 38 decoders)."""
    return [[specjax.accepted_length(d, draft, target, position=n) for n in positions]
            for d in decoders]


# ----------------------------------------------------------------------------- brute force
def brute_tree(rank_trans, n, prev, budget, max_depth):
    """The kept prefixes (tuples of tokens) of the call at ``n`` after ``prev``."""
    horizon, num_states = rank_trans.shape[0], rank_trans.shape[1]
    nodes = []
    for depth in range(1, max_depth + 1):
        if n + depth - 1 > horizon:
            break
        for path in itertools.product(range(num_states), repeat=depth):
            score, a = 1.0, prev
            for i, x in enumerate(path):
                score *= rank_trans[n - 1 + i, a, x]
                a = x
            if score > 0:
                nodes.append((score, depth, path))
    # Ties: the shallower prefix first; within a depth, the smaller tokens lexicographically
    # (the library's beams break ties by slot order, so the tests avoid exact ties in scores of
    # one depth).
    nodes.sort(key=lambda t: (-t[0], t[1], t[2]))
    return {path for _, _, path in nodes[:budget - 1]}


def brute_accepted(draft, target, budget, max_depth, rank, n):
    (_, p_trans), (_, q_trans) = draft, target
    rank_trans = p_trans if rank == "draft" else q_trans
    out = []
    for a in range(q_trans.shape[1]):
        total = 0.0
        for path in brute_tree(rank_trans, n, a, budget, max_depth):
            prob, prev = 1.0, a
            for i, x in enumerate(path):
                prob *= q_trans[n - 1 + i, prev, x]
                prev = x
            total += prob
        out.append(total)
    return np.array(out)


def dynamic_call_literal(chooser, draft, target, n, prev, budget, max_depth, rank):
    """One call as written: build the tree, then draw ``y ~ q`` at each node and descend while
    ``y`` is a child. Returns ``(emitted, flags, kept)``."""
    (_, p_trans), (_, q_trans) = draft, target
    horizon = q_trans.shape[0]
    tree = brute_tree(p_trans if rank == "draft" else q_trans, n, prev, budget, max_depth)
    path, x = (), prev
    while True:
        position = n + len(path)
        if position > horizon:
            return path, (False,) * len(path), len(path)
        y = chooser.categorical(q_trans[position - 1, x])
        if path + (y,) in tree:
            path, x = path + (y,), y
            continue
        has_children = any(node[:len(path)] == path and len(node) == len(path) + 1
                           for node in tree)
        return path + (y,), (False,) * len(path) + (has_children,), len(path)


def literal_law(draft, target, budget, max_depth, rank):
    horizon = target[1].shape[0]
    calls = functools.lru_cache(maxsize=None)(lambda n, a: ref.enumerate_law(
        lambda c: dynamic_call_literal(c, draft, target, n, a, budget, max_depth, rank)))
    return ref.chain_calls(target[0], horizon, calls)


INSTANCES = {
    "random": lambda: random_pair(41, 3, 4, zero_fraction=0.3),
    "dense": lambda: random_pair(42, 3, 4),
    "edge": lambda: edge_pair(4, 3),
}
LITERAL_CASES = [("random", 4, 2, "draft"), ("random", 6, 3, "target"),
                 ("dense", 5, 3, "draft"), ("dense", 3, 4, "target"), ("edge", 4, 2, "draft")]


@functools.lru_cache(maxsize=None)
def cached_literal(name, budget, max_depth, rank):
    draft, target = INSTANCES[name]()
    return literal_law(draft, target, budget, max_depth, rank)


# ----------------------------------------------------------------------------- exact values
BRUTE_SETTINGS = [(2, 1), (4, 2), (7, 3), (12, 3), (30, 4)]  # (budget, max_depth)
BRUTE_DECODERS = {(budget, max_depth, rank): specjax.DynamicTree(budget, max_depth=max_depth,
                                                                  rank=rank)
                  for budget, max_depth in BRUTE_SETTINGS for rank in ("draft", "target")}
# The speed of light against every static top-k tree of these shapes and EAGLE-2's tree of the
# same size, at the tree's own depth and at depth 4: (shape, depth, the speed of light, the
# trees it beats).
LIGHT_CASES = [(shape, depth, specjax.DynamicTree(tree.num_nodes, max_depth=depth, rank="target"),
                (tree, specjax.DynamicTree(tree.num_nodes, max_depth=depth)))
               for shape in [(1,), (2,), (3,), (1, 1), (2, 1), (1, 2), (1, 1, 1), (2, 2), (3, 1),
                             (2, 1, 1)]
               for tree in [specjax.TokenTree(shape, children="top_k")]
               for depth in (len(shape), 4)]
# A chain of budget two ranked by the draft, and the top-1 tree it must equal.
GREEDY = (specjax.DynamicTree(2, max_depth=3), specjax.TokenTree((1,), children="top_k"))
# Every decoder whose lengths the tests below read at position 1, and those read at 2 and 4.
FIRST_POSITION = tuple(dict.fromkeys(
    [d for *_, light, others in LIGHT_CASES for d in (light,) + others]
    + list(BRUTE_DECODERS.values()) + list(GREEDY)))
LATER_POSITIONS = tuple(BRUTE_DECODERS.values()) + GREEDY


@functools.lru_cache(maxsize=None)
def lengths_of(name):
    """``{(decoder, position): (V,) float64 accepted length}`` on instance ``name`` for the
    decoders above: two programs shared by every instance (each (decoder, positions) compiled
    as a program of its own took ten more), the same values."""
    draft, target = map(to_chain, INSTANCES[name]())
    out = {}
    with jax.enable_x64(True):
        for decoders, positions in [(FIRST_POSITION, (1,)), (LATER_POSITIONS, (2, 4))]:
            for decoder, lengths in zip(decoders, accepted_lengths(decoders, draft, target,
                                                                   positions)):
                out.update({(decoder, n): np.asarray(x) for n, x in zip(positions, lengths)})
    return out


@pytest.mark.parametrize("rank", ["draft", "target"])
@pytest.mark.parametrize("budget, max_depth", BRUTE_SETTINGS)
def test_accepted_length_equals_brute_force(rank, budget, max_depth, x64):
    decoder = BRUTE_DECODERS[budget, max_depth, rank]
    for name in ("random", "dense"):
        draft, target = INSTANCES[name]()
        for n in (1, 2, 4):
            got = lengths_of(name)[decoder, n]
            want = brute_accepted(draft, target, budget, max_depth, rank, n)
            np.testing.assert_allclose(got, want, atol=1e-12, err_msg=f"{name} n={n}")


@pytest.mark.parametrize("name, budget, max_depth, rank", LITERAL_CASES)
def test_literal_algorithm_is_unbiased(name, budget, max_depth, rank):
    _, target = INSTANCES[name]()
    tokens = ref.marginalise_tokens(cached_literal(name, budget, max_depth, rank))
    want = ref.target_sequence_law(target)
    assert max(abs(tokens.get(s, 0) - want.get(s, 0)) for s in set(tokens) | set(want)) < 1e-10


@pytest.mark.parametrize("name, budget, max_depth, rank", LITERAL_CASES)
def test_exact_values_match_the_literal_algorithm(name, budget, max_depth, rank, x64):
    draft, target = INSTANCES[name]()
    rejections, calls = ref.expected_counts_from_law(cached_literal(name, budget, max_depth,
                                                                    rank))
    got = specjax.exact(specjax.DynamicTree(budget, max_depth=max_depth, rank=rank),
                        to_chain(draft), to_chain(target))
    assert abs(float(got.expected_rejections) - rejections) < 1e-10
    assert abs(float(got.expected_calls) - calls) < 1e-10


def test_speed_of_light_beats_every_deterministic_tree(x64):
    """Ranking by the target gives the largest expected drafts kept of any deterministic tree of
    that size, for every previous token: every static top-k tree and EAGLE-2's tree."""
    lengths = lengths_of("dense")
    for shape, depth, light, others in LIGHT_CASES:
        for other in others:
            assert np.all(lengths[other, 1] <= lengths[light, 1] + 1e-12), (shape, depth, other)


def test_chain_budget_two_is_greedy_drafting(x64):
    """Two nodes ranked by the draft: the draft's most probable token, kept with the target's
    probability of it (a top-1 tree)."""
    lengths = lengths_of("random")
    dynamic, top1 = GREEDY
    for n in (1, 2, 4):  # three drafts and a bonus row, three without, one draft (T = 4)
        np.testing.assert_allclose(lengths[dynamic, n], lengths[top1, n], atol=1e-12)


# ----------------------------------------------------------------------------- Monte Carlo
NUM_CHAINS = 40_000


@pytest.mark.parametrize("name, budget, max_depth, rank", LITERAL_CASES[:3])
def test_sampler_matches_the_literal_joint_law(name, budget, max_depth, rank, x64):
    draft, target = INSTANCES[name]()
    decoder = specjax.DynamicTree(budget, max_depth=max_depth, rank=rank)
    trace = jax.tree_util.tree_map(np.asarray, specjax.decode(
        jax.random.key(7), decoder, to_chain(draft), to_chain(target), NUM_CHAINS))
    observed = defaultdict(int)
    for tokens, rejected, calls in zip(trace.tokens, trace.rejected, trace.num_calls):
        observed[(tuple(int(v) for v in tokens), tuple(bool(v) for v in rejected),
                  int(calls))] += 1
    law = cached_literal(name, budget, max_depth, rank)
    stats.assert_law(dict(observed), law, NUM_CHAINS, f"dynamic tree {name} {budget} {rank}")
    exact = specjax.exact(decoder, to_chain(draft), to_chain(target))
    stats.assert_mean(trace.num_calls, float(exact.expected_calls), "calls")
    stats.assert_mean(trace.num_rejections, float(exact.expected_rejections), "rejections")


@pytest.mark.slow  # a Monte Carlo run of 100,000 chains or more
def test_sampler_output_law_on_a_larger_chain(x64):
    """V = 6, T = 8: the final token's law is the target's marginal (float32 sampler), and the
    mean calls are the exact (float64) value."""
    key_d, key_t = jax.random.split(jax.random.key(5))
    draft = specjax.random_markov_chain(key_d, 6, 8, concentration=0.5)
    target = specjax.random_markov_chain(key_t, 6, 8, concentration=0.5)
    d32, t32 = (jax.tree_util.tree_map(lambda x: x.astype(jnp.float32), m)
                for m in (draft, target))
    for rank in ("draft", "target"):
        decoder = specjax.DynamicTree(10, max_depth=4, rank=rank)
        statistics = specjax.decoding_statistics(jax.random.key(3), decoder, d32, t32, 100_000)
        exact = specjax.exact(decoder, draft, target)
        marginal = np.asarray(exact.marginals[-1], np.float64)
        observed = {(x,): int(c) for x, c in enumerate(statistics.final_token_counts)}
        stats.assert_law(observed, {(x,): float(m) for x, m in enumerate(marginal)}, 100_000,
                         f"final token, {rank}")
        stats.assert_mean(statistics.num_calls, float(exact.expected_calls), f"calls {rank}")


# ----------------------------------------------------------------------------- edge cases
def test_finite_values_and_gradients_at_edge_rows(x64):
    draft, target = map(to_chain, edge_pair(4, 4))
    for rank in ("draft", "target"):
        decoder = specjax.DynamicTree(5, max_depth=2, rank=rank)

        def calls(t):
            return specjax.exact(decoder, draft, t).expected_calls

        value, grad = jax.jit(jax.value_and_grad(calls))(target)  # one program, not three
        assert np.isfinite(float(value))
        assert np.all(np.isfinite(np.asarray(grad.trans)))


def test_validation():
    for build, name in [(lambda: specjax.DynamicTree(1, max_depth=2), "budget"),
                        (lambda: specjax.DynamicTree(jnp.int32(4), max_depth=2), "budget"),
                        (lambda: specjax.DynamicTree(4, max_depth=0), "max_depth"),
                        (lambda: specjax.DynamicTree(4, max_depth=2, rank="x"), "rank")]:
        with pytest.raises(ValueError, match=name):
            build()


# ----------------------------------------------------------------------------- Sequoia's inputs
def test_positional_acceptance_sums_to_batch_acceptance(x64):
    """i.i.d. children: the positional masses add up to batch SD's root acceptance
    ``1 - sum [q - S_M p]_+``, averaged over the target's context law."""
    draft, target = map(to_chain, INSTANCES["random"]())
    for m in (1, 2, 4):
        acc = specjax.theory.positional_acceptance(draft, target, num_children=m, position=2)
        rejected = specjax.decoders.batch_residual_mass(draft.trans[1], target.trans[1],
                                               num_drafts=m).sum(-1)
        context = target.init @ target.trans[0]
        np.testing.assert_allclose(float(acc.sum()), float(context @ (1 - rejected)),
                                   atol=1e-12)
        assert np.all(np.diff(np.asarray(acc)) <= 1e-12)  # i.i.d.: later children accept less
    top = specjax.theory.positional_acceptance(draft, target, num_children=3, children="top_k")
    q = np.asarray(target.trans[0])
    order = np.argsort(-np.asarray(draft.trans[0]), axis=-1, kind="stable")
    want = [np.asarray(target.init) @ q[np.arange(3), order[:, j]] for j in range(3)]
    np.testing.assert_allclose(np.asarray(top), want, atol=1e-12)


def test_ordered_trees_are_all_the_plane_trees():
    catalan = [math.comb(2 * n, n) // (n + 1) for n in range(9)]
    for nodes in range(1, 9):
        found = trees.ordered_trees(nodes, nodes)
        assert len(found) == catalan[nodes - 1] == len(set(found))
        for depth in (1, 2, 3):
            limited = trees.ordered_trees(nodes, depth)
            shapes = [specjax.decoders.tree_structure.tree_shape(p) for p in found]
            assert len(limited) == sum(s.max_depth <= depth for s in shapes)


@pytest.mark.parametrize("children", ["iid", "without_replacement", "top_k"])
def test_best_token_tree_value_is_its_exact_value_and_the_best(children, x64):
    draft, target = map(to_chain, INSTANCES["dense"]())
    value, parents = specjax.theory.best_token_tree(draft, target, budget=6, max_depth=3,
                                             children=children, position=2)
    context = np.asarray(target.init @ target.trans[0])

    def exact_value(parents):
        tree = specjax.TokenTree.from_parents(parents, children=children)
        return 1 + float(context @ np.asarray(specjax.accepted_length(tree, draft, target,
                                                                      position=2)))

    assert abs(value - exact_value(parents)) < 1e-12
    for shape in [(5,), (1, 1, 1), (2, 2), (4, 1), (1, 4), (2, 1, 1)]:
        tree = specjax.TokenTree(shape, children=children)
        if tree.num_nodes == 6:
            assert exact_value(specjax.decoders.tree_structure.branching_parents(shape)) <= value + 1e-12


# ----------------------------------------------------------------------------- static trees
@pytest.mark.parametrize("children", ["iid", full_suite_only("without_replacement")])
def test_static_tree_gradients_equal_finite_differences(children, x64):
    """The exact expected calls of a static tree are differentiable in the draft and the target:
    reverse-mode gradients against central differences along random directions (interior
    rows, so that no min/max is at a kink)."""
    draft, target = map(to_chain, random_pair(43, 3, 4))
    tree = specjax.TokenTree.from_parents((-1, 0, 0, 1, 1, 2, 3), children=children)
    rng = np.random.default_rng(0)

    def calls(d_trans, t_trans):
        return specjax.exact(tree, specjax.MarkovChain(draft.init, d_trans),
                             specjax.MarkovChain(target.init, t_trans)).expected_calls

    grads = jax.jit(jax.grad(calls, argnums=(0, 1)))(draft.trans, target.trans)  # one program
    for which, base in enumerate((draft.trans, target.trans)):
        for _ in range(3):
            direction = rng.normal(size=base.shape)
            direction -= direction.mean(-1, keepdims=True)  # stay on the simplex
            h = 1e-6
            args = [draft.trans, target.trans]
            plus, minus = list(args), list(args)
            plus[which] = base + h * direction
            minus[which] = base - h * direction
            numeric = (float(calls(*plus)) - float(calls(*minus))) / (2 * h)
            analytic = float(jnp.sum(grads[which] * direction))
            assert abs(numeric - analytic) < 1e-6, (which, numeric, analytic)
