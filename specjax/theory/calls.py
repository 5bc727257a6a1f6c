"""The exact forward recursion of call-level decoders over the states where calls start.

A call-level decoder (block verification; token trees next) is a Markov chain over the states
``(position n, previous token a)`` at which target calls start. Its ``call_law`` gives, for every
``a``, the law of a call's outcome: which drafts it keeps and its last token, rejected or bonus
(``specjax.decoders.base.CallLaw``). The recursion carries the mass of call starts for the next
``K + 1`` positions (a window) and the masses each call adds to the positions it fills:

* ``P(a call starts at n) = sum_a s_n(a)``;
* ``P(x_{n+i} = x, ...) += s_n @ law[i]`` for the kept drafts, the rejected and the bonus token;
* ``s_{n+i+1} += s_n @ (rejected[i] + bonus[i])``.

A call at ``n`` drafts ``K' = min(K, T - n + 1)`` tokens; its law is evaluated once per start
position (``T`` evaluations, the full-length ones under ``lax.map``), so the cost is that of the
decoder's law (``V**K'`` for block verification) times ``T``, plus ``O(T K V^2)``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from specjax.decoders.base import CallLaw
from specjax.theory.recursion import ExactDecoding

_HIGHEST = jax.lax.Precision.HIGHEST


def call_laws(decoder, draft, target, lookahead: int) -> CallLaw:
    """The law of a call starting at each position ``n = 1..T``, padded to ``K``: fields
    ``(T, K, V, V)`` (kept) and ``(T, K + 1, V, V)`` (rejected, bonus)."""
    horizon = target.horizon
    k = lookahead
    laws = []
    num_full = horizon - k  # calls at n = 1 .. T - K draft K tokens and may emit a bonus
    if num_full > 0:
        rows = jnp.arange(num_full)[:, None] + jnp.arange(k)[None, :]
        laws.append(jax.lax.map(
            lambda args: decoder.call_law(*args, with_bonus=True),
            (draft.trans[rows], target.trans[rows], target.trans[jnp.arange(num_full) + k])))
    for n in range(max(num_full, 0) + 1, horizon + 1):  # the last calls: fewer drafts
        law = decoder.call_law(draft.trans[n - 1:], target.trans[n - 1:], None,
                               with_bonus=False)
        pad = k - law.kept.shape[0]
        law = CallLaw(*(jnp.pad(x, ((0, pad), (0, 0), (0, 0)))[None] for x in law))
        laws.append(law)
    return CallLaw(*(jnp.concatenate(parts) for parts in zip(*laws)))


def _vecmat(x, a):
    return jnp.einsum("a,iay->iy", x, a, precision=_HIGHEST)


@functools.partial(jax.jit, static_argnames=("lookahead",))
def forward_calls(decoder, draft, target, *, lookahead: int) -> ExactDecoding:
    """Exact per-position statistics of a call-level ``decoder`` on ``MarkovChain``s.

    Args:
      decoder: a call-level decoder.
      draft, target: ``MarkovChain``s.
      lookahead: ``K = min(decoder.lookahead, T)`` (static).

    Returns:
      ``ExactDecoding``; ``rejected`` is the mass of last tokens drawn after a rejection,
      ``verified`` one minus the mass of bonus tokens.
    """
    num_states = target.num_states
    k = lookahead
    laws = call_laws(decoder, draft, target, k)
    dtype = laws.rejected.dtype

    def step(carry, law):
        # starts[j]: mass of calls starting at n + j; filled[j]: (token, rejected, bonus) masses
        # already placed at position n + j by earlier calls.
        starts, filled = carry
        start = starts[0]
        kept = jnp.pad(_vecmat(start, law.kept), ((0, 1), (0, 0)))  # positions n .. n + K
        rejected = _vecmat(start, law.rejected)
        bonus = _vecmat(start, law.bonus)
        filled = filled + jnp.stack([kept + rejected + bonus, rejected, bonus], axis=1)
        zeros = jnp.zeros((1, num_states), dtype)
        # The last token at n + i starts a call at n + i + 1 (index i once shifted).
        starts = jnp.concatenate([starts[1:], zeros]) + rejected + bonus
        done = filled[0]
        filled = jnp.concatenate([filled[1:], jnp.zeros((1, 3, num_states), dtype)])
        return (starts, filled), (done, jnp.sum(start))

    starts = jnp.zeros((k + 1, num_states), dtype).at[0].set(target.init)
    filled = jnp.zeros((k + 1, 3, num_states), dtype)
    _, (done, new_call) = jax.lax.scan(step, (starts, filled), laws)
    marginals = jnp.concatenate([target.init[None].astype(dtype), done[:, 0]])
    return ExactDecoding(rejected=done[:, 1], new_call=new_call, marginals=marginals,
                         verified=1 - jnp.sum(done[:, 2], axis=-1))


def accepted_length_calls(decoder, draft, target, *, position: int, lookahead: int):
    """``(V,)``: the expected drafts kept by a call at ``position`` from each previous token."""
    horizon = target.horizon
    k = min(lookahead, horizon - position + 1)
    with_bonus = position + k <= horizon
    bonus_row = target.trans[position - 1 + k] if with_bonus else None
    law = decoder.call_law(draft.trans[position - 1: position - 1 + k],
                           target.trans[position - 1: position - 1 + k], bonus_row,
                           with_bonus=with_bonus)
    return jnp.sum(law.kept, axis=(0, 2))
