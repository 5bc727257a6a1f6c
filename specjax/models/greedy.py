"""Greedy drafts: ``greedy_draft``, the deterministic draft of any model (one-hot at its most
likely next token), and ``GreedyModel``, the wrapper it builds for a protocol model that has no
table of its own.
"""

from __future__ import annotations

from typing import ClassVar

import jax

from specjax._pytree import array_field
from specjax._pytree import pytree_dataclass
from specjax.models.autoregressive import is_autoregressive_model
from specjax.models.base import ModelKind
from specjax.models.base import ProtocolModel
from specjax.models.finite_state import FiniteStateModel
from specjax.models.markov import MarkovChain
from specjax.models.markov import greedy_chain as _greedy_chain
from specjax.models.markov import one_hot_argmax
from specjax.models.ngram import NGramModel


@pytree_dataclass(init_on_unflatten=False)
class GreedyModel(ProtocolModel):
    """Any protocol model made deterministic: ``probs`` is one-hot at the wrapped model's argmax
    (ties to the lowest index); states and updates are the wrapped model's.

    A frozen dataclass and a pytree whose child is the wrapped model (its leaves are this
    model's leaves)."""

    kind: ClassVar[ModelKind] = ModelKind.PROTOCOL

    model: object = array_field()

    def __post_init__(self):
        if not is_autoregressive_model(self.model):
            raise ValueError(f"model must be an autoregressive model, got "
                             f"{type(self.model).__name__}")

    @property
    def num_states(self) -> int:
        return self.model.num_states

    def init_state(self):
        return self.model.init_state()

    def probs(self, state) -> jax.Array:
        return one_hot_argmax(self.model.probs(state))

    def update(self, state, token):
        return self.model.update(state, token)


def greedy_draft(model):
    """The deterministic (greedy) draft of any model: one-hot at its most likely next token.

    Greedy drafting and n-gram lookup (vLLM's ngram drafting) propose one token with certainty;
    SD's rule then accepts it with probability ``q(x)`` and otherwise resamples from ``q`` with
    ``x`` removed, which is exactly unbiased. The result is a model of the same kind, so every
    sampler takes it as a draft and the exact functions give its costs:

    * ``MarkovChain``: one-hot transition rows (``init`` kept; decoding never uses it);
    * ``NGramModel`` / ``FiniteStateModel``: one-hot tables, same contexts and transitions;
    * any other protocol model: a ``GreedyModel`` wrapper.

    Ties go to the lowest token index. Not differentiable in ``model`` (an argmax).

    Args:
      model: the draft model whose argmax is drafted.

    Returns:
      The deterministic draft model.

    Raises:
      ValueError: ``model`` is neither a ``MarkovChain`` nor a protocol model.
    """
    if isinstance(model, MarkovChain):
        return _greedy_chain(model)
    if isinstance(model, NGramModel):
        return NGramModel(one_hot_argmax(model.table), model.order)
    if isinstance(model, FiniteStateModel):
        return FiniteStateModel(model.start, model.next_state, one_hot_argmax(model.table))
    if is_autoregressive_model(model):
        return GreedyModel(model)
    raise ValueError(f"model must be a specjax.MarkovChain or an autoregressive model, got "
                     f"{type(model).__name__}")


__all__ = ["GreedyModel", "greedy_draft"]
