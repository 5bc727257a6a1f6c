"""The sequence-optimal verifier of ``M`` i.i.d. drafts: root laws that maximise a weighted
matched mass (``weighted_optimal_root_law``, Edmonds' greedy) and the weights that make them
minimise the expected rejections of a whole sequence (``sequence_optimal_weights``, backward
induction). ``OptimalMultiDraft(..., sequence_optimal=True)`` verifies its roots with them. The
names are served from ``specjax.decoders.multi_draft`` too.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from specjax.decoders.optimal_acceptance import inverse_permutation
from specjax.decoders.optimal_acceptance import prefix_with_zero
from specjax.decoders.optimal_acceptance import ratio_order
from specjax.decoders.optimal_acceptance import unpermute
from specjax.decoders.verification import VerificationLaw
from specjax.numerics import indicator

__all__ = [
    "MAX_SEQUENCE_OPTIMAL_ELEMENTS",
    "check_sequence_optimal_size",
    "sequence_optimal_weights",
    "weighted_optimal_root_law",
]


# --- The sequence-optimal verifier: which tokens to match, by backward induction ----------------
#
# Every m of the polymatroid of the per-token optimum
# (specjax.decoders.optimal_acceptance) is the matched mass of some lossless coupling, so a verifier
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
    p_mass = prefix_with_zero(member * p_r[..., None, :])  # (..., k, l): p(top l of G_k)
    q_mass = prefix_with_zero(member * q_r[..., None, :])
    g = 1 - (1 - jnp.clip(p_mass, 0, 1)) ** int(num_drafts) - q_mass
    rank_cut = q_mass[..., -1] + jnp.minimum(jnp.min(g, axis=-1), 0)  # rho'(G_k), k = 0..V
    gain = jnp.diff(rank_cut, axis=-1)  # (..., k): the k-th token of the weight order
    gain_r = jnp.take_along_axis(gain, rank, axis=-1)  # back to q/p order
    matched_r = jnp.clip(gain_r, 0, q_r) * (w_r > 0)
    accepted = unpermute(matched_r, ratio_desc)
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
