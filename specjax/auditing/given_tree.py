"""Verification of a given token tree, in the shape tree-based engines use (SpecInfer, Sequoia,
EAGLE, Medusa; multi-draft speculative sampling).

An engine that verifies a tree sees, per request, the tokens of the tree's nodes, the draft's
rows the children of each node were drawn from, the target's rows at every node (one batched
call scores the whole tree under a tree attention mask) and random numbers. It returns the
accepted path and one more token: drawn from the residual where every child of the last accepted
node was rejected, or the target's bonus token at a leaf.

* ``verify_tree(key, decoder, tree_tokens, draft_probs, target_probs)`` does that for a batch of
  requests, each with its own number of nodes (``num_nodes``: the first ``N_b`` nodes of the
  decoder's tree; ``N_b = 1`` is the root alone, which takes the target's token), with a key or
  with the random numbers themselves (``uniforms``).
* ``verify_tree_law(decoder, tree_tokens, draft_probs, target_probs)`` is the exact law of that
  output over the random numbers: ``P(the output is the path to node i, then y)``.

The tree is the decoder's: a ``specjax.TokenTree`` (its parent array and its ``children`` rule),
or ``specjax.BatchSpeculative(M, lookahead=K)``, whose call is the tree ``(M, 1, ..., 1)`` (``M``
drafted sequences of ``K`` tokens sharing the root; with replacement or without). Node 0 is the
root: it holds the last token already accepted, so ``tree_tokens[..., 0]`` is not read.

**The convention** (what a kernel must do to agree token for token). Row ``i`` of
``draft_probs`` and ``target_probs`` is the draft's and the target's law in the context of the
path to node ``i`` (root included). Node ``i``'s children are tested in index order with the
accept uniforms ``u[c]`` of each child ``c``; the token that ends the call at node ``i`` uses the
sample uniform ``v[i]``.

* ``"iid"`` children (SpecInfer's multi-step speculative sampling; batch SD) and
  ``"without_replacement"`` (Sequoia; recursive rejection sampling): child ``j`` with token
  ``t`` is accepted iff ``u * d_j(t) < min(d_j(t), r_j(t))``, with ``r_1 = q``, ``r_{j+1} =
  [r_j - d_j]_+`` normalised after each rejection, and ``d_j`` the law the child was drawn from:
  ``p`` for i.i.d. children, ``p`` without the siblings before it (normalised) without
  replacement. So a child with ``d_j(t) = 0`` is rejected, as in ``verify_drafts``. The first
  accepted child is descended into; when all are rejected, the last token is the inverse CDF of
  the last residual at ``v[i]``, or of ``q`` if the residual has no mass (below ``V`` float
  epsilons: given siblings can exhaust it, e.g. a child whose token the residual gives 0 after
  ``r = d``; its later children are then rejected).
* ``"top_k"`` children (Medusa, EAGLE: deterministic drafts): ``y`` is the inverse CDF of ``q`` at
  ``v[i]``; the call descends into the first child holding ``y``, and ends with ``y`` when none
  does. ``draft_probs`` is not read (pass ``None``).
* At a node with no child (a leaf, or the end of a ragged tree) the last token is the bonus: the
  inverse CDF of ``q`` at ``v[i]``.
* The inverse CDF is the smallest ``y`` with ``v W < cumsum(w)[y]`` (``W`` the total): a token of
  zero mass is never drawn. ``u`` and ``v`` are uniform on ``[0, 1)``; with a key, ``u =
  uniform(k1, (B, N))`` and ``v = uniform(k2, (B, N))``, ``k1, k2 = split(key)``, in the
  computation's dtype (float32 at least).

Averaged over trees drafted as the rule says, the output followed by the target is distributed
as the target: every node is a rejection coupling of the current residual with the law its
child was drawn from (tested by enumeration).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax.auditing.given import check_valid_rows
from specjax.auditing.given import _float_array
from specjax.auditing.given import unbatch
from specjax.auditing.given import uniforms_or_key
from specjax.auditing.given import check_endings
from specjax.auditing.given import computation_arrays
from specjax.decoders.planning import resolve_decoder
from specjax.decoders.draws import inverse_cdf as _inverse_cdf
from specjax.decoders.draws import mass_or_target as _mass_or_target
from specjax.decoders.given_drafts import PAD
from specjax.decoders.given_drafts import end_outputs
from specjax.decoders.tree import TokenTree
from specjax.decoders.tree import first_hit
from specjax.decoders.tree import sibling_tests
from specjax.decoders.verification import safe_normalize

__all__ = ["VerifiedTree", "TreeLaw", "verify_tree", "verify_tree_law"]


class VerifiedTree(NamedTuple):
    """What ``verify_tree`` returns (leading ``B`` only for batched input).

    Attributes:
      tokens: ``(B, D + 1)`` int32; request ``b`` emits ``tokens[b, :num_emitted[b]]``: the
        accepted path's tokens, then the recovered or bonus token, ``-1`` after.
      nodes: ``(B, D + 1)`` int32; the tree nodes of the accepted tokens (``-1`` for the last
        token and after): what an engine needs to keep the accepted entries of its cache.
      num_accepted: ``(B,)`` int32; accepted drafts among the emitted tokens.
      bonus: ``(B,)`` bool; whether the last token is the bonus (the path reached a node with
        no child).
      num_emitted: ``(B,)`` int32; tokens emitted, ``1..D + 1``.
      stopped: ``(B,)`` bool; whether the output ends at a stop token.
    """

    tokens: jax.Array  # shape=(B, D + 1), int32
    nodes: jax.Array  # shape=(B, D + 1), int32
    num_accepted: jax.Array  # shape=(B,), int32
    bonus: jax.Array  # shape=(B,), bool
    num_emitted: jax.Array  # shape=(B,), int32
    stopped: jax.Array  # shape=(B,), bool


class TreeLaw(NamedTuple):
    """The exact law of ``verify_tree``'s output over its random numbers, per request.

    Attributes:
      outcome: ``(B, N, V)``; ``P(the output is the tokens of the path to node i, then y)``,
        after stop tokens and a dropped bonus (an output that ends on a draft ``t_s`` is counted
        at ``(parent(s), t_s)``, the same sequence).
      reach: ``(B, N)``; ``P(node i is accepted)`` (1 at the root), before the endings.
      num_accepted: ``(B, D + 1)``; ``P(n drafts accepted)``, before the endings.
    """

    outcome: jax.Array  # shape=(B, N, V)
    reach: jax.Array  # shape=(B, N)
    num_accepted: jax.Array  # shape=(B, D + 1)


def tree_of(decoder) -> TokenTree:
    """The ``TokenTree`` whose call ``decoder`` verifies, its ``given_tree()``
    (``BatchSpeculative(M, lookahead=K)``: ``(M, 1, ..., 1)``), or a ``ValueError`` naming what
    is supported."""
    resolve_decoder(decoder)
    tree = decoder.given_tree()
    if tree is not None:
        return tree
    raise ValueError(
        f"decoder must be a specjax.TokenTree or a specjax.BatchSpeculative(M, lookahead=K) "
        f"with finite M and K (the tree (M, 1, ..., 1)); got {decoder!r}, which has no "
        f"given-tree form")


class _TreeInputs(NamedTuple):
    tokens: jax.Array  # (B, N) int32, clipped into range
    draft_probs: jax.Array | None  # (B, N, V)
    target_probs: jax.Array  # (B, N, V)
    num_nodes: jax.Array  # (B,) int32
    batched: bool


def check_tree_inputs(tree: TokenTree, tree_tokens, draft_probs, target_probs,
                      num_nodes) -> _TreeInputs:
    """Shapes, dtypes and (when concrete) values of the given-tree arguments."""
    size = tree.num_nodes
    tokens = _checks.host_or_device(tree_tokens)
    if not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(f"tree_tokens must hold integer token ids, got dtype {tokens.dtype}")
    if tokens.ndim not in (1, 2) or tokens.shape[-1] != size:
        raise ValueError(f"tree_tokens must have shape (N,) or (B, N) with N = {size}, the "
                         f"decoder's nodes (root included), got {tokens.shape}")
    batched = tokens.ndim == 2
    tokens = tokens if batched else tokens[None]
    num_requests = tokens.shape[0]
    target = _float_array("target_probs", target_probs, 3 if batched else 2)
    target = target if batched else target[None]
    if target.shape[:2] != (num_requests, size) or target.shape[-1] < 1:
        raise ValueError(f"target_probs must have shape {'(B, N, V)' if batched else '(N, V)'} "
                         f"with B, N = {num_requests}, {size}, got {jnp.shape(target_probs)}")
    num_tokens = target.shape[-1]
    draft = None
    if tree.children != "top_k":
        if draft_probs is None:
            raise ValueError(f"draft_probs must be given for {tree.children!r} children (the "
                             f"rows each node's children were drawn from); only 'top_k' trees "
                             f"are verified without them")
        draft = _float_array("draft_probs", draft_probs, 3 if batched else 2)
        draft = draft if batched else draft[None]
        if draft.shape != target.shape:
            raise ValueError(f"draft_probs must have the shape of target_probs "
                             f"{tuple(jnp.shape(target_probs))}, got {jnp.shape(draft_probs)}")
    if num_nodes is None:
        counts = np.full((num_requests,), size, np.int32)
    else:
        counts = _checks.host_or_device(num_nodes)
        if not jnp.issubdtype(counts.dtype, jnp.integer) \
                or counts.shape != ((num_requests,) if batched else ()):
            raise ValueError(f"num_nodes must be integers of shape "
                             f"{(num_requests,) if batched else ()}, got dtype {counts.dtype} "
                             f"and shape {counts.shape}")
        counts = counts.reshape(num_requests).astype(np.int32)
        if _checks.is_concrete(counts):
            values = np.asarray(counts)
            bad = np.flatnonzero((values < 1) | (values > size))
            if bad.size:
                raise ValueError(f"num_nodes must lie in [1, N] = [1, {size}] (1: the root "
                                 f"alone), got {int(values[bad[0]])} at request {bad[0]}")
    if _checks.is_concrete(tokens) and _checks.is_concrete(counts):
        valid = np.arange(size)[None] < np.asarray(counts)[:, None]
        drafted = valid & (np.arange(size)[None] > 0)
        ids = np.asarray(tokens)[drafted]
        if ids.size and (ids.min() < 0 or ids.max() >= num_tokens):
            bad = ids[(ids < 0) | (ids >= num_tokens)][0]
            raise ValueError(f"tree_tokens must be ids in [0, V) = [0, {num_tokens}) at the "
                             f"drafted nodes of each request, got {int(bad)}")
        checks = [("target_probs", target, valid)]
        if draft is not None:  # read only at nodes with a child in the request
            checks.append(("draft_probs", draft,
                           valid & (_first_child(tree)[None] < np.asarray(counts)[:, None])))
        check_valid_rows(checks, batched)
    return _TreeInputs(*computation_arrays(tokens, draft, target), counts, batched)


def _kids(tree: TokenTree, node: int):
    return tree.shape.children[node]


def _node_tests(tree: TokenTree, inputs: _TreeInputs, node: int):
    """Node ``node``'s children in every request (``b`` of them, static): ``(kids (b,), tokens
    (B, b), present (B, b), tests)``, ``tests`` the ``sibling_tests`` of iid and
    without-replacement children (``None`` for top-k)."""
    kids = np.asarray(_kids(tree, node), np.int32)
    present = jnp.asarray(kids)[None] < inputs.num_nodes[:, None]
    tokens = inputs.tokens[:, kids]
    if tree.children == "top_k":
        return kids, tokens, present, None
    tests = sibling_tests(tree.children, inputs.draft_probs[:, node],
                          inputs.target_probs[:, node], tokens, present)
    return kids, tokens, present, tests


def _accept_probability(d, r):
    """``P(u d < min(d, r))`` for ``u ~ U[0, 1)``: ``min(1, r / d)``, and 0 where ``d = 0``."""
    return jnp.where(d > 0, jnp.minimum(d, r) / jnp.where(d > 0, d, 1), 0)


@functools.partial(jax.jit, static_argnames=("tree", "with_bonus", "batched"))
def _verify_tree(tree: TokenTree, inputs: _TreeInputs, u, v, stop, with_bonus, batched=True):
    return unbatch(_verify_batch(tree, inputs, u, v, stop, with_bonus), batched)


def _verify_batch(tree: TokenTree, inputs: _TreeInputs, u, v, stop, with_bonus):
    parents, depth = tree.shape.parents, tree.shape.max_depth
    size = len(parents)
    num_requests = inputs.tokens.shape[0]
    # Each node's outcome depends on its own rows and uniforms: decide every node, then walk.
    child = jnp.full((num_requests, size), -1, jnp.int32)  # the accepted child, or -1
    last = jnp.zeros((num_requests, size), jnp.int32)  # the token that ends the call there
    for node in range(size):
        kids, tokens, present, tests = _node_tests(tree, inputs, node)
        q = inputs.target_probs[:, node]
        if tests is None:  # top-k: y ~ q, descend into the first child holding it
            ends = jax.vmap(_inverse_cdf)(v[:, node], jnp.ones_like(v[:, node]), q)
            hit = first_hit(present & (tokens == ends[:, None]))
        else:
            alive, d, r, residual = tests
            hit = first_hit(alive & (u[:, kids] * d < jnp.minimum(d, r)))
            w = jax.vmap(_mass_or_target)(residual, q)
            ends = jax.vmap(_inverse_cdf)(v[:, node], jnp.ones_like(v[:, node]), w)
        if kids.size:
            found = jnp.any(hit, axis=1)
            child = child.at[:, node].set(
                jnp.where(found, jnp.asarray(kids)[jnp.argmax(hit, axis=1)], -1))
        last = last.at[:, node].set(ends)
    rows = jnp.arange(num_requests)
    node = jnp.zeros((num_requests,), jnp.int32)
    done = jnp.zeros((num_requests,), bool)
    out = jnp.full((num_requests, depth + 1), PAD, jnp.int32)
    nodes = jnp.full((num_requests, depth + 1), PAD, jnp.int32)
    num_accepted = jnp.zeros((num_requests,), jnp.int32)
    for d in range(depth + 1):
        nxt = child[rows, node]
        descend = ~done & (nxt >= 0)
        ending = ~done & (nxt < 0)
        safe = jnp.maximum(nxt, 0)
        out = out.at[:, d].set(jnp.where(descend, inputs.tokens[rows, safe],
                                         jnp.where(ending, last[rows, node], PAD)))
        nodes = nodes.at[:, d].set(jnp.where(descend, nxt, PAD))
        num_accepted = num_accepted + descend
        node = jnp.where(descend, nxt, node)
        done = done | ending
    at_leaf = _no_child_present(tree, inputs.num_nodes, node)
    counts = jnp.where(at_leaf, num_accepted, -1)  # end_outputs reads a bonus as all accepted
    ended = end_outputs(out, num_accepted, counts, stop, with_bonus)
    keep = jnp.arange(depth + 1)[None] < ended.num_accepted[:, None]
    return VerifiedTree(ended.tokens, jnp.where(keep, nodes, PAD), ended.num_accepted,
                        ended.bonus, ended.num_emitted, ended.stopped)


def _first_child(tree: TokenTree) -> np.ndarray:
    """``(N,)`` int32: each node's first child, ``N`` for a leaf (a node has a child in a
    request of ``N_b`` nodes iff this is below ``N_b``)."""
    size = len(tree.shape.parents)
    return np.array([kids[0] if kids else size for kids in tree.shape.children], np.int32)


def _no_child_present(tree: TokenTree, num_nodes, node):
    """Whether ``node`` (per request) has no child among the request's first nodes."""
    return jnp.asarray(_first_child(tree))[node] >= num_nodes


@functools.partial(jax.jit, static_argnames=("tree", "with_bonus", "batched"))
def _tree_law(tree: TokenTree, inputs: _TreeInputs, stop, with_bonus, batched=True):
    return unbatch(_batch_law(tree, inputs, stop, with_bonus), batched)


def _batch_law(tree: TokenTree, inputs: _TreeInputs, stop, with_bonus):
    size = len(tree.shape.parents)
    q_all = inputs.target_probs
    num_requests, _, num_tokens = q_all.shape
    reach = [jnp.ones((num_requests,), q_all.dtype)] + [None] * (size - 1)
    outcome = [None] * size
    for node in range(size):
        kids, tokens, present, tests = _node_tests(tree, inputs, node)
        q = q_all[:, node]
        if tests is None:  # top-k: y ~ q, descend into the first child holding it
            hold = jax.nn.one_hot(tokens, num_tokens, dtype=bool) & present[..., None]
            mine = hold & (jnp.cumsum(hold, axis=1) == 1)  # (B, b, V): the first holder
            for j, kid in enumerate(kids):
                reach[kid] = reach[node] * jnp.sum(jnp.where(mine[:, j], q, 0), axis=-1)
            outcome[node] = reach[node][:, None] * jnp.where(jnp.any(hold, axis=1), 0, q)
            continue
        alive, d, r, residual = tests
        a = jnp.where(alive, _accept_probability(d, r), 0)  # (B, b)
        before = jnp.cumprod(jnp.concatenate([jnp.ones((num_requests, 1), a.dtype), 1 - a],
                                             axis=1), axis=1)
        for j, kid in enumerate(kids):
            reach[kid] = reach[node] * before[:, j] * a[:, j]
        w = jax.vmap(_mass_or_target)(residual, q)
        outcome[node] = (reach[node] * before[:, -1])[:, None] * safe_normalize(w)
    reach = jnp.stack(reach, axis=1)
    outcome = jnp.stack(outcome, axis=1)
    depth_of = jnp.asarray(tree.shape.depth)
    accepted = jnp.stack([jnp.sum(jnp.where(depth_of[None] == d, outcome.sum(-1), 0), axis=1)
                          for d in range(tree.shape.max_depth + 1)], axis=1)
    outcome = _end_tree_law(tree, inputs, outcome, reach, stop, with_bonus)
    return TreeLaw(outcome, reach, accepted)


def _end_tree_law(tree, inputs, outcome, reach, stop, with_bonus):
    """Outputs after the endings. A stop token at drafted node ``s`` (the first on its path)
    ends every output through ``s``: their mass ``reach[s]`` moves to ``(parent(s), t_s)``.
    Without the bonus, an output that reached a node with no child ends on that node's token.

    A node that loses its outcomes has no child that gives it mass (its children are blocked,
    or not in the request), so every move is made at once: the outcomes masked, then the moved
    masses added by one contraction with the parent map (per-node scatters compile slowly)."""
    parents = tree.shape.parents
    size = len(parents)
    num_requests = outcome.shape[0]
    rows_valid = jnp.arange(size)[None] < inputs.num_nodes[:, None]
    no_block = jnp.zeros((num_requests,), bool)
    blocked = [no_block] * size  # a stop among the node's ancestors (itself included)
    gain = jnp.zeros_like(reach)  # (B, N): the mass moved from node to (parent, its token)
    if stop.shape[0]:
        is_stop = jnp.isin(inputs.tokens, stop) & rows_valid & (jnp.arange(size)[None] > 0)
        first = [no_block] * size
        for node in range(1, size):
            above = blocked[parents[node]]
            first[node] = is_stop[:, node] & ~above
            blocked[node] = above | first[node]
        first = jnp.stack(first, axis=1)
        gain = jnp.where(first, reach, 0)
        outcome = outcome * jnp.where(jnp.stack(blocked, axis=1), 0, 1)[..., None]
    if not with_bonus:
        nodes = jnp.arange(size)
        leaf = _no_child_present(tree, inputs.num_nodes[:, None], nodes[None])
        move = leaf & rows_valid & ~jnp.stack(blocked, axis=1) & (nodes[None] > 0)
        gain = gain + jnp.where(move, outcome.sum(-1), 0)
        outcome = outcome * jnp.where(move, 0, 1)[..., None]
    if stop.shape[0] or not with_bonus:
        to_parent = np.zeros((size, size), np.float32)  # (node, its parent), the root's none
        to_parent[np.arange(1, size), np.asarray(parents[1:])] = 1
        token = jax.nn.one_hot(inputs.tokens, outcome.shape[-1], dtype=outcome.dtype)
        outcome = outcome + jnp.einsum("bc,cn,bcv->bnv", gain, to_parent.astype(outcome.dtype),
                                       token, precision=jax.lax.Precision.HIGHEST)
    return outcome


def verify_tree(key, decoder, tree_tokens, draft_probs, target_probs, *, num_nodes=None,
                uniforms=None, stop_tokens=None, bonus: bool = True) -> VerifiedTree:
    """Verify given token trees as a tree-based engine does, for a batch of requests.

    Args:
      key: a PRNG key, or ``None`` when ``uniforms`` are given.
      decoder: a ``specjax.TokenTree`` (its tree and ``children`` rule) or
        ``specjax.BatchSpeculative(M, lookahead=K)`` (the tree ``(M, 1, ..., 1)``).
      tree_tokens: ``(B, N)`` int token of each node (``(N,)`` for one request); entry 0, the
        root, is not read.
      draft_probs: ``(B, N, V)``, row ``i`` the law node ``i``'s children were drawn from (not
        read, so anything, at a node without children: a leaf or past ``N_b``); ``None`` for
        ``"top_k"`` trees.
      target_probs: ``(B, N, V)``, row ``i`` the target's law after the path to node ``i``.
      num_nodes: ``(B,)`` ints in ``[1, N]``: request ``b`` uses the first ``N_b`` nodes (a
        prefix of the parent array is a tree); ``1`` takes the target's token alone.
      uniforms: ``(accept (B, N), sample (B, N))`` in ``[0, 1)``, instead of ``key`` (see the
        module's convention).
      stop_tokens: ids that end a sequence: the output ends at the first one it emits.
      bonus: ``False`` drops the bonus token after a path that reached a node with no child
        (``N_b = 1`` still emits the target's token).

    Returns:
      ``VerifiedTree(tokens (B, D + 1), nodes (B, D + 1), num_accepted, bonus, num_emitted,
      stopped)``.

    Raises:
      ValueError: a bad key, decoder, shape, dtype, id, probability row (of the rows read),
        ``num_nodes`` or uniform; before any work. Under the caller's ``jit`` only the shape
        and dtype checks run.

    Example:
      >>> import jax.numpy as jnp, specjax
      >>> tree = specjax.TokenTree((2,))        # the root and two i.i.d. children
      >>> p = jnp.array([[0.5, 0.5, 0.0]] * 3)
      >>> q = jnp.array([[0.0, 0.6, 0.4], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
      >>> out = specjax.verify_tree(None, tree, jnp.array([0, 0, 1]), p, q,
      ...                           uniforms=(jnp.zeros(3), jnp.zeros(3)))
      >>> out.tokens.tolist(), out.nodes.tolist()  # child 1 (token 0) rejected, child 2 taken
      ([1, 1], [2, -1])
    """
    tree = tree_of(decoder)
    inputs = check_tree_inputs(tree, tree_tokens, draft_probs, target_probs, num_nodes)
    stop, with_bonus = check_endings(stop_tokens, bonus, inputs.target_probs.shape[-1])
    num_requests, size = inputs.tokens.shape
    u, v = uniforms_or_key(key, uniforms, num_requests, (size, size), inputs.batched,
                           inputs.target_probs.dtype)
    return _verify_tree(tree, inputs._replace(batched=None), u, v, stop, with_bonus,
                        inputs.batched)


def verify_tree_law(decoder, tree_tokens, draft_probs, target_probs, *, num_nodes=None,
                    stop_tokens=None, bonus: bool = True) -> TreeLaw:
    """The exact law of ``verify_tree``'s output over its random numbers, given the trees.

    Arguments as ``verify_tree`` (without ``key`` and ``uniforms``).

    Returns:
      ``TreeLaw(outcome (B, N, V), reach (B, N), num_accepted (B, D + 1))``. Averaged over
      trees drafted by the decoder's rule (and target rows that follow each node's path), the
      output continued by the target is distributed as the target.

    Example:
      >>> import jax.numpy as jnp, specjax
      >>> tree = specjax.TokenTree((2,))
      >>> p = jnp.array([[0.5, 0.5, 0.0]] * 3)
      >>> q = jnp.array([[0.0, 0.6, 0.4], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
      >>> law = specjax.verify_tree_law(tree, jnp.array([0, 0, 1]), p, q)
      >>> [round(float(x), 3) for x in law.reach]   # child 2 accepted w.p. min(1, r(1) / p(1))
      [1.0, 0.0, 0.4]
    """
    tree = tree_of(decoder)
    inputs = check_tree_inputs(tree, tree_tokens, draft_probs, target_probs, num_nodes)
    stop, with_bonus = check_endings(stop_tokens, bonus, inputs.target_probs.shape[-1])
    return _tree_law(tree, inputs._replace(batched=None), stop, with_bonus, inputs.batched)
