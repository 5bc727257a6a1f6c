"""Runs too large to keep their tokens: counts only, in chunks of chains, on any device layout.

``decoding_statistics(sampler, key, ...)`` runs any of the public samplers with the arguments it
takes, but keeps, instead of the ``(C, T + 1)`` tokens, what a study of its cost needs: the
rejections and calls of each chain, how many chains rejected, verified a draft, or started a
target call at each position, and the law of the final token. Memory is ``O(C + T + V)`` per
chunk instead of ``O(C T)``: ``10^6`` chains with ``T = 1,000`` need tens of MB, not the 6 GB of
their trace.

Exactness. Chain ``c`` draws its random numbers from the counter ``c`` alone
(``specjax._engine.chain_bits``), so a chunk of chains ``[o, o + s)`` is exactly those chains of
the one-shot run, the per-chain results concatenate and the counts (integers) add: a chunked run
equals the one-shot run, and both equal the counts taken from the sampler's full
``DecodingTrace`` with the same key. The counts are combined on the host as int64.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax import _engine
from specjax import _sharding
from specjax import samplers
from specjax._progress import Progress

#: Chains per chunk and per device when ``chunk_size`` is not given: on a CPU about 50 MB of
#: working memory; on an accelerator a chunk must be large enough to hide the fixed cost of each
#: position's kernels (see the README's "GPU/TPU readiness"), about 0.5 GB.
DEFAULT_CHUNK_SIZE = 1 << 20
DEFAULT_CHUNK_SIZE_ACCELERATOR = 1 << 24
_MAX_CHAINS = 1 << 32  # chain counters are 32-bit


class DecodingStatistics(NamedTuple):
    """Counts of a decoding run of ``C`` chains of horizon ``T`` over ``V`` tokens (no tokens).

    Attributes:
      num_rejections: the paper's ``N_rej`` of each chain (equal to ``DecodingTrace``'s).
      num_calls: target calls of each chain.
      rejections_at: how many chains drew ``x_n`` after a rejection, ``n = 1..T``.
      verified_at: how many chains verified a draft at position ``n`` (every position but the
        target's bonus token after ``K`` accepted drafts).
      calls_at: how many chains started a target call at position ``n``.
      final_token_counts: how many chains ended in each token ``x_T``.

    The per-chain fields are JAX arrays (laid out like the run's ``sharding``); the counts are
    NumPy int64, exact whatever the number of chains.
    """

    num_rejections: jax.Array  # shape=(C,), dtype=int32
    num_calls: jax.Array  # shape=(C,), dtype=int32
    rejections_at: np.ndarray  # shape=(T,), dtype=int64
    verified_at: np.ndarray  # shape=(T,), dtype=int64
    calls_at: np.ndarray  # shape=(T,), dtype=int64
    final_token_counts: np.ndarray  # shape=(V,), dtype=int64

    @property
    def num_chains(self) -> int:
        """``C``."""
        return int(self.final_token_counts.sum())

    @property
    def rejection_rate(self) -> np.ndarray:
        """Fraction of chains rejecting at position ``n``; estimates ``ExactDecoding.rejection_rate``."""
        return self.rejections_at / self.num_chains

    @property
    def acceptance_rate(self) -> np.ndarray:
        """Accepted / verified drafts at position ``n`` (1 where none was verified); estimates
        ``ExactDecoding.acceptance_rate``, the acceptance rate given a draft was verified."""
        verified = np.maximum(self.verified_at, 1)
        return 1.0 - self.rejections_at / verified

    @property
    def acceptance_rate_se(self) -> np.ndarray:
        """Binomial standard error of ``acceptance_rate`` (0 where nothing was verified)."""
        rate = self.acceptance_rate
        return np.sqrt(rate * (1 - rate) / np.maximum(self.verified_at, 1))

    @property
    def final_token_law(self) -> np.ndarray:
        """The empirical law of ``x_T``."""
        return self.final_token_counts / self.num_chains


@functools.partial(jax.jit,
                   static_argnames=("num_chains", "lookahead", "rule", "sharding"))
def _run_counts(key, draft, target, extra, offset, num_valid, *, num_chains, lookahead, rule,
                sharding):
    plan = samplers.Plan(draft, target, extra, num_chains, lookahead, rule, sharding)
    return _engine.simulate_counts(key, target.init, samplers.law_thresholds(plan), num_chains,
                                   lookahead, offset=offset, num_valid=num_valid,
                                   sharding=sharding)


def default_chunk_size(sharding=None) -> int:
    """``chunk_size`` when none is given: ``DEFAULT_CHUNK_SIZE`` chains per device on a CPU,
    ``DEFAULT_CHUNK_SIZE_ACCELERATOR`` on a GPU or TPU, times the number of shards."""
    device = next(iter(sharding.device_set)) if sharding is not None else jax.devices()[0]
    per_device = DEFAULT_CHUNK_SIZE if device.platform == "cpu" else DEFAULT_CHUNK_SIZE_ACCELERATOR
    return per_device * _sharding.num_shards(sharding)


def _resolve_chunk_size(chunk_size, num_chains: int, sharding) -> int:
    shards = _sharding.num_shards(sharding)
    if chunk_size is None:
        return min(num_chains, default_chunk_size(sharding))
    _checks.check_positive_int("chunk_size", chunk_size)
    if chunk_size % shards:
        raise ValueError(f"chunk_size ({chunk_size}) must be a multiple of the number of shards "
                         f"({shards}) of sharding")
    return min(chunk_size, num_chains)


def decoding_statistics(sampler, key, *args, chunk_size: int | None = None,
                        progress: bool = False, **kwargs) -> DecodingStatistics:
    """Runs ``sampler(key, *args, **kwargs)`` keeping counts only, in chunks of chains.

    Args:
      sampler: one of ``specjax.autoregressive_decoding``, ``speculative_decoding``,
        ``batch_speculative_decoding``, ``biased_speculative_decoding``, ``rejection_decoding``.
      key: a JAX PRNG key.
      *args, **kwargs: the sampler's own arguments (models, ``num_chains``, ``lookahead``,
        ``num_drafts``, ``epsilon``, ``sharding``, ...), validated as the sampler does.
      chunk_size: chains per chunk (default ``default_chunk_size(sharding)``: 2**20 chains per
        CPU device, 2**24 per GPU or TPU; all of them when fewer); a multiple of the number of
        shards. Every chunk has the same shape (the last one is
        padded and its padding not counted), so a run compiles once.
      progress: show a progress bar on standard error, one step per chunk.

    Returns:
      ``DecodingStatistics``, equal to the counts of ``sampler``'s ``DecodingTrace`` for the same
      key, whatever ``chunk_size`` and ``sharding``.

    Raises:
      ValueError: ``sampler`` is not a specjax sampler, its arguments are invalid (as the sampler
        would raise), ``chunk_size`` is not a positive multiple of the number of shards, or
        ``num_chains`` rounded up to a multiple of ``chunk_size`` exceeds ``2**32``.

    This is a host-side driver (a Python loop over chunks); call it outside ``jax.jit``.
    """
    try:
        plan_fn = samplers.PLANS[sampler]
    except (KeyError, TypeError):
        raise ValueError(
            "sampler must be one of specjax's samplers (e.g. specjax.speculative_decoding), got "
            f"{sampler!r}") from None
    plan = plan_fn(key, *args, **kwargs)
    if not samplers.is_markov(plan):
        raise ValueError("decoding_statistics runs MarkovChain models only; for other "
                         "autoregressive models call the sampler itself")
    num_chains = plan.num_chains
    chunk = _resolve_chunk_size(chunk_size, num_chains, plan.sharding)
    num_chunks = -(-num_chains // chunk)
    if num_chunks * chunk > _MAX_CHAINS:
        raise ValueError(f"num_chains ({num_chains}) is too large: chains are numbered with 32 "
                         f"bits, so num_chains rounded up to a multiple of chunk_size ({chunk}) "
                         f"must be at most 2**32")
    plan = samplers.replicate(plan)
    bar = Progress(num_chunks, enabled=progress)
    per_position = np.zeros((plan.target.horizon, 3), np.int64)
    final = np.zeros((plan.target.num_states,), np.int64)
    rejections, calls = [], []
    for i in range(num_chunks):
        start = i * chunk
        valid = min(chunk, num_chains - start)
        out = _run_counts(key, plan.draft, plan.target, plan.extra, np.uint32(start),
                          np.int32(valid), num_chains=chunk, lookahead=plan.lookahead,
                          rule=plan.rule, sharding=plan.sharding)
        per_position += np.asarray(out.per_position, np.int64)
        final += np.asarray(out.final_tokens, np.int64)
        rejections.append(out.num_rejections[:valid] if valid < chunk else out.num_rejections)
        calls.append(out.num_calls[:valid] if valid < chunk else out.num_calls)
        bar.step(f"chains {start + valid:,}/{num_chains:,}")
    join = (lambda parts: parts[0]) if num_chunks == 1 else jnp.concatenate
    return DecodingStatistics(
        num_rejections=join(rejections),
        num_calls=join(calls),
        rejections_at=per_position[:, 0],
        verified_at=per_position[:, 1],
        calls_at=per_position[:, 2],
        final_token_counts=final,
    )
