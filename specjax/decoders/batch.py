"""Batch speculative decoding (Algorithm 4): ``M`` drafts verified at the root of each call, with
replacement (the paper) or without (recursive rejection sampling)."""

from __future__ import annotations

import dataclasses
import math

from specjax.decoders import multi_draft
from specjax.decoders import verification
from specjax.decoders.base import TokenwiseDecoder
from specjax.decoders.base import check_lookahead
from specjax.decoders.base import pytree_dataclass
from specjax.decoders.tree import TokenTree

__all__ = ["BatchSpeculative"]


@pytree_dataclass
class BatchSpeculative(TokenwiseDecoder):
    """Batch SD: ``M`` draft sequences per target call, verified depth-first.

    At the root of a call, draft ``m`` is verified against the ``m``-th residual ``q^m``
    (``q^1 = q``, ``q^{m+1} = [q^m - p]_+``); the first accepted draft is followed until a
    rejection, which resamples from ``[q - p]_+`` and ends the call. If all ``M`` first tokens are
    rejected the token is drawn from ``q^{M+1}``, as in the appendix proof (the pseudo-code read
    literally, ``q^{M+2}``, is biased; the tests show it).

    Attributes:
      num_drafts: ``M >= 1`` (``M = 1`` is SD), or ``math.inf`` for the limit ``M -> infinity``.
      replacement: ``True`` (the paper: independent drafts). ``False``: the drafts' first tokens
        are drawn without replacement and verified by recursive rejection sampling (Yang et al.
        2024); ``M`` is capped at ``V`` and the root law enumerates ``V^(M-1)`` draw paths per
        row (refused beyond ``2**26`` elements).
      lookahead: ``None`` (``K = T``) or ``K`` (a bonus token after ``K`` accepted drafts).

    References:
      Algorithm 4, Theorem 3 and its appendix proof; Yang et al. 2024, "Multi-candidate
      speculative decoding"; Jeon et al. 2024, "Recursive speculative decoding".
    """

    num_drafts: int | float
    _: dataclasses.KW_ONLY
    replacement: bool = True
    lookahead: int | None = None
    same_root = False

    @classmethod
    def example_cases(cls) -> dict:
        return {"batch M=3": cls(3), "batch M=2 K=2": cls(2, lookahead=2),
                "batch M=2 w/o replacement": cls(2, replacement=False)}

    def __post_init__(self):
        multi_draft.check_num_drafts(self.num_drafts)
        if not isinstance(self.replacement, bool):
            raise ValueError(f"replacement must be True or False, got {self.replacement!r}")
        check_lookahead(self.lookahead)

    @property
    def has_root_scale(self) -> bool:
        return self.replacement and self.num_drafts != math.inf

    def laws(self, p, q):
        if self.replacement:
            root = multi_draft.batch_root_law(p, q, self.num_drafts)
        else:
            root = multi_draft.batch_without_replacement_root_law(p, q, self.num_drafts)
        return root, verification.speculative_law(p, q)

    def root_scale(self, p, q):
        return multi_draft.batch_scale(p, q, self.num_drafts)

    def given_tree(self) -> TokenTree | None:
        """The tree ``(M, 1, ..., 1)`` of a call (``M`` drafted sequences of ``K`` tokens sharing
        the root; i.i.d. or without replacement), when ``M`` and ``K`` are finite."""
        if self.lookahead is None or self.num_drafts == math.inf:
            return None
        return TokenTree((int(self.num_drafts),) + (1,) * (self.lookahead - 1),
                         children="iid" if self.replacement else "without_replacement")

    def check(self, num_states: int, num_rows: int) -> None:
        if not self.replacement:
            multi_draft.check_without_replacement_size(self.num_drafts, num_states, num_rows)

    @property
    def label(self) -> str:
        k = "" if self.lookahead is None else f", K = {self.lookahead}"
        how = "" if self.replacement else " w/o replacement"
        return f"batch SD{how}, M = {self.num_drafts}{k}"
