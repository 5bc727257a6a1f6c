"""The NumPy references of the benchmarks, written once: what a user would otherwise write.

Each is plain NumPy (vectorised over chains, rows or requests, Python loops only over positions,
nodes or drafts), written independently of specjax's kernels, so that a benchmark compares two
implementations of the same law or value. ``python -m specjax bench``
(``specjax.experiments.bench``) and the scripts ``scripts/benchmark_*.py`` both import them from
here. The instance builders (``verify_instance``, ``verify_tree_instance``, ``dirichlet_rows``)
draw the inputs of the verification and optimal-acceptance benchmarks.

The references of given drafts and token trees are in ``verify_references``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from specjax.experiments.verify_references import numpy_inverse_cdf
from specjax.experiments.verify_references import numpy_verify
from specjax.experiments.verify_references import numpy_verify_tree
from specjax.experiments.verify_references import verify_instance
from specjax.experiments.verify_references import verify_tree_instance

__all__ = ["NumpyDecoder", "numpy_batch_rejections", "children_lists", "depths", "stage_laws",
           "numpy_accepted_length", "numpy_expected_calls", "NumpyTreeSampler", "dirichlet_rows",
           "numpy_optimal_acceptance", "verify_instance", "numpy_verify", "verify_tree_instance",
           "numpy_inverse_cdf", "numpy_verify_tree", "numpy_optimal_stopping", "LowRankBigram",
           "low_rank_pair"]


# ----------------------------------------------------------------------------------------- samplers
# the paper's decoders over many chains (``scripts/benchmark_samplers.py``)


def _chain_cdf(rows):
    c = np.cumsum(rows, axis=-1)
    return c / c[..., -1:]


def _draw(rng, cdf_rows):
    """One inverse-CDF draw per row of ``cdf_rows`` (C, V)."""
    u = rng.random(cdf_rows.shape[0])[:, None]
    return np.minimum((u >= cdf_rows).sum(-1), cdf_rows.shape[-1] - 1)


def _residual_rows(w):
    s = w.sum(-1, keepdims=True)
    return np.where(s > 0, w / np.where(s > 0, s, 1), 1.0 / w.shape[-1])


class NumpyDecoder:
    """Speculative decoding in NumPy, vectorised over chains, one loop over positions."""

    def __init__(self, draft, target, *, lookahead=None, num_drafts=1, epsilon=None):
        self.p = np.asarray(draft.trans, np.float64)
        self.q = np.asarray(target.trans, np.float64)
        self.init_cdf = _chain_cdf(np.asarray(target.init, np.float64))
        self.horizon = self.q.shape[0]
        self.k = self.horizon if lookahead is None else lookahead
        self.m = num_drafts
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(self.p > 0, self.q / np.where(self.p > 0, self.p, 1), 1)
        if epsilon is None:
            self.accept = np.minimum(1, ratio)
            self.residual_cdf = _chain_cdf(_residual_rows(np.maximum(self.q - self.p, 0)))
        else:  # Decoding-OPT
            with np.errstate(divide="ignore", invalid="ignore"):
                self.accept = np.minimum(1, np.where(
                    self.p > 0, (self.q + epsilon) / np.where(self.p > 0, self.p, 1), 1))
            self.residual_cdf = _chain_cdf(_residual_rows(np.maximum(
                self.q - self.accept * self.p, 0)))
        self.p_cdf, self.q_cdf = _chain_cdf(self.p), _chain_cdf(self.q)
        if num_drafts > 1:  # residual chain q^1..q^{M+1} per (n, a)
            chain = [self.q]
            for _ in range(num_drafts):
                chain.append(_residual_rows(np.maximum(chain[-1] - self.p, 0)))
            self.q_chain = np.stack(chain)  # (M + 1, T, V, V)
            with np.errstate(divide="ignore", invalid="ignore"):
                self.root_accept = np.minimum(1, np.where(
                    self.p > 0, self.q_chain[:-1] / np.where(self.p > 0, self.p, 1), 1))
            self.root_final_cdf = _chain_cdf(self.q_chain[-1])

    def run(self, seed: int, num_chains: int):
        rng = np.random.default_rng(seed)
        c = num_chains
        x = _draw(rng, np.broadcast_to(self.init_cdf, (c, self.init_cdf.size)))
        j = np.zeros(c, np.int64)
        rejections = np.zeros(c, np.int64)
        calls = np.zeros(c, np.int64)
        tokens = np.empty((c, self.horizon + 1), np.int64)
        tokens[:, 0] = x
        for n in range(self.horizon):
            calls += j == 0
            draft = _draw(rng, self.p_cdf[n, x])
            acc = rng.random(c) < self.accept[n, x, draft]
            new = np.where(acc, draft, _draw(rng, self.residual_cdf[n, x]))
            rejected = ~acc
            if self.m > 1:  # roots: M drafts against the residual chain
                root = j == 0
                done = np.zeros(c, bool)
                root_tok = np.zeros(c, np.int64)
                for m in range(self.m):
                    d = _draw(rng, self.p_cdf[n, x])
                    a = ~done & (rng.random(c) < self.root_accept[m, n, x, d])
                    root_tok = np.where(a, d, root_tok)
                    done |= a
                final = _draw(rng, self.root_final_cdf[n, x])
                new = np.where(root, np.where(done, root_tok, final), new)
                rejected = np.where(root, ~done, rejected)
            bonus = j == self.k
            if bonus.any():
                new = np.where(bonus, _draw(rng, self.q_cdf[n, x]), new)
                rejected &= ~bonus
            rejections += rejected
            j = np.where(rejected | bonus, 0, j + 1)
            x = new
            tokens[:, n + 1] = x
        return tokens, rejections, calls


# ------------------------------------------------------------------------------------------- theory
# batch SD's expected rejections (``scripts/benchmark_theory.py``)


def numpy_batch_rejections(init, p, q, num_drafts: int) -> float:
    """Theorem 3's expected rejections in plain NumPy float64 (the reference a user would write)."""
    w = q.copy()
    for _ in range(num_drafts):
        s = w.sum(-1, keepdims=True)
        w = np.maximum(w - s * p, 0.0)
    root_rej, root_acc = w, q - w
    sd_rej = np.maximum(q - p, 0.0)
    sd_acc = np.minimum(p, q)
    root, inside = init.copy(), np.zeros_like(init)
    total = 0.0
    for n in range(p.shape[0]):
        rej = root @ root_rej[n] + inside @ sd_rej[n]
        acc = root @ root_acc[n] + inside @ sd_acc[n]
        total += rej.sum()
        root, inside = rej, acc
    return float(total)


# -------------------------------------------------------------------------------------- token trees
# exact values and the sampler (``scripts/benchmark_token_tree.py``)


def children_lists(parents) -> list:
    """``children[i]``: the children of node ``i`` in order (index order)."""
    children = [[] for _ in parents]
    for i in range(1, len(parents)):
        children[parents[i]].append(i)
    return children


def depths(parents) -> list:
    depth = [0] * len(parents)
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
    return depth


def stage_laws(p, q, num_children: int):
    """Multi-step speculative sampling with i.i.d. children on rows ``p``, ``q`` ``(..., V)``:
    ``(accepted (b, ..., V), last (..., V))``, the mass child ``j`` accepts (token and all) and
    the mass of the token drawn when every child is rejected."""
    w = q
    accepted = []
    for _ in range(num_children):
        scaled = w.sum(-1, keepdims=True) * p
        accepted.append(np.minimum(scaled, w))
        w = np.maximum(w - scaled, 0)
    return np.stack(accepted), w


def numpy_accepted_length(parents, p, q, position: int = 1) -> np.ndarray:
    """``(V,)``: expected drafts kept by a call at ``position`` (1-based) after each previous
    token; a node at depth ``d`` drafts its children from row ``position - 1 + d``, and only
    while ``position + d <= T``. Backward recursion over the nodes (children after parents)."""
    horizon, num_states = p.shape[0], p.shape[-1]
    kids, depth = children_lists(parents), depths(parents)
    laws = {}
    value = [None] * len(parents)
    for i in range(len(parents) - 1, -1, -1):
        d, b = depth[i], len(kids[i])
        if b == 0 or position + d > horizon:
            value[i] = np.zeros(num_states, p.dtype)
            continue
        if (d, b) not in laws:
            row = position - 1 + d
            laws[(d, b)] = stage_laws(p[row], q[row], b)[0]
        accepted = laws[(d, b)]
        total = np.zeros(num_states, p.dtype)
        for j, c in enumerate(kids[i]):
            total += accepted[j] @ (1 + value[c])
        value[i] = total
    return value[0]


def numpy_expected_calls(parents, init, p, q):
    """``(expected calls, expected rejections)`` over the whole horizon: a forward recursion
    over ``m[node, x]`` = P(the token at the current position is ``x`` and held by ``node``);
    the root holds the token a call starts after. ``O(T N V^2)``."""
    horizon = p.shape[0]
    kids = children_lists(parents)
    groups = {}  # branching factor -> (nodes (n,), their children (b, n))
    for i, ks in enumerate(kids):
        if ks:
            nodes, children = groups.setdefault(len(ks), ([], []))
            nodes.append(i)
            children.append(ks)
    groups = {b: (np.array(nodes), np.array(children).T) for b, (nodes, children) in
              groups.items()}
    leaves = np.array([i for i, ks in enumerate(kids) if not ks])
    mass = np.zeros((len(parents), p.shape[-1]), p.dtype)
    mass[0] = init
    calls = rejections = 0.0
    for n in range(horizon):
        calls += mass[0].sum()
        new = np.zeros_like(mass)
        for b, (nodes, children) in groups.items():
            accepted, last = stage_laws(p[n], q[n], b)
            here = mass[nodes]
            for j in range(b):
                new[children[j]] += here @ accepted[j]
            rejected = here.sum(0) @ last
            rejections += rejected.sum()
            new[0] += rejected
        new[0] += mass[leaves].sum(0) @ q[n]
        mass = new
    return float(calls), float(rejections)


def _cdf(rows):
    c = np.cumsum(rows, axis=-1)
    total = c[..., -1:]
    return np.where(total > 0, c / np.where(total > 0, total, 1), 1.0)


def _offset_cdf(rows):
    """Cumulative rows ``(R, V)`` offset by their index and flattened: one ``searchsorted`` then
    draws from row ``r`` for ``r + u``."""
    return (_cdf(rows) + np.arange(rows.shape[0])[:, None]).ravel()


def _search(flat, rows, u, num_states):
    k = np.searchsorted(flat, rows + u, side="right") - rows * num_states
    return np.minimum(k, num_states - 1)


class NumpyTreeSampler:
    """The token-tree sampler in NumPy (i.i.d. children), vectorised over chains."""

    def __init__(self, parents, draft, target):
        self.p = np.asarray(draft.trans, np.float64)
        self.q = np.asarray(target.trans, np.float64)
        self.init_cdf = _offset_cdf(np.asarray(target.init, np.float64)[None])
        kids = children_lists(parents)
        self.num_kids = np.array([len(k) for k in kids])
        self.width = int(self.num_kids.max())
        self.table = np.zeros((len(parents), max(self.width, 1)), np.int64)
        for i, k in enumerate(kids):
            self.table[i, :len(k)] = k

    def run(self, seed: int, num_chains: int):
        """``(calls (C,), rejections (C,))`` of ``num_chains`` chains."""
        rng = np.random.default_rng(seed)
        horizon, num_states = self.q.shape[0], self.q.shape[-1]
        c = num_chains
        x = _search(self.init_cdf, np.zeros(c, np.int64), rng.random(c), num_states)
        node = np.zeros(c, np.int64)
        calls = np.zeros(c, np.int64)
        rejections = np.zeros(c, np.int64)
        for n in range(horizon):
            p, q = self.p[n], self.q[n]
            # The residual chain r_1 = q, r_{j+1} = [r_j - p]_+ (normalised), its CDFs (the token
            # ending a call after j rejections; j = 0: the bonus at a leaf) and the acceptance
            # ratios min(1, r_j / p).
            residuals = [q]
            for _ in range(self.width):
                w = np.maximum(residuals[-1] - p, 0)
                s = w.sum(-1, keepdims=True)
                residuals.append(np.where(s > 0, w / np.where(s > 0, s, 1), 0.0))
            residuals = np.stack(residuals)  # (b + 1, V, V)
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = np.where(p > 0, np.minimum(residuals[:-1] / p, 1), 0.0)
            end_cdf = _offset_cdf(residuals.reshape(-1, num_states))
            p_cdf = _offset_cdf(p)
            calls += node == 0
            b = self.num_kids[node]
            found = np.zeros(c, bool)
            choice = np.zeros(c, np.int64)
            token = np.zeros(c, np.int64)
            for j in range(self.width):
                idx = np.flatnonzero((j < b) & ~found)
                if idx.size == 0:
                    break
                xs = x[idx]
                t = _search(p_cdf, xs, rng.random(idx.size), num_states)
                ok = rng.random(idx.size) < ratio[j, xs, t]
                hit = idx[ok]
                found[hit] = True
                choice[hit] = j
                token[hit] = t[ok]
            ends = np.flatnonzero(~found)  # every child rejected, or a leaf (b = 0: the bonus)
            token[ends] = _search(end_cdf, b[ends] * num_states + x[ends], rng.random(ends.size),
                                  num_states)
            rejections += ~found & (b > 0)
            node = np.where(found, self.table[node, choice], 0)
            x = token
        return calls, rejections


# ------------------------------------------------------------------------------- optimal acceptance
# ``scripts/benchmark_optimal_acceptance.py``


def dirichlet_rows(rng, rows: int, states: int, concentration: float, zeros: float,
                   dtype=np.float32) -> np.ndarray:
    """``rows`` Dirichlet(concentration) rows of length ``states`` with a fraction ``zeros`` of
    the entries set to exactly 0 (then renormalised; every row keeps at least one token)."""
    x = rng.gamma(concentration, size=(rows, states))
    x[rng.random((rows, states)) < zeros] = 0.0
    x[:, 0] += (x.sum(-1) == 0)  # a row with no mass left keeps its first token
    return (x / x.sum(-1, keepdims=True)).astype(dtype)


def numpy_optimal_acceptance(p: np.ndarray, q: np.ndarray, num_drafts: int) -> np.ndarray:
    """``1 - max_k [p(first k)^M - q(first k)]`` over prefixes sorted by ``q / p`` ascending."""
    positive = p > 0
    ratio = np.where(positive, q / np.where(positive, p, 1), np.where(q > 0, np.inf, 0))
    order = np.argsort(ratio, axis=-1)
    zero = np.zeros(p.shape[:-1] + (1,), p.dtype)
    p_cum = np.concatenate([zero, np.cumsum(np.take_along_axis(p, order, -1), -1)], -1)
    q_cum = np.concatenate([zero, np.cumsum(np.take_along_axis(q, order, -1), -1)], -1)
    return 1 - np.max(p_cum ** num_drafts - q_cum, axis=-1)


# --------------------------------------------------------------------------- adaptive draft lengths
# ``scripts/benchmark_adaptive.py``


def numpy_optimal_stopping(draft_trans, target_trans, init, *, lookahead, draft_cost,
                           stop_costs):
    """Least expected time to decode ``T`` tokens, and ``W`` (``(T + 1, V)``), in float64.

    ``stop_costs[d]``: the time of a call that drafted ``d`` tokens, excluding the draft passes
    (the target scoring ``d + 1`` tokens plus the overhead)."""
    p_all = np.asarray(draft_trans, np.float64)
    q_all = np.asarray(target_trans, np.float64)
    horizon, num_states, _ = q_all.shape
    with np.errstate(divide="ignore", invalid="ignore"):
        alpha_all = np.where(p_all > 0, np.minimum(1.0, q_all / p_all), 1.0)
    excess = np.maximum(q_all - p_all, 0.0)
    total = excess.sum(-1, keepdims=True)
    resid_all = np.divide(excess, total, out=np.zeros_like(excess), where=total > 0)
    values = np.zeros((horizon + 2, num_states))  # values[m]: W(m, .), m = 1..T + 1
    for n in range(horizon, 0, -1):
        depth = min(lookahead, horizon - n + 1)
        for a in range(num_states):
            last = [np.array([a])]
            all_acc = [np.ones(1)]
            committed = [np.zeros(1)]
            for i in range(depth):
                row = n + i - 1  # 0-based row of position n + i
                l = last[-1]
                lost = resid_all[row] @ values[n + i + 1]  # (V,) by the rejected draft's row
                alpha = alpha_all[row][l]  # (paths, V)
                all_acc.append((all_acc[-1][:, None] * alpha).ravel())
                committed.append((committed[-1][:, None]
                                  + all_acc[-2][:, None] * (1 - alpha) * lost[l][:, None]).ravel())
                last.append(np.tile(np.arange(num_states), len(l)))

            def stop(i):
                row = n + i - 1
                bonus = (q_all[row] @ values[n + i + 1] if n + i <= horizon
                         else np.zeros(num_states))
                return stop_costs[i] + committed[i] + all_acc[i] * bonus[last[i]]

            value = stop(depth)
            for i in range(depth - 1, -1, -1):
                p = p_all[n + i - 1][last[i]]  # (paths, V)
                go = draft_cost + np.sum(p * value.reshape(-1, num_states), axis=-1)
                value = np.minimum(stop(i), go)
            values[n, a] = value[0]
    return float(np.asarray(init, np.float64) @ values[1]), values[1:]


# ---------------------------------------------------------------------------------- protocol models
# ``scripts/benchmark_pairs.py``


@jax.tree_util.register_pytree_node_class
class LowRankBigram:
    """``P(x_t | x_{t-1}) = softmax(E[x_{t-1}] @ W)``: a protocol model whose state is the last
    token, scoring a block of contexts in one evaluation."""

    def __init__(self, embed, out):
        self.embed, self.out = embed, out

    def tree_flatten(self):
        return (self.embed, self.out), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)

    @property
    def num_states(self) -> int:
        return self.out.shape[1]

    def init_state(self):
        return jnp.zeros((), jnp.int32)

    def probs(self, state):
        return jax.nn.softmax(self.embed[state] @ self.out)

    def update(self, state, token):
        return token

    def probs_block(self, state, tokens):
        contexts = jnp.concatenate([state[None], tokens])
        return jax.nn.softmax(self.embed[contexts] @ self.out, axis=-1)


def low_rank_pair(num_states: int, rank: int):
    """``(draft, target)``: two ``LowRankBigram`` models over ``num_states`` tokens sharing
    their embeddings, the draft's output weights the target's plus noise."""
    keys = jax.random.split(jax.random.key(0), 3)
    embed = jax.random.normal(keys[0], (num_states, rank))
    out = jax.random.normal(keys[1], (rank, num_states)) * 0.7
    noise = jax.random.normal(keys[2], (rank, num_states)) * 0.3
    return LowRankBigram(embed, out + noise), LowRankBigram(embed, out)
