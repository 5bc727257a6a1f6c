"""Runs too large to keep their tokens: counts only, in chunks of chains, on any device layout.

``decoding_statistics(key, decoder, draft, target, num_chains)`` runs any decoder as
``specjax.decode`` does, but keeps, instead of the ``(C, T + 1)`` tokens, what a study of its cost needs: the
rejections and calls of each chain, how many chains rejected, verified a draft, or started a
target call at each position, and the law of the final token. Memory is ``O(C + T + V)`` per
chunk instead of ``O(C T)``: ``10^6`` chains with ``T = 1,000`` need tens of MB, not the 6 GB of
their trace.

Exactness. Chain ``c`` draws its random numbers from the counter ``c`` alone
(``specjax.sampling.engine.chain_bits``), so a chunk of chains ``[o, o + s)`` is exactly those chains of
the one-shot run, the per-chain results concatenate and the counts (integers) add: a chunked run
equals the one-shot run, and both equal the counts taken from the sampler's full
``DecodingTrace`` with the same key. The counts are combined on the host as int64.
"""

from __future__ import annotations

import functools
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax.sampling import sharding as _sharding
from specjax.decoders.base import CallDecoder
from specjax.decoders.planning import MAX_COUNTER
from specjax.models.base import ModelKind
from specjax.sampling import blocks
from specjax.sampling import decoding
from specjax.sampling import engine
from specjax.sampling import tables as _tables
from specjax._progress import Progress

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_CHUNK_SIZE_ACCELERATOR",
    "DecodingStatistics",
    "KEPT_BYTES_PER_CHAIN",
    "TRACE_CHUNK_ELEMENTS",
    "decoding_statistics",
    "default_chunk_size",
]

#: Chains per chunk and per device when ``chunk_size`` is not given: on a CPU about 50 MB of
#: working memory; on an accelerator a chunk must be large enough to hide the fixed cost of each
#: position's kernels (see the README's "GPU/TPU readiness"), about 0.5 GB.
DEFAULT_CHUNK_SIZE = 1 << 20
DEFAULT_CHUNK_SIZE_ACCELERATOR = 1 << 24
TRACE_CHUNK_ELEMENTS = 1 << 24  # tokens per device in a chunk of the engines that keep them


def _renamed_field(old: str, new: str) -> property:
    """A read-only property ``old`` that warns and reads the field ``new``: the deprecated name
    of a ``DecodingStatistics`` field."""

    def read(self):
        warnings.warn(f"DecodingStatistics.{old} is deprecated: read .{new} (the name the "
                      f"trace and the exact values use)", DeprecationWarning, stacklevel=2)
        return getattr(self, new)

    return property(read, doc=f"Deprecated name of ``{new}``.")


class DecodingStatistics(NamedTuple):
    """Counts of a decoding run of ``C`` chains of horizon ``T`` over ``V`` tokens (no tokens).

    The per-position fields have the names of the same quantities in ``DecodingTrace`` and
    ``ExactDecoding``, summed over the chains: ``rejected`` here is
    ``DecodingTrace.rejected.sum(0)`` (a count per position, where the trace has one bool per
    chain and position), and its expectation is ``C * ExactDecoding.rejected.sum(-1)`` (the
    exact field also splits it by token); likewise ``new_call``, ``verified`` and ``emitted``.

    Attributes:
      num_rejections: the paper's ``N_rej`` of each chain (equal to ``DecodingTrace``'s).
      num_calls: target calls of each chain.
      rejected: how many chains drew ``x_n`` after a rejection, ``n = 1..T``.
      verified: how many chains verified a draft at position ``n`` (every position but the
        target's bonus token after ``K`` accepted drafts).
      new_call: how many chains started a target call at position ``n``.
      final_token_counts: how many chains ended in each token ``x_T``.
      emitted: how many chains emitted ``x_n`` (all of them, or with stop tokens those that
        had not stopped before ``n``); its sum over the chains' number is the mean length.
        ``None`` in counts built by hand before it existed.

    The per-chain fields are JAX arrays (laid out like the run's ``sharding``); the counts are
    NumPy int64, exact whatever the number of chains. The names before the fields were shared
    with the other results (``rejections_at``, ``verified_at``, ``calls_at``, ``emitted_at``)
    still read the same arrays, with a ``DeprecationWarning``.
    """

    num_rejections: jax.Array  # shape=(C,), dtype=int32
    num_calls: jax.Array  # shape=(C,), dtype=int32
    rejected: np.ndarray  # shape=(T,), dtype=int64
    verified: np.ndarray  # shape=(T,), dtype=int64
    new_call: np.ndarray  # shape=(T,), dtype=int64
    final_token_counts: np.ndarray  # shape=(V,), dtype=int64
    emitted: np.ndarray | None = None  # shape=(T,), dtype=int64

    rejections_at = _renamed_field("rejections_at", "rejected")
    verified_at = _renamed_field("verified_at", "verified")
    calls_at = _renamed_field("calls_at", "new_call")
    emitted_at = _renamed_field("emitted_at", "emitted")

    @property
    def num_chains(self) -> int:
        """``C``."""
        return int(self.final_token_counts.sum())

    @property
    def rejection_rate(self) -> np.ndarray:
        """Fraction of chains rejecting at position ``n``; estimates ``ExactDecoding.rejection_rate``."""
        return self.rejected / self.num_chains

    @property
    def acceptance_rate(self) -> np.ndarray:
        """Accepted / verified drafts at position ``n`` (1 where none was verified); estimates
        ``ExactDecoding.acceptance_rate``, the acceptance rate given a draft was verified."""
        verified = np.maximum(self.verified, 1)
        return 1.0 - self.rejected / verified

    @property
    def acceptance_rate_se(self) -> np.ndarray:
        """Binomial standard error of ``acceptance_rate`` (0 where nothing was verified)."""
        rate = self.acceptance_rate
        return np.sqrt(rate * (1 - rate) / np.maximum(self.verified, 1))

    @property
    def final_token_law(self) -> np.ndarray:
        """The empirical law of ``x_T``."""
        return self.final_token_counts / self.num_chains


@functools.partial(jax.jit, static_argnames=("num_chains", "lookahead", "sharding", "tables"))
def _markov_counts(key, decoder, draft, target, offset, num_valid, *, num_chains, lookahead,
                   sharding, tables=None):
    if tables is None:
        tables = _tables.table_plan(decoder, target.num_states, target.horizon, lookahead)
    return engine.simulate_markov_counts(key, decoder, draft.trans, target.trans, target.init,
                                         num_chains, lookahead, tables, offset=offset,
                                         num_valid=num_valid, sharding=sharding)


@functools.partial(jax.jit, static_argnames=("num_states",))
def _trace_counts(trace, verified, num_valid, *, num_states):
    """The counts of a chunk's trace (engines that keep their tokens), padding not counted."""
    valid = jnp.arange(trace.tokens.shape[0]) < num_valid
    emitted = jnp.arange(1, trace.tokens.shape[1])[None, :] <= trace.num_emitted[:, None]
    rows = [jnp.sum(flag & valid[:, None], axis=0, dtype=jnp.int32)
            for flag in (trace.rejected, verified, trace.new_call, emitted)]
    final = jnp.bincount(trace.tokens[:, -1], weights=valid.astype(jnp.int32),
                         length=num_states)
    return engine.ChunkCounts(num_rejections=trace.num_rejections, num_calls=trace.num_calls,
                              per_position=jnp.stack(rows, axis=-1),
                              final_tokens=final.astype(jnp.int32))


def _keeps_tokens(run) -> bool:
    """Whether a run's counts are taken from each chunk's trace: call-level decoders, protocol
    models and stop tokens; token-wise decoders on Markov chains count inside the scan."""
    return isinstance(run.decoder, CallDecoder) or run.models != ModelKind.MARKOV \
        or bool(run.stop_tokens)


def _chunk_counts(key, run, offset: int, chunk: int, valid: int):
    if not _keeps_tokens(run):
        out = _markov_counts(key, run.decoder, run.draft, run.target, np.uint32(offset),
                             np.int32(valid), num_chains=chunk, lookahead=run.lookahead,
                             sharding=run.sharding, tables=decoding.table_plan(run))
        every = jnp.full((run.horizon, 1), valid, jnp.int32)  # no stop: every x_n is emitted
        return out._replace(per_position=jnp.concatenate([out.per_position, every], axis=1))
    trace, verified = decoding.run_chunk(key, run, np.uint32(offset), chunk)
    return _trace_counts(trace, verified, np.int32(valid), num_states=run.target.num_states)


def default_chunk_size(sharding=None, horizon: int | None = None) -> int:
    """``chunk_size`` when none is given: ``DEFAULT_CHUNK_SIZE`` chains per device on a CPU,
    ``DEFAULT_CHUNK_SIZE_ACCELERATOR`` on a GPU or TPU, times the number of shards. With a
    ``horizon`` (engines that keep each chunk's tokens: call-level decoders and protocol
    models), at most ``TRACE_CHUNK_ELEMENTS / T`` chains per device."""
    device = next(iter(sharding.device_set)) if sharding is not None else jax.devices()[0]
    per_device = DEFAULT_CHUNK_SIZE if device.platform == "cpu" else DEFAULT_CHUNK_SIZE_ACCELERATOR
    if horizon is not None:
        per_device = min(per_device, max(1, TRACE_CHUNK_ELEMENTS // (horizon + 1)))
    return per_device * _sharding.num_shards(sharding)


def _resolve_chunk_size(chunk_size, num_chains: int, sharding, horizon=None) -> int:
    shards = _sharding.num_shards(sharding)
    if chunk_size is None:
        return min(num_chains, default_chunk_size(sharding, horizon))
    _checks.check_positive_int("chunk_size", chunk_size)
    if chunk_size % shards:
        raise ValueError(f"chunk_size ({chunk_size}) must be a multiple of the number of shards "
                         f"({shards}) of sharding")
    return min(chunk_size, num_chains)


#: Bytes each chain keeps until the end of a run: its rejections and calls (int32 each), and
#: their concatenation over the chunks.
KEPT_BYTES_PER_CHAIN = 16


def _check_fits(run, num_chains: int, chunk: int, num_chunks: int, keeps_tokens: bool) -> None:
    """Refuses a run whose chunk (its chains and law tables) and per-chain results cannot fit,
    naming ``num_chains`` when the results of every chain are the larger part, ``chunk_size``
    when one chunk's chains are, and ``num_states`` when the law tables are."""
    size = decoding.run_bytes(run, chunk, keep_tokens=keeps_tokens)
    kept = num_chains * (KEPT_BYTES_PER_CHAIN if num_chunks > 1 else 8)
    if kept >= size.chains:
        argument, remedy = f"num_chains = {num_chains:,}", "use fewer chains"
        what = "the rejections and calls of every chain, kept to the end, and one chunk"
    else:
        argument, remedy = f"chunk_size = {chunk:,}", "use a smaller chunk_size"
        what = "the chains of one chunk" + (f", their (C, T + 1) tokens with T = "
                                            f"{run.horizon:,}" if keeps_tokens else "")
    decoding.check_fits(run, size._replace(chains=size.chains + kept),
                        chains_argument=argument, chains_what=what, chains_remedy=remedy)


def decoding_statistics(key, decoder, draft=None, target=None, num_chains=None, *,
                        chunk_size: int | None = None, progress: bool = False,
                        sharding=None, horizon: int | None = None, stop_tokens=None,
                        batched_scoring: bool = False, **legacy) -> DecodingStatistics:
    """Runs ``decoder`` like ``specjax.decode`` but keeps counts only, in chunks of chains.

    Args:
      key: a JAX PRNG key.
      decoder: any decoder value (``specjax.Speculative()``, ...).
      draft: the draft model ``p``, as for ``specjax.decode``.
      target: the target model ``q``.
      num_chains: ``C``.
      horizon: ``T`` for models other than ``MarkovChain``.
      sharding: the chain layout, as for ``specjax.decode``.
      chunk_size: chains per chunk (default ``default_chunk_size``: 2**20 chains per CPU device,
        2**24 per GPU or TPU, at most ``2**24 / (T + 1)`` per device for the engines that keep
        a chunk's tokens; all of them when fewer); a multiple of the number of shards. Every
        chunk has the same shape (the last one is padded and its padding not counted), so a run
        compiles once.
      progress: show a progress bar (tqdm) on standard error, one step per chunk.
      stop_tokens: end-of-sequence ids, as for ``specjax.decode`` (the counts of a run with
        them are taken from each chunk's tokens).
      batched_scoring: score each call's drafts in one target evaluation, as for
        ``specjax.decode``.

    Returns:
      ``DecodingStatistics``, equal to the counts of ``specjax.decode``'s ``DecodingTrace`` for
      the same arguments, whatever ``chunk_size`` and ``sharding``.

    Raises:
      ValueError: bad arguments (as ``decode`` raises), ``chunk_size`` not a positive multiple
        of the number of shards, ``num_chains`` rounded up to a multiple of ``chunk_size``
        above ``2**32`` (divided by the uniforms per call of a call-level decoder), or a run
        whose estimated memory (one chunk with its law tables, and the per-chain rejections
        and calls of every chain, 16 bytes per chain) exceeds what is available; all before
        any work.

    The old form ``decoding_statistics(sampler, key, *args, **kwargs)`` (a sampler function
    first) still works and warns that it is deprecated.

    This is a host-side driver (a Python loop over chunks); call it outside ``jax.jit``,
    ``vmap`` and ``grad``. Under a transformation its key or models are traced and it raises
    ``ValueError`` saying so (use ``specjax.decode`` there). The deprecated sampler-first form
    cannot say it: a function is not a JAX type, and ``jax.jit`` refuses it first with JAX's
    "Error interpreting argument".
    """
    if callable(key) and not isinstance(key, jax.Array):
        return _legacy(key, decoder, draft, target, num_chains, chunk_size=chunk_size,
                       progress=progress, sharding=sharding, horizon=horizon,
                       stop_tokens=stop_tokens, batched_scoring=batched_scoring, **legacy)
    if legacy:
        raise TypeError(f"decoding_statistics() got unexpected keyword arguments "
                        f"{sorted(legacy)}")
    if num_chains is None:
        raise ValueError("num_chains must be given (a positive integer)")
    _checks.refuse_traced("decoding_statistics", "a Python loop over chunks of chains",
                          "Inside a transformation use specjax.decode", key=key, draft=draft,
                          target=target, num_chains=num_chains, chunk_size=chunk_size)
    if not (isinstance(progress, (bool, np.bool_)) or (
            isinstance(progress, (int, np.integer)) and progress in (0, 1))):
        raise ValueError(f"progress must be True or False, got {progress!r}")
    run = decoding.plan(key, decoder, draft, target, num_chains, horizon=horizon,
                        sharding=sharding, stop_tokens=stop_tokens,
                        batched_scoring=batched_scoring)
    keeps_tokens = _keeps_tokens(run)
    words = run.horizon if keeps_tokens else None  # per-chain words of a chunk, beyond T + 1
    if run.batched_scoring:  # a call's rows (specjax.sampling.blocks), as run_bytes counts them
        words += blocks.call_words(run.lookahead, run.target.num_states)
    chunk = _resolve_chunk_size(chunk_size, num_chains, run.sharding, words)
    num_chunks = -(-num_chains // chunk)
    per_chain = decoding.counters_per_chain(run.decoder, run.lookahead, run.batched_scoring)
    if num_chunks * chunk * per_chain > MAX_COUNTER:
        raise ValueError(f"num_chains ({num_chains}) is too large: chains are numbered with 32 "
                         f"bits, so num_chains rounded up to a multiple of chunk_size ({chunk}) "
                         f"must be at most 2**32" + ("" if per_chain == 1 else
                                                     f" / {per_chain}"))
    _check_fits(run, num_chains, chunk, num_chunks, keeps_tokens)
    run = decoding.replicate(run)
    bar = Progress(num_chunks, enabled=progress)
    per_position = np.zeros((run.horizon, 4), np.int64)
    final = np.zeros((run.target.num_states,), np.int64)
    rejections, calls = [], []
    for i in range(num_chunks):
        start = i * chunk
        valid = min(chunk, num_chains - start)
        out = _chunk_counts(key, run, start, chunk, valid)
        per_position += np.asarray(out.per_position, np.int64)
        final += np.asarray(out.final_tokens, np.int64)
        rejections.append(out.num_rejections[:valid] if valid < chunk else out.num_rejections)
        calls.append(out.num_calls[:valid] if valid < chunk else out.num_calls)
        bar.step(f"chains {start + valid:,}/{num_chains:,}")
    join = (lambda parts: parts[0]) if num_chunks == 1 else jnp.concatenate
    return DecodingStatistics(
        num_rejections=join(rejections),
        num_calls=join(calls),
        rejected=per_position[:, 0],
        verified=per_position[:, 1],
        new_call=per_position[:, 2],
        final_token_counts=final,
        emitted=per_position[:, 3],
    )


def _legacy(sampler, key, *args, chunk_size=None, progress=False, sharding=None, horizon=None,
            stop_tokens=None, batched_scoring=False, **kwargs) -> DecodingStatistics:
    """``decoding_statistics(sampler, key, *args, **kwargs)``: the form before decoders were
    values. Maps the sampler and its arguments to a decoder and warns."""
    to_decoder = getattr(sampler, "decoder_from", None)
    if to_decoder is None:
        raise ValueError(
            "decoding_statistics takes (key, decoder, draft, target, num_chains); the deprecated "
            "form takes one of specjax's samplers first (e.g. specjax.speculative_decoding), "
            f"got {sampler!r}")
    warnings.warn("decoding_statistics(sampler, key, ...) is deprecated: use "
                  "decoding_statistics(key, decoder, draft, target, num_chains, ...)",
                  DeprecationWarning, stacklevel=3)
    args = [a for a in args if a is not None]
    if sharding is not None:
        kwargs["sharding"] = sharding
    if horizon is not None:
        kwargs["horizon"] = horizon
    decoder, draft, target, num_chains, rest = to_decoder(*args, **kwargs)
    return decoding_statistics(key, decoder, draft, target, num_chains, chunk_size=chunk_size,
                               progress=progress, stop_tokens=stop_tokens,
                               batched_scoring=batched_scoring, **rest)
