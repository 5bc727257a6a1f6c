"""Sequoia's tree shapes: the dynamic program that picks a token tree from a positional
acceptance vector, and its hardware-aware choice of budget and depth.

Sequoia (Chen et al. 2024, "Sequoia: Scalable, Robust, and Hardware-aware Speculative
Decoding", arXiv:2402.12374) assumes a *positional* acceptance vector ``a``: given that a node
of the tree is accepted, its ``k``-th child (by rank) is the accepted one with probability
``a[k - 1]``, the same at every node; the children of a node are mutually exclusive, so
``sum(a) <= 1``. Children of rank beyond ``len(a)`` are never accepted. A node is reached when
every edge on its path from the root is accepted, so the expected number of tokens one target
call yields (the root, i.e. the bonus token, counted once) is

    value(tree) = 1 + sum over non-root nodes v of prod over edges (u -> w) on root -> v of
                  a[rank(w) - 1].

The value of a tree is ``1 + sum_k a[k - 1] * value(k-th subtree of the root)``, so the best
trees obey a recursion over subtrees. With ``F[d][m]`` the best value of a tree of at most ``m``
nodes and depth at most ``d``, and ``G_d[b][m]`` the best ``sum_{k <= b} a[k - 1] F[d - 1][y_k]``
over root children of ranks ``1..b`` whose subtrees hold ``y_1 + ... + y_b <= m`` nodes (each
``y_k >= 1``)::

    F[0][m] = 1                                    (m >= 1: the root alone),
    G_d[0][m] = 0,   G_d[b][m] = max_{1 <= y <= m} G_d[b - 1][m - y] + a[b - 1] F[d - 1][y],
    F[d][m] = 1 + max_b G_d[b][m - 1].

This is the recursion of Sequoia's search (their ``T[n][l][b]``: the best tree of ``n`` nodes,
``l`` levels and ``b`` root children, in ``tree_search.py``) with the subtree of the last root
child split off, written with *depth* (the most drafted tokens on a root-to-leaf path, the root
at depth 0) where Sequoia counts *levels* including the root (``l`` levels = depth ``l - 1``).
The tests check it against every ordered tree of up to 8 nodes. ``F`` is "at most ``m``
nodes": the values are non-negative, so a tree never loses value by growing, and a best tree of
fewer nodes is padded to exactly ``m`` nodes with leaves under the root at the next ranks (which
add nothing, else it was not the best). Only ranks up to ``K``, the last non-zero entry of ``a``,
are searched, since a child of a later rank adds nothing. The program takes
``O(depth * K * budget^2)`` operations, vectorised over ``m`` and ``y`` in NumPy (budget 128,
depth 12, ``K = 8``: about 6 ms; ``K = 127``: about 0.1 s), and keeps arg-maxes to rebuild the
tree; depths past ``budget - 1`` change nothing and are not searched.

This is a combinatorial search over a short vector, done in NumPy on the host in float64: it is
not differentiable and cannot be traced (``jax.jit`` of it raises ``ValueError``). Its trees feed
``specjax.TokenTree.from_parents``; ``specjax.theory.positional_acceptance`` gives the acceptance
vector of a Markov chain exactly.
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import jax
import numpy as np

from specjax import _checks
from specjax import _memory

__all__ = [
    "PROGRAM_ENTRY_BYTES",
    "SUM_TOLERANCE",
    "SequoiaChoice",
    "sequoia_hardware_tree",
    "sequoia_tree",
]

#: Tolerance on ``sum(acceptance) <= 1``.
SUM_TOLERANCE = 1e-6


class SequoiaChoice(NamedTuple):
    """Sequoia's hardware-aware tree (``sequoia_hardware_tree``).

    Attributes:
      value: Expected tokens per target call of the tree (the root counted once).
      parents: The tree as a parents tuple (``parents[0] = -1``, breadth-first order).
      budget: Its number of nodes (root included): the tokens one target call scores.
      depth: Its depth: the most drafted tokens on a root-to-leaf path (draft passes per call).
      time_per_token: ``(depth * draft_cost + target_cost(budget)) / value``.
    """

    value: float
    parents: tuple
    budget: int
    depth: int
    time_per_token: float


# ----------------------------------------------------------------------------- validation
def _refuse_tracer(name: str, value) -> None:
    if isinstance(value, jax.core.Tracer):
        raise ValueError(
            f"{name} must be concrete (a NumPy array, a list or a JAX array outside jax.jit): "
            f"Sequoia's tree search runs in NumPy on the host and cannot be traced, got "
            f"{value!r}")


def _check_acceptance(acceptance) -> np.ndarray:
    _refuse_tracer("acceptance", acceptance)
    try:
        acc = np.asarray(acceptance, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"acceptance must be a 1-D array of probabilities, "
                         f"got {acceptance!r}") from None
    if acc.ndim != 1:
        raise ValueError(f"acceptance must be a 1-D array (acceptance[k] for the child of rank "
                         f"k + 1), got shape {acc.shape}")
    if acc.size == 0:
        raise ValueError("acceptance must not be empty")
    if np.isnan(acc).any():
        raise ValueError("acceptance contains NaN")
    if (acc < 0).any() or (acc > 1).any():
        raise ValueError(f"acceptance must lie in [0, 1], got values in "
                         f"[{acc.min():.6g}, {acc.max():.6g}]")
    if acc.sum() > 1 + SUM_TOLERANCE:
        raise ValueError(f"acceptance must sum to at most one (the children of a node are "
                         f"mutually exclusive), got sum {acc.sum():.8g}")
    return acc


def _check_max_depth(max_depth) -> int:
    _refuse_tracer("max_depth", max_depth)
    if isinstance(max_depth, bool) or not isinstance(max_depth, numbers.Integral) \
            or max_depth < 0:
        raise ValueError(f"max_depth must be a non-negative integer, got {max_depth!r}")
    return int(max_depth)


def _check_positive(name: str, value) -> int:
    _refuse_tracer(name, value)
    _checks.check_positive_int(name, value)
    return int(value)


def _check_cost(name: str, value, *, positive: bool) -> float:
    _refuse_tracer(name, value)
    kind = "positive" if positive else "non-negative"
    try:
        if isinstance(value, bool) or np.ndim(value) != 0:
            raise TypeError
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a finite {kind} number, got {value!r}") from None
    if not (math.isfinite(number) and (number > 0 if positive else number >= 0)):
        raise ValueError(f"{name} must be a finite {kind} number, got {value!r}")
    return number


def _check_target_cost(target_cost, max_budget: int) -> np.ndarray:
    """``costs[n]`` for ``n = 0..max_budget`` (``costs[0]`` unused, set to ``nan``)."""
    _refuse_tracer("target_cost", target_cost)
    if np.ndim(target_cost) == 0:
        cost = _check_cost("target_cost", target_cost, positive=True)
        costs = np.full(max_budget + 1, cost)
    else:
        try:
            table = np.asarray(target_cost, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"target_cost must be a positive number or a 1-D table of them, "
                             f"got {target_cost!r}") from None
        if table.ndim != 1:
            raise ValueError(f"target_cost must be a number or a 1-D table (target_cost[n] for "
                             f"a call scoring n tokens), got shape {table.shape}")
        if table.shape[0] <= max_budget:
            raise ValueError(f"target_cost is a table of length {table.shape[0]}; it is indexed "
                             f"by the budget n = 1..max_budget, so it needs length at least "
                             f"max_budget + 1 = {max_budget + 1} (entry 0 is unused)")
        costs = table[:max_budget + 1].copy()
        used = costs[1:]
        if not (np.isfinite(used).all() and (used > 0).all()):
            bad = int(np.argmax(~(np.isfinite(used) & (used > 0)))) + 1
            raise ValueError(f"target_cost must hold finite positive costs at n = "
                             f"1..max_budget, got target_cost[{bad}] = {costs[bad]!r}")
    costs[0] = np.nan
    return costs


# ----------------------------------------------------------------------------- the program
class _Program(NamedTuple):
    """``best[d, m]``: the best value of a tree of at most ``m`` nodes and depth at most ``d``.
    The arg-maxes rebuild the trees: ``children[d, m]`` is the number of root children of that
    tree, ``sizes[d, b - 1, m]`` the nodes (at most) under the root child of rank ``b`` when the
    children of ranks ``1..b`` hold at most ``m`` nodes."""

    best: np.ndarray
    children: np.ndarray
    sizes: np.ndarray


#: Bytes per entry of the program's ``(budget + 1, budget)`` work arrays (an int64 index table,
#: a mask, two float64 candidate tables and an int64 arg-max, alive together).
PROGRAM_ENTRY_BYTES = 40


def _program(acc: np.ndarray, budget: int, depth: int, argument: str = "budget") -> _Program:
    """Sequoia's dynamic program for every ``m <= budget`` and depth ``<= depth`` at once.
    Its memory grows as ``budget ** 2`` (checked first: ``argument`` names the budget)."""
    nonzero = np.flatnonzero(acc > 0)
    ranks = min(int(nonzero[-1]) + 1 if nonzero.size else 0, budget - 1)
    size = budget + 1  # m = 0..budget
    _memory.check_fits(PROGRAM_ENTRY_BYTES * size * budget + 4 * (depth + 1) * (ranks + 2) * size,
                       argument=f"{argument} = {budget:,}",
                       what="Sequoia's dynamic program over every budget up to it",
                       remedy=f"use a smaller {argument} (its tables grow as its square)")
    best = np.ones((depth + 1, size))  # depth 0: the root alone, value 1
    best[:, 0] = -np.inf  # no tree has zero nodes
    children = np.zeros((depth + 1, size), np.int32)
    sizes = np.zeros((depth + 1, max(ranks, 1), size), np.int32)
    m = np.arange(size)
    rest = m[:, None] - np.arange(1, size)[None, :]  # [m, y - 1]: nodes left for ranks < b
    valid = rest >= 0
    rest = np.where(valid, rest, 0)
    for d in range(1, depth + 1):
        sub = best[d - 1, 1:]  # F[d - 1][y], y = 1..budget
        g = np.zeros(size)  # G[0][m] = 0: no children, any number of nodes left unused
        top = g.copy()  # max over b <= current of G[b][m]
        for b in range(1, ranks + 1):
            cand = np.where(valid, g[rest] + acc[b - 1] * sub[None, :], -np.inf)
            arg = np.argmax(cand, axis=1)  # first maximum: the smallest subtree
            g = cand[m, arg]
            sizes[d, b - 1] = arg + 1
            better = g > top  # strictly: ties keep the fewer children
            top = np.where(better, g, top)
            children[d, 1:] = np.where(better[:-1], b, children[d, 1:])
        best[d, 1:] = 1.0 + top[:-1]  # the root and at most m - 1 nodes below it
    return _Program(best, children, sizes)


def _rebuild(program: _Program, depth: int, nodes: int) -> list:
    """The best tree of at most ``nodes`` nodes and depth at most ``depth``, as nested lists of
    children in rank order."""
    if depth == 0 or nodes == 1:
        return []
    kids = []
    left = nodes - 1
    for b in range(int(program.children[depth, nodes]), 0, -1):
        y = int(program.sizes[depth, b - 1, left])
        kids.append(_rebuild(program, depth - 1, y))
        left -= y
    return kids[::-1]


def _parents(tree: list, nodes: int) -> tuple:
    """Breadth-first parents of ``tree``, padded to ``nodes`` with leaves under the root (the
    next ranks of its children)."""
    tree = tree + [[] for _ in range(nodes - _count(tree))]
    parents = [-1]
    queue = [(0, tree)]
    for index, kids in queue:  # the queue grows as it is read: breadth-first
        for kid in kids:
            queue.append((len(parents), kid))
            parents.append(index)
    return tuple(parents)


def _count(tree: list) -> int:
    return 1 + sum(_count(kid) for kid in tree)


def _tree_value(acc: np.ndarray, parents: tuple) -> tuple:
    """``(value, depth)`` of a parents tuple under the positional acceptance ``acc``."""
    reach = [1.0]
    depths = [0]
    seen = [0] * len(parents)  # children met so far, per node: the next child's rank - 1
    for parent in parents[1:]:
        rank = seen[parent]
        seen[parent] += 1
        reach.append(reach[parent] * (float(acc[rank]) if rank < acc.size else 0.0))
        depths.append(depths[parent] + 1)
    return math.fsum(reach), max(depths)


# ----------------------------------------------------------------------------- public
def sequoia_tree(acceptance, *, budget: int, max_depth: int) -> tuple[float, tuple]:
    """Sequoia's best tree of ``budget`` nodes for a positional acceptance vector.

    Maximises ``1 + sum over non-root nodes v of prod over the edges on root -> v of
    acceptance[rank - 1]`` over the ordered trees of exactly ``budget`` nodes (root included) and
    depth at most ``max_depth``, by Sequoia's dynamic program (see the module docstring). Ties
    between optimal trees are broken deterministically.

    Args:
      acceptance: 1-D array-like (NumPy, list, concrete JAX array) of floats in ``[0, 1]``
        summing to at most one (tolerance ``1e-6``): ``acceptance[k]`` is the probability that
        the child of rank ``k + 1`` of an accepted node is the accepted one. Children of rank
        beyond ``len(acceptance)`` are never accepted. Read in float64.
      budget: Number of nodes of the tree, root included (the tokens one target call scores),
        a positive int.
      max_depth: Most drafted tokens on a root-to-leaf path (the root is at depth 0; Sequoia's
        number of levels is ``max_depth + 1``), a non-negative int. With ``max_depth = 0`` the
        tree is the root alone, so ``budget`` must be 1.

    Returns:
      ``(value, parents)``: ``value`` (a Python float) is the expected number of tokens per
      target call, the root counted once; ``parents`` is a tuple of ``budget`` Python ints with
      ``parents[0] = -1`` and ``parents[i] < i``, in breadth-first order, the children of a node
      listed in rank order (its first child uses ``acceptance[0]``). ``value`` is computed from
      ``parents`` (it equals the dynamic program's optimum up to rounding).

    Raises:
      ValueError: ``acceptance`` is not a concrete 1-D vector in ``[0, 1]`` summing to at most
        one (or is empty or NaN); ``budget`` is not a positive int; ``max_depth`` is not a
        non-negative int, or is 0 with ``budget > 1``.
    """
    acc = _check_acceptance(acceptance)
    budget = _check_positive("budget", budget)
    max_depth = _check_max_depth(max_depth)
    if max_depth == 0 and budget > 1:
        raise ValueError(f"max_depth = 0 allows the root alone (1 node), but budget = {budget}; "
                         f"pass max_depth >= 1 or budget = 1")
    depth = min(max_depth, budget - 1)  # no path of budget nodes is longer
    program = _program(acc, budget, depth)
    parents = _parents(_rebuild(program, depth, budget), budget)
    value, _ = _tree_value(acc, parents)
    return value, parents


def sequoia_hardware_tree(acceptance, *, draft_cost, target_cost, max_budget: int,
                          max_depth: int) -> SequoiaChoice:
    """Sequoia's hardware-aware tree: the budget and depth of least time per token.

    Over budgets ``n = 1..max_budget`` and depths ``d = 0..max_depth``, minimises
    ``(d * draft_cost + target_cost(n)) / value(n, d)``, with ``value(n, d)`` the best value of
    a tree of ``n`` nodes and depth at most ``d`` (``sequoia_tree``): ``d`` draft passes (one
    per level) and one target call scoring ``n`` tokens yield ``value`` tokens on average. One
    run of the dynamic program gives every ``value(n, d)``. Ties go to the smallest ``n``, then
    the smallest ``d``; the returned ``depth`` is the depth of the returned tree, and
    ``time_per_token`` is charged with it.

    Args:
      acceptance: Positional acceptance vector, as for ``sequoia_tree``.
      draft_cost: Time of one draft forward pass (one level of the tree), finite and ``>= 0``.
      target_cost: Time of one target call: a finite positive number (the same for every
        budget), or a 1-D table with ``target_cost[n]`` the time of a call scoring ``n`` tokens,
        of length at least ``max_budget + 1`` (entry 0 is unused; entries past ``max_budget``
        are ignored).
      max_budget: Largest number of nodes (root included), a positive int.
      max_depth: Largest depth (most drafted tokens on a path), a non-negative int.

    Returns:
      ``SequoiaChoice(value, parents, budget, depth, time_per_token)``: the tree's expected
      tokens per call (root counted once), its parents tuple (as ``sequoia_tree`` gives), its
      number of nodes, its depth and its time per token.

    Raises:
      ValueError: a bad ``acceptance`` (see ``sequoia_tree``), ``draft_cost`` not finite
        ``>= 0``, ``target_cost`` not finite ``> 0`` or a table shorter than ``max_budget + 1``,
        ``max_budget`` not a positive int, ``max_depth`` not a non-negative int.
    """
    acc = _check_acceptance(acceptance)
    draft = _check_cost("draft_cost", draft_cost, positive=False)
    max_budget = _check_positive("max_budget", max_budget)
    max_depth = _check_max_depth(max_depth)
    target = _check_target_cost(target_cost, max_budget)
    depth = min(max_depth, max_budget - 1)
    program = _program(acc, max_budget, depth, "max_budget")
    value = program.best[:, 1:].copy()  # [d, n - 1]
    value[0, 1:] = -np.inf  # depth 0: the root alone, exactly one node
    cost = np.arange(depth + 1)[:, None] * draft + target[None, 1:]
    with np.errstate(divide="ignore"):
        time = np.where(np.isfinite(value), cost / np.where(np.isfinite(value), value, 1.0),
                        np.inf)
    # ties: smallest n, then smallest d (argmin over the transposed [n - 1, d] table)
    n, d = np.unravel_index(int(np.argmin(time.T)), time.T.shape)
    budget, d = int(n) + 1, int(d)
    parents = _parents(_rebuild(program, d, budget), budget)
    tree_value, tree_depth = _tree_value(acc, parents)
    return SequoiaChoice(tree_value, parents, budget, tree_depth,
                         (tree_depth * draft + float(target[budget])) / tree_value)
