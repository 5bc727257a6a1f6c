"""The optimal verifier of ``M`` drafts at the root of a call: the best acceptance any lossless
verifier reaches (``optimal_acceptance``) and the root law that reaches it (``optimal_root_law``),
for drafts drawn with or without replacement; with the sorting helpers they share
(``ratio_order``, ``ratios``, ``stable_argsort_nonnegative``, ``inverse_permutation``,
``unpermute``, ``prefix_with_zero``; in ``specjax.decoders.ratio_sort``). For i.i.d. drafts the
optimum is also found without a sort (``iid_optimal_acceptance``, ``method="buckets"``: the CPU's
default for long float32 rows).

``specjax.decoders.optimal_multi_draft.OptimalMultiDraft`` verifies its root with this law; the
sequence-optimal verifier (``specjax.decoders.sequence_optimal``) and the Gumbel list coupling
build on its order. The names are served from ``specjax.decoders.multi_draft`` too.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from specjax import _checks

from specjax.decoders.multi_draft import check_num_drafts
from specjax.decoders.multi_draft import check_without_replacement_size
from specjax.decoders.multi_draft import without_replacement_stages
from specjax.decoders.ratio_sort import PACKED_SORT_MAX_STATES
from specjax.decoders.ratio_sort import inverse_permutation
from specjax.decoders.ratio_sort import prefix_with_zero
from specjax.decoders.ratio_sort import ratio_order
from specjax.decoders.ratio_sort import ratios
from specjax.decoders.ratio_sort import stable_argsort_nonnegative
from specjax.decoders.ratio_sort import unpermute
from specjax.decoders.verification import VerificationLaw
from specjax.decoders.verification import safe_normalize
from specjax.numerics import indicator

__all__ = ["check_replacement", "inverse_permutation", "ratio_order", "ratios",
           "PACKED_SORT_MAX_STATES", "stable_argsort_nonnegative", "unpermute", "prefix_with_zero",
           "check_optimal_without_replacement_size", "optimal_acceptance", "optimal_root_law",
           "BUCKET_SHIFT", "BUCKET_BUFFER", "BUCKET_MIN_STATES", "IID_METHODS",
           "iid_optimal_acceptance"]


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
    For i.i.d. drafts on CPU, float32 rows of at least ``BUCKET_MIN_STATES`` tokens need no sort:
    ``iid_optimal_acceptance`` finds the same maximum from buckets of the ratio (one
    scatter-add and one ``top_k``; proof there); other backends, dtypes and shorter rows sort.

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
    if replacement and num_drafts != math.inf:
        return _iid_optimal_acceptance(p, q, int(num_drafts), None, BUCKET_BUFFER)
    return 1 - _sorted_optimum(p, q, num_drafts, replacement)


def _sorted_optimum(p: jax.Array, q: jax.Array, num_drafts, replacement: bool) -> jax.Array:
    """``max_k [F_k - Q_k]`` over the ``V + 1`` prefixes of the order by ``q / p``."""
    _, _, cover, q_cum = _optimal_prefix_terms(p, q, num_drafts, replacement)
    return jnp.max(cover - q_cum, axis=-1)


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


# --- The optimum for i.i.d. drafts without a sort -----------------------------------------------

#: Low bits of the float32 ratio's int32 pattern that a bucket spans: ``2^20`` patterns, so 8
#: buckets per binade of ``q / p`` and 2,041 buckets from 0 to ``+inf``.
BUCKET_SHIFT = 20
#: Tokens per row that ``method="buckets"`` orders itself; a row whose open buckets hold more is
#: computed by the sort.
BUCKET_BUFFER = 1024
#: Shortest rows ``method=None`` computes by buckets on CPU: below it the sort is as fast (the
#: buffer is then a large part of the row).
BUCKET_MIN_STATES = 4 * BUCKET_BUFFER
#: The values of ``method`` in ``iid_optimal_acceptance`` (``None``: chosen by the backend).
IID_METHODS = ("sort", "buckets")

_INF_BITS = 0x7F800000  # the int32 pattern of float32 +inf, the largest ratio
_TOP = 0x7F000000  # top_k codes: _TOP - (key - low) is a normal positive float32 pattern
_MAX_SPAN = 0x7E000000  # wider key ranges than this cannot be coded (the row takes the sort)
_MARGIN = 2.0 ** -20  # slack of a bucket bound against float32 rounding of its masses
_SLOPE_SAFETY = 1 - 2.0 ** -22  # a token's q / p is at least its rounded ratio times this


def iid_optimal_acceptance(p: jax.Array, q: jax.Array, num_drafts: int, *, method=None,
                           buffer: int = BUCKET_BUFFER) -> jax.Array:
    """``optimal_acceptance(p, q, num_drafts=M)`` for i.i.d. drafts by a chosen method.

    ``alpha* = 1 - max_k [P_k^M - Q_k]`` over the prefixes ``k = 0..V`` of the tokens in
    ``q / p`` order (``P_k``, ``Q_k``: their ``p`` and ``q`` mass). ``method="sort"`` sorts each
    row (``ratio_order``). ``method="buckets"`` finds the same maximum without a sort
    (float32 rows only):

    1. The int32 pattern ``key`` of a non-negative float32 is monotone in the float, so
       ``key >> BUCKET_SHIFT`` puts the tokens in 2,041 buckets that are consecutive runs of
       the sorted order (ties of the ratio in token order, as ``ratio_order``). One scatter-add
       gives each bucket's ``p`` and ``q`` mass, prefix sums the masses ``P_b``, ``Q_b`` of the
       buckets before ``b``: ``g_b = P_b^M - Q_b`` at every bucket boundary is the value of a
       prefix, so ``L = max_b g_b`` is attained.
    2. A prefix ending inside bucket ``b`` (ratios at least ``r_b``, the float of pattern
       ``b << BUCKET_SHIFT``) adds tokens of mass ``d <= p_b`` (the bucket's ``p`` mass) and
       ``q`` mass at least ``r_b d``: its value is at most ``h(d) = (P_b + d)^M - Q_b - r_b d``,
       convex in ``d``, so at most ``max(h(0), h(p_b)) = max(g_b, P_{b+1}^M - Q_b - r_b p_b)``.
       A bucket whose bound is below ``L`` holds no better prefix; nor does a bucket with
       ``p_b = 0`` (its tokens only add ``q``) or with ``r_b >= M`` (``d/dP P^M <= M`` on
       ``[0, 1]``, so its tokens add at least as much ``q`` as ``P^M``). The rest are *open*.
       Typically the open buckets are the few around the best boundary: on Dirichlet(0.3)
       rows of ``V = 32,000`` their range holds 350-570 tokens on average (at most 664).
    3. The tokens whose keys lie between the first and the last open bucket are ordered by
       ``jax.lax.top_k`` (``buffer`` of them per row; its ties come in token order) on a code
       decreasing in ``key``; cumulative sums inside each bucket, started at ``P_b``, ``Q_b``,
       give the value of every prefix ending inside an open bucket. The maximum of those and
       ``L`` is the maximum over all ``V + 1`` prefixes.

    Float32 rounding: a token's exact ``q / p`` can be below its rounded ratio by a relative
    ``2^-24``, so ``r_b`` is taken ``2^-22`` smaller, and a bucket stays open when its bound is
    within ``2^-20`` of ``L`` (the masses are float32 sums). A batch with a row of more tokens
    in its open range than ``buffer`` (ties, adversarial rows) is computed by the sort
    (``jax.lax.cond``): the result is exact on every input (to float32 rounding), and costs one
    scatter-add and one ``top_k`` pass when no row needs the sort.

    The gradient is that of ``method="sort"``: ``d alpha* = sum_{x in A} (dq_x - M P_A^{M-1}
    dp_x)`` for the maximising prefix ``A``, averaged over the prefixes that tie exactly (as
    ``jnp.max`` does) where they differ by tokens with ``p = q = 0``, which sit at ratio 0 in
    token order. Where two prefixes tie only through float32 rounding, the sort's subgradient
    averages them and the buckets take one: both are subgradients of the exact value.

    Args:
      p: ``(..., V)`` draft probabilities.
      q: ``(..., V)`` target probabilities.
      num_drafts: ``M >= 1``, an int (static).
      method: ``"sort"``, ``"buckets"``, or ``None``: buckets for float32 rows of at least
        ``BUCKET_MIN_STATES`` tokens on CPU (where XLA's sort is slower than a scatter-add and
        a ``top_k``), the sort on other backends, dtypes and shorter rows, chosen when the
        computation is lowered (``jax.lax.platform_dependent``).
      buffer: tokens per row ``method="buckets"`` orders itself (static).

    Returns:
      ``(...)``: ``alpha*``, as ``optimal_acceptance``.
    """
    _check_optimal(p, q, num_drafts, True)
    if num_drafts == math.inf:
        raise ValueError("num_drafts must be a finite int here; optimal_acceptance takes "
                         "math.inf")
    if method is not None and method not in IID_METHODS:
        raise ValueError(f"method must be one of {IID_METHODS} or None, got {method!r}")
    if not isinstance(buffer, int) or isinstance(buffer, bool) or buffer < 1:
        raise ValueError(f"buffer must be a positive int, got {buffer!r}")
    dtype = jnp.result_type(p, q)
    if method == "buckets" and dtype != jnp.float32:
        raise ValueError(f"method='buckets' needs float32 rows, got {dtype}")
    return _iid_optimal_acceptance(p, q, int(num_drafts), method, buffer)


def _iid_optimal_acceptance(p, q, num_drafts: int, method, buffer: int) -> jax.Array:
    shape = jnp.broadcast_shapes(jnp.shape(p), jnp.shape(q))
    p, q = jnp.broadcast_to(p, shape), jnp.broadcast_to(q, shape)

    def by_sort(p, q):
        return 1 - _sorted_optimum(p, q, num_drafts, True)

    def by_buckets(p, q):
        rows = (p.reshape((-1, shape[-1])), q.reshape((-1, shape[-1])))
        return 1 - _bucketed_optimum(num_drafts, min(buffer, shape[-1]), *rows).reshape(
            shape[:-1])

    if method == "sort" or p.dtype != jnp.float32 \
            or (method is None and shape[-1] < BUCKET_MIN_STATES):
        return by_sort(p, q)
    if method == "buckets":
        return by_buckets(p, q)
    return jax.lax.platform_dependent(p, q, cpu=by_buckets, default=by_sort)


class _Cut(NamedTuple):
    """The best prefix of each row: ``value = max_k [P_k^M - Q_k]``; the prefix holds the
    tokens with ``(key, token) <= (key, token)`` of the cut (``token = -1``: keys below
    ``key``); ``overflow``: the row needs the sort."""
    value: jax.Array  # (R,)
    key: jax.Array  # (R,) int32
    token: jax.Array  # (R,) int32
    overflow: jax.Array  # (R,) bool


def _ratio_keys(p: jax.Array, q: jax.Array) -> jax.Array:
    return jax.lax.bitcast_convert_type(ratios(p, q), jnp.int32)


def _within_bucket_prefix(x: jax.Array, bucket: jax.Array) -> jax.Array:
    """Inclusive cumulative sums of ``x >= 0`` restarted where ``bucket`` changes."""
    total = jnp.cumsum(x, axis=-1)
    before = jnp.concatenate([jnp.zeros_like(total[:, :1]), total[:, :-1]], axis=-1)
    first = jnp.concatenate([jnp.ones_like(bucket[:, :1], bool),
                             bucket[:, 1:] != bucket[:, :-1]], axis=-1)
    start = jax.lax.cummax(jnp.where(first, before, -jnp.inf), axis=1)
    return total - start


def _bucket_search(p: jax.Array, q: jax.Array, num_drafts: int, buffer: int) -> _Cut:
    """Steps 1-3 of ``iid_optimal_acceptance``'s buckets on ``(R, V)`` float32 rows."""
    p, q = jax.lax.stop_gradient(p), jax.lax.stop_gradient(q)
    num_rows, num_states = p.shape
    m = num_drafts
    key = _ratio_keys(p, q)
    num_buckets = (_INF_BITS >> BUCKET_SHIFT) + 1
    rows = jnp.arange(num_rows, dtype=jnp.int32)[:, None]
    masses = jax.lax.complex(p, q)  # one scatter for p and q
    if num_rows * num_buckets < 2**31:  # flat indices: about a fifth faster on CPU
        flat = (key >> BUCKET_SHIFT) + rows * num_buckets
        mass = jnp.zeros((num_rows * num_buckets,), jnp.complex64).at[flat.reshape(-1)].add(
            masses.reshape(-1)).reshape((num_rows, num_buckets))
    else:
        mass = jnp.zeros((num_rows, num_buckets), jnp.complex64).at[
            rows, key >> BUCKET_SHIFT].add(masses)
    p_mass, q_mass = jnp.real(mass), jnp.imag(mass)
    p_cum, q_cum = prefix_with_zero(p_mass), prefix_with_zero(q_mass)  # (R, B + 1)
    at_bounds = p_cum ** m - q_cum
    lower = jnp.max(at_bounds, axis=-1)
    best_bound = jnp.argmax(at_bounds, axis=-1).astype(jnp.int32)
    ids = jnp.arange(num_buckets, dtype=jnp.int32)
    low = jax.lax.bitcast_convert_type(ids << BUCKET_SHIFT, jnp.float32)[None] * _SLOPE_SAFETY
    inside_bound = p_cum[:, 1:] ** m - q_cum[:, :-1] - jnp.where(p_mass > 0, low * p_mass, 0)
    bound = jnp.maximum(at_bounds[:, :-1], inside_bound)
    # a bucket of ratios >= M cannot beat its start (F' <= M on [0, 1]); nor one with p_b = 0
    open_ = (bound >= lower[:, None] - _MARGIN) & (p_mass > 0) & (low < m)
    first_open = jnp.min(jnp.where(open_, ids[None], num_buckets), axis=-1)
    last_open = jnp.max(jnp.where(open_, ids[None], -1), axis=-1)
    any_open = last_open >= 0
    low_key = jnp.where(any_open, first_open << BUCKET_SHIFT, 0)[:, None]
    high_key = jnp.where(any_open, (last_open + 1) << BUCKET_SHIFT, 0)[:, None]
    in_range = (key >= low_key) & (key < high_key)
    code = jax.lax.bitcast_convert_type(_TOP - (key - low_key), jnp.float32)
    codes, token = jax.lax.top_k(jnp.where(in_range, code, -1.0), buffer)
    valid = codes >= 0
    overflow = (high_key[:, 0] - low_key[:, 0] > _MAX_SPAN) \
        | (valid[:, -1] & (buffer < num_states))
    key_e = low_key + _TOP - jax.lax.bitcast_convert_type(codes, jnp.int32)
    bucket_e = jnp.where(valid, key_e >> BUCKET_SHIFT, num_buckets)
    p_e = jnp.where(valid, jnp.take_along_axis(p, token, axis=-1), 0)
    q_e = jnp.where(valid, jnp.take_along_axis(q, token, axis=-1), 0)
    p_at = jnp.take_along_axis(p_cum, bucket_e, axis=-1) + _within_bucket_prefix(p_e, bucket_e)
    q_at = jnp.take_along_axis(q_cum, bucket_e, axis=-1) + _within_bucket_prefix(q_e, bucket_e)
    g = jnp.where(valid, p_at ** m - q_at, -jnp.inf)
    best = jnp.argmax(g, axis=-1)[:, None]
    best_value = jnp.max(g, axis=-1)
    inner = best_value > lower
    return _Cut(jnp.maximum(lower, best_value),
                jnp.where(inner, jnp.take_along_axis(key_e, best, -1)[:, 0],
                          best_bound << BUCKET_SHIFT),
                jnp.where(inner, jnp.take_along_axis(token, best, -1)[:, 0], -1),
                overflow)


def _cut_weights(p: jax.Array, q: jax.Array, cut: _Cut) -> jax.Array:
    """``w (R, V)``: the average of the indicators of the prefixes that tie with the cut.

    The tie that is structural: a cut among the ratio-0 tokens (those with ``q = 0``, in token
    order). Adding a token with ``p = q = 0`` changes no prefix sum, so every prefix from the
    last token with ``p > 0`` to the end of that run has the same value; ``jnp.max`` averages
    their gradients, so each such null token counts the share of them that hold it."""
    key = _ratio_keys(p, q)
    token = jax.lax.broadcasted_iota(jnp.int32, key.shape, 1)
    inside = (key < cut.key[:, None]) | ((key == cut.key[:, None])
                                        & (token <= cut.token[:, None]))
    zero = key == 0
    only_zero = ~jnp.any(inside & ~zero, axis=-1, keepdims=True)
    last = jnp.max(jnp.where(zero & (p > 0), token, -1), axis=-1, keepdims=True)
    after = (p == 0) & (q == 0) & (token > last)
    rank = jnp.cumsum(after, axis=-1)
    count = jnp.sum(after, axis=-1, keepdims=True)
    share = (count - rank + 1).astype(p.dtype) / (count + 1).astype(p.dtype)
    tie = jnp.where(zero & (token <= last), 1, jnp.where(after, share, 0))
    return jnp.where(only_zero, tie, inside).astype(p.dtype)


def _may_overflow(num_drafts: int, buffer: int, num_states: int) -> bool:
    """Whether a row can need the sort: more tokens than the buffer, or open buckets too far
    apart to code (only for ratios near ``M``, the largest an open bucket starts at, beyond
    ``2^64``)."""
    return buffer < num_states or num_drafts > 2**64


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def _bucketed_optimum(num_drafts: int, buffer: int, p: jax.Array, q: jax.Array) -> jax.Array:
    """``max_k [P_k^M - Q_k]`` of ``(R, V)`` float32 rows by buckets (the sort for all rows
    when one overflows its buffer)."""
    cut = _bucket_search(p, q, num_drafts, buffer)
    if not _may_overflow(num_drafts, buffer, p.shape[-1]):
        return cut.value
    return jax.lax.cond(jnp.any(cut.overflow),
                        lambda p, q: _sorted_optimum(p, q, num_drafts, True),
                        lambda p, q: cut.value, p, q)


@_bucketed_optimum.defjvp
def _bucketed_optimum_jvp(num_drafts, buffer, primals, tangents):
    p, q = primals
    cut = _bucket_search(p, q, num_drafts, buffer)

    def by_sort(p, q, dp, dq):
        return jax.jvp(lambda p, q: _sorted_optimum(p, q, num_drafts, True), (p, q), (dp, dq))

    def by_cut(p, q, dp, dq):
        w = jax.lax.stop_gradient(_cut_weights(p, q, cut))
        slope = num_drafts * jnp.sum(w * p, axis=-1) ** (num_drafts - 1)
        return cut.value, slope * jnp.sum(w * dp, axis=-1) - jnp.sum(w * dq, axis=-1)

    if not _may_overflow(num_drafts, buffer, p.shape[-1]):
        return by_cut(p, q, *tangents)
    return jax.lax.cond(jnp.any(cut.overflow), by_sort, by_cut, p, q, *tangents)
