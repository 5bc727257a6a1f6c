"""Exact quantities of the theory for Markov-chain drafts and targets, differentiable in both.

Every function here is exact (no sampling), jit-safe, ``vmap``-able over a batch of instances and
differentiable with respect to the draft ``p`` and the target ``q`` (their probabilities, or
logits through ``MarkovChain.from_logits``). They run in float32 by default and in float64 when
``jax_enable_x64`` is on.

The decoders are the samplers' own: ``exact_*`` functions propagate the law of the state the
samplers simulate through the very same per-position laws (``specjax._rules``), so an exact value
and a Monte Carlo mean of the matching sampler estimate the same number.

On gradients with respect to probabilities: the functions are smooth (piecewise linear) in the
entries of ``init`` and ``trans`` as written, but only directions that keep rows on the simplex
(summing to zero along each row) have a meaning; take gradients through logits
(``MarkovChain.from_logits``) or project them, as ``specjax`` tuning does.

Validation: as for the samplers, shapes and settings are checked before any work and raise
``ValueError``; probability values are checked when the arrays are concrete (a ``MarkovChain``
checks them on construction) and skipped under a caller's ``jit``/``vmap``/``grad``.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from specjax import _checks
from specjax import _exact
from specjax import _generic
from specjax import _rules
from specjax import _verify
from specjax._exact import ExactDecoding
from specjax._models import MarkovChain
from specjax._models import check_chain
from specjax._models import check_pair
from specjax.models import FiniteStateModel


@functools.partial(jax.jit, static_argnames=("rule", "lookahead"))
def _forward(draft, target, extra, *, rule, lookahead):
    return _exact.forward(target.init, draft.trans, target.trans, rule, extra, lookahead)


def _check_exact_models(draft, target, horizon) -> int:
    """Validates the models of an exact function and returns ``T``: two ``MarkovChain``s (their
    own ``T``), or two ``FiniteStateModel``s on one state space with ``horizon`` given."""
    if isinstance(draft, MarkovChain) or isinstance(target, MarkovChain):
        check_pair(draft, target)
        _checks.check_positive_int("horizon", horizon, allow_none=True)
        if horizon is not None and horizon != target.horizon:
            raise ValueError(f"horizon is the chains' own T = {target.horizon} for MarkovChain "
                             f"models; leave it None (got {horizon})")
        return target.horizon
    if not (isinstance(draft, FiniteStateModel) and isinstance(target, FiniteStateModel)):
        raise ValueError(
            "draft and target must both be MarkovChains, or both FiniteStateModels on one state "
            "space (exact quantities need a finite state space: lift n-grams with "
            f"as_finite_state), got {type(draft).__name__} and {type(target).__name__}")
    _generic.check_shared_states(draft, target)
    if horizon is None:
        raise ValueError("horizon must be given (a positive integer T) for finite-state models")
    _checks.check_positive_int("horizon", horizon)
    return horizon


def _run_exact(draft, target, rule, lookahead, horizon: int, extra=()) -> ExactDecoding:
    """Dispatches checked models: the ``(token, phase)`` recursion for ``MarkovChain``s, the
    ``(state, phase)`` recursion of ``specjax._generic`` for ``FiniteStateModel``s."""
    if isinstance(target, MarkovChain):
        k = _rules.resolve_lookahead(lookahead, horizon)
        return _forward(draft, target, extra, rule=rule, lookahead=k)
    return _generic.run_exact(draft, target, horizon=horizon, rule=rule, lookahead=lookahead,
                              extra=extra)


def _exact_decoding(draft, target, rule, lookahead, horizon, extra=()) -> ExactDecoding:
    return _run_exact(draft, target, rule, lookahead, _check_exact_models(draft, target, horizon),
                      extra)


def exact_speculative_decoding(draft: MarkovChain, target: MarkovChain, *,
                               lookahead: int | None = None,
                               horizon: int | None = None) -> ExactDecoding:
    """Exact per-position statistics of speculative decoding (Algorithm 1).

    With ``lookahead=None`` (the paper's ``K = T``) the expected rejections are Theorem 1's
    ``sum_n E_{x_{n-1} ~ q}[TV(p_n(.|x_{n-1}), q_n(.|x_{n-1}))]``. With an int ``K``, a target
    call verifies up to ``K`` drafts and appends its bonus token when all are accepted (beyond the
    paper); calls and rejections are then those of ``speculative_decoding(..., lookahead=K)``.

    Args:
      draft: the draft ``MarkovChain`` ``p``.
      target: the target ``MarkovChain`` ``q``.
      lookahead: ``None`` or a positive int ``K``.
      horizon: ``T``, required when the models are ``specjax.models.FiniteStateModel``s
        sharing one state space (e.g. n-grams lifted with ``as_finite_state``); a
        ``MarkovChain`` carries its own ``T``.

    Returns:
      ``ExactDecoding`` (``.expected_rejections``, ``.expected_calls``, ``.rejection_rate``,
      ``.rejected`` ``(T, V)``, ``.new_call`` ``(T,)``, ``.marginals`` ``(T + 1, V)``).

    References:
      Theorem 1; Leviathan et al. 2023 for the bonus token.
    """
    return _exact_decoding(draft, target, _rules.SPECULATIVE, lookahead, horizon)


def exact_batch_speculative_decoding(draft: MarkovChain, target: MarkovChain, *, num_drafts,
                                     lookahead: int | None = None,
                                     replacement: bool = True,
                                     horizon: int | None = None) -> ExactDecoding:
    """Exact per-position statistics of batch SD with ``M`` drafts (Algorithm 4, Theorem 3).

    ``.rejected[n - 1]`` is the paper's pseudo-measure ``f`` (equation (ff)) marginalised to the
    last token. The residual chain ``q^{m+1} = [q^m - p]_+`` is carried un-normalised in closed
    form (see ``specjax._verify.batch_residual_mass``), so values and gradients stay finite when
    a residual runs out of mass.

    Args:
      draft: the draft ``MarkovChain`` ``p``.
      target: the target ``MarkovChain`` ``q``.
      num_drafts: ``M >= 1``, or ``math.inf`` for the limit ``M -> infinity`` (Proposition
        "increasing batch size doesn't help").
      lookahead: ``None`` (``K = T``) or ``K``, as in ``batch_speculative_decoding``.
      replacement: ``False`` for drafts drawn without replacement, as in
        ``batch_speculative_decoding`` (``math.inf`` then means ``M = V``).
      horizon: ``T``, required when the models are ``specjax.models.FiniteStateModel``s
        sharing one state space (e.g. n-grams lifted with ``as_finite_state``); a
        ``MarkovChain`` carries its own ``T``.

    Returns:
      ``ExactDecoding``.

    References:
      Theorem 3 and its appendix proof; Proposition (appendix) on ``M -> infinity``; Yang et al.
      2024 for drafts without replacement.
    """
    return _exact_decoding(draft, target, _rules.batch(num_drafts, replacement), lookahead,
                           horizon)


def exact_biased_speculative_decoding(draft: MarkovChain, target: MarkovChain, *, epsilon,
                                      residual: str = "optimal",
                                      lookahead: int | None = None,
                                      horizon: int | None = None) -> ExactDecoding:
    """Exact statistics of biased SD, ``b = min(1, (q + eps) / p)`` (Section 4).

    Args:
      draft: the draft ``MarkovChain`` ``p``.
      target: the target ``MarkovChain`` ``q``.
      epsilon: ``eps >= 0`` (may be traced; differentiable).
      residual: ``"optimal"`` (Theorem 4's ``P*``, Decoding-OPT), ``"target"`` (Decoding-UNO)
        or ``"standard"`` (``[q - p]_+``).
      lookahead: ``None`` or ``K``.
      horizon: ``T``, required when the models are ``specjax.models.FiniteStateModel``s
        sharing one state space (e.g. n-grams lifted with ``as_finite_state``); a
        ``MarkovChain`` carries its own ``T``.

    Returns:
      ``ExactDecoding``; ``.marginals`` is the biased decoder's own law of ``x_n``.

    References:
      Theorems 4-5; Table 1.
    """
    horizon = _check_exact_models(draft, target, horizon)  # before reading the models' dtype
    rule, extra = _rules.biased(epsilon, residual, _generic.model_dtype(target))
    return _run_exact(draft, target, rule, lookahead, horizon, extra)


def exact_rejection_decoding(draft: MarkovChain, target: MarkovChain, *, accept_prob, residual,
                             lookahead: int | None = None,
                             horizon: int | None = None) -> ExactDecoding:
    """Exact statistics of any instance of the framework (Algorithm 2, Theorem 2).

    Use it to check a rule numerically: an unbiased rule has ``.marginals`` equal to the
    target's (and ``output_chain`` equal to the target chain), and by Theorem 2 no unbiased rule
    has fewer ``.expected_rejections`` than ``exact_speculative_decoding``.

    Args:
      draft: the draft ``MarkovChain`` ``p``.
      target: the target ``MarkovChain`` ``q``.
      accept_prob: ``accept_prob(p, q) -> b`` on ``(V,)`` rows.
      residual: ``residual(p, q, b) -> P`` on ``(V,)`` rows (normalised here).
      lookahead: ``None`` or ``K``.
      horizon: ``T``, required when the models are ``specjax.models.FiniteStateModel``s
        sharing one state space (e.g. n-grams lifted with ``as_finite_state``); a
        ``MarkovChain`` carries its own ``T``.

    Both functions are static (hashed by identity): reuse the same objects to avoid recompiling.

    Returns:
      ``ExactDecoding``.

    References:
      Algorithm 2; Theorem 2 (instance-dependent rejection lower bound).
    """
    return _exact_decoding(draft, target, _rules.general(accept_prob, residual), lookahead,
                           horizon)


def expected_rejections(draft: MarkovChain, target: MarkovChain, *,
                        lookahead: int | None = None, horizon: int | None = None) -> jax.Array:
    """``E[N_rej]`` of speculative decoding: Theorem 1 (``lookahead=None``) or lookahead ``K``.

    Args:
      draft: the draft ``MarkovChain`` ``p``.
      target: the target ``MarkovChain`` ``q``.
      lookahead: ``None`` (``K = T``, the paper) or a positive int ``K``.
      horizon: ``T``, required when the models are ``specjax.models.FiniteStateModel``s
        sharing one state space (e.g. n-grams lifted with ``as_finite_state``); a
        ``MarkovChain`` carries its own ``T``.

    Returns:
      A scalar. ``T / expected_rejections`` is the paper's acceleration rate (for ``K = T``).

    Example:
      >>> import specjax
      >>> draft, target = specjax.paper_instance()
      >>> float(specjax.expected_rejections(draft, target))  # doctest: +ELLIPSIS
      22.7...

    References:
      Theorem 1.
    """
    return exact_speculative_decoding(draft, target, lookahead=lookahead,
                                      horizon=horizon).expected_rejections


def expected_calls(draft: MarkovChain, target: MarkovChain, *,
                   lookahead: int | None = None, horizon: int | None = None) -> jax.Array:
    """Expected number of target calls of speculative decoding with lookahead ``K``.

    A call starts at the first position, after every rejection, and after every bonus token.
    When every draft is accepted with the same probability ``alpha`` regardless of context, the
    expected tokens per call tends to ``(1 - alpha^{K+1}) / (1 - alpha)`` (Leviathan et al.).

    Args:
      draft: the draft ``MarkovChain`` ``p``.
      target: the target ``MarkovChain`` ``q``.
      lookahead: ``None`` (``K = T``) or a positive int ``K``.
      horizon: ``T``, required when the models are ``specjax.models.FiniteStateModel``s
        sharing one state space (e.g. n-grams lifted with ``as_finite_state``); a
        ``MarkovChain`` carries its own ``T``.

    Returns:
      A scalar.
    """
    return exact_speculative_decoding(draft, target, lookahead=lookahead,
                                      horizon=horizon).expected_calls


def batch_expected_rejections(draft: MarkovChain, target: MarkovChain, *, num_drafts,
                              lookahead: int | None = None,
                              replacement: bool = True,
                              horizon: int | None = None) -> jax.Array:
    """``E[N_rej]`` of batch SD with ``M`` drafts (Theorem 3); ``M = 1`` is Theorem 1.

    Args:
      draft: the draft ``MarkovChain`` ``p``.
      target: the target ``MarkovChain`` ``q``.
      num_drafts: ``M >= 1`` or ``math.inf`` (the limit; it stays positive whenever ``p != q``).
      lookahead: ``None`` (``K = T``) or ``K``.
      replacement: ``False`` for drafts drawn without replacement.
      horizon: ``T``, required when the models are ``specjax.models.FiniteStateModel``s
        sharing one state space (e.g. n-grams lifted with ``as_finite_state``); a
        ``MarkovChain`` carries its own ``T``.

    Returns:
      A scalar.

    References:
      Theorem 3; Proposition "increasing batch size doesn't help".
    """
    return exact_batch_speculative_decoding(
        draft, target, num_drafts=num_drafts, lookahead=lookahead,
        replacement=replacement, horizon=horizon).expected_rejections


# --- whole-sequence laws -----------------------------------------------------------------------


def marginals(model: MarkovChain) -> jax.Array:
    """The law of ``x_n`` for ``n = 0..T`` under ``model``: ``(T + 1, V)``."""
    check_chain("model", model)

    def step(mu, trans_n):
        mu = jnp.dot(mu, trans_n, precision=jax.lax.Precision.HIGHEST)
        return mu, mu

    _, mus = jax.lax.scan(step, model.init, model.trans)
    return jnp.concatenate([model.init[None], mus])


def _output_chain(draft, target, rule, extra) -> MarkovChain:
    law, _ = _rules.laws(rule, draft.trans, target.trans, extra)
    trans = law.accepted + law.rejected
    if _checks.is_concrete(trans):
        _checks.check_probabilities(
            "the decoder's output transitions (does residual(p, q, b) have mass wherever "
            "rejection is possible?)", trans)
    return MarkovChain.tree_unflatten(None, (target.init, trans))


def output_chain(draft: MarkovChain, target: MarkovChain, *, accept_prob,
                 residual) -> MarkovChain:
    """The exact law of the sequences a rule of Algorithm 2 outputs, as a ``MarkovChain``.

    For Markov drafts and targets and ``K = T`` (the paper's setting), the decoder's output is
    itself a Markov chain with transition ``b p + (1 - sum b p) P`` at each position. (With a
    finite lookahead the bonus token makes the output law depend on the hidden phase, so it is not
    a Markov chain in the tokens; use ``exact_rejection_decoding(...).marginals`` there.)

    Args:
      draft: the draft ``MarkovChain`` ``p``.
      target: the target ``MarkovChain`` ``q``.
      accept_prob: ``accept_prob(p, q) -> b`` on ``(V,)`` rows.
      residual: ``residual(p, q, b) -> P`` on ``(V,)`` rows.

    Returns:
      A ``MarkovChain``; equal to ``target`` exactly when the rule is unbiased.

    References:
      Algorithm 2; Theorem 4 (the output law ``P^A``).
    """
    check_pair(draft, target)
    return _output_chain(draft, target, _rules.general(accept_prob, residual), ())


def biased_output_chain(draft: MarkovChain, target: MarkovChain, *, epsilon,
                        residual: str = "optimal") -> MarkovChain:
    """The exact output law of biased SD (``K = T``) as a ``MarkovChain``; see ``output_chain``.

    ``sequence_kl(biased_output_chain(p, q, epsilon=e), q)`` is the whole-sequence KL divergence
    of Decoding-OPT (``residual="optimal"``) or Decoding-UNO (``residual="target"``) from the
    target.
    """
    check_pair(draft, target)
    rule, extra = _rules.biased(epsilon, residual, target.dtype)
    return _output_chain(draft, target, rule, extra)


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
    _checks.check_same_shape(model_a, model_b)
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

