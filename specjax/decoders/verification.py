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

import functools
import math
import numbers
import warnings
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


@jax.custom_jvp
def _divide(num: jax.Array, den: jax.Array) -> jax.Array:
    """``num / den`` for ``den`` at least the smallest normal float, with the derivative written
    as ``(d num - (num / den) d den) / den``: the default rule forms ``den ** -2``, which
    overflows to inf (and then NaN) once ``den`` is below about 1e-19 in float32."""
    return num / den


@_divide.defjvp
def _divide_jvp(primals, tangents):
    num, den = primals
    d_num, d_den = tangents
    ratio = num / den
    return ratio, (d_num - ratio * d_den) / den


def _tiny(x: jax.Array):
    return jnp.finfo(jnp.asarray(x).dtype).tiny


def safe_normalize(w: jax.Array) -> jax.Array:
    """``w / sum(w)`` over the last axis; all zeros (value and gradient finite) when the sum is 0.

    A sum below the smallest normal float (about 1e-38 in float32) counts as 0, so the division
    and its gradient never overflow.
    """
    total = jnp.sum(w, axis=-1, keepdims=True)
    positive = total >= _tiny(total)
    safe_total = jnp.where(positive, total, jnp.ones_like(total))
    return jnp.where(positive, _divide(w, safe_total), jnp.zeros_like(w))


def _safe_ratio(num: jax.Array, den: jax.Array, fill) -> jax.Array:
    """``num / den`` where ``den`` is at least the smallest normal float, ``fill`` elsewhere
    (``den = 0`` included), with finite values and reverse-mode gradients (forward-mode
    derivatives can still overflow when ``num / den`` itself is huge)."""
    positive = den >= _tiny(den)
    safe_den = jnp.where(positive, den, jnp.ones_like(den))
    return jnp.where(positive, _divide(num, safe_den), jnp.full_like(num, fill))


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
    """One SD verification step (Algorithm 1): accept ``min(p, q)``, reject into ``[q - p]_+``.

    This is ``verification_law(p, min(1, q / p), [q - p]_+)`` written without division: the
    accepted mass is ``b p = min(p, q)`` and the rejected mass ``(1 - sum min(p, q))`` times the
    normalised ``[q - p]_+`` is ``[q - p]_+`` itself, because ``sum [q - p]_+ = 1 - sum min(p, q)``
    for probability rows. Values and gradients are finite at ``p = 0``, ``p = q`` and disjoint
    supports.
    """
    return VerificationLaw(jnp.minimum(p, q), scaled_residual(p, q, 1))


def bonus_law(q: jax.Array) -> VerificationLaw:
    """A token drawn straight from the target (bonus token, autoregressive step): never rejected."""
    return VerificationLaw(q, jnp.zeros_like(q))


def check_num_drafts(num_drafts) -> None:
    """``num_drafts`` is a static positive int or ``math.inf``."""
    if isinstance(num_drafts, (jax.Array, jax.core.Tracer)):
        raise ValueError(f"num_drafts is a static setting (a Python int or math.inf fixed when the "
                         f"computation is compiled), got an array {num_drafts!r}; pass a Python "
                         f"int (inside your own jax.jit, use static_argnames or functools.partial)")
    if num_drafts == math.inf:
        return
    if isinstance(num_drafts, bool) or not isinstance(num_drafts, numbers.Integral) \
            or num_drafts <= 0:
        raise ValueError(f"num_drafts must be a positive integer or math.inf, got {num_drafts!r}")


def scaled_residual(p: jax.Array, q: jax.Array, scale: jax.Array) -> jax.Array:
    """``[q - S p]_+``: SD's rejection mass for ``S = 1``, batch SD's root for ``S = S_M``."""
    return jnp.maximum(q - scale * p, 0)


def _indicator(x):
    """``1[x > 0]`` for ``x >= 0`` by arithmetic (XLA CPU vectorises it better than a select)."""
    return jnp.sign(x)


def _scale_sweep(p, q, num_drafts):
    """``S_1 = 1, S_{m+1} = S_m + sum [q - S_m p]_+``; returns ``S_M`` and ``S_1..S_{M-1}``."""
    cum = jnp.ones(q.shape[:-1] + (1,), q.dtype)
    if num_drafts - 1 <= _UNROLL_DRAFTS:  # unrolled: each pass is one fused reduction
        cums = []
        for _ in range(num_drafts - 1):
            cums.append(cum)
            cum = cum + jnp.sum(scaled_residual(p, q, cum), axis=-1, keepdims=True)
        return cum, jnp.concatenate(cums, axis=-1)

    def step(cum, _):
        return cum + jnp.sum(scaled_residual(p, q, cum), axis=-1, keepdims=True), cum[..., 0]

    cum, cums = jax.lax.scan(step, cum, None, length=num_drafts - 1)
    return cum, jnp.moveaxis(cums, 0, -1)


_UNROLL_DRAFTS = 32


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def batch_scale(p: jax.Array, q: jax.Array, num_drafts: int) -> jax.Array:
    """``S_M`` of the batch residual chain (``(..., 1)``), so that ``w^{M+1} = [q - S_M p]_+``.

    The paper's residual chain is ``q^1 = q``, ``q^{m+1} = [q^m - p]_+ / r_m`` with
    ``r_m = TV(q^m, p)``. Carried un-normalised, ``w^m = (prod_{j<m} r_j) q^m`` obeys
    ``w^{m+1} = [w^m - s_m p]_+`` with ``s_m = sum w^m``, and by induction
    ``w^{m+1} = [q - S_m p]_+`` with ``S_m = s_1 + ... + s_m``: the whole chain reduces to a scalar
    recursion per row, ``S_1 = 1``, ``S_{m+1} = S_m + sum [q - S_m p]_+``. No division and no
    normalisation, so nothing breaks when a residual runs out of mass (``w`` is zero from there).

    The gradient is written by hand: with ``A_m = {x : q(x) > S_m p(x)}``,
    ``dS_{m+1} = (1 - p(A_m)) dS_m + sum_{A_m} (dq - S_m dp)``.

    Args:
      p: ``(..., V)`` draft probabilities.
      q: ``(..., V)`` target probabilities.
      num_drafts: ``M >= 1`` (static).
    """
    if num_drafts == 1:
        return jnp.ones(q.shape[:-1] + (1,), q.dtype)
    return _scale_sweep(p, q, num_drafts)[0]


def _batch_scale_fwd(p, q, num_drafts):
    if num_drafts == 1:
        return batch_scale(p, q, 1), (p, q, None)
    cum, cums = _scale_sweep(p, q, num_drafts)
    return cum, (p, q, cums)


def _batch_scale_bwd(num_drafts, res, g):
    p, q, cums = res
    if num_drafts == 1:
        return jnp.zeros_like(p), jnp.zeros_like(q)
    steps = num_drafts - 1
    # Cotangent of S_{m+1} (m = M-1 .. 1): c_M = g, c_m = c_{m+1} (1 - P_m), P_m = p(A_m).
    coeff = g
    grad_p = jnp.zeros_like(p)
    grad_q = jnp.zeros_like(q)

    def back(m, carry):
        coeff, grad_p, grad_q = carry
        cum_m = jax.lax.dynamic_slice_in_dim(cums, m, 1, -1)
        a = _indicator(scaled_residual(p, q, cum_m))  # 1[x in A_m]
        grad_q = grad_q + coeff * a
        grad_p = grad_p - (coeff * cum_m) * a
        coeff = coeff * (1 - jnp.sum(a * p, axis=-1, keepdims=True))
        return coeff, grad_p, grad_q

    carry = (coeff, grad_p, grad_q)
    if steps <= _UNROLL_DRAFTS:
        for m in reversed(range(steps)):
            carry = back(m, carry)
    else:
        carry = jax.lax.fori_loop(0, steps, lambda i, c: back(steps - 1 - i, c), carry)
    _, grad_p, grad_q = carry
    return grad_p, grad_q


batch_scale.defvjp(_batch_scale_fwd, _batch_scale_bwd)


def batch_residual_mass(p: jax.Array, q: jax.Array, *, num_drafts) -> jax.Array:
    """Un-normalised ``w^{M+1} = [q - S_M p]_+``: the mass left after ``M`` rejected drafts.

    ``sum w^{M+1} = prod_{m <= M} TV(q^m, p)``, the probability that all ``M`` drafts are
    rejected; see ``batch_scale`` for the closed form of the residual chain.

    Args:
      p: ``(..., V)`` draft probabilities.
      q: ``(..., V)`` target probabilities.
      num_drafts: ``M >= 1`` (static), or ``math.inf`` for the limit ``M -> infinity``, which is
        ``q`` restricted to the tokens the draft can never propose (``p = 0``). (The paper's
        Proposition "increasing batch size doesn't help" assumes the product of TVs tends to 0;
        that holds exactly when ``q`` puts no mass where ``p = 0``.) Convergence to the limit is
        geometric with rate ``1 - p(x*)`` at the token ``x*`` maximising ``q / p``, so it can
        be slow when the draft rarely proposes that token.

    Returns:
      ``(..., V)`` non-negative masses.

    References:
      Theorem 3 and its appendix proof (the residual chain ``q^{m+1} = [q^m - p]_+``).
    """
    check_num_drafts(num_drafts)
    if num_drafts == math.inf:
        return jnp.where(p > 0, jnp.zeros_like(q), q)
    return scaled_residual(p, q, batch_scale(p, q, num_drafts))


def batch_root_law(p: jax.Array, q: jax.Array, num_drafts) -> VerificationLaw:
    """The first token after a target call in batch SD: ``M`` drafts verified in turn.

    Draft ``m`` is verified by SD against ``q^m``, where ``q^1 = q`` and
    ``q^{m+1} = [q^m - p]_+`` (normalised). If all ``M`` are rejected the token is drawn from
    ``q^{M+1}``, as in the appendix proof of unbiasedness (step 1). Algorithm 4's pseudo-code, read
    literally, would draw it from ``q^{M+2}``, which is biased; specjax follows the proof.

    The token is ``x`` and rejected with mass ``w^{M+1}(x)`` (``batch_residual_mass``); accepted
    otherwise, so ``accepted = q - w^{M+1}`` and the step is unbiased by construction.

    Args:
      p: ``(..., V)`` draft probabilities.
      q: ``(..., V)`` target probabilities.
      num_drafts: ``M >= 1`` (static) or ``math.inf``.

    References:
      Algorithm 4 and Theorem "Unbiasedness of batch SD" (appendix), Theorem 3.
    """
    rejected = batch_residual_mass(p, q, num_drafts=num_drafts)
    return VerificationLaw(q - rejected, rejected)


#: Largest ``V^M x rows`` (the size of the biggest array of the enumeration) that
#: ``batch_without_replacement_root_law`` builds: 256 MB in float32.
MAX_WITHOUT_REPLACEMENT_ELEMENTS = 2**26


def without_replacement_stages(num_drafts, num_states: int) -> int:
    """How many drafts without replacement can be drawn from ``V`` tokens: ``min(M, V)``."""
    return num_states if num_drafts == math.inf else min(int(num_drafts), num_states)


def check_without_replacement_size(num_drafts, num_states: int, num_rows: int) -> None:
    """Raises ``ValueError`` (naming ``num_drafts``) when the root law of ``num_rows`` rows would
    need more than ``MAX_WITHOUT_REPLACEMENT_ELEMENTS`` elements per array."""
    stages = without_replacement_stages(num_drafts, num_states)
    elements = num_states ** stages * max(int(num_rows), 1)
    if elements > MAX_WITHOUT_REPLACEMENT_ELEMENTS:
        raise ValueError(
            f"num_drafts = {num_drafts} without replacement enumerates V^M x rows = "
            f"{num_states}^{stages} x {num_rows:,} = {elements:,} elements, more than "
            f"{MAX_WITHOUT_REPLACEMENT_ELEMENTS:,}; use fewer drafts (or fewer rows or chains)")


def batch_without_replacement_root_law(p: jax.Array, q: jax.Array,
                                       num_drafts) -> VerificationLaw:
    """The first token after a target call when the ``M`` drafts are drawn without replacement.

    Multi-candidate SD (Yang et al. 2024) / recursive rejection sampling (Jeon et al. 2024): the
    first tokens of the ``M`` drafts are drawn without replacement, ``x_m ~ d_m`` with ``d_1 = p``
    and ``d_{m+1}`` = ``d_m`` with ``x_m`` removed (renormalised). Draft ``m`` is accepted with
    ``min(1, r_m(x_m) / d_m(x_m))`` against the residual target ``r_1 = q``,
    ``r_{m+1} = [r_m - d_m]_+`` (normalised); if every draft is rejected, or the draft law runs out
    of tokens first, the token is drawn from the current residual. Each stage is an exact
    rejection coupling of ``r_m`` with ``d_m``, so the step is unbiased (``accepted + rejected =
    q``, tested). A rejected ``x_m`` has ``r_{m+1}(x_m) = 0``, so removing it from the draft
    loses nothing.

    The law depends on the order of the draws, so it is computed by enumerating the
    ``V^(m-1)`` paths of rejected draws at stage ``m``, all rows at once (``O(V^M)`` work and
    memory per row, refused beyond ``MAX_WITHOUT_REPLACEMENT_ELEMENTS``). ``M`` is capped at
    ``V`` (``math.inf`` means ``V``: every token the draft can propose).

    Args:
      p: ``(..., V)`` draft probabilities.
      q: ``(..., V)`` target probabilities.
      num_drafts: ``M >= 1`` (static) or ``math.inf``.

    Returns:
      ``VerificationLaw``: ``accepted(x)`` = P(token ``x``, some draft accepted), ``rejected(x)`` =
      P(token ``x``, every draft rejected).

    Raises:
      ValueError: ``num_drafts`` is invalid, or ``V^M`` times the number of rows exceeds
        ``MAX_WITHOUT_REPLACEMENT_ELEMENTS``.

    References:
      Yang et al. 2024, "Multi-candidate speculative decoding"; Jeon et al. 2024, "Recursive
      speculative decoding".
    """
    check_num_drafts(num_drafts)
    num_states = p.shape[-1]
    stages = without_replacement_stages(num_drafts, num_states)
    rows = q.shape[:-1]
    check_without_replacement_size(num_drafts, num_states, math.prod(rows))
    removed = 1 - jnp.eye(num_states, dtype=p.dtype)  # removed[x] zeroes token x
    removed = removed.reshape((1,) * (1 + len(rows)) + removed.shape)
    # One entry per path of rejected draws so far (leading axis): its probability, its draft law.
    weight = jnp.ones((1,) + rows, q.dtype)
    draft = p[None]
    residual = q[None]
    accepted = jnp.zeros_like(q)
    rejected = jnp.zeros_like(q)
    for stage in range(stages):
        # A path whose draft law has no token left draws its token from the residual.
        exhausted = 1 - _indicator(jnp.sum(draft, axis=-1))
        rejected = rejected + jnp.sum((weight * exhausted)[..., None] * residual, axis=0)
        accepted = accepted + jnp.sum(weight[..., None] * jnp.minimum(draft, residual), axis=0)
        reject_x = weight[..., None] * jnp.maximum(draft - residual, 0)  # (P, ..., V)
        next_residual = safe_normalize(jnp.maximum(residual - draft, 0))
        if stage == stages - 1:
            rejected = rejected + jnp.sum(
                jnp.sum(reject_x, axis=-1)[..., None] * next_residual, axis=0)
            break
        # Branch on the rejected token x: (P, ..., V) -> (P * V, ...).
        paths = weight.shape[0]
        weight = jnp.moveaxis(reject_x, -1, 1).reshape((paths * num_states,) + rows)
        draft = safe_normalize(draft[..., None, :] * removed)  # (P, ..., V_x, V)
        draft = jnp.moveaxis(draft, -2, 1).reshape((paths * num_states,) + rows + (num_states,))
        residual = jnp.broadcast_to(next_residual[:, None],
                                    (paths, num_states) + rows + (num_states,))
        residual = residual.reshape((paths * num_states,) + rows + (num_states,))
    return VerificationLaw(accepted, rejected)


# ---------------------------------------------------------------------------------------------
# Single-token quantities of the theory.


def tv_distance(p: jax.Array, q: jax.Array) -> jax.Array:
    """Total variation distance ``(1/2) sum |p - q|`` over the last axis: ``(..., V) -> (...)``."""
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
    loss = 0.5 * jnp.sum(jnp.abs(q - accept_prob * p), axis=-1) \
        - 0.5 * rejection_probability(p, accept_prob)
    return jnp.maximum(loss, 0)


def batch_improvement(p: jax.Array, q: jax.Array, *, num_drafts) -> jax.Array:
    """Single-token batch improvement ``TV(q, p) - prod_{m <= M} TV(q^m, p)``.

    The drop in rejection probability at the root of a call when ``M`` drafts are verified in
    turn instead of one. Closed forms (the paper, Section 3.2): ``q`` uniform on ``V / r`` of the
    ``V`` tokens and ``p`` uniform on all of them gives ``(1 - 1/r) - (1 - 1/r)^M``;
    ``p = Ber(u)``, ``q = Ber(v)``, ``u >= v`` gives ``|u - v| (1 - u^{M - 1})``.

    Args:
      p: ``(..., V)`` draft probabilities.
      q: ``(..., V)`` target probabilities.
      num_drafts: ``M >= 1`` (static) or ``math.inf``.

    Returns:
      ``(...)``; zero for ``M = 1``.

    References:
      Theorem 3 (batch improvement), Figure 4.
    """
    single = jnp.sum(scaled_residual(p, q, 1), axis=-1)
    return single - jnp.sum(batch_residual_mass(p, q, num_drafts=num_drafts), axis=-1)
