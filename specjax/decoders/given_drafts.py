"""The given-drafts kernel: verify ``K`` given drafts per request with a decoder's own rule.

One function, shared by ``specjax.verify_drafts`` (``specjax.auditing.given``, which documents the
convention and adds the input checks and the exact law) and by batched target scoring
(``specjax.sampling.blocks``), so the verification rule is written once for both.

* Token-wise decoders with one draft per position read their verification law
  (``decoder.laws(p, q)``): accept draft ``x_j`` iff ``u_j p_j(x_j) < a_j(x_j)``, else the inverse
  CDF of the rejected mass at ``v_j``; after ``K_b`` acceptances the bonus from ``q_{K_b}``.
* ``BlockVerification`` reads its backward pass (``specjax.decoders.block.block_levels``).

Outputs are padded with ``PAD``; ``end_outputs`` applies stop tokens and a dropped bonus.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from specjax.decoders.base import TokenwiseDecoder
from specjax.decoders.block import block_levels
from specjax.decoders.draws import inverse_cdf as _inverse_cdf
from specjax.decoders.draws import mass_or_target as _mass_or_target
from specjax.decoders.planning import resolve_decoder

__all__ = [
    "Inputs",
    "PAD",
    "Verified",
    "accept_test",
    "block_rows",
    "check_given_decoder",
    "drafted_rows",
    "end_outputs",
    "residual_rows",
    "verify_given",
]


#: The id that pads ``Verified.tokens`` after the last emitted token.
PAD = -1


class Verified(NamedTuple):
    """What ``verify_drafts`` returns (leading ``B`` only for batched input).

    Attributes:
      tokens: ``(B, K + 1)`` int32; request ``b`` emits ``tokens[b, :num_emitted[b]]``: its
        accepted drafts, then the recovered or bonus token, ``-1`` after. Without stop tokens and
        with the bonus, ``num_emitted = num_accepted + 1``.
      num_accepted: ``(B,)`` int32; accepted drafts among the emitted tokens, ``0..K_b``.
      bonus: ``(B,)`` bool; whether the last token is the bonus (all ``K_b`` drafts accepted and
        the bonus emitted; always true for ``K_b = 0``, whose one token is the target's).
      num_emitted: ``(B,)`` int32; tokens emitted, ``1..K_b + 1``.
      stopped: ``(B,)`` bool; whether the output ends at a stop token (tokens verified after it
        are dropped).
    """

    tokens: jax.Array  # shape=(B, K + 1), int32
    num_accepted: jax.Array  # shape=(B,), int32
    bonus: jax.Array  # shape=(B,), bool
    num_emitted: jax.Array  # shape=(B,), int32
    stopped: jax.Array  # shape=(B,), bool



class Inputs(NamedTuple):
    tokens: jax.Array  # (B, K) int32, padded ids clipped into range
    draft_probs: jax.Array | None  # (B, K, V) or None
    target_probs: jax.Array  # (B, K + 1, V)
    num_drafts: jax.Array  # (B,) int32
    batched: bool


def check_given_decoder(decoder) -> None:
    """Raise ``ValueError`` unless ``decoder`` verifies one given draft per position."""
    resolve_decoder(decoder)
    if decoder.verifies_jointly:
        return
    if not isinstance(decoder, TokenwiseDecoder) or not decoder.same_root \
            or decoder.num_drafts != 1 or decoder.binds_models:
        raise ValueError(
            f"decoder must verify one given draft per position with a law of its rows alone "
            f"(specjax.Speculative(), specjax.BiasedSpeculative(eps), a specjax.RejectionRule) "
            f"or a block (specjax.BlockVerification); got {decoder!r}, which drafts several "
            f"sequences or a tree (see specjax.verify_tree for token trees and batch SD), or "
            f"depends on the whole models: it has no given-drafts form yet")


def drafted_rows(inputs: Inputs):
    """``(p, q)`` of the drafted positions, ``p`` the one-hot of the drafts when not given."""
    q = inputs.target_probs
    lookahead = inputs.tokens.shape[1]
    p = inputs.draft_probs
    if p is None:
        p = jax.nn.one_hot(inputs.tokens, q.shape[-1], dtype=q.dtype)
    return p, q[:, :lookahead]


def _gather(rows, tokens):
    return jnp.take_along_axis(rows, tokens[..., None], axis=-1)[..., 0]


def accept_test(decoder, law, p, q, tokens):
    """``(scale, mass)`` at the drafts: accept iff ``u * scale < mass``. In general
    ``(p(x), a(x))`` with ``a`` the accepted mass (a draft with ``p(x) = 0`` is rejected); for a
    rule whose test ignores the draft's probabilities (``reads_draft_probs = False``: typical
    acceptance, SGLang's thresholds), ``(1, b(x))`` from its ``acceptance(p, q)``."""
    if decoder.reads_draft_probs:
        return _gather(p, tokens), _gather(law.accepted, tokens)
    b = _gather(decoder.acceptance(p, q), tokens)
    return jnp.ones_like(b), b


def residual_rows(decoder, p, q, tokens, rejected):
    """The masses the token is drawn from after rejecting ``tokens``: the decoder's rejected
    mass, or, for a rule whose residual depends on the rejected draft (SGLang's threshold
    verification), its ``residual_given_draft(p, q, x)``."""
    if not decoder.has_residual_given_draft:
        return rejected
    return decoder.residual_given_draft(p, q, tokens)


@functools.partial(jax.jit, static_argnames="with_bonus")
def verify_given(decoder, inputs: Inputs, u, v, stop, with_bonus) -> Verified:
    tokens, q, counts = inputs.tokens, inputs.target_probs, inputs.num_drafts
    num_requests, lookahead = tokens.shape
    rows = jnp.arange(num_requests)
    if decoder.verifies_jointly:
        return _verify_block(inputs, u, v, stop, with_bonus)
    if lookahead:
        p, q_drafted = drafted_rows(inputs)
        law = decoder.laws(p, q_drafted)[1]
        scale, mass = accept_test(decoder, law, p, q_drafted, tokens)
        keep = u * scale < mass
        keep &= jnp.arange(lookahead)[None] < counts[:, None]
        num_accepted = jnp.sum(jnp.cumprod(keep, axis=1), axis=1).astype(jnp.int32)
        at = jnp.minimum(num_accepted, lookahead - 1)
        rejected = residual_rows(decoder, p[rows, at], q_drafted[rows, at],
                                 tokens[rows, at], law.rejected[rows, at])
    else:
        num_accepted = jnp.zeros((num_requests,), jnp.int32)
        rejected = q[:, 0]
    bonus = num_accepted == counts
    q_last = q[rows, num_accepted]
    w = jnp.where(bonus[:, None], q_last, jax.vmap(_mass_or_target)(rejected, q_last))
    last = jax.vmap(_inverse_cdf)(v[rows, num_accepted], jnp.ones_like(v[:, 0]), w)
    position = jnp.arange(lookahead + 1)[None]
    padded = jnp.concatenate([tokens, jnp.zeros((num_requests, 1), jnp.int32)], axis=1)
    out = jnp.where(position < num_accepted[:, None], padded,
                    jnp.where(position == num_accepted[:, None], last[:, None], PAD))
    return end_outputs(out.astype(jnp.int32), num_accepted, counts, stop, with_bonus)



def block_rows(inputs: Inputs):
    """Block verification's ``(h (B, K), last rows (B, K + 1, V))``: the stopping probability of
    each level (``block.block_levels``) and the law of the last token when ``tau = n``."""
    tokens, q, counts = inputs.tokens, inputs.target_probs, inputs.num_drafts
    lookahead = tokens.shape[1]
    p, q_drafted = drafted_rows(inputs)
    h, residual = jax.vmap(block_levels)(p, q_drafted, tokens, counts)
    residual = jax.vmap(jax.vmap(_mass_or_target))(residual, q_drafted)
    rows = jnp.concatenate([residual, q[:, lookahead:]], axis=1)
    bonus_row = jnp.arange(lookahead + 1)[None] == counts[:, None]
    return h, jnp.where(bonus_row[..., None], q, rows)


def _verify_block(inputs: Inputs, u, v, stop, with_bonus) -> Verified:
    """Block verification of given drafts: level ``i`` (``1..K_b``) is kept iff
    ``u_{i-1} < h_i``; ``tau`` is the largest kept level (the backward pass), the last token
    the inverse CDF of ``r_tau`` (or of ``q_{K_b}`` at ``tau = K_b``) at ``v_tau``."""
    tokens, counts = inputs.tokens, inputs.num_drafts
    num_requests, lookahead = tokens.shape
    rows = jnp.arange(num_requests)
    if lookahead:
        h, last_rows = block_rows(inputs)
        levels = jnp.arange(1, lookahead + 1)[None]
        tau = jnp.max(jnp.where(u < h, levels, 0), axis=1).astype(jnp.int32)
    else:
        last_rows, tau = inputs.target_probs, jnp.zeros((num_requests,), jnp.int32)
    last = jax.vmap(_inverse_cdf)(v[rows, tau], jnp.ones_like(v[:, 0]), last_rows[rows, tau])
    position = jnp.arange(lookahead + 1)[None]
    padded = jnp.concatenate([tokens, jnp.zeros((num_requests, 1), jnp.int32)], axis=1)
    out = jnp.where(position < tau[:, None], padded,
                    jnp.where(position == tau[:, None], last[:, None], PAD))
    return end_outputs(out.astype(jnp.int32), tau, counts, stop, with_bonus)



def end_outputs(out, num_accepted, counts, stop, with_bonus):
    """Outputs after the endings: a dropped bonus (``with_bonus=False``, ``K_b >= 1``) and the
    first stop token (the tokens after it dropped)."""
    position = jnp.arange(out.shape[1])[None]
    length = num_accepted + 1
    if not with_bonus:
        length = jnp.where((num_accepted == counts) & (counts > 0), num_accepted, length)
    stopped = jnp.zeros(out.shape[:1], bool)
    if stop.shape[0]:  # static: no stop token, no search (XLA would fold it slowly)
        is_stop = jnp.isin(out, stop) & (position < length[:, None])
        stopped = jnp.any(is_stop, axis=1)
        length = jnp.where(stopped, jnp.argmax(is_stop, axis=1) + 1, length)
    length = length.astype(jnp.int32)
    out = jnp.where(position < length[:, None], out, PAD)
    bonus = (num_accepted == counts) & (length == num_accepted + 1)
    return Verified(out, jnp.minimum(num_accepted, length), bonus, length, stopped)
