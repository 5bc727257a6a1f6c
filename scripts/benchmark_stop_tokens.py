"""What stop tokens cost: each entry point with and without ``stop_tokens``, in one run.

On the paper's instance shape (``V = 7``, ``T = 50``, SD with ``K = 4``), with the stop token 6
(outputs end after about 6 tokens), measured side by side (best of ``--repeats``, compilation
excluded):

* ``decode`` on ``MarkovChain``s (the law-table engine, then the trace cut at the stop);
* ``decode`` on the same chains lifted to ``FiniteStateModel``s (the protocol engine);
* ``decoding_statistics`` (without stop tokens the counts are taken inside the scan; with them,
  from each chunk's tokens);
* ``exact`` (the Markov recursion; without stop tokens it takes the unbiased fast path).

Chain-steps per second count ``C T`` steps per run whatever the stop: the engines run every chain
to the horizon and cut it after.

Usage: python scripts/benchmark_stop_tokens.py [--num-chains 200000] [--repeats 5] [--horizon 50]
"""

from __future__ import annotations

import argparse

import jax

import specjax
from _timing import best_time

STOP = 6


def measure(num_chains: int, repeats: int, horizon: int = 50):
    """Rows ``(entry point, seconds without, seconds with, chain-steps/s without, with)``."""
    draft, target = specjax.paper_instance(horizon=horizon)
    decoder = specjax.Speculative(4)
    lift = specjax.FiniteStateModel.from_markov_chain
    lifted = (lift(draft), lift(target))
    key = jax.random.key(0)
    cases = [
        ("decode, Markov chains",
         lambda stop: lambda i: specjax.decode(jax.random.fold_in(key, i), decoder, draft,
                                               target, num_chains, stop_tokens=stop).tokens),
        ("decode, finite-state models",
         lambda stop: lambda i: specjax.decode(jax.random.fold_in(key, i), decoder, *lifted,
                                               num_chains, horizon=horizon,
                                               stop_tokens=stop).tokens),
        ("decoding_statistics",
         lambda stop: lambda i: specjax.decoding_statistics(
             jax.random.fold_in(key, i), decoder, draft, target, num_chains,
             stop_tokens=stop).num_calls),
        ("exact",
         lambda stop: lambda i: specjax.exact(decoder, draft, target,
                                              stop_tokens=stop).new_call),
    ]
    rows = []
    for name, make in cases:
        without, with_stop = (best_time(make(stop), repeats) for stop in (None, STOP))
        steps = num_chains * horizon
        if name == "exact":
            rows.append((name, without, with_stop, float("nan"), float("nan")))
        else:
            rows.append((name, without, with_stop, steps / without, steps / with_stop))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-chains", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--horizon", type=int, default=50, help="T (the paper's: 50)")
    args = parser.parse_args(argv)
    draft, target = specjax.paper_instance(horizon=args.horizon)
    exact = specjax.exact(specjax.Speculative(4), draft, target, stop_tokens=STOP)
    full = specjax.exact(specjax.Speculative(4), draft, target)
    print(f"V = 7, T = {args.horizon}, Speculative(4), stop token {STOP}: E[length] = "
          f"{float(exact.expected_length):.2f}, E[calls] = {float(exact.expected_calls):.2f} "
          f"(without: {args.horizon}, {float(full.expected_calls):.2f}); "
          f"C = {args.num_chains:,}, best of "
          f"{args.repeats}, {jax.devices()[0].platform}")
    rows = measure(args.num_chains, args.repeats, args.horizon)
    print(f"{'entry point':30s} {'without':>11s} {'with':>11s} {'ratio':>6s} "
          f"{'steps/s without':>16s} {'steps/s with':>14s}")
    for name, without, with_stop, rate, rate_stop in rows:
        print(f"{name:30s} {without * 1e3:9.2f}ms {with_stop * 1e3:9.2f}ms "
              f"{with_stop / without:6.2f} {rate:16.3g} {rate_stop:14.3g}")
    return rows


if __name__ == "__main__":
    main()
