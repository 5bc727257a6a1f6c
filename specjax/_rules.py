"""Decoding rules: which verification law each decoder applies at the root of a call and inside it.

A *rule* is a small hashable tuple (a static argument of the jitted entry points); ``laws`` turns
it into the two per-position laws (``specjax._verify.VerificationLaw``) that both the Monte Carlo
engine and the exact forward recursion consume:

* ``root``: the law of the first token after a target call (batch SD verifies ``M`` drafts here);
* ``verify``: the law of every later draft verified within the call.

(The third law, the bonus token after ``K`` accepted drafts, is always the target's own row.)
Samplers and exact theory therefore cannot disagree about what a decoder does.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from specjax import _checks
from specjax import _verify

AUTOREGRESSIVE = ("autoregressive",)
SPECULATIVE = ("speculative",)


def batch(num_drafts, replacement: bool = True) -> tuple:
    """Batch SD with ``M`` drafts (``math.inf`` allowed for the exact limit); with
    ``replacement=False`` the drafts' first tokens are drawn without replacement."""
    _verify._check_num_drafts(num_drafts)
    if not isinstance(replacement, bool):
        raise ValueError(f"replacement must be True or False, got {replacement!r}")
    return ("batch", num_drafts) if replacement else ("batch_wor", num_drafts)


def same_root(rule) -> bool:
    """True when the root and in-call laws coincide (every rule but batch SD)."""
    return rule[0] not in ("batch", "batch_wor")


def has_root_scale(rule) -> bool:
    """True for the unbiased rules whose rejected mass is ``[q - S p]_+`` (SD: ``S = 1``; batch
    SD's root with finite ``M``: ``S = S_M``); their accepted mass is ``q - [q - S p]_+``."""
    return rule == SPECULATIVE or (rule[0] == "batch" and rule[1] != math.inf)


def root_scale(rule, p, q):
    """The root's ``S`` as ``(..., 1)`` for a rule with ``has_root_scale(rule)``."""
    if rule == SPECULATIVE:
        return jnp.ones(q.shape[:-1] + (1,), q.dtype)
    return _verify.batch_scale(p, q, rule[1])


def resolve_lookahead(lookahead, horizon: int) -> int:
    """Validates ``lookahead``; ``None`` means the paper's ``K = T``, and larger values act the
    same, so they are clamped to ``T`` (one compilation for all of them)."""
    _checks.check_positive_int("lookahead", lookahead, allow_none=True)
    return horizon if lookahead is None else min(lookahead, horizon)


def laws(rule, p, q, extra=()) -> tuple[_verify.VerificationLaw, _verify.VerificationLaw]:
    """``(root, verify)`` laws of ``rule`` for draft rows ``p`` and target rows ``q`` (..., V)."""
    kind = rule[0]
    if kind == "autoregressive":
        law = _verify.bonus_law(q)
        return law, law
    if kind == "speculative":
        law = _verify.speculative_law(p, q)
        return law, law
    if kind == "batch":
        return _verify.batch_root_law(p, q, rule[1]), _verify.speculative_law(p, q)
    if kind == "batch_wor":
        return (_verify.batch_without_replacement_root_law(p, q, rule[1]),
                _verify.speculative_law(p, q))
    if kind == "general":
        accept_fn, residual_fn = rule[1], rule[2]
        flat_p = p.reshape(-1, p.shape[-1])
        flat_q = q.reshape(-1, q.shape[-1])
        b = jax.vmap(lambda pr, qr: accept_fn(pr, qr, *extra))(flat_p, flat_q)
        res = jax.vmap(lambda pr, qr, br: residual_fn(pr, qr, br, *extra))(flat_p, flat_q, b)
        law = _verify.verification_law(p, b.reshape(p.shape), res.reshape(p.shape))
        return law, law
    raise AssertionError(f"unknown rule {rule!r}")  # pragma: no cover - internal misuse


# --- biased SD (Section 4): b = min(1, (q + eps) / p) and a choice of residual ----------------


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


BIASED_RESIDUALS = {
    "optimal": _residual_optimal,  # Theorem 4's P* (Decoding-OPT)
    "target": _residual_target,  # resample from q (Decoding-UNO)
    "standard": _residual_standard,  # SD's [q - p]_+
}


def biased(epsilon, residual: str, dtype) -> tuple[tuple, tuple]:
    """Validates biased-SD settings; returns ``(rule, extra)`` with ``extra = (epsilon,)``."""
    if residual not in BIASED_RESIDUALS:
        raise ValueError(f"residual must be one of {tuple(BIASED_RESIDUALS)}, got {residual!r}")
    epsilon = jnp.asarray(epsilon, dtype=dtype)
    if epsilon.shape != ():
        raise ValueError(f"epsilon must be a scalar, got shape {epsilon.shape}")
    if _checks.is_concrete(epsilon) and not bool(epsilon >= 0):
        raise ValueError(f"epsilon must be non-negative and not NaN, got {float(epsilon)}")
    return ("general", _biased_accept, BIASED_RESIDUALS[residual]), (epsilon,)


# --- user rules (Algorithm 2) ----------------------------------------------------------------


class _UserAccept:
    """Adapts a user's ``accept_prob(p, q)`` to the internal signature; hashes by the function."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, p, q, *extra):
        return self.fn(p, q)

    def __hash__(self):
        return hash(self.fn)

    def __eq__(self, other):
        return type(other) is type(self) and other.fn is self.fn


class _UserResidual(_UserAccept):
    """Adapts a user's ``residual(p, q, b)``."""

    def __call__(self, p, q, b, *extra):
        return self.fn(p, q, b)

    __hash__ = _UserAccept.__hash__


def general(accept_prob, residual) -> tuple:
    """Validates a user's Algorithm-2 rule; returns the (static, hashable) rule tuple."""
    if not callable(accept_prob):
        raise ValueError(f"accept_prob must be a function (p, q) -> b, got {accept_prob!r}")
    if not callable(residual):
        raise ValueError(f"residual must be a function (p, q, b) -> P, got {residual!r}")
    return ("general", _UserAccept(accept_prob), _UserResidual(residual))
