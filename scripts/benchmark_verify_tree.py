"""Verifying given token trees as a tree-based engine does: specjax vs plain NumPy, in one run.

A batch of ``--batch`` requests (256) sharing the tree ``--branching`` (``4,2,1``: 21 nodes,
depth 3) over ``V = --vocab`` tokens (32,000), ragged: request ``b`` uses its first ``N_b`` nodes,
drawn uniformly in ``1..N``. Draft and target rows at each node are softmaxes of nearby random
logits (float32); each node's children are drawn i.i.d. from its draft row (SpecInfer's
multi-step speculative sampling); the random numbers are given, so both implementations must
return the same tokens.

* specjax: ``specjax.verify_tree(None, TokenTree(branching), ...)`` as a user calls it (with the
  argument checks on each call), and the same function under the caller's ``jit``.
* NumPy (``specjax.experiments.references``, written independently, vectorised over the batch, node
  by node): child ``c`` of node ``i`` is accepted iff ``u[c] p(t) < min(p(t), r(t))`` against the
  residual ``r`` (``q``, then ``[r - p]_+`` normalised after each rejection); the first accepted
  child is taken; the last token is the inverse CDF of the residual (or of ``q`` at a node without
  children) at ``v[i]``.

Times are the best of ``--repeats`` after a first call (reported apart). The table gives on how
many requests the two agree: the path always should; the last token may not at large ``V`` in
float32 (cumulative sums added in another order).

Usage: python scripts/benchmark_verify_tree.py [--batch 256] [--branching 4,2,1]
       [--vocab 32000] [--repeats 5] [--seed 0]
"""

from __future__ import annotations

import argparse

import jax
import numpy as np

import specjax
from _timing import print_speed_table
from _timing import time_against_numpy
from specjax.experiments.references import numpy_verify_tree
from specjax.experiments.references import verify_tree_instance as instance


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
