"""Typical acceptance (Medusa; vLLM's ``TypicalAcceptanceSampler``): accept a draft the target
finds plausible enough, else emit the target's most likely token. Lossy."""

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

__all__ = ["ENTROPY_OFFSET", "TypicalAcceptance"]

#: The constant inside the entropy's logarithm, ``H(q) = -sum q log(q + 1e-5)``, as in Medusa's
#: and vLLM's code (it keeps ``log 0`` away).
ENTROPY_OFFSET = 1e-5


@pytree_dataclass
class TypicalAcceptance(TokenwiseDecoder):
    """Typical acceptance: accept ``x`` iff ``q(x) > min(threshold, alpha exp(-H(q)))``.

    A deterministic test on the target's row alone (the draft's probabilities are not read);
    after a rejection the token comes from ``residual``: ``"argmax"`` (the target's most likely
    token: Medusa's code, and vLLM's ``TypicalAcceptanceSampler`` as its tests
    ``test_get_recovered_token_ids`` check), ``"target"`` (a draw from ``q``: a review reports
    that vLLM's last version emitted the target sampler's own token, not confirmed here),
    ``"optimal"`` (Theorem 4's ``P*`` for the same acceptance, the least biased residual) or
    ``"standard"`` (``[q - p]_+``).

    Attributes:
      threshold: ``posterior_threshold`` (vLLM's default 0.09), in ``[0, 1]``; a pytree leaf.
      alpha: ``posterior_alpha`` (default 0.3), ``>= 0``; a pytree leaf.
      residual: see above.
      lookahead: ``None`` (``K = T``) or ``K``.

    ``H(q) = -sum q log(q + 1e-5)`` as in the engines' code. The rule accepts only tokens with
    ``q(x) > 0`` when ``threshold > 0`` and ``alpha > 0``.

    References:
      Cai et al. (2024), Medusa, Section 3.3.1; vLLM ``typical_acceptance_sampler.py``
      (``_evaluate_accepted_tokens``; the recovered token in ``test_get_recovered_token_ids``).
    """

    lossless = False

    threshold: Any = array_field(default=0.09)
    alpha: Any = array_field(default=0.3)
    _: dataclasses.KW_ONLY
    residual: str = "argmax"
    lookahead: int | None = None
    #: The test ignores the draft's probabilities (``verify_drafts`` accepts iff ``u < b(x)``).
    reads_draft_probs = False

    @classmethod
    def example_cases(cls) -> dict:
        return {"typical 0.2/0.3 K=4": cls(0.2, 0.3, lookahead=4)}

    def __post_init__(self):
        verification.check_residual_name(self.residual)
        check_lookahead(self.lookahead)

    def validate(self) -> None:
        """Checks ``threshold`` in ``[0, 1]`` and ``alpha >= 0`` (values only when concrete)."""
        _checks.check_scalar_leaf("threshold", self.threshold, high=1.0)
        _checks.check_scalar_leaf("alpha", self.alpha)

    def acceptance(self, p, q):
        """``b(x) = 1[q(x) > min(threshold, alpha exp(-H(q)))]``, the same for every ``x`` of a
        row's test (``p`` is not read)."""
        del p
        entropy = -jnp.sum(q * jnp.log(q + ENTROPY_OFFSET), axis=-1, keepdims=True)
        cut = jnp.minimum(jnp.asarray(self.threshold, q.dtype),
                          jnp.asarray(self.alpha, q.dtype) * jnp.exp(-entropy))
        return (q > cut).astype(q.dtype)

    def laws(self, p, q):
        law = verification.named_residual_law(p, q, self.acceptance(p, q), self.residual)
        return law, law

    @property
    def label(self) -> str:
        if _checks.is_concrete(self.threshold) and _checks.is_concrete(self.alpha):
            return (f"typical (threshold = {float(self.threshold):g}, alpha = "
                    f"{float(self.alpha):g}, {self.residual})")
        return f"typical ({self.residual})"
