"""Dynamic token trees (EAGLE-2) and the speed of light of deterministic speculation.

Each call builds its own deterministic tree from the call's context: the ``budget - 1`` drafted
prefixes ``x_n .. x_{n+d-1}`` (``1 <= d <= max_depth``) of largest *path probability* under a
ranking model, the draft (``rank="draft"``: EAGLE-2 grows its tree by the product of the draft's
confidences and keeps the best nodes) or the target itself (``rank="target"``: the best any
deterministic tree of that size can do, the "speed of light" of Pankratov & Alistarh 2025). The
root (the call's previous token) is the ``budget``-th node: ``budget`` counts the tokens one target
call verifies, as ``specjax.sequoia_tree`` does.

Verification is the lossless rule for deterministic drafts: at each node draw ``y`` from the
target; descend into the child holding ``y`` if the tree has one, else ``y`` ends the call (a
rejection when the node has children, the bonus token at a leaf). So the output law is the
target's, and a call keeps at least ``d`` drafts with probability the target probability of the
path: ``E[accepted] = sum over drafted nodes of q(path)``. Ranking by the target maximises that
sum over every deterministic tree with ``budget`` nodes (a prefix-closed set of the most
probable target prefixes).

The tree. Path probabilities never increase along a path, so the best prefixes form a tree when
ties go to the shallower prefix. It is built by a beam per depth: the ``B = budget - 1`` best
children of depth ``d``'s beam form depth ``d + 1``'s beam (``top_k`` over ``B V`` candidates, ties
to the smaller index), and the best ``B`` of all beams, ranked by (probability, shallower, beam
order), are kept. Prefixes of probability zero under the ranking model are never kept, so the tree
can be smaller than the budget. The same function builds the tree in the sampler and in the exact
law, for every previous token at once in the latter.

Exact values: ``call_law`` builds the tree for each previous token and sums target path
probabilities (``O(D B V)`` per previous token and position, plus the beams' ``top_k``). Values are
differentiable in the target's probabilities along the chosen paths; the choice of the tree is
discrete (no gradient flows through the ranking).

References:
  Li et al. 2024, "EAGLE-2: Faster inference of language models with dynamic draft trees";
  Pankratov & Alistarh 2025, "Speculative decoding speed-of-light" (arXiv 2512.11718).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar
from typing import NamedTuple

import jax
import jax.numpy as jnp

from specjax import _checks
from specjax.decoders.base import CallDecoder
from specjax.decoders.base import CallLaw
from specjax.decoders.base import pytree_dataclass
from specjax.decoders.draws import categorical_thresholds
from specjax.decoders.draws import cdf_search
from specjax.decoders.draws import cumulative_masses
from specjax.decoders.draws import draw

__all__ = ["Beams", "DynamicTree", "MAX_BUDGET", "RANKS", "beam_nodes", "build_tree"]

RANKS = ("draft", "target")
MAX_BUDGET = 2**12


class Beams(NamedTuple):
    """A dynamic tree as beams per depth ``d = 0..D`` of width ``B`` (depth 0: the root in
    slot 0)."""

    tokens: jax.Array  # (D + 1, B) int32
    parents: jax.Array  # (D + 1, B) int32: slot of the parent in the beam above (-1 at the root)
    kept: jax.Array  # (D + 1, B) bool: the node is in the tree
    child: jax.Array  # (D, B, V) int32: slot at depth d + 1 of node (d, j)'s child holding y, -1


def beam_nodes(rows_at, depth: int, num_states: int, dtype, prev, width: int):
    """``(tokens, parents, kept)`` of ``Beams``: the tree of the ``width`` most probable prefixes
    after token ``prev``, ``rows_at(d, tokens)`` giving the ranking model's rows ``(B, V)`` after
    the beam's tokens at depth ``d``."""
    slots = jnp.arange(width, dtype=jnp.int32)
    tokens = [jnp.zeros((width,), jnp.int32).at[0].set(jnp.asarray(prev).astype(jnp.int32))]
    parents = [jnp.full((width,), -1, jnp.int32)]
    scores = [jnp.zeros((width,), dtype).at[0].set(1)]
    for d in range(depth):
        cand = scores[-1][:, None] * rows_at(d, tokens[-1])  # (B, V)
        best, flat = jax.lax.top_k(cand.reshape(-1), width)
        size = jnp.asarray(num_states, flat.dtype)  # flat >= 0: C division is floor division
        parents.append(jax.lax.div(flat, size).astype(jnp.int32))
        tokens.append(jax.lax.rem(flat, size).astype(jnp.int32))
        scores.append(best)
    if not depth:
        return tokens[0][None], parents[0][None], (slots == 0)[None]
    scores = jnp.stack(scores[1:])  # (D, B); ranked by score, then depth, then beam order
    order = jnp.argsort(-scores.reshape(-1), stable=True)
    chosen = jnp.zeros((depth * width,), bool).at[order[:width]].set(
        True, wrap_negative_indices=False).reshape(depth, width)
    chosen = chosen & (scores > 0)
    return jnp.stack(tokens), jnp.stack(parents), jnp.concatenate([(slots == 0)[None], chosen])


def _take(x, *index):
    """``x[index]`` for non-negative integer arrays: no wrapping of negative indices (a
    comparison and a select per index array in every program that builds a tree)."""
    return x.at[index].get(wrap_negative_indices=False)


def build_tree(rank_rows: jax.Array, prev: jax.Array, width: int) -> Beams:
    """The tree of the ``width`` most probable prefixes under ``rank_rows`` ``(D, V, V)`` (the
    ranking model's rows at the call's positions) after token ``prev``."""
    depth, num_states, _ = rank_rows.shape
    slots = jnp.arange(width, dtype=jnp.int32)
    tokens, parents, kept = beam_nodes(lambda d, t: _take(rank_rows[d], t), depth, num_states,
                                       rank_rows.dtype, prev, width)
    child = []
    for d in range(depth):
        index = jnp.full((width, num_states), -1, jnp.int32)
        target_slot = jnp.where(kept[d + 1], parents[d + 1], width)  # dropped: out of range
        child.append(index.at[target_slot, tokens[d + 1]].set(slots, mode="drop",
                                                              wrap_negative_indices=False))
    return Beams(tokens, parents, kept, jnp.stack(child) if depth else
                 jnp.zeros((0, width, num_states), jnp.int32))


@pytree_dataclass
class DynamicTree(CallDecoder):
    """A deterministic tree built per call from its context: EAGLE-2's dynamic tree
    (``rank="draft"``) or the speed of light (``rank="target"``).

    Attributes:
      budget: nodes of the tree, root included (the tokens one target call verifies), ``>= 2``.
      max_depth: the most drafted tokens on one path (the decoder's ``lookahead``).
      rank: ``"draft"`` (path probability under the draft) or ``"target"`` (under the target:
        the most probable target prefixes, the best deterministic tree of that size).
    """

    budget: int
    _: dataclasses.KW_ONLY
    max_depth: int
    rank: str = "draft"

    @classmethod
    def example_cases(cls) -> dict:
        return {"dynamic tree P=6 D=3": cls(6, max_depth=3),
                "speed of light P=5 D=2": cls(5, max_depth=2, rank="target")}

    def __post_init__(self):
        _checks.check_static_int("budget", self.budget)
        if self.budget < 2 or self.budget > MAX_BUDGET:
            raise ValueError(f"budget must be an integer in [2, {MAX_BUDGET}] (the root and at "
                             f"least one drafted token), got {self.budget}")
        _checks.check_static_int("max_depth", self.max_depth)
        if self.rank not in RANKS:
            raise ValueError(f"rank must be one of {RANKS}, got {self.rank!r}")

    @property
    def lookahead(self) -> int:
        return self.max_depth

    def truncate(self, lookahead: int) -> "DynamicTree":
        del lookahead  # the sampler stops at the horizon by itself
        return self

    @property
    def label(self) -> str:
        who = "EAGLE-2 dynamic tree" if self.rank == "draft" else "speed of light"
        return f"{who}, {self.budget} nodes, depth <= {self.max_depth}"

    def call_work(self, depth: int) -> tuple[int, int]:
        """``min(depth, max_depth)`` draft passes (one per level of the beam) and ``budget``
        tokens scored, for ``specjax.CostModel``: the call is provisioned for the budget even
        where fewer prefixes have positive probability or fit in the horizon."""
        return min(depth, self.max_depth), self.budget

    @property
    def num_uniforms(self) -> int:
        return self.max_depth + 1

    def prepare(self, draft, target):
        return (draft.trans if self.rank == "draft" else target.trans), target.trans

    def sample_call(self, tables, n, prev, u):
        """One call of one chain from position ``n`` after ``prev``: build the tree, then walk
        it with one draw from the target per depth."""
        rank_trans, q_trans = tables
        horizon = q_trans.shape[0]
        depth, width = self.max_depth, self.budget - 1
        rows = jnp.clip(n - 1 + jnp.arange(depth), 0, horizon - 1)
        fits = n + jnp.arange(depth) <= horizon  # the position of depth d + 1 exists
        rank_rows = rank_trans[rows] * fits[:, None, None]  # no prefix beyond the horizon
        beams = build_tree(rank_rows, prev, width)
        child = jnp.concatenate([beams.child, jnp.full((1,) + beams.child.shape[1:], -1,
                                                       jnp.int32)])

        def level(carry, inputs):
            slot, x, done, kept, last_rejected, emitted = carry
            d, u_d = inputs
            row = jnp.clip(n - 1 + d, 0, horizon - 1)
            y = draw(categorical_thresholds(q_trans[row, x]), u_d)
            nxt = child[d, slot, y]
            has_children = jnp.any(child[d, slot] >= 0)
            live = ~done
            emitted = emitted.at[d].set(jnp.where(live, y, emitted[d]))
            descend = live & (nxt >= 0)
            return (jnp.where(descend, nxt, slot), jnp.where(descend, y, x), done | ~descend,
                    kept + descend.astype(jnp.int32),
                    jnp.where(live & ~descend, has_children, last_rejected), emitted), None

        carry = (jnp.zeros((), jnp.int32), prev, jnp.zeros((), bool), jnp.zeros((), jnp.int32),
                 jnp.zeros((), bool), jnp.zeros((depth + 1,), jnp.int32))
        (_, _, _, kept, last_rejected, emitted), _ = jax.lax.scan(
            level, carry, (jnp.arange(depth + 1), u))
        return emitted, kept, last_rejected

    walk_uniforms: ClassVar[int] = 1  # the target's draw at the chain's node

    def walk_start(self):
        """``(depth, slot, tokens, parents, kept)``: the chain's node and its call's tree (built
        at the root, from the call's context)."""
        width = self.budget - 1
        zeros = jnp.zeros((self.max_depth + 1, width), jnp.int32)
        return (jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32), zeros, zeros,
                zeros.astype(bool))

    def walk_tables(self, draft, target, row):
        """The trees of a call opened at position ``row``, one per previous token (``beam_nodes``
        on the ranking model's rows of the positions ``row .. row + D - 1``, zero beyond the
        horizon: no prefix there), built once for all chains, and the cumulative target rows
        of position ``row``."""
        rank_trans = draft.trans if self.rank == "draft" else target.trans
        horizon, num_states = rank_trans.shape[0], rank_trans.shape[-1]
        positions = row + jnp.arange(self.max_depth)
        fits = positions < horizon
        rank_rows = rank_trans[jnp.minimum(positions, horizon - 1)] * fits[:, None, None]
        trees = jax.vmap(lambda prev: beam_nodes(lambda d, t: _take(rank_rows[d], t),
                                                 self.max_depth, num_states, rank_rows.dtype,
                                                 prev, self.budget - 1))(jnp.arange(num_states))
        return trees, cumulative_masses(target.trans[row])

    def walk_step(self, tables, prev, state, u):
        """One position of one chain: at the root the call's tree is the one ``walk_tables``
        built for ``prev``; the token is drawn from the target at the chain's node; the chain
        descends into the child holding it, else the call ends (a rejection where the node has
        children)."""
        trees, q_cdf = tables
        depth, slot, *tree = state
        at_root = depth == 0
        tokens, parents, kept = (jnp.where(at_root, b[prev], a) for a, b in zip(tree, trees))
        y = cdf_search(lambda i: q_cdf[prev, i], u[0], q_cdf.shape[-1])
        below = jnp.minimum(depth + 1, self.max_depth)
        children = kept[below] & (parents[below] == slot) & (depth < self.max_depth)
        hit = children & (tokens[below] == y)
        descend = jnp.any(hit)
        leaf = ~jnp.any(children)
        state = (jnp.where(descend, depth + 1, 0).astype(jnp.int32),
                 jnp.where(descend, jnp.argmax(hit), 0).astype(jnp.int32), tokens, parents, kept)
        return y, state, ~descend & ~leaf, at_root, ~descend & leaf

    def call_law(self, p_rows, q_rows, bonus_row, *, with_bonus: bool) -> CallLaw:
        """The exact law of one call: the tree for every previous token, then target path
        probabilities summed over its nodes.

        Args:
          p_rows: ``(K', V, V)`` draft rows of the call's positions.
          q_rows: ``(K', V, V)`` target rows of the same positions.
          bonus_row: ``(V, V)`` target row after them (unused without bonus).
          with_bonus: whether that position exists (static).
        """
        k, num_states, _ = q_rows.shape
        width = self.budget - 1
        rank_rows = p_rows if self.rank == "draft" else q_rows
        beams = jax.vmap(lambda a: build_tree(rank_rows, a, width))(
            jnp.arange(num_states))  # fields (V_a, K' + 1, B, ...)
        dtype = q_rows.dtype
        # mass[a, d, j]: P(the call reaches node (d, j) | a) = its target path probability.
        mass = [jnp.zeros((num_states, width), dtype).at[:, 0].set(1)]
        kept, rejected, bonus = [], [], []
        lanes = jnp.arange(num_states)[:, None]
        for d in range(k + 1):
            tok = beams.tokens[:, d]  # (V_a, B)
            here = mass[d] * beams.kept[:, d]
            row = q_rows[d] if d < k else bonus_row
            if d < k:
                child = beams.child[:, d]  # (V_a, B, V)
                has_children = jnp.any(child >= 0, axis=-1)
                out = here[..., None] * _take(row, tok)  # (V_a, B, V): y drawn at node (d, j)
                rejected.append(jnp.sum(jnp.where(has_children[..., None] & (child < 0), out,
                                                  0), axis=1))
                bonus.append(jnp.sum(jnp.where(has_children[..., None], 0, out), axis=1))
                parent = beams.parents[:, d + 1]
                nxt_tok = beams.tokens[:, d + 1]
                step = (_take(here, lanes, parent)
                        * _take(row, _take(tok, lanes, parent), nxt_tok))
                nxt = jnp.where(beams.kept[:, d + 1], step, 0)
                mass.append(nxt)
                kept.append(jnp.zeros((num_states, num_states), dtype).at[
                    lanes, nxt_tok].add(nxt, wrap_negative_indices=False))
            else:
                zeros = jnp.zeros((num_states, num_states), dtype)
                rejected.append(zeros)
                bonus.append(jnp.sum(here[..., None] * _take(row, tok), axis=1) if with_bonus
                             else zeros)
        return CallLaw(kept=jnp.stack(kept), rejected=jnp.stack(rejected),
                       bonus=jnp.stack(bonus))
