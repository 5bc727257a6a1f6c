"""Token trees (SpecInfer, Sequoia, Medusa/EAGLE) transcribed literally, for the tests only.

Nothing here imports specjax: plain Python and NumPy float64, written from the verbal
description of one target call, against the chooser interface of ``reference`` (every random
choice is ``chooser.categorical`` or ``chooser.bernoulli``), so ``reference.enumerate_law`` gives
the exact law of a call by brute force.

One call from position ``n`` after the token ``prev = x_{n-1}``: the root holds ``prev`` (depth
0); a node at depth ``d`` holds ``x_{n+d-1}`` and its children are drafted from the draft's row of
position ``n + d`` given that token and verified against the target's row of the same position.
Nodes deeper than ``K' = min(D, T - n + 1)`` are dropped (``D``: the tree's depth).

1. The whole tree is drafted first, top-down (node by node in index order; a parent always has
   a smaller index than its children):

   * ``"iid"``: each child ~ ``p(. | parent)`` independently;
   * ``"without_replacement"``: the children of a node in order, child ``j`` ~ ``d_j``,
     ``d_1 = p``, ``d_{j+1}`` = ``d_j`` without child ``j``'s token, renormalised; a ``d_j`` with
     no mass leaves child ``j`` and its later siblings (and their subtrees) absent;
   * ``"top_k"``: the ``b`` tokens of largest ``p`` (ties to the smaller index), deterministic.

2. Verification, top-down from the root. At a node holding ``x`` with present children:

   * ``"iid"``/``"without_replacement"``: ``r = q``; child ``j`` (token ``t_j``, drawn from
     ``d_j``, ``d_j = p`` for i.i.d.) is accepted with ``min(1, r(t_j) / d_j(t_j))`` and descended
     into; otherwise ``r <- normalise([r - d_j]_+)``. If every child is rejected, ``y ~ r`` is
     emitted as a rejected token and the call ends;
   * ``"top_k"``: ``y ~ q``; descend into the child holding ``y`` if there is one, else ``y`` is
     emitted as a rejected token and the call ends.

   At a node with no present child at depth ``d``: the target's bonus token
   ``y ~ q(. | x)`` of position ``n + d`` if ``n + d <= T``, else nothing (the sequence is done).

``draft_all=False`` drafts a node's children only when verification reaches the node (the same
law: the tokens of unvisited subtrees are independent of everything the call emits; the tests
check the two agree) and makes the enumeration far cheaper.
"""

from __future__ import annotations

import functools
from collections import defaultdict

import numpy as np

import reference as ref

CHILDREN = ("iid", "without_replacement", "top_k")


# ----------------------------------------------------------------------------- shapes
def branching_parents(branching) -> tuple:
    """Breadth-first parent array of the uniform tree with branching factors ``branching``."""
    parents, level = [-1], [0]
    for factor in branching:
        nxt = []
        for node in level:
            for _ in range(factor):
                parents.append(node)
                nxt.append(len(parents) - 1)
        level = nxt
    return tuple(parents)


def tree_depths(parents) -> list:
    depth = [0] * len(parents)
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
    return depth


def tree_kids(parents) -> list:
    kids = [[] for _ in parents]
    for i in range(1, len(parents)):
        kids[parents[i]].append(i)
    return kids


def _arrays(model):
    """``(init, trans)`` as float64 NumPy arrays from a pair or an object with ``.init``/``.trans``."""
    if hasattr(model, "trans"):
        init, trans = model.init, model.trans
    else:
        init, trans = model
    return np.asarray(init, np.float64), np.asarray(trans, np.float64)


def _trans(trans_or_model):
    if hasattr(trans_or_model, "trans"):
        return np.asarray(trans_or_model.trans, np.float64)
    if isinstance(trans_or_model, tuple):
        return np.asarray(trans_or_model[1], np.float64)
    return np.asarray(trans_or_model, np.float64)


def _top_tokens(p, count):
    """The ``count`` tokens of largest ``p`` (ties to the smaller index), at most ``V``."""
    order = sorted(range(len(p)), key=lambda v: (-p[v], v))
    return order[:count]


# ----------------------------------------------------------------------------- one call
def tree_call_literal(chooser, parents, children, draft_trans, target_trans, n, prev,
                      draft_all=True):
    """One target call of a static token tree from position ``n`` after token ``prev``.

    Args:
      chooser: a ``reference`` chooser.
      parents: the parent array (``parents[0] = -1``, ``parents[i] < i``).
      children: ``"iid"``, ``"without_replacement"`` or ``"top_k"``.
      draft_trans, target_trans: ``(T, V, V)`` transitions (or models / ``(init, trans)`` pairs).
      n: the first position the call fills (``1 <= n <= T``).
      prev: ``x_{n-1}``.
      draft_all: draft the whole tree before verifying (the literal order) or each node's
        children when verification reaches it (same law, cheaper to enumerate).

    Returns:
      ``(emitted tokens, num_kept, last_rejected)``: the kept drafts then the last token
      (``last_rejected`` True after a rejection, False for a bonus token), or only the kept
      drafts and ``None`` when the call fills the horizon and emits nothing more.
    """
    if children not in CHILDREN:
        raise ValueError(f"unknown children {children!r}")
    p_trans, q_trans = _trans(draft_trans), _trans(target_trans)
    horizon = q_trans.shape[0]
    assert 1 <= n <= horizon
    depth, kids = tree_depths(parents), tree_kids(parents)
    max_kept = min(max(depth), horizon - n + 1)  # K'

    token = {0: int(prev)}  # node -> token, for the present nodes
    law = {}  # node -> the law its token was drawn from (d_j)

    def draft_children(node):
        if depth[node] >= max_kept:
            return  # its children would lie beyond the horizon: dropped
        p = p_trans[n + depth[node] - 1, token[node]]  # position n + depth
        if children == "iid":
            for c in kids[node]:
                token[c] = chooser.categorical(p)
                law[c] = p
        elif children == "without_replacement":
            d = p.copy()
            for c in kids[node]:
                if d.sum() <= 0:
                    break  # no token left: this child and its later siblings are absent
                token[c] = chooser.categorical(d)
                law[c] = d
                d = d.copy()
                d[token[c]] = 0.0
                d = ref.positive_part(d)
        else:
            for c, t in zip(kids[node], _top_tokens(p, len(kids[node]))):
                token[c] = t
                law[c] = p

    if draft_all:  # 1. the whole tree, top-down (index order puts parents first)
        for node in range(len(parents)):
            if node in token:
                draft_children(node)

    # 2. verification, top-down
    node, emitted, kept = 0, [], 0
    while True:
        if not draft_all:
            draft_children(node)
        x, pos = token[node], n + depth[node]
        present = [c for c in kids[node] if c in token]
        if not present:  # a leaf: the target's bonus token, if the position exists
            if pos <= horizon:
                emitted.append(chooser.categorical(q_trans[pos - 1, x]))
                return tuple(emitted), kept, False
            return tuple(emitted), kept, None
        q = q_trans[pos - 1, x]
        if children == "top_k":
            y = chooser.categorical(q)
            hit = [c for c in present if token[c] == y]
            if not hit:
                emitted.append(y)
                return tuple(emitted), kept, True
            node = hit[0]
        else:
            r = q.copy()
            accepted = None
            for c in present:
                t, d = token[c], law[c]
                if chooser.bernoulli(min(1.0, r[t] / d[t])):
                    accepted = c
                    break
                r = ref.positive_part(r - d)
            if accepted is None:
                assert r.sum() > 0, "a rejection with an exhausted residual"
                emitted.append(chooser.categorical(r))
                return tuple(emitted), kept, True
            node = accepted
        emitted.append(token[node])
        kept += 1


# ----------------------------------------------------------------------------- whole sequences
def tree_literal(chooser, parents, children, draft, target, draft_all=True):
    """Token-tree decoding of a whole sequence: ``x_0 ~ q_0``, then calls until ``x_T``.

    Returns ``(tokens x_0..x_T, rejected R_1..R_T, calls)`` as ``reference.sd_literal``.
    """
    _, p_trans = _arrays(draft)
    q_init, q_trans = _arrays(target)
    horizon = q_trans.shape[0]
    x = [chooser.categorical(q_init)]
    rejected = []
    calls = 0
    while len(x) <= horizon:
        calls += 1
        emitted, kept, last = tree_call_literal(chooser, parents, children, p_trans, q_trans,
                                                len(x), x[-1], draft_all)
        x.extend(emitted)
        rejected.extend([False] * kept)
        if last is not None:
            rejected.append(last)
    assert len(x) == horizon + 1 and len(rejected) == horizon
    return tuple(x), tuple(rejected), calls


# ----------------------------------------------------------------------------- exact laws
class LiteralTree:
    """Enumerated laws of one tree on one pair of models, each call law computed once per
    ``(n, prev)`` (``reference.enumerate_law`` over ``tree_call_literal``)."""

    def __init__(self, parents, children, draft, target, draft_all=False):
        self.parents, self.children, self.draft_all = tuple(parents), children, draft_all
        self.p_init, self.p_trans = _arrays(draft)
        self.q_init, self.q_trans = _arrays(target)

    @functools.lru_cache(maxsize=None)
    def call(self, n, prev) -> dict:
        """``{(emitted, num_kept, last_rejected): probability}`` of one call."""
        return ref.enumerate_law(lambda chooser: tree_call_literal(
            chooser, self.parents, self.children, self.p_trans, self.q_trans, n, prev,
            self.draft_all))

    def call_law(self, n):
        """``(kept (K', V, V), rejected (K'+1, V, V), bonus (K'+1, V, V))`` with the meaning of
        ``specjax.decoders.CallLaw``, for a call at position ``n``."""
        horizon, num_states, _ = self.q_trans.shape
        k = min(max(tree_depths(self.parents)), horizon - n + 1)
        kept = np.zeros((k, num_states, num_states))
        rejected = np.zeros((k + 1, num_states, num_states))
        bonus = np.zeros((k + 1, num_states, num_states))
        for a in range(num_states):
            for (emitted, num_kept, last), pr in self.call(n, a).items():
                for i in range(num_kept):
                    kept[i, a, emitted[i]] += pr
                if last is True:
                    rejected[num_kept, a, emitted[num_kept]] += pr
                elif last is False:
                    bonus[num_kept, a, emitted[num_kept]] += pr
        return kept, rejected, bonus

    def sequence_law(self) -> dict:
        """``{(tokens, rejected, calls): probability}`` over whole sequences (calls chained)."""
        horizon = self.q_trans.shape[0]
        states = {((a,), (), 0): float(pr) for a, pr in enumerate(self.q_init) if pr > 0}
        done = defaultdict(float)
        while states:
            new = defaultdict(float)
            for (tokens, rejected, num_calls), pr in states.items():
                for (emitted, num_kept, last), pc in self.call(len(tokens), tokens[-1]).items():
                    flags = (False,) * num_kept + (() if last is None else (last,))
                    state = (tokens + emitted, rejected + flags, num_calls + 1)
                    (done if len(state[0]) == horizon + 1 else new)[state] += pr * pc
            states = new
        return dict(done)

    def accepted_length(self, n) -> np.ndarray:
        """``(V,)``: expected drafts kept by a call at ``n`` after each previous token."""
        num_states = self.q_trans.shape[1]
        return np.array([sum(pr * k for (_, k, _), pr in self.call(n, a).items())
                         for a in range(num_states)])


def literal_call_law(parents, children, draft_trans, target_trans, n, draft_all=False):
    """``(kept, rejected, bonus)`` NumPy arrays of one call at position ``n`` (see
    ``LiteralTree.call_law``); the models may be ``(T, V, V)`` arrays, pairs or models."""
    p_trans, q_trans = _trans(draft_trans), _trans(target_trans)
    init = np.full(p_trans.shape[1], 1.0 / p_trans.shape[1])
    return LiteralTree(parents, children, (init, p_trans), (init, q_trans),
                       draft_all).call_law(n)


def literal_sequence_law(parents, children, draft, target, draft_all=False) -> dict:
    """Exact law of ``(tokens, rejected, calls)`` of ``tree_literal`` (calls chained)."""
    return LiteralTree(parents, children, draft, target, draft_all).sequence_law()
