"""Block verification (Sun et al. 2024): verify a drafted block jointly instead of token by token.

One target call drafts ``K`` tokens ``X_1..X_K`` from the draft ``p`` (fewer at the end of the
horizon) and keeps a prefix ``X_1..X_tau`` plus one more token ``Y``. Algorithm 2 of Sun,
Mendlovic, Leviathan, Aharoni, Beirami, Ro and Suresh, *Block verification accelerates speculative
decoding* (arXiv 2403.10444, ICLR 2025), on a Markov chain whose call starts at position ``n``
from the previous token ``X_0 = x_{n-1}`` (``p_i``, ``q_i`` the rows at position ``n + i - 1``):

* weights ``w_0 = 1``, ``w_i = min(w_{i-1} q_i(X_i | X_{i-1}) / p_i(X_i | X_{i-1}), 1)``;
* residual masses ``r_i(y) = [w_i q_{i+1}(y | X_i) - p_{i+1}(y | X_i)]_+`` with total ``R_i``;
* acceptance probabilities ``h_i = R_i / (R_i + 1 - w_i)`` for ``i < K`` and ``h_K = w_K``;
* backward pass: for ``i = K, K - 1, ..., 1``, stop at the first ``i`` whose fresh uniform is
  ``<= h_i`` (``tau = i``), ``tau = 0`` if none; the paper draws ``eta_1..eta_K`` up front and
  keeps the largest accepted ``i``, the same law;
* ``Y ~ q_{K+1}(. | X_K)`` if ``tau = K`` (the bonus token), else ``Y ~ r_tau / R_tau``.

``h_i`` is computed as ``R_i / (R_i + (1 - w_i))``: with ``w_i = 1`` it is then exactly 1 (as
``(R_i + 1) - w_i`` would not be after rounding, and a residual of no mass could be reached).
``h_i`` is ``0/0`` only when ``w_i = 1`` and ``R_i = 0``; it is then 1. So a level whose residual
has no mass is never stopped at, and a draft of target probability 0 (``w_i = 0``) never kept. With
``K = 1`` this is speculative decoding. The output law is the target's (the tests enumerate it).

How much it accepts. With ``m_i(x_{1:i}) = w_i p(x_{1:i})`` (joint probabilities of the prefix
given ``x_0``), the recursion reads ``m_i = min(m_{i-1} q_i(x_i | x_{i-1}), p(x_{1:i}))`` and
``E[tau] = sum_{i <= K} sum_{x_{1:i}} m_i(x_{1:i})``. This lies between token-wise SD,
``sum_i sum_{x_{1:i}} prod_{j <= i} min(p_j, q_j)``, and the joint-coupling bound
``sum_i sum_{x_{1:i}} min(p(x_{1:i}), q(x_{1:i}))`` that a verifier knowing the whole joint laws
could reach (the paper's motivating example: 10/9, 11/9 and 12/9 tokens). The bound is *not*
block verification's value in general. The paper proves block verification optimal within its
class of verifiers; that claim is not checked here (the tests check unbiasedness, the formula
above against the enumerated literal algorithm, and token-wise <= block <= bound).

Sampler: a ``lax.scan`` over at most ``T`` calls (each emits at least one token), vmapped over
chains; chain ``c`` draws call ``m``'s ``2K + 1`` uniforms from ``chain_bits`` (the Threefry hash
of the counters ``c (2K + 1) + j`` under a key folded with ``m``), so its numbers depend on its
index alone (a larger run's first chains equal a smaller run). Categorical draws use the
engine's integer inverse-CDF thresholds, so a token of probability zero is never drawn and an
acceptance of probability one never fails.
"""

from __future__ import annotations

import functools
import numbers

import jax
import jax.numpy as jnp

from specjax import _checks
from specjax._engine import DecodingTrace
from specjax._engine import _int31
from specjax._engine import _search
from specjax._engine import categorical_thresholds
from specjax._engine import chain_bits
from specjax._models import MarkovChain
from specjax._models import check_pair
from specjax._verify import _safe_ratio
from specjax._verify import safe_normalize

MAX_BLOCKS = 2**20  # largest number of draft blocks V**K the exact functions enumerate


# ---------------------------------------------------------------------------------------------
# The sampler.


def _bernoulli(prob: jax.Array, u: jax.Array) -> jax.Array:
    """``True`` with probability ``prob`` for a 31-bit uniform integer ``u`` (exactly never at
    ``prob = 0``, always at ``prob = 1``)."""
    thr = categorical_thresholds(jnp.stack([prob, 1 - prob], axis=-1))
    return u <= thr[..., 0]


def _call(draft_thr, p_trans, q_trans, lookahead, carry, u):
    """One target call of one chain: draft, verify the block, write the emitted tokens.

    Args:
      draft_thr: ``(T, V, W)`` inverse-CDF thresholds of the draft's rows.
      p_trans, q_trans: ``(T, V, V)`` draft and target transitions.
      lookahead: ``K`` (static).
      carry: ``(tokens (T+1,), rejected (T,), new_call (T,), n, previous token)``; ``n`` is the
        next position to fill (``n > T``: the chain is finished and the call does nothing).
      u: ``(2K + 1,)`` 31-bit uniforms: drafts, acceptances, the last token.

    Returns:
      The new carry.
    """
    tokens, rejected, new_call, n, prev = carry
    horizon, _, width = draft_thr.shape
    k = lookahead
    active = n <= horizon
    steps = jnp.arange(k, dtype=jnp.int32)
    rows = jnp.clip(n - 1 + steps, 0, horizon - 1)  # draft i + 1 sits at position n + i

    def draw(x, inputs):  # X_i ~ p(. | X_{i-1}) at position n + i - 1
        row, u_i = inputs
        thr = draft_thr[row, x]
        x = _search(lambda j: thr[j], u_i, width)
        return x, x

    _, drafts = jax.lax.scan(draw, prev, (rows, u[:k]))
    parents = jnp.concatenate([prev[None], drafts[:-1]])
    p_rows, q_rows = p_trans[rows, parents], q_trans[rows, parents]  # (K, V)
    ratio = _safe_ratio(q_rows[steps, drafts], p_rows[steps, drafts], 1)

    weights = [jnp.ones((), p_rows.dtype)]
    for i in range(k):
        weights.append(jnp.minimum(weights[-1] * ratio[i], 1))
    weights = jnp.stack(weights)  # (K + 1,): w_0 .. w_K
    residual = jnp.maximum(weights[:k, None] * q_rows - p_rows, 0)  # level i = 0 .. K-1
    mass = jnp.sum(residual, axis=-1)
    inner = _safe_ratio(mass[1:], mass[1:] + (1 - weights[1:k]), 1)  # h_1 .. h_{K-1}
    inner = jnp.concatenate([inner, jnp.zeros((1,), inner.dtype)])
    levels = steps + 1
    num_drafts = jnp.clip(horizon - n + 1, 0, k)  # K' (fewer drafts at the end of the horizon)
    h = jnp.where(levels == num_drafts, weights[1:], jnp.where(levels < num_drafts, inner, 0))
    accepted = _bernoulli(h, u[k:2 * k])
    tau = jnp.max(jnp.where(accepted, levels, 0))  # the backward pass's first acceptance

    bonus = q_trans[jnp.clip(n - 1 + k, 0, horizon - 1), drafts[k - 1]]
    last = jnp.where(tau == k, bonus, residual[jnp.minimum(tau, k - 1)])
    last_thr = categorical_thresholds(last)
    y = _search(lambda j: last_thr[j], u[2 * k], last_thr.shape[-1])

    emitted = jnp.concatenate([drafts, y[None]]).at[tau].set(y)
    offsets = jnp.arange(k + 1, dtype=jnp.int32)
    keep = active & (offsets <= tau) & (n + offsets <= horizon)
    tokens = tokens.at[jnp.where(keep, n + offsets, horizon + 1)].set(emitted, mode="drop")
    end = n + tau  # the position of Y
    rejected = rejected.at[jnp.where(active & (end <= horizon), end - 1, horizon)].set(
        tau < k, mode="drop")
    new_call = new_call.at[jnp.where(active, n - 1, horizon)].set(True, mode="drop")
    return (tokens, rejected, new_call, jnp.where(active, end + 1, n), jnp.where(active, y, prev))


@functools.partial(jax.jit, static_argnames=("num_chains", "lookahead"))
def _run(key, draft, target, *, num_chains, lookahead):
    horizon = target.horizon
    key_init, key_calls = jax.random.split(key)
    init_thr = categorical_thresholds(target.init)
    u0 = _int31(chain_bits(key_init, 0, num_chains))
    x0 = jax.vmap(lambda u: _search(lambda i: init_thr[i], u, init_thr.shape[-1]))(u0)
    draft_thr = categorical_thresholds(draft.trans)
    call = functools.partial(_call, draft_thr, draft.trans, target.trans, lookahead)

    def step(carry, m):  # chain c's uniforms are counters c (2K + 1) + j, j < 2K + 1
        bits = chain_bits(jax.random.fold_in(key_calls, m), 0, num_chains * (2 * lookahead + 1))
        u = _int31(bits).reshape(num_chains, 2 * lookahead + 1)
        return jax.vmap(call)(carry, u), None

    tokens = jnp.zeros((num_chains, horizon + 1), jnp.int32).at[:, 0].set(x0)
    flags = jnp.zeros((num_chains, horizon), bool)
    carry = (tokens, flags, flags, jnp.ones((num_chains,), jnp.int32), x0)
    (tokens, rejected, new_call, _, _), _ = jax.lax.scan(step, carry, jnp.arange(horizon))
    return DecodingTrace(
        tokens=tokens,
        rejected=rejected,
        num_rejections=jnp.sum(rejected, axis=-1, dtype=jnp.int32),
        num_calls=jnp.sum(new_call, axis=-1, dtype=jnp.int32),
        new_call=new_call,
    )


def block_verification_decoding(key, draft: MarkovChain, target: MarkovChain, num_chains: int,
                                *, lookahead: int) -> DecodingTrace:
    """Speculative decoding with block verification: each call drafts ``K`` tokens from ``p``
    and verifies them jointly.

    Each target call drafts ``K`` tokens (fewer when fewer positions remain), keeps the prefix the
    backward pass accepts and appends one token: the target's bonus token when all ``K`` are kept,
    else a draw from the block residual ``[w_tau q - p]_+`` (see the module docstring). A
    truncated block at the end of the horizon that is kept whole ends the sequence.

    Args:
      key: a JAX PRNG key.
      draft: the draft ``MarkovChain`` ``p``.
      target: the target ``MarkovChain`` ``q``; the output law is exactly ``q``'s.
      num_chains: ``C``.
      lookahead: ``K >= 1`` drafts per call; ``K = 1`` is SD with lookahead 1, values above
        ``T`` act as ``T``.

    Returns:
      ``DecodingTrace``: ``tokens (C, T + 1)``; ``rejected (C, T)`` marks the token drawn from a
      block residual after a partial acceptance (never a bonus token); ``new_call (C, T)`` the
      first position of each call; ``num_rejections``, ``num_calls``.

    Raises:
      ValueError: a bad key, models that are not a matching pair, or ``num_chains`` or
        ``lookahead`` not a positive integer.

    References:
      Sun et al. 2024, "Block verification accelerates speculative decoding", Algorithm 2
      (arXiv 2403.10444).
    """
    _checks.check_key(key)
    check_pair(draft, target)
    _checks.check_positive_int("num_chains", num_chains)
    _checks.check_positive_int("lookahead", lookahead)
    lookahead = min(lookahead, target.horizon)
    if num_chains * (2 * lookahead + 1) > 2**32:
        raise ValueError(f"num_chains must be at most 2**32 / (2 K + 1) (random numbers are "
                         f"counted with 32 bits), got {num_chains} with K = {lookahead}")
    return _run(key, draft, target, num_chains=num_chains, lookahead=lookahead)


# ---------------------------------------------------------------------------------------------
# Exact theory by enumeration of the draft blocks.


def _check_block_args(draft, target, lookahead, position, prev_token) -> int:
    """Validates the exact functions' arguments; returns ``K'``, the drafts of the call."""
    check_pair(draft, target)
    _checks.check_positive_int("lookahead", lookahead)
    horizon, num_states = target.horizon, target.num_states
    if isinstance(position, bool) or not isinstance(position, numbers.Integral) \
            or not 1 <= position <= horizon:
        raise ValueError(f"position must be an integer in [1, T] = [1, {horizon}], "
                         f"got {position!r}")
    if prev_token is not None and (isinstance(prev_token, bool)
                                   or not isinstance(prev_token, numbers.Integral)
                                   or not 0 <= prev_token < num_states):
        raise ValueError(f"prev_token must be None or an integer in [0, V) = [0, {num_states}), "
                         f"got {prev_token!r}")
    return min(lookahead, horizon - position + 1)


def _check_enumerable(num_states: int, num_drafts: int) -> None:
    if num_states**num_drafts > MAX_BLOCKS:
        raise ValueError(f"lookahead: enumerating V**K = {num_states}**{num_drafts} draft blocks "
                         f"exceeds the bound {MAX_BLOCKS} (2**20); use a smaller lookahead")


def _lift(row: jax.Array, depth: int) -> jax.Array:
    """A ``(V, V)`` transition row ``(x_{i-1}, x_i)`` as an array of rank ``depth + 1`` that
    broadcasts against prefixes ``(x_0, .., x_{i-1}, x_i)``."""
    return row.reshape((1,) * (depth - 1) + row.shape)


def _pick(values: jax.Array, prev_token):
    return values if prev_token is None else values[prev_token]


def exact_block_accepted_length(draft: MarkovChain, target: MarkovChain, *, lookahead: int,
                                position: int = 1, prev_token: int | None = None) -> jax.Array:
    """Expected number of drafts block verification accepts in one call, exactly.

    The call starts at position ``n`` from ``x_{n-1} = a`` and verifies drafts for
    ``x_n .. x_{n+K'-1}``, ``K' = min(K, T - n + 1)``. The value is
    ``sum_{i <= K'} sum_{x_{1:i}} m_i(x_{1:i})`` with ``m_0 = 1`` and
    ``m_i = min(m_{i-1} q(x_i | x_{i-1}), p(x_{1:i}))`` (``p(x_{1:i})`` the draft's joint
    probability of the prefix given ``a``), i.e. ``E[sum_i w_i]`` over draft blocks: enumerated
    over the ``V**K'`` blocks. It is at least ``exact_tokenwise_accepted_length`` and at most
    ``exact_joint_accepted_length``, with equality for ``K' = 1``.

    Args:
      draft: the draft ``MarkovChain`` ``p``.
      target: the target ``MarkovChain`` ``q``.
      lookahead: ``K >= 1``.
      position: ``n`` in ``[1, T]``, the first position the call fills.
      prev_token: ``a = x_{n-1}``, or ``None`` for every ``a``.

    Returns:
      ``(V,)`` (one value per previous token) or a scalar for the given ``prev_token``.

    Raises:
      ValueError: bad arguments, or ``V**K'`` above ``MAX_BLOCKS`` (2**20).

    References:
      Sun et al. 2024, "Block verification accelerates speculative decoding" (arXiv 2403.10444),
      Algorithm 2.
    """
    k = _check_block_args(draft, target, lookahead, position, prev_token)
    _check_enumerable(target.num_states, k)
    p_rows = draft.trans[position - 1: position - 1 + k]
    q_rows = target.trans[position - 1: position - 1 + k]
    joint = p_rows[0]
    kept = jnp.minimum(p_rows[0], q_rows[0])  # m_1 (x_0, x_1)
    total = jnp.sum(kept, axis=-1)
    for i in range(1, k):
        joint = joint[..., None] * _lift(p_rows[i], i + 1)
        kept = jnp.minimum(kept[..., None] * _lift(q_rows[i], i + 1), joint)
        total = total + jnp.sum(kept.reshape(kept.shape[0], -1), axis=-1)
    return _pick(total, prev_token)


def exact_joint_accepted_length(draft: MarkovChain, target: MarkovChain, *, lookahead: int,
                                position: int = 1, prev_token: int | None = None) -> jax.Array:
    """The joint-coupling bound ``sum_{i <= K'} sum_{x_{1:i}} min(p(x_{1:i}), q(x_{1:i}))``.

    The most drafts any verifier could accept in expectation if it knew the draft's and the
    target's joint laws of every prefix (a maximal coupling of each prefix); block verification,
    which sees only the conditionals along the drafted path, can accept less
    (``exact_block_accepted_length``). Same arguments, shapes and enumeration bound.

    References:
      Sun et al. 2024 (arXiv 2403.10444), Section 2's motivating example (12/9 against 11/9).
    """
    k = _check_block_args(draft, target, lookahead, position, prev_token)
    _check_enumerable(target.num_states, k)
    p_rows = draft.trans[position - 1: position - 1 + k]
    q_rows = target.trans[position - 1: position - 1 + k]
    p_joint, q_joint = p_rows[0], q_rows[0]
    total = jnp.sum(jnp.minimum(p_joint, q_joint), axis=-1)
    for i in range(1, k):
        p_joint = p_joint[..., None] * _lift(p_rows[i], i + 1)
        q_joint = q_joint[..., None] * _lift(q_rows[i], i + 1)
        both = jnp.minimum(p_joint, q_joint)
        total = total + jnp.sum(both.reshape(both.shape[0], -1), axis=-1)
    return _pick(total, prev_token)


def exact_tokenwise_accepted_length(draft: MarkovChain, target: MarkovChain, *, lookahead: int,
                                    position: int = 1,
                                    prev_token: int | None = None) -> jax.Array:
    """Expected drafts accepted in one call of token-wise SD with lookahead ``K``, exactly.

    ``sum_{i <= K'} sum_{x_{1:i}} prod_{j <= i} min(p(x_j | x_{j-1}), q(x_j | x_{j-1}))``,
    computed as products of the ``(V, V)`` matrices ``min(p_j, q_j)`` (no enumeration, no bound).
    Same arguments and shapes as ``exact_block_accepted_length``.

    References:
      Algorithm 1 of the paper with lookahead ``K`` (Leviathan et al. 2023).
    """
    k = _check_block_args(draft, target, lookahead, position, prev_token)
    both = jnp.minimum(draft.trans[position - 1: position - 1 + k],
                       target.trans[position - 1: position - 1 + k])
    reach = both[0]
    total = jnp.sum(reach, axis=-1)
    for i in range(1, k):
        reach = reach @ both[i]
        total = total + jnp.sum(reach, axis=-1)
    return _pick(total, prev_token)


def _call_law(p_rows, q_rows, bonus_row, *, with_bonus: bool):
    """Law of one call's outcome, by enumeration of the draft blocks and the backward pass.

    Args:
      p_rows, q_rows: ``(K', V, V)`` rows of the call's positions.
      bonus_row: ``(V, V)`` target row of the position after the block (unused without bonus).
      with_bonus: whether that position exists (``n + K' <= T``; static).

    Returns:
      ``(K' + 1, V, V)``: entry ``[i, a, y]`` is ``P(tau = i, Y = y | x_{n-1} = a)``, where
      ``Y`` sits at position ``n + i`` (for ``i = K'`` without bonus, all zero: the sequence ends
      with probability ``P(tau = K')``).
    """
    k, num_states, _ = p_rows.shape
    ratio = _safe_ratio(q_rows, p_rows, 1)
    weight = jnp.ones((num_states,), p_rows.dtype)
    joint = jnp.ones((num_states,), p_rows.dtype)
    joints, residuals, stop = [joint], [], []
    for i in range(k + 1):
        if i < k:  # residual at level i, over (x_0..x_i, y)
            residuals.append(jnp.maximum(weight[..., None] * _lift(q_rows[i], i + 1)
                                         - _lift(p_rows[i], i + 1), 0))
            mass = jnp.sum(residuals[-1], axis=-1)
            stop.append(_safe_ratio(mass, mass + (1 - weight), 1) if i > 0 else joint)
            weight = jnp.minimum(weight[..., None] * _lift(ratio[i], i + 1), 1)
            joint = joint[..., None] * _lift(p_rows[i], i + 1)
            joints.append(joint)
        else:
            stop.append(weight)  # h_K' = w_K'
    # Backward: survive_i(x_{0:i}) = P(levels i+1..K' all reject | x_{0:i}).
    survive = jnp.ones_like(joint)
    laws = [None] * (k + 1)
    for i in range(k, -1, -1):
        stopped = joints[i] * stop[i] * survive  # P(tau = i, x_{1:i} | x_0); h_0 = 1
        if i < k:
            out = stopped[..., None] * safe_normalize(residuals[i])
        elif with_bonus:
            out = stopped[..., None] * _lift(bonus_row, i + 1)
        else:
            out = jnp.zeros(stopped.shape + (num_states,), stopped.dtype)
        laws[i] = jnp.sum(out.reshape(num_states, -1, num_states), axis=1)
        if i > 0:
            survive = jnp.sum(_lift(p_rows[i - 1], i) * (1 - stop[i]) * survive, axis=-1)
    return jnp.stack(laws)


@functools.partial(jax.jit, static_argnames=("lookahead",))
def _expected_calls(draft, target, *, lookahead):
    horizon, num_states = target.horizon, target.num_states
    k = lookahead
    laws = []
    num_full = horizon - k  # calls at n = 1 .. T - K draft K tokens and may emit a bonus
    if num_full > 0:
        rows = jnp.arange(num_full)[:, None] + jnp.arange(k)[None, :]
        laws.append(jax.lax.map(
            lambda args: _call_law(*args, with_bonus=True),
            (draft.trans[rows], target.trans[rows], target.trans[jnp.arange(num_full) + k])))
    for n in range(max(num_full, 0) + 1, horizon + 1):  # the last calls: fewer drafts
        law = _call_law(draft.trans[n - 1:], target.trans[n - 1:], None, with_bonus=False)
        laws.append(jnp.pad(law, ((0, k + 1 - law.shape[0]), (0, 0), (0, 0)))[None])
    laws = jnp.concatenate(laws)  # (T, K + 1, V, V)

    def step(window, law):  # window[j]: mass of calls starting at position n + j
        start = window[0]
        ahead = jnp.einsum("a,iay->iy", start, law)  # to positions n + 1 .. n + K + 1
        pad = jnp.zeros((1, num_states), window.dtype)
        return jnp.concatenate([window[1:], pad]) + ahead, jnp.sum(start)

    window = jnp.zeros((k + 1, num_states), target.dtype).at[0].set(target.init)
    _, calls = jax.lax.scan(step, window, laws)
    return jnp.sum(calls)


def exact_block_expected_calls(draft: MarkovChain, target: MarkovChain, *,
                               lookahead: int) -> jax.Array:
    """Expected number of target calls of block verification over the whole sequence, exactly.

    A forward recursion over the states where calls start, ``(position n, previous token a)``,
    with each call's law of ``(tau, Y)`` enumerated over its ``V**K'`` draft blocks and the
    backward pass (``T`` enumerations, one position at a time). Differentiable; jitted (static
    ``lookahead``).

    Args:
      draft: the draft ``MarkovChain`` ``p``.
      target: the target ``MarkovChain`` ``q``.
      lookahead: ``K >= 1``.

    Returns:
      A scalar: ``E[num_calls]`` of ``block_verification_decoding``.

    Raises:
      ValueError: bad arguments, or ``V**min(K, T)`` above ``MAX_BLOCKS`` (2**20).

    References:
      Sun et al. 2024 (arXiv 2403.10444), Algorithm 2.
    """
    check_pair(draft, target)
    _checks.check_positive_int("lookahead", lookahead)
    k = min(lookahead, target.horizon)
    _check_enumerable(target.num_states, k)
    return _expected_calls(draft, target, lookahead=k)
