"""Exact, differentiable costs of decoding to tune a draft for: a decoder and a quantity.

``objective(decoder, "rejections")`` is ``exact(decoder, draft, target).expected_rejections`` as
a function of the draft, so every decoder (including one defined outside specjax) can be tuned
for without a new objective function. ``biased_tradeoff`` and ``kl_divergence`` are objectives of
their own; ``make_objective`` builds one by name (command lines). ``sd_rejections``,
``batch_rejections`` and ``target_calls`` only name ``objective`` of SD and batch SD: the public
ones are the deprecated ``specjax.compat`` conveniences, and ``make_objective`` uses these.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from specjax import _checks
from specjax.decoders import verification as _verify
from specjax.decoders.base import TokenwiseDecoder
from specjax.decoders.base import check_decoder
from specjax.decoders.batch import BatchSpeculative
from specjax.decoders.biased import BiasedSpeculative
from specjax.decoders.speculative import Speculative
from specjax.models.markov import MarkovChain
from specjax.theory.values import exact
from specjax.theory.laws import sequence_kl

__all__ = [
    "OBJECTIVES",
    "Objective",
    "QUANTITIES",
    "batch_rejections",
    "biased_tradeoff",
    "kl_divergence",
    "make_objective",
    "objective",
    "sd_rejections",
    "target_calls",
]

QUANTITIES = ("rejections", "calls", "tradeoff", "kl")


@dataclasses.dataclass(frozen=True)
class Objective:
    """An exact, differentiable cost of decoding: ``objective(draft, target) -> scalar``.

    Build one with ``objective(decoder, quantity)``, ``biased_tradeoff``, ``kl_divergence``, or
    by name with ``make_objective``. Objectives are frozen dataclasses: hashable, so
    ``tune_draft`` compiles once per objective. Any other callable ``(draft, target) -> scalar``
    works with ``tune_draft`` too.

    Attributes:
      decoder: the decoder whose exact values are the cost (``None`` for ``"kl"``).
      quantity: ``"rejections"`` (``E[N_rej]``), ``"calls"`` (expected target calls),
        ``"tradeoff"`` (``E[N_rej] + weight * sum_n E[Loss*_TV(b_n)]`` for a decoder with
        acceptance probabilities ``b``) or ``"kl"`` (the forward KL of whole sequences).
      weight: ``lambda`` of ``"tradeoff"``.
      kind: the name of the objective for tables and command lines (``"sd"``, ``"batch"``,
        ``"calls"``, ``"biased"``, ``"kl"``, or ``"custom"``).
    """

    decoder: Any = None
    quantity: str = "rejections"
    weight: float = 1.0
    kind: str = "custom"

    @property
    def num_drafts(self):
        """``M`` of a token-wise decoder; ``None`` for a call-level one or ``"kl"``."""
        return self.decoder.num_drafts if isinstance(self.decoder, TokenwiseDecoder) else None

    @property
    def lookahead(self):
        """The decoder's ``lookahead`` (``None``: ``K = T``, and for ``"kl"``)."""
        return None if self.decoder is None else self.decoder.lookahead

    @property
    def epsilon(self):
        """The decoder's ``over_acceptance``: biased SD's ``epsilon`` (0 for the other decoders
        and for ``"kl"``)."""
        return 0.0 if self.decoder is None else self.decoder.over_acceptance

    @property
    def label(self) -> str:
        """A short name for tables: ``sd``, ``batch(M=4)``, ``calls(K=4)``, ..."""
        k = "" if self.lookahead is None else f"K={self.lookahead}"
        if self.kind == "sd":
            return "sd" if not k else f"sd({k})"
        if self.kind == "batch":
            return f"batch(M={self.num_drafts}{', ' + k if k else ''})"
        if self.kind == "calls":
            return f"calls({k or 'K=T'})"
        if self.kind == "biased":
            return f"biased(eps={self.epsilon:g}, lambda={self.weight:g})"
        if self.kind == "custom":
            return f"{self.quantity}({self.decoder.label})"
        return self.kind

    def __call__(self, draft: MarkovChain, target: MarkovChain) -> jax.Array:
        if not (isinstance(draft, MarkovChain) and isinstance(target, MarkovChain)):
            raise ValueError(f"tuning objectives take MarkovChain models (draft families are "
                             f"Markov chains), got {type(draft).__name__} and "
                             f"{type(target).__name__}")
        if self.quantity == "kl":
            # The prompt term KL(q_0 || p_0) does not depend on the draft's transitions and the
            # draft's prompt law is never used by decoding: compare transitions only.
            return sequence_kl(target, MarkovChain.tree_unflatten(None, (target.init, draft.trans)))
        result = exact(self.decoder, draft, target)
        if self.quantity == "rejections":
            return result.expected_rejections
        if self.quantity == "calls":
            return result.expected_calls
        b = self.decoder.acceptance(draft.trans, target.trans)
        loss = _verify.tv_loss_star(draft.trans, target.trans, b)  # (T, V), per context
        context = result.marginals[:-1]  # (T, V): the decoder's own law of x_{n-1}
        return result.expected_rejections + self.weight * jnp.sum(context * loss)


# A pytree without leaves (static data), as the families are: jax.jit(tune_draft) then reaches
# tune_draft's own refusal instead of JAX's "Error interpreting argument".
jax.tree_util.register_static(Objective)


def objective(decoder, quantity: str = "rejections", *, weight: float = 1.0) -> Objective:
    """The exact ``quantity`` of ``decoder`` as a differentiable function of the draft.

    Args:
      decoder: any decoder value (token-wise or call-level, specjax's or your own).
      quantity: ``"rejections"``, ``"calls"`` or ``"tradeoff"`` (the latter for decoders with
        an ``acceptance(p, q)`` method: ``Speculative``, ``BiasedSpeculative``,
        ``RejectionRule``).
      weight: ``lambda >= 0`` of ``"tradeoff"``.

    Example:
      >>> import specjax
      >>> draft, target = specjax.paper_instance()
      >>> cost = specjax.tuning.objective(specjax.BlockVerification(2), "calls")
      >>> float(cost(draft, target)) < 50
      True
    """
    check_decoder(decoder)
    if quantity not in QUANTITIES[:3]:
        raise ValueError(f"quantity must be one of {QUANTITIES[:3]} (kl_divergence() for the "
                         f"KL), got {quantity!r}")
    if quantity == "tradeoff" and not (isinstance(decoder, TokenwiseDecoder)
                                       and decoder.has_acceptance):
        raise ValueError(f"quantity 'tradeoff' needs a decoder with acceptance probabilities "
                         f"(acceptance(p, q)), got {decoder!r}")
    weight = _checks.check_finite_non_negative("weight", weight)
    return Objective(decoder, quantity, weight)


def sd_rejections(*, lookahead: int | None = None) -> Objective:
    """Expected rejections of SD: Theorem 1's ``sum_n E_{x_{n-1} ~ q}[TV(p_n, q_n)]`` (K = T)."""
    return Objective(Speculative(lookahead), "rejections", kind="sd")


def batch_rejections(num_drafts, *, lookahead: int | None = None) -> Objective:
    """Expected rejections of batch SD with ``M`` drafts (Theorem 3)."""
    return Objective(BatchSpeculative(num_drafts, lookahead=lookahead), "rejections",
                     kind="batch")


def target_calls(*, lookahead: int | None = None) -> Objective:
    """Expected target calls of SD with lookahead ``K`` (bonus token after ``K`` accepts)."""
    return Objective(Speculative(lookahead), "calls", kind="calls")


def biased_tradeoff(epsilon: float, *, weight: float = 1.0) -> Objective:
    """Biased SD's trade-off ``E[N_rej] + lambda * sum_n E[Loss*_TV(b_n)]`` at fixed ``eps``.

    ``b = min(1, (q + eps) / p)`` with Theorem 4's optimal residual (Decoding-OPT), ``K = T``.
    The bias term is the paper's single-token ``Loss*_TV`` of each position, averaged over the
    biased decoder's own law of the context ``x_{n-1}`` and summed over positions: the paper
    solves the trade-off one token at a time (its remark after Theorem 4 notes the
    whole-sequence problem has no closed form). By Theorem 5 each term is
    ``P(reject) + Loss* = TV(p, q)`` per context, so ``lambda = 1`` gives SD's objective under
    the biased decoder's context law; ``lambda > 1`` favours less bias, ``lambda < 1`` fewer
    rejections.

    Args:
      epsilon: ``eps >= 0``.
      weight: ``lambda >= 0``.
    """
    epsilon = _checks.check_finite_non_negative("epsilon", epsilon)
    weight = _checks.check_finite_non_negative("weight", weight)
    return Objective(BiasedSpeculative(epsilon), "tradeoff", weight, kind="biased")


def kl_divergence() -> Objective:
    """Forward ``KL(q || p)`` of whole sequences, up to the prompt term: maximum likelihood.

    It is ``+inf`` (never NaN, gradient finite) when the draft gives probability 0 to a token the
    target can produce, e.g. when logits far below the row's maximum (about 87 in float32) make
    the softmax underflow; ``tune_draft`` refuses such a start. Start from moderate logits.
    """
    return Objective(None, "kl", kind="kl")


OBJECTIVES = ("sd", "batch", "calls", "biased", "kl")


def make_objective(name: str, *, num_drafts=4, lookahead: int | None = None,
                   epsilon: float = 0.05, weight: float = 1.0) -> Objective:
    """An objective by name (for command lines); settings that do not apply are ignored.

    ``"sd"`` (``lookahead``), ``"batch"`` (``num_drafts``, ``lookahead``), ``"calls"``
    (``lookahead``), ``"biased"`` (``epsilon``, ``weight``; ``K = T``), ``"kl"``. ``lookahead``
    ``None`` is ``K = T``.
    """
    if name == "sd":
        return sd_rejections(lookahead=lookahead)
    if name == "batch":
        return batch_rejections(num_drafts, lookahead=lookahead)
    if name == "calls":
        return target_calls(lookahead=lookahead)
    if name == "biased":
        return biased_tradeoff(epsilon, weight=weight)
    if name == "kl":
        return kl_divergence()
    raise ValueError(f"objective must be one of {list(OBJECTIVES)}, got {name!r}")
