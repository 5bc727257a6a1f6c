"""Lenient speculative decoding (Leviathan et al. 2023; DistillSpec): accept with
``min(1, q / (l p))``, more often than SD for a lenience ``l < 1``. Lossy."""

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
from specjax.numerics import safe_ratio

__all__ = ["LenientSpeculative"]


@pytree_dataclass
class LenientSpeculative(TokenwiseDecoder):
    """SD with a lenient acceptance ``b = min(1, q / (l p))`` (1 where ``p = 0``).

    ``l = 1`` is SD; smaller ``l`` accepts more and biases the output towards the draft. Written
    as ``b = min(1, f(q) / p)`` with ``f(q) = q / l``, the form DistillSpec studies.

    Attributes:
      lenience: ``l`` in ``(0, 1]``; a pytree leaf (traced and differentiated).
      residual: after a rejection: ``"standard"`` (``[q - p]_+``, what an engine that changes
        only the acceptance test keeps), ``"optimal"`` (Theorem 4's ``P*`` for this acceptance),
        ``"target"`` or ``"argmax"``.
      lookahead: ``None`` (``K = T``) or ``K``.

    References:
      Leviathan et al. (2023), lenience; Zhou et al. (2024), DistillSpec, lenient acceptance.
    """

    lossless = False

    lenience: Any = array_field()
    _: dataclasses.KW_ONLY
    residual: str = "standard"
    lookahead: int | None = None

    @classmethod
    def example_cases(cls) -> dict:
        return {"lenient l=0.6": cls(0.6)}

    def __post_init__(self):
        verification.check_residual_name(self.residual)
        check_lookahead(self.lookahead)

    def validate(self) -> None:
        """Checks ``lenience`` in ``(0, 1]`` (its value only when concrete)."""
        _checks.check_scalar_leaf("lenience", self.lenience, high=1.0, low_open=True)

    def acceptance(self, p, q):
        """``b = min(1, q / (l p))``, 1 where ``p = 0``."""
        scaled = jnp.asarray(self.lenience, q.dtype) * p
        return jnp.minimum(1, safe_ratio(q, scaled, 1))

    def laws(self, p, q):
        law = verification.named_residual_law(p, q, self.acceptance(p, q), self.residual)
        return law, law

    @property
    def label(self) -> str:
        if _checks.is_concrete(self.lenience):
            return f"lenient SD (l = {float(self.lenience):g}, {self.residual})"
        return f"lenient SD ({self.residual})"
