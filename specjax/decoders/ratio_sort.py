"""Tokens sorted by ``q / p``: the sorting helpers the optimal verifiers share (``ratio_order``,
``ratios``, ``stable_argsort_nonnegative``, ``inverse_permutation``, ``unpermute``,
``prefix_with_zero``), served from ``specjax.decoders.optimal_acceptance`` too.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["inverse_permutation", "ratio_order", "ratios", "PACKED_SORT_MAX_STATES",
           "stable_argsort_nonnegative", "unpermute", "prefix_with_zero"]


def inverse_permutation(order: jax.Array) -> jax.Array:
    """``rank`` with ``rank[..., order[..., i]] = i`` (a scatter, not a second sort)."""
    index = jnp.broadcast_to(jnp.arange(order.shape[-1], dtype=order.dtype), order.shape)
    return unpermute(index, order)


def ratio_order(p: jax.Array, q: jax.Array) -> jax.Array:
    """The permutation sorting each row by ``q / p`` ascending (``+inf`` where ``p = 0 < q``,
    ``0`` where both are 0), ties in token order; ``(..., V)`` int32, a constant of the
    computation (no gradient flows through it)."""
    return stable_argsort_nonnegative(ratios(p, q))


def ratios(p: jax.Array, q: jax.Array) -> jax.Array:
    """``q / p`` per token, ``+inf`` where ``p = 0 < q`` and ``0`` (never ``-0.0``) where both
    are 0: the key ``ratio_order`` sorts by; a constant of the computation (no gradient)."""
    p, q = jax.lax.stop_gradient(p), jax.lax.stop_gradient(q)
    ratio = q / jnp.where(p > 0, p, jnp.ones_like(p))
    ratio = jnp.where(p > 0, ratio, jnp.where(q > 0, jnp.inf, 0))
    return jnp.where(ratio > 0, ratio, 0)  # no -0.0


#: Largest ``V`` whose float32 rows ``stable_argsort_nonnegative`` sorts by packed int32 keys
#: (a token index takes 15 bits of the key).
PACKED_SORT_MAX_STATES = 2**15


def stable_argsort_nonnegative(x: jax.Array) -> jax.Array:
    """``jnp.argsort(x, axis=-1, stable=True)`` for ``x >= 0`` without NaN (``+inf`` allowed):
    ties in token order. Same permutation, faster on CPU for float32 rows of ``V <= 2^15``.

    XLA's CPU sort is fast for one int32 operand and about six times slower for a float key or
    for a key with a value carried along (its generic comparator), which is what an argsort is.
    The bits of a non-negative float32 sort as the float does, so two passes of a least
    significant digit radix sort on packed single int32 keys give the exact stable order:
    pass 1 sorts ``(low 16 bits of x) << 15 | token``, pass 2 sorts ``(high 15 bits of x) << 15
    | position after pass 1`` (the position breaks ties of the high bits by the low bits, then
    by token). Other dtypes and larger ``V`` use ``jnp.argsort``. Integer outputs: no
    gradient.
    """
    num_states = x.shape[-1]
    if x.dtype != jnp.float32 or num_states > PACKED_SORT_MAX_STATES:
        return jnp.argsort(x, axis=-1, stable=True)
    bits = jax.lax.bitcast_convert_type(x, jnp.int32)  # x >= 0: bit 31 is 0
    index = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    low_mask, index_mask = jnp.int32(0xFFFF), jnp.int32(PACKED_SORT_MAX_STATES - 1)
    first = jnp.sort(((bits & low_mask) << 15) | index, axis=-1) & index_mask  # (.., V) tokens
    high = jnp.take_along_axis(bits >> 16, first, axis=-1)  # 15 bits, in pass-1 order
    position = jnp.sort((high << 15) | index, axis=-1) & index_mask
    return jnp.take_along_axis(first, position, axis=-1)


def unpermute(values: jax.Array, order: jax.Array) -> jax.Array:
    """``out[..., order[..., i]] = values[..., i]``: back from a sorted order to token order
    (a scatter, rather than a gather by ``argsort(order)``, which would cost a second sort)."""
    lead = values.shape[:-1]
    flat_values = values.reshape((-1, values.shape[-1]))
    flat_order = jnp.broadcast_to(order, values.shape).reshape(flat_values.shape)
    rows = jnp.arange(flat_values.shape[0])[:, None]
    out = jnp.zeros_like(flat_values).at[rows, flat_order].set(flat_values,
                                                                 unique_indices=True)
    return out.reshape(lead + values.shape[-1:])


def prefix_with_zero(x: jax.Array) -> jax.Array:
    """``[0, x_1, x_1 + x_2, ...]``: cumulative sums over the last axis with a leading 0."""
    return jnp.concatenate([jnp.zeros_like(x[..., :1]), jnp.cumsum(x, axis=-1)], axis=-1)
