"""Verifying given token trees as a tree-based engine does: specjax vs plain NumPy, in one run.

A batch of ``--batch`` requests (256) sharing the tree ``--branching`` (``4,2,1``: 21 nodes,
depth 3) over ``V = --vocab`` tokens (32,000), ragged: request ``b`` uses its first ``N_b`` nodes,
drawn uniformly in ``1..N``. Draft and target rows at each node are softmaxes of nearby random
logits (float32); each node's children are drawn i.i.d. from its draft row (SpecInfer's
multi-step speculative sampling); the random numbers are given, so both implementations must
return the same tokens.

* specjax: ``specjax.verify_tree(None, TokenTree(branching), ...)`` as a user calls it (with the
  argument checks on each call), and the same function under the caller's ``jit``.
* NumPy (written here, independently, vectorised over the batch, node by node): child ``c`` of
  node ``i`` is accepted iff ``u[c] p(t) < min(p(t), r(t))`` against the residual ``r`` (``q``,
  then ``[r - p]_+`` normalised after each rejection); the first accepted child is taken; the last
  token is the inverse CDF of the residual (or of ``q`` at a node without children) at
  ``v[i]``.

Times are the best of ``--repeats`` after a first call (reported apart). The table gives on how
many requests the two agree: the path always should; the last token may not at large ``V`` in
float32 (cumulative sums added in another order).

Usage: python scripts/benchmark_verify_tree.py [--batch 256] [--branching 4,2,1]
       [--vocab 32000] [--repeats 5] [--seed 0]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import specjax
from _timing import print_speed_table
from _timing import time_against_numpy


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


def instance(seed, batch, parents, vocab):
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


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--branching", default="4,2,1")
    parser.add_argument("--vocab", type=int, default=32_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    tree = specjax.TokenTree(tuple(int(b) for b in args.branching.split(",")))
    parents = tree.shape.parents
    x, p, q, counts, u, v = instance(args.seed, args.batch, parents, args.vocab)
    first, t_checked, t_jitted, t_numpy, ours = time_against_numpy(
        lambda x_, p_, q_, c_, u_, v_: specjax.verify_tree(
            None, tree, x_, p_, q_, num_nodes=c_, uniforms=(u_, v_)).tokens,
        (x, p, q, counts, u, v), lambda: numpy_verify_tree(parents, x, p, q, counts, u, v),
        args.repeats)
    theirs, accepted = numpy_verify_tree(parents, x, p, q, counts, u, v)
    agree = int(np.all(ours == theirs, axis=1).sum())
    prefix = np.arange(ours.shape[1])[None] < accepted[:, None]
    same_path = int(((((ours != -1).sum(1) - 1) == accepted)
                     & np.all(np.where(prefix, ours == theirs, True), axis=1)).sum())
    print(f"Verification of given token trees: B = {args.batch}, tree {tree.branching} "
          f"({tree.num_nodes} nodes, ragged, mean N_b = {counts.mean():.2f}), "
          f"V = {args.vocab:,}, float32, {jax.devices()[0].platform}; best of {args.repeats}")
    print()
    print_speed_table((("specjax.verify_tree (checked)", t_checked),
                       ("specjax.verify_tree under jit", t_jitted),
                       ("NumPy, vectorised", t_numpy)), args.batch, t_numpy)
    print()
    print(f"First call under jit (compilation included): {first:.2f} s. The accepted path "
          f"agrees on {same_path} of {args.batch} requests, the whole output token for token on "
          f"{agree}; mean accepted {accepted.mean():.3f}.")
    return dict(checked_s=t_checked, jitted_s=t_jitted, numpy_s=t_numpy, first_s=first,
                agree=agree, same_path=same_path, batch=args.batch,
                mean_accepted=float(accepted.mean()))


if __name__ == "__main__":
    main()
