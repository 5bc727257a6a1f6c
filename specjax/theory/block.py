"""Block verification's exact values beside the token-wise value and the joint-coupling bound.

``exact_block_accepted_length`` and ``exact_block_expected_calls`` are conveniences over
``specjax.accepted_length`` and ``specjax.exact`` with ``BlockVerification(K)``;
``exact_tokenwise_accepted_length`` and ``exact_joint_accepted_length`` are the two values block
verification lies between (Sun et al. 2024, arXiv 2403.10444).
"""

from __future__ import annotations

import functools
import numbers

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax.decoders.block import BlockVerification
from specjax.decoders.block import check_enumerable
from specjax.decoders.block import lift
from specjax.models.markov import MarkovChain
from specjax.models.markov import check_pair
from specjax.theory.values import accepted_length
from specjax.theory.values import exact

__all__ = [
    "exact_block_accepted_length",
    "exact_block_expected_calls",
    "exact_joint_accepted_length",
    "exact_tokenwise_accepted_length",
]


def _check_block_args(draft, target, lookahead, position, prev_token) -> int:
    """Validates the exact functions' arguments; returns ``K'``, the drafts of the call."""
    check_pair(draft, target)
    _checks.check_positive_int("lookahead", lookahead)
    horizon, num_states = target.horizon, target.num_states
    _checks.check_position(position, horizon)
    if prev_token is not None and (isinstance(prev_token, bool)
                                   or not isinstance(prev_token, numbers.Integral)
                                   or not 0 <= prev_token < num_states):
        raise ValueError(f"prev_token must be None or an integer in [0, V) = [0, {num_states}), "
                         f"got {prev_token!r}")
    return min(lookahead, horizon - position + 1)


def _pick(values: jax.Array, prev_token):
    return values if prev_token is None else values[prev_token]


def exact_block_accepted_length(draft: MarkovChain, target: MarkovChain, *, lookahead: int,
                                position: int = 1, prev_token: int | None = None) -> jax.Array:
    """Expected number of drafts block verification accepts in one call, exactly:
    ``accepted_length(BlockVerification(lookahead), draft, target, position=position)``, or its
    entry ``prev_token``.

    The value is ``sum_{i <= K'} sum_{x_{1:i}} m_i(x_{1:i})`` with ``m_0 = 1`` and
    ``m_i = min(m_{i-1} q(x_i | x_{i-1}), p(x_{1:i}))``, enumerated over the ``V**K'`` blocks
    (``K' = min(K, T - n + 1)``); between ``exact_tokenwise_accepted_length`` and
    ``exact_joint_accepted_length``, with equality for ``K' = 1``.

    Returns:
      ``(V,)`` (one value per previous token) or a scalar for the given ``prev_token``.

    References:
      Sun et al. 2024, "Block verification accelerates speculative decoding", Algorithm 2.
    """
    _check_block_args(draft, target, lookahead, position, prev_token)
    values = accepted_length(BlockVerification(lookahead), draft, target, position=position)
    return _pick(values, prev_token)


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
    check_enumerable(target.num_states, k)
    return _pick(_joint_total(draft.trans, target.trans, np.int32(position - 1), k=k),
                 prev_token)


@functools.partial(jax.jit, static_argnames=("k",))
def _joint_total(p_trans, q_trans, start, *, k: int):
    """``exact_joint_accepted_length``'s ``(V,)`` values for the ``k`` rows from ``start``
    (traced): one compiled program per ``k`` and shape, not one per operation."""
    p_rows = jax.lax.dynamic_slice_in_dim(p_trans, start, k)
    q_rows = jax.lax.dynamic_slice_in_dim(q_trans, start, k)
    p_joint, q_joint = p_rows[0], q_rows[0]
    total = jnp.sum(jnp.minimum(p_joint, q_joint), axis=-1)
    for i in range(1, k):
        p_joint = p_joint[..., None] * lift(p_rows[i], i + 1)
        q_joint = q_joint[..., None] * lift(q_rows[i], i + 1)
        both = jnp.minimum(p_joint, q_joint)
        total = total + jnp.sum(both.reshape(both.shape[0], -1), axis=-1)
    return total


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
    return _pick(_tokenwise_total(draft.trans, target.trans, np.int32(position - 1), k=k),
                 prev_token)


@functools.partial(jax.jit, static_argnames=("k",))
def _tokenwise_total(p_trans, q_trans, start, *, k: int):
    """``exact_tokenwise_accepted_length``'s ``(V,)`` values for the ``k`` rows from ``start``
    (traced), in one compiled program."""
    both = jnp.minimum(jax.lax.dynamic_slice_in_dim(p_trans, start, k),
                       jax.lax.dynamic_slice_in_dim(q_trans, start, k))
    reach = both[0]
    total = jnp.sum(reach, axis=-1)
    for i in range(1, k):
        reach = reach @ both[i]
        total = total + jnp.sum(reach, axis=-1)
    return total


def exact_block_expected_calls(draft: MarkovChain, target: MarkovChain, *,
                               lookahead: int) -> jax.Array:
    """``exact(BlockVerification(lookahead), draft, target).expected_calls``: the expected
    number of target calls of block verification over the whole sequence, exactly."""
    return exact(BlockVerification(lookahead), draft, target).expected_calls
