"""The estimator from target rollouts against simulate-and-count, at the same number of rollouts.

For each decoder, ``N`` target rollouts are recorded (``specjax.record``) and estimated
(``specjax.estimate``: the mean of exact conditional expectations given each output), and ``N``
chains of the decoder itself are simulated (``specjax.decode``) and counted. Both are unbiased
for ``specjax.exact``'s value; the table gives the per-sequence variance of each and their ratio
(simulate-and-count over the estimator: how many times more rollouts counting needs for the same
standard error), with the exact values and both means in standard errors from them.

Usage: python scripts/pairs_variance.py [--sequences 20000] [--horizon 50] [--states 7]
"""

from __future__ import annotations

import argparse

import jax
import numpy as np

import specjax
from specjax.pairs.calls import phase_filter
from specjax.pairs.estimate import call_columns
from specjax.pairs.estimate import rates

COST = specjax.CostModel(0.1, 1.0)


def decoders():
    return (specjax.Speculative(lookahead=1), specjax.Speculative(lookahead=4),
            specjax.Speculative(), specjax.BatchSpeculative(4, lookahead=4),
            specjax.OptimalMultiDraft(4, lookahead=4))


def per_sequence(decoder, recording):
    """Per-sequence conditional expectations ``(rejections, calls, time)`` ``(N,)`` each."""
    root, inside = rates(decoder, recording)
    horizon = recording.horizon
    lookahead = decoder.resolve_lookahead(horizon)
    columns = call_columns(decoder, horizon, lookahead, COST)
    rejections, weighted, _ = phase_filter(inside, root, lookahead, columns)
    return np.asarray(rejections), np.asarray(weighted[:, 0]), np.asarray(weighted[:, 2])


def counted(key, decoder, draft, target, num):
    """Simulate-and-count: ``(rejections, calls, time)`` ``(N,)`` of ``decode``'s chains."""
    trace = specjax.decode(key, decoder, draft, target, num)
    horizon = target.horizon
    lookahead = decoder.resolve_lookahead(horizon)
    times = call_columns(decoder, horizon, lookahead, COST)[:, 2]
    return (np.asarray(trace.num_rejections, np.float64), np.asarray(trace.num_calls, np.float64),
            np.asarray(trace.new_call, np.float64) @ times)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sequences", type=int, default=20_000)
    parser.add_argument("--horizon", type=int, default=50)
    parser.add_argument("--states", type=int, default=7)
    args = parser.parse_args(argv)
    draft, target = specjax.paper_instance(num_states=args.states, horizon=args.horizon)
    key_record, key_decode = jax.random.split(jax.random.key(0))
    recording = specjax.record(key_record, draft, target, args.sequences,
                               decoders=decoders()[3:])
    rows = []
    print(f"paper instance, V = {args.states}, T = {args.horizon}, N = {args.sequences:,} "
          f"rollouts each; cost: draft 0.1, target 1")
    print("| decoder | quantity | exact | estimator (z) | counting (z) | var. estimator "
          "| var. counting | ratio |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for decoder in decoders():
        exact = specjax.exact(decoder, draft, target)
        time = float(specjax.expected_time(decoder, draft, target, COST))
        mine = per_sequence(decoder, recording)
        theirs = counted(key_decode, decoder, draft, target, args.sequences)
        wants = (float(exact.expected_rejections), float(exact.expected_calls), time)
        for name, a, b, want in zip(("rejections", "calls", "time"), mine, theirs, wants):
            var_a, var_b = a.var(ddof=1), b.var(ddof=1)
            z_a = (a.mean() - want) / np.sqrt(var_a / a.size)
            z_b = (b.mean() - want) / np.sqrt(var_b / b.size)
            row = dict(decoder=decoder.label, quantity=name, exact=want, estimator=a.mean(),
                       counting=b.mean(), z_estimator=z_a, z_counting=z_b, var_estimator=var_a,
                       var_counting=var_b, ratio=var_b / var_a)
            rows.append(row)
            print(f"| {decoder.label} | {name} | {want:.3f} | {a.mean():.3f} ({z_a:+.1f}) | "
                  f"{b.mean():.3f} ({z_b:+.1f}) | {var_a:.3f} | {var_b:.3f} | "
                  f"{var_b / var_a:.2f} |")
    return rows


if __name__ == "__main__":
    main()
