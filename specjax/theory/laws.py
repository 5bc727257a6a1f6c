"""Whole-sequence laws and single-token trade-offs: marginals, output chains, sequence KL, the
Pareto front of biased acceptance (Section 4)."""

from __future__ import annotations

import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp

from specjax import _checks
from specjax.decoders import verification as _verify
from specjax.decoders.base import TokenwiseDecoder
from specjax.decoders.base import check_decoder
from specjax.decoders.biased import BiasedSpeculative
from specjax.decoders.planning import plan_run
from specjax.decoders.rejection import RejectionRule
from specjax.models.markov import MarkovChain
from specjax.models.markov import check_chain
from specjax.models.markov import check_pair
from specjax.numerics import matmul_highest

__all__ = [
    "ParetoFront",
    "biased_output_chain",
    "marginals",
    "output_chain",
    "pareto_front",
    "sequence_kl",
]


def marginals(model: MarkovChain) -> jax.Array:
    """The law of ``x_n`` for ``n = 0..T`` under ``model``: ``(T + 1, V)``."""
    check_chain("model", model)
    return _marginals(model.init, model.trans)


@jax.jit
def _marginals(init, trans):
    """``marginals``' scan, one compiled program per shape and dtype (called eagerly, a
    ``lax.scan`` of a new ``step`` closure compiled a program of its own at every call)."""
    def step(mu, trans_n):
        mu = matmul_highest(mu, trans_n)
        return mu, mu

    _, mus = jax.lax.scan(step, init, trans)
    return jnp.concatenate([init[None], mus])


def output_chain(decoder, draft=None, target=None, *, accept_prob=None,
                 residual=None) -> MarkovChain:
    """The exact law of the sequences a token-wise decoder outputs, as a ``MarkovChain``.

    For Markov drafts and targets and ``K = T`` (the paper's setting), a rejection-based
    decoder's output is itself a Markov chain with transition ``b p + (1 - sum b p) P`` at each
    position. (With a finite lookahead, or a multi-draft root, the output law depends on the
    hidden phase, so it is not a Markov chain in the tokens; use ``exact(...).marginals``.)

    Args:
      decoder: a token-wise decoder whose root and in-call laws coincide and whose lookahead is
        ``None`` (``Speculative()``, ``BiasedSpeculative(eps)``, ``RejectionRule(b, P)``).
      draft: the draft ``MarkovChain`` ``p``.
      target: the target ``MarkovChain`` ``q``.
      accept_prob: deprecated, with ``residual``: the form ``output_chain(draft, target,
        accept_prob=..., residual=...)`` still works (it is ``RejectionRule(accept_prob,
        residual)``) and warns.
      residual: deprecated, see ``accept_prob``.

    Returns:
      A ``MarkovChain``; equal to ``target`` exactly when the decoder is unbiased.

    Example:
      >>> import specjax
      >>> draft, target = specjax.paper_instance()
      >>> chain = specjax.output_chain(specjax.BiasedSpeculative(0.1), draft, target)
      >>> float(specjax.theory.sequence_kl(chain, target)) > 0
      True

    References:
      Algorithm 2; Theorem 4 (the output law ``P^A``).
    """
    if accept_prob is not None or residual is not None or isinstance(decoder, MarkovChain):
        warnings.warn("output_chain(draft, target, accept_prob=..., residual=...) is deprecated: "
                      "use output_chain(specjax.RejectionRule(accept_prob, residual), draft, "
                      "target)", DeprecationWarning, stacklevel=2)
        decoder, draft, target = RejectionRule(accept_prob, residual), decoder, draft
    check_decoder(decoder)
    if not isinstance(decoder, TokenwiseDecoder) or not decoder.same_root \
            or decoder.resolve_lookahead(2**31) != 2**31:
        raise ValueError(
            f"output_chain needs a token-wise decoder with one law per position and lookahead "
            f"None (K = T), got {decoder!r}: its output is not a Markov chain in the tokens; "
            f"use specjax.exact(decoder, draft, target).marginals")
    check_pair(draft, target)
    decoder, draft, target, *_ = plan_run(decoder, draft, target, engine="exact")
    trans = _output_trans(decoder, draft.trans, target.trans)
    if _checks.is_concrete(trans):
        _checks.check_probabilities(
            "the decoder's output transitions (does residual(p, q, b) have mass wherever "
            "rejection is possible?)", trans)
    return MarkovChain.tree_unflatten(None, (target.init, trans))


@jax.jit
def _output_trans(decoder, draft_trans, target_trans):
    """The output chain's transitions, one compiled program (op by op, a call compiled about 50
    small programs; gradients through it compiled as many again)."""
    law, _ = decoder.laws(draft_trans, target_trans)
    return law.accepted + law.rejected


def biased_output_chain(draft: MarkovChain, target: MarkovChain, *, epsilon,
                        residual: str = "optimal") -> MarkovChain:
    """``output_chain(BiasedSpeculative(epsilon, residual=residual), draft, target)``.

    ``sequence_kl(biased_output_chain(p, q, epsilon=e), q)`` is the whole-sequence KL divergence
    of Decoding-OPT (``residual="optimal"``) or Decoding-UNO (``residual="target"``) from the
    target.
    """
    return output_chain(BiasedSpeculative(epsilon, residual=residual), draft, target)


def _kl_rows(a, b):
    """``KL(a || b)`` over the last axis: 0 log 0 = 0, +inf where ``a > 0 = b``; no NaN."""
    pos_a, pos_b = a > 0, b > 0
    safe_a = jnp.where(pos_a, a, jnp.ones_like(a))
    safe_b = jnp.where(pos_b, b, jnp.ones_like(b))
    terms = jnp.where(pos_a, a * (jnp.log(safe_a) - jnp.log(safe_b)), jnp.zeros_like(a))
    infinite = jnp.any(pos_a & ~pos_b, axis=-1)
    return jnp.where(infinite, jnp.inf, jnp.sum(terms, axis=-1))


def sequence_kl(model_a: MarkovChain, model_b: MarkovChain) -> jax.Array:
    """``KL(A || B)`` between the laws of whole sequences ``x_{0:T}`` of two Markov chains.

    By the chain rule it decomposes over positions:
    ``KL(a_0 || b_0) + sum_n E_{x_{n-1} ~ A}[KL(A_n(.|x_{n-1}) || B_n(.|x_{n-1}))]``, an
    ``O(T V^2)`` computation. It is ``+inf`` when ``A`` can produce a sequence ``B`` cannot (e.g.
    Decoding-UNO keeps drafting tokens the target forbids); rows ``A`` never reaches do not count.

    Args:
      model_a: the ``MarkovChain`` ``A`` (e.g. a decoder's ``output_chain``).
      model_b: the ``MarkovChain`` ``B`` (e.g. the target).

    Returns:
      A non-negative scalar (or ``+inf``).
    """
    check_chain("model_a", model_a)
    check_chain("model_b", model_b)
    _checks.check_same_shape(model_a, model_b, ("model_a", "model_b"))
    return _sequence_kl(model_a, model_b)


@jax.jit
def _sequence_kl(model_a, model_b):
    """``sequence_kl`` after its checks, one compiled program."""
    mu = marginals(model_a)[:-1]  # (T, V): law of x_{n-1}
    rows = _kl_rows(model_a.trans, model_b.trans)  # (T, V)
    reached = mu > 0
    # Unreached rows may have an infinite KL: zero them before weighting (0 * inf is NaN).
    weighted = mu * jnp.where(reached, rows, 0)
    return _kl_rows(model_a.init, model_b.init) + jnp.sum(weighted)


# --- single-token trade-off (Section 4) ----------------------------------------------------------


class ParetoFront(NamedTuple):
    """Points ``(P(reject), Loss*_TV)`` of biased acceptance ``b = min(1, (q + eps) / p)``.

    Attributes:
      epsilon: the over-acceptance values swept.
      rejection_probability: ``sum (1 - b) p`` for each ``eps``.
      loss_star: Theorem 4's optimal bias ``Loss*_TV(b)`` for each ``eps``.
      tv: ``TV(p, q)``; Theorem 5 says ``rejection_probability + loss_star == tv``.
    """

    epsilon: jax.Array  # shape=(E,)
    rejection_probability: jax.Array  # shape=(E, ...)
    loss_star: jax.Array  # shape=(E, ...)
    tv: jax.Array  # shape=(...)


def pareto_front(p: jax.Array, q: jax.Array, epsilons) -> ParetoFront:
    """Sweeps ``eps`` and returns the trade-off points of Theorem 5 for one token.

    Args:
      p: ``(..., V)`` draft probabilities.
      q: ``(..., V)`` target probabilities.
      epsilons: ``(E,)`` non-negative over-acceptance values.

    Returns:
      ``ParetoFront``; every point lies on the line ``P(reject) + Loss* = TV(p, q)``.

    References:
      Theorems 4-5; Figure 3.
    """
    p, q = jnp.asarray(p), jnp.asarray(q)
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape, got {p.shape} and {q.shape}")
    _checks.check_probabilities("p", p)
    _checks.check_probabilities("q", q)
    epsilons = jnp.asarray(epsilons, dtype=p.dtype)
    if epsilons.ndim != 1:
        raise ValueError(f"epsilons must be one-dimensional, got shape {epsilons.shape}")
    if _checks.is_concrete(epsilons) and not bool(jnp.all(epsilons >= 0)):
        raise ValueError("epsilons must be non-negative and not NaN")

    def point(eps):
        b = _verify.acceptance_probability(p, q, epsilon=eps)
        return _verify.rejection_probability(p, b), _verify.tv_loss_star(p, q, b)

    reject, loss = jax.vmap(point)(epsilons)
    return ParetoFront(epsilons, reject, loss, _verify.tv_distance(p, q))

