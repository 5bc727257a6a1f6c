"""The optimal verifier of ``M`` drafts: the best acceptance any lossless verifier can reach at the
root of each call (``optimal_acceptance``), SD below it."""

from __future__ import annotations

import dataclasses

from specjax.decoders import multi_draft
from specjax.decoders import verification
from specjax.decoders.base import TokenwiseDecoder
from specjax.decoders.base import check_lookahead
from specjax.decoders.base import pytree_dataclass


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
    descending, ``multi_draft.optimal_root_law``). The samplers draw the root's outcome
    (token, matched or not) from that coupling's joint law, as for every token-wise decoder; the
    tests construct a coupling of the drafts with exactly this law by a linear program.

    Attributes:
      num_drafts: ``M >= 1`` (``M = 1`` is SD) or ``math.inf``.
      replacement: ``True``: the drafts' first tokens are i.i.d. from ``p``; ``False``: drawn
        without replacement (``O(V^M)`` per row, refused beyond
        ``multi_draft.MAX_WITHOUT_REPLACEMENT_ELEMENTS``, as ``BatchSpeculative``).
      sequence_optimal: ``False`` (the only choice available): the matched tokens are chosen
        per token as above. ``True`` (choosing them by backward induction over the horizon) is
        not implemented and raises.
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

    def __post_init__(self):
        multi_draft.check_num_drafts(self.num_drafts)
        multi_draft._check_replacement(self.replacement)
        if not isinstance(self.sequence_optimal, bool):
            raise ValueError(f"sequence_optimal must be True or False, got "
                             f"{self.sequence_optimal!r}")
        if self.sequence_optimal:
            raise NotImplementedError(
                "OptimalMultiDraft(sequence_optimal=True), the matched tokens chosen by backward "
                "induction over the horizon, is not implemented yet; sequence_optimal=False "
                "gives the per-token optimum")
        check_lookahead(self.lookahead)

    def laws(self, p, q):
        root = multi_draft.optimal_root_law(p, q, self.num_drafts, self.replacement)
        return root, verification.speculative_law(p, q)

    def check(self, num_states: int, num_rows: int) -> None:
        if not self.replacement:
            multi_draft.check_without_replacement_size(self.num_drafts, num_states, num_rows)

    @property
    def label(self) -> str:
        k = "" if self.lookahead is None else f", K = {self.lookahead}"
        how = "" if self.replacement else " w/o replacement"
        return f"optimal multi-draft{how}, M = {self.num_drafts}{k}"
