"""Sequoia's tree shapes (``specjax.theory.tree_shapes``) against brute force over every ordered
tree of up to 8 nodes: the dynamic program's value is the best value, its tree has that value,
and the hardware-aware choice is the least time per token."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.theory.tree_shapes import SequoiaChoice
from specjax.theory.tree_shapes import sequoia_hardware_tree
from specjax.theory.tree_shapes import sequoia_tree

MAX_NODES = 8
DEPTHS = (0, 1, 2, 3, 4, 7)  # 7: unlimited for 8 nodes


def _random_acceptance():
    rng = np.random.default_rng(20240215)
    acc = rng.uniform(size=6)
    acc[[1, 4]] = 0.0  # zeros, one in the middle
    return acc / acc.sum() * 0.93


ACCEPTANCES = {
    "random": _random_acceptance(),
    "decreasing": np.array([0.55, 0.2, 0.1, 0.05, 0.02]),
    "zero_in_middle": np.array([0.3, 0.0, 0.45, 0.1]),
    "increasing": np.array([0.1, 0.2, 0.3, 0.35]),  # later ranks accept more
    "length_1": np.array([0.7]),
    "all_zero": np.zeros(3),
    "sure": np.array([1.0]),
}


# ----------------------------------------------------------------------------- brute force
@functools.cache
def _forests(nodes: int) -> tuple:
    """Every ordered forest of ``nodes`` nodes, as tuples of subtrees (nested tuples)."""
    if nodes == 0:
        return ((),)
    return tuple((first,) + rest
                 for size in range(1, nodes + 1)
                 for first in _trees(size)
                 for rest in _forests(nodes - size))


@functools.cache
def _trees(nodes: int) -> tuple:
    """Every ordered (plane) tree of ``nodes`` nodes: a tree is the tuple of its subtrees."""
    return _forests(nodes - 1)


def _preorder_parents(tree) -> tuple:
    """Parents in depth-first preorder (not the breadth-first order sequoia_tree returns)."""
    parents = [-1]

    def walk(node, index):
        for kid in node:
            parents.append(index)
            walk(kid, len(parents) - 1)

    walk(tree, 0)
    return tuple(parents)


def value_and_depth(acc, parents) -> tuple:
    """Value ``1 + sum_v prod_{edges} acc[rank - 1]`` and depth, straight from ``parents``
    (a child's rank is its position among its siblings in index order)."""
    n = len(parents)
    total, depth = 1.0, 0
    for v in range(1, n):
        prob, hops, node = 1.0, 0, v
        while parents[node] != -1:
            parent = parents[node]
            rank = sum(1 for u in range(1, node + 1) if parents[u] == parent)
            prob *= acc[rank - 1] if rank <= len(acc) else 0.0
            hops += 1
            node = parent
        total += prob
        depth = max(depth, hops)
    return total, depth


@functools.cache
def _all_trees(name: str) -> dict:
    """``{n: [(value, depth, parents), ...]}`` for every ordered tree of ``n <= 8`` nodes."""
    acc = ACCEPTANCES[name]
    out = {}
    for n in range(1, MAX_NODES + 1):
        out[n] = []
        for tree in _trees(n):
            parents = _preorder_parents(tree)
            value, depth = value_and_depth(acc, parents)
            out[n].append((value, depth, parents))
    return out


def test_enumeration_is_the_plane_trees():
    for n in range(1, MAX_NODES + 1):
        found = [_preorder_parents(t) for t in _trees(n)]
        assert len(found) == len(set(found)) == math.comb(2 * n - 2, n - 1) // n  # Catalan


def check_parents(parents, budget, max_depth):
    assert isinstance(parents, tuple) and len(parents) == budget
    assert all(type(p) is int for p in parents)
    assert parents[0] == -1
    depth = [0]
    for i in range(1, budget):
        assert 0 <= parents[i] < i
        depth.append(depth[parents[i]] + 1)
    assert max(depth) <= max_depth
    assert list(parents[1:]) == sorted(parents[1:])  # breadth-first
    assert depth == sorted(depth)


# ----------------------------------------------------------------------------- sequoia_tree
@pytest.mark.parametrize("name", sorted(ACCEPTANCES))
def test_sequoia_tree_is_the_best_tree(name):
    acc = ACCEPTANCES[name]
    trees = _all_trees(name)
    for n in range(1, MAX_NODES + 1):
        for max_depth in DEPTHS:
            if max_depth == 0 and n > 1:
                continue
            want = max(v for v, d, _ in trees[n] if d <= max_depth)
            value, parents = sequoia_tree(acc, budget=n, max_depth=max_depth)
            assert type(value) is float
            check_parents(parents, n, max_depth)
            assert abs(value - want) <= 1e-12, (n, max_depth, value, want, parents)
            recomputed, _ = value_and_depth(acc, parents)
            assert abs(recomputed - value) <= 1e-12, (n, max_depth, parents)


def test_sequoia_tree_closed_forms():
    # sure acceptance of the first child: the best tree holds a chain as long as allowed
    for budget, max_depth in [(1, 0), (5, 2), (5, 10), (128, 12), (40, 100)]:
        value, parents = sequoia_tree([1.0], budget=budget, max_depth=max_depth)
        assert value == 1 + min(max_depth, budget - 1)
        check_parents(parents, budget, max_depth)
    # depth 1: a star, its children in rank order
    acc = np.array([0.4, 0.3, 0.2])
    value, parents = sequoia_tree(acc, budget=6, max_depth=1)
    assert parents == (-1, 0, 0, 0, 0, 0)
    assert abs(value - 1.9) < 1e-15
    # nothing is ever accepted: the root plus padding
    value, parents = sequoia_tree(np.zeros(4), budget=5, max_depth=3)
    assert value == 1.0
    check_parents(parents, 5, 3)


def test_sequoia_tree_inputs_and_large_budget():
    acc = np.array([0.5, 0.2, 0.1, 0.05, 0.03, 0.02, 0.01, 0.01])
    want = sequoia_tree(acc, budget=7, max_depth=3)
    assert sequoia_tree(list(acc), budget=7, max_depth=3) == want
    value, parents = sequoia_tree(jnp.asarray(acc, jnp.float32), budget=np.int64(7),
                                  max_depth=3)  # float32 rounding may break ties otherwise
    check_parents(parents, 7, 3)
    assert abs(value - want[0]) < 1e-6
    # sum over one within the tolerance is accepted
    sequoia_tree(np.array([0.5, 0.5 + 1e-9]), budget=3, max_depth=2)
    values = {}
    for max_depth in (1, 4, 12):
        for budget in (1, 2, 31, 64, 127, 128):
            value, parents = sequoia_tree(acc, budget=budget, max_depth=max_depth)
            check_parents(parents, budget, max_depth)
            assert abs(value - value_and_depth(acc, parents)[0]) < 1e-12
            values[max_depth, budget] = value
    for (d, n), v in values.items():  # more nodes or more depth never hurts
        assert all(v <= w + 1e-12 for (e, m), w in values.items() if e >= d and m >= n)


# ----------------------------------------------------------------------------- hardware-aware
def _brute_hardware(name, draft_cost, cost, max_budget, max_depth):
    trees = _all_trees(name)
    return min((depth * draft_cost + cost(n)) / value
               for n in range(1, max_budget + 1)
               for value, depth, _ in trees[n] if depth <= max_depth)


TABLES = {
    "scalar": None,
    "increasing": np.array([np.nan, 1.0, 1.05, 1.1, 1.4, 1.42, 1.6, 2.3, 2.35, 9.0]),
    # not monotone (hardware alignment): more nodes can cost less; entry 0 is unused
    "uneven": np.array([np.nan, 2.0, 1.5, 1.6, 1.2, 1.9, 1.3, 2.5, 1.1, 9.0]),
}


@pytest.mark.parametrize("name", ["random", "zero_in_middle", "decreasing", "all_zero"])
@pytest.mark.parametrize("table", sorted(TABLES))
def test_sequoia_hardware_tree_is_the_fastest(name, table):
    acc = ACCEPTANCES[name]
    for max_budget in (1, 5, MAX_NODES):
        for max_depth in (0, 1, 2, 3, 7):
            for draft_cost in (0.0, 0.05, 0.3):
                values = TABLES[table]
                target_cost = 1.0 if values is None else values
                cost = (lambda n: 1.0) if values is None else values.__getitem__
                choice = sequoia_hardware_tree(acc, draft_cost=draft_cost,
                                               target_cost=target_cost,
                                               max_budget=max_budget, max_depth=max_depth)
                assert isinstance(choice, SequoiaChoice)
                want = _brute_hardware(name, draft_cost, cost, max_budget, max_depth)
                assert abs(choice.time_per_token - want) <= 1e-12 * want, \
                    (max_budget, max_depth, draft_cost, choice, want)
                assert 1 <= choice.budget <= max_budget
                check_parents(choice.parents, choice.budget, max_depth)
                value, depth = value_and_depth(acc, choice.parents)
                assert choice.depth == depth
                assert abs(choice.value - value) <= 1e-12
                assert abs(choice.time_per_token
                           - (depth * draft_cost + cost(choice.budget)) / value) <= 1e-12


def test_sequoia_hardware_tree_agrees_with_sequoia_tree():
    acc = ACCEPTANCES["random"]
    rng = np.random.default_rng(3)
    table = np.concatenate([[0.0], np.sort(rng.uniform(1.0, 3.0, size=24))])
    choice = sequoia_hardware_tree(acc, draft_cost=0.08, target_cost=table, max_budget=24,
                                   max_depth=6)
    best = min((d * 0.08 + table[n]) / sequoia_tree(acc, budget=n, max_depth=d)[0]
               for n in range(1, 25) for d in range(0 if n == 1 else 1, 7))
    assert abs(choice.time_per_token - best) <= 1e-12
    assert choice.time_per_token < 1.0 / 1.0 * table[1]  # drafting pays here
    # a free target call past 16 tokens: the largest budget wins
    flat = sequoia_hardware_tree(acc, draft_cost=0.0, target_cost=1.0, max_budget=24,
                                 max_depth=6)
    assert flat.value == sequoia_tree(acc, budget=flat.budget, max_depth=6)[0]


# ----------------------------------------------------------------------------- validation
def _tree(**kw):
    args = {"acceptance": [0.5, 0.3], "budget": 4, "max_depth": 2}
    args.update(kw)
    acceptance = args.pop("acceptance")
    return lambda: sequoia_tree(acceptance, **args)


def _hardware(**kw):
    args = {"acceptance": [0.5, 0.3], "draft_cost": 0.1, "target_cost": 1.0, "max_budget": 4,
            "max_depth": 2}
    args.update(kw)
    acceptance = args.pop("acceptance")
    return lambda: sequoia_hardware_tree(acceptance, **args)


BAD = [
    ("acceptance", _tree(acceptance=[[0.5, 0.3]])),
    ("acceptance", _tree(acceptance=0.5)),
    ("acceptance", _tree(acceptance=[])),
    ("acceptance", _tree(acceptance=[0.5, float("nan")])),
    ("acceptance", _tree(acceptance=[0.5, -0.1])),
    ("acceptance", _tree(acceptance=[1.2])),
    ("acceptance", _tree(acceptance=[0.6, 0.5])),
    ("acceptance", _tree(acceptance=["a"])),
    ("budget", _tree(budget=0)),
    ("budget", _tree(budget=-3)),
    ("budget", _tree(budget=True)),
    ("budget", _tree(budget=2.0)),
    ("budget", _tree(budget=np.array(3))),
    ("max_depth", _tree(max_depth=-1)),
    ("max_depth", _tree(max_depth=False)),
    ("max_depth", _tree(max_depth=1.5)),
    ("max_depth", _tree(max_depth=0, budget=2)),
    ("acceptance", _hardware(acceptance=[0.9, 0.6])),
    ("draft_cost", _hardware(draft_cost=-0.1)),
    ("draft_cost", _hardware(draft_cost=float("inf"))),
    ("draft_cost", _hardware(draft_cost=None)),
    ("target_cost", _hardware(target_cost=0.0)),
    ("target_cost", _hardware(target_cost=float("nan"))),
    ("target_cost", _hardware(target_cost=np.ones(4))),  # length <= max_budget
    ("target_cost", _hardware(target_cost=np.array([1.0, 1.0, -1.0, 1.0, 1.0]))),
    ("target_cost", _hardware(target_cost=np.ones((5, 1)))),
    ("max_budget", _hardware(max_budget=0)),
    ("max_budget", _hardware(max_budget=True)),
    ("max_depth", _hardware(max_depth=-2)),
]


@pytest.mark.parametrize("name,call", BAD, ids=[f"{i}-{name}" for i, (name, _) in enumerate(BAD)])
def test_bad_arguments_raise_naming_them(name, call):
    with pytest.raises(ValueError, match=name):
        call()


def test_good_edge_arguments():
    assert sequoia_tree([0.5], budget=1, max_depth=0) == (1.0, (-1,))
    choice = sequoia_hardware_tree([0.5], draft_cost=0.0, target_cost=np.ones(10),
                                   max_budget=4, max_depth=0)  # a longer table is fine
    assert choice == SequoiaChoice(1.0, (-1,), 1, 0, 1.0)


def test_traced_arguments_are_refused():
    with pytest.raises(ValueError, match="acceptance.*concrete"):
        jax.jit(lambda a: sequoia_tree(a, budget=3, max_depth=2))(jnp.asarray([0.5, 0.3]))
    with pytest.raises(ValueError, match="target_cost.*concrete"):
        jax.jit(lambda c: sequoia_hardware_tree([0.5], draft_cost=0.1, target_cost=c,
                                                max_budget=3, max_depth=2))(jnp.ones(4))
