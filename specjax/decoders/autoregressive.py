"""Autoregressive decoding (Algorithm 3): every token drawn from the target, one call each."""

from __future__ import annotations

from specjax.decoders import verification
from specjax.decoders.base import TokenwiseDecoder
from specjax.decoders.base import pytree_dataclass

__all__ = ["Autoregressive"]


@pytree_dataclass
class Autoregressive(TokenwiseDecoder):
    """Samples from the target token by token: every position costs one target call and nothing
    is ever rejected. The draft is not used (pass ``None``).

    References:
      Algorithm 3 (Auto-Regressive Model Decoding).
    """

    recording_reads = "nothing"

    uses_draft = False

    @classmethod
    def example_cases(cls) -> dict:
        return {"autoregressive": cls()}

    def laws(self, p, q):
        law = verification.bonus_law(q)
        return law, law

    def resolve_lookahead(self, horizon: int) -> int:
        return 0  # every position is the target's own ("bonus") draw

    @property
    def label(self) -> str:
        return "autoregressive"
