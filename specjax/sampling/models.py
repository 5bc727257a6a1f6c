"""The Monte Carlo engine of token-wise decoders for any autoregressive model (``specjax.models``).

Why the Markov engine's argument carries over. Drafting a whole lookahead and then verifying it
in order has the same law as drafting each token only when it is verified: the draft of position
``n + 1`` is conditioned on the drafted prefix, which equals the accepted prefix whenever it is
verified at all, and a draft that is never verified influences nothing. So a decoder is still a
Markov chain, now over ``(draft state, target state, phase j)``, with the phases of
``specjax.sampling.engine``. Each position draws its outcome (token, rejected) from the decoder's
laws built on the chain's own rows ``p = draft.probs(draft state)``, ``q = target.probs(target
state)``, with the Markov engine's draw (one 31-bit uniform per chain-step from ``chain_bits``,
integer thresholds, binary search) and its phase state machine: with the same rows it draws the
same tokens as ``specjax.sampling.engine.simulate``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from specjax import _checks
from specjax.decoders import verification
from specjax.decoders.draws import categorical_thresholds
from specjax.decoders.draws import int31
from specjax.sampling import engine
from specjax.sampling import sharding as _sharding
from specjax.sampling.engine import DecodingTrace

__all__ = ["raise_invalid", "simulate_models", "trace_dtype"]


def _outcome_masses(decoder, p, q, lookahead: int, phase):
    """The ``2V`` masses (accepted | rejected) of one chain's position in phase ``j``."""
    if lookahead == 0:  # autoregressive: every position is the target's own draw
        law = verification.bonus_law(q)
        return jnp.concatenate([law.accepted, law.rejected])
    root, verify = decoder.laws(p, q)
    rows = jnp.stack([jnp.concatenate([law.accepted, law.rejected])
                      for law in (root, verify, verification.bonus_law(q))])
    return rows[engine.phase_row(phase, lookahead)]


def _chain_step(decoder, draft, target, lookahead: int, carry, u):
    """One position of one chain: the Markov engine's outcome and phase logic, with the law built
    from the chain's own rows and both states updated with the token."""
    draft_state, target_state, j, num_rejections, num_calls, invalid = carry
    q = target.probs(target_state)
    p = draft.probs(draft_state)
    num_states = q.shape[-1]
    invalid = invalid | jnp.where(_invalid_row(p), 1, 0) | jnp.where(_invalid_row(q), 2, 0)
    masses = _outcome_masses(decoder, p, q, lookahead, j)
    thresholds = categorical_thresholds(masses)
    token, rejected = engine.outcome(lambda i: thresholds[i], u, thresholds.shape[-1],
                                     num_states)
    next_j, new_call, verified = engine.advance(j, rejected, lookahead)
    carry = (draft.update(draft_state, token), target.update(target_state, token), next_j,
             num_rejections + rejected, num_calls + new_call, invalid)
    return carry, (token, rejected, new_call, verified)


def _invalid_row(row):
    """Whether a model's row is not a law: a negative or NaN entry, or a sum off one by more
    than the dtype's tolerance (``specjax._checks.row_sum_tolerance``)."""
    tol = _checks.row_sum_tolerance(row.dtype)
    total = jnp.sum(row.astype(jnp.promote_types(row.dtype, jnp.float32)))
    return jnp.any(~(row >= 0)) | ~(jnp.abs(total - 1) <= tol)


def simulate_models(key, decoder, draft, target, offset, *, num_chains, horizon, lookahead,
                    sharding=None):
    """Runs chains ``offset .. offset + C - 1`` of a token-wise decoder on protocol models.

    A model is probed on a few states before a run (``specjax.models.checks.probe_rows``); every
    row the run meets is checked as well, and a row that is not a law (negative, NaN, not
    summing to one) raises a ``ValueError`` after the run, naming the model. Under a caller's own
    ``jax.jit`` that flag is a tracer and the check is skipped.

    Args:
      key: a JAX PRNG key.
      decoder: a token-wise decoder (a pytree; its static settings select the compilation).
      draft: the draft model ``p`` (``specjax.models.AutoregressiveModel``); for autoregressive
        decoding pass the target.
      target: the target model ``q``, with the same ``V``; ``x_0`` is drawn from its
        ``probs(init_state())``.
      offset: index of the first chain (traced).
      num_chains: ``C`` (static).
      horizon: ``T`` (static).
      lookahead: the resolved ``K`` (static; 0 for autoregressive decoding).
      sharding: a ``NamedSharding`` of the chain axis, or ``None``.

    Returns:
      ``(DecodingTrace, verified)``, ``verified (C, T)`` as in the counts; chain ``c`` uses
      element ``c`` of each position's random bits, as the Markov engine.

    Raises:
      ValueError: a model returned a row that is not a law during the run.
    """
    trace, verified, invalid = _simulate_models(
        key, decoder, draft, target, offset, num_chains=num_chains, horizon=horizon,
        lookahead=lookahead, sharding=sharding)
    raise_invalid(invalid, draft, target)
    return trace, verified


def raise_invalid(invalid, draft, target) -> None:
    """Raise the ``ValueError`` of a run that met a row that is not a law: bit 1 (2) of
    ``invalid`` for the draft (target); nothing when it is a tracer (a caller's ``jit``)."""
    if _checks.is_concrete(invalid) and int(invalid):
        names = [name for bit, name in ((2, "target"), (1, "draft")) if int(invalid) & bit]
        if draft is target:
            names = ["target"]
        raise ValueError(
            f"{' and '.join(names)} returned a row that is not a law (a negative or NaN entry, or a sum "
            f"off one by more than {_checks.row_sum_tolerance(trace_dtype(target)):g}) at a "
            f"state reached during the run; the tokens of this run are not valid. Check probs() "
            f"of every state your model can reach (the probe before the run tries only a few)")


def trace_dtype(model):
    """The dtype of a protocol model's rows."""
    return jax.eval_shape(lambda m: m.probs(m.init_state()), model).dtype


@functools.partial(jax.jit, static_argnames=("num_chains", "horizon", "lookahead", "sharding"))
def _simulate_models(key, decoder, draft, target, offset, *, num_chains, horizon, lookahead,
                     sharding=None):
    """``simulate_models`` under ``jit``, with a third output: bit 1 (2) set when
    a draft (target) row met during the run was not a law."""
    key_init, key_steps = jax.random.split(key)
    draft_start, target_start = draft.init_state(), target.init_state()
    x0 = engine.first_tokens(key_init, target.probs(target_start), offset, num_chains, sharding)
    draft_states = jax.vmap(draft.update, in_axes=(None, 0))(draft_start, x0)
    target_states = jax.vmap(target.update, in_axes=(None, 0))(target_start, x0)
    token_dtype = engine.small_int_dtype(target.num_states)
    step = functools.partial(_chain_step, decoder, draft, target, lookahead)

    def scan_step(carry, n):
        bits = engine.chain_bits(jax.random.fold_in(key_steps, n), offset, num_chains, sharding)
        carry, (token, rejected, new_call, verified) = jax.vmap(step)(carry, int31(bits))
        return carry, (token.astype(token_dtype), rejected, new_call, verified)

    zeros = _sharding.constrain(jnp.zeros((num_chains,), jnp.int32), sharding)
    carry0 = (draft_states, target_states, zeros, zeros, zeros,
              jnp.zeros((num_chains,), jnp.int32))
    carry, (tokens, rejected, new_call, verified) = jax.lax.scan(scan_step, carry0,
                                                                 jnp.arange(horizon))
    num_rejections, num_calls = carry[3], carry[4]
    tokens = jnp.concatenate([x0[:, None], tokens.T.astype(jnp.int32)], axis=1)
    return DecodingTrace(tokens=_sharding.constrain(tokens, sharding),
                         rejected=_sharding.constrain(rejected.T, sharding),
                         num_rejections=num_rejections, num_calls=num_calls,
                         new_call=_sharding.constrain(new_call.T, sharding),
                         num_emitted=_sharding.constrain(jnp.full_like(num_calls, horizon),
                                                         sharding)), verified.T, \
        (jnp.max(carry[5] & 1) | jnp.max(carry[5] & 2))  # XLA:CPU has no sharded reduce_or
