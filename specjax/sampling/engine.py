"""The simulation engine shared by every sampler: one ``lax.scan`` over positions, vmapped chains.

Why a scan over positions suffices. For Markov drafts, drafting a whole lookahead first and then
verifying it in order has the same law as drafting each token only when it is verified: a draft
token that is never verified never influences the output. So a sampler is a Markov chain over a
small per-chain state, ``(previous token, phase)``, where the phase ``j`` counts the drafts accepted
since the last target call:

* ``j == 0``: the position opens a new target call (the *root* of a draft block or tree);
* ``0 < j < K``: inside an accepted block, the next draft is verified;
* ``j == K``: ``K`` drafts were accepted, the target's bonus token is emitted.

At each position the outcome (token, rejected) is drawn from the decoder's law (see
``specjax.decoders.verification``) for the chain's ``(n, previous token, row kind)``, with a
single uniform per chain-step via an inverse-CDF binary search on integer thresholds. A literal
implementation that drafts whole sequences is kept in the tests and checked to agree in law.

Law tables and memory: the thresholds the chains draw from are built as
``specjax.sampling.tables`` plans (``table_plan``), before the scan or inside it, one position
at a time; the tokens are the same either way. This module serves the tables' names too.

Random numbers: chain ``c`` at position ``n`` uses the Threefry-2x32 hash of the counter ``c``
under the key ``fold_in(key_steps, n)`` (``chain_bits``), which is element ``c`` of JAX's
partitionable ``jax.random.bits(fold_in(key_steps, n), (C,))`` for any ``C > c``. Each chain's
numbers depend on its index alone, so the first chains of a larger run equal a smaller run with
the same key, a block of chains ``[o, o + s)`` can be run on its own (chunks), and laying chains
out over devices (``specjax.sampling.sharding``) cannot change a token.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.extend.random import threefry2x32_p

from specjax.sampling import sharding as _sharding

from specjax.decoders.draws import categorical_thresholds
from specjax.decoders.draws import int31
from specjax.decoders.draws import search
# The law tables (and their constants) live in specjax.sampling.tables; served from here too.
from specjax.sampling.tables import ALL_KINDS
from specjax.sampling.tables import BLOCK_ELEMENTS  # noqa: F401
from specjax.sampling.tables import BONUS
from specjax.sampling.tables import GROUP_BELOW  # noqa: F401
from specjax.sampling.tables import GROUP_ROWS  # noqa: F401
from specjax.sampling.tables import Laws
from specjax.sampling.tables import PRECOMPUTED_TABLE_BYTES  # noqa: F401
from specjax.sampling.tables import ROOT
from specjax.sampling.tables import TablePlan
from specjax.sampling.tables import VERIFY
from specjax.sampling.tables import block_thresholds  # noqa: F401
from specjax.sampling.tables import decoder_table  # noqa: F401
from specjax.sampling.tables import kind_thresholds  # noqa: F401
from specjax.sampling.tables import law_table  # noqa: F401
from specjax.sampling.tables import markov_laws
from specjax.sampling.tables import row_kinds  # noqa: F401
from specjax.sampling.tables import table_bytes  # noqa: F401
from specjax.sampling.tables import table_laws
from specjax.sampling.tables import table_plan  # noqa: F401
from specjax.sampling.tables import table_width  # noqa: F401

__all__ = [
    "ChunkCounts",
    "DecodingTrace",
    "advance",
    "chain_bits",
    "counts_bytes",
    "first_tokens",
    "kind_slot",
    "outcome",
    "phase_row",
    "simulate",
    "simulate_counts",
    "simulate_markov",
    "simulate_markov_counts",
    "small_int_dtype",
    "stop_trace",
    "trace_bytes",
]


class DecodingTrace(NamedTuple):
    """What a decoding run produced, for ``C`` chains of horizon ``T``.

    Attributes:
      tokens: ``x_0..x_T`` for each chain.
      rejected: whether ``x_n`` (``n = 1..T``) was drawn after a rejection.
      num_rejections: the paper's ``N_rej``, ``rejected.sum(-1)``.
      num_calls: target (oracle) calls, ``new_call.sum(-1)``.
      new_call: whether a target call starts at position ``n`` (the first position of a block).
      num_emitted: how many of ``x_1..x_T`` were emitted: ``T``, or with stop tokens the position
        of the first one (the chain stopped there; see ``stop_trace``).

    ``rejected`` and ``new_call`` are named as in ``ExactDecoding`` (their probabilities, the
    former also split by token) and ``DecodingStatistics`` (their counts over the chains,
    ``rejected.sum(0)`` and ``new_call.sum(0)``).
    """

    tokens: jax.Array  # shape=(C, T + 1), dtype=int32
    rejected: jax.Array  # shape=(C, T), dtype=bool
    num_rejections: jax.Array  # shape=(C,), dtype=int32
    num_calls: jax.Array  # shape=(C,), dtype=int32
    new_call: jax.Array  # shape=(C, T), dtype=bool
    num_emitted: jax.Array | None = None  # shape=(C,), dtype=int32; None: a trace built by hand


def stop_trace(trace: DecodingTrace, verified, stop):
    """Ends each chain of ``trace`` at its first stop token among ``x_1..x_T``.

    Why a run can be stopped after the fact. What a decoder does up to the stop token does not
    depend on what it would do after it, and chain ``c``'s random numbers at a position do not
    depend on the earlier ones; so the run truncated at the stop is distributed as a run that
    stops there, and equals it token for token with the same key. The tokens after the stop
    repeat it (the padding), and the positions after it are not rejected, verified or called: a
    call that emitted the stop token counts, the calls after it do not.

    Args:
      trace: a ``DecodingTrace`` whose ``num_emitted`` is ``T``.
      verified: ``(C, T)`` bool (a draft was verified at the position), or ``None``.
      stop: ``(V,)`` bool mask of the stop tokens (``specjax._checks.stop_mask``), or ``None`` (no change).

    Returns:
      ``(trace, verified)`` of the stopped run.
    """
    if stop is None:
        return trace, verified
    tokens = trace.tokens
    horizon = tokens.shape[1] - 1
    is_stop = stop[tokens[:, 1:]]
    stopped = jnp.any(is_stop, axis=1)
    length = jnp.where(stopped, jnp.argmax(is_stop, axis=1) + 1, horizon).astype(jnp.int32)
    position = jnp.arange(1, horizon + 1, dtype=jnp.int32)
    live = position[None, :] <= length[:, None]  # (C, T): x_n was emitted
    last = jnp.take_along_axis(tokens, length[:, None], axis=1)
    tokens = jnp.concatenate([tokens[:, :1], jnp.where(live, tokens[:, 1:], last)], axis=1)
    rejected, new_call = trace.rejected & live, trace.new_call & live
    trace = DecodingTrace(tokens=tokens, rejected=rejected,
                          num_rejections=jnp.sum(rejected, axis=1, dtype=jnp.int32),
                          num_calls=jnp.sum(new_call, axis=1, dtype=jnp.int32),
                          new_call=new_call, num_emitted=length)
    return trace, None if verified is None else verified & live


def _key_words(key) -> tuple[jax.Array, jax.Array]:
    """The two uint32 words of a Threefry key; other PRNG implementations are mapped to two
    words drawn from the key, so any key works (and gives the same run every time)."""
    if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.wrap_key_data(key)
    if str(jax.random.key_impl(key)) == "threefry2x32":
        words = jax.random.key_data(key)
    else:
        words = jax.random.bits(key, (2,), jnp.uint32)
    return words[0], words[1]


def chain_bits(key, offset, num_chains: int, sharding=None) -> jax.Array:
    """32 random bits for each of the chains ``offset, ..., offset + num_chains - 1``.

    Chain ``c`` gets the Threefry-2x32 hash of the 64-bit counter ``c`` (high word 0), which is
    element ``c`` of JAX's partitionable ``jax.random.bits(key, (N,))`` for every ``N > c``.

    Args:
      key: PRNG key.
      offset: index of the first chain (may be traced; ``offset + num_chains <= 2**32``).
      num_chains: how many (static).
      sharding: chain layout (``specjax.sampling.sharding``), or ``None``.

    Returns:
      ``(num_chains,)`` uint32.
    """
    k1, k2 = _key_words(key)
    counter = jnp.asarray(offset, jnp.uint32) + jax.lax.iota(jnp.uint32, num_chains)
    counter = _sharding.constrain(counter, sharding)
    hi, lo = threefry2x32_p.bind(k1, k2, jnp.zeros_like(counter), counter)
    return hi ^ lo


def phase_row(j: jax.Array, lookahead: int) -> jax.Array:
    """The row kind of phase ``j``: ``ROOT`` opens a call, ``VERIFY`` inside it, ``BONUS`` after
    ``K`` accepted drafts (``K = 0``: every position is the target's own draw)."""
    return jnp.where(j == lookahead, BONUS, jnp.where(j == 0, ROOT, VERIFY))


def kind_slot(j: jax.Array, lookahead: int, kinds: tuple = ALL_KINDS) -> jax.Array:
    """The index, among a table's row kinds ``kinds``, of the row that phase ``j`` draws from
    (``phase_row`` for all three kinds; a missing ``VERIFY`` is the root's row, see
    ``row_kinds``)."""
    if len(kinds) == 1:
        return jnp.zeros_like(j)
    verify = kinds.index(VERIFY) if VERIFY in kinds else kinds.index(ROOT)
    bonus = kinds.index(BONUS) if BONUS in kinds else verify
    return jnp.where(j == lookahead, bonus, jnp.where(j == 0, kinds.index(ROOT), verify))


def advance(j: jax.Array, rejected: jax.Array, lookahead: int):
    """The call-phase state machine: ``(next phase, a call starts here, a draft is verified
    here)`` after an outcome in phase ``j``. A rejection or a bonus token ends the call."""
    next_j = jnp.where(rejected | (j == lookahead), 0, j + 1)
    return next_j, j == 0, j != lookahead


def outcome(thresholds_at, u, width: int, num_states: int):
    """Draws one outcome of a ``2V`` (accepted | rejected) row: ``(token, rejected)``."""
    index = search(thresholds_at, u, width)
    rejected = index >= num_states
    return jnp.where(rejected, index - num_states, index), rejected


def first_tokens(key_init, init_law: jax.Array, offset, num_chains: int, sharding=None):
    """``x_0`` of chains ``offset .. offset + C - 1``, drawn from ``init_law`` ``(V,)``."""
    init_thr = categorical_thresholds(init_law)
    u0 = int31(chain_bits(key_init, offset, num_chains, sharding))
    return jax.vmap(lambda u: search(lambda i: init_thr[i], u, init_thr.shape[-1]))(u0)


def _chain_step(flat_thresholds, lookahead, num_states, kinds, width, carry, u):
    """One position of one chain.

    Args:
      flat_thresholds: the position's ``(V, R, W')`` thresholds, flattened.
      lookahead: ``K`` (static).
      num_states: ``V`` (static).
      kinds: the table's row kinds (static, ``R = len(kinds)``); width: ``W'`` (static).
      carry: ``(previous token, phase j, rejections so far, calls so far)``.
      u: a 31-bit uniform integer.

    Returns:
      The new carry and ``(token, rejected, new_call, verified)`` for this position
      (``verified``: a draft was verified here, i.e. the position is not a bonus token).
    """
    x, j, num_rejections, num_calls = carry
    base = (x * len(kinds) + kind_slot(j, lookahead, kinds)) * width
    token, rejected = outcome(lambda i: flat_thresholds[base + i], u, width, num_states)
    next_j, new_call, verified = advance(j, rejected, lookahead)
    carry = (token, next_j, num_rejections + rejected, num_calls + new_call)
    return carry, (token, rejected, new_call, verified)


def small_int_dtype(num_states: int):
    """The narrowest integer type for token ids: the per-step outputs are transposed at the end,
    and moving int8 instead of int32 there is a large share of a run's time when ``V`` is small."""
    if num_states <= jnp.iinfo(jnp.int8).max:
        return jnp.int8
    if num_states <= jnp.iinfo(jnp.int16).max:
        return jnp.int16
    return jnp.int32


def _run_chains(key, init, laws: Laws, num_chains: int, lookahead: int, offset, sharding,
                emit):
    """Scans chains ``offset .. offset + num_chains - 1`` over the positions.

    ``emit(outputs)`` maps one position's ``(token, rejected, new_call, verified)``, each of shape
    ``(C,)``, to what the scan keeps of that position. Returns ``(x0, final carry, kept)``.
    """
    num_states = init.shape[-1]
    key_init, key_steps = jax.random.split(key)

    x0 = first_tokens(key_init, init, offset, num_chains, sharding)

    def scan_step(carry, inputs):
        chains, state = carry
        xs_n, n = inputs
        thresholds_n, state = laws.at(xs_n, n, state)
        u = int31(chain_bits(jax.random.fold_in(key_steps, n), offset, num_chains, sharding))
        step = functools.partial(_chain_step, thresholds_n.reshape(-1), lookahead, num_states,
                                 laws.kinds, laws.width)
        chains, outputs = jax.vmap(step)(chains, u)
        return (chains, state), emit(outputs)

    zeros = _sharding.constrain(jnp.zeros((num_chains,), jnp.int32), sharding)
    carry0 = ((x0, zeros, zeros, zeros), laws.state)
    (carry, _), kept = jax.lax.scan(scan_step, carry0, (laws.xs, jnp.arange(laws.horizon)))
    return x0, carry, kept


def _as_laws(thresholds) -> Laws:
    return thresholds if isinstance(thresholds, Laws) else table_laws(thresholds)


def simulate(key, init: jax.Array, thresholds, num_chains: int, lookahead: int, *,
             offset=0, sharding=None, with_verified: bool = False):
    """Runs ``num_chains`` chains through the per-position law table.

    Args:
      key: PRNG key.
      init: ``(V,)`` law of ``x_0``.
      thresholds: ``(T, V, 3, W')`` from ``law_table`` or ``decoder_table``, or the laws of
        ``markov_laws`` (a table built per position inside the scan).
      num_chains: ``C`` (static).
      lookahead: ``K`` (static); ``0`` gives autoregressive decoding (every step a bonus token),
        ``K >= T`` never reaches a bonus (the paper's ``K = T``).
      offset: index of the first chain (traced): the chains are ``offset .. offset + C - 1`` of
        a larger run with the same key.
      sharding: a ``NamedSharding`` of the chain axis (``specjax.sampling.sharding.resolve``), or ``None``.
      with_verified: also return ``verified (C, T)`` (static; the counts of a stopped run need
        it).

    Returns:
      A ``DecodingTrace``, or ``(trace, verified)`` with ``with_verified``.
    """
    token_dtype = small_int_dtype(init.shape[-1])

    def emit(outputs):
        token, rejected, new_call, verified = outputs
        return token.astype(token_dtype), rejected, new_call, verified if with_verified else None

    x0, carry, (tokens, rejected, new_call, verified) = _run_chains(
        key, init, _as_laws(thresholds), num_chains, lookahead, offset, sharding, emit)
    _, _, num_rejections, num_calls = carry
    tokens = jnp.concatenate([x0[:, None], tokens.T.astype(jnp.int32)], axis=1)
    trace = DecodingTrace(
        tokens=_sharding.constrain(tokens, sharding),
        rejected=_sharding.constrain(rejected.T, sharding),
        num_rejections=num_rejections,
        num_calls=num_calls,
        new_call=_sharding.constrain(new_call.T, sharding),
        # Split by chain as the other fields are (a constant would be replicated).
        num_emitted=_sharding.constrain(jnp.full_like(num_calls, tokens.shape[1] - 1), sharding),
    )
    return (trace, _sharding.constrain(verified.T, sharding)) if with_verified else trace


def simulate_markov(key, decoder, draft_trans: jax.Array, target_trans: jax.Array,
                    init: jax.Array, num_chains: int, lookahead: int, plan: TablePlan, *,
                    offset=0, sharding=None, with_verified: bool = False):
    """``simulate`` for a token-wise decoder on Markov transitions ``(T, V, V)``, its tables
    built as ``plan`` (``table_plan``) says; the tokens do not depend on the plan."""
    return simulate(key, init, markov_laws(decoder, draft_trans, target_trans, plan),
                    num_chains, lookahead, offset=offset, sharding=sharding,
                    with_verified=with_verified)


def trace_bytes(num_chains: int, horizon: int, num_states: int) -> int:
    """Peak bytes of ``simulate``'s per-chain arrays (without the tables): the scan's stacked
    per-position outputs, the transposed ``(C, T + 1)`` int32 tokens and ``(C, T)`` flags, and
    the chains' state. Calibrated with XLA's ``memory_analysis``."""
    token_bytes = jnp.dtype(small_int_dtype(num_states)).itemsize
    stacked = num_chains * horizon * (token_bytes + 2)
    out = num_chains * ((horizon + 1) * 4 + 2 * horizon + 8)
    return stacked + out + num_chains * horizon * 4 + 64 * num_chains


def counts_bytes(num_chains: int, horizon: int, num_states: int) -> int:
    """Peak bytes of ``simulate_counts``' per-chain arrays (without the tables)."""
    return 64 * num_chains + 16 * horizon + 8 * num_states


class ChunkCounts(NamedTuple):
    """What the statistics-only path keeps of one block of chains (no tokens).

    ``num_rejections`` and ``num_calls`` are per chain; the counts are over the chains of the
    block that are ``valid`` (index below the run's total).
    """

    num_rejections: jax.Array  # shape=(C,), dtype=int32
    num_calls: jax.Array  # shape=(C,), dtype=int32
    per_position: jax.Array  # shape=(T, 3), dtype=int32: rejected, verified, call starts
    # (decoding_statistics appends a fourth column, the chains that emitted x_n)
    final_tokens: jax.Array  # shape=(V,), dtype=int32


def simulate_counts(key, init: jax.Array, thresholds, num_chains: int, lookahead: int,
                    *, offset=0, num_valid=None, sharding=None) -> ChunkCounts:
    """Like ``simulate``, but keeps only counts: ``O(C + T + V)`` memory instead of ``O(C T)``.

    The per-position sums are taken per shard at each position and across shards once at the end,
    so a sharded run communicates a ``(T, 3)`` array once, not at every position.

    Args:
      key, init, thresholds, num_chains, lookahead, offset, sharding: as for ``simulate``.
      num_valid: chains ``offset + i`` with ``i >= num_valid`` (traced) are run but not counted
        (the padding of a last, partial chunk); ``None`` counts all.
    """
    shards = _sharding.num_shards(sharding)
    index = jax.lax.iota(jnp.int32, num_chains)
    valid = _sharding.constrain(
        index < (num_chains if num_valid is None else num_valid), sharding)

    def per_shard(x):  # (C,) -> (S, C / S) without moving data between devices
        return _sharding.constrain(x.reshape(shards, num_chains // shards), sharding)

    def emit(outputs):
        _, rejected, new_call, verified = outputs
        rows = [jnp.sum(per_shard(flag & valid), axis=1, dtype=jnp.int32)
                for flag in (rejected, verified, new_call)]
        return jnp.stack(rows, axis=-1)  # (S, 3)

    _, carry, per_position = _run_chains(
        key, init, _as_laws(thresholds), num_chains, lookahead, offset, sharding, emit)
    x, _, num_rejections, num_calls = carry
    num_states = init.shape[-1]
    final = jax.vmap(lambda t, w: jnp.bincount(t, weights=w, length=num_states))(
        per_shard(x), per_shard(valid.astype(jnp.int32)))
    return ChunkCounts(
        num_rejections=num_rejections,
        num_calls=num_calls,
        per_position=jnp.sum(per_position, axis=1),
        final_tokens=jnp.sum(final, axis=0).astype(jnp.int32),
    )


def simulate_markov_counts(key, decoder, draft_trans: jax.Array, target_trans: jax.Array,
                           init: jax.Array, num_chains: int, lookahead: int, plan: TablePlan,
                           *, offset=0, num_valid=None, sharding=None) -> ChunkCounts:
    """``simulate_counts`` for a token-wise decoder on Markov transitions, its tables built as
    ``plan`` says (see ``simulate_markov``)."""
    return simulate_counts(key, init, markov_laws(decoder, draft_trans, target_trans, plan),
                           num_chains, lookahead, offset=offset, num_valid=num_valid,
                           sharding=sharding)
