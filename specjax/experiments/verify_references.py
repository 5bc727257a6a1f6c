"""The NumPy references of the verification benchmarks, written once (re-exported by
``specjax.experiments.references``): SD verification of given drafts and of given i.i.d. token
trees, vectorised over requests, and the instance builders that draw their inputs
(``verify_instance``, ``verify_tree_instance``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["verify_instance", "numpy_verify", "verify_tree_instance", "numpy_inverse_cdf",
           "numpy_verify_tree"]


# ------------------------------------------------------------------------------------- given drafts
# ``scripts/benchmark_verify.py``


def verify_instance(seed, batch, lookahead, vocab):
    rng = np.random.default_rng(seed)
    key = jax.random.key(seed)
    k1, k2, k3 = jax.random.split(key, 3)
    # Logits near each other: draft and target agree on most of their mass, as in practice.
    base = jax.random.normal(k1, (batch, lookahead + 1, vocab), jnp.float32) * 3
    q = jax.nn.softmax(base + 0.5 * jax.random.normal(k2, base.shape, jnp.float32), axis=-1)
    p = jax.nn.softmax(base[:, :lookahead], axis=-1)
    x = jax.random.categorical(k3, jnp.log(p)).astype(jnp.int32)
    counts = rng.integers(0, lookahead + 1, batch).astype(np.int32)
    x = jnp.where(jnp.arange(lookahead)[None] < counts[:, None], x, -1)
    u = rng.random((batch, lookahead), np.float32)
    v = rng.random((batch, lookahead + 1), np.float32)
    return (np.asarray(x), np.asarray(p), np.asarray(q), counts, u, v)


def numpy_verify(x, p, q, counts, u, v):
    """Vectorised NumPy SD verification of given drafts: ``(tokens (B, K + 1), accepted)``."""
    num_requests, lookahead = x.shape
    rows = np.arange(num_requests)
    px = np.take_along_axis(p, x[..., None], -1)[..., 0]
    qx = np.take_along_axis(q[:, :lookahead], x[..., None], -1)[..., 0]
    keep = (px > 0) & (u * px < qx) & (np.arange(lookahead)[None] < counts[:, None])
    n = np.cumprod(keep, axis=1).sum(1)
    bonus = n == counts
    q_n = q[rows, n]
    p_n = p[rows, np.minimum(n, lookahead - 1)]
    w = np.where(bonus[:, None], q_n, np.maximum(q_n - p_n, 0))
    w = np.where(w.sum(1, keepdims=True) > 0, w, q_n)
    cw = np.cumsum(w, axis=1)
    last = (v[rows, n][:, None] * cw[:, -1:] >= cw).sum(1)
    last = np.minimum(last, w.shape[1] - 1 - np.argmax(w[:, ::-1] > 0, axis=1))
    position = np.arange(lookahead + 1)[None]
    padded = np.concatenate([x, np.zeros((num_requests, 1), x.dtype)], axis=1)
    out = np.where(position < n[:, None], padded, np.where(position == n[:, None],
                                                            last[:, None], -1))
    return out, n


# -------------------------------------------------------------------------------- given token trees
# ``scripts/benchmark_verify_tree.py``


def verify_tree_instance(seed, batch, parents, vocab):
    rng = np.random.default_rng(seed)
    size = len(parents)
    k1, k2 = jax.random.split(jax.random.key(seed))
    base = jax.random.normal(k1, (batch, size, vocab), jnp.float32) * 3
    q = np.asarray(jax.nn.softmax(base + 0.5 * jax.random.normal(k2, base.shape), axis=-1))
    p = np.asarray(jax.nn.softmax(base, axis=-1))
    x = np.zeros((batch, size), np.int32)
    cdf = np.cumsum(p.astype(np.float64), axis=-1)
    for c in range(1, size):  # child c ~ p at its parent, by inverse CDF
        draw = rng.random(batch)[:, None] * cdf[:, parents[c], -1:]
        x[:, c] = np.minimum((draw >= cdf[:, parents[c]]).sum(1), vocab - 1)
    counts = rng.integers(1, size + 1, batch).astype(np.int32)
    u = rng.random((batch, size), np.float32)
    v = rng.random((batch, size), np.float32)
    return x, p, q, counts, u, v


def numpy_inverse_cdf(w, v):
    """The smallest ``y`` with ``v W < cumsum(w)[y]`` per row, clipped to the last token of
    positive mass."""
    cw = np.cumsum(w, axis=1)
    last = (v[:, None] * cw[:, -1:] >= cw).sum(1)
    return np.minimum(last, w.shape[1] - 1 - np.argmax(w[:, ::-1] > 0, axis=1))


def numpy_verify_tree(parents, x, p, q, counts, u, v):
    """Vectorised NumPy verification of i.i.d. trees: ``(path tokens (B, D + 1), accepted)``."""
    num_requests, size = x.shape
    rows = np.arange(num_requests)
    children = [[c for c in range(size) if parents[c] == i] for i in range(size)]
    chosen = np.full((num_requests, size), -1)
    ends = np.zeros((num_requests, size), np.int64)
    for node in range(size):
        r, d = q[:, node].astype(np.float64), p[:, node]
        pick = np.full(num_requests, -1)
        for c in children[node]:
            t = x[:, c]
            searching = (c < counts) & (pick < 0)
            d_t, r_t = d[rows, t], r[rows, t]
            accept = searching & (u[:, c] * d_t < np.minimum(d_t, r_t))
            pick = np.where(accept, c, pick)
            rejected = searching & ~accept
            w = np.maximum(r - d, 0)
            total = w.sum(1, keepdims=True)
            w = np.where(total > 0, w / np.where(total > 0, total, 1), 0)
            r = np.where(rejected[:, None], w, r)
        r = np.where(r.sum(1, keepdims=True) > 0, r, q[:, node])
        chosen[:, node] = pick
        ends[:, node] = numpy_inverse_cdf(r.astype(np.float32), v[:, node])
    depth = max(len(path) for path in _paths(parents))
    out = np.full((num_requests, depth + 1), -1)
    node = np.zeros(num_requests, np.int64)
    done = np.zeros(num_requests, bool)
    accepted = np.zeros(num_requests, np.int64)
    for level in range(depth + 1):
        nxt = chosen[rows, node]
        descend = ~done & (nxt >= 0)
        ending = ~done & (nxt < 0)
        out[:, level] = np.where(descend, x[rows, np.maximum(nxt, 0)],
                                 np.where(ending, ends[rows, node], -1))
        accepted += descend
        node = np.where(descend, nxt, node)
        done |= ending
    return out, accepted


def _paths(parents):
    paths = []
    for node in range(len(parents)):
        path = []
        while node > 0:
            path.append(node)
            node = parents[node]
        paths.append(path)
    return paths
