"""``python -m specjax``: simulate SD and batch SD on the paper's default instance.

Prints mean rejections and target calls with their Monte Carlo standard errors. Later versions
grow this into the paper's full reproduction.
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
        ("autoregressive (Alg. 3)", lambda k: specjax.autoregressive_decoding(k, target, c)),
        ("SD, K = T (Alg. 1)", lambda k: specjax.speculative_decoding(k, draft, target, c)),
        ("SD, K = 4", lambda k: specjax.speculative_decoding(k, draft, target, c, lookahead=4)),
    ] + [
        (f"batch SD, M = {m} (Alg. 4)",
         lambda k, m=m: specjax.batch_speculative_decoding(k, draft, target, c, num_drafts=m))
        for m in (2, 4, 5)
    ]
    header = f"{'decoder':<26}{'E[N_rej]':>10}{'± se':>9}{'E[calls]':>10}{'± se':>9}" \
             f"{'T/calls':>9}{'wall*':>8}"
    print(header)
    print("-" * len(header))
    key = jax.random.key(args.seed)
    for i, (name, run) in enumerate(runs):
        start = time.perf_counter()
        trace = jax.block_until_ready(run(jax.random.fold_in(key, i)))
        elapsed = time.perf_counter() - start
        rej, rej_se = _mean_se(trace.num_rejections)
        calls, calls_se = _mean_se(trace.num_calls)
        print(f"{name:<26}{rej:>10.3f}{rej_se:>9.3f}{calls:>10.3f}{calls_se:>9.3f}"
              f"{horizon / calls:>9.2f}{elapsed:>7.2f}s")
    print("* wall time of the first call, compilation included.")


if __name__ == "__main__":
    main()
