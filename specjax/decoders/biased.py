"""Biased (lossy) speculative decoding (Section 4): over-acceptance ``b = min(1, (q + eps) / p)``
and a choice of residual."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from specjax import _checks
from specjax.decoders import verification
from specjax.decoders.base import TokenwiseDecoder
from specjax.decoders.base import array_field
from specjax.decoders.base import check_lookahead
from specjax.decoders.base import pytree_dataclass

__all__ = ["BiasedSpeculative", "RESIDUALS"]


#: The residuals biased SD accepts (``verification.RESIDUALS`` has ``"argmax"`` too).
RESIDUALS = {name: verification.RESIDUALS[name] for name in ("optimal", "target", "standard")}


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

    lossless = False

    epsilon: Any = array_field()
    _: dataclasses.KW_ONLY
    residual: str = "optimal"
    lookahead: int | None = None

    @classmethod
    def example_cases(cls) -> dict:
        return {"biased eps=0.1 UNO K=4": cls(0.1, residual="target", lookahead=4)}

    def __post_init__(self):
        verification.check_residual_name(self.residual, tuple(RESIDUALS))
        check_lookahead(self.lookahead)

    def validate(self) -> None:
        """Checks ``epsilon`` (a non-negative scalar; its value only when concrete)."""
        _checks.check_scalar_leaf("epsilon", self.epsilon)

    @property
    def over_acceptance(self):
        """``epsilon``: the acceptance is ``min(1, (q + eps) / p)``."""
        return self.epsilon

    def acceptance(self, p, q):
        """``b = min(1, (q + eps) / p)`` (1 where ``p = 0``)."""
        epsilon = jnp.asarray(self.epsilon, q.dtype)
        return verification.acceptance_probability(p, q, epsilon=epsilon)

    def laws(self, p, q):
        law = verification.named_residual_law(p, q, self.acceptance(p, q), self.residual)
        return law, law

    @property
    def label(self) -> str:
        eps = self.epsilon if _checks.is_concrete(self.epsilon) else "traced"
        return f"biased SD (eps = {float(eps) if eps != 'traced' else eps}, {self.residual})"
