"""Speculative decoding (Algorithm 1): accept ``min(1, q/p)``, resample ``[q - p]_+``."""

from __future__ import annotations

import jax.numpy as jnp

from specjax.decoders import verification
from specjax.decoders.base import TokenwiseDecoder
from specjax.decoders.base import check_lookahead
from specjax.decoders.base import pytree_dataclass

__all__ = ["Speculative"]


@pytree_dataclass
class Speculative(TokenwiseDecoder):
    """Speculative decoding (SD): draft from ``p``, verify with ``min(1, q/p)``, resample
    ``[q - p]_+``; the output law is exactly the target's.

    Attributes:
      lookahead: ``None`` for the paper's ``K = T`` (draft to the end, one target call per
        rejection); an int ``K`` for practical SD: a call verifies up to ``K`` drafts and appends
        the target's bonus token when all are accepted.

    Example:
      >>> import jax, specjax
      >>> draft, target = specjax.paper_instance()
      >>> trace = specjax.decode(jax.random.key(0), specjax.Speculative(), draft, target, 8)
      >>> trace.tokens.shape
      (8, 51)

    References:
      Algorithm 1 and Theorem 1; Leviathan et al. 2023 for the bonus token.
    """

    recording_reads = "emitted"

    lookahead: int | None = None
    has_root_scale = True

    @classmethod
    def example_cases(cls) -> dict:
        return {"sd": cls(), "sd K=3": cls(lookahead=3)}

    def __post_init__(self):
        check_lookahead(self.lookahead)

    def laws(self, p, q):
        law = verification.speculative_law(p, q)
        return law, law

    def root_scale(self, p, q):
        return jnp.ones(q.shape[:-1] + (1,), q.dtype)

    def acceptance(self, p, q):
        """SD's acceptance probabilities ``min(1, q / p)`` (1 where ``p = 0``)."""
        return verification.acceptance_probability(p, q, epsilon=0)

    @property
    def label(self) -> str:
        return "SD" if self.lookahead is None else f"SD, K = {self.lookahead}"
