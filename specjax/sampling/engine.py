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

Law tables and memory (``table_plan``): the thresholds of all positions, ``(T, V, 3, W')``, are
built before the scan when they are small; otherwise each position's ``(V, R, W')`` table, for
the ``R`` row kinds the chains can meet, is built inside the scan in blocks of rows, so a run
holds one position's table instead of all of them and their float temporaries (4 times the
table). The thresholds, and so the tokens, are the same either way.

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
from specjax.decoders.verification import VerificationLaw
from specjax.decoders.verification import bonus_law
from specjax.numerics import next_power_of_two

ROOT, VERIFY, BONUS = 0, 1, 2  # row kinds of the per-position law table
ALL_KINDS = (ROOT, VERIFY, BONUS)

#: A run whose law table for all positions, ``(T, V, 3, W')`` int32, takes at most this many
#: bytes builds it before the scan, as every earlier version did (fastest for small ``V``; XLA
#: needs about 4 times the table to build it). A larger one is built inside the scan, one
#: position at a time, in blocks of rows, so that only one position's table exists at a time.
PRECOMPUTED_TABLE_BYTES = 1 << 26
#: Thresholds (rows x row kinds x ``W'``) built at once inside the scan: the block of rows whose
#: laws, masses and cumulative sums are live together.
BLOCK_ELEMENTS = 1 << 20
#: Below this ``V``, the tables built inside the scan are built for ``ceil(GROUP_ROWS / V)``
#: positions at once: XLA:CPU sums the rows of a small array in another order than those of a
#: large one, and whole groups of positions (at least ``GROUP_ROWS`` rows) sum them as the table
#: of all positions does (tested), so the thresholds do not depend on the plan.
GROUP_BELOW = 128
GROUP_ROWS = 1 << 13


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


class TablePlan(NamedTuple):
    """How a run's per-position law tables are built: static, part of the compiled program.

    Attributes:
      kinds: the row kinds of the table, in its order: all three when it is built before the
        scan, those the chains can meet (``row_kinds``) when it is built inside it.
      block_rows: ``None``: the tables of all positions are built before the scan, as one
        ``(T, V, 3, W')`` array. An int: the tables are built inside the scan, ``block_rows``
        rows (previous tokens) at a time, so that only the tables of ``block_positions``
        positions and one block's temporaries are live.
      block_positions: positions whose tables are built together inside the scan (more than
        one only for ``V < GROUP_BELOW``, with ``block_rows = V``).
    """

    kinds: tuple
    block_rows: int | None
    block_positions: int = 1


def row_kinds(decoder, lookahead: int, horizon: int) -> tuple:
    """The row kinds the chains of a run can meet, in the order of the table's rows.

    ``K = 0`` (autoregressive) meets only ``BONUS``; ``K >= T`` never reaches a bonus token;
    a decoder whose root law is its in-call law (``same_root``) needs no ``VERIFY`` rows. SD with
    ``K = T`` therefore needs one row kind out of three. A row's thresholds do not depend on the
    other rows, so leaving kinds out changes no draw.
    """
    if lookahead == 0:
        return (BONUS,)
    kinds = (ROOT,) if decoder.same_root else (ROOT, VERIFY)
    return kinds + ((BONUS,) if lookahead < horizon else ())


def table_width(num_states: int) -> int:
    """``W'``: the thresholds of one ``2V`` (accepted | rejected) row, padded to a power of two."""
    return next_power_of_two(2 * num_states)


def table_plan(decoder, num_states: int, horizon: int, lookahead: int) -> TablePlan:
    """The ``TablePlan`` of a run: a table of at most ``PRECOMPUTED_TABLE_BYTES`` for all
    positions is built before the scan; a larger one inside it, per position in blocks of about
    ``BLOCK_ELEMENTS`` thresholds (per group of positions when ``V < GROUP_BELOW``). Each row's
    thresholds equal those of the table of all positions, bit for bit (tested for every
    built-in decoder on CPU), so the plan changes no token."""
    width = table_width(num_states)
    if horizon * num_states * len(ALL_KINDS) * width * 4 <= PRECOMPUTED_TABLE_BYTES:
        return TablePlan(ALL_KINDS, None)
    kinds = row_kinds(decoder, lookahead, horizon)
    if num_states < GROUP_BELOW:
        return TablePlan(kinds, num_states, min(horizon, -(-GROUP_ROWS // num_states)))
    block = BLOCK_ELEMENTS // (len(kinds) * width)
    return TablePlan(kinds, max(1, min(num_states, block)))


def table_bytes(plan: TablePlan, num_states: int, horizon: int, dtype_bytes: int = 4) -> int:
    """Peak bytes of a run's law tables: the int32 thresholds that exist at once and the
    temporaries of the laws, masses and cumulative sums that build them (``dtype_bytes`` per
    probability: 4 in float32, 8 in float64). Calibrated with XLA's ``memory_analysis``."""
    width = table_width(num_states)
    kinds = len(plan.kinds)
    if plan.block_rows is None:
        rows = live = horizon * num_states
    else:
        rows = plan.block_positions * plan.block_rows
        live = 2 * rows if plan.block_positions > 1 else num_states  # group: kept and built
    elements = rows * kinds * width
    return (4 * live * kinds * width + 3 * elements * max(dtype_bytes, 4)
            + 8 * rows * num_states * dtype_bytes)


def kind_thresholds(decoder, p: jax.Array, q: jax.Array, kinds: tuple = ALL_KINDS,
                    positions=0) -> jax.Array:
    """The thresholds ``(..., R, W')`` of a token-wise decoder's laws on the rows ``p``, ``q``
    ``(..., V)``, for the row kinds ``kinds`` (``R = len(kinds)``).

    Row ``r`` of kind ``k`` has outcome ``i``: token ``i`` accepted for ``i < V`` and token
    ``i - V`` rejected for ``V <= i < 2V``. Every row is computed on its own, so a block of rows
    gives the laws of the whole table; bit for bit when the block is not tiny (XLA:CPU sums the
    rows of an array of a few thousand entries in another order: see ``GROUP_ROWS``).
    ``positions`` (broadcasting against the rows' leading axes) goes to ``decoder.laws_at``.
    """
    laws = {BONUS: bonus_law(q)}
    if any(kind != BONUS for kind in kinds):
        laws[ROOT], laws[VERIFY] = decoder.laws_at(positions, p, q)
    rows = [jnp.concatenate([laws[kind].accepted, laws[kind].rejected], axis=-1)
            for kind in kinds]
    return categorical_thresholds(jnp.stack(rows, axis=-2))


def decoder_table(decoder, draft_trans: jax.Array, target_trans: jax.Array) -> jax.Array:
    """The ``(T, V, 3, W')`` thresholds of a token-wise decoder's laws on Markov rows, every row
    kind, every position at once."""
    positions = jnp.arange(target_trans.shape[0])[:, None]
    root, verify = decoder.laws_at(positions, draft_trans, target_trans)
    return law_table(root, verify, bonus_law(target_trans))


def law_table(root: VerificationLaw, verify: VerificationLaw, bonus: VerificationLaw) -> jax.Array:
    """Stacks the per-position laws into thresholds of shape ``(T, V, 3, W')``.

    Each law has fields of shape ``(T, V, V)`` (position, previous token, token); outcome ``i`` of
    a row is token ``i`` accepted for ``i < V`` and token ``i - V`` rejected for ``V <= i < 2V``.
    """
    rows = [jnp.concatenate([law.accepted, law.rejected], axis=-1) for law in (root, verify, bonus)]
    return categorical_thresholds(jnp.stack(rows, axis=-2))


def block_thresholds(decoder, draft_trans: jax.Array, target_trans: jax.Array, first,
                     plan: TablePlan) -> jax.Array:
    """The ``(P, V, R, W')`` thresholds of the ``P = plan.block_positions`` positions from
    ``first`` (traced), built ``plan.block_rows`` rows at a time into one buffer: the
    temporaries of one block are live, not those of the whole table.

    The last block of rows is moved back to end at row ``V`` (it overlaps the one before; the
    rows it computes again are equal), so every block has the same shape.
    """
    positions = plan.block_positions
    num_states = target_trans.shape[-1]
    block = min(plan.block_rows, num_states)
    first = jnp.asarray(first, jnp.int32)

    def thresholds_from(start):
        shape = (positions, block, num_states)
        rows = [jax.lax.dynamic_slice(trans, (first, start, jnp.int32(0)), shape)
                for trans in (draft_trans, target_trans)]
        return kind_thresholds(decoder, *rows, plan.kinds,
                               (first + jnp.arange(positions))[:, None])

    if block == num_states:
        return thresholds_from(jnp.int32(0))

    def fill(i, table):
        start = jnp.minimum(i * block, num_states - block)
        return jax.lax.dynamic_update_slice_in_dim(table, thresholds_from(start), start, axis=1)

    table = jnp.zeros((positions, num_states, len(plan.kinds), table_width(num_states)),
                      jnp.int32)
    return jax.lax.fori_loop(0, -(-num_states // block), fill, table)


class _Laws(NamedTuple):
    """Where the scan finds each position's thresholds (internal, built under ``jit``)."""

    xs: object  # scanned over positions with ``jnp.arange(T)``: a (T, V, R, W') table, or None
    state: object  # carried through the scan: the tables of the current group of positions
    at: object  # (xs_n, n, state) -> (the position's (V, R, W') thresholds, new state)
    kinds: tuple
    width: int
    horizon: int


def _table_laws(thresholds: jax.Array, kinds: tuple = ALL_KINDS) -> _Laws:
    return _Laws(thresholds, None, lambda table_n, n, state: (table_n, state), kinds,
                 thresholds.shape[-1], thresholds.shape[0])


def markov_laws(decoder, draft_trans: jax.Array, target_trans: jax.Array,
                plan: TablePlan) -> _Laws:
    """The thresholds of a token-wise decoder on Markov transitions ``(T, V, V)``, laid out as
    ``plan`` says: all positions before the scan, or inside it, one position (or one group of
    positions, rebuilt at its first position; the last group is moved back to end at ``T``)
    at a time."""
    decoder = decoder.bind(draft_trans, target_trans)
    if plan.block_rows is None:
        return _table_laws(decoder_table(decoder, draft_trans, target_trans))
    horizon, num_states = target_trans.shape[0], target_trans.shape[-1]
    positions = plan.block_positions

    def build(first):
        return block_thresholds(decoder, draft_trans, target_trans, first, plan)

    if positions == 1:
        def at(_, n, state):
            return build(n)[0], state
        state = None
    else:
        def at(_, n, table):
            first = jnp.minimum((n // positions) * positions, horizon - positions)
            table = jax.lax.cond(n % positions == 0, lambda: build(first), lambda: table)
            return table[n - first], table
        state = jnp.zeros((positions, num_states, len(plan.kinds), table_width(num_states)),
                          jnp.int32)
    return _Laws(None, state, at, plan.kinds, table_width(num_states), horizon)


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


def _run_chains(key, init, laws: _Laws, num_chains: int, lookahead: int, offset, sharding,
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


def _as_laws(thresholds) -> _Laws:
    return thresholds if isinstance(thresholds, _Laws) else _table_laws(thresholds)


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
        num_emitted=jnp.full_like(num_calls, tokens.shape[1] - 1),
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
