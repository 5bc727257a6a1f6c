"""Single-step verification rules, correct and deliberately broken, for ``specjax.audit``
(which re-exports every public name here).

A rule verifies one drafted token ``x`` against a draft row ``p`` and a target row ``q`` (both
``(V,)``) and returns ``(accepted, token)``: a bool and the emitted int32 token. Each rule comes in
two forms:

* key form ``verify(key, p, q, x)``, what ``audit`` runs by Monte Carlo;
* uniform form ``verify_u(u, p, q, x)`` with ``u`` uniform in ``[0, 1)``, what ``audit_exact``
  integrates exactly over ``u`` (suffix ``_u``). A rule in this form decides acceptance and, after
  a rejection, the resampled token from the same ``u``: rejection means ``u >= b``, and then
  ``(u - b) / (1 - b)`` is again uniform, which an inverse CDF turns into the token. The rule is
  therefore piecewise constant in ``u``. ``from_uniform`` turns it into a key form.

Correct rules: ``speculative_rule`` (SD, Algorithm 1: accept with ``min(1, q(x)/p(x))``, else
resample from ``[q - p]_+`` normalised; unbiased for ``x ~ p``) and ``greedy_rule`` (a one-hot
draft ``x = argmax p``: accept with ``q(x)``, else resample from ``q`` with ``x`` removed; unbiased
for any deterministic draft). Broken rules (the bugs serving engines have shipped):
``accept_all``, ``wrong_residual``, ``greedy_scored_with_softmax`` and, in uniform form,
``accepts_at_zero_uniform_u``. ``CORRECT_RULES`` and ``BROKEN_RULES`` list them with the drafting
under which each is (un)biased.

Numerics: no division at all in the uniform forms (the inverse CDF compares ``(u - b) W`` with
``(1 - b) cumsum(w)``), so a zero-mass token has a zero-width interval and is never emitted; a
residual with no mass (``p = q`` up to rounding) falls back to ``q``.
"""

from __future__ import annotations

import functools
from typing import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from specjax.decoders.draws import inverse_cdf as _inverse_cdf
from specjax.decoders.draws import mass_or_target as _mass_or_target
from specjax.decoders.verification import acceptance_probability

__all__ = [
    "BROKEN_RULES",
    "CORRECT_RULES",
    "Rule",
    "accept_all",
    "accept_all_u",
    "accepts_at_zero_uniform",
    "accepts_at_zero_uniform_u",
    "from_uniform",
    "greedy_rule",
    "greedy_rule_u",
    "greedy_scored_with_softmax",
    "greedy_scored_with_softmax_u",
    "speculative_rule",
    "speculative_rule_u",
    "wrong_residual",
    "wrong_residual_u",
]

# ---------------------------------------------------------------------------------------------
# Building blocks.


def _sd_accept(p: jax.Array, q: jax.Array, x: jax.Array) -> jax.Array:
    """``b(x) = min(1, q(x) / p(x))``, 1 where ``p(x) = 0`` (``specjax.decoders.verification``)."""
    return acceptance_probability(p, q, epsilon=0.0)[x]


def _draw(key: jax.Array, w: jax.Array) -> jax.Array:
    """One token from the unnormalised masses ``w >= 0`` (Gumbel-max; zero mass never drawn)."""
    return jax.random.categorical(key, jnp.log(w)).astype(jnp.int32)


def _uniform_rule(u, b, w, q, x, *, accept_at_boundary=False):
    """Accept iff ``u < b`` (``u <= b`` for the u = 0 bug), else the inverse CDF of the residual
    ``w`` at the rescaled uniform ``(u - b) / (1 - b)`` (``u >= b`` there, so it is >= 0)."""
    accepted = (u <= b) if accept_at_boundary else (u < b)
    resampled = _inverse_cdf(u - b, 1 - b, _mass_or_target(w, q))
    return accepted, jnp.where(accepted, x, resampled).astype(jnp.int32)


def from_uniform(verify_u: Callable) -> Callable:
    """The key form ``verify(key, p, q, x)`` of a uniform-form rule ``verify_u(u, p, q, x)``.

    Draws ``u = jax.random.uniform(key, dtype=p.dtype)`` (multiples of ``2^-23`` in float32, so
    ``u = 0.0`` exactly has probability ``2^-23``). Cached: the same ``verify_u`` gives the same
    function object, so ``audit`` compiles it once.

    Args:
      verify_u: ``(u, p, q, x) -> (accepted, token)``.

    Returns:
      ``(key, p, q, x) -> (accepted, token)``.

    Raises:
      ValueError: ``verify_u`` is not callable.
    """
    if not callable(verify_u):
        raise ValueError(f"verify_u must be a function verify_u(u, p, q, x) -> (accepted, token), "
                         f"got {verify_u!r}")
    return _from_uniform(verify_u)


@functools.cache
def _from_uniform(verify_u):
    @functools.wraps(verify_u)
    def verify(key, p, q, x):
        return verify_u(jax.random.uniform(key, dtype=p.dtype), p, q, x)

    return verify


# ---------------------------------------------------------------------------------------------
# Correct rules.


def speculative_rule(key: jax.Array, p: jax.Array, q: jax.Array, x: jax.Array):
    """Standard SD verification of a draft ``x ~ p``: unbiased, and optimal in acceptance.

    Accepts with probability ``min(1, q(x) / p(x))``; otherwise draws the token from
    ``[q - p]_+`` normalised, with a key of its own.

    Args:
      key: a PRNG key.
      p: ``(V,)`` draft row (the law ``x`` was drawn from).
      q: ``(V,)`` target row.
      x: the drafted token (int32 scalar).

    Returns:
      ``(accepted, token)``: bool and int32 scalars.

    References:
      Algorithm 1 of the paper (lines 6-8); Leviathan et al. (2023), Chen et al. (2023).
    """
    key_accept, key_residual = jax.random.split(key)
    accepted = jax.random.uniform(key_accept, dtype=p.dtype) < _sd_accept(p, q, x)
    resampled = _draw(key_residual, _mass_or_target(jnp.maximum(q - p, 0), q))
    return accepted, jnp.where(accepted, x, resampled).astype(jnp.int32)


def speculative_rule_u(u: jax.Array, p: jax.Array, q: jax.Array, x: jax.Array):
    """``speculative_rule`` as a function of one uniform ``u`` in ``[0, 1)`` (for ``audit_exact``).

    Accepts iff ``u < min(1, q(x) / p(x))``, else the inverse CDF of ``[q - p]_+`` at the
    rescaled uniform. Emits a token of zero target mass for no ``u``, ``u = 0`` included.
    """
    return _uniform_rule(u, _sd_accept(p, q, x), jnp.maximum(q - p, 0), q, x)


def greedy_rule(key: jax.Array, p: jax.Array, q: jax.Array, x: jax.Array):
    """Unbiased verification of a deterministic (greedy) draft ``x``, e.g. ``x = argmax p``.

    The draft's law is the one-hot of ``x``, so SD's rule with that law accepts with probability
    ``q(x)`` and resamples from ``[q - onehot(x)]_+``: ``q`` with ``x`` removed, renormalised.
    The output law is ``q`` and the acceptance rate ``q(x)``, the optimum for a one-hot draft.
    ``p`` is not used.

    Args:
      key: a PRNG key.
      p: ``(V,)`` draft row (ignored).
      q: ``(V,)`` target row.
      x: the drafted token (int32 scalar).

    Returns:
      ``(accepted, token)``: bool and int32 scalars.
    """
    del p
    key_accept, key_residual = jax.random.split(key)
    accepted = jax.random.uniform(key_accept, dtype=q.dtype) < q[x]
    resampled = _draw(key_residual, _mass_or_target(q.at[x].set(0), q))
    return accepted, jnp.where(accepted, x, resampled).astype(jnp.int32)


def greedy_rule_u(u: jax.Array, p: jax.Array, q: jax.Array, x: jax.Array):
    """``greedy_rule`` as a function of one uniform ``u``: accept iff ``u < q(x)``."""
    del p
    return _uniform_rule(u, q[x], q.at[x].set(0), q, x)


# ---------------------------------------------------------------------------------------------
# Broken rules.


def accept_all(key: jax.Array, p: jax.Array, q: jax.Array, x: jax.Array):
    """BROKEN: accepts every draft, so the output law is the draft's, not ``q``.

    HuggingFace's speculative sampling once did this. Biased whenever ``p != q``; its acceptance
    rate 1 exceeds the optimum ``1 - TV(p, q)``, which no unbiased rule can.
    """
    del key, p, q
    return jnp.asarray(True), jnp.asarray(x, jnp.int32)


def accept_all_u(u: jax.Array, p: jax.Array, q: jax.Array, x: jax.Array):
    """``accept_all`` in uniform form."""
    del u, p, q
    return jnp.asarray(True), jnp.asarray(x, jnp.int32)


def wrong_residual(key: jax.Array, p: jax.Array, q: jax.Array, x: jax.Array):
    """BROKEN: accepts correctly but resamples from ``[p - q]_+`` (arguments swapped).

    The classic convention mix-up (HuggingFace names the draft ``q``). A rejection has
    probability ``TV(p, q)`` and the residual has mass ``TV(p, q)``, so the output law is
    ``min(p, q) + [p - q]_+ = p``: the rule emits the draft's law. Biased whenever ``p != q``;
    with disjoint supports it never emits a token the target can produce.
    """
    key_accept, key_residual = jax.random.split(key)
    accepted = jax.random.uniform(key_accept, dtype=p.dtype) < _sd_accept(p, q, x)
    resampled = _draw(key_residual, _mass_or_target(jnp.maximum(p - q, 0), q))
    return accepted, jnp.where(accepted, x, resampled).astype(jnp.int32)


def wrong_residual_u(u: jax.Array, p: jax.Array, q: jax.Array, x: jax.Array):
    """``wrong_residual`` in uniform form."""
    return _uniform_rule(u, _sd_accept(p, q, x), jnp.maximum(p - q, 0), q, x)


def greedy_scored_with_softmax(key: jax.Array, p: jax.Array, q: jax.Array, x: jax.Array):
    """BROKEN with a greedy draft: SD's rule scored with the softmax ``p`` the draft never used.

    The draft is ``x = argmax p`` (``drafting="greedy"``), whose law is the one-hot of ``x``,
    but acceptance uses ``min(1, q(x) / p(x))`` and the residual ``[q - p]_+``. The output law
    is ``b onehot(x) + (1 - b) [q - p]_+ / sum [q - p]_+`` with ``b = min(1, q(x) / p(x))``,
    not ``q`` (e.g. ``p = (0.6, 0.4)``, ``q = (0.5, 0.5)`` gives ``(5/6, 1/6)``). Engines that
    verify a greedy draft with the sampling path do this. (The code is ``speculative_rule``:
    the same rule is correct for ``x ~ p``; the bug is the mismatch with the draft's law.)
    """
    return speculative_rule(key, p, q, x)


def greedy_scored_with_softmax_u(u: jax.Array, p: jax.Array, q: jax.Array, x: jax.Array):
    """``greedy_scored_with_softmax`` in uniform form (``speculative_rule_u``'s body)."""
    return speculative_rule_u(u, p, q, x)


def accepts_at_zero_uniform_u(u: jax.Array, p: jax.Array, q: jax.Array, x: jax.Array):
    """BROKEN at one point: accepts iff ``u <= q(x) / p(x)`` instead of ``u < ...``.

    At ``u = 0.0`` exactly it accepts a draft with ``q(x) = 0``, emitting a token the target
    never produces. ``u = 0.0`` has probability ``2^-23`` under ``jax.random.uniform`` in float32
    (``2^-52`` in float64): a real, rare bug (a JAX port shipped it) that Monte Carlo almost
    never sees and the integral over ``u`` cannot see; ``audit_exact`` flags it by evaluating the
    rule at ``u = 0.0`` itself.
    """
    return _uniform_rule(u, _sd_accept(p, q, x), jnp.maximum(q - p, 0), q, x,
                         accept_at_boundary=True)


accepts_at_zero_uniform = from_uniform(accepts_at_zero_uniform_u)
accepts_at_zero_uniform.__doc__ = "``accepts_at_zero_uniform_u`` in key form (``from_uniform``)."


class Rule(NamedTuple):
    """A verification rule in both forms and the drafting it is meant for (or biased under)."""

    verify: Callable  # (key, p, q, x) -> (accepted, token)
    verify_u: Callable  # (u, p, q, x) -> (accepted, token)
    drafting: str  # "sample" or "greedy"


#: Unbiased rules, each with the drafting it is correct for.
CORRECT_RULES = {
    "speculative_rule": Rule(speculative_rule, speculative_rule_u, "sample"),
    "greedy_rule": Rule(greedy_rule, greedy_rule_u, "greedy"),
}

#: Broken rules, each with a drafting under which it is biased.
BROKEN_RULES = {
    "accept_all": Rule(accept_all, accept_all_u, "sample"),
    "wrong_residual": Rule(wrong_residual, wrong_residual_u, "sample"),
    "greedy_scored_with_softmax": Rule(greedy_scored_with_softmax, greedy_scored_with_softmax_u,
                                       "greedy"),
    "accepts_at_zero_uniform": Rule(accepts_at_zero_uniform, accepts_at_zero_uniform_u, "sample"),
}
