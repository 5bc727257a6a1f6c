"""Any rule of the paper's general framework (Algorithm 2): a user's acceptance probabilities and
residual distribution."""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks

from specjax.decoders import verification
from specjax.decoders.base import TokenwiseDecoder
from specjax.decoders.base import check_lookahead
from specjax.decoders.base import pytree_dataclass
from specjax.models.checks import probs_at
from specjax.models.checks import update_at

__all__ = ["MAX_PROBE_ROWS", "RejectionRule", "sd_accept", "sd_residual"]


def sd_accept(p, q):
    """SD's acceptance ``min(1, q / p)`` written as a user's ``accept_prob`` (1 where ``p = 0``):
    with ``sd_residual``, ``RejectionRule``'s example case."""
    return jnp.where(p > 0, jnp.minimum(1.0, q / jnp.where(p > 0, p, 1.0)), 1.0)


def sd_residual(p, q, b):
    """SD's residual ``[q - p]_+`` written as a user's ``residual`` (un-normalised)."""
    return jnp.maximum(q - p, 0.0)


@pytree_dataclass
class RejectionRule(TokenwiseDecoder):
    """A rule of rejection-based decoding (Algorithm 2), given by two functions on ``(V,)`` rows.

    Attributes:
      accept_prob: ``accept_prob(p, q) -> b``, values in ``[0, 1]``.
      residual: ``residual(p, q, b) -> P``; a distribution (normalised here, so an un-normalised
        ``[q - p]_+`` is fine) wherever rejection has positive probability.
      lookahead: ``None`` (``K = T``) or ``K``.

    Both functions are static settings, compared by identity: reuse the same function objects
    across calls (not a new ``lambda`` each time) to avoid recompiling.

    Example:
      >>> import jax.numpy as jnp, specjax
      >>> sd = specjax.RejectionRule(
      ...     lambda p, q: jnp.minimum(1, q / jnp.where(p > 0, p, 1)),
      ...     lambda p, q, b: jnp.maximum(q - p, 0))
      >>> draft, target = specjax.paper_instance()
      >>> round(float(specjax.exact(sd, draft, target).expected_rejections), 3)
      22.719

    References:
      Algorithm 2 (Framework for Rejection-based Decoding); Theorem 2.
    """

    #: A user's functions may be lossy (audits test biased rules): only the rows can tell.
    lossless = None

    accept_prob: Callable
    residual: Callable
    _: dataclasses.KW_ONLY
    lookahead: int | None = None

    @classmethod
    def example_cases(cls) -> dict:
        return {"rejection": cls(sd_accept, sd_residual)}

    def __post_init__(self):
        if not callable(self.accept_prob):
            raise ValueError(f"accept_prob must be a function (p, q) -> b, got "
                             f"{self.accept_prob!r}")
        if not callable(self.residual):
            raise ValueError(f"residual must be a function (p, q, b) -> P, got {self.residual!r}")
        check_lookahead(self.lookahead)

    def acceptance(self, p, q):
        flat_p, flat_q = p.reshape(-1, p.shape[-1]), q.reshape(-1, q.shape[-1])
        return jax.vmap(self.accept_prob)(flat_p, flat_q).reshape(p.shape)

    def laws(self, p, q):
        b = self.acceptance(p, q)
        flat = [x.reshape(-1, x.shape[-1]) for x in (p, q, b)]
        res = jax.vmap(self.residual)(*flat).reshape(p.shape)
        # b matters only where the draft can propose the token: a rule's 0/0 or inf at p = 0
        # (e.g. min(1, q / p)) must not turn the accepted mass b p into NaN.
        b = jnp.where(p > 0, b, jnp.zeros_like(b))
        law = verification.verification_law(p, b, res)
        return law, law

    def probe(self, draft, target, kind: str) -> None:
        """Runs both functions on the models' rows (every row of a ``MarkovChain`` or a
        ``FiniteStateModel``, up to ``MAX_PROBE_ROWS`` evenly spaced; a protocol model's rows at
        a few states) and raises ``ValueError`` unless ``accept_prob`` is in ``[0, 1]`` wherever
        the draft has mass and ``residual`` is finite, non-negative, and has mass wherever
        rejection has positive probability."""
        p, q = _probe_rows(draft, target, kind)
        try:
            b, res, rejection = _evaluate_rule(self, p, q)
        except Exception as error:  # a user's functions: name them
            raise ValueError(
                f"accept_prob(p, q) and residual(p, q, b) must take (V,) rows and return (V,) "
                f"rows; evaluating them on the models' rows failed: {error}") from error
        b, res, rejection, p = (np.asarray(x, np.float64) for x in (b, res, rejection, p))
        tol = _checks.acceptance_tolerance(jnp.asarray(q).dtype)
        drafted = p > 0
        bad_b = drafted & ~((b >= -tol) & (b <= 1 + tol))
        if bad_b.any():
            row = int(np.argmax(bad_b.any(axis=-1)))
            values = b[row][bad_b[row]]
            raise ValueError(
                f"accept_prob must return probabilities in [0, 1] where the draft has mass; on "
                f"row {row} of the probed (p, q) rows it returned {values[:4].tolist()} (NaN or "
                f"out of range). Clip it, e.g. jnp.clip(b, 0, 1), or fix the division at p = 0")
        bad_res = ~np.isfinite(res) | (res < -tol)
        if bad_res.any():
            row = int(np.argmax(bad_res.any(axis=-1)))
            raise ValueError(
                f"residual must return a distribution (finite, non-negative masses); on row "
                f"{row} of the probed (p, q) rows it returned {res[row][bad_res[row]][:4].tolist()}")
        empty = (rejection > tol) & ~(np.maximum(res, 0).sum(axis=-1) > 0)
        if empty.any():
            row = int(np.argmax(empty))
            raise ValueError(
                f"residual must have mass wherever rejection can happen: on row {row} of the "
                f"probed (p, q) rows the rejection probability is {rejection[row]:.4g} but the "
                f"residual is all zeros, so the rejected mass would vanish (the output would not "
                f"sum to one)")
        super().probe(draft, target, kind)  # its laws, as every token-wise decoder's

    @property
    def label(self) -> str:
        name = getattr(self.accept_prob, "__name__", "rule")
        return f"rejection rule ({name})"


#: The most (p, q) row pairs ``RejectionRule.probe`` evaluates (evenly spaced beyond it).
MAX_PROBE_ROWS = 2**14


def _probe_rows(draft, target, kind: str):
    """``(p, q)`` row pairs ``(R, V)`` of the same contexts, at most ``MAX_PROBE_ROWS``."""
    if kind == "markov":
        p, q = draft.trans, target.trans
    elif kind == "finite_state":
        p, q = draft.table, target.table
    else:  # protocol models: the rows at the initial state and after one token
        num_states = target.num_states
        probs, update = probs_at, update_at
        pairs = []
        for token in (None, 0, num_states - 1):
            states = [m.init_state() for m in (draft, target)]
            if token is not None:
                states = [update(m, s, jnp.asarray(token, jnp.int32))
                          for m, s in zip((draft, target), states)]
            pairs.append([probs(m, s) for m, s in zip((draft, target), states)])
        p, q = (jnp.stack(rows) for rows in zip(*pairs))
    p, q = p.reshape(-1, p.shape[-1]), q.reshape(-1, q.shape[-1])
    if p.shape[0] > MAX_PROBE_ROWS:
        index = np.linspace(0, p.shape[0] - 1, MAX_PROBE_ROWS).astype(np.int64)
        p, q = p[index], q[index]
    return p, q


@jax.jit
def _evaluate_rule(rule, p, q):
    """``(b, residual, rejection probability)`` of a rule on ``(R, V)`` rows."""
    b = rule.acceptance(p, q)
    res = jax.vmap(rule.residual)(p, q, b)
    rejection = 1 - jnp.sum(jnp.where(p > 0, b * p, 0), axis=-1)
    return b, res, rejection
