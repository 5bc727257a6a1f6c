"""The verification rule of rejection-based decoding (Algorithm 2), written once.

One verification step sees a draft row ``p`` and a target row ``q`` (both ``(..., V)``), draws a
draft token ``x ~ p``, accepts it with probability ``b(x)`` and otherwise draws the token from a
residual distribution ``P``. Its outcome is the pair (token, rejected?), whose law is

    P(token = x, accepted) = b(x) p(x)
    P(token = x, rejected) = (1 - sum_y b(y) p(y)) P(x).

``verification_law`` returns these two ``(..., V)`` mass vectors. Every sampler in specjax (SD,
lookahead K, batch SD, biased SD, the general framework) draws its tokens from laws built here, and
the exact theory sums the same masses, so the accept/residual rule exists in exactly one place.

Numerics: no bare division. Normalisation goes through ``safe_normalize`` (the double-``where``
idiom), so an all-zero residual (``p = q``) gives zeros with finite gradients, and ``p(x) = 0``
gives a finite acceptance probability.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class VerificationLaw(NamedTuple):
    """Joint law of one verification step's outcome.

    Attributes:
      accepted: ``(..., V)``; ``P(token = x and the draft was accepted)`` (or, for a bonus or
        autoregressive step, the probability of a token produced without rejection).
      rejected: ``(..., V)``; ``P(token = x and it was drawn after a rejection)``.
    """

    accepted: jax.Array  # shape=(..., V)
    rejected: jax.Array  # shape=(..., V)


def safe_normalize(w: jax.Array) -> jax.Array:
    """``w / sum(w)`` over the last axis; all zeros (value and gradient finite) when the sum is 0."""
    total = jnp.sum(w, axis=-1, keepdims=True)
    positive = total > 0
    safe_total = jnp.where(positive, total, jnp.ones_like(total))
    return jnp.where(positive, w / safe_total, jnp.zeros_like(w))


def _safe_ratio(num: jax.Array, den: jax.Array, fill) -> jax.Array:
    """``num / den`` where ``den > 0``, ``fill`` elsewhere, with finite gradients."""
    positive = den > 0
    safe_den = jnp.where(positive, den, jnp.ones_like(den))
    return jnp.where(positive, num / safe_den, jnp.full_like(num, fill))


def residual_distribution(q: jax.Array, p: jax.Array) -> jax.Array:
    """Normalised ``[q - p]_+``: the law SD resamples from after a rejection.

    Args:
      q: ``(..., V)`` target probabilities.
      p: ``(..., V)`` draft probabilities.

    Returns:
      ``(..., V)``; all zeros (finite value and gradient) when ``[q - p]_+`` has no mass, which
      happens exactly when ``p = q`` (and then SD never rejects).

    References:
      Section 2.1 of the paper; Algorithm 1, line 8.
    """
    return safe_normalize(jnp.maximum(q - p, 0))


def speculative_acceptance(p: jax.Array, q: jax.Array) -> jax.Array:
    """SD's acceptance probability ``min(1, q / p)``; 1 where ``p = 0`` (never drafted)."""
    return jnp.minimum(1, _safe_ratio(q, p, 1))


def acceptance_probability(p: jax.Array, q: jax.Array, *, epsilon) -> jax.Array:
    """Biased acceptance ``b = min(1, (q + eps) / p)``; finite (1) where ``p = 0``.

    Args:
      p: ``(..., V)`` draft probabilities.
      q: ``(..., V)`` target probabilities.
      epsilon: over-acceptance ``eps >= 0``; ``eps = 0`` is SD.

    References:
      Section 4 of the paper (Figure 3), ``b(x) = min{1, (q(x) + eps) / p(x)}``.
    """
    return jnp.minimum(1, _safe_ratio(q + epsilon, p, 1))


def optimal_residual(p: jax.Array, q: jax.Array, accept_prob: jax.Array) -> jax.Array:
    """Theorem 4's optimal rejection distribution ``P* = [A]_+ / sum [A]_+``.

    With ``A(x) = (q(x) - b(x) p(x)) / sum_y (1 - b(y)) p(y)``, normalising ``[A]_+`` is the same as
    normalising ``[q - b p]_+``, which needs no division by the rejection probability.

    Args:
      p: ``(..., V)`` draft probabilities.
      q: ``(..., V)`` target probabilities.
      accept_prob: ``(..., V)`` acceptance probabilities ``b``.

    Returns:
      ``(..., V)``; zeros when ``[q - b p]_+`` has no mass (then ``b p = q`` and no rejection
      can happen).

    References:
      Theorem 4 (Optimal solution to optimization (2)); Decoding-OPT of Section 4.
    """
    return safe_normalize(jnp.maximum(q - accept_prob * p, 0))


def verification_law(p: jax.Array, accept_prob: jax.Array, residual: jax.Array) -> VerificationLaw:
    """The joint law of (token, rejected) of one step of Algorithm 2.

    Args:
      p: ``(..., V)`` draft probabilities (the token verified is drawn from ``p``).
      accept_prob: ``(..., V)`` acceptance probabilities ``b`` in ``[0, 1]``.
      residual: ``(..., V)`` rejection distribution ``P``; normalised here (so ``[q - p]_+``
        unnormalised is fine), all-zero allowed where rejection is impossible.

    Returns:
      ``VerificationLaw(accepted=b p, rejected=(1 - sum b p) P)``.

    References:
      Algorithm 2 (Framework for Rejection-based Decoding), lines 9-11.
    """
    accepted = accept_prob * p
    reject_mass = jnp.maximum(1 - jnp.sum(accepted, axis=-1, keepdims=True), 0)
    return VerificationLaw(accepted, reject_mass * safe_normalize(residual))


def speculative_law(p: jax.Array, q: jax.Array) -> VerificationLaw:
    """One SD verification step: ``b = min(1, q / p)``, residual ``[q - p]_+`` (Algorithm 1)."""
    return verification_law(p, speculative_acceptance(p, q), residual_distribution(q, p))


def bonus_law(q: jax.Array) -> VerificationLaw:
    """A token drawn straight from the target (bonus token, autoregressive step): never rejected."""
    return VerificationLaw(q, jnp.zeros_like(q))


def batch_root_law(p: jax.Array, q: jax.Array, num_drafts: int) -> VerificationLaw:
    """The first token after a target call in batch SD: ``M`` drafts verified in turn.

    Draft ``m`` is verified by SD against ``q^m``, where ``q^1 = q`` and
    ``q^{m+1} = [q^m - p]_+`` (normalised). If all ``M`` are rejected the token is drawn from
    ``q^{M+1}``, as in the appendix proof of unbiasedness (step 1). Algorithm 4's pseudo-code, read
    literally, would draw it from ``q^{M+2}``, which is biased; specjax follows the proof.

    The masses are carried un-normalised (``w^1 = q``, ``w^{m+1} = s_m [q^m - p]_+``, with
    ``s_m = sum w^m`` the probability that the first ``m - 1`` drafts were rejected), so the
    returned ``rejected`` mass is ``w^{M+1}``, summing to ``prod_m TV(q^m, p)``.

    Args:
      p: ``(..., V)`` draft probabilities.
      q: ``(..., V)`` target probabilities.
      num_drafts: ``M >= 1`` (static).

    References:
      Algorithm 4 and Theorem "Unbiasedness of batch SD" (appendix), Theorem 3.
    """
    accepted = jnp.zeros_like(q)
    reach = jnp.ones_like(q[..., :1])  # s_m: probability that drafts 1..m-1 were all rejected
    q_m = q
    for _ in range(num_drafts):
        law = speculative_law(p, q_m)
        accepted = accepted + reach * law.accepted
        w = reach * law.rejected
        reach = jnp.sum(w, axis=-1, keepdims=True)
        q_m = safe_normalize(w)
    return VerificationLaw(accepted, w)  # w^{M+1} = s_{M+1} q^{M+1}
