"""Token trees: one target call verifies a tree of drafted tokens (SpecInfer, Sequoia, Medusa,
EAGLE).

A tree is a static shape: a parent array (``parents[0] = -1`` is the root, ``parents[i] < i``;
the children of a node are ordered by index) or nested branching factors (``(4, 2, 1)``: the root
has 4 children, each of them 2, each of those 1). A call from position ``n`` after the token
``a = x_{n-1}`` puts ``a`` at the root; a node at depth ``d`` holds ``x_{n+d-1}`` and its
children are drafted from the draft's row of position ``n + d`` given that token. Nodes deeper than
``K' = min(D, T - n + 1)`` are dropped at the end of the horizon (``D``, the tree's depth, is the
decoder's ``lookahead``). The shape's own helpers (``TreeShape``, ``tree_shape``, ``tree_classes``,
``branching_parents``, the checks of both forms) are in ``specjax.decoders.tree_structure`` and
served from here too.

How children are drawn and verified (``children``):

* ``"iid"`` (SpecInfer's multi-step speculative sampling): the children of a node are i.i.d.
  from the draft ``p``; child ``j`` is accepted with ``min(1, r_j(t_j) / p(t_j))`` against the
  residual ``r_1 = q``, ``r_{j+1} = [r_j - p]_+`` (normalised); an accepted child is descended
  into, and if every child is rejected the call ends with a token drawn from the last residual.
* ``"without_replacement"`` (Sequoia; recursive rejection sampling, Jeon et al. 2024): the
  children are drawn without replacement (``d_1 = p``, ``d_{j+1}`` = ``d_j`` without ``t_j``,
  renormalised), child ``j`` is accepted with ``min(1, r_j(t_j) / d_j(t_j))``,
  ``r_{j+1} = [r_j - d_j]_+`` (normalised); a draft law with no token left ends the siblings.
* ``"top_k"`` (Medusa, EAGLE): the children are the draft's ``b`` most probable tokens (ties to
  the smaller index). Verification is the lossless rule for deterministic drafts: draw
  ``y ~ q`` at the node; descend into the child holding ``y`` if there is one, else ``y`` ends
  the call (a rejection).

At a leaf the call ends with the target's bonus token (none if the horizon has ended). Each node
is an exact rejection coupling of the current residual with the law its child is drawn from, so
the output law is the target's (the tests enumerate it).

Exact values. A call is a Markov chain over (node, token). Nodes whose truncated subtrees have the
same shape at the same depth have the same future, so they are merged into one *class* (a uniform
tree ``(b_1, .., b_D)`` has one class per depth). The law of a call (``call_law``) carries, per
class, the ``(V, V)`` matrix ``reach[a, x]`` = P(the call reaches a node of the class holding
``x`` | ``a``) down the tree: child ``j`` of a class adds ``reach @ accepted_j``, the class's
rejected mass ``reach @ rejected``, its leaves ``reach @ q`` (bonus). The per-child masses are
those of recursive rejection sampling, written once in ``specjax.decoders.multi_draft``
(``with_replacement_stage_laws``, ``without_replacement_stage_laws``). Work: ``O(C V^3)`` per
call law for ``C`` classes (``D`` for a uniform tree); ``exact`` pushes the mass of call starts
instead of ``eye`` through the classes (``call_law_from``: ``(1, V)`` reach vectors), ``O(C b
V^2)`` per position, ``T`` positions; the without-replacement law enumerates ``V^(b-1)`` paths of rejected siblings per row (refused
beyond ``2**26`` elements, as batch SD without replacement).

The sampler follows one path of the tree: the children of the current node are drafted, verified
and one of them descended into (drafting the siblings' subtrees as well would not change the law:
their tokens are independent of everything the path uses). So a call is a walk, one node per
position, and the engine advances all chains in lockstep one position per step, each from its own
node (``walk_step``; ``specjax.sampling.calls``): the laws of a position are built once for all
chains (``walk_tables``), and a chain-step reads them. With i.i.d. children a node's outcome is
drawn from its exact law, the one the exact values use (``stage_laws``): which child is the first
accepted (or none), then its token (or the last token), two uniforms per position and a search in
the per-position cumulative rows, however many children the node has. Without replacement each
child is drafted and tested in turn (``2 b + 1`` uniforms per position); ``top_k`` draws the
target's token and looks it up among the draft's top tokens (one uniform).

A chain ``(1,) * K`` with ``"iid"`` is speculative decoding with lookahead ``K``; a star
``(M,)`` is batch SD's root with one token per call, ``(M, 1, .., 1)`` batch SD with lookahead
``K`` (with or without replacement).

References:
  Miao et al. 2024, "SpecInfer" (multi-step speculative sampling); Chen et al. 2024, "Sequoia";
  Cai et al. 2024, "Medusa"; Li et al. 2024, "EAGLE"; Jeon et al. 2024, "Recursive speculative
  decoding".
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from specjax.decoders import multi_draft
from specjax.decoders.base import CallDecoder
from specjax.decoders.base import CallLaw
from specjax.decoders.base import pytree_dataclass
from specjax.decoders.draws import bernoulli
from specjax.decoders.draws import categorical_thresholds
from specjax.decoders.draws import cdf_search
from specjax.decoders.draws import cumulative_masses
from specjax.decoders.draws import draw
# The tree's shape (parent arrays, depths, classes of nodes) lives in
# specjax.decoders.tree_structure; its names are served from here too.
from specjax.decoders.tree_structure import MAX_TREE_NODES  # noqa: F401
from specjax.decoders.tree_structure import TreeShape  # noqa: F401  (served from here)
from specjax.decoders.tree_structure import TreeSpec
from specjax.decoders.tree_structure import check_tree_spec
from specjax.decoders.tree_structure import tree_classes
from specjax.decoders.verification import safe_normalize
from specjax.numerics import matmul_highest
from specjax.numerics import safe_ratio

__all__ = ["CHILDREN", "TokenTree", "first_hit", "sibling_tests", "stage_laws"]

CHILDREN = ("iid", "without_replacement", "top_k")


def stage_laws(children: str, p: jax.Array, q: jax.Array, num_children: int):
    """``(accepted (b, ..., V), rejected (..., V))``: the mass the ``j``-th child of a node
    accepts (and descends with) and the mass of the token drawn when none is, for rows ``p``,
    ``q`` of the node's context."""
    if children == "iid":
        return multi_draft.with_replacement_stage_laws(p, q, num_children)
    if children == "without_replacement":
        return multi_draft.without_replacement_stage_laws(p, q, num_children)
    num_states = p.shape[-1]
    chosen = min(num_children, num_states)
    top = jax.lax.top_k(p, chosen)[1]  # (..., b): ties go to the smaller index
    hit = jax.nn.one_hot(top, num_states, dtype=q.dtype)  # (..., b, V)
    accepted = jnp.moveaxis(hit, -2, 0) * q[None]
    if chosen < num_children:
        accepted = jnp.concatenate(
            [accepted, jnp.zeros((num_children - chosen,) + q.shape, q.dtype)])
    return accepted, q * (1 - jnp.sum(hit, axis=-2))


def sibling_tests(children: str, p, q, tokens, present):
    """The tests of a node's drafted children, in order: the rule of ``"iid"`` and
    ``"without_replacement"`` children, written once for the sampler, for given trees
    (``specjax.verify_tree``) and for their exact law.

    Child ``j`` (token ``t``) is tested against the residual ``r_j`` (``r_1 = q``) and the law it
    was drawn from, ``d_j`` (``p`` for i.i.d. children; without replacement, ``p`` without the
    siblings before it): it is accepted with probability ``min(1, r_j(t) / d_j(t))`` (0 where
    ``d_j(t) = 0``), and ``r_{j+1} = [r_j - d_j]_+`` (normalised) after a rejection. The first
    accepted child is taken. Given the tokens, ``r_j`` and ``d_j`` are those after children
    ``1..j-1`` are rejected, the only case in which child ``j`` is tested, so they are fixed
    before any random number is drawn. A child whose draft law has no token left is absent. A
    residual of mass below ``V`` float epsilons is empty (``r_j = d_j`` up to rounding): its
    rounding noise must not become a law; its later children are rejected and the call's last
    token comes from ``q``.

    Args:
      children: ``"iid"`` or ``"without_replacement"`` (static).
      p, q: ``(..., V)`` the draft's and the target's rows at the node.
      tokens: ``(..., b)`` int32 the children's tokens; ``present``: ``(..., b)`` bool.

    Returns:
      ``(alive (..., b), d (..., b), r (..., b), residual (..., V))``: whether child ``j`` is
      tested when reached, ``d_j(t_j)``, ``r_j(t_j)``, and the law of the token that ends the
      call at the node when every child is rejected (``q`` when none is present).
    """
    residual, law = q, p
    alive, d, r = [], [], []
    others = jnp.arange(p.shape[-1]).reshape((1,) * (p.ndim - 1) + (-1,))
    noise = p.shape[-1] * jnp.finfo(jnp.result_type(p, q)).eps  # of a mass that sums to 1
    for j in range(tokens.shape[-1]):
        t = tokens[..., j]
        here = present[..., j] & (jnp.sum(law, axis=-1) > 0)
        d.append(jnp.take_along_axis(law, t[..., None], axis=-1)[..., 0])
        r.append(jnp.take_along_axis(residual, t[..., None], axis=-1)[..., 0])
        rest = jnp.maximum(residual - law, 0)
        rest = jnp.where(jnp.sum(rest, axis=-1, keepdims=True) > noise, rest, 0)
        residual = jnp.where(here[..., None], safe_normalize(rest), residual)
        if children == "without_replacement":
            law = jnp.where(here[..., None], safe_normalize(law * (others != t[..., None])), law)
        alive.append(here)
    if not alive:
        empty = jnp.zeros(tokens.shape, q.dtype)
        return empty.astype(bool), empty, empty, q
    stack = functools.partial(jnp.stack, axis=-1)
    return stack(alive), stack(d), stack(r), residual


def first_hit(accepted):
    """``(..., b)``: the first ``True`` of ``accepted`` along its last axis, the others
    ``False``."""
    return accepted & (jnp.cumsum(accepted, axis=-1) == 1)


@pytree_dataclass
class TokenTree(TreeSpec, CallDecoder):
    """A static draft tree verified top-down in one target call.

    ``TokenTree((4, 2))``: the root has 4 children and each of them 2 (13 nodes, depth 2).
    ``TokenTree.from_parents(parents)``: any tree, e.g. one ``specjax.sequoia_tree`` returns.
    See the module docstring for the drafting and verification rules of each ``children``.

    Attributes:
      branching: branching factors per depth (a tuple of positive ints), or ``None`` when the
        tree is given by ``parents``.
      children: ``"iid"`` (SpecInfer), ``"without_replacement"`` (Sequoia) or ``"top_k"``
        (Medusa, EAGLE: the draft's most probable tokens, verified by sampling the target).
      parents: the parent array (``parents[0] = -1``, ``parents[i] < i``; children ordered by
        index), or ``None`` when the tree is given by ``branching``.

    The tree's depth is the decoder's ``lookahead`` (a call emits at most ``D + 1`` tokens). The
    exact law of ``"without_replacement"`` enumerates ``V^(b - 1)`` paths per row for the largest
    branching factor ``b`` and is refused beyond ``2**26`` elements.
    """

    branching: tuple | None
    _: dataclasses.KW_ONLY
    children: str = "iid"
    parents: tuple | None = None
    label_name = "token tree"
    #: A call reads only rows along the emitted path (the rejected siblings' subtrees are never
    #: read): estimated from a recording that holds the rows (``specjax.pairs.trees``).
    recording_reads = "path_rows"

    @classmethod
    def example_cases(cls) -> dict:
        return {"tree (2, 2)": cls((2, 2)),
                "tree w/o replacement": cls.from_parents((-1, 0, 0, 1, 2, 3),
                                                         children="without_replacement"),
                "tree top-k (3, 1)": cls((3, 1), children="top_k")}

    def __post_init__(self):
        check_tree_spec(self, allowed=CHILDREN, example="(4, 2)")

    def given_tree(self) -> "TokenTree":
        """The tree itself: ``specjax.verify_tree`` verifies given trees of its shape."""
        return self

    def check_exact(self, num_states: int, horizon: int) -> None:
        if self.children == "without_replacement":
            multi_draft.check_without_replacement_size(self.shape.max_children, num_states,
                                                       num_states)

    @property
    def num_uniforms(self) -> int:
        return (self.lookahead + 1) * (2 * self.shape.max_children + 1)

    def sample_call(self, tables, n, prev, u):
        """One call of one chain from position ``n`` after ``prev``, level by level (the
        literal rule; the engine walks the tree one position per step instead, ``walk_step``);
        ``u``: ``num_uniforms`` 31-bit uniforms, ``2 b + 1`` per depth (drafts, acceptances,
        the last token)."""
        p_trans, q_trans = tables
        horizon = p_trans.shape[0]
        depth, width = self.shape.max_depth, self.shape.max_children
        table = self._child_table()

        def level(carry, inputs):
            node, x, done, kept, last_rejected, emitted = carry
            d, u_d = inputs
            row = jnp.clip(n - 1 + d, 0, horizon - 1)
            in_horizon = n + d <= horizon
            p_row, q_row = p_trans[row, x], q_trans[row, x]
            kids = table[node]
            present = (kids >= 0) & in_horizon
            tokens, present, hit, residual = self._draft_and_verify(p_row, q_row, u_d, present)
            y = draw(categorical_thresholds(residual), u_d[2 * width])
            if self.children == "top_k":  # the lossless rule: descend into the child holding y
                hit = present & (tokens == y)
            accepted = jnp.any(hit)
            choice = jnp.argmax(hit)
            token = jnp.where(accepted, tokens[choice], y)
            live = ~done
            emitted = emitted.at[d].set(jnp.where(live, token, emitted[d]))
            descend = live & accepted
            return (jnp.where(descend, kids[choice], node), jnp.where(descend, token, x),
                    done | ~descend, kept + descend.astype(jnp.int32),
                    jnp.where(live & ~accepted, jnp.any(present), last_rejected), emitted), None

        carry = (jnp.zeros((), jnp.int32), prev, jnp.zeros((), bool), jnp.zeros((), jnp.int32),
                 jnp.zeros((), bool), jnp.zeros((depth + 1,), jnp.int32))
        inputs = (jnp.arange(depth + 1), u.reshape(depth + 1, 2 * width + 1))
        (_, _, _, kept, last_rejected, emitted), _ = jax.lax.scan(level, carry, inputs)
        return emitted, kept, last_rejected

    @property
    def walk_uniforms(self) -> int:
        """Uniforms of one position of one chain: one for ``"top_k"`` (the target's draw), two
        for ``"iid"`` (which child is accepted, then the token), ``2 b + 1`` without replacement
        (the drafts, their tests, the last token)."""
        if self.children == "without_replacement":
            return 2 * self.shape.max_children + 1
        return 1 if self.children == "top_k" else 2

    def walk_start(self):
        return jnp.zeros((), jnp.int32)  # the root

    def _end_factors(self) -> tuple:
        """The branching factors of the tree's nodes, leaves (0) included, in increasing order:
        the laws a call can end with."""
        return tuple(sorted({len(kids) for kids in self.shape.children}))

    def walk_tables(self, draft, target, row):
        """The laws of position ``row`` for every previous token, built once for all chains.

        ``"iid"``: the cumulative masses ``(b + F, V, V)`` of the rows a chain draws its token
        from: ``accepted_j`` (``j = 1..b``), the mass the ``j``-th child accepts
        (``multi_draft.with_replacement_stage_laws``: ``min(W_j p, w_j)``), then, for each
        branching factor ``f`` of the tree (leaves' ``f = 0`` included), ``w_{f + 1} = [q - S_f
        p]_+``, the token that ends a call when the node's ``f`` children are all rejected (``q``,
        the bonus, at a leaf). ``"top_k"``: the draft's ``b`` most probable tokens ``(V, b)`` and
        the cumulative target rows. ``"without_replacement"``: the rows ``(p, q)``.
        """
        p, q = draft.trans[row], target.trans[row]
        width = self.shape.max_children
        if self.children == "without_replacement":
            return p, q
        if self.children == "top_k":
            top = jax.lax.top_k(p, min(width, p.shape[-1]))[1].astype(jnp.int32)
            return top, cumulative_masses(q)
        accepted, _ = multi_draft.with_replacement_stage_laws(p, q, width)  # (b, V, V)
        _, cums = multi_draft.scale_sweep(p, q, width + 1)  # S_1 .. S_b
        ends = [jnp.maximum(q - cums[:, f - 1:f] * p, 0) if f else q
                for f in self._end_factors()]
        return cumulative_masses(jnp.concatenate([accepted, jnp.stack(ends)]))  # (b + F, V, V)

    def walk_step(self, tables, prev, state, u):
        """One position of one chain at node ``state`` after token ``prev``: the node's children
        are drafted and verified (the rules of ``sample_call``); an accepted child is descended
        into, else the call ends there with a token from the last residual (the target's bonus
        at a leaf) and the chain is back at the root.

        ``"iid"`` draws the outcome of the whole node from its law, the one the exact values use
        (``stage_laws``): the first accepted child ``j <= b`` with probability ``alpha_j = sum
        accepted_j``, none with ``W_{b + 1} = sum w_{b + 1}`` (one uniform), then the child's
        token from ``accepted_j``, or the last token from ``w_{b + 1}`` (a second uniform): two
        draws per position whatever the branching factor.
        """
        node = state
        kids = self._child_table()[node]
        present = kids >= 0
        num_states = tables[-1].shape[-1]
        if self.children == "iid":
            cdf = tables
            width = kids.shape[-1]
            num_kids = jnp.sum(present)
            end_row = jnp.asarray([width + self._end_factors().index(len(k))
                                   for k in self.shape.children], jnp.int32)[node]
            # the first accepted child's law: alpha_j (j <= b), then none (index b)
            first = cumulative_masses(jnp.concatenate([
                jnp.where(present, cdf[:width, prev, num_states - 1], 0),
                cdf[end_row, prev, num_states - 1][None]]))
            choice = cdf_search(lambda i: first[i], u[0], width + 1)
            accepted = choice < width  # a child of zero mass (j > b) is never drawn
            source = jnp.where(accepted, choice, end_row)
            token = cdf_search(lambda i: cdf[source, prev, i], u[1], num_states)
            leaf = num_kids == 0
            return (token, jnp.where(accepted, kids[jnp.minimum(choice, width - 1)], 0)
                    .astype(jnp.int32), ~accepted & ~leaf, node == 0, ~accepted & leaf)
        if self.children == "top_k":
            top, q_cdf = tables
            tokens = jnp.full(kids.shape, -1, jnp.int32).at[:top.shape[-1]].set(top[prev])
            present = present & (tokens >= 0)
            y = cdf_search(lambda i: q_cdf[prev, i], u[0], num_states)
            hit = present & (tokens == y)
        else:
            p, q = tables
            tokens, present, hit, residual = self._draft_and_verify(p[prev], q[prev], u, present)
            y = draw(categorical_thresholds(residual), u[2 * kids.shape[-1]])
        accepted = jnp.any(hit)
        choice = jnp.argmax(hit)
        token = jnp.where(accepted, tokens[choice], y).astype(jnp.int32)
        leaf = ~jnp.any(present)
        return (token, jnp.where(accepted, kids[choice], 0).astype(jnp.int32),
                ~accepted & ~leaf, node == 0, ~accepted & leaf)

    def _child_table(self):
        """``(nodes, b)`` int32: the children of each node, ``-1``-padded."""
        table = np.full((len(self.shape.parents), self.shape.max_children), -1, np.int32)
        for i, kids in enumerate(self.shape.children):
            table[i, :len(kids)] = kids
        return jnp.asarray(table)

    def _draft_and_verify(self, p_row, q_row, u_d, present):
        """Draft the children of one node and verify them in turn: ``(tokens (b,), present
        (b,), accepted (b,) bool, residual (V,))``, the last the law of the token that ends the
        call there (``q`` at a leaf). For ``top_k`` the drafts are deterministic and
        ``accepted`` is decided by the caller's draw from ``q``; ``"iid"`` children are drawn
        from the draft, without replacement each from the draft without the siblings drawn
        before it."""
        width = self.shape.max_children
        if self.children == "top_k":
            chosen = min(width, p_row.shape[-1])
            tokens = jax.lax.top_k(p_row, chosen)[1].astype(jnp.int32)
            if chosen < width:
                tokens = jnp.concatenate([tokens, jnp.full((width - chosen,), -1, jnp.int32)])
                present = present & (jnp.arange(width) < chosen)
            return tokens, present, None, q_row
        law, tokens = p_row, []
        for j in range(width):  # i.i.d., or from the draft without the siblings before it
            t = draw(categorical_thresholds(law), u_d[j])
            tokens.append(t)
            if self.children == "without_replacement":
                law = safe_normalize(law * (jnp.arange(law.shape[-1]) != t))
        tokens = jnp.stack(tokens).astype(jnp.int32)

        alive, d, r, residual = sibling_tests(self.children, p_row, q_row, tokens, present)
        hit = first_hit(alive & bernoulli(jnp.minimum(safe_ratio(r, d, 1), 1),
                                          u_d[width:2 * width]))
        return tokens, alive, hit, residual

    def call_law(self, p_rows, q_rows, bonus_row, *, with_bonus: bool) -> CallLaw:
        """The exact law of one call, by classes of nodes (see the module docstring).

        Args:
          p_rows: ``(K', V, V)`` draft rows of the call's positions.
          q_rows: ``(K', V, V)`` target rows of the same positions.
          bonus_row: ``(V, V)`` target row after them (unused without bonus).
          with_bonus: whether that position exists (static).
        """
        eye = jnp.eye(p_rows.shape[-1], dtype=q_rows.dtype)
        return self._pushed_law(eye, p_rows, q_rows, bonus_row, with_bonus=with_bonus)

    def call_law_from(self, start, p_rows, q_rows, bonus_row, *, with_bonus: bool) -> CallLaw:
        """The law of one call whose previous token has the law ``start`` (``(V,)``): the same
        recursion with ``(1, V)`` reach vectors, ``O(nodes V^2)`` instead of ``O(classes
        V^3)``; the exact recursion calls it once per position."""
        law = self._pushed_law(start[None].astype(q_rows.dtype), p_rows, q_rows, bonus_row,
                               with_bonus=with_bonus)
        return CallLaw(*(x[:, 0] for x in law))

    def _pushed_law(self, reach0, p_rows, q_rows, bonus_row, *, with_bonus: bool) -> CallLaw:
        """``call_law`` with the root's reach ``reach0`` (``(A, V)``): fields ``(K', A, V)``."""
        k = p_rows.shape[0]
        levels = tree_classes(self.shape.parents, k)
        zeros = jnp.zeros_like(reach0)
        reach = [reach0]
        kept, rejected, bonus = [], [], []
        for d in range(k + 1):
            nxt = [zeros] * (len(levels[d + 1]) if d < k else 0)
            rejected_d, bonus_d = zeros, zeros
            laws = {}
            for c, kids in enumerate(levels[d]):
                if kids:
                    if len(kids) not in laws:
                        laws[len(kids)] = stage_laws(self.children, p_rows[d], q_rows[d],
                                                     len(kids))
                    accepted, last = laws[len(kids)]
                    rejected_d = rejected_d + matmul_highest(reach[c], last)
                    for j, kid in enumerate(kids):
                        nxt[kid] = nxt[kid] + matmul_highest(reach[c], accepted[j])
                elif d < k or with_bonus:
                    bonus_d = bonus_d + matmul_highest(reach[c], q_rows[d] if d < k else bonus_row)
            rejected.append(rejected_d)
            bonus.append(bonus_d)
            if d < k:
                kept.append(sum(nxt[1:], nxt[0]))
                reach = nxt
        return CallLaw(kept=jnp.stack(kept), rejected=jnp.stack(rejected),
                       bonus=jnp.stack(bonus))

