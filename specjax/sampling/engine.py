"""The simulation engine shared by every sampler: one ``lax.scan`` over positions, vmapped chains.

Why a scan over positions suffices. For Markov drafts, drafting a whole lookahead first and then
verifying it in order has the same law as drafting each token only when it is verified: a draft
token that is never verified never influences the output. So a sampler is a Markov chain over a
small per-chain state, ``(previous token, phase)``, where the phase ``j`` counts the drafts accepted
since the last target call:

* ``j == 0``: the position opens a new target call (the *root* of a draft block or tree);
* ``0 < j < K``: inside an accepted block, the next draft is verified;
* ``j == K``: ``K`` drafts were accepted, the target's bonus token is emitted.

At each position the outcome (token, rejected) is drawn from a precomputed law (see
``specjax._verify``) for the chain's ``(n, previous token, row kind)``, with a single uniform per
chain-step via an inverse-CDF binary search on integer thresholds. A literal implementation that
drafts whole sequences is kept in the tests and checked to agree in law.

Random numbers: chain ``c`` at position ``n`` uses the Threefry-2x32 hash of the counter ``c``
under the key ``fold_in(key_steps, n)`` (``chain_bits``), which is element ``c`` of JAX's
partitionable ``jax.random.bits(fold_in(key_steps, n), (C,))`` for any ``C > c``. Each chain's
numbers depend on its index alone, so the first chains of a larger run equal a smaller run with
the same key, a block of chains ``[o, o + s)`` can be run on its own (chunks), and laying chains
out over devices (``specjax._sharding``) cannot change a token.
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
from specjax.decoders.verification import VerificationLaw
from specjax.decoders.verification import bonus_law

ROOT, VERIFY, BONUS = 0, 1, 2  # row kinds of the per-position law table


class DecodingTrace(NamedTuple):
    """What a decoding run produced, for ``C`` chains of horizon ``T``.

    Attributes:
      tokens: ``x_0..x_T`` for each chain.
      rejected: whether ``x_n`` (``n = 1..T``) was drawn after a rejection.
      num_rejections: the paper's ``N_rej``, ``rejected.sum(-1)``.
      num_calls: target (oracle) calls, ``new_call.sum(-1)``.
      new_call: whether a target call starts at position ``n`` (the first position of a block).
    """

    tokens: jax.Array  # shape=(C, T + 1), dtype=int32
    rejected: jax.Array  # shape=(C, T), dtype=bool
    num_rejections: jax.Array  # shape=(C,), dtype=int32
    num_calls: jax.Array  # shape=(C,), dtype=int32
    new_call: jax.Array  # shape=(C, T), dtype=bool


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
      sharding: chain layout (``specjax._sharding``), or ``None``.

    Returns:
      ``(num_chains,)`` uint32.
    """
    k1, k2 = _key_words(key)
    counter = jnp.asarray(offset, jnp.uint32) + jax.lax.iota(jnp.uint32, num_chains)
    counter = _sharding.constrain(counter, sharding)
    hi, lo = threefry2x32_p.bind(k1, k2, jnp.zeros_like(counter), counter)
    return hi ^ lo


def decoder_table(decoder, draft_trans: jax.Array, target_trans: jax.Array) -> jax.Array:
    """The ``(T, V, 3, W')`` thresholds of a token-wise decoder's laws on Markov rows."""
    root, verify = decoder.laws(draft_trans, target_trans)
    return law_table(root, verify, bonus_law(target_trans))


def law_table(root: VerificationLaw, verify: VerificationLaw, bonus: VerificationLaw) -> jax.Array:
    """Stacks the per-position laws into thresholds of shape ``(T, V, 3, W')``.

    Each law has fields of shape ``(T, V, V)`` (position, previous token, token); outcome ``i`` of
    a row is token ``i`` accepted for ``i < V`` and token ``i - V`` rejected for ``V <= i < 2V``.
    """
    rows = [jnp.concatenate([law.accepted, law.rejected], axis=-1) for law in (root, verify, bonus)]
    return categorical_thresholds(jnp.stack(rows, axis=-2))


def phase_row(j: jax.Array, lookahead: int) -> jax.Array:
    """The row kind of phase ``j``: ``ROOT`` opens a call, ``VERIFY`` inside it, ``BONUS`` after
    ``K`` accepted drafts (``K = 0``: every position is the target's own draw)."""
    return jnp.where(j == lookahead, BONUS, jnp.where(j == 0, ROOT, VERIFY))


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


def _chain_step(flat_thresholds, lookahead, num_states, row_kinds, width, carry, u):
    """One position of one chain.

    Args:
      flat_thresholds: the position's ``(V, 3, W')`` thresholds, flattened.
      lookahead: ``K`` (static).
      num_states: ``V`` (static).
      row_kinds: 3 (static); width: ``W'`` (static).
      carry: ``(previous token, phase j, rejections so far, calls so far)``.
      u: a 31-bit uniform integer.

    Returns:
      The new carry and ``(token, rejected, new_call, verified)`` for this position
      (``verified``: a draft was verified here, i.e. the position is not a bonus token).
    """
    x, j, num_rejections, num_calls = carry
    base = (x * row_kinds + phase_row(j, lookahead)) * width
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


def _run_chains(key, init, thresholds, num_chains: int, lookahead: int, offset, sharding,
                emit):
    """Scans chains ``offset .. offset + num_chains - 1`` over the positions.

    ``emit(outputs)`` maps one position's ``(token, rejected, new_call, verified)``, each of shape
    ``(C,)``, to what the scan keeps of that position. Returns ``(x0, final carry, kept)``.
    """
    num_states = init.shape[-1]
    horizon, _, row_kinds, width = thresholds.shape
    key_init, key_steps = jax.random.split(key)

    x0 = first_tokens(key_init, init, offset, num_chains, sharding)

    def scan_step(carry, inputs):
        thresholds_n, n = inputs
        u = int31(chain_bits(jax.random.fold_in(key_steps, n), offset, num_chains, sharding))
        step = functools.partial(_chain_step, thresholds_n.reshape(-1), lookahead, num_states,
                                 row_kinds, width)
        carry, outputs = jax.vmap(step)(carry, u)
        return carry, emit(outputs)

    zeros = _sharding.constrain(jnp.zeros((num_chains,), jnp.int32), sharding)
    carry0 = (x0, zeros, zeros, zeros)
    carry, kept = jax.lax.scan(scan_step, carry0, (thresholds, jnp.arange(horizon)))
    return x0, carry, kept


def simulate(key, init: jax.Array, thresholds: jax.Array, num_chains: int, lookahead: int, *,
             offset=0, sharding=None) -> DecodingTrace:
    """Runs ``num_chains`` chains through the per-position law table.

    Args:
      key: PRNG key.
      init: ``(V,)`` law of ``x_0``.
      thresholds: ``(T, V, 3, W')`` from ``law_table``.
      num_chains: ``C`` (static).
      lookahead: ``K`` (static); ``0`` gives autoregressive decoding (every step a bonus token),
        ``K >= T`` never reaches a bonus (the paper's ``K = T``).
      offset: index of the first chain (traced): the chains are ``offset .. offset + C - 1`` of
        a larger run with the same key.
      sharding: a ``NamedSharding`` of the chain axis (``specjax.sampling.sharding.resolve``), or ``None``.

    Returns:
      A ``DecodingTrace``.
    """
    token_dtype = small_int_dtype(init.shape[-1])

    def emit(outputs):
        token, rejected, new_call, _ = outputs
        return token.astype(token_dtype), rejected, new_call

    x0, carry, (tokens, rejected, new_call) = _run_chains(
        key, init, thresholds, num_chains, lookahead, offset, sharding, emit)
    _, _, num_rejections, num_calls = carry
    tokens = jnp.concatenate([x0[:, None], tokens.T.astype(jnp.int32)], axis=1)
    return DecodingTrace(
        tokens=_sharding.constrain(tokens, sharding),
        rejected=_sharding.constrain(rejected.T, sharding),
        num_rejections=num_rejections,
        num_calls=num_calls,
        new_call=_sharding.constrain(new_call.T, sharding),
    )


class ChunkCounts(NamedTuple):
    """What the statistics-only path keeps of one block of chains (no tokens).

    ``num_rejections`` and ``num_calls`` are per chain; the counts are over the chains of the
    block that are ``valid`` (index below the run's total).
    """

    num_rejections: jax.Array  # shape=(C,), dtype=int32
    num_calls: jax.Array  # shape=(C,), dtype=int32
    per_position: jax.Array  # shape=(T, 3), dtype=int32: rejected, verified, call starts
    final_tokens: jax.Array  # shape=(V,), dtype=int32


def simulate_counts(key, init: jax.Array, thresholds: jax.Array, num_chains: int, lookahead: int,
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
        key, init, thresholds, num_chains, lookahead, offset, sharding, emit)
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
