"""Top-k acceptance: SD that also accepts every draft among the target's ``k`` most likely
tokens. Lossy for ``k >= 1``."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax import _checks
from specjax.decoders import verification
from specjax.decoders.base import TokenwiseDecoder
from specjax.decoders.base import check_lookahead
from specjax.decoders.base import pytree_dataclass

__all__ = ["TopKAcceptance"]


@pytree_dataclass
class TopKAcceptance(TokenwiseDecoder):
    """Accept a draft ``x`` surely when it is among the target's top ``k`` (``q(x) > 0`` and
    ``q(x)`` at least the ``k``-th largest, ties kept), else with SD's ``min(1, q / p)``.

    ``k = 0`` is SD. The relaxation engines and papers use to accept "good enough" drafts (a
    draft the target ranks highly is kept even when the draft over-proposes it).

    Attributes:
      k: a static int ``>= 0``.
      residual: ``"standard"`` (``[q - p]_+``), ``"optimal"`` (Theorem 4's ``P*``), ``"target"``
        or ``"argmax"``.
      lookahead: ``None`` (``K = T``) or ``K``.
    """

    lossless = False

    k: int
    _: dataclasses.KW_ONLY
    residual: str = "standard"
    lookahead: int | None = None

    @classmethod
    def example_cases(cls) -> dict:
        return {"top-2 acceptance, optimal residual": cls(2, residual="optimal")}

    def __post_init__(self):
        _checks.check_static_non_negative_int("k", self.k)
        verification.check_residual_name(self.residual)
        check_lookahead(self.lookahead)

    def acceptance(self, p, q):
        """``1`` on the target's top ``k`` tokens of positive mass, ``min(1, q / p)`` elsewhere."""
        sd = verification.acceptance_probability(p, q, epsilon=0.0)
        if self.k == 0:
            return sd
        kth = jax.lax.top_k(q, min(self.k, q.shape[-1]))[0][..., -1:]
        return jnp.where((q >= kth) & (q > 0), jnp.ones_like(sd), sd)

    def laws(self, p, q):
        law = verification.named_residual_law(p, q, self.acceptance(p, q), self.residual)
        return law, law

    @property
    def label(self) -> str:
        return f"top-{self.k} acceptance ({self.residual})"
