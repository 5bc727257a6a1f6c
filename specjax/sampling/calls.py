"""The Monte Carlo engine of call-level decoders (block verification, token trees).

A chain is a sequence of target calls. A call from position ``n`` after token ``prev`` draws its
``U = decoder.num_uniforms`` uniforms, asks the decoder for its outcome
(``decoder.sample_call``: the emitted tokens, how many drafts were kept, whether the last token
came after a rejection) and writes the tokens it emits at positions ``n .. n + kept`` (those
beyond ``T`` are dropped: the sequence ends). At most ``T`` calls are needed, since each emits
at least one token; finished chains do nothing.

Random numbers: call ``m`` of chain ``c`` uses the Threefry hash of the counters
``c U + j`` (``j < U``) under ``fold_in(key_calls, m)``, so a chain's numbers depend on its index
alone: chunks and device layouts cannot change a token, as in the token-wise engine.

Walks (``decoder.has_walk``: token trees). A call that is a walk down a tree, one node per
position, needs no scan over calls: the chains advance in lockstep one *position* per step, as
in the token-wise engine, each from its own node (the root opens a call). The laws of a position
are built once for all chains (``decoder.walk_tables``), and a chain-step is integer work on them
(``decoder.walk_step``): no work for levels or calls a chain does not reach. Position ``n`` of
chain ``c`` uses the counters ``c U + j`` (``j < U = decoder.walk_uniforms``) under
``fold_in(key_steps, n)``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from specjax.decoders.draws import int31
from specjax.sampling import engine
from specjax.sampling import sharding as _sharding
from specjax.sampling.engine import DecodingTrace

__all__ = ["call_trace", "simulate_calls", "write_call"]


def write_call(horizon: int, record, n, active, emitted, kept, last_rejected):
    """Writes one call's outcome into one chain's trace; also the engine of batched scoring.

    Args:
      horizon: ``T``.
      record: ``(tokens (T + 1,), rejected (T,), bonus (T,), new_call (T,))`` of the chain.
      n: the position of the call's first token; ``active``: ``n <= T``.
      emitted: ``(K + 1,)`` the call's tokens, of which ``kept + 1`` are emitted (those beyond
        ``T`` dropped).
      last_rejected: whether the last emitted token came after a rejection.

    Returns:
      ``(record, the next call's position)``.
    """
    tokens, rejected, bonus, new_call = record
    offsets = jnp.arange(emitted.shape[0], dtype=jnp.int32)
    keep = active & (offsets <= kept) & (n + offsets <= horizon)
    tokens = tokens.at[jnp.where(keep, n + offsets, horizon + 1)].set(emitted, mode="drop")
    end = n + kept  # the position of the last token
    last_at = jnp.where(active & (end <= horizon), end - 1, horizon)
    rejected = rejected.at[last_at].set(last_rejected, mode="drop")
    bonus = bonus.at[last_at].set(~last_rejected, mode="drop")
    new_call = new_call.at[jnp.where(active, n - 1, horizon)].set(True, mode="drop")
    return (tokens, rejected, bonus, new_call), jnp.where(active, end + 1, n)


def _write_call(decoder, tables, horizon: int, carry, u):
    """One call of one chain: the decoder's outcome written into the chain's trace."""
    tokens, rejected, bonus, new_call, n, prev, state = carry
    active = n <= horizon
    if decoder.num_call_states > 1:  # a state carried from call to call (a draft schedule)
        emitted, kept, last_rejected = decoder.sample_call(tables, n, prev, u, state=state)
        state = jnp.where(active, decoder.next_call_state(state, kept), state).astype(jnp.int32)
    else:
        emitted, kept, last_rejected = decoder.sample_call(tables, n, prev, u)
    record, next_n = write_call(horizon, (tokens, rejected, bonus, new_call), n, active,
                                emitted, kept, last_rejected)
    return (*record, next_n, jnp.where(active, emitted[kept], prev), state)


@functools.partial(jax.jit, static_argnames=("num_chains", "sharding"))
def simulate_calls(key, decoder, draft, target, offset, *, num_chains,
                   sharding=None):
    """Runs chains ``offset .. offset + C - 1`` of a call-level decoder on ``MarkovChain``s.

    Args:
      key: a JAX PRNG key.
      decoder: a call-level decoder whose ``lookahead`` is already at most ``T``.
      draft, target: ``MarkovChain``s.
      offset: index of the first chain (traced).
      num_chains: ``C`` (static).
      sharding: a ``NamedSharding`` of the chain axis, or ``None``.

    Returns:
      ``(DecodingTrace, verified)``; ``verified (C, T)``: a draft was verified at the position
      (it is not a bonus token).
    """
    if decoder.has_walk:
        return _simulate_walks(key, decoder, draft, target, offset, num_chains, sharding)
    horizon = target.horizon
    uniforms = decoder.num_uniforms
    key_init, key_calls = jax.random.split(key)
    x0 = engine.first_tokens(key_init, target.init, offset, num_chains, sharding)
    tables = decoder.prepare(draft, target)
    call = functools.partial(_write_call, decoder, tables, horizon)
    first = jnp.asarray(offset, jnp.uint32) * jnp.uint32(uniforms)

    def step(carry, m):
        bits = engine.chain_bits(jax.random.fold_in(key_calls, m), first, num_chains * uniforms)
        u = _sharding.constrain(int31(bits).reshape(num_chains, uniforms), sharding)
        return jax.vmap(call)(carry, u), None

    tokens = jnp.zeros((num_chains, horizon + 1), jnp.int32).at[:, 0].set(x0)
    flags = jnp.zeros((num_chains, horizon), bool)
    flags = _sharding.constrain(flags, sharding)
    ones = _sharding.constrain(jnp.ones((num_chains,), jnp.int32), sharding)
    carry = (_sharding.constrain(tokens, sharding), flags, flags, flags, ones, x0,
             ones * jnp.int32(decoder.initial_call_state))
    (tokens, rejected, bonus, new_call, *_), _ = jax.lax.scan(step, carry, jnp.arange(horizon))
    return call_trace((tokens, rejected, bonus, new_call), sharding)


def _simulate_walks(key, decoder, draft, target, offset, num_chains: int, sharding):
    """``simulate_calls`` for a decoder that walks its calls one position at a time."""
    horizon, num_states = target.horizon, target.num_states
    uniforms = decoder.walk_uniforms
    key_init, key_steps = jax.random.split(key)
    x0 = engine.first_tokens(key_init, target.init, offset, num_chains, sharding)
    first = jnp.asarray(offset, jnp.uint32) * jnp.uint32(uniforms)
    token_dtype = engine.small_int_dtype(num_states)

    def step(carry, n):
        tables = decoder.walk_tables(draft, target, n)
        bits = engine.chain_bits(jax.random.fold_in(key_steps, n), first, num_chains * uniforms)
        u = _sharding.constrain(int31(bits).reshape(num_chains, uniforms), sharding)
        token, state, rejected, new_call, bonus = jax.vmap(
            functools.partial(decoder.walk_step, tables))(*carry, u)
        return (token, state), (token.astype(token_dtype), rejected, new_call, bonus)

    state = jax.tree_util.tree_map(
        lambda a: _sharding.constrain(jnp.broadcast_to(a, (num_chains,) + a.shape), sharding),
        decoder.walk_start())
    _, (tokens, rejected, new_call, bonus) = jax.lax.scan(step, (x0, state),
                                                           jnp.arange(horizon))
    tokens = jnp.concatenate([x0[:, None], tokens.T.astype(jnp.int32)], axis=1)
    return call_trace(tuple(_sharding.constrain(a, sharding)
                            for a in (tokens, rejected.T, bonus.T, new_call.T)), sharding)


def call_trace(record, sharding=None):
    """``(DecodingTrace, verified)`` of the records ``write_call`` filled: a position was
    verified unless it holds a bonus token."""
    tokens, rejected, bonus, new_call = record
    return DecodingTrace(
        tokens=tokens,
        rejected=rejected,
        num_rejections=jnp.sum(rejected, axis=-1, dtype=jnp.int32),
        num_calls=jnp.sum(new_call, axis=-1, dtype=jnp.int32),
        new_call=new_call,
        # Split by chain as the other fields are (a constant alone would be replicated).
        num_emitted=_sharding.constrain(
            jnp.full(tokens.shape[:1], tokens.shape[1] - 1, jnp.int32), sharding),
    ), ~bonus
