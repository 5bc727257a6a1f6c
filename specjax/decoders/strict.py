"""Strict verification (vLLM's ``rejection_sample_method="strict"``): keep a draft iff it equals
a sample of the target, else emit that sample. Lossless, and never better than SD."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.decoders import verification
from specjax.decoders.base import TokenwiseDecoder
from specjax.decoders.base import check_lookahead
from specjax.decoders.base import pytree_dataclass

__all__ = ["StrictVerification"]


@pytree_dataclass
class StrictVerification(TokenwiseDecoder):
    """Strict verification: at each drafted position the target draws ``y ~ q``; the draft ``x``
    is kept iff ``x = y``, otherwise ``y`` is emitted and the call ends (the bonus token after
    ``K`` kept drafts is a plain draw from ``q``).

    The step's law: ``P(x kept) = p(x) q(x)``; after a rejection the token is ``y ~ q`` given
    ``y != x``, of marginal mass ``q(y) (1 - p(y))``. The token's law is ``p q + q (1 - p) = q``
    whatever the draft, so the rule is lossless, and its acceptance ``sum_x p(x) q(x)`` is at
    most SD's ``sum_x min(p(x), q(x))``, with equality iff ``p`` or ``q`` is a point mass or
    their supports are disjoint (``p q = min(p, q)`` needs ``min = 0`` or ``max = 1`` at every
    token): greedy drafts lose nothing, sampled drafts lose ``sum min(p, q) - sum p q``. It never
    reads the draft's probabilities, so an engine keeps no draft logits (the default of vLLM's
    Model Runner V2 when PR #35461 added ``"probabilistic"``).

    The rule is ``ThresholdVerification()`` with both thresholds 1 (accept with ``q(x)``, then
    ``q`` without ``x``); this preset writes its law without division and names the engine's
    setting.

    Attributes:
      lookahead: ``None`` (``K = T``) or ``K``.

    Example:
      >>> import specjax
      >>> draft, target = specjax.paper_instance()
      >>> strict = specjax.decoders.StrictVerification(lookahead=4)
      >>> calls = specjax.exact(strict, draft, target).expected_calls
      >>> sd = specjax.exact(specjax.Speculative(lookahead=4), draft, target).expected_calls
      >>> bool(calls >= sd)
      True

    References:
      vLLM PR #35461 (``SpeculativeConfig.rejection_sample_method``: ``"strict"`` against
      ``"probabilistic"``), Model Runner V2's rejection sampler.
    """

    lookahead: int | None = None
    #: The test ignores the draft's probabilities (``verify_drafts`` accepts iff ``u < q(x)``).
    reads_draft_probs = False

    @classmethod
    def example_cases(cls) -> dict:
        return {"strict K=2": cls(lookahead=2)}

    def __post_init__(self):
        check_lookahead(self.lookahead)

    def acceptance(self, p, q):
        """``b(x) = q(x)``: the chance that the target's sample equals the draft."""
        del p
        return q

    def residual_given_draft(self, p, q, x):
        """The masses the token is drawn from after draft ``x`` (``(...)`` ints) is rejected:
        ``q`` with ``x`` removed."""
        del p
        return q * (1 - jax.nn.one_hot(x, q.shape[-1], dtype=q.dtype))

    def laws(self, p, q):
        law = verification.VerificationLaw(p * q, q * jnp.maximum(1 - p, 0))
        return law, law

    @property
    def label(self) -> str:
        return "strict" if self.lookahead is None else f"strict, K = {self.lookahead}"
