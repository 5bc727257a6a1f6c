"""The call structure of a lossless decoder given its output: a filter over the phase of the call.

A lossless decoder's output ``x`` has the target's law, whatever the draft. Given ``x``, the calls
that produced it are hidden: at position ``t`` the decoder is in *phase* ``j``, the number of
drafts already accepted in the current call (``j = 0``: the call's first drafted position, its
root; ``j = 1..K - 1``: a later draft; ``j = K``: the target's bonus token). At a drafted
position, the emitted ``x_t`` came from a rejection with probability

    r_t = P(rejected, x_t) / q_t(x_t)  =  [q_t - p_t]_+(x_t) / q_t(x_t)  for SD,

and since every phase emits ``x_t`` with the same probability ``q_t(x_t)`` (losslessness), the
likelihood of ``x_t`` cancels: the forward chain over phases with these transition probabilities
*is* the posterior law of the phase given ``x`` (no backward pass is needed, because the future
tokens have the target's law in every phase). A rejection or a bonus token opens a new call at
the next position; an acceptance moves phase ``j`` to ``j + 1``. So

* ``E[rejections | x] = sum_t sum_{j < K} P(phase j at t | x) r_t^{(j)}``;
* ``E[calls | x] = sum_t P(phase 0 at t | x)``;
* ``E[# calls keeping >= i drafts | x] = sum_t P(phase i - 1 at t | x) (1 - r_t^{(i-1)})``;

exact conditional expectations (Rao-Blackwell): their mean over target rollouts is unbiased for
``specjax.exact``'s value. A multi-draft root (batch SD, the optimal verifier, K-SEQ) changes only
``r`` at phase 0 (``root_rejection``). ``K = None`` drafts to the horizon (phase ``K = T`` is
never reached), exactly as ``specjax.exact``; a call at position ``n`` drafts
``min(K, T - n + 1)`` levels.

Everything is a product of the rates, so the functions are differentiable (finite gradients at
``r`` in ``{0, 1}``): a draft can be trained for the expected rejections of its actual ``K``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax.numerics import safe_ratio
from specjax.theory.cost import call_depths

__all__ = [
    "CallStructure",
    "call_structure",
    "check_rates",
    "checked_rates",
    "expected_call_time",
    "live_positions",
    "phase_filter",
    "rejection_rate",
    "resolve_lookahead",
]


class CallStructure(NamedTuple):
    """Exact conditional expectations of a decoder's call structure given its output ``x``.

    Attributes:
      rejections: ``(B,)``, ``E[rejections | x]``.
      calls: ``(B,)``, ``E[target calls | x]``.
      accepted_at: ``(B, K)``, ``E[# calls that kept >= i drafts | x]``, ``i = 1..K``
        (``K = min(lookahead, T)``; ``T`` for ``lookahead=None``).
      drafted: ``(B,)``, ``E[drafted levels | x]``: a call at position ``n`` drafts
        ``min(K, T - n + 1)`` tokens per draft sequence.
    """

    rejections: jax.Array  # shape=(B,)
    calls: jax.Array  # shape=(B,)
    accepted_at: jax.Array  # shape=(B, K)
    drafted: jax.Array  # shape=(B,)


def rejection_rate(draft_prob, target_prob) -> jax.Array:
    """SD's ``r = [q - p]_+ / q`` at the emitted token: the probability that a token emitted at a
    drafted position came from a rejection.

    Args:
      draft_prob: ``p_t(x_t)``, any shape.
      target_prob: ``q_t(x_t)``, the same shape.

    Returns:
      ``max(0, q - p) / q``; 0 where ``q = 0`` (a token the target never emits), with finite
      values and gradients there and at ``p = q``.

    Raises:
      ValueError: shapes that differ, or (when concrete) values outside ``[0, 1]`` or NaN.

    Example:
      >>> import specjax.pairs
      >>> rates = specjax.pairs.rejection_rate([0.2, 0.5, 0.0], [0.5, 0.5, 0.0])
      >>> print(*[round(float(r), 3) for r in rates])
      0.6 0.0 0.0
    """
    p = jnp.asarray(draft_prob)
    q = jnp.asarray(target_prob)
    if p.shape != q.shape:
        raise ValueError(f"draft_prob and target_prob must have the same shape, got {p.shape} "
                         f"and {q.shape}")
    for name, x in (("draft_prob", p), ("target_prob", q)):
        if _checks.is_concrete(x):  # NumPy: inside a caller's trace a jitted check is traced
            values = np.asarray(x)
            outside = ~((values >= 0) & (values <= 1))
            if outside.any():
                raise ValueError(f"{name} must hold probabilities in [0, 1], got "
                                 f"{values[outside].ravel()[0]!r}")
    dtype = jnp.result_type(p.dtype, q.dtype, jnp.float32)
    p, q = p.astype(dtype), q.astype(dtype)
    return safe_ratio(jnp.maximum(q - p, 0), q, 0)


def resolve_lookahead(lookahead, horizon: int) -> int:
    """The static ``K`` of the filter: ``min(lookahead, T)``, ``T`` for ``None``; refuses a
    traced or negative value naming ``lookahead``."""
    if lookahead is None:
        return horizon
    _checks.check_static_non_negative_int("lookahead", lookahead)
    return min(lookahead, horizon)


def live_positions(lengths, horizon: int, batch: int, dtype):
    """``(T, B)`` 1 where position ``t < lengths[b]`` holds an emitted token, 0 on padding (all
    ones without ``lengths``): the filters' mask of ragged requests."""
    if lengths is None:
        return jnp.ones((horizon, batch), dtype)
    return (jnp.arange(horizon)[:, None] < jnp.asarray(lengths)[None]).astype(dtype)


def phase_filter(rejection, root_rejection, lookahead: int, call_weights, lengths=None, k=None):
    """The filter itself, for a static ``K = lookahead`` (``0 <= K <= T``), or for a traced
    ``k <= lookahead`` (``specjax.pairs.lookahead`` runs every ``K`` in one program): phases
    ``j < k`` draft, phase ``k`` is the bonus token, the phases above ``k`` stay empty.

    Args:
      rejection: ``(B, T)`` rates at non-root drafted positions.
      root_rejection: ``(B, T)`` rates at a call's first drafted position.
      lookahead: static ``K`` (with ``k``, the largest ``K``: the phase vector's size).
      call_weights: ``(T, W)`` per-position weights of a call start (a column of ones counts
        calls; a column of depths counts drafted levels; a column of call times gives time).
      lengths: ``(B,)`` ints or ``None``: sequence ``b`` ends after ``lengths[b]`` emitted
        tokens (an end-of-sequence token): its later positions are padding, never read, and
        open no call (whatever phase the last token left).
      k: ``None`` (``K = lookahead``) or a traced ``K``.

    Returns:
      ``(rejections (B,), weighted_calls (B, W), accepted_at (B, lookahead))``.
    """
    batch, horizon = rejection.shape
    kmax = lookahead
    k = kmax if k is None else k
    dtype = rejection.dtype
    call_weights = jnp.asarray(call_weights, dtype)
    phases = jnp.arange(kmax)
    is_root = (phases == 0)[None]  # (1, K)
    drafting = (phases < k)[None]  # (1, K): all phases for a static K
    bonus = (jnp.arange(kmax + 1) == k)[None]  # (1, K + 1)
    live = live_positions(lengths, horizon, batch, dtype)
    # Padding may hold anything: its rates are replaced before they meet a product.
    rejection = jnp.where(live.T > 0, rejection, 0)
    root_rejection = jnp.where(live.T > 0, root_rejection, 0)

    def step(carry, inputs):
        alpha, rejected, weighted, accepted = carry
        r, root_r, weight, on = inputs  # (B,), (B,), (W,), (B,)
        rate = jnp.where(is_root, root_r[:, None], r[:, None])  # (B, K)
        drafted = jnp.where(drafting, alpha[:, :kmax], 0)
        rej = drafted * rate * on[:, None]
        acc = (drafted - rej) * on[:, None]  # phase j accepted: phase j + 1 next
        # A rejection or the bonus (phase k) opens a call at the next position.
        start = jnp.sum(rej, axis=-1) + jnp.sum(jnp.where(bonus, alpha, 0), axis=-1) * on
        new_alpha = jnp.concatenate([start[:, None], acc], axis=-1)
        weighted = weighted + (alpha[:, :1] * on[:, None]) * weight[None]
        return (new_alpha, rejected + jnp.sum(rej, axis=-1), weighted, accepted + acc), None

    alpha0 = jnp.zeros((batch, kmax + 1), dtype).at[:, 0].set(1)
    carry = (alpha0, jnp.zeros((batch,), dtype),
             jnp.zeros((batch, call_weights.shape[-1]), dtype), jnp.zeros((batch, kmax), dtype))
    (_, rejections, weighted, accepted_at), _ = jax.lax.scan(
        step, carry, (rejection.T, root_rejection.T, call_weights, live))
    return rejections, weighted, accepted_at


# Compiled, not op by op (the scan and the set-up around it were a dozen programs per shape);
# estimate and distill use the same jitted filter, called the same way, so programs are shared.
_filter = jax.jit(phase_filter, static_argnames=("lookahead",))


def check_rates(name: str, rates, shape=None):
    """``rates`` as a float array of shape ``(B, T)`` (or ``shape``); values in ``[0, 1]`` when
    concrete; ``ValueError`` naming ``name`` otherwise."""
    x = jnp.asarray(rates)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jnp.result_type(float))
    if x.ndim != 2:
        raise ValueError(f"{name} must have shape (B, T) (sequences, positions), got shape "
                         f"{x.shape}")
    if shape is not None and x.shape != tuple(shape):
        raise ValueError(f"{name} must have the shape of rejection {tuple(shape)}, got {x.shape}")
    if _checks.is_concrete(x) and bool(_any_outside_unit_interval(x)):
        bad = ~((x >= 0) & (x <= 1))
        raise ValueError(f"{name} must hold rates in [0, 1], got {float(x[bad][0])!r}")
    return x


# One compiled program per shape (op by op, the check was five: two comparisons, an and, a not
# and an any).
_any_outside_unit_interval = jax.jit(lambda x: jnp.any(~((x >= 0) & (x <= 1))))


def checked_rates(rejection, root_rejection, lookahead):
    """``(rejection, root, K)``: both rate arrays checked and in one float dtype (``root``
    defaults to ``rejection``), and the static ``K`` (``resolve_lookahead``)."""
    rejection = check_rates("rejection", rejection)
    root = rejection if root_rejection is None else check_rates(
        "root_rejection", root_rejection, rejection.shape)
    dtype = jnp.result_type(rejection.dtype, root.dtype)
    rejection, root = rejection.astype(dtype), root.astype(dtype)
    return rejection, root, resolve_lookahead(lookahead, rejection.shape[1])


def call_structure(rejection, lookahead, *, root_rejection=None) -> CallStructure:
    """The expected call structure of a lossless decoder given its outputs.

    Args:
      rejection: ``(B, T)``, ``r_t`` at drafted positions that are not a call's first
        (``rejection_rate(p, q)`` for SD), for ``B`` output sequences of ``T`` tokens.
      lookahead: ``K``, a static int (``0``: autoregressive decoding), or ``None`` to draft to
        the horizon (the paper's ``K = T``).
      root_rejection: ``(B, T)``, ``r_t`` when ``t`` is a call's first drafted position (a
        multi-draft root: ``P(rejected, x_t) / q_t(x_t)`` of the decoder's root law); default
        ``rejection``.

    Returns:
      ``CallStructure`` of ``(B,)`` arrays and ``accepted_at`` ``(B, K)``: exact conditional
      expectations, differentiable in the rates (a lax.scan over ``T`` with a ``(B, K + 1)``
      phase distribution).

    Raises:
      ValueError: a rate array that is not ``(B, T)``, shapes that differ, rates outside
        ``[0, 1]`` (checked when concrete), a traced or negative ``lookahead``.

    Example:
      >>> import jax.numpy as jnp, specjax.pairs
      >>> s = specjax.pairs.call_structure(jnp.array([[0.5, 0.5, 0.5]]), 2)
      >>> round(float(s.rejections[0]), 3), round(float(s.calls[0]), 3)
      (1.375, 2.0)
    """
    rejection, root, k = checked_rates(rejection, root_rejection, lookahead)
    horizon = rejection.shape[1]
    weights = np.stack([np.ones(horizon), call_depths(k, horizon)], axis=-1)
    rejections, weighted, accepted_at = _filter(rejection, root, lookahead=k,
                                                call_weights=jnp.asarray(weights, rejection.dtype))
    return CallStructure(rejections=rejections, calls=weighted[:, 0], accepted_at=accepted_at,
                         drafted=weighted[:, 1])


def expected_call_time(rejection, lookahead, call_times, *, root_rejection=None) -> jax.Array:
    """``(B,)``: ``E[time | x] = sum_n P(a call starts at n | x) call_times[n - 1]``, with
    ``call_times`` ``(T,)`` the time of a call at each position (``CostModel.call_time`` of the
    decoder's ``call_work(min(K, T - n + 1))``, ``specjax.theory.cost.call_works``)."""
    rejection, root, k = checked_rates(rejection, root_rejection, lookahead)
    horizon = rejection.shape[1]
    times = jnp.asarray(call_times)
    if times.shape != (horizon,):
        raise ValueError(f"call_times must have shape (T,) = ({horizon},), got {times.shape}")
    if _checks.is_concrete(times):
        values = np.asarray(times, np.float64)
        if not np.isfinite(values).all() or (values < 0).any():
            raise ValueError(f"call_times must hold finite non-negative times, got "
                             f"{values.tolist()}"[:300])
    _, weighted, _ = _filter(rejection, root, lookahead=k, call_weights=times[:, None])
    return weighted[:, 0]
