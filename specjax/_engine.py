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

Random numbers: chain ``c`` at position ``n`` uses element ``c`` of
``jax.random.bits(fold_in(key_steps, n), (C,))``. With JAX's partitionable Threefry (the default
since 0.5) element ``c`` does not depend on ``C``, so the first chains of a larger run equal a
smaller run with the same key.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from specjax._verify import VerificationLaw

ROOT, VERIFY, BONUS = 0, 1, 2  # row kinds of the per-position law table
_INT32_MAX = jnp.iinfo(jnp.int32).max
_RESOLUTION_BITS = 31  # uniforms are 31-bit integers; probabilities are resolved to 2**-31


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


def _next_power_of_two(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def categorical_thresholds(masses: jax.Array) -> jax.Array:
    """Integer inverse-CDF thresholds for drawing from (un-normalised) ``masses``.

    Entry ``i`` is drawn for a 31-bit uniform integer ``u`` iff ``thr[i - 1] < u <= thr[i]``, so
    ``P(i) = (thr[i] - thr[i - 1]) / 2**31``. Zero-mass entries get zero width (a token of
    probability zero is never drawn, whatever the rounding), and every entry from the last one
    with positive mass on is ``INT32_MAX``, so the search never runs past it.

    Args:
      masses: ``(..., W)`` non-negative masses.

    Returns:
      ``(..., W')`` int32 thresholds, ``W'`` the next power of two ``>= W`` (padding has no mass).
    """
    width = masses.shape[-1]
    padded = _next_power_of_two(width)
    masses = jnp.pad(masses, [(0, 0)] * (masses.ndim - 1) + [(0, padded - width)])
    cdf = jnp.cumsum(masses, axis=-1)
    total = cdf[..., -1:]
    cdf = cdf / jnp.where(total > 0, total, jnp.ones_like(total))
    scaled = jnp.ceil(cdf * 2.0**_RESOLUTION_BITS) - 1
    scaled = jnp.clip(scaled, -1, 2.0**_RESOLUTION_BITS - 256).astype(jnp.int32)
    positive = masses > 0
    thr = jax.lax.cummax(jnp.where(positive, scaled, -1), axis=masses.ndim - 1)
    index = jnp.arange(padded, dtype=jnp.int32).reshape((1,) * (masses.ndim - 1) + (padded,))
    last_positive = jnp.max(jnp.where(positive, index, -1), axis=-1, keepdims=True)
    return jnp.where(index >= last_positive, _INT32_MAX, thr)


def _search(thresholds_at, u: jax.Array, width: int) -> jax.Array:
    """First ``i`` with ``thr[i] >= u``; ``thresholds_at(i)`` reads one threshold (a gather)."""
    lo = jnp.zeros_like(u)
    half = width // 2
    while half >= 1:
        below = thresholds_at(lo + half - 1) < u
        lo = jnp.where(below, lo + half, lo)
        half //= 2
    return lo


def uniform_int31(key, shape) -> jax.Array:
    """Uniform integers in ``[0, 2**31)`` as int32."""
    bits = jax.random.bits(key, shape, dtype=jnp.uint32)
    return jax.lax.shift_right_logical(bits, jnp.uint32(1)).astype(jnp.int32)


def law_table(root: VerificationLaw, verify: VerificationLaw, bonus: VerificationLaw) -> jax.Array:
    """Stacks the per-position laws into thresholds of shape ``(T, V, 3, W')``.

    Each law has fields of shape ``(T, V, V)`` (position, previous token, token); outcome ``i`` of
    a row is token ``i`` accepted for ``i < V`` and token ``i - V`` rejected for ``V <= i < 2V``.
    """
    rows = [jnp.concatenate([law.accepted, law.rejected], axis=-1) for law in (root, verify, bonus)]
    return categorical_thresholds(jnp.stack(rows, axis=-2))


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
      The new carry and ``(token, rejected, new_call)`` for this position.
    """
    x, j, num_rejections, num_calls = carry
    kind = jnp.where(j == lookahead, BONUS, jnp.where(j == 0, ROOT, VERIFY))
    base = (x * row_kinds + kind) * width
    outcome = _search(lambda i: flat_thresholds[base + i], u, width)
    rejected = outcome >= num_states
    token = jnp.where(rejected, outcome - num_states, outcome)
    next_j = jnp.where(rejected | (j == lookahead), 0, j + 1)
    new_call = j == 0
    carry = (token, next_j, num_rejections + rejected, num_calls + new_call)
    return carry, (token, rejected, new_call)


def _small_int_dtype(num_states: int):
    """The narrowest integer type for token ids: the per-step outputs are transposed at the end,
    and moving int8 instead of int32 there is a large share of a run's time when ``V`` is small."""
    if num_states <= jnp.iinfo(jnp.int8).max:
        return jnp.int8
    if num_states <= jnp.iinfo(jnp.int16).max:
        return jnp.int16
    return jnp.int32


def simulate(key, init: jax.Array, thresholds: jax.Array, num_chains: int,
             lookahead: int) -> DecodingTrace:
    """Runs ``num_chains`` chains through the per-position law table.

    Args:
      key: PRNG key.
      init: ``(V,)`` law of ``x_0``.
      thresholds: ``(T, V, 3, W')`` from ``law_table``.
      num_chains: ``C`` (static).
      lookahead: ``K`` (static); ``0`` gives autoregressive decoding (every step a bonus token),
        ``K >= T`` never reaches a bonus (the paper's ``K = T``).

    Returns:
      A ``DecodingTrace``.
    """
    num_states = init.shape[-1]
    horizon, _, row_kinds, width = thresholds.shape
    key_init, key_steps = jax.random.split(key)

    init_thr = categorical_thresholds(init)
    u0 = uniform_int31(key_init, (num_chains,))
    x0 = jax.vmap(lambda u: _search(lambda i: init_thr[i], u, init_thr.shape[-1]))(u0)
    token_dtype = _small_int_dtype(num_states)

    def scan_step(carry, inputs):
        thresholds_n, n = inputs
        u = uniform_int31(jax.random.fold_in(key_steps, n), (num_chains,))
        step = functools.partial(_chain_step, thresholds_n.reshape(-1), lookahead, num_states,
                                 row_kinds, width)
        carry, (token, rejected, new_call) = jax.vmap(step)(carry, u)
        return carry, (token.astype(token_dtype), rejected, new_call)

    zeros = jnp.zeros((num_chains,), jnp.int32)
    carry0 = (x0, zeros, zeros, zeros)
    carry, (tokens, rejected, new_call) = jax.lax.scan(
        scan_step, carry0, (thresholds, jnp.arange(horizon)))
    _, _, num_rejections, num_calls = carry
    tokens = jnp.concatenate([x0[:, None], tokens.T.astype(jnp.int32)], axis=1)
    return DecodingTrace(
        tokens=tokens,
        rejected=rejected.T,
        num_rejections=num_rejections,
        num_calls=num_calls,
        new_call=new_call.T,
    )
