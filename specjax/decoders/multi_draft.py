"""The root laws of multi-draft verification: batch SD's residual chain (with replacement) and
recursive rejection sampling (without replacement), with their single-token quantities.

``specjax.decoders.batch.BatchSpeculative`` verifies its ``M`` drafts at the root of a call with
these laws; inside a call it is SD (``specjax.decoders.verification.speculative_law``).
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


# --- The optimal verifier of M drafts -----------------------------------------------------------
#
# A lossless verifier of a draft set S couples S with an output Y ~ q and accepts when Y is in S.
# Max-flow / min-cut (sets S with mass P(S) -> tokens y in S -> the sink with capacity q(y)) gives
# the best acceptance: alpha* = 1 - max_A [P(S subset of A) - q(A)] over token sets A. For i.i.d.
# drafts P(S subset of A) = p(A)^M; an exchange argument (adding j outside A or removing i inside
# it does not help) puts every i in an optimal A below every j outside it in q/p, so the maximum
# runs over the V + 1 prefixes of the tokens sorted by q/p ascending. Without replacement the same
# holds on every case the tests enumerate (checked against a linear program and every subset).
#
# The matched masses m(y) = P(Y = y, Y in S) of an optimal coupling are a maximal point of the
# polymatroid {m <= q, m(G) <= P(S meets G)}. The greedy vertex in order of q/p descending (the
# tokens the target wants more than the draft offers are matched first) reads
# m = q~ + diff(cummin(g)), g_l = 1 - P(S subset of the complement of the top l) - q(top l), which
# is O(V log V) per row. The tests check it against a linear program (a coupling with these
# matched masses exists) and that it sums to alpha*.


def _check_replacement(replacement) -> None:
    if not isinstance(replacement, bool):
        raise ValueError(f"replacement must be True or False, got {replacement!r}")


def inverse_permutation(order: jax.Array) -> jax.Array:
    """``rank`` with ``rank[..., order[..., i]] = i`` (a scatter, not a second sort)."""
    index = jnp.broadcast_to(jnp.arange(order.shape[-1], dtype=order.dtype), order.shape)
    return _unpermute(index, order)


def ratio_order(p: jax.Array, q: jax.Array) -> jax.Array:
    """The permutation sorting each row by ``q / p`` ascending (``+inf`` where ``p = 0 < q``,
    ``0`` where both are 0), ties in token order; ``(..., V)`` int32, a constant of the
    computation (no gradient flows through it)."""
    p, q = jax.lax.stop_gradient(p), jax.lax.stop_gradient(q)
    ratio = q / jnp.where(p > 0, p, jnp.ones_like(p))
    ratio = jnp.where(p > 0, ratio, jnp.where(q > 0, jnp.inf, 0))
    return stable_argsort_nonnegative(jnp.where(ratio > 0, ratio, 0))  # no -0.0


#: Largest ``V`` whose float32 rows ``stable_argsort_nonnegative`` sorts by packed int32 keys
#: (a token index takes 15 bits of the key).
PACKED_SORT_MAX_STATES = 2**15


def stable_argsort_nonnegative(x: jax.Array) -> jax.Array:
    """``jnp.argsort(x, axis=-1, stable=True)`` for ``x >= 0`` without NaN (``+inf`` allowed):
    ties in token order. Same permutation, faster on CPU for float32 rows of ``V <= 2^15``.

    XLA's CPU sort is fast for one int32 operand and about six times slower for a float key or
    for a key with a value carried along (its generic comparator), which is what an argsort is.
    The bits of a non-negative float32 sort as the float does, so two passes of a least
    significant digit radix sort on packed single int32 keys give the exact stable order:
    pass 1 sorts ``(low 16 bits of x) << 15 | token``, pass 2 sorts ``(high 15 bits of x) << 15
    | position after pass 1`` (the position breaks ties of the high bits by the low bits, then
    by token). Other dtypes and larger ``V`` use ``jnp.argsort``. Integer outputs: no
    gradient.
    """
    num_states = x.shape[-1]
    if x.dtype != jnp.float32 or num_states > PACKED_SORT_MAX_STATES:
        return jnp.argsort(x, axis=-1, stable=True)
    bits = jax.lax.bitcast_convert_type(x, jnp.int32)  # x >= 0: bit 31 is 0
    index = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    low_mask, index_mask = jnp.int32(0xFFFF), jnp.int32(PACKED_SORT_MAX_STATES - 1)
    first = jnp.sort(((bits & low_mask) << 15) | index, axis=-1) & index_mask  # (.., V) tokens
    high = jnp.take_along_axis(bits >> 16, first, axis=-1)  # 15 bits, in pass-1 order
    position = jnp.sort((high << 15) | index, axis=-1) & index_mask
    return jnp.take_along_axis(first, position, axis=-1)


def _unpermute(values: jax.Array, order: jax.Array) -> jax.Array:
    """``out[..., order[..., i]] = values[..., i]``: back from a sorted order to token order
    (a scatter, rather than a gather by ``argsort(order)``, which would cost a second sort)."""
    lead = values.shape[:-1]
    flat_values = values.reshape((-1, values.shape[-1]))
    flat_order = jnp.broadcast_to(order, values.shape).reshape(flat_values.shape)
    rows = jnp.arange(flat_values.shape[0])[:, None]
    out = jnp.zeros_like(flat_values).at[rows, flat_order].set(flat_values,
                                                                 unique_indices=True)
    return out.reshape(lead + values.shape[-1:])


def _prefix_with_zero(x: jax.Array) -> jax.Array:
    """``[0, x_1, x_1 + x_2, ...]``: cumulative sums over the last axis with a leading 0."""
    return jnp.concatenate([jnp.zeros_like(x[..., :1]), jnp.cumsum(x, axis=-1)], axis=-1)


def _without_replacement_prefix_law(p_sorted: jax.Array, stages: int) -> jax.Array:
    """``F_k = P(S within the first k tokens)``, ``k = 0..V``, for ``stages`` draws without
    replacement from ``p_sorted`` (drawing stops when the draft has no token left): the law of
    the largest index drawn, by enumerating the ``V^stages`` paths of draws."""
    num_states = p_sorted.shape[-1]
    rows = p_sorted.shape[:-1]
    index = jnp.arange(1, num_states + 1)  # token x puts the largest index at least at x + 1
    bins = jnp.arange(num_states + 1)
    removed = 1 - jnp.eye(num_states, dtype=p_sorted.dtype)
    removed = removed.reshape((1,) * (1 + len(rows)) + removed.shape)
    weight = jnp.ones((1,) + rows, p_sorted.dtype)
    draft = p_sorted[None]
    top = jnp.zeros((1,) + rows, jnp.int32)  # the largest index drawn so far (0: none)
    law = jnp.zeros(rows + (num_states + 1,), p_sorted.dtype)

    def at_top(mass, top):  # mass (P, ...) put at bin top (P, ...), summed over paths
        hit = top[..., None] == bins.reshape((1,) * top.ndim + bins.shape)
        return jnp.sum(mass[..., None] * hit, axis=0)

    def expand(x):  # (V,) -> (1, ..., 1, V) against (P, ..., V)
        return x.reshape((1,) * (1 + len(rows)) + x.shape)

    for stage in range(stages):
        exhausted = 1 - indicator(jnp.sum(draft, axis=-1))
        law = law + at_top(weight * exhausted, top)
        branch = weight[..., None] * draft  # (P, ..., V): draw token x next
        above = expand(index) > top[..., None]  # x + 1 > top: it becomes x + 1
        if stage == stages - 1:
            below = jnp.sum(jnp.where(above, 0, branch), axis=-1)  # (P, ...): top unchanged
            law = law + at_top(below, top)
            law = law.at[..., 1:].add(jnp.sum(jnp.where(above, branch, 0), axis=0))
            break
        paths = weight.shape[0]
        weight = jnp.moveaxis(branch, -1, 1).reshape((paths * num_states,) + rows)
        top = jnp.moveaxis(jnp.maximum(top[..., None], expand(index)), -1, 1)
        top = top.reshape((paths * num_states,) + rows)
        draft = safe_normalize(draft[..., None, :] * removed)  # (P, ..., V_x, V)
        draft = jnp.moveaxis(draft, -2, 1).reshape(
            (paths * num_states,) + rows + (num_states,))
    return jnp.cumsum(law, axis=-1)


def _optimal_prefix_terms(p: jax.Array, q: jax.Array, num_drafts, replacement: bool):
    """The rows sorted by ``q / p`` ascending, with ``F_k = P(S within the first k)`` and
    ``Q_k = q(first k)`` for ``k = 0..V``: ``(order, q_sorted, F, Q)``."""
    shape = jnp.broadcast_shapes(jnp.shape(p), jnp.shape(q))
    p, q = jnp.broadcast_to(p, shape), jnp.broadcast_to(q, shape)
    order = ratio_order(p, q)
    p_sorted = jnp.take_along_axis(p, order, axis=-1)
    q_sorted = jnp.take_along_axis(q, order, axis=-1)
    num_states = p.shape[-1]
    if without_replacement_stages(num_drafts, num_states) == num_states \
            and (num_drafts == math.inf or not replacement):
        # Every token the draft can propose is drawn: S is the support of p.
        outside = jnp.flip(_prefix_with_zero(jnp.flip(p_sorted, -1)), -1)  # p after the k-th
        cover = (outside == 0).astype(p_sorted.dtype)
    elif replacement:
        cover = _prefix_with_zero(p_sorted) ** int(num_drafts)
    else:
        cover = _without_replacement_prefix_law(
            p_sorted, without_replacement_stages(num_drafts, num_states))
    return order, q_sorted, cover, _prefix_with_zero(q_sorted)


def check_optimal_without_replacement_size(num_drafts, num_states: int, num_rows: int) -> None:
    """As ``check_without_replacement_size``, except that ``M >= V`` (and ``math.inf``) is
    computed in closed form (the draft set is the support of ``p``) and never refused."""
    if without_replacement_stages(num_drafts, num_states) < num_states:
        check_without_replacement_size(num_drafts, num_states, num_rows)


def _check_optimal(p, q, num_drafts, replacement) -> None:
    _checks.check_rows(probabilities={"p": p, "q": q})
    check_num_drafts(num_drafts)
    _check_replacement(replacement)
    if not replacement:
        rows = math.prod(jnp.broadcast_shapes(jnp.shape(p), jnp.shape(q))[:-1])
        check_optimal_without_replacement_size(num_drafts, jnp.shape(p)[-1], rows)


def optimal_acceptance(p: jax.Array, q: jax.Array, *, num_drafts,
                       replacement: bool = True) -> jax.Array:
    """The best acceptance of any lossless verifier of ``M`` drafts (the first tokens of the
    drafts of one call): ``alpha* = 1 - max_A [P(S within A) - q(A)]``.

    A lossless verifier outputs ``Y ~ q`` from the draft set ``S`` and accepts when ``Y`` is in
    ``S``; the best ``P(Y in S)`` is an optimal-transport value, and max-flow / min-cut turns it
    into the minimum above over token sets ``A``. The maximising ``A`` is a prefix of the tokens
    sorted by ``q / p`` ascending (an exchange argument for i.i.d. drafts; verified against every
    subset and a linear program without replacement), so ``alpha*`` costs one sort per row.

    ``M = 1`` gives SD's ``sum min(p, q)``; ``alpha*`` grows with ``M`` to ``q(p > 0)`` and is at
    least batch SD's ``1 - sum w^{M+1}`` (tested).

    Args:
      p: ``(..., V)`` draft probabilities.
      q: ``(..., V)`` target probabilities.
      num_drafts: ``M >= 1`` (static), or ``math.inf``.
      replacement: ``True``: the drafts are i.i.d. from ``p``; ``False``: drawn without
        replacement (enumerates ``V^M`` draw paths per row, refused beyond
        ``MAX_WITHOUT_REPLACEMENT_ELEMENTS`` as ``BatchSpeculative(replacement=False)``).

    Returns:
      ``(...)``: ``alpha*``, differentiable in ``p`` and ``q`` (a subgradient where two prefixes
      tie); finite at zeros, ``p = q`` and disjoint supports.

    References:
      Sun et al. 2023, "SpecTr" (optimal transport with membership cost); Hu et al. 2025,
      "Towards optimal multi-draft speculative decoding" (the sorted form).
    """
    _check_optimal(p, q, num_drafts, replacement)
    _, _, cover, q_cum = _optimal_prefix_terms(p, q, num_drafts, replacement)
    return 1 - jnp.max(cover - q_cum, axis=-1)


def optimal_root_law(p: jax.Array, q: jax.Array, num_drafts,
                     replacement: bool = True) -> VerificationLaw:
    """The first token after a target call under the optimal verifier of ``M`` drafts.

    ``accepted(x)`` is the matched mass ``m(x) = P(Y = x, x in S)`` of an optimal coupling: the
    greedy vertex of ``{m <= q, m(G) <= P(S meets G)}`` taken in order of ``q / p`` descending,
    ``m = q~ + diff(cummin(g))`` with ``g_l = 1 - P(S within the complement of the top l) -
    q(top l)``; ``sum m = optimal_acceptance``. ``rejected = q - m``, so the step is unbiased by
    construction; a linear program in the tests finds a coupling of the draft set and ``Y ~ q``
    with exactly these matched masses.

    Args:
      p: ``(..., V)`` draft probabilities.
      q: ``(..., V)`` target probabilities.
      num_drafts: ``M >= 1`` (static) or ``math.inf``.
      replacement: i.i.d. drafts (``True``) or without replacement.
    """
    order, q_sorted, cover, _ = _optimal_prefix_terms(p, q, num_drafts, replacement)
    q_desc = jnp.flip(q_sorted, -1)
    g = 1 - jnp.flip(cover, -1) - _prefix_with_zero(q_desc)  # g_l over the top l, l = 0..V
    g = g.at[..., 0].set(0)  # no token: nothing matched, exactly
    cum = jax.lax.cummin(g, axis=g.ndim - 1)
    matched = jnp.clip(q_desc + jnp.diff(cum, axis=-1), 0, q_desc)
    matched = jnp.flip(matched, -1)  # back to ascending order, then to token order
    accepted = _unpermute(matched, order)
    q_full = jnp.broadcast_to(q, accepted.shape)
    return VerificationLaw(accepted, jnp.maximum(q_full - accepted, 0))


# --- The sequence-optimal verifier: which tokens to match, by backward induction ----------------
#
# Every m of the polymatroid above is the matched mass of some lossless coupling, so a verifier
# may match the tokens whose match saves the most later: at the root of position n it maximises
# sum_y m(y) w_n(y), with w_n(y) = 1 + R_root(y) - R_in(y) the rejections saved by matching y
# (R_root, R_in: expected rejections after position n when x_n = y opens a new call or continues
# the current one). Edmonds' greedy solves it: tokens in order of w descending (those with
# w <= 0 are not matched), each raised to the truncated rank rho'(G) = min_{H within G}
# [q(G \ H) + rho(H)], rho(H) = 1 - (1 - p(H))^M. For i.i.d. drafts the minimising H is the
# tokens of G with the largest q/p (the exchange argument of the per-token optimum), so
# rho'(G_k) costs one masked cumulative sum: O(V^2) per row.

#: Largest ``rows x (V + 1)^2`` the weighted greedy builds (``OptimalMultiDraft`` with
#: ``sequence_optimal=True``): 256 MB per array in float32 (the greedy holds a few such arrays).
MAX_SEQUENCE_OPTIMAL_ELEMENTS = 2**26


def check_sequence_optimal_size(num_states: int, num_rows: int) -> None:
    """Raises ``ValueError`` (naming ``sequence_optimal``) when the weighted greedy of
    ``num_rows`` rows would build more than ``MAX_SEQUENCE_OPTIMAL_ELEMENTS`` elements."""
    elements = max(int(num_rows), 1) * (num_states + 1) ** 2
    if elements > MAX_SEQUENCE_OPTIMAL_ELEMENTS:
        raise ValueError(
            f"sequence_optimal=True builds rows x (V + 1)^2 = {num_rows:,} x {num_states + 1}^2 "
            f"= {elements:,} elements (rows: T x V on Markov chains), more than "
            f"{MAX_SEQUENCE_OPTIMAL_ELEMENTS:,}; use sequence_optimal=False (the per-token "
            f"optimum), a smaller V or a shorter horizon T")


def weighted_optimal_root_law(p: jax.Array, q: jax.Array, weights: jax.Array,
                              num_drafts) -> VerificationLaw:
    """The root law of the lossless coupling of ``M`` i.i.d. drafts that maximises
    ``sum_y m(y) weights(y)`` over the matched masses ``m`` (Edmonds' greedy on the polymatroid
    ``{m <= q, m(G) <= 1 - (1 - p(G))^M}``; tokens with ``weights <= 0`` are not matched).

    Every point of that polymatroid is the matched mass of a lossless verifier that may also
    decline a drafted token: output it as a rejection and end the call (as batch SD may output a
    drafted token after rejecting every draft). A maximal point needs no declining; a weight
    ``<= 0`` (following that draft costs more later than a new call) asks for it. The tests'
    oracle is a linear program over such verifiers.

    ``weights`` broadcasts against the rows; it fixes an order and a sign only, so no gradient
    flows through it. With ``weights = q / p`` it is ``optimal_root_law``.
    """
    shape = jnp.broadcast_shapes(jnp.shape(p), jnp.shape(q), jnp.shape(weights))
    p, q = jnp.broadcast_to(p, shape), jnp.broadcast_to(q, shape)
    weights = jax.lax.stop_gradient(jnp.broadcast_to(weights, shape))
    if num_drafts == math.inf:  # rho(G) = 1[p(G) > 0]: every token the draft proposes
        accepted = q * indicator(p) * (weights > 0)
        return VerificationLaw(accepted, q - accepted)
    num_states = shape[-1]
    ratio_desc = jnp.flip(ratio_order(p, q), -1)
    p_r = jnp.take_along_axis(p, ratio_desc, axis=-1)  # rows in order of q / p descending
    q_r = jnp.take_along_axis(q, ratio_desc, axis=-1)
    w_r = jnp.take_along_axis(weights, ratio_desc, axis=-1)
    # rank[j]: the place of token j (in q/p order) in the order of weights descending.
    rank = inverse_permutation(jnp.argsort(-w_r, axis=-1, stable=True))
    prefix = jnp.arange(num_states + 1).reshape((1,) * (len(shape) - 1) + (-1, 1))
    member = (rank[..., None, :] < prefix).astype(p.dtype)  # (..., k, j): j in G_k
    p_mass = _prefix_with_zero(member * p_r[..., None, :])  # (..., k, l): p(top l of G_k)
    q_mass = _prefix_with_zero(member * q_r[..., None, :])
    g = 1 - (1 - jnp.clip(p_mass, 0, 1)) ** int(num_drafts) - q_mass
    rank_cut = q_mass[..., -1] + jnp.minimum(jnp.min(g, axis=-1), 0)  # rho'(G_k), k = 0..V
    gain = jnp.diff(rank_cut, axis=-1)  # (..., k): the k-th token of the weight order
    gain_r = jnp.take_along_axis(gain, rank, axis=-1)  # back to q/p order
    matched_r = jnp.clip(gain_r, 0, q_r) * (w_r > 0)
    accepted = _unpermute(matched_r, ratio_desc)
    return VerificationLaw(accepted, q - accepted)


def sequence_optimal_weights(p: jax.Array, q: jax.Array, num_drafts) -> jax.Array:
    """``w_n(y) = 1 + R_root,n(y) - R_in,n(y)`` for ``n = 1..T`` (``(T, V)``): the expected
    rejections after position ``n`` saved by matching token ``y`` at a call root there, for the
    depth-first multi-draft decoder (``K = T``) whose roots maximise ``sum_y m(y) w_n(y)``.

    Backward induction on Markov transitions ``p``, ``q`` ``(T, V, V)``:
    ``R_in,n-1(x) = sum_y min(p, q)(y) R_in,n(y) + [q - p]_+(y) (1 + R_root,n(y))`` and
    ``R_root,n-1(x) = sum_y m(y) R_in,n(y) + (q - m)(y) (1 + R_root,n(y))`` with ``m`` the
    weighted greedy root law; ``R_root,T = R_in,T = 0``. The policy minimises the expected
    rejections over every choice of matched masses at every root (Bellman), so its exact
    ``E[N_rej]`` is at most that of the per-token optimum (tested).
    """
    p, q = jax.lax.stop_gradient(p), jax.lax.stop_gradient(q)
    num_states = q.shape[-1]
    zero = jnp.zeros((num_states,), q.dtype)

    def step(values, rows):
        r_root, r_in = values
        p_n, q_n = rows
        weights = 1 + r_root - r_in
        root = weighted_optimal_root_law(p_n, q_n, weights[None, :], num_drafts)
        after_accept, after_reject = r_in[None, :], 1 + r_root[None, :]
        new_root = jnp.sum(root.accepted * after_accept + root.rejected * after_reject, -1)
        new_in = jnp.sum(jnp.minimum(p_n, q_n) * after_accept
                         + jnp.maximum(q_n - p_n, 0) * after_reject, -1)
        return (new_root, new_in), weights

    _, weights = jax.lax.scan(step, (zero, zero), (p, q), reverse=True)
    return weights
