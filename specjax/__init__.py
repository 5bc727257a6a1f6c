"""specjax: the theory and simulation of speculative decoding in JAX.

Convention throughout: ``p`` is the draft model, ``q`` the target model (the paper's notation).
"""

from specjax._engine import DecodingTrace
from specjax._models import MarkovChain
from specjax._models import paper_instance
from specjax._models import random_markov_chain
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
from specjax.samplers import autoregressive_decoding
from specjax.samplers import batch_speculative_decoding
from specjax.samplers import biased_speculative_decoding
from specjax.samplers import rejection_decoding
from specjax.samplers import speculative_decoding
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

__version__ = "0.1.0"

__all__ = [
    "DecodingTrace",
    "ExactDecoding",
    "MarkovChain",
    "ParetoFront",
    "VerificationLaw",
    "acceptance_probability",
    "autoregressive_decoding",
    "batch_expected_rejections",
    "batch_improvement",
    "batch_residual_mass",
    "batch_speculative_decoding",
    "biased_output_chain",
    "biased_speculative_decoding",
    "exact_batch_speculative_decoding",
    "exact_biased_speculative_decoding",
    "exact_rejection_decoding",
    "exact_speculative_decoding",
    "expected_calls",
    "expected_rejections",
    "marginals",
    "optimal_residual",
    "output_chain",
    "paper_instance",
    "pareto_front",
    "random_markov_chain",
    "rejection_decoding",
    "rejection_probability",
    "residual_distribution",
    "sequence_kl",
    "speculative_decoding",
    "tv_distance",
    "tv_loss_star",
    "verification_law",
]
