"""Recordings built in chunks (issue 47, item 1): ``Recording.concatenate`` and
``Recording.from_chunks`` give the recording built at once, and building from 32,000-wide row
chunks keeps memory near one chunk's rows."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import specjax
from compile_flags import without_fast_compile
from specjax.pairs import Recording

V, T, B = 4, 5, 12


def _dump(seed=0):
    rng = np.random.default_rng(seed)
    q = rng.dirichlet(np.ones(V), size=(B, T))
    p = rng.dirichlet(np.ones(V), size=(B, T))
    tokens = np.zeros((B, T + 1), np.int64)
    for t in range(T):
        tokens[:, t + 1] = [rng.choice(V, p=q[b, t]) for b in range(B)]
    return tokens, p, q


def _same(a, b, decoders):
    for decoder in decoders:
        x, y = specjax.estimate(decoder, a), specjax.estimate(decoder, b)
        for field in ("expected_calls", "expected_calls_se", "expected_rejections"):
            assert float(getattr(x, field)) == pytest.approx(float(getattr(y, field)),
                                                             rel=1e-6, abs=1e-9), field


def test_concatenate_and_from_chunks_equal_the_recording_built_at_once():
    tokens, p, q = _dump()
    lengths = np.arange(B) % T + 1
    weights = np.linspace(1.0, 3.0, B)
    batch = specjax.BatchSpeculative(2, lookahead=2)
    whole = Recording.from_arrays(tokens, p, q, weights=weights, lengths=lengths,
                                  decoders=(batch,))
    parts = [Recording.from_arrays(tokens[s], p[s], q[s], lengths=lengths[s], decoders=(batch,))
             for s in (slice(0, 5), slice(5, B))]
    joined = Recording.concatenate(parts, weights=weights)
    assert joined.draft_probs is not None and joined.rates_of(batch) is not None
    np.testing.assert_array_equal(joined.lengths, lengths)
    _same(whole, joined, (specjax.Speculative(lookahead=2), batch))
    chunks = ({"tokens": tokens[s], "draft_probs": p[s], "target_probs": q[s],
               "weights": weights[s], "lengths": lengths[s]} for s in (slice(0, 7), slice(7, B)))
    built = Recording.from_chunks(chunks, decoders=(batch,))
    assert built.draft_probs is None  # statistics and rates only
    _same(whole, built, (specjax.Speculative(lookahead=2), batch))


def test_chunks_are_checked():
    tokens, p, q = _dump()
    weighted = Recording.from_arrays(tokens, p, q, weights=np.ones(B))
    with pytest.raises(ValueError, match="weights: some recordings are weighted"):
        Recording.concatenate([weighted, weighted])
    with pytest.raises(ValueError, match="one horizon"):
        Recording.concatenate([Recording.from_arrays(tokens, p, q),
                               Recording.from_arrays(tokens[:, :-1], p[:, :-1], q[:, :-1])])
    with pytest.raises(ValueError, match="recordings must be a non-empty list"):
        Recording.concatenate([])
    with pytest.raises(ValueError, match="chunks: no chunk"):
        Recording.from_chunks(iter(()))
    with pytest.raises(ValueError, match="chunks: chunk 0 must be a dict"):
        Recording.from_chunks([(tokens, p, q)])


PEAK = textwrap.dedent("""
    import numpy as np
    import specjax
    from specjax import _memory
    from specjax.pairs import Recording
    V, T, B, CHUNK = 32000, 32, 96, 16
    rng = np.random.default_rng(0)

    def chunks():
        for _ in range(B // CHUNK):
            logits = rng.standard_normal((CHUNK, T, V), dtype=np.float32)
            q = np.exp(logits)
            q /= q.sum(-1, keepdims=True)
            p = np.exp(0.9 * logits)
            p /= p.sum(-1, keepdims=True)
            del logits
            yield {"tokens": rng.integers(0, V, size=(CHUNK, T + 1)), "draft_probs": p,
                   "target_probs": q}

    rec = Recording.from_chunks(chunks())
    assert rec.num_sequences == B
    specjax.estimate(specjax.Speculative(lookahead=4), rec)
    # VmHWM, the child's own peak (ru_maxrss inherits the forking pytest worker's).
    print(_memory.peak_resident_bytes(), 2 * 16 * 32 * 32000 * 4)
""")


@pytest.mark.slow
def test_building_from_wide_chunks_peaks_near_one_chunk():
    # XLA's own optimisation level, as users run it: the suite's level 0 fuses nothing, and the
    # row checks' unfused temporaries took 6.3 GB at these sizes.
    env = dict(os.environ, XLA_FLAGS=without_fast_compile(os.environ.get("XLA_FLAGS", "")))
    out = subprocess.run([sys.executable, "-c", PEAK], capture_output=True, text=True,
                         timeout=300, check=True, env=env)
    peak, chunk = (int(x) for x in out.stdout.split()[-2:])
    assert peak < (1 << 30) + chunk, (peak / 2**30, chunk / 2**30)
