"""SpecTr's k-sequential selection (Sun et al. 2023): ``M`` i.i.d. drafts verified in turn with a
shared, damped acceptance ``min(1, q / (rho p))``, and one residual after all of them.

At the root of a call the first tokens ``X_1 .. X_M`` of ``M`` drafts are i.i.d. from ``p``.
Draft ``i`` (in turn) is accepted with probability ``min(1, q(X_i) / (rho p(X_i)))``; the first
accepted draft is followed (SD inside the call, as batch SD). If none is accepted the token is
drawn from the residual. With ``beta(rho) = sum_y min(p(y), q(y) / rho)``,

    P(token y, some draft accepted) = a(y) = min(p(y), q(y) / rho) c(rho),
    c(rho) = (1 - (1 - beta)^M) / beta   (c = M at beta = 0),

and the residual is ``(q - a) / (1 - beta)^M``, a law only when ``q - a >= 0`` everywhere.
The acceptance ``1 - (1 - beta)^M`` decreases in ``rho`` (``beta`` does), although ``a`` is
not monotone token by token (``a = p c`` rises with ``c`` where ``q >= rho p``). Validity is
monotone in ``rho``: it reads ``c(rho) <= max(rho, r_min)`` with ``r_min`` the smallest ``q / p``
over tokens where both are positive; ``beta`` and ``c`` are constant on ``[1, r_min]``, and above
``r_min`` it reads ``1 - (1 - beta)^M <= sum min(rho p, q)``, whose left side falls and right
side rises with ``rho``. ``rho = M`` is always valid, so the best valid ``rho`` is the smallest
in ``[1, M]`` that keeps ``q - a >= 0``: ``k_sequential_rho`` finds it per row by bisection.

Unlike batch SD (every draft against a new residual) the drafts share one acceptance rule; unlike
``OptimalMultiDraft`` the rule does not see the whole draft set. Both bound it:
``acceptance <= optimal_acceptance`` (tested), and ``M = 1`` is SD (``rho = 1``).
"""

from __future__ import annotations


import jax
import jax.numpy as jnp

from specjax import _checks

from specjax.decoders import multi_draft
from specjax.decoders.base import pytree_dataclass
from specjax.decoders.iid_multi_draft import IidMultiDraft
from specjax.decoders.verification import VerificationLaw

__all__ = ["BISECTION_STEPS", "KSequential", "k_sequential_rho", "k_sequential_root_law"]

#: Bisection steps for ``rho``: the bracket ``[1, M]`` shrinks by ``2^-steps`` (float32 stops
#: improving after about 24 steps; the extra ones leave it unchanged).
BISECTION_STEPS = {"float64": 60, "float32": 40}


def _check_num_drafts(num_drafts) -> None:
    multi_draft.check_finite_num_drafts(
        num_drafts, "k-sequential selection",
        "its acceptance needs rho -> infinity as M -> infinity, and there is no closed-form limit")


def _capped(p, q, rho):
    """``min(p, q / rho)`` without a division by zero (``rho >= 1``)."""
    return jnp.minimum(p, q / rho)


def _scale(beta, num_drafts: int):
    """``c = (1 - (1 - beta)^M) / beta`` (``(..., 1)``): ``M`` at ``beta = 0``, ``1`` at
    ``beta = 1``, written as ``-expm1(M log1p(-beta)) / beta`` in between (no cancellation
    for small ``beta``), with finite values and gradients at both ends (double ``where``)."""
    if num_drafts == 1:
        return jnp.ones_like(beta)
    beta = jnp.clip(beta, 0, 1)
    inside = (beta >= jnp.finfo(beta.dtype).tiny) & (beta < 1)
    safe = jnp.where(inside, beta, jnp.full_like(beta, 0.5))
    middle = -jnp.expm1(num_drafts * jnp.log1p(-safe)) / safe
    ends = jnp.where(beta >= 1, jnp.ones_like(beta), jnp.full_like(beta, num_drafts))
    return jnp.where(inside, middle, ends)


def _masses(p, q, rho, num_drafts: int):
    """``(a, c)``: the accepted masses ``min(p, q / rho) c(rho)`` and ``c`` (``(..., 1)``)."""
    capped = _capped(p, q, rho)
    c = _scale(jnp.sum(capped, axis=-1, keepdims=True), num_drafts)
    return capped * c, c


#: Relative slack (in units of the dtype's epsilon) of the validity test: ``beta`` is a rounded
#: sum, so at ``p = q`` it can come out as ``1 - 1e-16`` and ``c = 1 / beta`` just above
#: ``rho = 1``. The residual's rounding-size negatives this admits are clipped to 0.
_SLACK_EPS = 64


def _feasible(p, q, rho, num_drafts: int):
    """``q - a >= 0`` for every token (to rounding), tested on the factors rather than on the
    difference: a token with ``q < rho p`` has ``a = q c / rho``, so it needs ``c <= rho``
    unless ``q = 0`` (then ``a = 0``); any other token has ``a = p c`` and needs ``p c <= q``.
    ``(..., 1)`` bool."""
    _, c = _masses(p, q, rho, num_drafts)
    slack = 1 + _SLACK_EPS * jnp.finfo(q.dtype).eps
    capped = q < rho * p
    ok = jnp.where(capped, (q <= 0) | (c <= rho * slack), p * c <= q * slack)
    return jnp.all(ok, axis=-1, keepdims=True)


def k_sequential_rho(p: jax.Array, q: jax.Array, num_drafts) -> jax.Array:
    """The smallest ``rho`` in ``[1, M]`` whose k-sequential residual ``q - a`` is non-negative
    (``(..., 1)``); ``1`` for ``M = 1`` (SD).

    The best valid ``rho`` of any k-sequential rule: the acceptance ``1 - (1 - beta(rho))^M``
    decreases in ``rho``, and validity is monotone in ``rho`` (module docstring; ``M`` is always
    valid). Found by bisection with a fixed number of steps (``BISECTION_STEPS``),
    returning the feasible end of the bracket, or exactly ``1`` when ``1`` is feasible. A
    constant under differentiation (``stop_gradient``).

    Note: SpecTr states its own equation for ``rho`` (not checked here); this function uses the
    defining property instead, which is the optimum of the rule.

    Args:
      p: ``(..., V)`` draft probabilities.
      q: ``(..., V)`` target probabilities.
      num_drafts: ``M >= 1`` (static, finite).
    """
    _check_num_drafts(num_drafts)
    p, q = multi_draft.broadcast_rows(jax.lax.stop_gradient(p), jax.lax.stop_gradient(q))
    one = jnp.ones(q.shape[:-1] + (1,), q.dtype)
    if num_drafts == 1:
        return one
    steps = BISECTION_STEPS["float64" if q.dtype == jnp.float64 else "float32"]

    def step(_, bracket):
        lo, hi = bracket
        mid = 0.5 * (lo + hi)
        ok = _feasible(p, q, mid, num_drafts)
        return jnp.where(ok, lo, mid), jnp.where(ok, mid, hi)

    _, hi = jax.lax.fori_loop(0, steps, step, (one, one * num_drafts))
    rho = jnp.where(_feasible(p, q, one, num_drafts), one, hi)
    return jax.lax.stop_gradient(rho)


def k_sequential_root_law(p: jax.Array, q: jax.Array, num_drafts) -> VerificationLaw:
    """The first token after a target call under k-sequential selection of ``M`` i.i.d. drafts.

    ``accepted = min(p, q / rho) c(rho)`` with ``c = (1 - (1 - beta)^M) / beta``, ``beta =
    sum min(p, q / rho)`` and ``rho = k_sequential_rho(p, q, M)``; ``rejected = q - accepted``
    (the residual's mass, ``(1 - beta)^M`` in all), clipped at 0 against rounding with
    ``accepted + rejected = q`` kept, so the step is unbiased by construction. At the optimal
    ``rho`` the residual vanishes on every token with ``q < rho p`` (there ``c(rho) = rho``,
    SpecTr's condition, whenever such a token has ``q > 0``). ``sum accepted =
    1 - (1 - beta)^M``, at most ``optimal_acceptance`` and ``sum min(p, q)`` at ``M = 1``.

    Gradients flow through ``p`` and ``q`` with ``rho`` held constant (``stop_gradient``): the
    derivative of the unclipped law at a fixed ``rho``, not of the law at the optimal ``rho``
    (which moves with ``p`` and ``q``); the two differ in general.

    Args:
      p: ``(..., V)`` draft probabilities.
      q: ``(..., V)`` target probabilities.
      num_drafts: ``M >= 1`` (static, finite; ``math.inf`` is refused).

    References:
      Sun et al. 2023, "SpecTr: fast speculative decoding via optimal transport" (k-sequential
      selection).
    """
    _check_num_drafts(num_drafts)
    _checks.check_rows(probabilities={"p": p, "q": q})
    p, q = multi_draft.broadcast_rows(p, q)
    rho = k_sequential_rho(p, q, num_drafts)
    accepted, _ = _masses(p, q, rho, num_drafts)
    rejected = q - accepted
    # Clip rounding-size negatives in the value only: at the optimal rho the residual is 0 on
    # every token with q < rho p, so a plain maximum would pass or block the gradient there by
    # the sign of a rounding error. The gradient is the unclipped law's at fixed rho.
    rejected = rejected + jax.lax.stop_gradient(jnp.maximum(rejected, 0) - rejected)
    return VerificationLaw(q - rejected, rejected)


@pytree_dataclass
class KSequential(IidMultiDraft):
    """SpecTr's k-sequential selection: ``M`` i.i.d. draft sequences per target call.

    At the root of a call the drafts' first tokens ``X_1 .. X_M ~ p`` are tried in turn, draft
    ``i`` accepted with probability ``min(1, q(X_i) / (rho p(X_i)))``; the first accepted draft is
    followed and verified by SD until a rejection (as batch SD). If none is accepted the token is
    drawn from the residual ``(q - a) / (1 - beta)^M`` (``k_sequential_root_law``).

    ``rho`` is computed per row as the smallest value in ``[1, M]`` that keeps the residual
    non-negative (bisection, ``k_sequential_rho``): the best any k-sequential rule can do, since
    its acceptance ``1 - (1 - beta(rho))^M`` decreases in ``rho``. SpecTr gives its own equation
    for ``rho``; it is not reproduced (nor checked) here. ``rho`` is a constant under
    differentiation (``jax.lax.stop_gradient``): gradients of ``exact`` are those of the law at
    the chosen ``rho``.

    Attributes:
      num_drafts: ``M >= 1`` (``M = 1`` is SD: ``rho = 1``). ``math.inf`` is refused (no
        closed-form limit).
      lookahead: ``None`` (``K = T``) or ``K`` (a bonus token after ``K`` accepted drafts).

    References:
      Sun et al. 2023, "SpecTr: fast speculative decoding via optimal transport".
    """

    scheme = "k-sequential"
    check_num_drafts = staticmethod(_check_num_drafts)

    @classmethod
    def example_cases(cls) -> dict:
        return {"k-sequential M=2": cls(2)}

    def root_law(self, p, q) -> VerificationLaw:
        return k_sequential_root_law(p, q, self.num_drafts)
