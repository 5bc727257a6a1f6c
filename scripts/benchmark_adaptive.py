"""The optimal adaptive draft length: time to solve it, specjax vs plain NumPy, in one run.

On random chains (``specjax.random_markov_chain``, V = 16, T = 64 by default) with a draft pass at
``--draft-cost`` of a target call, ``specjax.theory.optimal_stopping(draft, target, cost,
max_lookahead=K)`` (K = 6 by default) solves the stopping policy of least expected time by
backward induction over positions, previous tokens and the ``V**K`` drafted paths of a call.

NumPy (``specjax.experiments.references``, written independently): the same backward induction with
the drafted paths of one call flattened (a path of ``i`` drafts is an index in ``0..V**i - 1``, its
children ``index * V + x``), one previous token at a time: forward over depths the probability ``A``
that every draft is kept and the expected time-to-go ``R`` committed by the first rejection, then
backward ``value_i = min(stop_i, draft_cost + sum_x p(x | last) value_{i+1})``. It runs in float64
(the reference) and is timed once (it takes minutes at the default size); specjax is timed as the
best of ``--repeats`` after a first call that includes compilation.

The table gives both times, their ratio, the expected times and their difference, whether the
thresholds reproduce every decision (``threshold_form``), and the time of the best fixed
lookahead for scale. In float32 at the default size ``threshold_form`` can be False: stopping and
going on differ by less than float32's rounding on a few paths (measured on the --x64 instance
solved in float32 and in float64: False and True).

Then the long run: ``specjax.optimal_rate`` (policy iteration on the average-cost semi-Markov
decision problem) on the rows of position 1 repeated at every position, with
``--rate-lookahead`` (4: each evaluation enumerates ``V**(K + 1)`` paths, bounded by ``2**22``),
timed the same way, beside the best fixed lookahead's time per token.

Usage: python scripts/benchmark_adaptive.py [--states 16] [--horizon 64] [--max-lookahead 6]
       [--draft-cost 0.1] [--repeats 2] [--x64] [--no-numpy] [--rate-lookahead 4]
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

import specjax
from _timing import best_time
from _timing import timed
from specjax.experiments.references import numpy_optimal_stopping


def _seconds(value: float) -> str:
    return f"{value:.2f} s" if value >= 1 else f"{value * 1e3:.1f} ms"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--states", type=int, default=16)
    parser.add_argument("--horizon", type=int, default=64)
    parser.add_argument("--max-lookahead", type=int, default=6)
    parser.add_argument("--draft-cost", type=float, default=0.1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--x64", action="store_true")
    parser.add_argument("--no-numpy", action="store_true")
    parser.add_argument("--rate-lookahead", type=int, default=4,
                        help="K of the long-run solve (optimal_rate); 0 skips it")
    args = parser.parse_args(argv)
    with jax.enable_x64(args.x64):  # restored on return: a test may call main twice
        return _run(args)


def _run(args) -> dict:
    k, horizon = args.max_lookahead, args.horizon
    draft = specjax.random_markov_chain(jax.random.key(1), args.states, horizon)
    target = specjax.random_markov_chain(jax.random.key(2), args.states, horizon)
    cost = specjax.CostModel(draft_cost=args.draft_cost, target_cost=1.0)
    dtype = str(target.trans.dtype)

    results = {}

    def solve(_):
        results["best"] = specjax.theory.optimal_stopping(draft, target, cost, max_lookahead=k)
        return results["best"].values

    first = timed(lambda: jax.block_until_ready(solve(0)))
    seconds = best_time(solve, args.repeats)
    best = results["best"]
    fixed = specjax.theory.best_lookahead(draft, target, cost, max_lookahead=min(k, horizon))
    row = {"states": args.states, "horizon": horizon, "max_lookahead": k, "dtype": dtype,
           "first_s": first, "specjax_s": seconds, "expected_time": float(best.expected_time),
           "threshold_form": bool(best.threshold_form),
           "best_fixed_time": float(fixed.expected_time), "best_fixed_k": int(fixed.lookahead)}
    if not args.no_numpy:
        stop_costs = [cost.call_time(draft_passes=0, tokens_scored=d + 1) for d in range(k + 1)]
        start = time.perf_counter()
        numpy_time, numpy_values = numpy_optimal_stopping(
            draft.trans, target.trans, target.init, lookahead=k, draft_cost=cost.draft_cost,
            stop_costs=stop_costs)
        row["numpy_s"] = time.perf_counter() - start
        row["numpy_expected_time"] = numpy_time
        row["diff"] = abs(numpy_time - row["expected_time"])
        row["values_diff"] = float(np.max(np.abs(numpy_values - np.asarray(best.values))))

    print(f"Optimal stopping on random chains, V = {args.states}, T = {horizon}, K <= {k}, "
          f"draft cost {args.draft_cost} (specjax {dtype}, NumPy float64)")
    print("| quantity | specjax | compile+first | NumPy | NumPy / specjax |")
    print("| --- | --- | --- | --- | --- |")
    numpy_s = row.get("numpy_s")
    ratio = f"{numpy_s / seconds:.1f}x" if numpy_s else "-"
    print(f"| solve | {_seconds(seconds)} | {_seconds(first)} | "
          f"{_seconds(numpy_s) if numpy_s else '-'} | {ratio} |")
    if numpy_s:
        print(f"| expected time | {row['expected_time']:.6f} | | "
              f"{row['numpy_expected_time']:.6f} | diff {row['diff']:.1e}, "
              f"max |W diff| {row['values_diff']:.1e} |")
    else:
        print(f"| expected time | {row['expected_time']:.6f} | | - | - |")
    print(f"threshold form: {row['threshold_form']}; best fixed K = {row['best_fixed_k']}: "
          f"{row['best_fixed_time']:.4f} ({row['best_fixed_time'] / row['expected_time'] - 1:+.2%}"
          " vs optimal)")
    if args.rate_lookahead:
        row.update(_long_run(draft, target, cost, min(args.rate_lookahead, horizon),
                             args.repeats))
    return row


def _long_run(draft, target, cost, k: int, repeats: int) -> dict:
    """``optimal_rate`` on the rows of position 1 repeated (a stationary pair), timed."""
    steady = [specjax.MarkovChain(m.init, jax.numpy.broadcast_to(m.trans[0], m.trans.shape))
              for m in (draft, target)]
    results = {}

    def solve(_):
        results["best"] = specjax.optimal_rate(*steady, cost, max_lookahead=k)
        return results["best"].relative_values

    first = timed(lambda: jax.block_until_ready(solve(0)))
    seconds = best_time(solve, repeats)
    best = results["best"]
    fixed = [float(specjax.theory.stationary_rate(
        specjax.AdaptiveSpeculative(specjax.decoders.FixedLength(j), max_lookahead=j), *steady,
        cost).time_per_token) for j in range(1, k + 1)]
    print(f"\nLong run (optimal_rate, policy iteration) on the rows of position 1 repeated, "
          f"K <= {k}")
    print("| solve | compile+first | iterations | tokens per unit time | Bellman residual | "
          "best fixed K |")
    print("| --- | --- | --- | --- | --- | --- |")
    ratio = min(fixed) * float(best.tokens_per_time) - 1
    print(f"| {_seconds(seconds)} | {_seconds(first)} | {best.iterations} | "
          f"{float(best.tokens_per_time):.6f} | {float(best.bellman_residual):.1e} | "
          f"K = {1 + int(np.argmin(fixed))}, {ratio:+.2%} time per token |")
    return {"rate_s": seconds, "rate_first_s": first, "rate_iterations": best.iterations,
            "rate_time_per_token": float(best.time_per_token), "rate_best_fixed": min(fixed),
            "rate_bellman_residual": float(best.bellman_residual)}


if __name__ == "__main__":
    main()
