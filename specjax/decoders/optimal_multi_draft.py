"""The optimal verifier of ``M`` drafts: the best acceptance any lossless verifier can reach at the
root of each call (``optimal_acceptance``), SD below it."""

from __future__ import annotations

import dataclasses
from typing import Any

from specjax.decoders import multi_draft
from specjax.decoders import optimal_acceptance
from specjax.decoders import sequence_optimal
from specjax.decoders import verification
from specjax.decoders.base import TokenwiseDecoder
from specjax.decoders.base import array_field
from specjax.decoders.base import check_lookahead
from specjax.decoders.base import pytree_dataclass

__all__ = ["OptimalMultiDraft"]


@pytree_dataclass
class OptimalMultiDraft(TokenwiseDecoder):
    """Multi-draft SD with the optimal root verifier: ``M`` drafts per target call, depth-first.

    At the root of a call the first tokens of the ``M`` drafts form a set ``S``; the verifier
    couples ``S`` with the output ``Y ~ q`` so that ``P(Y in S)`` is the largest any lossless
    verifier reaches, ``alpha* = 1 - max_A [P(S within A) - q(A)]`` (``optimal_acceptance``).
    When ``Y`` is one of the drafts, that draft is followed and verified by SD until a rejection
    (as batch SD); otherwise the call ends with ``Y``. The output law is exactly the target's.

    Which tokens an optimal coupling matches is not unique; this decoder matches first the
    tokens the target wants most relative to the draft (the greedy vertex in order of ``q / p``
    descending, ``optimal_acceptance.optimal_root_law``). The samplers draw the root's outcome
    (token, matched or not) from that coupling's joint law, as for every token-wise decoder; the
    tests construct a coupling of the drafts with exactly this law by a linear program.

    Attributes:
      num_drafts: ``M >= 1`` (``M = 1`` is SD) or ``math.inf``.
      replacement: ``True``: the drafts' first tokens are i.i.d. from ``p``; ``False``: drawn
        without replacement (``O(V^M)`` per row, refused beyond
        ``multi_draft.MAX_WITHOUT_REPLACEMENT_ELEMENTS``, as ``BatchSpeculative``; ``M >= V``
        and ``math.inf`` need no enumeration: the draft set is the support of ``p``).
      sequence_optimal: ``False``: the matched tokens are chosen per token as above. ``True``:
        at the root of position ``n`` the coupling maximises ``sum_y m(y) w_n(y)`` over every
        lossless coupling, ``w_n(y)`` the expected later rejections saved by matching ``y``
        (backward induction over the horizon, ``sequence_optimal.sequence_optimal_weights``), so no
        verifier of this depth-first structure has fewer expected rejections. It may accept less
        than ``alpha*`` at a root, declining a drafted token (ending the call with it) when
        following that draft costs more later than a new call. On the paper's instance
        (``M = 2, 4, 8, inf``) and on 3 random chains (``V = 6``, ``T = 20``, ``M = 2, 8, inf``)
        every weight was positive (the smallest 0.32): no declining. Needs ``MarkovChain``
        models, i.i.d. drafts and ``lookahead=None``; ``O(V^3)`` per position. Refused beyond
        ``T V (V + 1)^2 > 2^26`` (``sequence_optimal.MAX_SEQUENCE_OPTIMAL_ELEMENTS``), the size of
        the sampler's table of all positions; ``exact`` needs only ``V (V + 1)^2`` per
        position but is refused at the same size.
      lookahead: ``None`` (``K = T``) or ``K`` (a bonus token after ``K`` accepted drafts).

    Example:
      >>> import jax, specjax
      >>> draft, target = specjax.paper_instance()
      >>> best = specjax.exact(specjax.OptimalMultiDraft(4), draft, target)
      >>> batch = specjax.exact(specjax.BatchSpeculative(4), draft, target)
      >>> bool(best.expected_rejections <= batch.expected_rejections)
      True

    References:
      Sun et al. 2023, "SpecTr: fast speculative decoding via optimal transport"; Hu et al. 2025,
      "Towards optimal multi-draft speculative decoding"; Khisti et al. 2025, "Multi-draft
      speculative sampling: canonical architectures and theoretical limits".
    """

    num_drafts: int | float
    _: dataclasses.KW_ONLY
    replacement: bool = True
    sequence_optimal: bool = False
    lookahead: int | None = None
    same_root = False

    @classmethod
    def example_cases(cls) -> dict:
        return {"optimal M=3 K=2": cls(3, lookahead=2)}

    def __post_init__(self):
        multi_draft.check_num_drafts(self.num_drafts)
        optimal_acceptance.check_replacement(self.replacement)
        if not isinstance(self.sequence_optimal, bool):
            raise ValueError(f"sequence_optimal must be True or False, got "
                             f"{self.sequence_optimal!r}")
        check_lookahead(self.lookahead)
        if self.sequence_optimal and not self.replacement:
            raise ValueError("sequence_optimal=True needs replacement=True (the backward "
                             "induction's greedy is written for i.i.d. drafts)")
        if self.sequence_optimal and self.lookahead is not None:
            raise ValueError(f"sequence_optimal=True needs lookahead=None (the paper's K = T: "
                             f"the backward induction has two phases), got "
                             f"lookahead={self.lookahead!r}")

    @property
    def model_kinds(self) -> tuple:
        """Exact values on finite-state models and Monte Carlo on protocol models, except for
        ``sequence_optimal=True`` (its backward induction is written for ``MarkovChain``s)."""
        return () if self.sequence_optimal else ("finite_state", "protocol")

    def laws(self, p, q):
        if self.sequence_optimal:
            raise ValueError("OptimalMultiDraft(sequence_optimal=True) has laws per position "
                             "only: run it through decode, exact or decoding_statistics")
        root = optimal_acceptance.optimal_root_law(p, q, self.num_drafts, self.replacement)
        return root, verification.speculative_law(p, q)

    def bind(self, p, q):
        if not self.sequence_optimal:
            return self
        weights = sequence_optimal.sequence_optimal_weights(p, q, self.num_drafts)
        return _BoundOptimalMultiDraft(self.num_drafts, replacement=self.replacement,
                                       sequence_optimal=True, lookahead=self.lookahead,
                                       weights=weights)

    def check(self, num_states: int, num_rows: int) -> None:
        if not self.replacement:
            optimal_acceptance.check_optimal_without_replacement_size(self.num_drafts,
                                                                      num_states, num_rows)
        if self.sequence_optimal:
            sequence_optimal.check_sequence_optimal_size(num_states, num_rows)

    @property
    def label(self) -> str:
        k = "" if self.lookahead is None else f", K = {self.lookahead}"
        how = "" if self.replacement else " w/o replacement"
        which = "sequence-optimal" if self.sequence_optimal else "optimal"
        return f"{which} multi-draft{how}, M = {self.num_drafts}{k}"


@pytree_dataclass
class _BoundOptimalMultiDraft(OptimalMultiDraft):
    """``OptimalMultiDraft(sequence_optimal=True)`` bound to one pair of Markov models: its
    backward-induction weights ``(T, V)`` (a leaf), so ``laws_at`` knows each position's root."""

    weights: Any = array_field(default=None)

    def laws_at(self, n, p, q):
        weights = self.weights[n]  # (..., V) against the rows (..., V)
        root = sequence_optimal.weighted_optimal_root_law(p, q, weights, self.num_drafts)
        return root, verification.speculative_law(p, q)
