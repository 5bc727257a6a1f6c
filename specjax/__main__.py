"""``python -m specjax``: simulate SD and batch SD on the paper's default instance.

Prints mean rejections and target calls with their Monte Carlo standard errors beside the exact
values of the theory (Theorem 1, Theorem 3, lookahead K). Later versions grow this into the
paper's full reproduction.
"""

from __future__ import annotations

import argparse
import math
import time

import jax
import numpy as np

import specjax
from specjax import _models


def _mean_se(x) -> tuple[float, float]:
    x = np.asarray(x, np.float64)
    return float(x.mean()), float(x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else 0.0


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specjax", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-chains", type=int, default=200_000, help="chains per decoder")
    parser.add_argument("--seed", type=int, default=_models.PAPER_SEED,
                        help="seed of the random draft/target instance (paper: 10)")
    parser.add_argument("--states", type=int, default=_models.PAPER_NUM_STATES, help="V")
    parser.add_argument("--horizon", type=int, default=_models.PAPER_HORIZON, help="T")
    args = parser.parse_args(argv)

    draft, target = specjax.paper_instance(args.seed, args.states, args.horizon)
    c, horizon = args.num_chains, args.horizon
    print(f"specjax {specjax.__version__}: random non-stationary Markov chains, V = {args.states}, "
          f"T = {horizon}, uniform prompt, seed {args.seed}; {c:,} chains per decoder "
          f"on {jax.devices()[0].platform}.")
    print("(The paper's own random draws are unknown, so its 16.41 rejections are not expected.)")
    runs = [
        ("autoregressive (Alg. 3)", lambda k: specjax.autoregressive_decoding(k, target, c),
         None),
        ("SD, K = T (Alg. 1)", lambda k: specjax.speculative_decoding(k, draft, target, c),
         specjax.exact_speculative_decoding(draft, target)),
        ("SD, K = 4", lambda k: specjax.speculative_decoding(k, draft, target, c, lookahead=4),
         specjax.exact_speculative_decoding(draft, target, lookahead=4)),
    ] + [
        (f"batch SD, M = {m} (Alg. 4)",
         lambda k, m=m: specjax.batch_speculative_decoding(k, draft, target, c, num_drafts=m),
         specjax.exact_batch_speculative_decoding(draft, target, num_drafts=m))
        for m in (2, 4, 5)
    ]
    header = f"{'decoder':<26}{'N_rej':>9}{'± se':>8}{'exact':>9}{'calls':>9}{'± se':>8}" \
             f"{'exact':>9}{'T/calls':>9}{'wall*':>8}"
    print(header)
    print("-" * len(header))
    key = jax.random.key(args.seed)
    for i, (name, run, exact) in enumerate(runs):
        start = time.perf_counter()
        trace = jax.block_until_ready(run(jax.random.fold_in(key, i)))
        elapsed = time.perf_counter() - start
        rej, rej_se = _mean_se(trace.num_rejections)
        calls, calls_se = _mean_se(trace.num_calls)
        exact_rej = 0.0 if exact is None else float(exact.expected_rejections)
        exact_calls = float(horizon) if exact is None else float(exact.expected_calls)
        print(f"{name:<26}{rej:>9.3f}{rej_se:>8.3f}{exact_rej:>9.3f}{calls:>9.3f}{calls_se:>8.3f}"
              f"{exact_calls:>9.3f}{horizon / calls:>9.2f}{elapsed:>7.2f}s")
    limit = float(specjax.batch_expected_rejections(draft, target, num_drafts=math.inf))
    print(f"exact: specjax.exact_* (no sampling). Batch SD as M -> infinity: {limit:.3f} "
          "rejections; it never reaches 0 (the paper's Proposition).")
    print("* wall time of the first call, compilation included.")


if __name__ == "__main__":
    main()
