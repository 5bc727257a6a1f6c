"""Models: Markov chains (the paper's setting) and any autoregressive model (n-grams, finite-state models, the protocol)."""

from specjax.models.markov import MarkovChain
from specjax.models.markov import paper_instance
from specjax.models.markov import random_markov_chain
# The protocol before the models of it: their modules import it (and it serves their names).
from specjax.models.autoregressive import AutoregressiveModel
from specjax.models.autoregressive import MAX_TABLE_SIZE
from specjax.models.autoregressive import is_autoregressive_model
from specjax.models.autoregressive import probs_block
from specjax.models.finite_state import FiniteStateModel
from specjax.models.greedy import GreedyModel
from specjax.models.greedy import greedy_draft
from specjax.models.ngram import NGramModel
from specjax.models.ngram import ngram_counts
from specjax.models.logits import ProcessedModel
from specjax.models.logits import process_chain
from specjax.models.logits import process_model
from specjax.models.logits import process_logits
from specjax.models.prompt import PromptedModel
from specjax.models.prompt import with_prompt

__all__ = [
    "AutoregressiveModel",
    "FiniteStateModel",
    "GreedyModel",
    "MAX_TABLE_SIZE",
    "MarkovChain",
    "NGramModel",
    "greedy_draft",
    "is_autoregressive_model",
    "ngram_counts",
    "probs_block",
    "process_chain",
    "process_logits",
    "process_model",
    "ProcessedModel",
    "PromptedModel",
    "paper_instance",
    "random_markov_chain",
    "with_prompt",
]
