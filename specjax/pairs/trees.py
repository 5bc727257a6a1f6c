"""Token trees from a recording (issue 47, item 2): the phase filter with the tree's node as its
state.

A static tree (``specjax.TokenTree``: i.i.d. children as SpecInfer and EAGLE-2's sampling, without
replacement as Sequoia, the draft's top-``b`` as Medusa and EAGLE) is verified top-down: at a node
whose context is ``x_0..x_{t-1}`` the node's ``b`` children are drafted from the draft's row
``p_t`` of that context and tested against the target's row ``q_t``; the first accepted child is
descended into (its children are drafted from ``p_{t+1}`` given the accepted token), and when none
is, the call ends with a token of the residual; a leaf ends it with the target's bonus token.
Every context the walk reads is on the emitted path: the rejected siblings' subtrees are never
read. So the rows along the recorded path suffice, and, as for token-wise decoders
(``specjax.pairs.calls``), the forward filter over the node reached at each position is the
posterior given the output: the node's stage laws (``specjax.decoders.tree.stage_laws``, the same
masses the sampler and ``exact`` use) give, at the emitted token ``x_t``, the probability
``accepted_j(x_t) / q_t(x_t)`` that it came from child ``j`` and ``rejected(x_t) / q_t(x_t)``
that it ended the call (they sum to one: the rule is lossless). The node at position ``t`` is
``0`` (the root) exactly when a call starts there.

Exact conditional expectations per sequence, as for ``estimate``: calls, rejections (calls that
end with a residual token at a node with children), drafted tokens, time (a call at ``n``
scores the tree cut at ``min(D, T - n + 1)`` levels, ``call_work``) and the calls that keep at
least ``i`` drafts. The recording must hold the full rows (``from_arrays`` keeps small ones by
default; ``record(..., keep_rows=True)``). Ragged recordings (``lengths``) end a sequence's
calls at its last token, as for SD.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from specjax.decoders.tree import stage_laws
from specjax.numerics import safe_ratio
from specjax.pairs.calls import live_positions
from specjax.pairs.recording import probs_at
from specjax.pairs.recording import rows_chunk

__all__ = ["tree_per_sequence"]


def _node_tables(shape):
    """Static per-node facts: each node's number of children ``b_v``, each non-root node's parent
    and rank among its siblings, and the distinct branching factors."""
    parents = shape.parents
    num_children = np.asarray([len(c) for c in shape.children], np.int64)
    rank = np.zeros(len(parents), np.int64)
    for kids in shape.children:
        for j, child in enumerate(kids):
            rank[child] = j
    factors = tuple(sorted({int(b) for b in num_children if b > 0}))
    return num_children, np.asarray(parents, np.int64), rank, factors


@functools.partial(jax.jit, static_argnames=("children", "parents", "num_children", "rank",
                                               "factors", "depths"))
def _tree_filter(p, q, tokens, columns, lengths, *, children, parents, num_children, rank,
                 factors, depths):
    """``(rejections (c,), weighted (c, W), accepted_at (c, D))`` of a chunk of sequences:
    rows ``p``, ``q`` ``(c, T, V)``, emitted tokens ``(c, T)``, ``columns`` ``(T, W)``."""
    batch, horizon = tokens.shape
    dtype = q.dtype
    q_x = probs_at(q, tokens)
    accepted, rejected = {}, {}
    for b in factors:  # each distinct branching factor's posterior rates at x_t
        acc, rej = stage_laws(children, p, q, b)  # (b, c, T, V), (c, T, V)
        accepted[b] = jnp.stack([jnp.clip(safe_ratio(probs_at(acc[j], tokens), q_x, 0), 0, 1)
                                 for j in range(b)])  # (b, c, T)
        rejected[b] = jnp.clip(safe_ratio(probs_at(rej, tokens), q_x, 0), 0, 1)
    num_nodes = len(parents)
    ones = jnp.ones((batch, horizon), dtype)
    # Per node: the rate of reaching it from its parent; the rate of ending the call there.
    reach = jnp.stack([ones] + [accepted[num_children[parents[u]]][rank[u]]
                                for u in range(1, num_nodes)], axis=-1)  # (c, T, N)
    end = jnp.stack([rejected[b] if b else ones for b in num_children], axis=-1)  # (c, T, N)
    internal = jnp.asarray(np.asarray(num_children) > 0, dtype)
    depth = jnp.asarray(depths)
    parent_index = jnp.asarray(np.maximum(np.asarray(parents), 0))
    live = live_positions(lengths, horizon, batch, dtype)
    max_depth = int(max(depths))
    at_depth = (depth[:, None] == jnp.arange(1, max_depth + 1)[None]).astype(dtype)  # (N, D)

    def step(carry, inputs):
        alpha, rejections, weighted, kept = carry  # alpha (c, N): the node at this position
        reach_t, end_t, weight, on = inputs
        started = alpha[:, 0] * on
        weighted = weighted + started[:, None] * weight[None]
        ended = alpha * end_t
        rejections = rejections + jnp.sum(ended * internal[None], axis=-1) * on
        moved = alpha[:, parent_index] * reach_t  # node u from its parent (x_t its token)
        kept = kept + (moved @ at_depth) * on[:, None]  # a call kept its d-th draft here
        nxt = moved.at[:, 0].set(jnp.sum(ended, axis=-1))  # a new call at the next position
        return (nxt * on[:, None], rejections, weighted, kept), None

    alpha0 = jnp.zeros((batch, num_nodes), dtype).at[:, 0].set(1)
    carry = (alpha0, jnp.zeros((batch,), dtype),
             jnp.zeros((batch, columns.shape[-1]), dtype), jnp.zeros((batch, max_depth), dtype))
    (_, rejections, weighted, kept), _ = jax.lax.scan(
        step, carry, (jnp.moveaxis(reach, 1, 0), jnp.moveaxis(end, 1, 0),
                      columns.astype(dtype), live))
    return rejections, weighted, kept


def tree_per_sequence(decoder, recording, columns):
    """``(rejections (B,), weighted (B, W), accepted_at (B, D))`` of a ``TokenTree`` along the
    recording's rows (module docstring); ``columns`` ``(T, W)`` the per-position weights of a
    call start (counts, drafted tokens, time)."""
    if recording.target_probs is None:
        raise ValueError(
            f"decoder: {decoder!r} reads the draft's and the target's full rows along the "
            f"path (each node's children are drafted from the row of its context), and this "
            f"recording holds only the emitted tokens' probabilities: build it from the rows "
            f"(Recording.from_arrays keeps rows of up to 1 GiB; record(..., keep_rows=True))")
    shape = decoder.shape
    num_children, parents, rank, factors = _node_tables(shape)
    p, q = recording.draft_probs, recording.target_probs
    tokens = recording.tokens[:, 1:]
    num, horizon, num_states = q.shape
    copies = 2 + max(factors, default=0) * 3
    chunk = rows_chunk(horizon, num_states * copies, q.dtype, num, ())
    parts = []
    for start in range(0, num, chunk):
        part = slice(start, start + chunk)
        lengths = None if recording.lengths is None else recording.lengths[part]
        parts.append(_tree_filter(
            p[part], q[part], tokens[part], jnp.asarray(columns, q.dtype), lengths,
            children=decoder.children, parents=tuple(int(x) for x in parents),
            num_children=tuple(int(x) for x in num_children),
            rank=tuple(int(x) for x in rank), factors=factors, depths=shape.depth))
    return tuple(jnp.concatenate([part[i] for part in parts]) for i in range(3))
