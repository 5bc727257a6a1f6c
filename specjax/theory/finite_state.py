"""The exact forward recursion of token-wise decoders on two finite-state models.

For two ``FiniteStateModel``s on one state space, the recursion of ``specjax.theory.recursion``
with the state ``s`` in place of the previous token: the law ``pi_n[j, s] = P(phase j, state s
after x_n)`` is pushed through ``next_state`` by a scatter-add, ``O(S V)`` per position and phase,
and every expected count is a sum of masses. Float64 under ``jax_enable_x64``, differentiable in
both tables (gradients finite at ``p = q``, disjoint supports and exhausted residuals, as the laws
are). Its values are the means of the protocol-model sampler (``specjax.sampling.models``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from specjax.decoders import verification
from specjax.numerics import matmul_highest
from specjax.theory.recursion import ExactDecoding
from specjax.theory.recursion import keep_live
from specjax.theory.recursion import stopping

__all__ = ["forward_finite_state"]


@functools.partial(jax.jit, static_argnames=("horizon", "lookahead"))
def forward_finite_state(decoder, draft, target, *, horizon, lookahead, stop=None):
    """``stop``: ``(V,)`` 0/1 mask of the stop tokens, or ``None`` (see
    ``specjax.theory.recursion.stopping``): the mass of a stop token is not pushed on."""
    next_state = target.next_state
    num_contexts, num_states = next_state.shape
    q = target.table
    dtype = jnp.result_type(draft.table, q)
    flat_next = next_state.reshape(-1)

    def push_all(mass):  # (..., S, V) -> (..., S): mass of (s, x) moves to next_state[s, x]
        lead = mass.shape[:-2]
        flat = mass.reshape(lead + (num_contexts * num_states,))
        return jnp.zeros(lead + (num_contexts,), dtype).at[..., flat_next].add(flat)

    def push(mass):  # the chains that emitted a stop token stop
        return push_all(keep_live(mass, stop))

    x0_law = q[draft.start]
    pi0 = push_all(jnp.zeros((num_contexts, num_states), dtype).at[draft.start].set(x0_law))

    in_call_only = lookahead >= horizon
    one_phase = lookahead == 0 or (in_call_only and decoder.same_root)
    if lookahead == 0:
        root = verify = verification.bonus_law(q)
    else:
        root, verify = decoder.laws(draft.table, q)
    root_total, verify_total = root.accepted + root.rejected, verify.accepted + verify.rejected

    def outer(pi, law):  # pi (S,), law (S, V) -> (S, V) joint mass of (state, token)
        return pi[:, None] * law

    # The (S, V) products are rematerialised under grad: the stored residuals are the carries.
    @functools.partial(jax.checkpoint, prevent_cse=False)
    def step(pi, _):
        if one_phase:  # pi: (S,)
            rejected = matmul_highest(pi, root.rejected)
            return push(outer(pi, root_total)), (rejected, matmul_highest(pi, root_total),
                                                 jnp.sum(pi), None)
        if in_call_only:  # pi: (2, S) = (root, in-call)
            rejected = matmul_highest(pi[0], root.rejected) + matmul_highest(pi[1], verify.rejected)
            token = matmul_highest(pi[0], root_total) + matmul_highest(pi[1], verify_total)
            new_pi = push(jnp.stack([
                outer(pi[0], root.rejected) + outer(pi[1], verify.rejected),
                outer(pi[0], root.accepted) + outer(pi[1], verify.accepted),
            ]))
            return new_pi, (rejected, token, jnp.sum(pi[0]), None)
        # pi: (K + 1, S): root, K - 1 in-call phases, bonus.
        inside = jnp.sum(pi[1:lookahead], axis=0)
        bonus = pi[lookahead]
        rejected = matmul_highest(pi[0], root.rejected) + matmul_highest(inside, verify.rejected)
        token = (matmul_highest(pi[0], root_total) + matmul_highest(inside, verify_total)
                 + matmul_highest(bonus, q))
        new_pi = push(jnp.concatenate([
            (outer(pi[0], root.rejected) + outer(inside, verify.rejected)
             + outer(bonus, q))[None],
            outer(pi[0], root.accepted)[None],
            pi[1:lookahead, :, None] * verify.accepted[None],
        ]))
        verified = jnp.minimum(jnp.sum(pi[:lookahead]), 1)
        return new_pi, (rejected, token, jnp.sum(pi[0]), verified)

    if one_phase:
        carry0 = pi0
    else:
        num_phases = 2 if in_call_only else lookahead + 1
        carry0 = jnp.zeros((num_phases, num_contexts), dtype).at[0].set(pi0)
    step = functools.partial(stopping(step, stop), mask=lambda pi: pi)  # push() masked it
    _, outputs = jax.lax.scan(step, (carry0, jnp.zeros((num_states,), dtype)), None,
                              length=horizon)
    rejected, marginals, new_call, verified, emitted = outputs
    if lookahead == 0:  # every position is a call and a bonus token, nothing is verified
        new_call = emitted
        verified = jnp.zeros((horizon,), dtype)
        rejected = jnp.zeros_like(rejected)
    elif one_phase:  # K >= T: a call at n = 1 and right after every rejection not at a stop
        rate = jnp.sum(keep_live(rejected, stop), axis=-1)
        new_call = jnp.concatenate([jnp.ones((1,), dtype), rate[:-1]])
        verified = emitted
    elif in_call_only:
        verified = emitted
    return ExactDecoding(rejected=rejected, new_call=new_call,
                         marginals=jnp.concatenate([x0_law[None], marginals]),
                         verified=verified, emitted=emitted)
