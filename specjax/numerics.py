"""Numerics every subpackage shares: full-precision products and divisions that stay finite.

The exact laws push reach vectors and matrices through ``(V, V)`` rows and divide masses that
can be 0 or below the smallest normal float; these helpers keep the values and their gradients
finite, and keep matrix products at full precision on accelerators (no TF32/bfloat16 passes).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = [
    "HIGHEST",
    "divide",
    "indicator",
    "matmul_highest",
    "next_power_of_two",
    "safe_ratio",
    "tiny",
]

#: The precision of every product of probabilities (``precision=HIGHEST`` in ``dot``/``einsum``).
HIGHEST = jax.lax.Precision.HIGHEST


def matmul_highest(a: jax.Array, b: jax.Array) -> jax.Array:
    """``a @ b`` at full precision (no TF32/bfloat16 passes on accelerators), for the exact laws
    that push a reach vector or matrix through ``(V, V)`` rows."""
    return jnp.matmul(a, b, precision=HIGHEST)


def tiny(x: jax.Array):
    """The smallest normal float of ``x``'s dtype."""
    return jnp.finfo(jnp.asarray(x).dtype).tiny


@jax.custom_jvp
def divide(num: jax.Array, den: jax.Array) -> jax.Array:
    """``num / den`` for ``den`` at least the smallest normal float, with the derivative written
    as ``(d num - (num / den) d den) / den``: the default rule forms ``den ** -2``, which
    overflows to inf (and then NaN) once ``den`` is below about 1e-19 in float32."""
    return num / den


@divide.defjvp
def _divide_jvp(primals, tangents):
    num, den = primals
    d_num, d_den = tangents
    ratio = num / den
    return ratio, (d_num - ratio * d_den) / den


def safe_ratio(num: jax.Array, den: jax.Array, fill) -> jax.Array:
    """``num / den`` where ``den`` is at least the smallest normal float, ``fill`` elsewhere
    (``den = 0`` included), with finite values and reverse-mode gradients (forward-mode
    derivatives can still overflow when ``num / den`` itself is huge)."""
    positive = den >= tiny(den)
    safe_den = jnp.where(positive, den, jnp.ones_like(den))
    return jnp.where(positive, divide(num, safe_den), jnp.full_like(num, fill))


def indicator(x: jax.Array) -> jax.Array:
    """``1[x > 0]`` for ``x >= 0`` by arithmetic (XLA CPU vectorises it better than a select)."""
    return jnp.sign(x)


def next_power_of_two(n: int) -> int:
    """The least power of two ``>= n`` (1 for ``n <= 1``)."""
    return 1 << max(0, (n - 1).bit_length())
