"""The exact forward recursion of call-level decoders over the states where calls start.

A call-level decoder (block verification, token trees) is a Markov chain over the states
``(position n, previous token a)`` at which target calls start. Its ``call_law`` gives, for every
``a``, the law of a call's outcome: which drafts it keeps and its last token, rejected or bonus
(``specjax.decoders.base.CallLaw``). The recursion carries the mass of call starts for the next
``K + 1`` positions (a window) and the masses each call adds to the positions it fills:

* ``P(a call starts at n) = sum_a s_n(a)``;
* ``P(x_{n+i} = x, ...) += s_n @ law[i]`` for the kept drafts, the rejected and the bonus token;
* ``s_{n+i+1} += s_n @ (rejected[i] + bonus[i])``.

A call at ``n`` drafts ``K' = min(K, T - n + 1)`` tokens. Its law is built inside the scan for
the mass of calls starting there (``decoder.call_law_from``), once per position, so the cost is
that of the decoder's law (``V**K'`` for block verification; ``O(nodes V^2)`` for a token tree,
which pushes the start mass through its nodes) times ``T``, plus ``O(T K V)``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from specjax.decoders.base import CallLaw
from specjax.numerics import HIGHEST
from specjax.theory.recursion import ExactDecoding

__all__ = [
    "accepted_length_calls",
    "call_law_at",
    "forward_calls",
    "law_from_rows",
    "next_state_table",
]

def call_law_at(decoder, start, draft, target, n, *, lookahead: int,
                with_drafted: bool = False, state: int | None = None):
    """The law of a call at position ``n`` (1-based) whose previous token has the law ``start``,
    fields padded to ``(K, V)`` and ``(K + 1, V)``. ``n`` may be traced for a full-length call
    (``n <= T - K``); the last ``K`` positions are static (the call drafts fewer tokens).

    With ``with_drafted`` (a decoder whose draft length is random: ``drafted_call_law_from``),
    the pair ``(law, drafted)``, ``drafted`` ``(K + 1,)`` the mass of calls drafting exactly ``d``
    tokens, both from one enumeration of the call. ``state``: the call state (traced) of a
    decoder with ``num_call_states > 1``."""
    p_rows, q_rows, bonus_row, pad = _call_rows(draft, target, n, lookahead)
    out = law_from_rows(decoder, start, p_rows, q_rows, bonus_row, position=n, state=state,
                        with_drafted=with_drafted)
    law, drafted = out if with_drafted else (out, None)
    if pad:
        law = CallLaw(*(jnp.pad(x, ((0, pad), (0, 0))) for x in law))
        drafted = None if drafted is None else jnp.pad(drafted, (0, pad))
    return (law, drafted) if with_drafted else law


def law_from_rows(decoder, start, p_rows, q_rows, bonus_row, *, position, state=None,
                  with_drafted: bool = False):
    """The decoder's ``call_law_from`` (or ``drafted_call_law_from`` with ``with_drafted``) on
    the rows of one call, with the keywords its hooks take: the call's 1-based ``position``
    (``uses_position``) and its call ``state`` (``None`` for a stateless decoder); the bonus
    row is ``None`` past the horizon."""
    law_from = decoder.drafted_call_law_from if with_drafted else decoder.call_law_from
    extra = _position(decoder, position) | ({} if state is None else {"state": state})
    return law_from(start, p_rows, q_rows, bonus_row, with_bonus=bonus_row is not None, **extra)


def next_state_table(decoder, lookahead: int):
    """``(S, K + 1, S)`` 0/1 NumPy array: ``[s, i, t] = 1`` iff a call in state ``s`` that kept
    ``i`` drafts leaves the decoder in state ``t`` (``decoder.next_call_state`` on Python ints)."""
    num = decoder.num_call_states
    table = np.zeros((num, lookahead + 1, num))
    for s in range(num):
        for i in range(lookahead + 1):
            table[s, i, int(decoder.next_call_state(s, i))] = 1
    return table


def _position(decoder, n) -> dict:
    """The call's position for a decoder whose law depends on it (``uses_position``)."""
    return {"position": n} if decoder.uses_position else {}


def _call_rows(draft, target, n, lookahead: int):
    """``(p_rows, q_rows, bonus_row, pad)`` of a call at ``n``: ``K' = min(K, T - n + 1)`` rows,
    the bonus row (``None`` past the horizon) and ``K - K'``."""
    horizon = target.horizon
    k = lookahead
    if isinstance(n, int) and n > horizon - k:
        return draft.trans[n - 1:], target.trans[n - 1:], None, k - (horizon - n + 1)
    p_rows = jax.lax.dynamic_slice_in_dim(draft.trans, n - 1, k)
    q_rows = jax.lax.dynamic_slice_in_dim(target.trans, n - 1, k)
    bonus_row = jax.lax.dynamic_index_in_dim(target.trans, n - 1 + k, keepdims=False)
    return p_rows, q_rows, bonus_row, 0


@functools.partial(jax.jit, static_argnames=("lookahead", "with_depths", "with_drafted"))
def forward_calls(decoder, draft, target, *, lookahead: int, with_depths: bool = False,
                  with_drafted: bool = False):
    """Exact per-position statistics of a call-level ``decoder`` on ``MarkovChain``s.

    Each position's call law is built for the mass of calls starting there
    (``decoder.call_law_from``) inside the scan, so nothing of size ``T x V x V`` per field is
    stored and a decoder that pushes the start mass through its call (a token tree) does
    ``O(V^2)`` work per node.

    Args:
      decoder: a call-level decoder.
      draft, target: ``MarkovChain``s.
      lookahead: ``K = min(decoder.lookahead, T)`` (static).

      with_depths: also return ``(T, K)``, ``[n - 1, i - 1]`` = P(a call starts at ``n`` and
        keeps at least ``i`` drafts) (static).
      with_drafted: also return ``(T, K + 1)``, ``[n - 1, d]`` = P(a call starts at ``n`` and
        drafts exactly ``d`` tokens), for a decoder with ``drafted_call_law_from`` (static).

    Returns:
      ``ExactDecoding``; ``rejected`` is the mass of last tokens drawn after a rejection,
      ``verified`` one minus the mass of bonus tokens. With ``with_depths`` or
      ``with_drafted``, a tuple ``(ExactDecoding, depths?, drafted?)`` of those requested.
    """
    num_states = target.num_states
    horizon = target.horizon
    k = lookahead
    dtype = jnp.result_type(draft.trans.dtype, target.trans.dtype)
    num_call_states = decoder.num_call_states
    if num_call_states > 1:
        moves = jnp.asarray(next_state_table(decoder, k), dtype)  # (S, K + 1, S), static

    def step(carry, n):
        # starts[j, s]: mass of calls starting at n + j in call state s; filled[j]: (token,
        # rejected, bonus) masses already placed at position n + j by earlier calls.
        starts, filled = carry
        # The last token at n + i starts a call at n + i + 1 (index i once shifted).
        new_starts = jnp.concatenate([starts[1:], jnp.zeros_like(starts[:1])])

        def one_state(start, state):
            out = call_law_at(decoder, start, draft, target, n, lookahead=k,
                              with_drafted=with_drafted, state=state)
            return out if with_drafted else (out, jnp.zeros((0,), dtype))

        if num_call_states == 1:
            law, drafted = one_state(starts[0, 0], None)
            new_starts = new_starts.at[:, 0].add(law.rejected + law.bonus)
        else:  # every call state at once: the state is traced, one law is compiled
            laws, drafts = jax.vmap(one_state)(starts[0], jnp.arange(num_call_states))
            ends = laws.rejected + laws.bonus  # (S, K + 1, V)
            new_starts = new_starts + jnp.einsum("siv,sit->itv", ends, moves,
                                                 precision=HIGHEST)
            law = CallLaw(*(jnp.sum(x, axis=0) for x in laws))
            drafted = jnp.sum(drafts, axis=0)
        kept = jnp.pad(law.kept, ((0, 1), (0, 0)))  # positions n .. n + K
        filled = filled + jnp.stack([kept + law.rejected + law.bonus, law.rejected, law.bonus],
                                    axis=1)
        done = filled[0]
        filled = jnp.concatenate([filled[1:], jnp.zeros((1, 3, num_states), dtype)])
        return (new_starts, filled), (done, jnp.sum(starts[0]), jnp.sum(law.kept, axis=-1),
                                      drafted)

    first = jnp.zeros((k + 1, num_call_states, num_states), dtype)
    carry = (first.at[0, decoder.initial_call_state].set(target.init),
             jnp.zeros((k + 1, 3, num_states), dtype))
    num_full = max(horizon - k, 0)
    outputs = []
    if num_full:
        carry, out = jax.lax.scan(step, carry, jnp.arange(1, num_full + 1))
        outputs.append(out)
    for n in range(num_full + 1, horizon + 1):  # the last calls: fewer drafts, static shapes
        carry, out = step(carry, n)
        outputs.append(jax.tree.map(lambda x: x[None], out))
    done, new_call, depths, drafted = (jnp.concatenate(parts) for parts in zip(*outputs))
    marginals = jnp.concatenate([target.init[None].astype(dtype), done[:, 0]])
    result = ExactDecoding(rejected=done[:, 1], new_call=new_call, marginals=marginals,
                           verified=1 - jnp.sum(done[:, 2], axis=-1),
                           emitted=jnp.ones_like(new_call))
    extra = (depths,) * with_depths + (drafted,) * with_drafted
    return (result,) + extra if extra else result


def accepted_length_calls(decoder, draft, target, *, position: int, lookahead: int):
    """``(V,)``: the expected drafts kept by a call at ``position`` from each previous token."""
    if decoder.num_call_states > 1:
        raise ValueError(f"decoder: accepted_length gives one value per previous token, but a "
                         f"call of {type(decoder).__name__} also depends on the earlier calls "
                         f"(a state carried from call to call); use specjax.exact or "
                         f"specjax.theory.engine_metrics")
    # Op by op on purpose (measured twice): a jit compiles one program per decoder, shapes and
    # position, where the op-by-op programs are shared between trees and positions. Jitted,
    # test_token_tree's per-position lengths of its trees took 79 -> 103 s of CPU (395 -> 594
    # compilations), more than every other module gained.
    horizon = target.horizon
    k = min(lookahead, horizon - position + 1)
    with_bonus = position + k <= horizon
    bonus_row = target.trans[position - 1 + k] if with_bonus else None
    law = decoder.call_law(draft.trans[position - 1: position - 1 + k],
                           target.trans[position - 1: position - 1 + k], bonus_row,
                           with_bonus=with_bonus, **_position(decoder, position))
    return jnp.sum(law.kept, axis=(0, 2))
