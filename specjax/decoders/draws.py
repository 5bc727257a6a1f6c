"""Categorical draws from one 31-bit uniform integer: the building block every sampler shares.

A law over ``W`` outcomes becomes integer inverse-CDF thresholds (``categorical_thresholds``); a
uniform integer ``u`` in ``[0, 2**31)`` picks the first outcome whose threshold is at least ``u``
(``search``, a branch-free binary search). Zero-mass outcomes get zero width, so a token of
probability zero is never drawn whatever the rounding, and an event of probability one never
fails (``bernoulli``).

A sampler that draws once from each of many rows (a token tree's walk builds the rows of every
previous token at each position) skips the thresholds: ``cdf_search`` draws from in-order running
sums (``cumulative_masses``), which keep the guarantee that a zero-mass outcome is never drawn.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.numerics import next_power_of_two

__all__ = [
    "INT32_MAX",
    "RESOLUTION_BITS",
    "bernoulli",
    "categorical_thresholds",
    "cdf_search",
    "cumulative_masses",
    "draw",
    "int31",
    "inverse_cdf",
    "mass_or_target",
    "search",
]

INT32_MAX = jnp.iinfo(jnp.int32).max
RESOLUTION_BITS = 31  # uniforms are 31-bit integers; probabilities are resolved to 2**-31


def categorical_thresholds(masses: jax.Array) -> jax.Array:
    """Integer inverse-CDF thresholds for drawing from (un-normalised) ``masses``.

    Entry ``i`` is drawn for a 31-bit uniform integer ``u`` iff ``thr[i - 1] < u <= thr[i]``, so
    ``P(i) = (thr[i] - thr[i - 1]) / 2**31``. Zero-mass entries get zero width (a token of
    probability zero is never drawn, whatever the rounding), and every entry from the last one
    with positive mass on is ``INT32_MAX``, so the search never runs past it.

    Args:
      masses: ``(..., W)`` non-negative masses (float16 and bfloat16 are widened to float32).

    Returns:
      ``(..., W')`` int32 thresholds, ``W'`` the next power of two ``>= W`` (padding has no mass).
    """
    width = masses.shape[-1]
    padded = next_power_of_two(width)
    if jnp.finfo(masses.dtype).bits < 32:
        # float16 cannot hold 2**31 (its largest value is 65504): scaling the CDF in it overflows
        # to inf and every threshold casts to the same integer (every draw the first token). The
        # thresholds are computed in float32; the masses' values are unchanged.
        masses = masses.astype(jnp.float32)
    masses = jnp.pad(masses, [(0, 0)] * (masses.ndim - 1) + [(0, padded - width)])
    cdf = jnp.cumsum(masses, axis=-1)
    total = cdf[..., -1:]
    cdf = cdf / jnp.where(total > 0, total, jnp.ones_like(total))
    scaled = jnp.ceil(cdf * 2.0**RESOLUTION_BITS) - 1
    scaled = jnp.clip(scaled, -1, 2.0**RESOLUTION_BITS - 256).astype(jnp.int32)
    positive = masses > 0
    thr = jax.lax.cummax(jnp.where(positive, scaled, -1), axis=masses.ndim - 1)
    index = jnp.arange(padded, dtype=jnp.int32).reshape((1,) * (masses.ndim - 1) + (padded,))
    last_positive = jnp.max(jnp.where(positive, index, -1), axis=-1, keepdims=True)
    return jnp.where(index >= last_positive, INT32_MAX, thr)


def search(thresholds_at, u: jax.Array, width: int) -> jax.Array:
    """First ``i`` with ``thr[i] >= u``; ``thresholds_at(i)`` reads one threshold (a gather)."""
    lo = jnp.zeros_like(u)
    half = width // 2
    while half >= 1:
        below = thresholds_at(lo + half - 1) < u
        lo = jnp.where(below, lo + half, lo)
        half //= 2
    return lo


def int31(bits: jax.Array) -> jax.Array:
    """Uniform integers in ``[0, 2**31)`` as int32, from 32 random bits."""
    return jax.lax.shift_right_logical(bits, jnp.uint32(1)).astype(jnp.int32)


def bernoulli(prob: jax.Array, u: jax.Array) -> jax.Array:
    """``True`` with probability ``prob`` for a 31-bit uniform integer ``u`` (exactly never at
    ``prob = 0``, always at ``prob = 1``)."""
    thr = categorical_thresholds(jnp.stack([prob, 1 - prob], axis=-1))
    return u <= thr[..., 0]


def draw(thresholds: jax.Array, u: jax.Array) -> jax.Array:
    """The outcome of one ``(W',)`` threshold row for the uniform integer ``u``."""
    return search(lambda i: thresholds[i], u, thresholds.shape[-1])


def mass_or_target(w: jax.Array, q: jax.Array) -> jax.Array:
    """``w`` if it has mass, else ``q``: a residual that is empty only by rounding (rows equal up
    to float error) must not emit an arbitrary, possibly zero-probability, token."""
    return jnp.where(jnp.sum(w) > 0, w, q)


def inverse_cdf(num: jax.Array, den: jax.Array, w: jax.Array) -> jax.Array:
    """The token at position ``s = (num / den) sum(w)`` of the CDF of ``w``, without dividing.

    ``num / den`` is in ``[0, 1)``. Counts the ``y`` with ``num * W >= den * cumsum(w)[y]``,
    monotone in ``y``, so a token of zero mass (equal consecutive cumsums) can never be returned;
    clipped to the last token of positive mass against rounding at the top end.
    """
    cw = jnp.cumsum(w)
    count = jnp.sum(num * cw[-1] >= den * cw).astype(jnp.int32)
    last = (w.shape[-1] - 1 - jnp.argmax(w[::-1] > 0)).astype(jnp.int32)
    return jnp.minimum(count, last)


def cdf_search(cdf_at, u: jax.Array, width: int) -> jax.Array:
    """The outcome of one row of un-normalised cumulative masses for the 31-bit uniform integer
    ``u``, without building integer thresholds (a sampler that draws from many rows once each).

    ``cdf_at(i)`` reads entry ``i < width`` of ``cdf = cumsum(w)`` (a gather); the outcome is the
    first ``i`` with ``cdf[i] > s``, ``s = v cdf[width - 1]`` for ``v = u' 2**-b`` the top ``b``
    bits of ``u`` (``b = 24`` in float32, ``31`` in float64: ``v < 1`` exactly, so ``s`` rounds
    below the total). ``P(i) = w[i] / sum(w)`` up to the rounding of the cumulative sum and the
    ``2**-b`` resolution of ``v``; an outcome of zero mass (``cdf[i] = cdf[i - 1]``) is never
    drawn, and the outcome is always below ``width`` (an all-zero row gives the last outcome).
    """
    total = cdf_at(jnp.full_like(u, width - 1))
    bits = min(RESOLUTION_BITS, jnp.finfo(total.dtype).nmant + 1)
    v = jax.lax.shift_right_logical(u, jnp.int32(RESOLUTION_BITS - bits)).astype(total.dtype)
    s = v * jnp.asarray(2.0**-bits, total.dtype) * total
    lo = jnp.zeros_like(u)
    half = next_power_of_two(width) // 2
    while half >= 1:
        below = cdf_at(jnp.minimum(lo + half - 1, width - 1)) <= s
        lo = jnp.where(below, lo + half, lo)
        half //= 2
    return jnp.minimum(lo, width - 1)


def cumulative_masses(w: jax.Array, block: int = 16) -> jax.Array:
    """``cumsum(w)`` along the last axis, added in order: ``c[i] = c[i - 1] + w[i]`` within
    blocks of ``block`` entries, each block offset by the running sum of the blocks before it.
    An entry of zero mass repeats the previous value exactly and the result never decreases,
    which ``cdf_search`` needs (``jnp.cumsum``'s tree of additions rounds differently at
    different entries, so a zero-mass token could get a sliver of mass)."""
    *lead, width = w.shape
    blocks = -(-width // block)
    pad = [(0, 0)] * len(lead) + [(0, blocks * block - width)]
    padded = jnp.pad(w, pad) if blocks * block > width else w
    within = _running_sum(padded.reshape(*lead, blocks, block))
    totals = _running_sum(within[..., -1])
    offsets = jnp.concatenate([jnp.zeros_like(totals[..., :1]), totals[..., :-1]], axis=-1)
    return (offsets[..., None] + within).reshape(*lead, blocks * block)[..., :width]


def _running_sum(x: jax.Array) -> jax.Array:
    """In-order running sums along the last axis: ``c[k] = c[k - 1] + x[k]``, ``c[0] = x[0]``."""
    if x.shape[-1] <= 32:
        out = [x[..., 0]]
        for k in range(1, x.shape[-1]):
            out.append(out[-1] + x[..., k])
        return jnp.stack(out, axis=-1)

    def step(c, xk):
        c = c + xk
        return c, c

    _, out = jax.lax.scan(step, jnp.zeros_like(x[..., 0]), jnp.moveaxis(x, -1, 0))
    return jnp.moveaxis(out, 0, -1)

