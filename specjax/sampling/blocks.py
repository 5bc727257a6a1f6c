"""Batched target scoring: the protocol engine that scores a call's drafts in one evaluation.

``decode(..., batched_scoring=True)`` runs a token-wise decoder with one draft per position as a
serving engine does, one call at a time. Per call and chain:

1. the draft proposes ``K`` tokens, one ``probs``/``update`` at a time (inverse CDF of its row);
2. the target scores the ``K`` drafted positions and the one after them in one evaluation,
   ``probs_block(state, drafts) -> (K + 1, V)`` (``specjax.models.autoregressive.probs_block``:
   the model's own when it defines one, else a scan of ``probs`` and ``update``);
3. the drafts are verified by the given-drafts kernel of ``specjax.decoders.given_drafts``
   (the one verification rule, also ``specjax.verify_drafts``'s: the decoder's ``laws``),
   which returns the accepted prefix and the recovered or bonus token;
4. both models advance by the emitted tokens: the draft from its state after the accepted
   prefix, the target by ``update`` over the emitted tokens.

Its output law is the token-wise engine's (``specjax.sampling.models``): drafting a whole
lookahead and then verifying it has the law of drafting each token only when it is verified.
Its tokens differ for the same key (it uses different random numbers). The tokens of a call that
fall beyond ``T`` are dropped, as in the call-level engine (``specjax.sampling.calls``, whose
``write_call`` writes the trace); the loop ends when every chain has reached ``T``.

Random numbers: call ``m`` of chain ``c`` uses ``U = 3K + 1`` uniforms (``K`` to draft, ``K``
to accept, ``K + 1`` for the recovered or bonus token), the Threefry hash of the counters
``c U + j`` under ``fold_in(key_calls, m)``: a chain's numbers depend on its index alone, so
chunks and device layouts cannot change a token.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from specjax._pytree import tree_where
from specjax.decoders import given_drafts as given
from specjax.decoders.draws import inverse_cdf as _inverse_cdf
from specjax.models.autoregressive import probs_block
from specjax.sampling import engine
from specjax.sampling import models
from specjax.sampling import sharding as _sharding
from specjax.sampling.calls import call_trace
from specjax.sampling.calls import write_call

__all__ = ["call_words", "simulate_blocks", "uniforms_per_call", "unit_uniforms"]


def uniforms_per_call(lookahead: int) -> int:
    """``3K + 1``: the uniforms one call of one chain uses."""
    return 3 * lookahead + 1


def call_words(lookahead: int, num_states: int) -> int:
    """The 4-byte words a chain's call holds at once: its ``2K + 1`` rows (``K`` draft,
    ``K + 1`` target) and their temporaries, counted three times over (``decode``'s memory
    estimate and ``decoding_statistics``' default chunk size)."""
    return 3 * (2 * lookahead + 1) * num_states


def unit_uniforms(bits: jax.Array, dtype) -> jax.Array:
    """Uniforms on ``[0, 1)`` in ``dtype`` from 32 random bits: the top 24 bits in float32 (its
    mantissa, so that no value rounds up to 1), all 32 in float64."""
    if jnp.finfo(dtype).nmant < 32:
        return (bits >> 8).astype(dtype) * jnp.asarray(2.0**-24, dtype)
    return bits.astype(dtype) * jnp.asarray(2.0**-32, dtype)


def _draft(draft, state, u):
    """One chain's ``K`` drafts: tokens ``(K,)``, rows ``(K, V)`` and the ``K + 1`` states
    (stacked: after each prefix of the drafts)."""

    def step(s, uj):
        p = draft.probs(s)
        x = _inverse_cdf(uj, jnp.ones_like(uj), p.astype(uj.dtype))
        return draft.update(s, x), (x, p, s)

    last, (tokens, rows, states) = jax.lax.scan(step, state, u)
    states = jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a, b[None]]), states, last)
    return tokens, rows, states


def _advance(model, state, tokens, count):
    """The state after ``update`` with ``tokens[:count]``."""

    def step(s, jx):
        j, x = jx
        return tree_where(j < count, model.update(s, x), s), None

    positions = jnp.arange(tokens.shape[0], dtype=jnp.int32)
    return jax.lax.scan(step, state, (positions, tokens))[0]


def _row_flags(rows, n, horizon: int):
    """Whether any of ``rows (C, J, V)`` that the run reads is not a law
    (``specjax.sampling.models._invalid_row``): row ``j`` of a chain at position ``n`` serves
    position ``n + j``, read only up to ``T`` (a call's rows beyond the horizon are dropped
    with its tokens, as the token-wise engine never computes them)."""
    bad = jax.vmap(jax.vmap(models._invalid_row))(rows)
    read = n[:, None] + jnp.arange(rows.shape[1])[None, :] <= horizon
    return jnp.max((bad & read).astype(jnp.int32)) > 0  # max: XLA:CPU shards no reduce_or


@functools.partial(jax.jit, static_argnames=("num_chains", "horizon", "lookahead", "sharding"))
def _simulate_blocks(key, decoder, draft, target, offset, *, num_chains, horizon, lookahead,
                     sharding=None):
    """``simulate_blocks`` under ``jit``, with a third output: bit 1 (2) set when a draft
    (target) row met during the run was not a law."""
    key_init, key_calls = jax.random.split(key)
    x0 = engine.first_tokens(key_init, target.probs(target.init_state()), offset, num_chains,
                             sharding)
    draft_states = jax.vmap(draft.update, in_axes=(None, 0))(draft.init_state(), x0)
    target_states = jax.vmap(target.update, in_axes=(None, 0))(target.init_state(), x0)
    dtype = jnp.promote_types(models.trace_dtype(target), jnp.float32)
    per_call = uniforms_per_call(lookahead)
    first = jnp.asarray(offset, jnp.uint32) * jnp.uint32(per_call)
    no_stop = jnp.zeros((0,), jnp.int32)
    write = jax.vmap(functools.partial(write_call, horizon))

    def call(carry):
        m, record, n, draft_states, target_states, invalid = carry
        bits = engine.chain_bits(jax.random.fold_in(key_calls, m), first, num_chains * per_call)
        u = _sharding.constrain(unit_uniforms(bits, dtype).reshape(num_chains, per_call),
                                sharding)
        tokens, p, states = jax.vmap(functools.partial(_draft, draft))(draft_states,
                                                                         u[:, :lookahead])
        q = jax.vmap(functools.partial(probs_block, target))(target_states, tokens)
        invalid = invalid | jnp.where(_row_flags(p, n, horizon), 1, 0) \
            | jnp.where(_row_flags(q, n, horizon), 2, 0)
        inputs = given.Inputs(tokens, p.astype(dtype), q.astype(dtype),
                               jnp.full((num_chains,), lookahead, jnp.int32), None)
        out = given.verify_given(decoder, inputs, u[:, lookahead:2 * lookahead],
                            u[:, 2 * lookahead:], no_stop, True)
        kept = out.num_accepted
        emitted = jnp.maximum(out.tokens, 0)  # the padding (-1) lies beyond kept: never written
        active = n <= horizon
        record, next_n = write(record, n, active, emitted, kept, ~out.bonus)
        rows = jnp.arange(num_chains)
        last = emitted[rows, kept]
        after = jax.vmap(lambda s, k, y: draft.update(
            jax.tree_util.tree_map(lambda a: a[k], s), y))(states, kept, last)
        draft_states = jax.vmap(tree_where)(active, after, draft_states)
        moved = jax.vmap(functools.partial(_advance, target))(target_states, emitted, kept + 1)
        target_states = jax.vmap(tree_where)(active, moved, target_states)
        return m + 1, record, next_n, draft_states, target_states, invalid

    def running(carry):
        return jnp.min(carry[2]) <= horizon  # XLA:CPU has no sharded reduce_or

    tokens = jnp.zeros((num_chains, horizon + 1), jnp.int32).at[:, 0].set(x0)
    flags = _sharding.constrain(jnp.zeros((num_chains, horizon), bool), sharding)
    record = (_sharding.constrain(tokens, sharding), flags, flags, flags)
    ones = _sharding.constrain(jnp.ones((num_chains,), jnp.int32), sharding)
    carry = (jnp.int32(0), record, ones, draft_states, target_states, jnp.int32(0))
    _, record, _, _, _, invalid = jax.lax.while_loop(running, call, carry)
    return (*call_trace(record, sharding), invalid)


def simulate_blocks(key, decoder, draft, target, offset, *, num_chains, horizon, lookahead,
                    sharding=None):
    """Runs chains ``offset .. offset + C - 1`` of a token-wise decoder with batched scoring.

    Arguments and result as ``specjax.sampling.models.simulate_models`` (``lookahead >= 1``; the
    decoder verifies one given draft per position, ``specjax.decoders.given_drafts``). A row that is
    not a law, met during the run, raises the same ``ValueError`` after it.
    """
    trace, verified, invalid = _simulate_blocks(
        key, decoder, draft, target, offset, num_chains=num_chains, horizon=horizon,
        lookahead=lookahead, sharding=sharding)
    models.raise_invalid(invalid, draft, target)
    return trace, verified
