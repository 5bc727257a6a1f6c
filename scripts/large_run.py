"""A statistics-only run too large to keep its tokens, checked against the exact theory.

Runs ``specjax.decoding_statistics`` (10^6 chains, T = 1,000 by default: 10^9 chain-steps, whose
full trace would need about 6 GB) on the paper's kind of instance, in chunks with a progress
bar, optionally sharded over every device JAX sees, and prints:

* time, chain-steps per second and the process's peak resident memory;
* mean rejections and target calls with their standard errors beside the exact values;
* the acceptance rate given a verified draft at selected positions, simulated and exact, with
  the z-score of each, and the largest |z| over all T positions;
* the law of the final token against the exact marginal (chi-square p-value).

Usage: python scripts/large_run.py [--chains 1000000] [--horizon 1000] [--lookahead K]
       [--num-drafts M] [--chunk-size N] [--shard] [--seed 0]
"""

from __future__ import annotations

import argparse
import math
import time

import jax
import numpy as np
import scipy.stats  # a dependency of jax itself

import specjax
from specjax._memory import peak_resident_bytes


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chains", type=int, default=10**6)
    parser.add_argument("--horizon", type=int, default=1000)
    parser.add_argument("--states", type=int, default=7)
    parser.add_argument("--lookahead", type=int, default=None)
    parser.add_argument("--num-drafts", type=int, default=1,
                        help="M > 1 runs batch SD instead of SD")
    parser.add_argument("--chunk-size", type=int, default=None)
    parser.add_argument("--shard", action="store_true", help="split chains over all devices")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)

    draft, target = specjax.paper_instance(num_states=args.states, horizon=args.horizon)
    if args.num_drafts > 1:
        decoder = specjax.BatchSpeculative(args.num_drafts, lookahead=args.lookahead)
        name = f"batch SD, M = {args.num_drafts}"
    else:
        decoder = specjax.Speculative(args.lookahead)
        name = "SD"
    exact = specjax.exact(decoder, draft, target)
    name += ", K = T" if args.lookahead is None else f", K = {args.lookahead}"
    sharding = specjax.chain_sharding() if args.shard else None
    steps = args.chains * args.horizon
    print(f"{name}: {args.chains:,} chains x T = {args.horizon:,} ({steps:.3g} chain-steps), "
          f"V = {args.states}, {len(jax.devices())} device(s) "
          f"({jax.devices()[0].device_kind}), sharded: {bool(sharding)}")

    start = time.perf_counter()
    stats = specjax.decoding_statistics(jax.random.key(args.seed), decoder, draft, target,
                                        args.chains, chunk_size=args.chunk_size,
                                        sharding=sharding, progress=not args.no_progress)
    seconds = time.perf_counter() - start
    peak = peak_resident_bytes() / 2**30
    print(f"time {seconds:.1f} s (compilation included), {steps / seconds / 1e6:.1f} M "
          f"chain-steps/s; peak RSS {peak:.2f} GiB")

    out = dict(seconds=seconds, peak_rss_gib=peak)
    for label, per_chain, value in (("rejections", stats.num_rejections,
                                     exact.expected_rejections),
                                    ("target calls", stats.num_calls, exact.expected_calls)):
        x = np.asarray(per_chain, np.float64)
        mean, se = x.mean(), x.std(ddof=1) / math.sqrt(x.size)
        z = (mean - float(value)) / se if se > 0 else 0.0
        print(f"{label:<13} simulated {mean:10.4f} +- {se:.4f}   exact {float(value):10.4f}   "
              f"z = {z:+.2f}")
        out[label] = (mean, se, float(value), z)

    rate = np.asarray(exact.acceptance_rate, np.float64)
    se = np.sqrt(rate * (1 - rate) / np.maximum(stats.verified, 1))
    z = np.where(se > 0, (stats.acceptance_rate - rate) / np.where(se > 0, se, 1), 0.0)
    shown = sorted({n for n in (1, 2, 3, 4, 5, 6, 10, 100, args.horizon // 2, args.horizon)
                    if 1 <= n <= args.horizon})
    print("acceptance rate given a verified draft, by position n:")
    print(f"{'n':>6}{'verified':>12}{'simulated':>11}{'exact':>9}{'z':>7}")
    for n in shown:
        print(f"{n:>6}{stats.verified[n - 1]:>12,}{stats.acceptance_rate[n - 1]:>11.5f}"
              f"{rate[n - 1]:>9.5f}{z[n - 1]:>+7.2f}")
    print(f"largest |z| over all {args.horizon} positions: {np.abs(z).max():.2f} "
          f"(at n = {int(np.abs(z).argmax()) + 1})")
    out["max_abs_z_acceptance"] = float(np.abs(z).max())

    law = np.asarray(exact.marginals[-1], np.float64)
    expected = law * stats.num_chains
    keep = expected > 0
    impossible = int(stats.final_token_counts[~keep].sum())
    chi2 = float((((stats.final_token_counts - expected) ** 2)[keep] / expected[keep]).sum())
    pvalue = float(scipy.stats.chi2.sf(chi2, int(keep.sum()) - 1))
    print(f"final token: chi-square {chi2:.2f} on {int(keep.sum()) - 1} df, p = {pvalue:.3f}; "
          f"tokens of probability 0 seen: {impossible}")
    out["final_token_pvalue"] = pvalue
    return out


if __name__ == "__main__":
    main()
