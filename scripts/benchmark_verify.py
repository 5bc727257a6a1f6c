"""Verifying given drafts as a serving engine does: specjax vs plain NumPy, in one run.

A batch of ``--batch`` requests (256) with ``K = --lookahead`` drafts (8) over ``V = --vocab``
tokens (32,000), ragged: request ``b`` has ``K_b`` drafts, drawn uniformly in ``0..K``. Draft and
target rows are softmaxes of random logits (float32), the drafts are drawn from the draft rows,
the random numbers are given, so every implementation must return the same tokens.

* specjax, checked: ``specjax.verify_drafts(None, Speculative(), ...)`` as a user calls it, with
  the argument checks (shapes, every row read summing to one, ids in range) on each call.
* specjax, under the caller's ``jit``: the same function inside ``jax.jit`` (value checks cannot
  run on tracers; the engines' situation).
* NumPy (``specjax.experiments.references``, written independently, vectorised over the batch):
  accept ``u p(x) < q(x)`` with ``p(x) > 0``, the first rejection by ``cumprod``, the residual
  ``[q - p]_+`` of that row only, the token by the inverse CDF convention of
  ``specjax.verify_drafts``.

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
import numpy as np

import specjax
from _timing import print_speed_table
from _timing import time_against_numpy
from specjax.experiments.references import numpy_verify
from specjax.experiments.references import verify_instance as instance


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
