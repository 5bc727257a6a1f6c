"""One process of a two-process ``jax.distributed`` run, started by ``test_distributed.py``.

Not a test module itself: ``python distributed_check.py PORT PROCESS_ID OUT`` joins the
coordinator at ``127.0.0.1:PORT`` as process ``PROCESS_ID`` of 2 (JAX's CPU collectives with
gloo), runs ``decode``, ``decoding_statistics`` and ``record`` on the global mesh of both
processes' devices (``specjax.chain_sharding()``), and writes to ``OUT`` (an ``.npz``) its own
shard of the tokens and every result gathered on all processes, for the test to compare with a
one-process run. The run's arguments are ``ARGS`` below, which the test imports. Exits non-zero
on the first failure.
"""

import sys

import numpy as np

#: The run both sides make: the sampler cases' small pair (V = 5, T = 12), 40 chains, the
#: statistics in 3 chunks of 16 (the last one padded), the recording in chunks of 16.
NUM_CHAINS = 40
CHUNK_SIZE = 16
SEED = 7


def run(sharding):
    """``(trace, statistics, recording)`` of the check, on ``sharding`` (``None``: one device)."""
    import jax

    import specjax
    from sampler_cases import instance

    draft, target = instance()
    key = jax.random.key(SEED)
    trace = specjax.decode(key, specjax.Speculative(3), draft, target, NUM_CHAINS,
                           sharding=sharding)
    stats = specjax.decoding_statistics(key, specjax.Speculative(3), draft, target, NUM_CHAINS,
                                        chunk_size=CHUNK_SIZE, sharding=sharding)
    recording = specjax.record(key, draft, target, NUM_CHAINS, chunk_size=CHUNK_SIZE,
                               sharding=sharding)
    return trace, stats, recording


def flatten(trace, stats, recording) -> dict:
    """The results as NumPy arrays by name (each must be fully addressable)."""
    out = {f"trace.{name}": np.asarray(x) for name, x in zip(trace._fields, trace)}
    out.update({f"stats.{name}": np.asarray(x) for name, x in zip(stats._fields, stats)})
    out.update({"record.tokens": np.asarray(recording.tokens),
                "record.draft_prob": np.asarray(recording.draft_prob),
                "record.target_prob": np.asarray(recording.target_prob)})
    return out


def main(port: str, process_id: int, out: str) -> None:
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process_id,
                               initialization_timeout=60)
    import specjax
    from sampler_cases import instance
    from specjax.sampling.sharding import gather

    assert jax.process_count() == 2 and len(jax.devices()) == 2 * len(jax.local_devices())
    sharding = specjax.chain_sharding()  # every device of both processes
    trace, stats, recording = run(sharding)

    # Each process holds its own chains: the first half on process 0, the second on process 1.
    (shard,) = trace.tokens.addressable_shards
    half = NUM_CHAINS // 2
    assert shard.index[0] == slice(process_id * half, (process_id + 1) * half), shard.index
    assert not trace.tokens.is_fully_addressable
    try:
        recording.save(out + ".recording.npz")
    except ValueError as error:
        assert "sharding.gather(recording)" in str(error), error
    else:
        raise AssertionError("Recording.save wrote a recording spread over processes")

    # A different key on each process is refused before any work, on both of them.
    try:
        specjax.decode(jax.random.key(process_id), specjax.Speculative(3), *instance(),
                       NUM_CHAINS, sharding=sharding)
    except ValueError as error:
        assert "same on every process" in str(error), error
    else:
        raise AssertionError("decode accepted different keys on the two processes")

    gathered = gather((trace, stats, recording))
    np.savez(out, local_tokens=np.asarray(shard.data), **flatten(*gathered))
    print(f"ok process {process_id}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
