"""specjax: the theory and simulation of speculative decoding in JAX.

Convention throughout: ``p`` is the draft model, ``q`` the target model (the paper's notation).
A decoder is a value (``Speculative()``, ``BatchSpeculative(4)``, ...); ``decode``, ``exact``,
``decoding_statistics`` and ``accepted_length`` take any decoder.
"""

from specjax.models import MarkovChain
from specjax.models import paper_instance
from specjax.models import random_markov_chain
from specjax.models import AutoregressiveModel
from specjax.models import FiniteStateModel
from specjax.models import GreedyModel
from specjax.models import NGramModel
from specjax.models import greedy_draft
from specjax.decoders import AdaptiveSpeculative
from specjax.decoders import HeuristicSchedule
from specjax.decoders import Autoregressive
from specjax.decoders import ConfidenceThreshold
from specjax.decoders import DraftState
from specjax.decoders import EntropyThreshold
from specjax.decoders import FixedLength
from specjax.decoders import RejectionThreshold
from specjax.decoders import StoppingPolicy
from specjax.decoders import StoppingRule
from specjax.decoders import ThresholdTable
from specjax.decoders import BatchSpeculative
from specjax.decoders import BiasedSpeculative
from specjax.decoders import BlockVerification
from specjax.decoders import CallDecoder
from specjax.decoders import CallLaw
from specjax.decoders import Decoder
from specjax.decoders import DynamicTree
from specjax.decoders import GumbelList
from specjax.decoders import ImportanceWeighted
from specjax.decoders import KSequential
from specjax.decoders import OptimalMultiDraft
from specjax.decoders import RejectionRule
from specjax.decoders import SpecHub
from specjax.decoders import Speculative
from specjax.decoders import TokenTree
from specjax.decoders import LenientSpeculative
from specjax.decoders import ThresholdVerification
from specjax.decoders import TopKAcceptance
from specjax.decoders import TypicalAcceptance
from specjax.decoders import TokenwiseDecoder
from specjax.decoders import array_field
from specjax.decoders import decoder_dataclass
from specjax.decoders.verification import VerificationLaw
from specjax.decoders.verification import acceptance_probability
from specjax.decoders.multi_draft import batch_improvement
from specjax.decoders.multi_draft import batch_residual_mass
from specjax.decoders.multi_draft import optimal_acceptance
from specjax.decoders.verification import optimal_residual
from specjax.decoders.verification import rejection_probability
from specjax.decoders.verification import residual_distribution
from specjax.decoders.verification import speculative_residual
from specjax.decoders.verification import tv_distance
from specjax.decoders.verification import tv_loss_star
from specjax.decoders.verification import verification_law
from specjax.sampling import DecodingStatistics
from specjax.sampling import DecodingTrace
from specjax.sampling import autoregressive_decoding
from specjax.sampling import batch_speculative_decoding
from specjax.sampling import biased_speculative_decoding
from specjax.sampling import block_verification_decoding
from specjax.sampling import chain_sharding
from specjax.sampling import decode
from specjax.sampling import decoding_statistics
from specjax.sampling import rejection_decoding
from specjax.sampling import speculative_decoding
from specjax.theory import CostModel
from specjax.theory import OptimalStopping
from specjax.theory import optimal_stopping
from specjax.theory import OptimalRate
from specjax.theory import StationaryRate
from specjax.theory import optimal_rate
from specjax.theory import stationary_rate
from specjax.theory import DecodingTime
from specjax.theory import LookaheadChoice
from specjax.theory import TreeBudgetChoice
from specjax.theory import best_lookahead
from specjax.theory import best_tree_budget
from specjax.theory import decoding_time
from specjax.theory import expected_time
from specjax.theory import best_token_tree
from specjax.theory import positional_acceptance
from specjax.theory import SequoiaChoice
from specjax.theory import sequoia_hardware_tree
from specjax.theory import sequoia_tree
from specjax.theory import EngineMetrics
from specjax.theory import engine_metrics
from specjax.theory import ExactDecoding
from specjax.theory import ParetoFront
from specjax.theory import accepted_length
from specjax.theory import batch_expected_rejections
from specjax.theory import biased_output_chain
from specjax.theory import exact
from specjax.theory import exact_batch_speculative_decoding
from specjax.theory import exact_biased_speculative_decoding
from specjax.theory import exact_block_accepted_length
from specjax.theory import exact_block_expected_calls
from specjax.theory import exact_joint_accepted_length
from specjax.theory import exact_rejection_decoding
from specjax.theory import exact_speculative_decoding
from specjax.theory import exact_tokenwise_accepted_length
from specjax.theory import expected_calls
from specjax.theory import expected_rejections
from specjax.theory import marginals
from specjax.theory import output_chain
from specjax.theory import pareto_front
from specjax.theory import sequence_kl
from specjax.tuning import ContextFreeDraft
from specjax.tuning import DraftFamily
from specjax.tuning import FullDraft
from specjax.tuning import LowRankDraft
from specjax.tuning import Objective
from specjax.tuning import StationaryDraft
from specjax.tuning import TuneResult
from specjax.tuning import batch_rejections
from specjax.tuning import biased_tradeoff
from specjax.tuning import draft_family
from specjax.tuning import kl_divergence
from specjax.tuning import kl_fit
from specjax.tuning import make_objective
from specjax.tuning import objective
from specjax.tuning import sd_rejections
from specjax.tuning import target_calls
from specjax.tuning import tune_draft
from specjax.auditing import AuditReport
from specjax.auditing import audit
from specjax.auditing import audit_exact
from specjax.auditing import DraftsLaw
from specjax.auditing import EngineComparison
from specjax.auditing import Verified
from specjax.auditing import compare_outputs
from specjax.auditing import verify_drafts
from specjax.auditing import verify_drafts_law
from specjax.auditing import TreeLaw
from specjax.auditing import VerifiedTree
from specjax.auditing import verify_tree
from specjax.auditing import verify_tree_law
from specjax.models import ProcessedModel
from specjax.models import process_chain
from specjax.models import process_model
from specjax.models import PromptedModel
from specjax.models import with_prompt
from specjax.models import process_logits

__version__ = "0.2.0"

__all__ = [
    "CostModel",
    "OptimalStopping",
    "optimal_stopping",
    "OptimalRate",
    "StationaryRate",
    "optimal_rate",
    "stationary_rate",
    "DecodingTime",
    "LookaheadChoice",
    "TreeBudgetChoice",
    "best_lookahead",
    "best_tree_budget",
    "decoding_time",
    "expected_time",
    "best_token_tree",
    "positional_acceptance",
    "SequoiaChoice",
    "sequoia_hardware_tree",
    "sequoia_tree",
    "AdaptiveSpeculative",
    "HeuristicSchedule",
    "AuditReport",
    "Autoregressive",
    "ConfidenceThreshold",
    "DraftState",
    "EntropyThreshold",
    "FixedLength",
    "RejectionThreshold",
    "StoppingPolicy",
    "StoppingRule",
    "ThresholdTable",
    "AutoregressiveModel",
    "BatchSpeculative",
    "BiasedSpeculative",
    "BlockVerification",
    "CallDecoder",
    "CallLaw",
    "ContextFreeDraft",
    "Decoder",
    "DecodingStatistics",
    "DecodingTrace",
    "DraftFamily",
    "EngineMetrics",
    "engine_metrics",
    "ExactDecoding",
    "FiniteStateModel",
    "FullDraft",
    "GreedyModel",
    "DynamicTree",
    "GumbelList",
    "ImportanceWeighted",
    "KSequential",
    "LowRankDraft",
    "MarkovChain",
    "NGramModel",
    "Objective",
    "OptimalMultiDraft",
    "ParetoFront",
    "RejectionRule",
    "SpecHub",
    "Speculative",
    "TokenTree",
    "LenientSpeculative",
    "ThresholdVerification",
    "TopKAcceptance",
    "TypicalAcceptance",
    "StationaryDraft",
    "TokenwiseDecoder",
    "TuneResult",
    "VerificationLaw",
    "acceptance_probability",
    "accepted_length",
    "array_field",
    "audit",
    "audit_exact",
    "compare_outputs",
    "DraftsLaw",
    "EngineComparison",
    "process_chain",
    "process_model",
    "ProcessedModel",
    "PromptedModel",
    "with_prompt",
    "process_logits",
    "Verified",
    "verify_drafts",
    "verify_drafts_law",
    "TreeLaw",
    "VerifiedTree",
    "verify_tree",
    "verify_tree_law",
    "autoregressive_decoding",
    "batch_expected_rejections",
    "batch_improvement",
    "batch_rejections",
    "batch_residual_mass",
    "batch_speculative_decoding",
    "biased_output_chain",
    "biased_speculative_decoding",
    "biased_tradeoff",
    "block_verification_decoding",
    "chain_sharding",
    "decode",
    "decoder_dataclass",
    "decoding_statistics",
    "draft_family",
    "exact",
    "exact_batch_speculative_decoding",
    "exact_biased_speculative_decoding",
    "exact_block_accepted_length",
    "exact_block_expected_calls",
    "exact_joint_accepted_length",
    "exact_rejection_decoding",
    "exact_speculative_decoding",
    "exact_tokenwise_accepted_length",
    "expected_calls",
    "expected_rejections",
    "greedy_draft",
    "kl_divergence",
    "kl_fit",
    "make_objective",
    "marginals",
    "objective",
    "optimal_acceptance",
    "optimal_residual",
    "output_chain",
    "paper_instance",
    "pareto_front",
    "random_markov_chain",
    "rejection_decoding",
    "rejection_probability",
    "residual_distribution",
    "sd_rejections",
    "sequence_kl",
    "speculative_decoding",
    "speculative_residual",
    "target_calls",
    "tune_draft",
    "tv_distance",
    "tv_loss_star",
    "verification_law",
]
