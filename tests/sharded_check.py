"""Run in a subprocess with 4 forced host devices by ``test_scale.py``: sharded == unsharded.

Not a test module itself: ``XLA_FLAGS=--xla_force_host_platform_device_count=4`` must be set
before JAX starts, and must not leak into the other tests. Exits non-zero on the first mismatch.

Its one argument is the ``.npz`` file that ``test_scale.py`` wrote: the models, the key's seed
and every case's unsharded trace (``unsharded_reference``), computed in the test's own process.
"""

import os
import re
import sys

import jax
import numpy as np
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import specjax
from specjax.sampling import decoding as decode
from sampler_cases import CASES
from sampler_cases import MAX_DIFFERING
from sampler_cases import REPRODUCIBLE
from sampler_cases import differing_chains

assert "xla_force_host_platform_device_count=4" in os.environ.get("XLA_FLAGS", "")
devices = jax.devices()
assert len(devices) == 4, devices

# The unsharded trace of every case comes from the test's process, where
# test_statistics_equal_trace_counts_in_padded_chunks compiled its program (the chain count and
# the pair of that test). Here each would be a compilation of its own, about 1 s: JAX's persistent
# cache key includes the CPU client's topology, so the device count, and an entry written by a
# one-device process never serves this one.
C = 3000
reference = np.load(sys.argv[1])
draft, target = (specjax.MarkovChain(reference[f"{which} init"], reference[f"{which} trans"])
                 for which in ("draft", "target"))
key = jax.random.key(int(reference["seed"]))
grid = Mesh(np.asarray(devices).reshape(2, 2), ("a", "b"))
layouts = {
    "chain_sharding()": (specjax.chain_sharding(), 4),
    "2x2 mesh": (grid, 4),
    "P('a') on a 2x2 mesh": (NamedSharding(grid, P("a")), 2),
    "two devices": (specjax.chain_sharding(devices[2:]), 2),
}


def same(a, b, what):
    for name, x, y in zip(a._fields, a, b):
        if not np.array_equal(np.asarray(x), np.asarray(y)):
            raise AssertionError(f"{what}: field {name} differs")


def counts(trace, num_states):
    """What ``decoding_statistics`` should return, from a full trace (bonus positions derived
    from the call structure: the ``K + 1``-th position of a call)."""
    return (trace.num_rejections, trace.num_calls, np.asarray(trace.rejected).sum(0),
            np.asarray(trace.new_call).sum(0),
            np.bincount(np.asarray(trace.tokens[:, -1]), minlength=num_states))


def same_counts(stats, trace, what):
    expected = counts(trace, len(stats.final_token_counts))
    got = (stats.num_rejections, stats.num_calls, stats.rejected, stats.new_call,
           stats.final_token_counts)
    for i, (x, y) in enumerate(zip(got, expected)):
        if not np.array_equal(np.asarray(x), np.asarray(y)):
            raise AssertionError(f"{what}: statistic {i} differs")


# The sharded chunked statistics of one case per engine path that counts: a token-wise decoder on
# Markov chains (counts kept inside the law-table scan, ``counts._markov_counts``) and a
# call-level decoder (counts taken from each chunk's trace, ``counts._trace_counts``); the
# protocol, batched-scoring and stop-token paths run below. The counting code of a path is the
# same for every decoder (a decoder only changes the law tables or the calls' outcomes, which
# the sharded ``decode`` of every case checks here), and the unsharded chunked statistics of
# every case are checked against its trace in test_scale
# (test_statistics_equal_trace_counts_in_padded_chunks). Each case's sharded statistics is a
# compilation of its own (about 1 s of this check's CPU per case).
STATISTICS = ("sd K=3", "block K=3")
assert set(STATISTICS) <= set(REPRODUCIBLE)

for name, decoder in CASES.items():
    plain = specjax.DecodingTrace(*(reference[f"{name}|{field}"]
                                    for field in specjax.DecodingTrace._fields))
    # Every layout for one sampler, the plainest one for the others (each is a compilation).
    chosen = layouts if name == "sd K=3" else {"chain_sharding()": layouts["chain_sharding()"]}
    for layout, (sharding, shards) in chosen.items():
        sharded = specjax.decode(key, decoder, draft, target, C, sharding=sharding)
        pieces = {s.data.shape for s in sharded.tokens.addressable_shards}
        assert pieces == {(C // shards, target.horizon + 1)}, (name, layout, pieces)
        emitted = {s.data.shape for s in sharded.num_emitted.addressable_shards}
        assert emitted == {(C // shards,)}, (name, layout, emitted)  # split, not replicated
        if name in REPRODUCIBLE:
            same(plain, sharded, f"{name}, {layout}")
        else:  # the same chains but for a few whose uniform falls within an ulp of a threshold
            share = differing_chains(sharded, plain)
            assert share <= MAX_DIFFERING, (name, layout, share)
        if name in STATISTICS:
            chunked = specjax.decoding_statistics(key, decoder, draft, target, C,
                                                  sharding=sharding, chunk_size=1200)
            same_counts(chunked, plain, f"{name}, statistics, {layout}")
    print("ok", name)

# Protocol models (XLA:CPU had no sharded reduce_or for their row checks) and stop tokens.
corpus = [np.array([0, 1, 2, 1, 1, 0, 2, 2, 1, 0, 0, 1, 2, 0, 1])]
ngrams = (specjax.NGramModel.fit(corpus, order=1, num_states=3),
          specjax.NGramModel.fit(corpus, order=2, num_states=3))
for what, models, extra in (("n-grams", ngrams, {"horizon": 8}),
                            ("stop tokens", (draft, target), {"stop_tokens": [1]}),
                            ("batched scoring", ngrams, {"horizon": 8,
                                                         "batched_scoring": True})):
    plain = specjax.decode(key, specjax.Speculative(2), *models, C, **extra)
    sharded = specjax.decode(key, specjax.Speculative(2), *models, C,
                             sharding=specjax.chain_sharding(), **extra)
    same(plain, sharded, what)
    chunked = specjax.decoding_statistics(key, specjax.Speculative(2), *models, C,
                                          sharding=specjax.chain_sharding(), chunk_size=1200,
                                          **extra)
    same_counts(chunked, plain, f"{what}, statistics")
    print("ok", what)

# The trace path needs no communication between devices at all: the program that the sharded
# decode of "sd" above ran (its arguments exactly as ``decode`` passes them, so that JAX's
# lowering and compilation caches return it instead of compiling another).
run = decode.replicate(decode.plan(key, specjax.Speculative(), draft, target, C,
                                   sharding=specjax.chain_sharding()))
hlo = decode._simulate_markov.lower(key, run.decoder, run.draft, run.target, np.uint32(0),
                                    num_chains=C, lookahead=run.lookahead,
                                    sharding=run.sharding, tables=decode.table_plan(run),
                                    with_verified=False).compile().as_text()
collectives = re.findall(r"all-gather|all-reduce|all-to-all|collective-permute|reduce-scatter",
                         hlo)
assert not collectives, collectives
assert specjax.sampling.counts.default_chunk_size(specjax.chain_sharding()) == 4 * 2**20
print("ok no collectives")
