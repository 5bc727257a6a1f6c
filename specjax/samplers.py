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
import jax.numpy as jnp

from specjax import _checks
from specjax import _engine
from specjax import _verify
from specjax._engine import DecodingTrace
from specjax._models import MarkovChain

def _check_model(name: str, model) -> None:
    if not isinstance(model, MarkovChain):
        raise ValueError(f"{name} must be a specjax.MarkovChain, got {type(model).__name__}")
    if model.init.ndim != 1 or model.trans.ndim != 3:
        raise ValueError(
            f"{name} must be a single chain (init (V,), trans (T, V, V)); got init "
            f"{model.init.shape} and trans {model.trans.shape}; vmap the sampler for a batch"
        )


def _check_pair(draft, target, key, num_chains) -> None:
    _checks.check_key(key)
    _check_model("draft", draft)
    _check_model("target", target)
    _checks.check_same_shape(draft, target)
    _checks.check_positive_int("num_chains", num_chains)


def _resolve_lookahead(lookahead, horizon: int) -> int:
    """``None`` means the paper's ``K = T``; larger values behave the same."""
    _checks.check_positive_int("lookahead", lookahead, allow_none=True)
    return horizon if lookahead is None else min(lookahead, horizon)


@functools.partial(jax.jit, static_argnames=("num_chains", "lookahead", "rule"))
def _run(key, draft, target, extra, *, num_chains, lookahead, rule):
    """Builds the law table for ``rule`` and simulates. ``extra`` holds traced rule parameters."""
    p, q = draft.trans, target.trans
    bonus = _verify.bonus_law(q)
    if rule[0] == "autoregressive":
        verify = root = bonus
    elif rule[0] == "speculative":
        verify = root = _verify.speculative_law(p, q)
    elif rule[0] == "batch":
        verify = _verify.speculative_law(p, q)
        root = _verify.batch_root_law(p, q, num_drafts=rule[1])
    elif rule[0] == "general":
        accept_prob_fn, residual_fn = rule[1], rule[2]
        rows = lambda f: jax.vmap(jax.vmap(f))  # noqa: E731 - map a (V,)-row rule over (T, V)
        b = rows(lambda pr, qr: accept_prob_fn(pr, qr, *extra))(p, q)
        res = rows(lambda pr, qr, br: residual_fn(pr, qr, br, *extra))(p, q, b)
        verify = root = _verify.verification_law(p, b, res)
    else:  # pragma: no cover - internal misuse
        raise AssertionError(rule)
    thresholds = _engine.law_table(root, verify, bonus)
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
    _check_model("model", model)
    _checks.check_positive_int("num_chains", num_chains)
    return _run(key, model, model, (), num_chains=num_chains, lookahead=0,
                rule=("autoregressive",))


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
    k = _resolve_lookahead(lookahead, target.horizon)
    return _run(key, draft, target, (), num_chains=num_chains, lookahead=k, rule=("speculative",))


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
    k = _resolve_lookahead(lookahead, target.horizon)
    return _run(key, draft, target, (), num_chains=num_chains, lookahead=k,
                rule=("batch", num_drafts))


def _biased_accept(p, q, epsilon):
    return _verify.acceptance_probability(p, q, epsilon=epsilon)


def _residual_optimal(p, q, b, epsilon):
    del epsilon
    return _verify.optimal_residual(p, q, b)


def _residual_target(p, q, b, epsilon):
    del p, b, epsilon
    return q


def _residual_standard(p, q, b, epsilon):
    del b, epsilon
    return _verify.residual_distribution(q, p)


_BIASED_RESIDUALS = {
    "optimal": _residual_optimal,
    "target": _residual_target,
    "standard": _residual_standard,
}


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
    if residual not in _BIASED_RESIDUALS:
        raise ValueError(
            f"residual must be one of {tuple(_BIASED_RESIDUALS)}, got {residual!r}")
    epsilon = jnp.asarray(epsilon, dtype=target.dtype)
    if epsilon.shape != ():
        raise ValueError(f"epsilon must be a scalar, got shape {epsilon.shape}")
    if _checks.is_concrete(epsilon) and not bool(epsilon >= 0):
        raise ValueError(f"epsilon must be non-negative and not NaN, got {float(epsilon)}")
    k = _resolve_lookahead(lookahead, target.horizon)
    rule = ("general", _biased_accept, _BIASED_RESIDUALS[residual])
    return _run(key, draft, target, (epsilon,), num_chains=num_chains, lookahead=k, rule=rule)


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
    if not callable(accept_prob):
        raise ValueError(f"accept_prob must be a function (p, q) -> b, got {accept_prob!r}")
    if not callable(residual):
        raise ValueError(f"residual must be a function (p, q, b) -> P, got {residual!r}")
    k = _resolve_lookahead(lookahead, target.horizon)
    rule = ("general", _UserAccept(accept_prob), _UserResidual(residual))
    return _run(key, draft, target, (), num_chains=num_chains, lookahead=k, rule=rule)


class _UserAccept:
    """Adapts a user's ``accept_prob(p, q)`` to the internal signature; hashes by the function."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, p, q, *extra):
        return self.fn(p, q)

    def __hash__(self):
        return hash(self.fn)

    def __eq__(self, other):
        return isinstance(other, _UserAccept) and other.fn is self.fn


class _UserResidual(_UserAccept):
    """Adapts a user's ``residual(p, q, b)``."""

    def __call__(self, p, q, b, *extra):
        return self.fn(p, q, b)

    def __eq__(self, other):
        return isinstance(other, _UserResidual) and other.fn is self.fn

    __hash__ = _UserAccept.__hash__
