"""Verifying given drafts as a serving engine does: specjax vs plain NumPy, in one run.

A batch of ``--batch`` requests (256) with ``K = --lookahead`` drafts (8) over ``V = --vocab``
tokens (32,000), ragged: request ``b`` has ``K_b`` drafts, drawn uniformly in ``0..K``. Draft and
target rows are softmaxes of random logits (float32), the drafts are drawn from the draft rows,
the random numbers are given, so every implementation must return the same tokens.

* specjax, checked: ``specjax.verify_drafts(None, Speculative(), ...)`` as a user calls it, with
  the argument checks (shapes, every row read summing to one, ids in range) on each call.
* specjax, under the caller's ``jit``: the same function inside ``jax.jit`` (value checks cannot
  run on tracers; the engines' situation).
* NumPy (written here, independently, vectorised over the batch): accept ``u p(x) < q(x)`` with
  ``p(x) > 0``, the first rejection by ``cumprod``, the residual ``[q - p]_+`` of that row only, the
  token by the inverse CDF convention of ``specjax.verify_drafts``.

Times are the best of ``--repeats`` after a first call (the first call, which includes
compilation, is reported apart). The table also gives on how many requests the two agree: the number
accepted always should; the last token may not at large ``V`` in float32, where the cumulative
sums of the inverse CDF, added in another order, differ by rounding (a few ids apart).

Usage: python scripts/benchmark_verify.py [--batch 256] [--lookahead 8] [--vocab 32000]
       [--repeats 5] [--seed 0]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import specjax
from _timing import print_speed_table
from _timing import time_against_numpy


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


def instance(seed, batch, lookahead, vocab):
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


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--lookahead", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    x, p, q, counts, u, v = instance(args.seed, args.batch, args.lookahead, args.vocab)
    sd = specjax.Speculative()
    first, t_checked, t_jitted, t_numpy, ours = time_against_numpy(
        lambda x_, p_, q_, c_, u_, v_: specjax.verify_drafts(
            None, sd, x_, p_, q_, num_drafts=c_, uniforms=(u_, v_)).tokens,
        (x, p, q, counts, u, v), lambda: numpy_verify(x, p, q, counts, u, v), args.repeats)
    theirs, n = numpy_verify(x, p, q, counts, u, v)
    agree = int(np.all(ours == theirs, axis=1).sum())
    same_accepted = int(((ours != -1).sum(1) == (theirs != -1).sum(1)).sum())
    print(f"Verification of given drafts: B = {args.batch}, K = {args.lookahead} (ragged, "
          f"mean K_b = {counts.mean():.2f}), V = {args.vocab:,}, float32, "
          f"{jax.devices()[0].platform}; best of {args.repeats}")
    print()
    print_speed_table((("specjax.verify_drafts (checked)", t_checked),
                       ("specjax.verify_drafts under jit", t_jitted),
                       ("NumPy, vectorised", t_numpy)), args.batch, t_numpy)
    print()
    print(f"First call under jit (compilation included): {first:.2f} s. The number accepted "
          f"agrees on {same_accepted} of {args.batch} requests, the whole output token for token "
          f"on {agree} (float32 cumulative sums in another order move inverse-CDF boundaries); "
          f"mean accepted {n.mean():.3f}.")
    return dict(checked_s=t_checked, jitted_s=t_jitted, numpy_s=t_numpy, first_s=first,
                agree=agree, same_accepted=same_accepted, batch=args.batch,
                mean_accepted=float(n.mean()))


if __name__ == "__main__":
    main()
