"""Models: Markov chains (the paper's setting) and any autoregressive model (n-grams, finite-state models, the protocol),
and history-dependent processing (penalties, grammar masks) as finite-state models."""

# The protocol's base classes first: every model's module imports them.
from specjax.models.base import Model
from specjax.models.base import ModelKind
from specjax.models.base import ProtocolModel
from specjax.models.base import as_model
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
from specjax.models.processing import Grammar
from specjax.models.processing import Penalties
from specjax.models.processing import apply_penalties
from specjax.models.processing import constrain
from specjax.models.processing import penalize
from specjax.models.prompt import PromptedModel
from specjax.models.prompt import with_prompt

__all__ = [
    "AutoregressiveModel",
    "FiniteStateModel",
    "GreedyModel",
    "Grammar",
    "MAX_TABLE_SIZE",
    "MarkovChain",
    "Model",
    "ModelKind",
    "NGramModel",
    "Penalties",
    "ProtocolModel",
    "apply_penalties",
    "as_model",
    "constrain",
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
    "penalize",
    "random_markov_chain",
    "with_prompt",
]
