"""The optimal verifier of ``M`` drafts at the root of a call: the best acceptance any lossless
verifier reaches (``optimal_acceptance``) and the root law that reaches it (``optimal_root_law``),
for drafts drawn with or without replacement; with the sorting helpers they share
(``ratio_order``, ``stable_argsort_nonnegative``, ``inverse_permutation``, ``unpermute``,
``prefix_with_zero``).

``specjax.decoders.optimal_multi_draft.OptimalMultiDraft`` verifies its root with this law; the
sequence-optimal verifier (``specjax.decoders.sequence_optimal``) and the Gumbel list coupling
build on its order. The names are served from ``specjax.decoders.multi_draft`` too.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from specjax import _checks

from specjax.decoders.multi_draft import check_num_drafts
from specjax.decoders.multi_draft import check_without_replacement_size
from specjax.decoders.multi_draft import without_replacement_stages
from specjax.decoders.verification import VerificationLaw
from specjax.decoders.verification import safe_normalize
from specjax.numerics import indicator


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


def check_replacement(replacement) -> None:
    if not isinstance(replacement, bool):
        raise ValueError(f"replacement must be True or False, got {replacement!r}")


def inverse_permutation(order: jax.Array) -> jax.Array:
    """``rank`` with ``rank[..., order[..., i]] = i`` (a scatter, not a second sort)."""
    index = jnp.broadcast_to(jnp.arange(order.shape[-1], dtype=order.dtype), order.shape)
    return unpermute(index, order)


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


def unpermute(values: jax.Array, order: jax.Array) -> jax.Array:
    """``out[..., order[..., i]] = values[..., i]``: back from a sorted order to token order
    (a scatter, rather than a gather by ``argsort(order)``, which would cost a second sort)."""
    lead = values.shape[:-1]
    flat_values = values.reshape((-1, values.shape[-1]))
    flat_order = jnp.broadcast_to(order, values.shape).reshape(flat_values.shape)
    rows = jnp.arange(flat_values.shape[0])[:, None]
    out = jnp.zeros_like(flat_values).at[rows, flat_order].set(flat_values,
                                                                 unique_indices=True)
    return out.reshape(lead + values.shape[-1:])


def prefix_with_zero(x: jax.Array) -> jax.Array:
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
        outside = jnp.flip(prefix_with_zero(jnp.flip(p_sorted, -1)), -1)  # p after the k-th
        cover = (outside == 0).astype(p_sorted.dtype)
    elif replacement:
        cover = prefix_with_zero(p_sorted) ** int(num_drafts)
    else:
        cover = _without_replacement_prefix_law(
            p_sorted, without_replacement_stages(num_drafts, num_states))
    return order, q_sorted, cover, prefix_with_zero(q_sorted)


def check_optimal_without_replacement_size(num_drafts, num_states: int, num_rows: int) -> None:
    """As ``check_without_replacement_size``, except that ``M >= V`` (and ``math.inf``) is
    computed in closed form (the draft set is the support of ``p``) and never refused."""
    if without_replacement_stages(num_drafts, num_states) < num_states:
        check_without_replacement_size(num_drafts, num_states, num_rows)


def _check_optimal(p, q, num_drafts, replacement) -> None:
    _checks.check_rows(probabilities={"p": p, "q": q})
    check_num_drafts(num_drafts)
    check_replacement(replacement)
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
    g = 1 - jnp.flip(cover, -1) - prefix_with_zero(q_desc)  # g_l over the top l, l = 0..V
    g = g.at[..., 0].set(0)  # no token: nothing matched, exactly
    cum = jax.lax.cummin(g, axis=g.ndim - 1)
    matched = jnp.clip(q_desc + jnp.diff(cum, axis=-1), 0, q_desc)
    matched = jnp.flip(matched, -1)  # back to ascending order, then to token order
    accepted = unpermute(matched, order)
    q_full = jnp.broadcast_to(q, accepted.shape)
    return VerificationLaw(accepted, jnp.maximum(q_full - accepted, 0))
