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

import jax

from specjax import _checks
from specjax import _engine
from specjax import _rules
from specjax import _verify
from specjax._engine import DecodingTrace
from specjax._models import MarkovChain
from specjax._models import check_chain
from specjax._models import check_pair

def _check_pair(draft, target, key, num_chains) -> None:
    _checks.check_key(key)
    check_pair(draft, target)
    _checks.check_positive_int("num_chains", num_chains)


@functools.partial(jax.jit, static_argnames=("num_chains", "lookahead", "rule"))
def _run(key, draft, target, extra, *, num_chains, lookahead, rule):
    """Builds the law table for ``rule`` and simulates. ``extra`` holds traced rule parameters."""
    root, verify = _rules.laws(rule, draft.trans, target.trans, extra)
    thresholds = _engine.law_table(root, verify, _verify.bonus_law(target.trans))
    return _engine.simulate(key, target.init, thresholds, num_chains, lookahead)


def autoregressive_decoding(key, model: MarkovChain, num_chains: int) -> DecodingTrace:
    """Samples ``num_chains`` sequences from ``model`` token by token (Algorithm 3).

    Every position costs one target call and nothing is ever rejected.

    Args:
      key: a JAX PRNG key.
      model: the (target) ``MarkovChain`` ``q``.
      num_chains: ``C``, the number of independent chains.

    Returns:
      ``DecodingTrace`` with ``tokens (C, T + 1)``, ``num_calls == T``, ``num_rejections == 0``.

    References:
      Algorithm 3 (Auto-Regressive Model Decoding).
    """
    _checks.check_key(key)
    check_chain("model", model)
    _checks.check_positive_int("num_chains", num_chains)
    return _run(key, model, model, (), num_chains=num_chains, lookahead=0,
                rule=_rules.AUTOREGRESSIVE)


def speculative_decoding(key, draft: MarkovChain, target: MarkovChain, num_chains: int, *,
                         lookahead: int | None = None) -> DecodingTrace:
    """Speculative decoding (SD): draft from ``p``, verify with ``min(1, q/p)``, resample ``[q - p]_+``.

    Args:
      key: a JAX PRNG key.
      draft: the draft ``MarkovChain`` ``p``.
      target: the target ``MarkovChain`` ``q``; the output law is exactly ``q``'s.
      num_chains: ``C``.
      lookahead: ``None`` for the paper's ``K = T`` (draft to the end, one target call per
        rejection); an int ``K`` for practical SD: each target call verifies up to ``K`` drafts,
        and when all ``K`` are accepted the target's bonus token is appended in the same call.

    Returns:
      ``DecodingTrace``. ``num_rejections`` is the paper's ``N_rej`` (Theorem 1).

    References:
      Algorithm 1 (Speculative Decoding); Leviathan et al. 2023 for the bonus token.
    """
    _check_pair(draft, target, key, num_chains)
    k = _rules.resolve_lookahead(lookahead, target.horizon)
    return _run(key, draft, target, (), num_chains=num_chains, lookahead=k, rule=_rules.SPECULATIVE)


def batch_speculative_decoding(key, draft: MarkovChain, target: MarkovChain, num_chains: int, *,
                               num_drafts: int, lookahead: int | None = None) -> DecodingTrace:
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

    Returns:
      ``DecodingTrace``; each rejection ends a call (``num_calls = N_rej + 1 - R_T`` for ``K = T``).

    References:
      Algorithm 4 (Batch Speculative Sampling); Theorem 3 and its appendix proof.
    """
    _check_pair(draft, target, key, num_chains)
    _checks.check_positive_int("num_drafts", num_drafts)
    k = _rules.resolve_lookahead(lookahead, target.horizon)
    return _run(key, draft, target, (), num_chains=num_chains, lookahead=k,
                rule=_rules.batch(num_drafts))


def biased_speculative_decoding(key, draft: MarkovChain, target: MarkovChain, num_chains: int, *,
                                epsilon, residual: str = "optimal",
                                lookahead: int | None = None) -> DecodingTrace:
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

    Returns:
      ``DecodingTrace``; the output law is the biased chain whose transition is
      ``b p + (1 - sum b p) P`` at each position.

    References:
      Section 4, Theorems 4-5, Table 1 (Decoding-OPT vs Decoding-UNO).
    """
    _check_pair(draft, target, key, num_chains)
    rule, extra = _rules.biased(epsilon, residual, target.dtype)
    k = _rules.resolve_lookahead(lookahead, target.horizon)
    return _run(key, draft, target, extra, num_chains=num_chains, lookahead=k, rule=rule)


def rejection_decoding(key, draft: MarkovChain, target: MarkovChain, num_chains: int, *,
                       accept_prob, residual, lookahead: int | None = None) -> DecodingTrace:
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

    Both functions are static arguments of a jitted function: pass the same function objects
    across calls (not a new ``lambda`` each time) to avoid recompiling.

    Returns:
      ``DecodingTrace``. SD is ``accept_prob=lambda p, q: jnp.minimum(1, q / p)`` (for ``p > 0``)
      with ``residual=lambda p, q, b: jnp.maximum(q - p, 0)``.

    References:
      Algorithm 2 (Framework for Rejection-based Decoding); Theorem 2.
    """
    _check_pair(draft, target, key, num_chains)
    rule = _rules.general(accept_prob, residual)
    k = _rules.resolve_lookahead(lookahead, target.horizon)
    return _run(key, draft, target, (), num_chains=num_chains, lookahead=k, rule=rule)
