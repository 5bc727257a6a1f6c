"""Traversal Verification (Weng et al., NeurIPS 2025): a static draft tree verified leaf to root,
one whole sequence (root to node) at a time.

Source. Weng, Hu, Chen, Liu, Mei, Qiu, Tian and Shi, *Traversal Verification for Speculative
Tree Decoding* (arXiv 2505.12398, NeurIPS 2025). The abstract was read (arxiv.org/html/2505.12398v1
and v2 as stored by the project's search tool); the algorithm's own text (its Algorithm 1) could
not be reached from this machine. The rule below is transcribed from two public third-party
implementations that quote its lines and equations (``traversal_verification_tree``, found with
the search tool's code index: the initial weights ``p_ini``, the post-order traversal, the residual
update of "Algorithm 3, lines 11-13" and "Eq. (3)" ``p' = S / (S + 1 - p)``, sibling deletion
renormalising the draft law, "Sample Y from M_b(. | X_tau)") and checked against what the abstract
and the project's notes state (leaf to root, lossless, block verification on a single chain). On a
chain it is exactly Sun et al.'s block verification (``specjax.BlockVerification``), and the tests
enumerate its output law: it is the target's.

The tree and its drafts are ``specjax.TokenTree``'s (``branching`` or ``from_parents``; the
children of a node are drafted from the draft ``p`` of the node's context, ``children="iid"``
i.i.d., ``"without_replacement"`` in sibling order without the siblings before them, the paper's
drafting: the same laws as ``TokenTree(..., children=...)``; a child whose law has no token left
is absent). Each node ``X`` of depth ``d`` holds a token; ``M_b(. | X)``
and ``M_s(. | X)`` are the target's and the draft's rows after it (the root holds the previous
token ``a``), and ``alpha(X)`` its acceptance weight. One call:

1. ``alpha(root) = 1``; ``alpha(X) = min(alpha(parent) M_b(x | parent) / M_s(x | parent), 1)``
   (``p_ini``: the sequence-level weight of block verification, 0 where ``M_s(x) = 0``).
2. Take ``X``, the first node of the tree's post-order (the leftmost deepest leaf, then its next
   sibling's subtree, ..., the parent once all its children are gone). Draw ``eta ~ U(0, 1)``:
   * ``eta < alpha(X)``: accept the sequence root -> ``X`` (``tau = depth(X)`` drafts kept) and draw
     the last token ``Y ~ M_b(. | X)``: the target's row (the bonus token) if ``X`` is a leaf of
     the tree, else ``X``'s residual (a rejection). Stop.
   * else delete ``X``. At its parent ``P``: ``S = sum_y [alpha(P) M_b(y | P) - M_s(y | P)]_+``,
     ``M_b(. | P) <- [alpha(P) M_b(. | P) - M_s(. | P)]_+ / S``, ``alpha(P) <- S / (S + 1 -
     alpha(P))``, ``M_s(. | P)`` <- the law the remaining siblings are drawn from (the paper's,
     without replacement: ``M_s`` without ``x``, renormalised; for i.i.d. children ``p`` itself,
     this module's reading of the rule for SpecInfer's drafts), and ``alpha`` of ``P``'s
     remaining subtrees is recomputed from step 1's formula. Repeat 2.

The root's weight stays 1 (``S / (S + 0)``), so a call always ends, at the root at the latest (``Y``
from the residual chain ``[q - p]_+`` of recursive rejection sampling, SpecInfer's root). With a
chain ``(1,) * K`` the deletions are block verification's backward pass: ``alpha`` after the
deletion of the child is ``h_i = R_i / (R_i + 1 - w_i)``. Nodes deeper than ``K' = min(D, T - n +
1)`` are dropped at the end of the horizon; a leaf at depth ``K' = T - n + 1`` that is accepted
ends the sequence (no bonus).

Post-order makes the traversal a fixed sequence: deleting the first node of the post-order leaves
the rest of it in order, so the nodes are tested in the tree's own post-order, each once, until one
is accepted. And the weights a node is tested with are set when its subtree is entered (its
parent's state after the deletion of its earlier siblings, recomputed by step 2 whenever a sibling
is deleted) and updated by its own children's deletions. With ``m = alpha(P) M_b(. | P)`` (the
sequence-level mass of ``P``'s continuations) a deletion is ``m <- [m - p]_+ / (1 - sum min(m, p))``
for i.i.d. children: it does not depend on the deleted token (without replacement it does,
through ``M_s``). The sampler drafts the whole tree, then walks its Euler tour (``enter`` a node,
``test`` it) with one ``(alpha, M_b, M_s)`` state per depth: ``2 N`` static steps for ``N`` nodes,
``2 N`` uniforms (``N - 1`` drafts, ``N`` tests, the last token).

Exact call law (``call_law``). For a node ``X`` of depth ``d`` write its path ``x_{0:d}`` (``x_0 =
a``), ``p_d``, ``q_d`` the rows at the call's position ``d`` and, as arrays over ``x_{0:d}``:

* ``alpha_X`` the weight ``X`` is entered with; ``R_X`` = P(``X``'s subtree is entered holding
  ``x_{1:d}`` | ``a``) (``R_root = 1``);
* ``m_1 = alpha_X q_d(. | x_d)``; child ``c_j`` of ``X`` holding ``t`` is entered with ``alpha =
  min(m_j(t) / p_d(t | x_d), 1)`` and ``R_{c_j} = R_X s_{j-1} p_d(t | x_d)``; ``G_{c_j}(x_{0:d},
  t)`` = P(``c_j``'s subtree ends with ``c_j`` deleted | it was entered); ``s_j = s_{j-1} sum_t
  p_d(t | x_d) G_{c_j}``, ``s_0 = 1``; ``m_{j+1} = [m_j - p_d]_+ / (1 - sum min(m_j, p_d))``;
* after the ``b`` children, ``X`` is tested with weight ``sum m_{b+1}``: the call keeps
  ``x_{1:d}`` and emits ``y`` with mass ``R_X s_b m_{b+1}(y)`` (rejected, for ``b > 0``), or, at a
  leaf, ``R_X alpha_X q_d(y | x_d)`` (the bonus; the bonus row at ``d = K'``); ``G_X = s_b (1 -
  sum m_{b+1})`` (``1 - alpha_X`` at a leaf).

``rejected[d]``, ``bonus[d]`` sum those masses over ``x_{1:d}``; ``kept[i - 1]`` sums the mass of
every acceptance at depth ``>= i`` over all path tokens but ``x_i``. The arrays of a node of depth
``d`` have ``V^(d + 2)`` elements (the whole law ``O(sum_X V^(depth(X) + 2))``). Without
replacement child ``c_j`` is drawn from ``M_s`` without ``t_1..t_{j-1}`` and the state of ``X``
after a deletion depends on the deleted token ``t_j``: the arrays keep an axis per deleted
sibling (``s_j(.., t_1, .., t_j) = s_{j-1} M_{s,j}(t_j) G_{c_j}(t_j)``, the state updated per
``t_j``, an absent child leaving it unchanged), and ``G_X`` sums those axes out. ``law_size``
counts the elements; ``check_exact`` refuses more than ``MAX_PATHS``. ``call_law_from`` pushes
the law of the previous token in as ``R_root`` (the same pass). Values and gradients are finite
at zero probabilities, ``p = q`` and disjoint supports (every ratio and normalisation is
NaN-free).

How much it accepts. On chains it equals block verification, optimal among verifiers of one
drafted block (Sun et al.). On a star ``(b,)`` it is recursive rejection sampling (the root's
weight is 1): token-level verification of the same tree. On deeper trees the paper reports gains
over token-level verification from experiments; ``scripts/study_traversal.py`` tabulates the exact
expected accepted drafts of both (``docs/guides/traversal.md``).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from specjax.decoders.base import CallDecoder
from specjax.decoders.base import CallLaw
from specjax.decoders.base import pytree_dataclass
from specjax.decoders.draws import bernoulli
from specjax.decoders.draws import categorical_thresholds
from specjax.decoders.draws import draw
from specjax.decoders.tree_structure import TreeSpec
from specjax.decoders.tree_structure import check_tree_spec
from specjax.decoders.tree_structure import tree_shape
from specjax.decoders.verification import safe_normalize
from specjax.numerics import safe_ratio

__all__ = [
    "CHILDREN",
    "MAX_EXACT_NODES",
    "MAX_PATHS",
    "TraversalVerification",
    "deletion_update",
    "entry_weight",
]

MAX_PATHS = 2**22  # largest sum over nodes of V^(depth + 2) the exact law enumerates
MAX_EXACT_NODES = 256  # most nodes (within the horizon) whose exact law is compiled
CHILDREN = ("iid", "without_replacement")


def entry_weight(alpha, mb, ms):
    """``min(alpha M_b(t) / M_s(t), 1)`` (0 where ``M_s(t) = 0``): the weight a child holding
    ``t`` is entered with, from its parent's ``alpha`` and the rows' masses at ``t`` (``mb``,
    ``ms``, broadcasting)."""
    return jnp.minimum(safe_ratio(alpha * mb, ms, 0), 1)


def deletion_update(alpha, mb, ms):
    """The parent's state after one of its children is deleted: ``(alpha', M_b')`` with
    ``S = sum [alpha M_b - M_s]_+``, ``M_b' = [alpha M_b - M_s]_+ / S``, ``alpha' = S / (S + (1 -
    alpha))`` (1 where that is ``0/0``: only a null path reaches it). ``alpha``: ``(...)``; ``mb``,
    ``ms``: ``(..., V)``. The rule, written once for the sampler and the exact law."""
    residual = jnp.maximum(alpha[..., None] * mb - ms, 0)
    mass = jnp.sum(residual, axis=-1)
    return safe_ratio(mass, mass + (1 - alpha), 1), safe_normalize(residual)


@functools.lru_cache(maxsize=64)
def _euler_tour(parents: tuple):
    """``(kinds, nodes)``: the tree's Euler tour, ``kind`` 0 entering a node, 1 testing it (after
    its subtree: the post-order)."""
    shape = tree_shape(parents)
    kinds, nodes = [], []

    def visit(i):
        kinds.append(0)
        nodes.append(i)
        for c in shape.children[i]:
            visit(c)
        kinds.append(1)
        nodes.append(i)

    visit(0)
    return np.asarray(kinds, np.int32), np.asarray(nodes, np.int32)


@pytree_dataclass
class TraversalVerification(TreeSpec, CallDecoder):
    """Traversal Verification (Weng et al. 2025) of a static draft tree: leaf to root, one whole
    sequence at a time (see the module docstring for the rule, its source and its exact law).

    ``TraversalVerification((2, 2))``: the tree of ``TokenTree((2, 2))``, drafted the same way
    (children i.i.d. from the draft), verified by traversal instead of token by token.
    ``TraversalVerification.from_parents(parents)``: any tree. A chain ``(1,) * K`` is
    ``BlockVerification(K)``.

    Attributes:
      branching: branching factors per depth, or ``None`` when the tree is given by ``parents``.
      children: ``"iid"`` (SpecInfer's drafts) or ``"without_replacement"`` (the paper's and
        Sequoia's): how siblings are drafted, as for ``TokenTree``.
      parents: the parent array (``parents[0] = -1``, ``parents[i] < i``), or ``None``.

    The exact law enumerates the path tokens of every node (``V^(depth + 2)`` elements per node,
    more without replacement: ``law_size``) and is refused beyond ``MAX_PATHS`` (``2**22``).

    Example:
      >>> import specjax
      >>> draft, target = specjax.paper_instance()
      >>> tv = specjax.TraversalVerification((2, 1))
      >>> round(float(specjax.exact(tv, draft, target).expected_calls), 2)
      24.96

    References:
      Weng et al. 2025, "Traversal Verification for Speculative Tree Decoding" (arXiv
      2505.12398); Sun et al. 2024, "Block verification accelerates speculative decoding".
    """

    branching: tuple | None
    _: dataclasses.KW_ONLY
    children: str = "iid"
    parents: tuple | None = None
    label_name = "traversal verification"

    @classmethod
    def example_cases(cls) -> dict:
        return {"traversal (2,)": cls((2,))}

    def __post_init__(self):
        check_tree_spec(self, allowed=CHILDREN, example="(2, 2)",
                        why_not=" for TraversalVerification (deterministic top-k drafts have no "
                                "draft law to verify against)")

    def check_exact(self, num_states: int, horizon: int) -> None:
        """The exact law's arrays (``law_size``) must stay within ``MAX_PATHS`` elements, and
        the nodes it walks (the tree cut at the horizon) within ``MAX_EXACT_NODES``."""
        levels = min(horizon, self.lookahead)
        nodes = self.nodes_within(levels)
        if nodes > MAX_EXACT_NODES:
            raise ValueError(f"branching: the exact law walks the tree's {nodes} nodes within "
                             f"{levels} levels, beyond the bound {MAX_EXACT_NODES}: its program "
                             f"is unrolled node by node, and compiling it grows fast with them "
                             f"(85 nodes took 20-30 s on a 2-core CPU, 585 over 5 minutes); use "
                             f"a smaller tree, or specjax.decode to simulate it")
        size = self.law_size(num_states, levels)
        if size > MAX_PATHS:
            raise ValueError(f"branching: the exact law of this tree enumerates {size} path "
                             f"elements on V = {num_states} tokens, beyond the bound {MAX_PATHS} "
                             "(2**22); use a smaller or shallower tree")

    def nodes_within(self, levels: int) -> int:
        """The tree's nodes at depth at most ``levels`` (the root included)."""
        shape = self.shape

        def count(node, d):
            kids = shape.children[node] if d < levels else ()
            return 1 + sum(count(c, d + 1) for c in kids)

        return count(0, 0)

    def law_size(self, num_states: int, levels: int) -> int:
        """Elements of the exact law's arrays for the tree cut at depth ``levels``: a node
        entered over a context of ``r`` axes holds ``V^(r + 1)``; without replacement each
        deleted sibling adds an axis to its parent's context."""
        shape = self.shape
        grow = self.children == "without_replacement"

        def size(node, rank, d):
            kids = shape.children[node] if d < levels else ()
            total = num_states**(rank + (1 if kids else 0))
            for j, c in enumerate(kids):
                total += size(c, rank + (j if grow else 0) + 1, d + 1)
            return total + (num_states**(rank + len(kids) * grow + 1) if kids else 0)

        return size(0, 1, 0)

    @property
    def num_uniforms(self) -> int:
        return 2 * self.num_nodes

    def prepare(self, draft, target):
        return categorical_thresholds(draft.trans), draft.trans, target.trans

    def sample_call(self, tables, n, prev, u):
        """One call of one chain from position ``n`` after ``prev``: the whole tree drafted
        (``u[:N - 1]``), its Euler tour walked with one ``(alpha, M_b)`` state per depth
        (``u[N - 1:2N - 1]`` the tests, in post-order), the last token from ``u[2N - 1]``."""
        draft_thr, p_trans, q_trans = tables
        horizon = p_trans.shape[0]
        shape = self.shape
        num_nodes, depth_max = self.num_nodes, shape.max_depth
        parents = np.asarray(shape.parents, np.int32)
        depth = np.asarray(shape.depth, np.int32)
        num_states = p_trans.shape[-1]
        levels = jnp.clip(horizon - n + 1, 0, depth_max)  # K'
        rows = jnp.clip(n - 1 + jnp.arange(depth_max + 1), 0, horizon - 1)

        table = np.full((num_nodes, max(shape.max_children, 1)), -1, np.int32)
        for i, kids in enumerate(shape.children):
            table[i, :len(kids)] = kids
        tokens = jnp.zeros((num_nodes,), jnp.int32).at[0].set(prev)
        drafted = jnp.zeros((num_nodes,), bool).at[0].set(True)
        for d in range(depth_max):  # draft the children of depth-d nodes, in sibling order
            at = np.nonzero(depth == d)[0]
            law = p_trans[rows[d], tokens[at]]  # (nodes, V): the law child j is drawn from
            for j in range(table.shape[1]):
                kid = table[at, j]
                valid = (kid >= 0) & drafted[at] & (jnp.sum(law, axis=-1) > 0)
                if self.children == "iid":
                    thr = draft_thr[rows[d], tokens[at]]
                else:
                    thr = categorical_thresholds(law)
                drawn = jax.vmap(draw)(thr, u[np.maximum(kid, 1) - 1]).astype(jnp.int32)
                slot = np.where(kid >= 0, kid, num_nodes)  # -1: dropped
                tokens = tokens.at[slot].set(drawn, mode="drop")
                drafted = drafted.at[slot].set(valid, mode="drop")
                if self.children == "without_replacement":
                    gone = jnp.arange(num_states)[None, :] == drawn[:, None]
                    law = jnp.where(valid[:, None], safe_normalize(law * ~gone), law)

        present = drafted & (jnp.asarray(depth) <= levels)
        inner = jnp.any(jnp.where(table >= 0, present[np.maximum(table, 0)], False), axis=-1)
        kinds, nodes = _euler_tour(shape.parents)
        test_index = np.zeros(num_nodes, np.int32)  # the node's rank in the post-order
        test_index[nodes[kinds == 1]] = np.arange(num_nodes)

        def step(carry, event):
            alpha, mb, ms, done, chosen = carry
            kind, node, d, parent, ui = event
            t = tokens[node]
            live = ~done & present[node]
            up = jnp.maximum(d - 1, 0)
            # enter: the node's weight from its parent's current state; M_b(. | node) = q's row
            enter_alpha = jnp.where(d == 0, 1.0, entry_weight(alpha[up], mb[up, t], ms[up, t]))
            entered = live & (kind == 0)
            alpha = alpha.at[d].set(jnp.where(entered, enter_alpha, alpha[d]))
            mb = mb.at[d].set(jnp.where(entered, q_trans[rows[d], t], mb[d]))
            ms = ms.at[d].set(jnp.where(entered, p_trans[rows[d], t], ms[d]))
            # test: accept with alpha, else delete the node and update its parent
            tested = live & (kind == 1)
            accept = tested & bernoulli(alpha[d], u[ui])
            new_alpha, new_mb = deletion_update(alpha[up], mb[up], ms[up])
            delete = tested & ~accept & (d > 0)
            alpha = alpha.at[up].set(jnp.where(delete, new_alpha, alpha[up]))
            mb = mb.at[up].set(jnp.where(delete, new_mb, mb[up]))
            if self.children == "without_replacement":  # the siblings' law loses t
                rest = safe_normalize(ms[up] * (jnp.arange(num_states) != t))
                ms = ms.at[up].set(jnp.where(delete, rest, ms[up]))
            return (alpha, mb, ms, done | accept, jnp.where(accept, node, chosen)), None

        events = (kinds, nodes, depth[nodes], np.maximum(parents[nodes], 0),
                  num_nodes - 1 + test_index[nodes])
        dtype = q_trans.dtype
        stack = jnp.zeros((depth_max + 1, num_states), dtype)
        carry = (jnp.ones((depth_max + 1,), dtype), stack, stack, jnp.zeros((), bool),
                 jnp.zeros((), jnp.int32))
        (_, mb, _, _, chosen), _ = jax.lax.scan(step, carry, tuple(jnp.asarray(e) for e in events))
        kept = jnp.asarray(depth)[chosen]
        y = draw(categorical_thresholds(mb[kept]), u[2 * num_nodes - 1])
        # the path root -> chosen: ancestors[i, k] is node i's ancestor at depth k + 1
        ancestors = np.zeros((num_nodes, depth_max), np.int32)
        for i in range(num_nodes):
            j = i
            while j > 0:
                ancestors[i, depth[j] - 1] = j
                j = parents[j]
        path = tokens[jnp.asarray(ancestors)[chosen]]
        emitted = jnp.concatenate([path, y[None].astype(jnp.int32)]).at[kept].set(y)
        return emitted, kept, inner[chosen]

    def call_law(self, p_rows, q_rows, bonus_row, *, with_bonus: bool) -> CallLaw:
        """The exact law of one call (see the module docstring).

        Args:
          p_rows: ``(K', V, V)`` draft rows of the call's positions.
          q_rows: ``(K', V, V)`` target rows of the same positions.
          bonus_row: ``(V, V)`` target row after them (unused without bonus).
          with_bonus: whether that position exists (static).
        """
        reach = jnp.ones((p_rows.shape[-1],), q_rows.dtype)
        return self._law(reach, p_rows, q_rows, bonus_row, with_bonus=with_bonus, keep_start=True)

    def call_law_from(self, start, p_rows, q_rows, bonus_row, *, with_bonus: bool) -> CallLaw:
        """The law of one call whose previous token has the law ``start`` (``(V,)``), from the
        same pass with ``R_root = start``."""
        return self._law(start.astype(q_rows.dtype), p_rows, q_rows, bonus_row,
                         with_bonus=with_bonus, keep_start=False)

    def _law(self, reach0, p_rows, q_rows, bonus_row, *, with_bonus: bool, keep_start: bool):
        k, num_states, _ = p_rows.shape
        shape = self.shape
        dtype = q_rows.dtype
        zeros = jnp.zeros((num_states, num_states), dtype)
        kept = [zeros] * k
        rejected = [zeros] * (k + 1)
        bonus = [zeros] * (k + 1)
        replacement = self.children == "iid"

        def row_at(row, rank, axis):
            """A ``(V, V)`` row ``(x, y)`` broadcast to rank ``rank + 1``: ``x`` at ``axis``,
            ``y`` last."""
            dims = [1] * (rank + 1)
            dims[axis] = dims[-1] = num_states
            return row.reshape(dims)

        def to_start_y(mass):
            """``(x_0, .., y)`` -> ``(x_0, y)``: summed over every axis in between."""
            return jnp.sum(mass, axis=tuple(range(1, mass.ndim - 1)))

        def accept(mass, path_axes):
            """Adds an acceptance of mass ``mass`` (its path tokens at ``path_axes``) to
            ``kept``."""
            for i in range(1, len(path_axes)):
                axes = tuple(a for a in range(1, mass.ndim) if a != path_axes[i])
                kept[i - 1] = kept[i - 1] + jnp.sum(mass, axis=axes)

        def visit(node, alpha, reach, path_axes):
            """Node of depth ``d = len(path_axes) - 1`` entered with weight ``alpha`` and mass
            ``reach`` (arrays over its context: the path tokens at ``path_axes``, its own last,
            and, without replacement, the tokens of the deleted siblings of its ancestors): adds
            its subtree's outcomes, returns ``G`` (its deletion) over the same context."""
            d = len(path_axes) - 1
            rank = alpha.ndim
            kids = list(shape.children[node]) if d < k else []
            if not kids:
                row = q_rows[d] if d < k else bonus_row
                if d < k or with_bonus:
                    out = (reach * alpha)[..., None] * row_at(row, rank, rank - 1)
                    bonus[d] = bonus[d] + to_start_y(out)
                accept(reach * alpha, path_axes)
                return 1 - alpha
            ms = jnp.broadcast_to(row_at(p_rows[d], rank, rank - 1), alpha.shape + (num_states,))
            mb = jnp.broadcast_to(row_at(q_rows[d], rank, rank - 1), alpha.shape + (num_states,))
            survive = jnp.ones_like(alpha)
            for c in kids:
                child_alpha = entry_weight(alpha[..., None], mb, ms)
                child_reach = (reach * survive)[..., None] * ms
                gone = visit(c, child_alpha, child_reach, path_axes + [alpha.ndim])
                if replacement:  # the state after a deletion does not depend on the token
                    survive = survive * jnp.sum(ms * gone, axis=-1)
                    alpha, mb = deletion_update(alpha, mb, ms)
                    continue
                # without replacement it does: a new axis, the deleted sibling's token t
                exhausted = jnp.sum(ms, axis=-1) <= 0  # no token left: the child is absent
                now = alpha.ndim  # an absent child keeps the state (at t = 0)
                first = (jnp.arange(num_states) == 0).reshape((1,) * now + (num_states,))
                survive = (survive[..., None] * ms * gone
                           + (survive * exhausted)[..., None] * first)
                new_alpha, new_mb = deletion_update(alpha[..., None], mb[..., None, :],
                                                    ms[..., None, :])
                others = 1 - jnp.eye(num_states, dtype=dtype).reshape((1,) * now + (
                    num_states, num_states))
                new_ms = safe_normalize(ms[..., None, :] * others)
                keep = exhausted[..., None]
                alpha = jnp.where(keep, alpha[..., None], new_alpha)
                mb = jnp.where(keep[..., None], mb[..., None, :], new_mb)
                ms = jnp.where(keep[..., None], ms[..., None, :], new_ms)
                reach = jnp.broadcast_to(reach[..., None], alpha.shape)
            final = reach * survive * alpha
            rejected[d] = rejected[d] + to_start_y(final[..., None] * mb)
            accept(final, path_axes)
            return jnp.sum(survive * (1 - alpha), axis=tuple(range(rank, alpha.ndim)))

        visit(0, jnp.ones_like(reach0), reach0, [0])
        law = CallLaw(kept=jnp.stack(kept), rejected=jnp.stack(rejected), bonus=jnp.stack(bonus))
        if keep_start:
            return law
        return CallLaw(*(jnp.sum(x, axis=1) for x in law))
