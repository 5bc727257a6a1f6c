"""The root laws of multi-draft verification: batch SD's residual chain (with replacement) and
recursive rejection sampling (without replacement), with their single-token quantities.

``specjax.decoders.batch.BatchSpeculative`` verifies its ``M`` drafts at the root of a call with
these laws; inside a call it is SD (``specjax.decoders.verification.speculative_law``). This module
also holds the checks every multi-draft decoder shares (``check_num_drafts``,
``check_finite_num_drafts``, ``broadcast_rows``, the without-replacement size limit).

The verifiers that build on these laws have their own modules, and their names are served from
here too: the optimal verifier of ``M`` drafts (``optimal_acceptance``, ``optimal_root_law``,
``ratio_order``, ...) in ``specjax.decoders.optimal_acceptance``, the sequence-optimal verifier
(``weighted_optimal_root_law``, ``sequence_optimal_weights``) in
``specjax.decoders.sequence_optimal``.
"""

from __future__ import annotations

import functools
import math
import numbers

import jax
import jax.numpy as jnp

from specjax import _checks

from specjax.decoders.verification import VerificationLaw
from specjax.decoders.verification import safe_normalize
from specjax.decoders.verification import scaled_residual
from specjax.numerics import indicator

__all__ = [
    "MAX_DRAFTS",
    "MAX_WITHOUT_REPLACEMENT_ELEMENTS",
    "batch_improvement",
    "batch_residual_mass",
    "batch_root_law",
    "batch_scale",
    "batch_without_replacement_root_law",
    "broadcast_rows",
    "check_finite_num_drafts",
    "check_num_drafts",
    "check_without_replacement_size",
    "scale_sweep",
    "with_replacement_stage_laws",
    "without_replacement_stage_laws",
    "without_replacement_stages",
]


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
    if num_drafts > MAX_DRAFTS:
        raise ValueError(
            f"num_drafts must be at most {MAX_DRAFTS:,} (the residual chain takes one pass per "
            f"draft), got {num_drafts:,}; for the limit M -> infinity pass math.inf")


def check_finite_num_drafts(num_drafts, scheme: str, why: str,
                            verb: str = "is not defined for") -> None:
    """``check_num_drafts``, and ``math.inf`` refused: "num_drafts = math.inf {verb} {scheme}
    ({why})", pointing to the decoders that take it."""
    check_num_drafts(num_drafts)
    if num_drafts == math.inf:
        raise ValueError(f"num_drafts = math.inf {verb} {scheme} ({why}); pass a "
                         f"finite int, or use OptimalMultiDraft(math.inf) / "
                         f"BatchSpeculative(math.inf)")


def broadcast_rows(p, q):
    """``p`` and ``q`` broadcast against each other, in their common dtype."""
    shape = jnp.broadcast_shapes(jnp.shape(p), jnp.shape(q))
    dtype = jnp.result_type(p, q)
    return jnp.broadcast_to(p, shape).astype(dtype), jnp.broadcast_to(q, shape).astype(dtype)


#: The most drafts a batch decoder takes as an integer (one residual pass each); ``math.inf``
#: gives the limit ``M -> infinity`` in closed form.
MAX_DRAFTS = 2**20


def scale_sweep(p, q, num_drafts):
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
    return scale_sweep(p, q, num_drafts)[0]


def _batch_scale_fwd(p, q, num_drafts):
    if num_drafts == 1:
        return batch_scale(p, q, 1), (p, q, None)
    cum, cums = scale_sweep(p, q, num_drafts)
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
        a = indicator(scaled_residual(p, q, cum_m))  # 1[x in A_m]
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
    _checks.check_rows(probabilities={"p": p, "q": q})
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


def with_replacement_stage_laws(p: jax.Array, q: jax.Array, num_drafts: int):
    """Recursive rejection sampling of ``M`` i.i.d. drafts (SpecInfer's multi-step speculative
    sampling, batch SD's root), draft by draft.

    Draft ``m`` is accepted with ``min(1, r_m / p)`` against ``r_1 = q``,
    ``r_{m+1} = [r_m - p]_+`` (normalised). Written with the un-normalised residual
    ``w_m = W_m r_m`` (``W_m`` = P(drafts ``1..m-1`` rejected) ``= sum w_m``), which needs no
    division: ``accepted_m = min(W_m p, w_m)``, ``w_{m+1} = [w_m - W_m p]_+``.

    Args:
      p: ``(..., V)`` draft probabilities.
      q: ``(..., V)`` target probabilities.
      num_drafts: ``M >= 1`` (static, finite).

    Returns:
      ``(accepted, rejected)``: ``accepted[m - 1](x)`` = P(drafts ``1..m-1`` rejected, draft
      ``m`` is ``x`` and accepted), ``(M, ..., V)``; ``rejected = w_{M+1}``, the mass of the token
      drawn after every draft is rejected. ``sum(accepted, 0) + rejected = q``.
    """
    residual = q
    accepted = []
    for _ in range(int(num_drafts)):
        scaled = jnp.sum(residual, axis=-1, keepdims=True) * p
        accepted.append(jnp.minimum(scaled, residual))
        residual = jnp.maximum(residual - scaled, 0)
    return jnp.stack(accepted), residual


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
    stages, rejected = without_replacement_stage_laws(p, q, num_drafts)
    return VerificationLaw(jnp.sum(stages, axis=0), rejected)


def without_replacement_stage_laws(p: jax.Array, q: jax.Array, num_drafts):
    """Recursive rejection sampling without replacement, draft by draft: the mass each draft
    accepts and the mass drawn from the last residual.

    The rule of ``batch_without_replacement_root_law`` (which sums the stages); a token tree
    needs the stages apart, since the ``m``-th child of a node carries its own subtree.

    Args:
      p: ``(..., V)`` draft probabilities.
      q: ``(..., V)`` target probabilities.
      num_drafts: ``M >= 1`` (static, finite).

    Returns:
      ``(accepted, rejected)``: ``accepted[m - 1](x)`` = P(drafts ``1..m-1`` rejected, draft
      ``m`` is ``x`` and accepted), ``(M, ..., V)`` (zero for ``m > V``: no token is left to
      draw); ``rejected(x)`` = P(every draft rejected, or the draft law ran out, and the token
      is ``x``), ``(..., V)``.
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
    accepted = []
    rejected = jnp.zeros_like(q)
    for stage in range(stages):
        # A path whose draft law has no token left draws its token from the residual.
        exhausted = 1 - indicator(jnp.sum(draft, axis=-1))
        rejected = rejected + jnp.sum((weight * exhausted)[..., None] * residual, axis=0)
        accepted.append(jnp.sum(weight[..., None] * jnp.minimum(draft, residual), axis=0))
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
    missing = int(num_drafts) - stages if num_drafts != math.inf else 0
    accepted = jnp.stack(accepted + [jnp.zeros_like(q)] * missing)
    return accepted, rejected


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
    _checks.check_rows(probabilities={"p": p, "q": q})
    single = jnp.sum(scaled_residual(p, q, 1), axis=-1)
    return single - jnp.sum(batch_residual_mass(p, q, num_drafts=num_drafts), axis=-1)


# The verifiers that build on these root laws, served from here too (``from
# specjax.decoders.multi_draft import optimal_acceptance``). Imported last: their modules import
# the checks above, and every import of specjax loads this module before them.
from specjax.decoders.optimal_acceptance import PACKED_SORT_MAX_STATES  # noqa: E402
from specjax.decoders.optimal_acceptance import (  # noqa: E402
    check_optimal_without_replacement_size)
from specjax.decoders.optimal_acceptance import inverse_permutation  # noqa: E402
from specjax.decoders.optimal_acceptance import optimal_acceptance  # noqa: E402
from specjax.decoders.optimal_acceptance import optimal_root_law  # noqa: E402
from specjax.decoders.optimal_acceptance import ratio_order  # noqa: E402
from specjax.decoders.optimal_acceptance import stable_argsort_nonnegative  # noqa: E402
from specjax.decoders.sequence_optimal import MAX_SEQUENCE_OPTIMAL_ELEMENTS  # noqa: E402
from specjax.decoders.sequence_optimal import check_sequence_optimal_size  # noqa: E402
from specjax.decoders.sequence_optimal import sequence_optimal_weights  # noqa: E402
from specjax.decoders.sequence_optimal import weighted_optimal_root_law  # noqa: E402
