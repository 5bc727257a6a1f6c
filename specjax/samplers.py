"""Monte Carlo decoders: pure, jit-safe, key first, vectorised over ``num_chains`` chains.

Every sampler builds the per-position law of its verification step from ``specjax._verify`` and
hands it to the shared engine (``specjax._engine.simulate``). Convention: ``p`` (``draft``) is the
draft model and ``q`` (``target``) the target model, as in the paper.

Validation: each entry point checks its arguments (shapes, settings, and, when the arrays are
concrete, probability values) and raises ``ValueError`` before any work starts. Under a caller's
own ``jax.jit``/``vmap`` the value checks cannot run and are skipped; shape checks still run.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
from jax.sharding import NamedSharding

from specjax import _checks
from specjax import _engine
from specjax import _generic
from specjax import _rules
from specjax import _sharding
from specjax import _verify
from specjax._engine import DecodingTrace
from specjax._models import MarkovChain
from specjax._models import check_chain
from specjax._models import check_pair

class Plan(NamedTuple):
    """A validated run: the models, the rule and its static settings (no key)."""

    draft: MarkovChain
    target: MarkovChain
    extra: tuple  # traced rule parameters, e.g. (epsilon,)
    num_chains: int
    lookahead: int
    rule: tuple
    sharding: NamedSharding | None
    horizon: int | None = None  # T for autoregressive models (a MarkovChain carries its own)


def is_markov(plan: Plan) -> bool:
    """True when the plan runs on ``MarkovChain``s (the law-table engine), False for any other
    autoregressive model (``specjax._generic``)."""
    return isinstance(plan.target, MarkovChain)


def _check_models(key, draft, target) -> None:
    _checks.check_key(key)
    if not (isinstance(draft, MarkovChain) or isinstance(target, MarkovChain)):
        _generic.check_models(draft, target)
        return
    other = target if isinstance(draft, MarkovChain) else draft
    if not isinstance(other, MarkovChain) and _generic.is_autoregressive_model(other):
        raise ValueError("draft and target must both be MarkovChains or both other "
                         "autoregressive models (lift a MarkovChain with "
                         "specjax.FiniteStateModel.from_markov_chain)")
    check_pair(draft, target)  # names a non-model argument


def _plan(draft, target, num_chains, rule, lookahead, sharding, extra=(), horizon=None) -> Plan:
    """Checks the run's settings into a plan (the key and models are checked by the caller;
    ``lookahead=None`` is the paper's ``K = T``)."""
    _checks.check_positive_int("num_chains", num_chains)
    if num_chains > 2**32:
        raise ValueError(f"num_chains must be at most 2**32 (chains are numbered with 32 bits), "
                         f"got {num_chains}")
    if isinstance(target, MarkovChain):
        _checks.check_positive_int("horizon", horizon, allow_none=True)
        if horizon is not None and horizon != target.horizon:
            raise ValueError(f"horizon is the chains' own T = {target.horizon} for MarkovChain "
                             f"models; leave it None (got {horizon})")
        horizon = target.horizon
    else:
        if horizon is None:
            raise ValueError("horizon must be given (a positive integer T) for autoregressive "
                             "models other than MarkovChain")
        _checks.check_positive_int("horizon", horizon)
        if sharding is not None:
            raise ValueError("sharding is supported for MarkovChain models only")
    if rule != _rules.AUTOREGRESSIVE:
        lookahead = _rules.resolve_lookahead(lookahead, horizon)
    return Plan(draft, target, extra, num_chains, lookahead, rule,
                _sharding.resolve(sharding, num_chains), horizon)


def law_thresholds(plan: Plan) -> jax.Array:
    """The engine's ``(T, V, 3, W')`` table for ``plan``'s rule (traced; call under ``jit``)."""
    root, verify = _rules.laws(plan.rule, plan.draft.trans, plan.target.trans, plan.extra)
    return _engine.law_table(root, verify, _verify.bonus_law(plan.target.trans))


def replicate(plan: Plan) -> Plan:
    """``plan`` with its arrays on every device of its mesh (no-op without a sharding)."""
    arrays = _sharding.put_replicated((plan.draft, plan.target, plan.extra), plan.sharding)
    return plan._replace(draft=arrays[0], target=arrays[1], extra=arrays[2])


@functools.partial(jax.jit, static_argnames=("num_chains", "lookahead", "rule", "sharding"))
def _run(key, draft, target, extra, *, num_chains, lookahead, rule, sharding):
    plan = Plan(draft, target, extra, num_chains, lookahead, rule, sharding)
    return _engine.simulate(key, target.init, law_thresholds(plan), num_chains, lookahead,
                            sharding=sharding)


def _trace(key, plan: Plan) -> DecodingTrace:
    if not is_markov(plan):
        return _generic.run_models(key, plan.draft, plan.target, plan.num_chains,
                                   horizon=plan.horizon, rule=plan.rule,
                                   lookahead=plan.lookahead, extra=plan.extra)
    plan = replicate(plan)
    return _run(key, plan.draft, plan.target, plan.extra, num_chains=plan.num_chains,
                lookahead=plan.lookahead, rule=plan.rule, sharding=plan.sharding)


def _plan_autoregressive(key, model, num_chains, *, horizon=None, sharding=None) -> Plan:
    _checks.check_key(key)
    if isinstance(model, MarkovChain):
        check_chain("model", model)
    else:
        _generic.check_models(model, model)
    return _plan(model, model, num_chains, _rules.AUTOREGRESSIVE, 0, sharding, horizon=horizon)


def _plan_speculative(key, draft, target, num_chains, *, lookahead=None, horizon=None,
                      sharding=None) -> Plan:
    _check_models(key, draft, target)
    return _plan(draft, target, num_chains, _rules.SPECULATIVE, lookahead, sharding,
                 horizon=horizon)


def _plan_batch(key, draft, target, num_chains, *, num_drafts, lookahead=None,
                replacement=True, horizon=None, sharding=None) -> Plan:
    _check_models(key, draft, target)
    _checks.check_positive_int("num_drafts", num_drafts)
    return _plan(draft, target, num_chains, _rules.batch(num_drafts, replacement), lookahead,
                 sharding, horizon=horizon)


def _plan_biased(key, draft, target, num_chains, *, epsilon, residual="optimal", lookahead=None,
                 horizon=None, sharding=None) -> Plan:
    _check_models(key, draft, target)
    rule, extra = _rules.biased(epsilon, residual, _generic.model_dtype(target))
    return _plan(draft, target, num_chains, rule, lookahead, sharding, extra, horizon=horizon)


def _plan_rejection(key, draft, target, num_chains, *, accept_prob, residual, lookahead=None,
                    horizon=None, sharding=None) -> Plan:
    _check_models(key, draft, target)
    rule = _rules.general(accept_prob, residual)
    return _plan(draft, target, num_chains, rule, lookahead, sharding, horizon=horizon)


def autoregressive_decoding(key, model: MarkovChain, num_chains: int, *, horizon: int | None = None,
                            sharding=None) -> DecodingTrace:
    """Samples ``num_chains`` sequences from ``model`` token by token (Algorithm 3).

    Every position costs one target call and nothing is ever rejected.

    Args:
      key: a JAX PRNG key.
      model: the (target) ``MarkovChain`` ``q``.
      num_chains: ``C``, the number of independent chains.
      horizon: ``T``, required when the models are any other autoregressive models than
        ``MarkovChain`` (``specjax.models``: an ``NGramModel``, a ``FiniteStateModel``, or your
        own model of the protocol); a ``MarkovChain`` carries its own ``T``.
      sharding: ``None`` (the default device), a ``jax.sharding.Mesh`` (chains split over
        all of its devices) or a ``NamedSharding`` of the chain axis
        (``specjax.chain_sharding()``); ``num_chains`` must be a multiple of the number of
        shards. The result equals an unsharded run's with the same key, laid out by chain.
        ``MarkovChain`` models only.

    Returns:
      ``DecodingTrace`` with ``tokens (C, T + 1)``, ``num_calls == T``, ``num_rejections == 0``.

    References:
      Algorithm 3 (Auto-Regressive Model Decoding).
    """
    return _trace(key, _plan_autoregressive(key, model, num_chains, horizon=horizon,
                                            sharding=sharding))


def speculative_decoding(key, draft: MarkovChain, target: MarkovChain, num_chains: int, *,
                         lookahead: int | None = None, horizon: int | None = None,
                         sharding=None) -> DecodingTrace:
    """Speculative decoding (SD): draft from ``p``, verify with ``min(1, q/p)``, resample ``[q - p]_+``.

    Args:
      key: a JAX PRNG key.
      draft: the draft ``MarkovChain`` ``p``.
      target: the target ``MarkovChain`` ``q``; the output law is exactly ``q``'s.
      num_chains: ``C``.
      lookahead: ``None`` for the paper's ``K = T`` (draft to the end, one target call per
        rejection); an int ``K`` for practical SD: each target call verifies up to ``K`` drafts,
        and when all ``K`` are accepted the target's bonus token is appended in the same call.
      horizon: ``T``, required when the models are any other autoregressive models than
        ``MarkovChain`` (``specjax.models``: an ``NGramModel``, a ``FiniteStateModel``, or your
        own model of the protocol); a ``MarkovChain`` carries its own ``T``.
      sharding: ``None`` (the default device), a ``jax.sharding.Mesh`` (chains split over
        all of its devices) or a ``NamedSharding`` of the chain axis
        (``specjax.chain_sharding()``); ``num_chains`` must be a multiple of the number of
        shards. The result equals an unsharded run's with the same key, laid out by chain.
        ``MarkovChain`` models only.

    Returns:
      ``DecodingTrace``. ``num_rejections`` is the paper's ``N_rej`` (Theorem 1).

    References:
      Algorithm 1 (Speculative Decoding); Leviathan et al. 2023 for the bonus token.
    """
    return _trace(key, _plan_speculative(key, draft, target, num_chains, lookahead=lookahead,
                                         horizon=horizon, sharding=sharding))


def batch_speculative_decoding(key, draft: MarkovChain, target: MarkovChain, num_chains: int, *,
                               num_drafts: int, lookahead: int | None = None,
                               replacement: bool = True, horizon: int | None = None,
                               sharding=None) -> DecodingTrace:
    """Batch SD: ``M`` draft sequences per target call, verified depth-first (Algorithm 4).

    At the root of a call, draft ``m`` is verified against the ``m``-th residual ``q^m``
    (``q^1 = q``, ``q^{m+1} = [q^m - p]_+``); the first accepted draft is followed until a
    rejection, which resamples from ``[q - p]_+`` and ends the call. If all ``M`` first tokens are
    rejected the token is drawn from ``q^{M+1}``, as in the appendix proof; the pseudo-code read
    literally (``q^{M+2}``) is biased, which the tests demonstrate.

    Args:
      key: a JAX PRNG key.
      draft: the draft ``MarkovChain`` ``p``.
      target: the target ``MarkovChain`` ``q``.
      num_chains: ``C``.
      num_drafts: ``M >= 1``; ``M = 1`` is SD.
      lookahead: ``None`` (the paper's ``K = T``) or ``K``: after ``K`` accepted tokens of a
        call, the target's bonus token is appended and a new call starts (beyond the paper).
      replacement: ``True`` (the paper: the ``M`` drafts are independent). ``False``: their first
        tokens are drawn without replacement and verified by recursive rejection sampling
        (multi-candidate SD, Yang et al. 2024): draft ``m`` against ``r_m`` with its own law
        ``d_m`` (``p`` without the rejected tokens), ``r_{m+1} = [r_m - d_m]_+``; see
        ``specjax._verify.batch_without_replacement_root_law``. ``M`` is capped at ``V``, and
        the root law enumerates ``V^(M-1)`` draw paths per row.
      horizon: ``T``, required when the models are any other autoregressive models than
        ``MarkovChain`` (``specjax.models``: an ``NGramModel``, a ``FiniteStateModel``, or your
        own model of the protocol); a ``MarkovChain`` carries its own ``T``.
      sharding: ``None`` (the default device), a ``jax.sharding.Mesh`` (chains split over
        all of its devices) or a ``NamedSharding`` of the chain axis
        (``specjax.chain_sharding()``); ``num_chains`` must be a multiple of the number of
        shards. The result equals an unsharded run's with the same key, laid out by chain.
        ``MarkovChain`` models only.

    Returns:
      ``DecodingTrace``; each rejection ends a call (``num_calls = N_rej + 1 - R_T`` for ``K = T``).

    References:
      Algorithm 4 (Batch Speculative Sampling); Theorem 3 and its appendix proof.
    """
    return _trace(key, _plan_batch(key, draft, target, num_chains, num_drafts=num_drafts,
                                   lookahead=lookahead, replacement=replacement,
                                   horizon=horizon, sharding=sharding))


def biased_speculative_decoding(key, draft: MarkovChain, target: MarkovChain, num_chains: int, *,
                                epsilon, residual: str = "optimal",
                                lookahead: int | None = None, horizon: int | None = None,
                                sharding=None) -> DecodingTrace:
    """Lossy SD with over-acceptance ``b = min(1, (q + eps) / p)``.

    Args:
      key: a JAX PRNG key.
      draft: the draft ``MarkovChain`` ``p``.
      target: the target ``MarkovChain`` ``q``.
      num_chains: ``C``.
      epsilon: ``eps >= 0`` (may be a traced scalar; ``eps = 0`` is SD).
      residual: ``"optimal"``: Theorem 4's ``P*`` (normalised ``[q - b p]_+``, Decoding-OPT);
        ``"target"``: resample from ``q`` (Decoding-UNO); ``"standard"``: ``[q - p]_+``.
      lookahead: ``None`` (``K = T``) or ``K`` as in ``speculative_decoding``.
      horizon: ``T``, required when the models are any other autoregressive models than
        ``MarkovChain`` (``specjax.models``: an ``NGramModel``, a ``FiniteStateModel``, or your
        own model of the protocol); a ``MarkovChain`` carries its own ``T``.
      sharding: ``None`` (the default device), a ``jax.sharding.Mesh`` (chains split over
        all of its devices) or a ``NamedSharding`` of the chain axis
        (``specjax.chain_sharding()``); ``num_chains`` must be a multiple of the number of
        shards. The result equals an unsharded run's with the same key, laid out by chain.
        ``MarkovChain`` models only.

    Returns:
      ``DecodingTrace``; the output law is the biased chain whose transition is
      ``b p + (1 - sum b p) P`` at each position.

    References:
      Section 4, Theorems 4-5, Table 1 (Decoding-OPT vs Decoding-UNO).
    """
    return _trace(key, _plan_biased(key, draft, target, num_chains, epsilon=epsilon,
                                    residual=residual, lookahead=lookahead, horizon=horizon,
                                    sharding=sharding))


def rejection_decoding(key, draft: MarkovChain, target: MarkovChain, num_chains: int, *,
                       accept_prob, residual, lookahead: int | None = None,
                       horizon: int | None = None, sharding=None) -> DecodingTrace:
    """The general framework of rejection-based decoding (Algorithm 2) for any rule.

    Args:
      key: a JAX PRNG key.
      draft: the draft ``MarkovChain`` ``p``.
      target: the target ``MarkovChain`` ``q``.
      num_chains: ``C``.
      accept_prob: ``accept_prob(p, q) -> b``, on ``(V,)`` rows, values in ``[0, 1]``.
      residual: ``residual(p, q, b) -> P``, on ``(V,)`` rows; a distribution (it is normalised,
        so an un-normalised ``[q - p]_+`` is fine) wherever rejection has positive probability.
      lookahead: ``None`` (``K = T``) or ``K`` as in ``speculative_decoding``.
      horizon: ``T``, required when the models are any other autoregressive models than
        ``MarkovChain`` (``specjax.models``: an ``NGramModel``, a ``FiniteStateModel``, or your
        own model of the protocol); a ``MarkovChain`` carries its own ``T``.
      sharding: ``None`` (the default device), a ``jax.sharding.Mesh`` (chains split over
        all of its devices) or a ``NamedSharding`` of the chain axis
        (``specjax.chain_sharding()``); ``num_chains`` must be a multiple of the number of
        shards. The result equals an unsharded run's with the same key, laid out by chain.
        ``MarkovChain`` models only.

    Both functions are static arguments of a jitted function: pass the same function objects
    across calls (not a new ``lambda`` each time) to avoid recompiling.

    Returns:
      ``DecodingTrace``. SD is ``accept_prob=lambda p, q: jnp.minimum(1, q / p)`` (for ``p > 0``)
      with ``residual=lambda p, q, b: jnp.maximum(q - p, 0)``.

    References:
      Algorithm 2 (Framework for Rejection-based Decoding); Theorem 2.
    """
    return _trace(key, _plan_rejection(key, draft, target, num_chains, accept_prob=accept_prob,
                                       residual=residual, lookahead=lookahead,
                                       horizon=horizon, sharding=sharding))


#: The planning function behind each public sampler, for ``specjax.decoding_statistics``.
PLANS = {
    autoregressive_decoding: _plan_autoregressive,
    speculative_decoding: _plan_speculative,
    batch_speculative_decoding: _plan_batch,
    biased_speculative_decoding: _plan_biased,
    rejection_decoding: _plan_rejection,
}
