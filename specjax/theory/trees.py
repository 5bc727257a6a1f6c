"""Token trees on a real chain: the positional acceptance Sequoia assumes, and the best tree.

Sequoia (Chen et al. 2024) chooses a tree's shape from a *positional* acceptance vector: the
probability that the ``k``-th child of an accepted node is the accepted one, the same at every
node. On a Markov chain that probability depends on the node's context. ``positional_acceptance``
gives Sequoia's vector exactly (averaged over the law of the context), so that
``specjax.sequoia_tree`` can pick a shape; ``best_token_tree`` searches every tree of a small
budget for the one whose *exact* expected tokens per call on the chain is largest. The gap between
the exact value of Sequoia's pick (``specjax.accepted_length`` of
``TokenTree.from_parents(parents)``) and the best is what the positional assumption costs.

Both use the per-child masses of recursive rejection sampling that ``specjax.TokenTree`` uses
(``specjax.decoders.tree.stage_laws``), so the three agree by construction on the rule; the value
of a tree here is a separate backward recursion over its nodes (tested against
``accepted_length``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax.decoders.tree import CHILDREN
from specjax.decoders.tree import stage_laws
from specjax.decoders.tree_structure import tree_shape
from specjax.models.markov import check_pair

__all__ = ["MAX_SEARCH_BUDGET", "best_token_tree", "ordered_trees", "positional_acceptance"]

#: Largest budget ``best_token_tree`` searches (4,862 ordered trees of 10 nodes).
MAX_SEARCH_BUDGET = 10


def _context_law(target, position: int) -> np.ndarray:
    law = np.asarray(target.init, np.float64)
    for n in range(position - 1):
        law = law @ np.asarray(target.trans[n], np.float64)
    return law


def _check_common(draft, target, children, position, max_depth):
    check_pair(draft, target)
    if children not in CHILDREN:
        raise ValueError(f"children must be one of {CHILDREN}, got {children!r}")
    _checks.check_position(position, target.horizon)
    if max_depth is not None:
        _checks.check_static_int("max_depth", max_depth)
        if position + max_depth - 1 > target.horizon:
            raise ValueError(f"max_depth: a call at position {position} can draft at most "
                             f"T - position + 1 = {target.horizon - position + 1} tokens, got "
                             f"max_depth = {max_depth}")


def positional_acceptance(draft, target, *, num_children: int, children: str = "iid",
                          position: int = 1) -> jnp.ndarray:
    """Sequoia's positional acceptance vector, exactly, at the root of a call.

    ``acceptance[k]`` = P(the ``(k+1)``-th child of the root is the accepted one), the context
    ``x_{position-1}`` drawn from the target's marginal law, each child drafted as
    ``TokenTree(children=...)`` drafts it (for ``"top_k"``, the ``k``-th most probable draft
    token). This is what Sequoia estimates from data, assumed the same at every node.

    Args:
      draft, target: ``MarkovChain``s.
      num_children: the length of the vector (static).
      children: ``"iid"``, ``"without_replacement"`` or ``"top_k"``.
      position: the position ``n`` the call starts at (``1..T``).

    Returns:
      ``(num_children,)``, summing to at most 1.
    """
    _check_common(draft, target, children, position, None)
    _checks.check_static_int("num_children", num_children)
    weights = _context_law(target, position)
    return _positional(children, draft.trans[position - 1], target.trans[position - 1], weights,
                       num_children)


# One compiled program each (op by op, the laws of children drawn without replacement compiled
# about 30 small programs per call).
@functools.partial(jax.jit, static_argnums=(0, 3))
def _accepted_masses(children, p, q, num_children):
    """``(b, V_x, V_y)``: the masses the children of a node accept (``stage_laws``)."""
    return stage_laws(children, p, q, num_children)[0]


@functools.partial(jax.jit, static_argnums=(0, 4))
def _positional(children, p, q, weights, num_children):
    accepted = _accepted_masses(children, p, q, num_children)
    return jnp.einsum("x,bxy->b", weights.astype(accepted.dtype), accepted)


@functools.lru_cache(maxsize=64)
def ordered_trees(num_nodes: int, max_depth: int) -> tuple:
    """Every ordered rooted tree with ``num_nodes`` nodes and depth at most ``max_depth``, as
    parent arrays in depth-first order."""

    def forests(nodes: int, depth: int):  # ordered forests of `nodes` nodes, depth <= depth
        if nodes == 0:
            yield ()
            return
        if depth < 1:
            return
        for first in range(1, nodes + 1):  # nodes in the first tree (its root included)
            for sub in forests(first - 1, depth - 1):
                for rest in forests(nodes - first, depth):
                    yield (sub,) + rest

    def parents_of(forest, parent, out):
        for sub in forest:
            me = len(out)
            out.append(parent)
            parents_of(sub, me, out)
        return out

    return tuple(tuple(parents_of(f, 0, [-1])) for f in forests(num_nodes - 1, max_depth))


def _tree_value(parents, accepted) -> np.ndarray:
    """``E[accepted drafts | a]`` for a tree, by a backward recursion over its nodes;
    ``accepted[d][j]``: ``(V, V)`` masses of child ``j`` at depth ``d``."""
    shape = tree_shape(parents)
    value = [None] * len(parents)
    for i in range(len(parents) - 1, -1, -1):
        d = shape.depth[i]
        total = 0.0
        for j, c in enumerate(shape.children[i]):
            total = total + accepted[d][j] @ (1 + value[c])
        value[i] = total if shape.children[i] else np.zeros(accepted[0][0].shape[0])
    return value[0]


def best_token_tree(draft, target, *, budget: int, max_depth: int, children: str = "iid",
                    position: int = 1):
    """The tree of ``budget`` nodes (root included) and depth at most ``max_depth`` whose exact
    expected tokens per call on the chains is largest, by exhaustive search.

    The value of a tree is ``1 + E[drafts kept]`` (the root counted as one, as Sequoia counts)
    for a call at ``position``, the previous token drawn from the target's marginal law. Every
    ordered tree is tried (the order of siblings matters: the ``j``-th child is verified
    ``j``-th), so the budget is capped at ``MAX_SEARCH_BUDGET``.

    Args:
      draft, target: ``MarkovChain``s (concrete: the search runs in NumPy float64).
      budget: nodes including the root, ``1..10``.
      max_depth: the most drafted tokens on a path.
      children: how children are drafted and verified, as in ``TokenTree``.
      position: the position the call starts at.

    Returns:
      ``(value, parents)``: a float and a tuple parent array (``TokenTree.from_parents``).
    """
    _check_common(draft, target, children, position, max_depth)
    _checks.check_static_int("budget", budget)
    if budget > MAX_SEARCH_BUDGET:
        raise ValueError(f"budget must be at most {MAX_SEARCH_BUDGET} for an exhaustive search "
                         f"(the number of trees grows as 4^budget), got {budget}")
    accepted = []
    for d in range(max_depth):
        rows = position - 1 + d
        law = _accepted_masses(children, jnp.asarray(draft.trans[rows]),
                               jnp.asarray(target.trans[rows]), max(budget - 1, 1))
        accepted.append(np.asarray(law, np.float64))
    weights = _context_law(target, position)
    best, best_parents = -np.inf, None
    for parents in ordered_trees(budget, max_depth):
        value = 1 + float(weights @ _tree_value(parents, accepted)) if budget > 1 else 1.0
        if value > best + 1e-15:
            best, best_parents = value, parents
    return best, best_parents
