"""Gumbel-max list coupling (GLS) of ``M`` drafts, token-wise, with its exact root law.

The coupling (Daliri, Musco & Suresh 2024 for one draft; Rowan, Phan & Khisti 2025 for a list):
shared exponentials ``E[i, k] ~ Exp(1)``, i.i.d. over the list index ``i = 1..M`` and the token
``k = 1..V``. Draft ``i`` is ``X_i = argmin_k E[i, k] / p_k`` (the drafts are i.i.d. from ``p``
and do not depend on ``q``: the drafter is invariant). The output is the token ``Y`` of the cell
``(i, k)`` minimising ``E[i, k] / q_k`` over all ``M V`` cells; ``min_i E[i, k] ~ Exp(M)``
independently over ``k``, so ``Y ~ q`` exactly and the step is lossless. The call accepts iff
``Y`` is one of ``X_1 .. X_M``. The root law is ``accepted(k) = P(Y = k, k in {X_i})`` and
``rejected = q - accepted``.

Exact law. Fix ``k`` with ``p_k q_k > 0`` and write ``a_j = q_j / q_k``, ``b_j = p_j / p_k``,
``Q = sum_{j != k} a_j`` and ``C = sum_{j != k} max(a_j, b_j)``. Conditioning on the column
minimum ``u = min_i E[i, k]`` (density ``M e^{-M u}``; one row attains it, the others have
``E[i, k] = u + v`` with ``v ~ Exp(1)``), the rows are independent and

    P(Y = k, no draft is k) = int_0^inf M e^{-M u} [e^{-u Q} - e^{-u C}] [e^{-u Q} - G(u)]^{M-1} du,
    G(u) = int_0^inf e^{-v} exp(-sum_{j != k} max(u a_j, (u + v) b_j)) dv.

With ``v = u t``, ``G(u) = u int_0^inf exp(-u L(t)) dt``, ``L(t) = t + sum_j max(a_j, (1 + t) b_j)``
convex and piecewise linear with breakpoints ``t_j = a_j / b_j - 1 > 0`` (the tokens with
``q_j / p_j > q_k / p_k``, taken in order of ``q / p``). Integrating segment by segment,

    G(u) = e^{-u C} / beta_0 + sum_j (1 / beta_j^+ - 1 / beta_j^-) e^{-u L(t_j)},

with ``beta`` the slope of ``L`` (``beta_0`` at ``t = 0``, ``beta_j^-`` and ``beta_j^+`` either
side of ``t_j``). ``e^{-u Q} - G(u)`` is thus a sum of ``V + 1`` exponentials; its ``(M - 1)``-th
power is expanded term by term (``(V + 1)^(M - 1)`` ordered products per token), and each term
with rate ``R`` is paired with the first factor in closed form:

    int_0^inf M e^{-M u} [e^{-u Q} - e^{-u C}] e^{-u R} du = M (C - Q) / ((M + Q + R)(M + C + R)),

with ``C - Q = sum_j max(0, b_j - a_j) >= 0`` computed directly (no cancellation there). The
expansion of the power alternates in sign: its rounding error is absolute, of order ``eps`` times
the number of terms (checked to 1e-8 in float64 against nested quadrature; float32 stays finite
and is clipped). At ``M = 1`` the law is ``accepted(k) = p_k q_k / sum_j max(p_j q_k, q_j p_k)``.

What is verified (``tests/test_gumbel_list.py``): the exact law against (a) Monte Carlo of the
literal coupling in NumPy (joint law of (token, accepted), chi-square), (b) nested
``scipy.integrate.quad`` of the integral above (its inner integral in ``v``, not the ``L(t)``
form), to 1e-8, and (c) the ``M = 1`` closed form; its gradients against central finite
differences on interior rows, to 1e-7; the acceptance is at most ``optimal_acceptance`` (the
drafts are i.i.d. from ``p``).

In specjax's engines the sampler draws each root's (token, accepted) from this exact law; it
does not draw or replay the exponentials, so the Monte Carlo of ``decode`` has the coupling's
law, not its sample paths. Below the root, the followed draft is verified by SD (as batch SD and
k-sequential selection).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from specjax import _checks

from specjax.decoders import multi_draft
from specjax.decoders import optimal_acceptance
from specjax.decoders.base import pytree_dataclass
from specjax.decoders.iid_multi_draft import IidMultiDraft
from specjax.decoders.verification import VerificationLaw

__all__ = [
    "GumbelList",
    "MAX_GUMBEL_LIST_ELEMENTS",
    "check_gumbel_list_size",
    "gumbel_list_elements",
    "gumbel_list_root_law",
]

#: The most elements the root law builds: ``rows x V x (V + 1)^max(M - 1, 1)`` (every token's
#: ordered products of the expansion; ``V^2`` per row at ``M = 1``).
MAX_GUMBEL_LIST_ELEMENTS = 2**26


def _check_num_drafts(num_drafts) -> None:
    multi_draft.check_finite_num_drafts(
        num_drafts, "the Gumbel list coupling",
        "its exact root law expands (V + 1)^(M - 1) terms per token")


def gumbel_list_elements(num_drafts: int, num_states: int, num_rows: int) -> int:
    """Elements the root law of ``num_rows`` rows builds (``MAX_GUMBEL_LIST_ELEMENTS`` caps it)."""
    return max(int(num_rows), 1) * num_states * (num_states + 1) ** max(num_drafts - 1, 1)


def check_gumbel_list_size(num_drafts, num_states: int, num_rows: int) -> None:
    """Raises ``ValueError`` (naming ``num_drafts``) when the root law of ``num_rows`` rows would
    build more than ``MAX_GUMBEL_LIST_ELEMENTS`` elements."""
    elements = gumbel_list_elements(num_drafts, num_states, num_rows)
    if elements > MAX_GUMBEL_LIST_ELEMENTS:
        raise ValueError(
            f"num_drafts = {num_drafts} with the Gumbel list coupling expands rows x V x "
            f"(V + 1)^max(M - 1, 1) = {max(int(num_rows), 1):,} x {num_states} x "
            f"{num_states + 1}^{max(num_drafts - 1, 1)} = {elements:,} elements, more than "
            f"{MAX_GUMBEL_LIST_ELEMENTS:,}; use fewer drafts (or fewer tokens, rows or chains)")


def _rejected(p, q, num_drafts: int):
    """``P(Y = k, no draft is k)`` for every token ``k`` (``(..., V)``, unclipped), and the mask
    of tokens with ``p_k q_k > 0`` (elsewhere the value is meaningless)."""
    v = q.shape[-1]
    m = float(num_drafts)
    pk, qk = p[..., :, None], q[..., :, None]  # (..., V_k, 1)
    pj, qj = p[..., None, :], q[..., None, :]  # (..., 1, V_j)
    valid = (pk > 0) & (qk > 0)
    one = jnp.ones_like(pk)
    pk_s, qk_s = jnp.where(valid, pk, one), jnp.where(valid, qk, one)
    square = q.shape[:-1] + (v, v)
    other = jnp.broadcast_to(~jnp.eye(v, dtype=bool), square)  # (..., V_k, V_j): j != k
    zero = jnp.zeros((), q.dtype)
    a = jnp.where(other, qj / qk_s, zero)  # (..., V_k, V_j)
    b = jnp.where(other, pj / pk_s, zero)
    big_q = jnp.sum(a, axis=-1, keepdims=True)  # (..., V_k, 1)
    big_c = jnp.sum(jnp.maximum(a, b), axis=-1, keepdims=True)
    gap = jnp.sum(jnp.maximum(b - a, zero), axis=-1, keepdims=True)  # C - Q >= 0

    def paired(rate):
        """``int M e^{-M u} [e^{-uQ} - e^{-uC}] e^{-u R} du`` for rates ``R``."""
        return m * (gap / (m + big_c + rate)) / (m + big_q + rate)

    if num_drafts == 1:
        return paired(jnp.zeros_like(big_q))[..., 0], valid[..., 0]

    # Breakpoints of L: tokens j != k with p_j > 0 and a_j > b_j (t_j > 0).
    active = other & (pj > 0) & (a > b)
    ramp_always = other & (pj > 0) & ~active  # slope b_j from t = 0
    beta0 = 1 + jnp.sum(jnp.where(ramp_always, b, zero), axis=-1, keepdims=True)
    # The breakpoints in order of t_j, i.e. of q_j / p_j (ties broken by index): a total order,
    # the same for every k. Sums over the active tokens up to j are cumulative sums in that
    # order (a sort and a scan; no matrix product, whose rounding XLA may change between
    # programs, e.g. sharded and not, which would change sampled tokens).
    order = optimal_acceptance.ratio_order(p, q)  # (..., V): tokens by q / p ascending
    rank = optimal_acceptance.inverse_permutation(order)  # (..., V): place of token j in that order
    b_active = jnp.where(active, b, zero)
    a_active = jnp.where(active, a, zero)

    def up_to(x):  # (..., V_k, V_j): sum over active l no later than j in the order
        in_order = jnp.take_along_axis(x, order[..., None, :], axis=-1)
        return jnp.take_along_axis(jnp.cumsum(in_order, axis=-1), rank[..., None, :], axis=-1)

    # Slopes right of t_j (beyond 1): every always-ramping token, and the active ones up to j.
    slope_b = beta0 - 1 + up_to(b_active)
    ramp_a = jnp.sum(jnp.where(ramp_always, a, zero), axis=-1, keepdims=True) + up_to(a_active)
    b_safe = jnp.where(active, b, jnp.ones_like(b))
    t = jnp.where(active, a / b_safe - 1, zero)
    # L(t_j) = t_j + (1 + t_j) sum_{ramping} b + sum_{others} a.
    rate_j = jnp.where(active, t + (1 + t) * slope_b + (big_q - ramp_a), zero)
    beta_right = 1 + slope_b
    beta_left = beta_right - b_active
    coef_j = jnp.where(active, 1 / beta_right - 1 / jnp.maximum(beta_left, 1), zero)
    # e^{-uQ} - G(u) = e^{-uQ} - e^{-uC} / beta0 - sum_j coef_j e^{-u L(t_j)}.
    h_coef = jnp.concatenate([jnp.ones_like(big_q), -1 / beta0, -coef_j], axis=-1)
    h_rate = jnp.concatenate([big_q, big_c, rate_j], axis=-1)  # (..., V_k, V + 1)
    coef, rate = h_coef, h_rate
    for _ in range(num_drafts - 2):
        shape = coef.shape[:-1] + (-1,)
        coef = (coef[..., :, None] * h_coef[..., None, :]).reshape(shape)
        rate = (rate[..., :, None] + h_rate[..., None, :]).reshape(shape)
    return jnp.sum(coef * paired(rate), axis=-1), valid[..., 0]


def gumbel_list_root_law(p: jax.Array, q: jax.Array, num_drafts) -> VerificationLaw:
    """The first token after a target call under the Gumbel-max list coupling of ``M`` drafts.

    ``accepted(k) = P(Y = k, k in {X_1 .. X_M})`` where ``X_i = argmin_k E[i, k] / p_k`` and
    ``Y`` is the token of the cell minimising ``E[i, k] / q_k`` (``E`` i.i.d. ``Exp(1)``);
    ``rejected = q - accepted`` (the output is always ``Y ~ q``: lossless). Computed in closed
    form (module docstring): ``O(V (V + 1)^(M - 1))`` terms per row. At ``M = 1``,
    ``accepted(k) = p_k q_k / sum_j max(p_j q_k, q_j p_k)``. Tokens with ``p_k q_k = 0`` have
    ``accepted = 0``. ``rejected`` is clipped to ``[0, q]`` against rounding (in the value only;
    the gradient is the unclipped expression's), with ``accepted + rejected = q`` kept.

    Args:
      p: ``(..., V)`` draft probabilities.
      q: ``(..., V)`` target probabilities.
      num_drafts: ``M >= 1`` (static, finite; ``math.inf`` is refused).

    Raises:
      ValueError: ``num_drafts`` is invalid, or the expansion would exceed
        ``MAX_GUMBEL_LIST_ELEMENTS`` elements (the message names ``num_drafts``).

    References:
      Daliri, Musco & Suresh 2024, "Coupling without communication and drafter-invariant
      speculative decoding"; Rowan, Phan & Khisti 2025, "List-level distribution coupling with
      applications to speculative decoding and lossy compression" (NeurIPS 2025).
    """
    _check_num_drafts(num_drafts)
    _checks.check_rows(probabilities={"p": p, "q": q})
    p, q = multi_draft.broadcast_rows(p, q)
    check_gumbel_list_size(num_drafts, q.shape[-1], math.prod(q.shape[:-1]))
    value, valid = _rejected(p, q, num_drafts)
    rejected = jnp.where(valid, value, q)
    clipped = jnp.clip(rejected, 0, q)
    rejected = rejected + jax.lax.stop_gradient(clipped - rejected)
    return VerificationLaw(q - rejected, rejected)


@pytree_dataclass
class GumbelList(IidMultiDraft):
    """The Gumbel-max list coupling (GLS): ``M`` i.i.d. draft sequences per target call, the
    drafts independent of the target (drafter invariant), verified by a shared-randomness coupling.

    At the root of a call, with shared ``E[i, k] ~ Exp(1)``, draft ``i`` starts with
    ``argmin_k E[i, k] / p_k`` and the output token is that of the cell minimising
    ``E[i, k] / q_k`` (always ``~ q``); the call accepts when it equals one of the drafts' first
    tokens, and then follows that draft, verified by SD until a rejection (as batch SD).
    The exact root law is ``gumbel_list_root_law``. specjax's engines draw each root's
    (token, accepted) from that exact law; they do not draw or replay the exponentials.

    Verified in ``tests/test_gumbel_list.py`` against Monte Carlo of the literal coupling, nested
    quadrature and the ``M = 1`` closed form, its gradients against central finite differences;
    the acceptance is at most ``optimal_acceptance``.

    Reproducibility: the float32 law is a sum with cancellation whose last bits XLA may round
    differently in different compiled programs, so ``decoding_statistics`` (chunked or sharded)
    can differ from ``decode`` with the same key on a few chains; both sample the same law.

    Attributes:
      num_drafts: ``M >= 1``, finite (``math.inf`` is refused). The root law expands
        ``(V + 1)^(M - 1)`` terms per token; ``check`` refuses sizes above
        ``MAX_GUMBEL_LIST_ELEMENTS``.
      lookahead: ``None`` (``K = T``) or ``K`` (a bonus token after ``K`` accepted drafts).

    References:
      Daliri, Musco & Suresh 2024, "Coupling without communication and drafter-invariant
      speculative decoding"; Rowan, Phan & Khisti 2025, "List-level distribution coupling with
      applications to speculative decoding and lossy compression" (NeurIPS 2025).
    """

    scheme = "Gumbel list coupling"
    check_num_drafts = staticmethod(_check_num_drafts)

    @classmethod
    def example_cases(cls) -> dict:
        return {"gumbel list M=2": cls(2)}

    def root_law(self, p, q) -> VerificationLaw:
        return gumbel_list_root_law(p, q, self.num_drafts)

    def check(self, num_states: int, num_rows: int) -> None:
        check_gumbel_list_size(self.num_drafts, num_states, num_rows)
