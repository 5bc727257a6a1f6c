"""Drawing random transition tables: the samplers behind ``random_markov_chain``
(``specjax.models.markov``, which picks the method and the blocks and checks the memory).

Two draws of a symmetric Dirichlet row: ``_dirichlet_rows``, the rows of
``jax.random.dirichlet``'s own numbers computed for a block of rows alone, and ``_fast_rows``,
the fast draw; ``_fill_in_blocks`` fills a ``(T, V, V)`` table with either, a block of rows at
a time.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.random import threefry2x32_p

from specjax import _checks

__all__ = ["concentration_range"]


def _gamma_sampler():
    """JAX's sampler of one gamma variate from its own key (``jax.random.gamma`` draws element
    ``e`` of an array with it, from key ``e`` of ``split(key, size)``), or ``None`` when this
    JAX version does not have it where expected (then large tables are drawn directly)."""
    try:
        from jax._src.random.core import _gamma_one
    except ImportError:
        try:
            from jax._src.random import _gamma_one
        except ImportError:
            return None
    return _gamma_one


def _blocked_draw_supported(key) -> bool:
    """The blocked draw reproduces ``jax.random.dirichlet`` for threefry keys split by counter
    (``jax_threefry_partitionable``, JAX's default), with JAX's gamma sampler at hand."""
    return (str(jax.random.key_impl(key)) == "threefry2x32"
            and bool(jax.config.jax_threefry_partitionable) and _gamma_sampler() is not None)


def _mul_wide(a: jax.Array, b: int):
    """``(hi, lo)`` uint32 words of the 64-bit product of uint32 ``a`` and ``b < 2**32``."""
    a_lo, a_hi = a & 0xFFFF, a >> 16
    b_lo, b_hi = jnp.uint32(b & 0xFFFF), jnp.uint32(b >> 16)
    ll, lh, hl, hh = a_lo * b_lo, a_lo * b_hi, a_hi * b_lo, a_hi * b_hi
    mid = (ll >> 16) + (lh & 0xFFFF) + (hl & 0xFFFF)
    return hh + (lh >> 16) + (hl >> 16) + (mid >> 16), (ll & 0xFFFF) | (mid << 16)


def _dirichlet_rows(key, alpha: jax.Array, start, num_rows: int) -> jax.Array:
    """Rows ``start .. start + num_rows - 1`` of ``jax.random.dirichlet(key, alpha, (R,))``,
    flattened over ``(T, V)``, for any ``R`` above them: entry ``e`` of the gamma draws uses
    key ``e`` of ``split(key, R V)``, the threefry hash of the 64-bit counter ``e``, which is
    computed here for the rows' entries alone."""
    num_states = alpha.shape[-1]
    words = jax.random.key_data(key)
    row = (jnp.asarray(start, jnp.int32) + jnp.arange(num_rows, dtype=jnp.int32))
    hi, lo = _mul_wide(row.astype(jnp.uint32), num_states)
    lo_entry = lo[:, None] + jnp.arange(num_states, dtype=jnp.uint32)[None, :]
    hi_entry = hi[:, None] + (lo_entry < lo[:, None]).astype(jnp.uint32)
    bits = threefry2x32_p.bind(words[0], words[1], hi_entry.ravel(), lo_entry.ravel())
    keys = jax.random.wrap_key_data(jnp.stack(bits, axis=-1), impl="threefry2x32")
    alphas = jnp.broadcast_to(alpha, (num_rows, num_states)).ravel()  # as jax.random.gamma
    gamma_one = functools.partial(_gamma_sampler(), log_space=True)
    log_gamma = jax.vmap(gamma_one)(keys, alphas)
    return jax.nn.softmax(log_gamma.reshape(num_rows, num_states), axis=-1)


@functools.partial(jax.jit, static_argnames=("draw", "num_rows", "options"),
                   donate_argnums=(0,))
def _draw_block(out, key, alpha, start, *, draw, num_rows, options=()):
    """``out`` (donated, updated in place) with rows ``start ..`` drawn by ``draw(key, alpha,
    start, num_rows, *options)``: a program of its own per block, so XLA compiles the block as
    it compiles a direct draw."""
    rows = draw(key, alpha, start, num_rows, *options)
    return jax.lax.dynamic_update_slice_in_dim(out, rows.astype(out.dtype), start, axis=0)


@functools.partial(jax.jit, static_argnames=("shape",), donate_argnums=(0,))
def _reshape(out, *, shape):
    return out.reshape(shape)


def _fill_in_blocks(draw, key, alpha, horizon: int, num_states: int, block_entries: int,
                    dtype, options=()) -> jax.Array:
    """The ``(T, V, V)`` table whose rows ``start .. start + num_rows - 1`` (flattened over
    ``(T, V)``) are ``draw(key, alpha, start, num_rows, *options)``, drawn about
    ``block_entries`` entries at a time into the result (the last block moved back to end at
    row ``T V``; the rows it draws again are equal): the temporaries of one block are live, not
    those of the table. With a concrete key, each block is one call of a compiled program
    (``_draw_block``); under a caller's transformation the blocks are a ``fori_loop``."""
    rows = horizon * num_states
    num_rows = max(1, min(rows, block_entries // num_states))
    starts = [min(i, rows - num_rows) for i in range(0, rows, num_rows)]
    if not all(_checks.is_concrete(x) for x in (key, alpha)):
        def fill(i, out):
            start = jnp.minimum(i * num_rows, rows - num_rows)
            block = draw(key, alpha, start, num_rows, *options).astype(dtype)
            return jax.lax.dynamic_update_slice_in_dim(out, block, start, axis=0)

        out = jax.lax.fori_loop(0, len(starts), fill, jnp.zeros((rows, num_states), dtype))
        return out.reshape(horizon, num_states, num_states)
    out = jnp.zeros((rows, num_states), dtype)
    for start in starts:
        out = _draw_block(out, key, alpha, np.int32(start), draw=draw, num_rows=num_rows,
                          options=options)
    return _reshape(out, shape=(horizon, num_states, num_states))


def _fast_rows(key, alpha, start, num_rows: int, kind: str, num_states: int, dtype):
    """Rows ``start .. start + num_rows - 1`` of the fast draw (``random_markov_chain``'s
    ``method="fast"``): row ``r`` from the key ``fold_in(k1, r)``, so a row's numbers do not
    depend on the blocks.

    At concentration 1 a Dirichlet row is a row of i.i.d. exponentials, normalised:
    ``E / sum(E)`` with ``E = exponential(fold_in(k1, r), (V,))``. Otherwise each entry is a
    gamma variate, drawn in log space by Marsaglia and Tsang's method (ACM TOMS 26, 2000): for
    ``a = alpha + 1`` (``alpha < 1``) or ``a = alpha``, ``d = a - 1/3``, ``c = 1 / sqrt(9 d)``,
    ``x`` standard normal and ``u`` uniform, the candidate ``d v`` with ``v = (1 + c x)^3`` is
    accepted iff ``v > 0`` and ``log u < x^2 / 2 + d - d v + d log v``, and is then
    ``Gamma(a)``; for ``alpha < 1``, ``log G = log G_{alpha + 1} + log(u') / alpha`` with one
    more uniform ``u'`` (the gamma's boost, exact). The first round draws every entry
    (``x, u, u'`` from ``fold_in(k1, r)``); an entry whose candidate is refused (a few percent:
    the method accepts with probability above 0.95 for ``a >= 1``) takes its ``i``-th new
    draws from ``fold_in(fold_in(fold_in(k2, i), r), column)``, rounds running on the refused
    entries alone (gathered, at most an eighth of the block at a time) until none is left. Each
    entry keeps its first accepted candidate of its own independent sequence of draws: exactly
    ``Gamma(alpha)``, and the same numbers whatever the blocks. The row is the softmax of the
    log-gammas, as ``jax.random.dirichlet`` computes it."""
    k1, k2 = jax.random.split(key)
    row = jnp.asarray(start, jnp.int32) + jnp.arange(num_rows, dtype=jnp.int32)
    row_keys = jax.vmap(lambda r: jax.random.fold_in(k1, r))(row)
    if kind == "one":
        e = jax.vmap(lambda k: jax.random.exponential(k, (num_states,), dtype))(row_keys)
        return e / jnp.sum(e, axis=-1, keepdims=True)
    boost = kind == "any"  # "above": a concrete concentration above 1, no boost
    a = jnp.where(alpha < 1, alpha + 1, alpha)
    d = a - jnp.asarray(1 / 3, dtype)
    c = jax.lax.rsqrt(9 * d)

    def candidates(x, u, u_boost):
        v = (1 + c * x) ** 3
        log_v = jnp.log(jnp.where(v > 0, v, 1))
        ok = (v > 0) & (jnp.log(u) < 0.5 * x * x + d - d * v + d * log_v)
        log_g = jnp.log(d) + log_v
        if boost:  # static: False for a concrete concentration of 1 or more
            log_g = log_g + jnp.where(alpha < 1, jnp.log(u_boost) / alpha, 0)
        return log_g, ok

    def entry_draws(k, shape):
        kx, ku, kb = jax.random.split(k, 3)
        tiny = jnp.finfo(dtype).tiny  # log u finite
        return (jax.random.normal(kx, shape, dtype),
                jax.random.uniform(ku, shape, dtype, minval=tiny),
                jax.random.uniform(kb, shape, dtype, minval=tiny) if boost else None)

    log_g, ok = candidates(*jax.vmap(lambda k: entry_draws(k, (num_states,)))(row_keys))
    log_g, ok = log_g.ravel(), ok.ravel()
    size = num_rows * num_states
    capacity = max(1, size // 8)

    def again(state):
        log_g, ok, tries = state
        (where,) = jnp.nonzero(~ok, size=capacity, fill_value=size)
        at = jnp.minimum(where, size - 1)  # the fill (no entry) reads the last, drops its write
        r, col = jnp.divmod(at, num_states)
        keys = jax.vmap(lambda i, j, t: jax.random.fold_in(jax.random.fold_in(
            jax.random.fold_in(k2, t), i), j))(row[r], col, tries[at])
        new, new_ok = candidates(*jax.vmap(lambda k: entry_draws(k, ()))(keys))
        log_g = log_g.at[where].set(jnp.where(new_ok, new, log_g[at]), mode="drop")
        return log_g, ok.at[where].set(new_ok, mode="drop"), tries.at[where].add(1, mode="drop")

    def more(state):
        log_g, ok, tries, rounds = state
        return ~jnp.all(ok) & (rounds < _MAX_ROUNDS)

    def again_counted(state):
        return (*again(state[:3]), state[3] + 1)

    tries = jnp.ones((size,), jnp.int32)  # the rounds an entry has had: its next round's key
    log_g, ok, _, _ = jax.lax.while_loop(more, again_counted,
                                         (log_g, ok, tries, jnp.zeros((), jnp.int32)))
    log_g = jnp.where(ok, log_g, jnp.nan)  # never, in range: a bound, not a hang
    return jax.nn.softmax(log_g.reshape(num_rows, num_states), axis=-1)


#: Rounds of redraws of the fast draw's refused entries at most (each entry is accepted with
#: probability above 0.95 per round, so a draw in range never comes near): an entry still refused
#: after them gives its row NaN instead of a loop without end.
_MAX_ROUNDS = 1000


def concentration_range(dtype) -> tuple[float, float]:
    """``(low, high)``: the concentrations ``random_markov_chain`` draws in ``dtype``: up to
    the largest finite number (above it the dtype holds infinity), from ``-log(tiny) / max``
    (below it a gamma variate's ``log(u) / alpha`` overflows: rows of NaN; at the bound the
    rows are one-hot to the dtype's precision). ``[2.6e-37, 3.4e38]`` in float32."""
    info = jnp.finfo(dtype)
    return float(-np.log(float(info.tiny)) / float(info.max)), float(info.max)
