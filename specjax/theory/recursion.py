"""Exact forward recursion over the decoder's state: the expected-value twin of the sampling
engine (``specjax.sampling.engine``).

A decoder is a Markov chain over ``(previous token, phase)`` (as in the engine): phase ``j``
counts the drafts accepted since the last target call, ``j = 0`` opens a call (the *root*, where
batch SD verifies its ``M`` drafts), ``j = K`` emits the target's bonus token. This module
propagates the exact law ``pi_n[j, x] = P(phase j, x_n = x)`` through the same per-position laws
the samplers draw from (the decoder's ``laws``), so every expected count is a sum of masses:

* ``P(x_n = x, R_n = 1) = sum_j (pi_{n-1}[j] @ rejected_j)[x]`` (the paper's ``f`` of
  Theorem 3, marginalised to the last token);
* ``P(a call starts at n) = sum_x pi_{n-1}[0, x]``.

Cost per position: one law evaluation on ``(V, V)`` rows and ``O(K)`` vector-matrix products,
i.e. ``O(T V^2)`` overall (times the ``M`` passes of the batch residual chain). Memory is that of
the inputs; under ``jax.grad`` the law evaluation is rematerialised (``jax.checkpoint``) so the
stored residuals stay ``O(T V^2)`` whatever ``M``.

When ``K >= T`` no bonus is ever reached and all in-call phases share one law, so the state
shrinks to ``(root, in-call)``, and to a single phase when the root law equals the in-call law
(every rule but batch SD): this is Theorem 1's ``sum_n E_{x_{n-1}}[TV(p_n, q_n)]``.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from specjax import _memory
from specjax.decoders import verification as _verify
from specjax.numerics import matmul_highest
from specjax.numerics import safe_ratio

__all__ = [
    "ExactDecoding",
    "accepted_by_depth",
    "check_fits",
    "forward",
    "forward_bytes",
    "keep_live",
    "stopping",
]

class ExactDecoding(NamedTuple):
    """Exact per-position statistics of a decoder (expected values, no sampling).

    Attributes:
      rejected: ``P(x_n = x and x_n was drawn after a rejection)`` for ``n = 1..T``; summed over
        ``x`` it is ``E[R_n]``. For batch SD this is the paper's pseudo-measure ``f`` (Theorem 3)
        marginalised to the last token.
      new_call: ``P(a target call starts at position n)``.
      marginals: the law of ``x_n`` for ``n = 0..T`` (the target's marginals for unbiased rules).
      verified: ``P(a draft is verified at position n)``, i.e. ``x_n`` is not the target's bonus
        token after ``K`` accepted drafts (1 for ``K = T``, 0 for autoregressive decoding).
      emitted: ``P(x_n is emitted)``: 1, or with stop tokens the probability that the chain has
        not stopped before ``n`` (the other fields then count only the emitted positions, and
        ``marginals`` is the law of the stopped output, whose tokens repeat the stop token).

    The fields have the names of the same quantities in ``DecodingTrace`` (one value per chain)
    and ``DecodingStatistics`` (counts over ``C`` chains): ``rejected.sum(-1)`` is the mean of
    ``DecodingTrace.rejected`` over the chains and of ``DecodingStatistics.rejected / C``; the
    same holds for ``new_call``, ``verified`` and ``emitted``.

    ``expected_rejections`` (the paper's ``E[N_rej]``), ``expected_calls``, ``expected_length``,
    ``rejection_rate`` (``E[R_n]``, shape ``(T,)``) and ``acceptance_rate`` (per position, given
    a draft was verified there) are derived properties; they reduce the trailing axes only, so
    they also work on a ``vmap``-ped batch of results.
    """

    rejected: jax.Array  # shape=(T, V)
    new_call: jax.Array  # shape=(T,)
    marginals: jax.Array  # shape=(T + 1, V)
    verified: jax.Array  # shape=(T,)
    emitted: jax.Array | None = None  # shape=(T,); None (a result built before it): all 1

    @property
    def rejection_rate(self) -> jax.Array:
        """``E[R_n]`` for ``n = 1..T``, shape ``(..., T)``."""
        return jnp.sum(self.rejected, axis=-1)

    @property
    def acceptance_rate(self) -> jax.Array:
        """``P(no rejection at n | a draft is verified at n)`` for ``n = 1..T``, shape
        ``(..., T)``: what serving engines report as the acceptance rate, position by position.
        Where no draft is ever verified (``verified == 0``: a certain bonus token, or
        autoregressive decoding) nothing is rejected and the rate is 1 by convention; values and
        gradients stay finite."""
        return 1 - safe_ratio(self.rejection_rate, self.verified, 0)

    @property
    def expected_rejections(self) -> jax.Array:
        """``E[N_rej] = sum_n E[R_n]``, shape ``(...)``."""
        return jnp.sum(self.rejected, axis=(-2, -1))

    @property
    def expected_calls(self) -> jax.Array:
        """Expected number of target calls, shape ``(...)``."""
        return jnp.sum(self.new_call, axis=-1)

    @property
    def expected_length(self) -> jax.Array:
        """Expected number of emitted tokens among ``x_1..x_T`` (``T`` without stop tokens),
        shape ``(...)``."""
        if self.emitted is None:
            return jnp.full(self.new_call.shape[:-1], self.new_call.shape[-1],
                            self.new_call.dtype)
        return jnp.sum(self.emitted, axis=-1)



def forward_bytes(num_states: int, horizon: int, lookahead: int, dtype_bytes: int = 4) -> int:
    """Estimated peak bytes of ``forward`` besides its inputs: a few ``(V, V)`` laws of one
    position (up to 5 measured with XLA's ``memory_analysis``, batch SD with ``K < T``), the
    ``(K + 1, V)`` state and the ``(T, V)`` outputs. Gradients store more (``O(T V^2)``
    residuals); they are not counted."""
    phases = min(lookahead, horizon) + 1
    return dtype_bytes * (6 * num_states * num_states + 2 * phases * num_states
                          + 4 * (horizon + 1) * num_states)


def check_fits(num_states: int, horizon: int, lookahead: int, dtype_bytes: int = 4) -> None:
    """Raises ``ValueError`` naming ``num_states`` when ``forward``'s estimated memory
    (``forward_bytes``) exceeds what is available (``specjax._memory``)."""
    _memory.check_fits(
        forward_bytes(num_states, horizon, lookahead, dtype_bytes),
        argument=f"num_states = {num_states:,} (draft and target, T = {horizon:,})",
        what="the exact recursion's laws of one position and its per-position outputs",
        remedy="use models with fewer tokens, or a machine (device) with more memory")


def forward(init, p, q, decoder, lookahead: int, stop=None) -> ExactDecoding:
    """Exact statistics of a token-wise ``decoder`` with lookahead ``K`` for drafts ``p`` and
    targets ``q``.

    Args:
      init: ``(V,)`` law of ``x_0``.
      p: ``(T, V, V)`` draft transitions.
      q: ``(T, V, V)`` target transitions.
      decoder: a token-wise decoder (its ``laws``, ``same_root``, ``root_scale``).
      lookahead: ``K`` (static); ``K >= T`` is the paper's setting (no bonus token), ``K = 0``
        autoregressive decoding.
      stop: ``(V,)`` 0/1 mask of the stop tokens, or ``None``: a chain stops after its first stop
        token among ``x_1..x_T`` (its mass leaves the recursion and repeats the token).

    Returns:
      ``ExactDecoding``.

    Raises:
      ValueError: the estimated memory (``forward_bytes``) exceeds what is available; checked
        from the shapes when the computation is traced, before it runs.
    """
    check_fits(q.shape[-1], q.shape[0], lookahead, jnp.dtype(q.dtype).itemsize)
    decoder = decoder.bind(p, q)
    if lookahead == 0:
        return _autoregressive(init, q, stop)
    if lookahead >= p.shape[0] and decoder.has_root_scale and stop is None:
        return _unbiased_forward(init, p, q, decoder)
    return _general_forward(init, p, q, decoder, lookahead, stop)


def keep_live(mass, stop):
    """``mass`` ``(..., V)`` without its mass at the stop tokens (``stop`` ``(V,)`` 0/1, or
    ``None``: unchanged)."""
    if stop is None:
        return mass
    return mass * jnp.expand_dims(1 - stop, tuple(range(mass.ndim - 1)))


def stopping(step, stop):
    """``step(pi, inputs) -> (new_pi, (rejected, token, *rest))`` of a recursion over live mass
    (``pi`` ``(..., V)`` or ``(..., S)``, the last axis pushed to ``token`` ``(V,)``), made to
    stop chains at the tokens of ``stop`` (``(V,)`` 0/1, or ``None``: ``step`` unchanged but for
    the carry). The carry becomes ``(pi, stopped)``, ``stopped`` ``(V,)`` the mass of chains
    stopped so far at each stop token; ``token`` becomes the law of the output at ``n`` (the
    stopped chains repeat their token), and ``P(x_n is emitted) = sum(pi)`` (1 without stop
    tokens) is appended to the outputs. The wrapped step's keyword ``mask(new_pi)`` removes the
    stopped mass from ``new_pi`` (``keep_live``, or nothing where ``step`` already did)."""
    def wrapped(carry, inputs, mask):
        pi, stopped = carry
        new_pi, (rejected, token, *rest) = step(pi, inputs)
        if stop is None:  # every position is emitted (1, not the mass: rows may sum off 1)
            return (new_pi, stopped), (rejected, token, *rest, jnp.ones((), token.dtype))
        emitted = jnp.sum(pi)
        new_pi = mask(new_pi)
        return (new_pi, stopped + token * stop), (rejected, token + stopped, *rest, emitted)
    return wrapped


def _autoregressive(init, q, stop=None) -> ExactDecoding:
    """Every position is one call and the target's own draw: nothing is verified or rejected."""
    def step(mu, q_n):
        mu = matmul_highest(mu, q_n)
        return mu, (None, mu)

    step = functools.partial(stopping(step, stop), mask=lambda mu: keep_live(mu, stop))
    _, (_, marginals, emitted) = jax.lax.scan(step, (init, jnp.zeros_like(init)), q)
    zeros = jnp.zeros(q.shape[:1], q.dtype)
    return _finish(init, jnp.zeros(q.shape[:2], q.dtype), marginals, new_call=emitted,
                   verified=zeros, emitted=emitted)


def _finish(init, rejected, marginals, new_call=None, verified=None, emitted=None,
            stop=None) -> ExactDecoding:
    marginals = jnp.concatenate([init[None], marginals])
    if emitted is None:
        emitted = jnp.ones(rejected.shape[:1], rejected.dtype)
    if new_call is None:  # K >= T: a call starts at n = 1 and right after every rejection
        rate = jnp.sum(keep_live(rejected, stop), axis=-1)  # not at a stop token
        new_call = jnp.concatenate([jnp.ones((1,), rate.dtype), rate[:-1]])
    if verified is None:  # K >= T: no bonus token, a draft is verified at every position
        verified = emitted
    return ExactDecoding(rejected=rejected, new_call=new_call, marginals=marginals,
                         verified=verified, emitted=emitted)


def _unbiased_forward(init, p, q, decoder) -> ExactDecoding:
    """``K >= T`` for SD and batch SD, whose rejected masses are ``[q - S p]_+`` (``S = 1``
    inside a call, ``S = S_M`` at the root, see ``specjax.decoders.multi_draft.batch_scale``) and whose
    accepted masses are ``q`` minus those (unbiasedness), so the in-call accepted law is never
    needed: per position, ``pi_root @ [q - S p]_+ + pi_in @ [q - p]_+`` and ``pi @ q``.

    The root's ``S`` is computed inside the scan, one ``(V, V)`` slice at a time, where its
    ``M - 1`` passes stay in cache (measured 2x faster on CPU than a sweep over all positions).
    """
    one_phase = decoder.same_root

    # No CSE barrier: inside a scan it is not needed, and it slows the primal pass 2x on CPU.
    @functools.partial(jax.checkpoint, prevent_cse=False)
    def step(pi, inputs):
        p_n, q_n = inputs
        if one_phase:
            rejected = matmul_highest(pi, _verify.scaled_residual(p_n, q_n, 1))
            total = matmul_highest(pi, q_n)
            return total, (rejected, total)
        root, inside = pi[0], pi[1]
        scale = decoder.root_scale(p_n, q_n)
        rejected = (matmul_highest(root, _verify.scaled_residual(p_n, q_n, scale))
                    + matmul_highest(inside, _verify.scaled_residual(p_n, q_n, 1)))
        total = matmul_highest(root + inside, q_n)
        return jnp.stack([rejected, total - rejected]), (rejected, total)

    pi0 = init if one_phase else jnp.stack([init, jnp.zeros_like(init)])
    _, (rejected, marginals) = jax.lax.scan(step, pi0, (p, q))
    return _finish(init, rejected, marginals)


def _phased_step(pi, root, verify, q_n, lookahead: int):
    """One position of the phased recursion: ``pi`` ``(K + 1, V)`` holds the mass of the root
    (phase 0), of ``i`` drafts accepted in the current call (phase ``i = 1..K - 1``) and of the
    bonus (phase ``K``). Returns the next ``pi`` (phase ``i >= 1``: the ``i``-th draft of a call
    was just accepted) and the rejected mass."""
    inside = pi[1:lookahead]
    rejected = (matmul_highest(pi[0], root.rejected)
                + matmul_highest(jnp.sum(inside, 0), verify.rejected))
    bonus = matmul_highest(pi[lookahead], q_n)
    new_pi = jnp.concatenate([
        (rejected + bonus)[None],
        matmul_highest(pi[0], root.accepted)[None],
        matmul_highest(inside, verify.accepted),
    ])
    return new_pi, rejected


@functools.partial(jax.jit, static_argnames=("lookahead",))
def accepted_by_depth(init, p, q, decoder, lookahead: int) -> jax.Array:
    """``(T, K)``: ``[n - 1, i - 1]`` = P(the ``i``-th draft of a call is accepted at position
    ``n``), by the phased recursion with ``K`` phases (``K = min(lookahead, T)``; for
    ``K = T`` no bonus is ever reached, as in the paper's setting). Summed over ``n`` it is the
    expected number of calls whose ``i``-th draft is accepted."""
    if lookahead == 0:  # autoregressive decoding drafts nothing
        return jnp.zeros((p.shape[0], 0), q.dtype)
    decoder = decoder.bind(p, q)

    def step(pi, pq):
        n, p_n, q_n = pq
        root, verify = decoder.laws_at(n, p_n, q_n)
        new_pi, _ = _phased_step(pi, root, verify, q_n, lookahead)
        return new_pi, jnp.sum(new_pi[1:], axis=-1)

    pi0 = jnp.zeros((lookahead + 1,) + init.shape, init.dtype).at[0].set(init)
    _, depths = jax.lax.scan(step, pi0, (jnp.arange(p.shape[0]), p, q))
    return depths


def _general_forward(init, p, q, decoder, lookahead: int, stop=None) -> ExactDecoding:
    """Any rule and lookahead: the laws are evaluated per position and propagated by products;
    with stop tokens (``stop``) the stopped chains leave the recursion (``stopping``)."""
    horizon = p.shape[0]
    in_call_only = lookahead >= horizon
    one_phase = in_call_only and decoder.same_root

    @functools.partial(jax.checkpoint, prevent_cse=False)
    def step_laws(n, p_n, q_n):
        return decoder.laws_at(n, p_n, q_n)

    def step(pi, pq):
        n, p_n, q_n = pq
        root, verify = step_laws(n, p_n, q_n)
        if one_phase:  # pi: (V,), every position is verified the same way
            rejected = matmul_highest(pi, root.rejected)
            new_pi = rejected + matmul_highest(pi, root.accepted)
            return new_pi, (rejected, new_pi, pi[:0], None)
        if in_call_only:  # pi: (2, V) = (root, in-call)
            rejected = matmul_highest(pi[0], root.rejected) + matmul_highest(pi[1], verify.rejected)
            accepted = matmul_highest(pi[0], root.accepted) + matmul_highest(pi[1], verify.accepted)
            return jnp.stack([rejected, accepted]), (rejected, rejected + accepted, pi[0], None)
        new_pi, rejected = _phased_step(pi, root, verify, q_n, lookahead)
        return new_pi, (rejected, jnp.sum(new_pi, 0), pi[0],
                        jnp.minimum(jnp.sum(pi[:lookahead]), 1))

    if one_phase:
        pi0 = init
    else:
        num_phases = 2 if in_call_only else lookahead + 1
        pi0 = jnp.zeros((num_phases,) + init.shape, init.dtype).at[0].set(init)
    step = functools.partial(stopping(step, stop), mask=lambda pi: keep_live(pi, stop))
    _, (rejected, marginals, root_mass, verified, emitted) = jax.lax.scan(
        step, (pi0, jnp.zeros_like(init)), (jnp.arange(horizon), p, q))
    if one_phase:
        return _finish(init, rejected, marginals, emitted=emitted, stop=stop)
    return _finish(init, rejected, marginals, new_call=jnp.sum(root_mass, axis=-1),
                   verified=None if in_call_only else verified, emitted=emitted, stop=stop)
