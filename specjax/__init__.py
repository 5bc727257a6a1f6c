"""specjax: the theory and simulation of speculative decoding in JAX.

Convention throughout: ``p`` is the draft model, ``q`` the target model (the paper's notation).
"""

from specjax._engine import DecodingTrace
from specjax._models import MarkovChain
from specjax._models import paper_instance
from specjax._models import random_markov_chain
from specjax._verify import VerificationLaw
from specjax._verify import acceptance_probability
from specjax._verify import optimal_residual
from specjax._verify import residual_distribution
from specjax._verify import verification_law
from specjax.samplers import autoregressive_decoding
from specjax.samplers import batch_speculative_decoding
from specjax.samplers import biased_speculative_decoding
from specjax.samplers import rejection_decoding
from specjax.samplers import speculative_decoding

__version__ = "0.1.0"

__all__ = [
    "DecodingTrace",
    "MarkovChain",
    "VerificationLaw",
    "acceptance_probability",
    "autoregressive_decoding",
    "batch_speculative_decoding",
    "biased_speculative_decoding",
    "optimal_residual",
    "paper_instance",
    "random_markov_chain",
    "rejection_decoding",
    "residual_distribution",
    "speculative_decoding",
    "verification_law",
]
