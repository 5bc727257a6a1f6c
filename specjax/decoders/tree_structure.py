"""The shape of a static token tree: its parent array, depths, children and classes of nodes.

A tree is a parent array (``parents[0] = -1`` is the root, ``parents[i] < i``; the children of a
node are ordered by index) or nested branching factors (``(4, 2, 1)``: the root has 4 children,
each of them 2, each of those 1; ``branching_parents`` gives its parent array, breadth first).
``tree_shape`` derives the static facts ``TokenTree`` needs (``TreeShape``: depths, children,
depth ``D`` and largest branching factor ``b``); ``tree_classes`` merges the nodes whose truncated
subtrees have the same shape at the same depth, the classes the exact law of a call
(``specjax.decoders.tree``) runs over. ``check_parents`` and ``check_branching`` validate the two
forms, at most ``MAX_TREE_NODES`` nodes.

Not to be confused with ``specjax.theory.tree_shapes``, Sequoia's dynamic programs that choose a
tree. The names are served from ``specjax.decoders.tree`` too.
"""

from __future__ import annotations

import functools
import numbers
from typing import NamedTuple

import jax
import numpy as np

from specjax import _checks

__all__ = [
    "MAX_TREE_NODES",
    "TreeShape",
    "TreeSpec",
    "branching_parents",
    "check_branching",
    "check_parents",
    "check_tree_spec",
    "spec_shape",
    "tree_classes",
    "tree_shape",
]

MAX_TREE_NODES = 2**14  # the largest tree (nodes, root included) a TokenTree accepts


class TreeShape(NamedTuple):
    """Static facts of a tree, derived from its parent array."""

    parents: tuple  # parents[0] = -1
    depth: tuple  # depth[i]: drafted tokens from the root to node i (root 0)
    children: tuple  # children[i]: node i's children, in order
    max_depth: int  # D
    max_children: int  # b, the largest branching factor (0 for a lone root)


def branching_parents(branching) -> tuple:
    """The parent array (breadth first) of the uniform tree with branching factors
    ``branching``."""
    parents, level = [-1], [0]
    for factor in branching:
        nxt = []
        for node in level:
            for _ in range(factor):
                parents.append(node)
                nxt.append(len(parents) - 1)
        level = nxt
    return tuple(parents)


@functools.lru_cache(maxsize=256)
def tree_shape(parents: tuple) -> TreeShape:
    depth = [0] * len(parents)
    children = [[] for _ in parents]
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
        children[parents[i]].append(i)
    return TreeShape(parents, tuple(depth), tuple(tuple(c) for c in children), max(depth),
                     max((len(c) for c in children), default=0))


@functools.lru_cache(maxsize=256)
def tree_classes(parents: tuple, max_depth: int) -> tuple:
    """Nodes of the tree truncated at depth ``max_depth``, merged by (depth, subtree shape).

    Returns ``levels``: ``levels[d]`` is a tuple with one entry per class at depth ``d``, the
    tuple of its children's class indices at depth ``d + 1`` in order (empty for a leaf).
    """
    shape = tree_shape(parents)
    keys = [None] * len(parents)
    for i in range(len(parents) - 1, -1, -1):  # children have larger indices
        if shape.depth[i] > max_depth:
            continue
        kids = shape.children[i] if shape.depth[i] < max_depth else ()
        keys[i] = tuple(keys[c] for c in kids)
    index = [dict() for _ in range(max_depth + 1)]
    for i in range(len(parents)):
        if keys[i] is not None:
            index[shape.depth[i]].setdefault(keys[i], len(index[shape.depth[i]]))
    levels = []
    for d in range(max_depth + 1):
        entries = [None] * len(index[d])
        for key, c in index[d].items():
            entries[c] = tuple(index[d + 1][k] for k in key)
        levels.append(tuple(entries))
    return tuple(levels)


def check_parents(parents) -> tuple:
    if isinstance(parents, (jax.Array, np.ndarray)) and not isinstance(parents, jax.core.Tracer):
        parents = np.asarray(parents).tolist()
    if isinstance(parents, jax.core.Tracer) or not isinstance(parents, (tuple, list)):
        raise ValueError("parents is a static setting: a tuple or list of Python ints "
                         f"(parents[0] = -1, parents[i] < i), got {parents!r}")
    if not parents or len(parents) > MAX_TREE_NODES:
        raise ValueError(f"parents must list 1 to {MAX_TREE_NODES} nodes, got {len(parents)}")
    for i, parent in enumerate(parents):
        if isinstance(parent, bool) or not isinstance(parent, numbers.Integral):
            raise ValueError(f"parents must hold Python ints, got {parent!r} at index {i}")
    if parents[0] != -1:
        raise ValueError(f"parents[0] must be -1 (the root), got {parents[0]}")
    for i in range(1, len(parents)):
        if not 0 <= parents[i] < i:
            raise ValueError(f"parents[{i}] must be a node before it (0 <= parents[i] < {i}), "
                             f"got {parents[i]}")
    return tuple(int(x) for x in parents)


def check_branching(branching) -> tuple:
    if isinstance(branching, (jax.Array, np.ndarray, jax.core.Tracer)) \
            or not isinstance(branching, (tuple, list)):
        raise ValueError("branching is a static setting: a tuple of positive Python ints, one "
                         f"branching factor per depth, e.g. (4, 2, 1); got {branching!r}")
    if not branching:
        raise ValueError("branching must hold at least one branching factor, got ()")
    for factor in branching:
        _checks.check_static_int("branching", factor)
    nodes, level = 1, 1
    for factor in branching:
        level *= factor
        nodes += level
        if nodes > MAX_TREE_NODES:
            raise ValueError(f"branching {tuple(branching)} has more than {MAX_TREE_NODES} "
                             "nodes; use smaller factors or fewer levels")
    return tuple(int(f) for f in branching)


def check_tree_spec(decoder, *, allowed: tuple, example: str, why_not: str = "") -> None:
    """The checks of a static tree decoder's specification (``TokenTree``,
    ``TraversalVerification``), run by its ``__post_init__``: one of ``branching`` and
    ``parents`` (normalised in place), a tree that drafts at least one node, and ``children`` in
    ``allowed`` (``why_not`` says why the others are refused). ``example`` is a branching that
    the first message shows."""
    name = type(decoder).__name__
    if decoder.branching is None and decoder.parents is None:
        raise ValueError(f"branching: give branching factors, e.g. {name}({example}), or a "
                         f"parent array with {name}.from_parents(parents)")
    if decoder.branching is not None and decoder.parents is not None:
        raise ValueError("branching and parents: give one of them, not both")
    if decoder.branching is not None:
        object.__setattr__(decoder, "branching", check_branching(decoder.branching))
    else:
        object.__setattr__(decoder, "parents", check_parents(decoder.parents))
        if len(decoder.parents) < 2:
            raise ValueError("parents must describe a tree with at least one drafted node "
                             "(a lone root drafts nothing: use Autoregressive())")
    if decoder.children not in allowed:
        raise ValueError(f"children must be one of {allowed}{why_not}, got {decoder.children!r}")


def spec_shape(branching, parents) -> TreeShape:
    """The shape of the tree given by ``branching`` or, if that is ``None``, by ``parents``."""
    return tree_shape(parents if parents is not None else branching_parents(branching))


class TreeSpec:
    """What a decoder given by a static tree derives from its fields ``branching``,
    ``children`` and ``parents`` (checked by ``check_tree_spec``): its shape, depth (the
    ``lookahead``), nodes, label and work per call. Mixed in before ``CallDecoder`` by
    ``TokenTree`` and ``TraversalVerification``, which name themselves in ``label_name``."""

    label_name = "tree"

    @classmethod
    def from_parents(cls, parents, *, children: str = "iid"):
        """The tree with parent array ``parents`` (``parents[0] = -1``, ``parents[i] < i``)."""
        return cls(None, children=children, parents=parents)

    @property
    def shape(self) -> TreeShape:
        return spec_shape(self.branching, self.parents)

    @property
    def lookahead(self) -> int:
        return self.shape.max_depth

    @property
    def num_nodes(self) -> int:
        """Nodes of the tree, root included: the tokens one call verifies."""
        return len(self.shape.parents)

    @property
    def label(self) -> str:
        tree = (f"{self.branching}" if self.branching is not None
                else f"{self.num_nodes}-node tree")
        return f"{self.label_name} {tree}, {self.children}"

    def truncate(self, lookahead: int):
        del lookahead  # the sampler leaves out the nodes beyond the horizon by itself
        return self

    def call_work(self, depth: int) -> tuple[int, int]:
        """One draft pass per level and the nodes of the tree cut at ``depth`` (root
        included), for ``specjax.CostModel``."""
        levels = min(depth, self.shape.max_depth)
        return levels, sum(1 for d in self.shape.depth if d <= levels)
