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
import jax.numpy as jnp
import numpy as np

import specjax
from specjax import _memory


@jax.tree_util.register_pytree_node_class
class LowRankBigram:
    """``P(x_t | x_{t-1}) = softmax(E[x_{t-1}] @ W)``: a protocol model whose state is the last
    token, scoring a block of contexts in one evaluation."""

    def __init__(self, embed, out):
        self.embed, self.out = embed, out

    def tree_flatten(self):
        return (self.embed, self.out), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)

    @property
    def num_states(self) -> int:
        return self.out.shape[1]

    def init_state(self):
        return jnp.zeros((), jnp.int32)

    def probs(self, state):
        return jax.nn.softmax(self.embed[state] @ self.out)

    def update(self, state, token):
        return token

    def probs_block(self, state, tokens):
        contexts = jnp.concatenate([state[None], tokens])
        return jax.nn.softmax(self.embed[contexts] @ self.out, axis=-1)


def models(num_states: int, rank: int):
    keys = jax.random.split(jax.random.key(0), 3)
    embed = jax.random.normal(keys[0], (num_states, rank))
    out = jax.random.normal(keys[1], (rank, num_states)) * 0.7
    noise = jax.random.normal(keys[2], (rank, num_states)) * 0.3
    return LowRankBigram(embed, out + noise), LowRankBigram(embed, out)


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
