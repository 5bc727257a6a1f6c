"""Finite-state models: ``FiniteStateModel``, ``S`` integer states with a transition table and a
next-token law per state (the view the exact theory needs; n-grams and Markov chains lift to it).
"""

from __future__ import annotations

import numbers
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax._pytree import array_field
from specjax._pytree import pytree_dataclass
from specjax.models.autoregressive import check_table_size
from specjax.models.base import ModelKind
from specjax.models.base import ProtocolModel
from specjax.models.markov import MarkovChain
from specjax.models.markov import check_chain


@pytree_dataclass(init_on_unflatten=False)
class FiniteStateModel(ProtocolModel):
    """A model with ``S`` integer states: ``x ~ table[s]``, then ``s <- next_state[s, x]``.

    The exact theory needs this view (``specjax.theory.finite_state`` propagates the law of the state). The
    fields are named ``start`` and ``table`` because ``init_state()`` and ``probs(state)`` are
    the protocol's methods.

    Attributes:
      start: the state before ``x_0`` (a Python int: static aux data of the pytree).
      next_state: ``(S, V)`` int32 in ``[0, S)``.
      table: ``(S, V)`` next-token laws.

    ``next_state`` is an integer leaf: differentiate with respect to ``table`` (e.g. through
    ``NGramModel.as_finite_state`` or by rebuilding the model from a table), or pass
    ``allow_int=True`` to ``jax.grad``. A frozen dataclass and a pytree
    (``specjax._pytree.pytree_dataclass``); construction validates (values when concrete),
    unflattening does not.
    """

    kind: ClassVar[ModelKind] = ModelKind.FINITE_STATE

    start: int
    next_state: jax.Array = array_field()
    table: jax.Array = array_field()

    def __post_init__(self):
        start = self.start
        table = _checks.device_array(self.table)
        next_state = _checks.device_array(self.next_state)
        if table.ndim != 2 or table.shape[0] < 1 or table.shape[1] < 1:
            raise ValueError(f"table must have shape (S, V), got shape {table.shape}")
        if next_state.shape != table.shape:
            raise ValueError(f"next_state must have the shape (S, V) = {table.shape} of table, "
                             f"got shape {next_state.shape}")
        if not jnp.issubdtype(next_state.dtype, jnp.integer):
            raise ValueError(f"next_state must hold integers, got dtype {next_state.dtype}")
        num_contexts = table.shape[0]
        if isinstance(start, bool) or not isinstance(start, numbers.Integral) \
                or not 0 <= start < num_contexts:
            raise ValueError(f"start must be an integer state in [0, {num_contexts}), got "
                             f"{start!r}")
        if _checks.is_concrete(next_state) and next_state.size:
            # On the host (NumPy): no program compiled for the check, and a concrete array
            # closed over by a jitted function is checked there too (jnp's min would be traced).
            states = np.asarray(next_state)
            low, high = int(states.min()), int(states.max())
            if low < 0 or high >= num_contexts:
                raise ValueError(f"next_state must hold states in [0, {num_contexts}), got "
                                 f"values in [{low}, {high}]")
        if not jnp.issubdtype(table.dtype, jnp.floating):
            table = table.astype(jnp.result_type(float))
        _checks.check_probabilities("table", table)
        object.__setattr__(self, "start", int(start))
        object.__setattr__(self, "next_state", next_state.astype(jnp.int32))
        object.__setattr__(self, "table", table)

    @property
    def num_states(self) -> int:
        """``V``."""
        return self.table.shape[-1]

    @property
    def num_contexts(self) -> int:
        """``S``."""
        return self.table.shape[-2]

    @property
    def dtype(self):
        """The dtype of the probabilities (``table``'s)."""
        return self.table.dtype

    def init_state(self) -> jax.Array:
        return jnp.asarray(self.start, jnp.int32)

    def probs(self, state) -> jax.Array:
        return self.table[state]

    def update(self, state, token) -> jax.Array:
        return self.next_state[state, token]

    @classmethod
    def from_markov_chain(cls, chain: MarkovChain, *, stationary: bool = False
                          ) -> "FiniteStateModel":
        """Lifts a ``MarkovChain`` (horizon ``T``) to ``S = 1 + T V`` states.

        State 0 is the start (row ``init``); the state after ``x_n = a`` is ``1 + n V + a`` with
        row ``trans[n, a]`` for ``n = 0..T-1``. After ``x_T`` the chain stays on its last layer
        (it would go on with ``trans[T-1]``), so the states exist for any horizon; decoding
        ``T`` tokens reproduces the chain exactly. With ``stationary=True`` only ``trans[0]`` is
        kept (``S = V + 1``; the chain must be stationary, checked when concrete): the same law
        on a state space that does not grow with ``T``.

        Args:
          chain: a single ``MarkovChain``.
          stationary: lift a stationary chain to ``V + 1`` states.

        Returns:
          ``FiniteStateModel`` with start 0.
        """
        check_chain("chain", chain)
        trans = chain.trans
        if stationary:
            values = np.asarray(trans) if _checks.is_concrete(trans) else None
            if values is not None and not np.all(values == values[:1]):
                raise ValueError("stationary=True needs a chain whose trans[n] are all equal")
            trans = trans[:1]
        layers, v = trans.shape[0], chain.num_states
        check_table_size("chain", 1 + layers * v, v)
        layer = np.minimum(np.arange(1, layers + 1), layers - 1)  # layer after layer n
        next_state = np.concatenate([
            (1 + np.arange(v))[None, :],
            (1 + (layer * v)[:, None, None] + np.zeros((1, v, 1), np.int64)
             + np.arange(v)[None, None, :]).reshape(layers * v, v),
        ]).astype(np.int32)
        table = jnp.concatenate([chain.init[None], trans.reshape(layers * v, v)])
        return cls(0, next_state, table)

    def __repr__(self) -> str:
        return (f"FiniteStateModel(S={self.num_contexts}, V={self.num_states}, "
                f"start={self.start}, dtype={self.table.dtype})")


__all__ = ["FiniteStateModel"]
