"""Biased (lossy) speculative decoding (Section 4): over-acceptance ``b = min(1, (q + eps) / p)``
and a choice of residual."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax.decoders import verification
from specjax.decoders.base import TokenwiseDecoder
from specjax.decoders.base import array_field
from specjax.decoders.base import check_lookahead
from specjax.decoders.base import pytree_dataclass


def _residual_optimal(p, q, b):
    return verification.optimal_residual(p, q, b)  # Theorem 4's P* (Decoding-OPT)


def _residual_target(p, q, b):
    del p, b
    return q  # resample from q (Decoding-UNO)


def _residual_standard(p, q, b):
    del b
    return verification.speculative_residual(p, q)  # SD's [q - p]_+


RESIDUALS = {"optimal": _residual_optimal, "target": _residual_target,
             "standard": _residual_standard}


@pytree_dataclass
class BiasedSpeculative(TokenwiseDecoder):
    """Lossy SD with over-acceptance ``b = min(1, (q + eps) / p)``.

    Attributes:
      epsilon: ``eps >= 0``; a pytree leaf, so it may be traced and differentiated (``eps = 0``
        is SD).
      residual: ``"optimal"``: Theorem 4's ``P*`` (normalised ``[q - b p]_+``, Decoding-OPT);
        ``"target"``: resample from ``q`` (Decoding-UNO); ``"standard"``: ``[q - p]_+``.
      lookahead: ``None`` (``K = T``) or ``K``.

    The output law is the biased chain whose transition is ``b p + (1 - sum b p) P`` at each
    position (``specjax.output_chain``).

    References:
      Section 4, Theorems 4-5, Table 1 (Decoding-OPT against Decoding-UNO).
    """

    epsilon: Any = array_field()
    _: dataclasses.KW_ONLY
    residual: str = "optimal"
    lookahead: int | None = None

    def __post_init__(self):
        if self.residual not in RESIDUALS:
            raise ValueError(f"residual must be one of {tuple(RESIDUALS)}, got {self.residual!r}")
        check_lookahead(self.lookahead)

    def validate(self) -> None:
        """Checks ``epsilon`` (a non-negative scalar; its value only when concrete)."""
        epsilon = self.epsilon
        if isinstance(epsilon, (str, bytes, bool)) or not (
                isinstance(epsilon, (int, float, np.number, np.ndarray, jax.Array))
                or isinstance(epsilon, jax.core.Tracer)):
            raise ValueError(f"epsilon must be a number (a float or a 0-d array), got "
                             f"{type(epsilon).__name__} {epsilon!r}")
        if not jnp.issubdtype(jnp.asarray(epsilon).dtype, jnp.number) \
                or jnp.issubdtype(jnp.asarray(epsilon).dtype, jnp.complexfloating):
            raise ValueError(f"epsilon must be a real number, got dtype "
                             f"{jnp.asarray(epsilon).dtype}")
        shape = jnp.shape(self.epsilon)
        if shape != ():
            raise ValueError(f"epsilon must be a scalar, got shape {shape}")
        if _checks.is_concrete(self.epsilon) and not bool(np.asarray(self.epsilon) >= 0):
            raise ValueError(f"epsilon must be non-negative and not NaN, got "
                             f"{float(self.epsilon)}")

    def acceptance(self, p, q):
        """``b = min(1, (q + eps) / p)`` (1 where ``p = 0``)."""
        epsilon = jnp.asarray(self.epsilon, q.dtype)
        return verification.acceptance_probability(p, q, epsilon=epsilon)

    def laws(self, p, q):
        b = self.acceptance(p, q)
        law = verification.verification_law(p, b, RESIDUALS[self.residual](p, q, b))
        return law, law

    @property
    def label(self) -> str:
        eps = self.epsilon if _checks.is_concrete(self.epsilon) else "traced"
        return f"biased SD (eps = {float(eps) if eps != 'traced' else eps}, {self.residual})"
