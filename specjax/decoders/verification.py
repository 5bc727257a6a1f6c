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

import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp

from specjax import _checks
from specjax.numerics import divide
from specjax.numerics import safe_ratio
from specjax.numerics import tiny

__all__ = [
    "RESIDUALS",
    "VerificationLaw",
    "acceptance_probability",
    "bonus_law",
    "check_residual_name",
    "named_residual_law",
    "optimal_residual",
    "rejection_probability",
    "residual_distribution",
    "safe_normalize",
    "scaled_residual",
    "speculative_law",
    "speculative_residual",
    "tv_distance",
    "tv_loss_star",
    "verification_law",
]


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
    """``w / sum(w)`` over the last axis; all zeros (value and gradient finite) when the sum is 0.

    A sum below the smallest normal float (about 1e-38 in float32) counts as 0, so the division
    and its gradient never overflow.
    """
    total = jnp.sum(w, axis=-1, keepdims=True)
    positive = total >= tiny(total)
    safe_total = jnp.where(positive, total, jnp.ones_like(total))
    return jnp.where(positive, divide(w, safe_total), jnp.zeros_like(w))


def speculative_residual(p: jax.Array, q: jax.Array) -> jax.Array:
    """Normalised ``[q - p]_+``: the law SD resamples from after a rejection (draft first).

    Args:
      p: ``(..., V)`` draft probabilities.
      q: ``(..., V)`` target probabilities.

    Returns:
      ``(..., V)``; all zeros (finite value and gradient) when ``[q - p]_+`` has no mass, which
      happens exactly when ``p = q`` (and then SD never rejects).

    References:
      Section 2.1 of the paper; Algorithm 1, line 8.
    """
    _checks.check_rows(probabilities={"p": p, "q": q})
    return safe_normalize(jnp.maximum(q - p, 0))


def residual_distribution(q: jax.Array, p: jax.Array) -> jax.Array:
    """Deprecated: ``speculative_residual(p, q)``, which takes the draft first like every other
    function. This name keeps its target-first order (swapping it would silently break positional
    calls) and warns."""
    warnings.warn("specjax.residual_distribution(q, p) is deprecated: use "
                  "specjax.speculative_residual(p, q) (draft first)", DeprecationWarning,
                  stacklevel=2)
    return speculative_residual(p, q)


def acceptance_probability(p: jax.Array, q: jax.Array, *, epsilon) -> jax.Array:
    """Biased acceptance ``b = min(1, (q + eps) / p)``; finite (1) where ``p = 0``.

    Args:
      p: ``(..., V)`` draft probabilities.
      q: ``(..., V)`` target probabilities.
      epsilon: over-acceptance ``eps >= 0``; ``eps = 0`` is SD.

    References:
      Section 4 of the paper (Figure 3), ``b(x) = min{1, (q(x) + eps) / p(x)}``.
    """
    _checks.check_rows(probabilities={"p": p, "q": q})
    if _checks.is_concrete(epsilon):
        _checks.check_finite_non_negative("epsilon", epsilon)
    return jnp.minimum(1, safe_ratio(q + epsilon, p, 1))


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
    _checks.check_rows(probabilities={"p": p, "q": q}, acceptance={"accept_prob": accept_prob})
    return safe_normalize(jnp.maximum(q - accept_prob * p, 0))


def _residual_optimal(p, q, b):
    return optimal_residual(p, q, b)  # Theorem 4's P* (Decoding-OPT)


def _residual_target(p, q, b):
    del p, b
    return q  # resample from q (Decoding-UNO)


def _residual_standard(p, q, b):
    del b
    return speculative_residual(p, q)  # SD's [q - p]_+


def _residual_argmax(p, q, b):
    del p, b
    return jax.nn.one_hot(jnp.argmax(q, axis=-1), q.shape[-1], dtype=q.dtype)  # Medusa, vLLM


#: The residuals a lossy rule may resample from after a rejection, by name: ``"optimal"``
#: (Theorem 4's ``P*``, normalised ``[q - b p]_+``), ``"target"`` (``q``), ``"standard"``
#: (SD's ``[q - p]_+``), ``"argmax"`` (the target's most likely token: Medusa's typical acceptance
#: and vLLM's ``TypicalAcceptanceSampler``). Each is ``f(p, q, b) -> (..., V)`` masses.
RESIDUALS = {"optimal": _residual_optimal, "target": _residual_target,
             "standard": _residual_standard, "argmax": _residual_argmax}


def named_residual_law(p: jax.Array, q: jax.Array, accept_prob: jax.Array,
                       residual: str) -> VerificationLaw:
    """``verification_law`` of acceptance ``accept_prob`` and the residual named ``residual`` (a
    key of ``RESIDUALS``): the law of every rule given by an acceptance and a named residual
    (biased SD, typical acceptance, lenient SD, top-k acceptance)."""
    return verification_law(p, accept_prob, RESIDUALS[residual](p, q, accept_prob))


def check_residual_name(residual: str, allowed=tuple(RESIDUALS)) -> None:
    """Raise ``ValueError`` unless ``residual`` names one of ``allowed``."""
    if residual not in allowed:
        raise ValueError(f"residual must be one of {tuple(allowed)}, got {residual!r}")


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
    _checks.check_rows(probabilities={"p": p}, acceptance={"accept_prob": accept_prob},
                       masses={"residual": residual})
    accepted = accept_prob * p
    reject_mass = jnp.maximum(1 - jnp.sum(accepted, axis=-1, keepdims=True), 0)
    return VerificationLaw(accepted, reject_mass * safe_normalize(residual))


def speculative_law(p: jax.Array, q: jax.Array) -> VerificationLaw:
    """One SD verification step (Algorithm 1): accept ``min(p, q)``, reject into ``[q - p]_+``.

    This is ``verification_law(p, min(1, q / p), [q - p]_+)`` written without division: the
    accepted mass is ``b p = min(p, q)`` and the rejected mass ``(1 - sum min(p, q))`` times the
    normalised ``[q - p]_+`` is ``[q - p]_+`` itself, because ``sum [q - p]_+ = 1 - sum min(p, q)``
    for probability rows. Values and gradients are finite at ``p = 0``, ``p = q`` and disjoint
    supports.
    """
    return VerificationLaw(jnp.minimum(p, q), scaled_residual(p, q, 1))


def scaled_residual(p: jax.Array, q: jax.Array, scale: jax.Array) -> jax.Array:
    """``[q - S p]_+``: SD's rejection mass for ``S = 1``, batch SD's root for ``S = S_M``."""
    return jnp.maximum(q - scale * p, 0)


def bonus_law(q: jax.Array) -> VerificationLaw:
    """A token drawn straight from the target (bonus token, autoregressive step): never rejected."""
    return VerificationLaw(q, jnp.zeros_like(q))


# ---------------------------------------------------------------------------------------------
# Single-token quantities of the theory.


def tv_distance(p: jax.Array, q: jax.Array) -> jax.Array:
    """Total variation distance ``(1/2) sum |p - q|`` over the last axis: ``(..., V) -> (...)``."""
    _checks.check_rows(probabilities={"p": p, "q": q})
    return 0.5 * jnp.sum(jnp.abs(p - q), axis=-1)


def rejection_probability(p: jax.Array, accept_prob: jax.Array) -> jax.Array:
    """``P(reject) = sum (1 - b) p`` for a draft row ``p`` and acceptance probabilities ``b``.

    Args:
      p: ``(..., V)`` draft probabilities.
      accept_prob: ``(..., V)`` acceptance probabilities ``b``.

    Returns:
      ``(...)``.

    References:
      Section 4, footnote to Theorem 5.
    """
    _checks.check_rows(probabilities={"p": p}, acceptance={"accept_prob": accept_prob})
    return jnp.sum((1 - accept_prob) * p, axis=-1)


def tv_loss_star(p: jax.Array, q: jax.Array, accept_prob: jax.Array) -> jax.Array:
    """Theorem 4's optimal bias ``Loss*_TV(b) = (1/2) sum |q - b p| - (1/2) sum (1 - b) p``.

    The smallest TV distance to the target ``q`` that any rejection distribution can reach for
    the acceptance probabilities ``b``; zero when ``b <= min(1, q / p)`` (unbiased rules).

    Args:
      p: ``(..., V)`` draft probabilities.
      q: ``(..., V)`` target probabilities.
      accept_prob: ``(..., V)`` acceptance probabilities ``b``.

    Returns:
      ``(...)``, non-negative (clipped at 0 against rounding).

    References:
      Theorem 4 (Optimal solution to optimization (2)).
    """
    _checks.check_rows(probabilities={"p": p, "q": q}, acceptance={"accept_prob": accept_prob})
    loss = 0.5 * jnp.sum(jnp.abs(q - accept_prob * p), axis=-1) \
        - 0.5 * rejection_probability(p, accept_prob)
    return jnp.maximum(loss, 0)
