"""specjax: the theory and simulation of speculative decoding in JAX.

Convention throughout: ``p`` is the draft model, ``q`` the target model (the paper's notation).
A decoder is a value (``Speculative()``, ``BatchSpeculative(4)``, ...); ``decode``, ``exact``,
``decoding_statistics`` and ``accepted_length`` take any decoder.

The top level holds the models, the decoders, the entry points, their result types and the
paper's own quantities. Everything else is served from its subpackage (``specjax.models``,
``specjax.decoders``, ``specjax.sampling``, ``specjax.theory``, ``specjax.tuning``,
``specjax.auditing``); conveniences that only repeat an entry point under another name live in
``specjax.compat`` and warn. A name that used to be here still resolves, with a
``DeprecationWarning`` naming its new home (``_MOVED`` below).
"""

from specjax import _moved

# Models.
from specjax.models import AutoregressiveModel
from specjax.models import FiniteStateModel
from specjax.models import MarkovChain
from specjax.models import NGramModel
from specjax.models import paper_instance
from specjax.models import process_logits
from specjax.models import random_markov_chain

# Decoders, and the protocol a new decoder follows.
from specjax.decoders import AdaptiveSpeculative
from specjax.decoders import Autoregressive
from specjax.decoders import BatchSpeculative
from specjax.decoders import BiasedSpeculative
from specjax.decoders import BlockVerification
from specjax.decoders import CallDecoder
from specjax.decoders import DynamicTree
from specjax.decoders import GumbelList
from specjax.decoders import HeuristicSchedule
from specjax.decoders import ImportanceWeighted
from specjax.decoders import KSequential
from specjax.decoders import LenientSpeculative
from specjax.decoders import OptimalMultiDraft
from specjax.decoders import RejectionRule
from specjax.decoders import SpecHub
from specjax.decoders import Speculative
from specjax.decoders import ThresholdVerification
from specjax.decoders import TokenTree
from specjax.decoders import TokenwiseDecoder
from specjax.decoders import TraversalVerification
from specjax.decoders import TopKAcceptance
from specjax.decoders import TypicalAcceptance
from specjax.decoders import array_field
from specjax.decoders import decoder_dataclass

# The paper's single-step quantities.
from specjax.decoders.multi_draft import batch_improvement
from specjax.decoders.optimal_acceptance import optimal_acceptance
from specjax.decoders.verification import acceptance_probability
from specjax.decoders.verification import optimal_residual
from specjax.decoders.verification import rejection_probability
from specjax.decoders.verification import residual_distribution
from specjax.decoders.verification import speculative_residual
from specjax.decoders.verification import tv_distance
from specjax.decoders.verification import tv_loss_star
from specjax.decoders.verification import verification_law

# Monte Carlo: the entry points, their results and the paper's samplers.
from specjax.sampling import DecodingStatistics
from specjax.sampling import DecodingTrace
from specjax.sampling import autoregressive_decoding
from specjax.sampling import batch_speculative_decoding
from specjax.sampling import biased_speculative_decoding
from specjax.sampling import chain_sharding
from specjax.sampling import decode
from specjax.sampling import decoding_statistics
from specjax.sampling import rejection_decoding
from specjax.sampling import speculative_decoding

# Exact theory: the entry points, their result, the paper's theorems, cost and trees.
from specjax.theory import CostModel
from specjax.theory import ExactDecoding
from specjax.theory import OptimalRate
from specjax.theory import accepted_length
from specjax.theory import batch_expected_rejections
from specjax.theory import exact
from specjax.theory import expected_calls
from specjax.theory import expected_rejections
from specjax.theory import expected_time
from specjax.theory import marginals
from specjax.theory import optimal_rate
from specjax.theory import output_chain
from specjax.theory import sequoia_tree
from specjax.theory import ServingCost
from specjax.theory import serving_rate

# Tuning: the entry points.
from specjax.tuning import objective
from specjax.tuning import tune_draft

# Auditing: single-step rules and engines' samplers on given drafts.
from specjax.auditing import audit
from specjax.auditing import audit_exact
from specjax.auditing import compare_outputs
from specjax.auditing import verify_drafts
from specjax.auditing import verify_drafts_law
from specjax.auditing import verify_tree
from specjax.auditing import verify_tree_law

# Real model pairs: recordings of target rollouts and the estimates from them.
from specjax.pairs import Estimate
from specjax.pairs import Recording
from specjax.pairs import estimate
from specjax.pairs import record

from specjax import compat  # the deprecated conveniences: specjax.compat.<name> warns

__version__ = "0.2.0"

__all__ = [
    # models
    "AutoregressiveModel",
    "FiniteStateModel",
    "MarkovChain",
    "NGramModel",
    "paper_instance",
    "process_logits",
    "random_markov_chain",
    # decoders
    "AdaptiveSpeculative",
    "Autoregressive",
    "BatchSpeculative",
    "BiasedSpeculative",
    "BlockVerification",
    "DynamicTree",
    "GumbelList",
    "HeuristicSchedule",
    "ImportanceWeighted",
    "KSequential",
    "LenientSpeculative",
    "OptimalMultiDraft",
    "RejectionRule",
    "SpecHub",
    "Speculative",
    "ThresholdVerification",
    "TokenTree",
    "TraversalVerification",
    "TopKAcceptance",
    "TypicalAcceptance",
    # the decoder protocol
    "CallDecoder",
    "TokenwiseDecoder",
    "array_field",
    "decoder_dataclass",
    "verification_law",
    # single-step quantities
    "acceptance_probability",
    "batch_improvement",
    "optimal_acceptance",
    "optimal_residual",
    "rejection_probability",
    "residual_distribution",
    "speculative_residual",
    "tv_distance",
    "tv_loss_star",
    # Monte Carlo
    "DecodingStatistics",
    "DecodingTrace",
    "autoregressive_decoding",
    "batch_speculative_decoding",
    "biased_speculative_decoding",
    "chain_sharding",
    "decode",
    "decoding_statistics",
    "rejection_decoding",
    "speculative_decoding",
    # exact theory
    "CostModel",
    "ServingCost",
    "serving_rate",
    "ExactDecoding",
    "OptimalRate",
    "accepted_length",
    "batch_expected_rejections",
    "exact",
    "expected_calls",
    "expected_rejections",
    "expected_time",
    "marginals",
    "optimal_rate",
    "output_chain",
    "sequoia_tree",
    # tuning
    "objective",
    "tune_draft",
    # auditing
    "audit",
    "audit_exact",
    "compare_outputs",
    "verify_drafts",
    "verify_drafts_law",
    "verify_tree",
    "verify_tree_law",
    # real model pairs
    "Estimate",
    "Recording",
    "estimate",
    "record",
]

#: The names that left the top level, and where each lives now. ``specjax.<name>`` still
#: resolves to the same object, with a ``DeprecationWarning`` naming its home.
_MOVED = {
    **dict.fromkeys(("GreedyModel", "ProcessedModel", "PromptedModel", "greedy_draft",
                     "process_chain", "process_model", "with_prompt"), "specjax.models"),
    **dict.fromkeys(("CallLaw", "ConfidenceThreshold", "Decoder", "DraftState",
                     "EntropyThreshold", "FixedLength", "RejectionThreshold", "StoppingPolicy",
                     "StoppingRule", "ThresholdTable", "VerificationLaw",
                     "batch_residual_mass"), "specjax.decoders"),
    **dict.fromkeys(("DecodingTime", "EngineMetrics", "LookaheadChoice", "OptimalStopping",
                     "ParetoFront", "SequoiaChoice", "StationaryRate", "TreeBudgetChoice",
                     "best_lookahead", "best_token_tree", "best_tree_budget",
                     "biased_output_chain", "decoding_time", "engine_metrics",
                     "exact_joint_accepted_length", "exact_tokenwise_accepted_length",
                     "optimal_stopping", "pareto_front", "positional_acceptance",
                     "sequence_kl", "sequoia_hardware_tree", "stationary_rate"),
                    "specjax.theory"),
    **dict.fromkeys(("ContextFreeDraft", "DraftFamily", "FullDraft", "LowRankDraft",
                     "Objective", "StationaryDraft", "TuneResult", "biased_tradeoff",
                     "draft_family", "kl_divergence", "kl_fit", "make_objective"),
                    "specjax.tuning"),
    **dict.fromkeys(("AuditReport", "DraftsLaw", "EngineComparison", "TreeLaw", "Verified",
                     "VerifiedTree"), "specjax.auditing"),
    **dict.fromkeys(("batch_rejections", "block_verification_decoding",
                     "exact_batch_speculative_decoding", "exact_biased_speculative_decoding",
                     "exact_block_accepted_length", "exact_block_expected_calls",
                     "exact_rejection_decoding", "exact_speculative_decoding", "sd_rejections",
                     "target_calls"), _moved.COMPAT),
}

__getattr__ = _moved.moved(__name__, _MOVED)
