"""Decoders: the verification rule written once (``verification``), the decoder protocol
(``base``) and one file per decoder."""

from specjax.decoders.adaptive import AdaptiveSpeculative
from specjax.decoders.schedule import HeuristicSchedule
from specjax.decoders.adaptive import ConfidenceThreshold
from specjax.decoders.adaptive import DraftState
from specjax.decoders.adaptive import EntropyThreshold
from specjax.decoders.adaptive import FixedLength
from specjax.decoders.adaptive import RejectionThreshold
from specjax.decoders.adaptive import StoppingPolicy
from specjax.decoders.adaptive import StoppingRule
from specjax.decoders.adaptive import ThresholdTable
from specjax.decoders.autoregressive import Autoregressive
from specjax.decoders.base import CallDecoder
from specjax.decoders.base import CallLaw
from specjax.decoders.base import DepthPlan
from specjax.decoders.base import Decoder
from specjax.decoders.base import TokenwiseDecoder
from specjax.decoders.base import array_field
from specjax.decoders.base import decoder_dataclass
from specjax.decoders.batch import BatchSpeculative
from specjax.decoders.biased import BiasedSpeculative
from specjax.decoders.block import BlockVerification
from specjax.decoders.dynamic_tree import DynamicTree
from specjax.decoders.gumbel_list import GumbelList
from specjax.decoders.importance_weighted import ImportanceWeighted
from specjax.decoders.k_sequential import KSequential
from specjax.decoders.optimal_multi_draft import OptimalMultiDraft
from specjax.decoders.parallel_draft import ParallelDraft
from specjax.decoders.parallel_draft import marginal_heads
from specjax.decoders.rejection import RejectionRule
from specjax.decoders.spechub import SpecHub
from specjax.decoders.strict import StrictVerification
from specjax.decoders.speculative import Speculative
from specjax.decoders.traversal import TraversalVerification
from specjax.decoders.tree import TokenTree
from specjax.decoders.lenient import LenientSpeculative
from specjax.decoders.threshold import ThresholdVerification
from specjax.decoders.top_k import TopKAcceptance
from specjax.decoders.typical import TypicalAcceptance
from specjax.decoders.multi_draft import batch_residual_mass
from specjax.decoders.verification import VerificationLaw

__all__ = [
    "AdaptiveSpeculative",
    "HeuristicSchedule",
    "Autoregressive",
    "ConfidenceThreshold",
    "DraftState",
    "EntropyThreshold",
    "FixedLength",
    "RejectionThreshold",
    "StoppingPolicy",
    "StoppingRule",
    "ThresholdTable",
    "BatchSpeculative",
    "BiasedSpeculative",
    "BlockVerification",
    "CallDecoder",
    "CallLaw",
    "DepthPlan",
    "Decoder",
    "DynamicTree",
    "GumbelList",
    "ImportanceWeighted",
    "KSequential",
    "OptimalMultiDraft",
    "ParallelDraft",
    "RejectionRule",
    "SpecHub",
    "Speculative",
    "StrictVerification",
    "TokenTree",
    "TraversalVerification",
    "LenientSpeculative",
    "ThresholdVerification",
    "TopKAcceptance",
    "TypicalAcceptance",
    "TokenwiseDecoder",
    "array_field",
    "decoder_dataclass",
    "VerificationLaw",
    "batch_residual_mass",
    "marginal_heads",
]

# specjax's own token-wise decoders: their laws are checked by the conformance suite against
# independent implementations, so they are not probed at every call (TokenwiseDecoder.probes_laws);
# RejectionRule's laws are a user's functions, and a user's subclass that defines its own laws is
# probed again (TokenwiseDecoder.__init_subclass__).
for _cls in (Autoregressive, Speculative, BatchSpeculative, BiasedSpeculative, GumbelList,
             ImportanceWeighted, KSequential, OptimalMultiDraft, SpecHub, StrictVerification,
             LenientSpeculative, ThresholdVerification, TopKAcceptance, TypicalAcceptance):
    _cls.probes_laws = False
del _cls
