"""The shared head of the decoders that draft ``M`` i.i.d. sequences per call and verify them at
the root by a multi-draft rule of their own: ``KSequential``, ``ImportanceWeighted`` and
``GumbelList``.

Each of them is ``IidMultiDraft`` with a ``root_law``: the fields ``num_drafts`` and
``lookahead`` (keyword-only), ``same_root = False``, the checks of both settings at
construction (``check_num_drafts``, the decoder's own refusal of ``math.inf``), the laws (the
root law at the root of a call; inside it the followed draft is verified by SD, as batch SD's)
and the label come from here.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar

from specjax.decoders import verification
from specjax.decoders.base import TokenwiseDecoder
from specjax.decoders.base import check_lookahead
from specjax.decoders.verification import VerificationLaw

__all__ = ["IidMultiDraft"]


@dataclasses.dataclass(frozen=True, eq=False)
class IidMultiDraft(TokenwiseDecoder, metaclass=abc.ABCMeta):
    """``M`` i.i.d. draft sequences per target call: the drafts' first tokens verified at the
    root by ``root_law(p, q)``, then the followed draft verified by SD until a rejection.

    A subclass (a ``decoder_dataclass``) gives ``root_law``, ``check_num_drafts`` (a static
    method: its refusals of ``num_drafts``) and ``scheme`` (its name in labels); it inherits the
    fields, the laws and the label. A subclass that defines ``root_law`` is probed as one that
    defines ``laws`` (``TokenwiseDecoder.probes_laws``).

    Attributes:
      num_drafts: ``M >= 1``.
      lookahead: ``None`` (``K = T``) or ``K`` (a bonus token after ``K`` accepted drafts).
    """

    num_drafts: int
    _: dataclasses.KW_ONLY
    lookahead: int | None = None
    same_root = False
    #: The decoder's name in its label (``"k-sequential, M = 2, K = 3"``).
    scheme: ClassVar[str] = "i.i.d. multi-draft"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "root_law" in cls.__dict__ and "probes_laws" not in cls.__dict__:
            cls.probes_laws = True  # new laws: probed as a class that defines laws

    def __post_init__(self):
        self.check_num_drafts(self.num_drafts)
        check_lookahead(self.lookahead)

    @staticmethod
    @abc.abstractmethod
    def check_num_drafts(num_drafts) -> None:
        """Raise ``ValueError`` unless ``num_drafts`` is a setting the root law takes."""

    @abc.abstractmethod
    def root_law(self, p, q) -> VerificationLaw:
        """The law of (token, rejected?) at the root of a call, for ``(..., V)`` rows."""

    def laws(self, p, q):
        return self.root_law(p, q), verification.speculative_law(p, q)

    @property
    def label(self) -> str:
        k = "" if self.lookahead is None else f", K = {self.lookahead}"
        return f"{self.scheme}, M = {self.num_drafts}{k}"
