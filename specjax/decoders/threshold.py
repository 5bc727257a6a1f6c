"""SGLang's threshold verification of a chain (``tree_speculative_sampling_target_only`` with one
draft per level): accept with ``min(1, q(x) / threshold_acc)``, or surely when ``q(x) >=
threshold_single``; after a rejection, the target with the rejected token removed."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from specjax import _checks
from specjax.decoders import verification
from specjax.decoders.base import TokenwiseDecoder
from specjax.decoders.base import array_field
from specjax.decoders.base import check_lookahead
from specjax.decoders.base import pytree_dataclass
from specjax.numerics import safe_ratio

__all__ = ["ThresholdVerification"]


@pytree_dataclass
class ThresholdVerification(TokenwiseDecoder):
    """SGLang's target-only verification: ``b(x) = min(1, q(x) / threshold_acc)``, or 1 when
    ``q(x) >= threshold_single``; a rejected ``x`` is removed from ``q`` and the token drawn from
    the rest (``relu(q - d)`` with ``d`` the rejected token's target mass).

    The draft's probabilities are not read. With both thresholds 1 (SGLang's defaults) the rule
    accepts with ``q(x)`` and resamples from ``q`` without ``x``: lossless whatever law the drafts
    come from (``q(y) P(x = y) + q(y) sum_{x != y} P(x) = q(y)``), SD itself for deterministic
    drafts (greedy, top-k trees), and less efficient than SD for drafts sampled from ``p``.
    Thresholds below 1 accept more and bias the output.

    The residual depends on the rejected token, so the law after a rejection is
    ``sum_x p(x) (1 - b(x)) q(y) 1[y != x] / (1 - q(x))``, not Algorithm 2's
    ``(1 - sum b p) P(y)``; ``residual_given_draft`` gives it for one drafted token.

    Attributes:
      threshold_single: in ``(0, 1]``; a pytree leaf.
      threshold_acc: in ``(0, 1]``; a pytree leaf.
      lookahead: ``None`` (``K = T``) or ``K``.

    References:
      SGLang, ``tree_speculative_sampling_target_only`` (``speculative_sampling.cuh``), with
      ``--speculative-accept-threshold-single`` and ``--speculative-accept-threshold-acc``; read
      through its transcriptions (a level's ``prob_acc`` is the drafted token's target mass when
      the level has one draft).
    """

    @property
    def lossless(self) -> bool:
        """Lossless with both thresholds 1 (``b = q``, SGLang's target-only rule at its
        defaults); lossy below, and unknown (``False``) when a threshold is traced."""
        values = (self.threshold_single, self.threshold_acc)
        return all(_checks.is_concrete(v) for v in values) and all(
            float(v) == 1.0 for v in values)

    threshold_single: Any = array_field(default=1.0)
    threshold_acc: Any = array_field(default=1.0)
    _: dataclasses.KW_ONLY
    lookahead: int | None = None
    #: The test ignores the draft's probabilities (``verify_drafts`` accepts iff ``u < b(x)``).
    reads_draft_probs = False

    @classmethod
    def example_cases(cls) -> dict:
        return {"threshold 0.5/0.7 K=3": cls(0.5, 0.7, lookahead=3)}

    def __post_init__(self):
        check_lookahead(self.lookahead)

    def validate(self) -> None:
        """Checks both thresholds in ``(0, 1]`` (values only when concrete)."""
        _checks.check_scalar_leaf("threshold_single", self.threshold_single, high=1.0,
                                  low_open=True)
        _checks.check_scalar_leaf("threshold_acc", self.threshold_acc, high=1.0, low_open=True)

    def acceptance(self, p, q):
        """``max(min(1, q / threshold_acc), 1[q >= threshold_single])`` per token."""
        del p
        single = jnp.asarray(self.threshold_single, q.dtype)
        acc = jnp.asarray(self.threshold_acc, q.dtype)
        return jnp.where(q >= single, jnp.ones_like(q), jnp.minimum(1, q / acc))

    def residual_given_draft(self, p, q, x):
        """The masses the token is drawn from after rejecting draft ``x`` (``(..., V)`` rows,
        ``x`` ``(...)`` ints): ``q`` with ``x`` removed."""
        del p
        return q * (1 - jax.nn.one_hot(x, q.shape[-1], dtype=q.dtype))

    def laws(self, p, q):
        b = self.acceptance(p, q)
        # P(reject x) / (1 - q(x)), 0 where q(x) = 1 (then b(x) = 1: never rejected).
        weight = safe_ratio(p * (1 - b), 1 - q, 0)
        total = jnp.sum(weight, axis=-1, keepdims=True)
        law = verification.VerificationLaw(b * p, jnp.maximum(q * (total - weight), 0))
        return law, law

    @property
    def label(self) -> str:
        if _checks.is_concrete(self.threshold_single) and _checks.is_concrete(self.threshold_acc):
            return (f"threshold verification (single = {float(self.threshold_single):g}, "
                    f"acc = {float(self.threshold_acc):g})")
        return "threshold verification"
