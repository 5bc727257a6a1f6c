"""Recording statistics at a realistic vocabulary, and estimating from them: time and memory.

Two protocol models over ``V`` tokens (a low-rank bigram each: ``softmax(E[x] @ W)`` with
``rank``-dimensional embeddings, scoring a whole sequence in one ``probs_block`` evaluation) play
draft and target. ``specjax.record`` draws ``B`` target rollouts of ``T`` tokens and keeps the
per-position statistics; the table gives the time of the rollouts plus scoring, the bytes the
recording holds (against the bytes its full rows would take), the process's peak resident memory,
and the time of ``specjax.estimate`` for SD with several lookaheads and a cost model.

Usage: python scripts/benchmark_pairs.py [--states 32000] [--horizon 256] [--sequences 1000]
                                         [--rank 16] [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time

import jax

import specjax
from specjax import _memory
from specjax.experiments.references import low_rank_pair as models


def nbytes(tree) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--states", type=int, default=32_000)
    parser.add_argument("--horizon", type=int, default=256)
    parser.add_argument("--sequences", type=int, default=1_000)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="V = 2,000, T = 64, B = 100")
    args = parser.parse_args(argv)
    if args.quick:
        args.states, args.horizon, args.sequences = 2_000, 64, 100
    draft, target = models(args.states, args.rank)
    cost = specjax.CostModel(0.05, 1.0)
    start = time.perf_counter()
    recording = specjax.record(jax.random.key(1), draft, target, args.sequences,
                               horizon=args.horizon, progress=sys.stderr.isatty())
    jax.block_until_ready(recording)
    record_s = time.perf_counter() - start
    held = nbytes(recording)
    rows = 2 * args.sequences * args.horizon * args.states * 4
    out = [dict(step="record (rollouts + scoring)", seconds=record_s, bytes=held)]
    for lookahead in (1, 4, 8, None):
        decoder = specjax.Speculative(lookahead=lookahead)
        jax.block_until_ready(specjax.estimate(decoder, recording, cost=cost))  # compile
        start = time.perf_counter()
        est = specjax.estimate(decoder, recording, cost=cost)
        jax.block_until_ready(est.expected_time)
        out.append(dict(step=f"estimate {decoder.label}", seconds=time.perf_counter() - start,
                        bytes=None, value=float(est.expected_calls),
                        se=float(est.expected_calls_se)))
    peak = _memory.peak_resident_bytes()
    print(f"V = {args.states:,}, T = {args.horizon}, B = {args.sequences:,}, rank {args.rank}; "
          f"{jax.devices()[0].platform}; recording {_memory.format_bytes(held)} (full rows "
          f"would be {_memory.format_bytes(rows)}); peak resident memory "
          f"{_memory.format_bytes(peak)}")
    print("| step | seconds | E[calls] (se) |")
    print("| --- | ---: | ---: |")
    for row in out:
        calls = f"{row['value']:.2f} ({row['se']:.2f})" if "value" in row else ""
        print(f"| {row['step']} | {row['seconds']:.3f} | {calls} |")
    return out


if __name__ == "__main__":
    main()
