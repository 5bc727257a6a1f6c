"""Models with static leaves: ``StaticLeaves`` carries a protocol model's leaves that are not
arrays (an equinox module's activation function, say) as static data so that ``jit`` takes the
model; ``with_static_leaves`` wraps a model only when it needs it.
"""

from __future__ import annotations

import numbers
from typing import ClassVar

import jax
import numpy as np

from specjax.models.autoregressive import is_autoregressive_model
from specjax.models.autoregressive import probs_block
from specjax.models.base import ModelKind
from specjax.models.base import ProtocolModel
from specjax.models.markov import MarkovChain


def _traceable(leaf) -> bool:
    """Whether ``jit`` can take ``leaf`` as an argument: an array or a number."""
    return isinstance(leaf, (jax.Array, np.ndarray, np.generic, numbers.Number))


@jax.tree_util.register_pytree_node_class
class StaticLeaves(ProtocolModel):
    """A protocol model whose leaves that are not arrays (an equinox module's activation
    function, say) travel as static data, so the engines can pass it through ``jit``.

    ``with_static_leaves`` builds it; ``decode`` and ``decoding_statistics`` apply it to every
    model. The arrays stay leaves (traced, differentiable); the other leaves are part of the
    compiled program, compared by equality (functions by identity).

    Attributes:
      model: the wrapped model, rebuilt from its arrays and static leaves.
    """

    kind: ClassVar[ModelKind] = ModelKind.PROTOCOL

    def __init__(self, model):
        leaves, treedef = jax.tree_util.tree_flatten(model)
        mask = tuple(_traceable(leaf) for leaf in leaves)
        self._arrays = [leaf for leaf, keep in zip(leaves, mask) if keep]
        self._static = (treedef, mask, tuple(leaf for leaf, keep in zip(leaves, mask)
                                             if not keep))

    def tree_flatten(self):
        return self._arrays, self._static

    @classmethod
    def tree_unflatten(cls, static, arrays):
        obj = object.__new__(cls)
        obj._arrays, obj._static = list(arrays), static
        return obj

    @property
    def model(self):
        treedef, mask, others = self._static
        arrays, others = iter(self._arrays), iter(others)
        return jax.tree_util.tree_unflatten(
            treedef, [next(arrays) if keep else next(others) for keep in mask])

    @property
    def num_states(self) -> int:
        return self.model.num_states

    def init_state(self):
        return self.model.init_state()

    def probs(self, state):
        return self.model.probs(state)

    def update(self, state, token):
        return self.model.update(state, token)

    def probs_block(self, state, tokens):
        return probs_block(self.model, state, tokens)

    def __repr__(self) -> str:
        return f"StaticLeaves({self.model!r})"


def with_static_leaves(model):
    """``model`` as ``StaticLeaves`` when some of its leaves are not arrays or numbers (which
    ``jit`` cannot take as arguments); any other value unchanged."""
    if isinstance(model, (MarkovChain, StaticLeaves)) or not is_autoregressive_model(model):
        return model
    leaves = jax.tree_util.tree_leaves(model)
    if any(leaf is model for leaf in leaves) or all(_traceable(leaf) for leaf in leaves):
        return model
    return StaticLeaves(model)


__all__ = ["StaticLeaves", "with_static_leaves"]
