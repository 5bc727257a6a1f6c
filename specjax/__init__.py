"""specjax: the theory and simulation of speculative decoding in JAX.

Convention throughout: ``p`` is the draft model, ``q`` the target model (the paper's notation).
"""

from specjax._engine import DecodingTrace
from specjax._models import MarkovChain
from specjax._models import paper_instance
from specjax._models import random_markov_chain
from specjax._sharding import chain_sharding
from specjax._verify import VerificationLaw
from specjax._verify import acceptance_probability
from specjax._verify import batch_improvement
from specjax._verify import batch_residual_mass
from specjax._verify import optimal_residual
from specjax._verify import rejection_probability
from specjax._verify import residual_distribution
from specjax._verify import tv_distance
from specjax._verify import tv_loss_star
from specjax._verify import verification_law
from specjax.auditing import AuditReport
from specjax.auditing import audit
from specjax.auditing import audit_exact
from specjax.block import block_verification_decoding
from specjax.block import exact_block_accepted_length
from specjax.block import exact_block_expected_calls
from specjax.block import exact_joint_accepted_length
from specjax.block import exact_tokenwise_accepted_length
from specjax.drafts import ContextFreeDraft
from specjax.drafts import DraftFamily
from specjax.drafts import FullDraft
from specjax.drafts import LowRankDraft
from specjax.drafts import StationaryDraft
from specjax.drafts import draft_family
from specjax.models import AutoregressiveModel
from specjax.models import FiniteStateModel
from specjax.models import GreedyModel
from specjax.models import NGramModel
from specjax.models import greedy_draft
from specjax.samplers import autoregressive_decoding
from specjax.samplers import batch_speculative_decoding
from specjax.samplers import biased_speculative_decoding
from specjax.samplers import rejection_decoding
from specjax.samplers import speculative_decoding
from specjax.statistics import DecodingStatistics
from specjax.statistics import decoding_statistics
from specjax.theory import ExactDecoding
from specjax.theory import ParetoFront
from specjax.theory import batch_expected_rejections
from specjax.theory import biased_output_chain
from specjax.theory import exact_batch_speculative_decoding
from specjax.theory import exact_biased_speculative_decoding
from specjax.theory import exact_rejection_decoding
from specjax.theory import exact_speculative_decoding
from specjax.theory import expected_calls
from specjax.theory import expected_rejections
from specjax.theory import marginals
from specjax.theory import output_chain
from specjax.theory import pareto_front
from specjax.theory import sequence_kl
from specjax.tuning import Objective
from specjax.tuning import TuneResult
from specjax.tuning import batch_rejections
from specjax.tuning import biased_tradeoff
from specjax.tuning import kl_divergence
from specjax.tuning import kl_fit
from specjax.tuning import make_objective
from specjax.tuning import sd_rejections
from specjax.tuning import target_calls
from specjax.tuning import tune_draft

__version__ = "0.1.0"

__all__ = [
    "AuditReport",
    "AutoregressiveModel",
    "ContextFreeDraft",
    "DecodingStatistics",
    "DecodingTrace",
    "DraftFamily",
    "ExactDecoding",
    "FiniteStateModel",
    "FullDraft",
    "GreedyModel",
    "LowRankDraft",
    "MarkovChain",
    "NGramModel",
    "Objective",
    "ParetoFront",
    "StationaryDraft",
    "TuneResult",
    "VerificationLaw",
    "acceptance_probability",
    "audit",
    "audit_exact",
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
    "decoding_statistics",
    "draft_family",
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
    "target_calls",
    "tune_draft",
    "tv_distance",
    "tv_loss_star",
    "verification_law",
]
