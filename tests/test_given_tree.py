"""Verification of given token trees (``verify_tree``, ``verify_tree_law``).

Checked three ways:

* the exact law against a literal transcription of SpecInfer's, Sequoia's and Medusa/EAGLE's
  verification of a given tree (plain NumPy, every random choice enumerated), with ragged trees,
  stop tokens and a dropped bonus, to 1e-12 in float64;
* losslessness: averaged over every tree the rule can draft (enumerated, each weighted by its
  probability), the output continued by the target has the target's law;
* Monte Carlo of ``verify_tree`` (with a key) against the exact law (chi-square at the suite's
  false-failure rate), the tokens given as uniforms against hand-checked cases, and
  ``BatchSpeculative``'s given form against its tree.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from reference import enumerate_law
from stats import assert_law

V = 3
IRREGULAR = (-1, 0, 0, 1, 1, 2, 0)  # a root with 3 children, two of them with children


def _kids(parents, num_nodes):
    return [[c for c in range(1, num_nodes) if parents[c] == i] for i in range(num_nodes)]


def _literal(chooser, parents, rule, tokens, p_rows, q_rows, num_nodes, stop=(), bonus=True):
    """One call verifying a given tree, as the papers describe it: the output tokens."""
    kids = _kids(parents, num_nodes)
    node, out = 0, []
    while True:
        q = q_rows[node]
        if not kids[node]:  # a leaf: the target's bonus token
            if node > 0 and not bonus:
                return tuple(out)
            out.append(chooser.categorical(q))
            return tuple(out)
        if rule == "top_k":
            y = chooser.categorical(q)
            nxt = next((c for c in kids[node] if tokens[c] == y), None)
            out.append(y)
            if nxt is None or y in stop:
                return tuple(out)
            node = nxt
            continue
        r, d = q.copy(), p_rows[node].copy()
        accepted = None
        for c in kids[node]:
            if d.sum() <= 0:  # without replacement, no token left: no more children
                break
            t = tokens[c]
            if chooser.bernoulli(0.0 if d[t] == 0 else min(1.0, r[t] / d[t])):
                accepted = c
                break
            r = np.maximum(r - d, 0)
            r = r / r.sum() if r.sum() > 0 else r
            if rule == "without_replacement":
                d[t] = 0
                d = d / d.sum() if d.sum() > 0 else d
        if accepted is None:
            out.append(chooser.categorical(r if r.sum() > 0 else q))
            return tuple(out)
        out.append(int(tokens[accepted]))
        if tokens[accepted] in stop:
            return tuple(out)
        node = accepted


def _path(parents, tokens, node):
    path = []
    while node > 0:
        path.append(int(tokens[node]))
        node = parents[node]
    return tuple(reversed(path))


def _sequence_law(law_outcome, parents, tokens):
    """``{output tokens: probability}`` from a ``TreeLaw.outcome`` ``(N, V)``."""
    law = {}
    for node in range(law_outcome.shape[0]):
        for y in range(law_outcome.shape[1]):
            mass = float(law_outcome[node, y])
            if mass > 0:
                key = _path(parents, tokens, node) + (y,)
                law[key] = law.get(key, 0.0) + mass
    return law


def _random_rows(rng, n, zeros=True):
    rows = rng.dirichlet(np.ones(V), size=n)
    if zeros:  # some zero-probability tokens
        rows[rng.random(rows.shape) < 0.2] = 0
        rows[rows.sum(1) == 0, 0] = 1
    return rows / rows.sum(1, keepdims=True)


CASES = [
    ("iid", (2, 2), None, (), True),
    ("iid", IRREGULAR, 5, (), True),
    ("without_replacement", (3, 1), None, (), True),
    ("without_replacement", IRREGULAR, None, (1,), False),
    ("top_k", (2, 1), None, (), True),
    ("top_k", IRREGULAR, 4, (2,), True),
    ("iid", (2, 1), 1, (), False),  # the root alone: the target's token
    ("iid", (1, 1, 1), None, (0,), False),  # a chain: speculative decoding
]


@pytest.mark.parametrize("rule,shape,num_nodes,stop,bonus", CASES)
def test_the_law_equals_the_literal_verification_enumerated(x64, rule, shape, num_nodes, stop,
                                                            bonus):
    tree = (specjax.TokenTree.from_parents(shape, children=rule) if shape[0] == -1
            else specjax.TokenTree(shape, children=rule))
    parents = tree.shape.parents
    size = len(parents)
    rng = np.random.default_rng(size + len(stop))
    for _ in range(3):
        tokens = rng.integers(0, V, size)
        p_rows, q_rows = _random_rows(rng, size), _random_rows(rng, size)
        count = size if num_nodes is None else num_nodes
        literal = enumerate_law(lambda c: _literal(c, parents, rule, tokens, p_rows, q_rows,
                                                   count, stop, bonus))
        got = specjax.verify_tree_law(tree, tokens, p_rows, q_rows, num_nodes=num_nodes,
                                      stop_tokens=stop or None, bonus=bonus)
        ours = _sequence_law(np.asarray(got.outcome), parents, tokens)
        assert set(k for k, v in ours.items() if v > 1e-14) == set(
            k for k, v in literal.items() if v > 1e-14)
        for key, mass in literal.items():
            assert abs(ours.get(key, 0.0) - mass) < 1e-12, (key, mass, ours.get(key))
        assert abs(float(np.asarray(got.outcome).sum()) - 1) < 1e-12


def _draft_weight(rule, parents, tokens, p_of, num_nodes):
    """P(the rule drafts ``tokens`` on the first ``num_nodes`` nodes): each node's children
    from ``p_of(node)``."""
    weight = 1.0
    for node, kids in enumerate(_kids(parents, num_nodes)):
        p = p_of(node).copy()
        if rule == "top_k":
            order = sorted(range(V), key=lambda x: (-p[x], x))[:len(kids)]
            weight *= float([tokens[c] for c in kids] == order[:len(kids)])
            continue
        for c in kids:
            if p[tokens[c]] == 0:
                return 0.0
            weight *= p[tokens[c]]
            if rule == "without_replacement":
                p[tokens[c]] = 0
                p = p / p.sum()
    return weight


def _target_paths(target, prev, length, stop):
    """``{sequence: probability}`` of the target's next ``length`` tokens after ``prev``, cut
    after the first stop token."""
    if length == 0:
        return {(): 1.0}
    out = {}
    for y in range(V):
        rest = {(): 1.0} if y in stop else _target_paths(target, y, length - 1, stop)
        for tail, m in rest.items():
            out[(y,) + tail] = out.get((y,) + tail, 0.0) + target[prev, y] * m
    return out


@pytest.mark.parametrize("rule", ["iid", "without_replacement", "top_k"])
@pytest.mark.parametrize("num_nodes,stop", [(5, ()), (3, ()), (1, ()), (5, (2,))])
def test_averaged_over_drafted_trees_the_output_is_the_targets(x64, rule, num_nodes, stop):
    """Markov rows (the context is the path's last token): the output, continued by the
    target to ``D + 1`` tokens (both cut after a stop token), has the target's law, for the
    whole tree ``(2, 1)``, its first three nodes, the root alone, and with a stop token."""
    tree = specjax.TokenTree((2, 1), children=rule)  # V = 3 (without replacement: 2 of 3)
    parents, size, depth = tree.shape.parents, tree.num_nodes, tree.shape.max_depth
    rng = np.random.default_rng(4)
    draft, target = _random_rows(rng, V, zeros=False), _random_rows(rng, V, zeros=False)
    root = 1
    weights, trees = [], []
    for rest in itertools.product(range(V), repeat=num_nodes - 1):
        tokens = np.array((root,) + rest + (0,) * (size - num_nodes))  # padding: never read
        w = _draft_weight(rule, parents, tokens, lambda n, t=tokens: draft[int(t[n])],
                          num_nodes)
        if w > 0:
            weights.append(w)
            trees.append(tokens)
    # One batch size for every case (the V**4 trees of 5 nodes), padded with copies of the first
    # tree, whose outcomes are not read: the cases of a rule and stop setting share a program.
    tokens = np.stack(trees + [trees[0]] * (V ** 4 - len(trees)))
    law = specjax.verify_tree_law(tree, tokens, draft[tokens], target[tokens],
                                  num_nodes=np.full(len(tokens), num_nodes),
                                  stop_tokens=stop or None)
    outcome = np.asarray(law.outcome)
    assert abs(sum(weights) - 1) < 1e-12
    total = {}
    for b, w in enumerate(weights):
        for out, mass in _sequence_law(outcome[b], parents, tokens[b]).items():
            done = out[-1] in stop
            tails = {(): 1.0} if done else _target_paths(target, out[-1],
                                                         depth + 1 - len(out), stop)
            for tail, m in tails.items():
                total[out + tail] = total.get(out + tail, 0.0) + w * mass * m
    expected = _target_paths(target, root, depth + 1, stop)
    assert set(k for k, v in total.items() if v > 1e-14) <= set(expected)
    for seq, mass in expected.items():
        assert abs(total.get(seq, 0.0) - mass) < 1e-12, seq


def test_monte_carlo_fits_the_law_and_ragged_requests_stay_apart():
    tree = specjax.TokenTree.from_parents(IRREGULAR, children="without_replacement")
    rng = np.random.default_rng(7)
    size = tree.num_nodes
    tokens = np.stack([rng.integers(0, V, size), rng.integers(0, V, size)])
    p_rows = np.stack([_random_rows(rng, size), _random_rows(rng, size)]).astype(np.float32)
    q_rows = np.stack([_random_rows(rng, size), _random_rows(rng, size)]).astype(np.float32)
    num_nodes = np.array([size, 3])
    n = 60_000
    reps = lambda x: jnp.asarray(np.repeat(x, n, axis=0))  # noqa: E731
    out = specjax.verify_tree(jax.random.key(0), tree, reps(tokens), reps(p_rows), reps(q_rows),
                              num_nodes=jnp.asarray(np.repeat(num_nodes, n)), stop_tokens=2)
    law = specjax.verify_tree_law(tree, tokens, p_rows, q_rows, num_nodes=num_nodes,
                                  stop_tokens=2)
    emitted = np.asarray(out.tokens)
    lengths = np.asarray(out.num_emitted)
    for b in range(2):
        rows = slice(b * n, (b + 1) * n)
        observed = {}
        for seq, length in zip(emitted[rows], lengths[rows]):
            key = tuple(int(x) for x in seq[:length])
            observed[key] = observed.get(key, 0) + 1
        expected = _sequence_law(np.asarray(law.outcome[b]), tree.shape.parents, tokens[b])
        assert_law(observed, expected, n, f"request {b}")
    # the accepted nodes' tokens are the emitted tokens
    nodes = np.asarray(out.nodes)
    for i in range(200):
        k = int(out.num_accepted[i])
        assert (nodes[i, :k] >= 0).all() and (nodes[i, k:] == -1).all()
        assert (np.repeat(tokens, n, axis=0)[i, nodes[i, :k]] == emitted[i, :k]).all()


def test_batch_speculative_is_its_tree_and_uniforms_decide_as_documented():
    rng = np.random.default_rng(8)
    batch = specjax.BatchSpeculative(2, lookahead=2)
    tree = specjax.TokenTree((2, 1))
    size = tree.num_nodes
    tokens = rng.integers(0, V, size)
    p_rows, q_rows = _random_rows(rng, size), _random_rows(rng, size)
    a = specjax.verify_tree_law(batch, tokens, p_rows, q_rows)
    b = specjax.verify_tree_law(tree, tokens, p_rows, q_rows)
    np.testing.assert_allclose(a.outcome, b.outcome)
    # hand-checked: p = q accepts the first child at any u < 1; the bonus at v = 0 is the
    # first token of positive mass
    same = np.array([[0.0, 0.5, 0.5]] * size)
    out = specjax.verify_tree(None, tree, np.array([0, 1, 2, 2, 1]), same, same,
                              uniforms=(np.full(size, 0.999), np.zeros(size)))
    assert out.tokens.tolist() == [1, 2, 1] and out.nodes.tolist() == [1, 3, -1]
    assert bool(out.bonus) and int(out.num_accepted) == 2
    # disjoint supports: every child rejected, the residual is q
    q = np.array([[1.0, 0.0, 0.0]] * size)
    out = specjax.verify_tree(None, tree, np.array([0, 1, 2, 2, 1]), same, q,
                              uniforms=(np.zeros(size), np.full(size, 0.5)))
    assert out.tokens.tolist() == [0, -1, -1] and not bool(out.bonus)
    grads = jax.jit(jax.grad(lambda qq: specjax.verify_tree_law(  # one program under jit
        tree, jnp.array([0, 1, 2, 2, 1]), same, qq).reach.sum()))(q)
    assert np.isfinite(np.asarray(grads)).all()


def test_bad_inputs_are_refused_by_name_before_any_work():
    tree = specjax.TokenTree((2,))
    rows = np.full((3, V), 1 / V)
    tokens = np.array([0, 1, 2])
    with pytest.raises(ValueError, match="decoder must be a specjax.TokenTree"):
        specjax.verify_tree_law(specjax.OptimalMultiDraft(2), tokens, rows, rows)
    with pytest.raises(ValueError, match="tree_tokens must have shape"):
        specjax.verify_tree_law(tree, tokens[:2], rows, rows)
    with pytest.raises(ValueError, match="draft_probs must be given"):
        specjax.verify_tree_law(tree, tokens, None, rows)
    with pytest.raises(ValueError, match="num_nodes must lie in"):
        specjax.verify_tree_law(tree, tokens[None], rows[None], rows[None],
                                num_nodes=np.array([0]))
    with pytest.raises(ValueError, match="tree_tokens must be ids"):
        specjax.verify_tree_law(tree, np.array([0, 1, 5]), rows, rows)
    negative = rows.copy()
    negative[1, 0] = -1.0
    with pytest.raises(ValueError, match=r"target_probs\[1\]"):
        specjax.verify_tree_law(tree, tokens, rows, negative)
    with pytest.raises(ValueError, match="uniforms"):
        specjax.verify_tree(None, tree, tokens, rows, rows, uniforms=(np.ones(3), np.ones(3)))
    # rows beyond a ragged request's nodes are not read
    unread = rows.copy()
    unread[2] = np.nan
    out = specjax.verify_tree_law(tree, tokens[None], rows[None], unread[None],
                                  num_nodes=np.array([2]))
    assert np.isfinite(np.asarray(out.outcome)).all()
    # top-k trees need no draft rows
    top = specjax.TokenTree((2,), children="top_k")
    assert specjax.verify_tree_law(top, tokens, None, rows).outcome.shape == (3, V)


def test_draft_rows_without_children_are_not_read_and_rounding_never_makes_a_residual(x64):
    tree = specjax.TokenTree((2,))
    rows = np.full((3, V), 1 / V)
    tokens = np.array([0, 1, 2])
    # a leaf's draft row is never read: zeros (or NaN) there are fine
    for leaf_row in (np.zeros(V), np.full(V, np.nan)):
        leaves = rows.copy()
        leaves[1:] = leaf_row
        law = specjax.verify_tree_law(tree, tokens, leaves, rows)
        np.testing.assert_allclose(law.outcome.sum(), 1, atol=1e-12)
    # Without replacement, children (1, 1, 0), p = [0.122..., 0.877...], q = [1, 0]: child 1
    # is rejected (q(1) = 0), leaving r = d = [1, 0] in exact arithmetic (not in floats); child
    # 2 repeats token 1 (draft probability 0: rejected), so the residual is empty; child 3 is
    # rejected against it and the last token comes from q. Rounding noise must not become a law
    # (the review's case: child 3 was accepted with probability 1 in float64, 0 in float32).
    tree = specjax.TokenTree((3,), children="without_replacement")
    p = np.array([0.12218455079693302, 0.8778154492030669, 0.0])
    q = np.array([1.0, 0.0, 0.0])
    for dtype in (np.float32, np.float64):
        law = specjax.verify_tree_law(tree, np.array([0, 1, 1, 0]),
                                      np.stack([p] * 4).astype(dtype),
                                      np.stack([q] * 4).astype(dtype))
        np.testing.assert_allclose(law.reach, [1, 0, 0, 0], atol=1e-6)
        np.testing.assert_allclose(np.asarray(law.outcome)[0], [1, 0, 0], atol=1e-6)
