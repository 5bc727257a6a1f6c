"""Any rule of the paper's general framework (Algorithm 2): a user's acceptance probabilities and
residual distribution."""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax

from specjax.decoders import verification
from specjax.decoders.base import TokenwiseDecoder
from specjax.decoders.base import check_lookahead
from specjax.decoders.base import pytree_dataclass


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

    accept_prob: Callable
    residual: Callable
    _: dataclasses.KW_ONLY
    lookahead: int | None = None

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
        law = verification.verification_law(p, b, res)
        return law, law

    @property
    def label(self) -> str:
        name = getattr(self.accept_prob, "__name__", "rule")
        return f"rejection rule ({name})"
