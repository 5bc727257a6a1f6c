"""Exact quantities of any decoder: ``exact`` and ``accepted_length``, and the conveniences.

Every function here is exact (no sampling), jit-safe, ``vmap``-able over a batch of instances and
differentiable with respect to the draft ``p`` and the target ``q`` (their probabilities, or
logits through ``MarkovChain.from_logits``). They run in float32 by default and in float64 when
``jax_enable_x64`` is on.

``exact`` propagates the law of the state a decoder's sampler simulates through the very same
laws the sampler draws from (the decoder's ``laws`` or ``call_law``), so an exact value and a
Monte Carlo mean of ``decode`` estimate the same number:

* token-wise decoders on ``MarkovChain``s: ``specjax.theory.recursion`` (``O(T V^2)``);
* token-wise decoders on ``FiniteStateModel``s: ``specjax.theory.finite_state``;
* call-level decoders on ``MarkovChain``s: ``specjax.theory.calls``.

On gradients with respect to probabilities: the functions are smooth (piecewise linear) in the
entries of ``init`` and ``trans`` as written, but only directions that keep rows on the simplex
(summing to zero along each row) have a meaning; take gradients through logits
(``MarkovChain.from_logits``) or project them, as ``specjax`` tuning does.

Validation: shapes and settings are checked before any work and raise ``ValueError``;
probability values are checked when the arrays are concrete (a ``MarkovChain`` checks them on
construction) and skipped under a caller's ``jit``/``vmap``/``grad``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from specjax import _checks
from specjax.decoders.base import CallDecoder
from specjax.decoders.planning import plan_run
from specjax.decoders.batch import BatchSpeculative
from specjax.decoders.biased import BiasedSpeculative
from specjax.decoders.rejection import RejectionRule
from specjax.decoders.speculative import Speculative
from specjax.models.markov import MarkovChain
from specjax.numerics import matmul_highest
from specjax.theory import calls
from specjax.theory import recursion
from specjax.theory.finite_state import forward_finite_state
from specjax.theory.recursion import ExactDecoding

__all__ = [
    "accepted_length",
    "batch_expected_rejections",
    "exact",
    "exact_planned",
    "exact_batch_speculative_decoding",
    "exact_biased_speculative_decoding",
    "exact_rejection_decoding",
    "exact_speculative_decoding",
    "expected_calls",
    "expected_rejections",
]


@functools.partial(jax.jit, static_argnames=("lookahead", "stop_tokens"))
def _forward(decoder, draft, target, *, lookahead, stop_tokens=()):
    stop = _checks.stop_mask(stop_tokens, target.num_states, target.init.dtype)
    return recursion.forward(target.init, draft.trans, target.trans, decoder, lookahead, stop)


def exact(decoder, draft, target, *, horizon: int | None = None,
          stop_tokens=None) -> ExactDecoding:
    """Exact per-position statistics of any decoder: the entry point of the theory.

    Args:
      decoder: any decoder value (``specjax.Speculative()``, ``specjax.BatchSpeculative(4)``,
        ``specjax.BlockVerification(3)``, your own).
      draft: the draft model ``p`` (``None`` for ``Autoregressive()``).
      target: the target model ``q``.
      horizon: ``T``, required for ``FiniteStateModel``s sharing one state space (e.g. n-grams
        lifted with ``as_finite_state``); a ``MarkovChain`` carries its own ``T``.
      stop_tokens: ``None``, or end-of-sequence ids (an int or a sequence; static), as for
        ``specjax.decode``: a chain ends at its first stop token among ``x_1..x_T``, and
        nothing after it is rejected, verified or called. Token-wise decoders only.

    Returns:
      ``ExactDecoding``: ``rejected (T, V)`` (``P(x_n = x and drawn after a rejection)``),
      ``new_call (T,)``, ``marginals (T + 1, V)``, ``verified (T,)``, ``emitted (T,)``, and the
      derived ``.expected_rejections`` (the paper's ``E[N_rej]``), ``.expected_calls``,
      ``.expected_length``, ``.rejection_rate`` and ``.acceptance_rate``: the means of
      ``decode``'s counts.

    Raises:
      ValueError: bad models or settings, or a decoder without exact values for the models'
        kind (call-level decoders on ``FiniteStateModel``s) or for stop tokens (call-level
        decoders), before any work.

    Example:
      >>> import specjax
      >>> draft, target = specjax.paper_instance()
      >>> round(float(specjax.exact(specjax.Speculative(), draft, target).expected_rejections), 3)
      22.719

    References:
      Theorems 1 and 3 (``E[N_rej]`` as a sum of per-position rejection masses).
    """
    run = plan_run(decoder, draft, target, engine="exact", horizon=horizon)
    return exact_planned(run, stop_tokens=stop_tokens)


def exact_planned(run, *, stop_tokens=None) -> ExactDecoding:
    """``exact`` of a run already planned (``plan_run(..., engine="exact")``): the entry points
    that plan once and then need the exact values (``serving_rate``) call this."""
    decoder, draft, target, kind, horizon, lookahead = run
    stop_tokens = _checks.check_stop_tokens(stop_tokens, target.num_states)
    if isinstance(decoder, CallDecoder):
        if stop_tokens:
            raise ValueError(
                f"stop_tokens: {type(decoder).__name__} has no exact values with stop tokens "
                f"yet (its call law gives each position's masses, not where a call's path "
                f"stops); token-wise decoders have them, and specjax.decode stops any decoder")
        # The program engine_metrics and decoding_time compile (with the depths and, for a
        # random draft length, the drafted law): one compilation serves the three, and the
        # values are the same (those extra outputs only add sums of the same laws).
        return calls.forward_calls(decoder, draft, target, lookahead=lookahead,
                                   with_depths=True,
                                   with_drafted=decoder.has_drafted_call_law)[0]
    if kind == "finite_state":
        stop = _checks.stop_mask(stop_tokens, target.num_states, target.table.dtype)
        return forward_finite_state(decoder, draft, target, horizon=horizon, lookahead=lookahead,
                                    stop=stop)
    # Checked here as well as when the recursion is traced: a cached compilation skips tracing.
    recursion.check_fits(target.num_states, horizon, lookahead,
                         jnp.dtype(target.trans.dtype).itemsize)
    return _forward(decoder, draft, target, lookahead=lookahead, stop_tokens=stop_tokens)


@functools.partial(jax.jit, static_argnames=("position", "lookahead"))
def _tokenwise_accepted_length(decoder, draft, target, *, position, lookahead):
    horizon = target.horizon
    k = min(lookahead, horizon - position + 1)
    rows = slice(position - 1, position - 1 + k)
    decoder = decoder.bind(draft.trans, target.trans)
    positions = jnp.arange(position - 1, position - 1 + k)[:, None]
    root, verify = decoder.laws_at(positions, draft.trans[rows], target.trans[rows])
    reach = root.accepted[0]
    total = jnp.sum(reach, axis=-1)
    if k == 1:
        return total

    def step(reach, accepted):
        reach = matmul_highest(reach, accepted)
        return reach, jnp.sum(reach, axis=-1)

    _, more = jax.lax.scan(step, reach, verify.accepted[1:])
    return total + jnp.sum(more, axis=0)


def accepted_length(decoder, draft, target, *, position: int = 1) -> jax.Array:
    """Expected number of drafts accepted by a call that starts at ``position``, exactly.

    The quantity engines report as the mean accepted length: a call from position ``n`` after
    ``x_{n-1} = a`` verifies drafts for ``x_n, x_{n+1}, ...`` (at most ``K' = min(K, T - n + 1)``);
    the value counts the accepted ones, not the bonus or correction token.

    Args:
      decoder: any decoder value except ``Autoregressive()`` (which drafts nothing: its value is
        0, returned as such).
      draft: the draft ``MarkovChain`` ``p``.
      target: the target ``MarkovChain`` ``q``.
      position: ``n`` in ``[1, T]``.

    Returns:
      ``(V,)``: one value per previous token ``a``.

    Example:
      >>> import specjax
      >>> draft, target = specjax.paper_instance()
      >>> specjax.accepted_length(specjax.Speculative(lookahead=4), draft, target).shape
      (7,)
    """
    for name, model in (("draft", draft), ("target", target)):
        if not isinstance(model, MarkovChain) and (model is not None or name == "target"):
            raise ValueError(f"{name} must be a MarkovChain for accepted_length (one value per "
                             f"previous token), got {type(model).__name__}")
    decoder, draft, target, kind, horizon, lookahead = plan_run(decoder, draft, target,
                                                                engine="exact")
    _checks.check_position(position, horizon)
    if lookahead == 0:
        return jnp.zeros((target.num_states,), target.dtype)
    if isinstance(decoder, CallDecoder):
        return calls.accepted_length_calls(decoder, draft, target, position=int(position),
                                           lookahead=lookahead)
    return _tokenwise_accepted_length(decoder, draft, target, position=int(position),
                                      lookahead=lookahead)


# --- conveniences: one line each over ``exact`` ------------------------------------------------


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
    return exact(Speculative(lookahead), draft, target, horizon=horizon)


def exact_batch_speculative_decoding(draft: MarkovChain, target: MarkovChain, *, num_drafts,
                                     lookahead: int | None = None,
                                     replacement: bool = True,
                                     horizon: int | None = None) -> ExactDecoding:
    """Exact per-position statistics of batch SD with ``M`` drafts (Algorithm 4, Theorem 3).

    ``.rejected[n - 1]`` is the paper's pseudo-measure ``f`` (equation (ff)) marginalised to the
    last token. The residual chain ``q^{m+1} = [q^m - p]_+`` is carried un-normalised in closed
    form (see ``specjax.decoders.multi_draft.batch_residual_mass``), so values and gradients stay finite when
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
    return exact(BatchSpeculative(num_drafts, replacement=replacement, lookahead=lookahead),
                 draft, target, horizon=horizon)


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
    return exact(BiasedSpeculative(epsilon, residual=residual, lookahead=lookahead), draft,
                 target, horizon=horizon)


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
    return exact(RejectionRule(accept_prob, residual, lookahead=lookahead), draft, target,
                 horizon=horizon)


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
      >>> round(float(specjax.expected_rejections(draft, target)), 3)
      22.719

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
