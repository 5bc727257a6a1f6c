"""The law tables of the Markov engine (``specjax.sampling.engine``): a token-wise decoder's laws on
Markov transitions as integer thresholds, one row per (position, previous token, row kind).

Row kinds: ``ROOT`` opens a target call, ``VERIFY`` verifies a draft inside it, ``BONUS`` is the
target's own draw after ``K`` accepted drafts. Row ``r`` of kind ``k`` has ``2V`` outcomes (token
``i`` accepted for ``i < V``, token ``i - V`` rejected for ``V <= i < 2V``), padded to ``W'``
thresholds (``table_width``).

Law tables and memory (``table_plan``): the thresholds of all positions, ``(T, V, 3, W')``, are
built before the scan when they are small; otherwise each position's ``(V, R, W')`` table, for
the ``R`` row kinds the chains can meet, is built inside the scan in blocks of rows, so a run
holds one position's table instead of all of them and their float temporaries (4 times the
table). The thresholds, and so the tokens, are the same either way.

``TablePlan`` and ``table_plan`` say how a run's tables are built, ``table_bytes`` what they
cost; ``decoder_table``, ``law_table``, ``kind_thresholds`` and ``block_thresholds`` build them;
``markov_laws`` gives the scan its ``Laws`` (where each position's thresholds are found).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from specjax.decoders.draws import categorical_thresholds
from specjax.decoders.verification import VerificationLaw
from specjax.decoders.verification import bonus_law
from specjax.numerics import next_power_of_two

__all__ = [
    "ALL_KINDS",
    "BLOCK_ELEMENTS",
    "BONUS",
    "GROUP_BELOW",
    "GROUP_ROWS",
    "Laws",
    "PRECOMPUTED_TABLE_BYTES",
    "ROOT",
    "TablePlan",
    "VERIFY",
    "block_thresholds",
    "decoder_table",
    "kind_thresholds",
    "law_table",
    "markov_laws",
    "row_kinds",
    "table_bytes",
    "table_laws",
    "table_plan",
    "table_width",
]

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


class Laws(NamedTuple):
    """Where the scan finds each position's thresholds (internal, built under ``jit``)."""

    xs: object  # scanned over positions with ``jnp.arange(T)``: a (T, V, R, W') table, or None
    state: object  # carried through the scan: the tables of the current group of positions
    at: object  # (xs_n, n, state) -> (the position's (V, R, W') thresholds, new state)
    kinds: tuple
    width: int
    horizon: int


def table_laws(thresholds: jax.Array, kinds: tuple = ALL_KINDS) -> Laws:
    return Laws(thresholds, None, lambda table_n, n, state: (table_n, state), kinds,
                 thresholds.shape[-1], thresholds.shape[0])


def markov_laws(decoder, draft_trans: jax.Array, target_trans: jax.Array,
                plan: TablePlan) -> Laws:
    """The thresholds of a token-wise decoder on Markov transitions ``(T, V, V)``, laid out as
    ``plan`` says: all positions before the scan, or inside it, one position (or one group of
    positions, rebuilt at its first position; the last group is moved back to end at ``T``)
    at a time."""
    decoder = decoder.bind(draft_trans, target_trans)
    if plan.block_rows is None:
        return table_laws(decoder_table(decoder, draft_trans, target_trans))
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
    return Laws(None, state, at, plan.kinds, table_width(num_states), horizon)
