"""A fixed prompt instead of a sampled first token: ``with_prompt``.

Every engine draws ``x_0`` from the target's ``probs(init_state())`` and updates both models with
it. A model conditioned on a prompt ``(y_1, ..., y_k)`` starts in the context after ``y_1..y_{k-1}``
and gives ``y_k`` probability one there, so ``x_0 = y_k`` in every chain and ``x_1..x_T`` continue
the whole prompt. Give the same prompt to the draft and the target.
"""

from __future__ import annotations

from typing import Any
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from specjax._pytree import array_field
from specjax._pytree import pytree_dataclass
from specjax.models.autoregressive import is_autoregressive_model
from specjax.models.base import ModelKind
from specjax.models.base import ProtocolModel
from specjax.models.finite_state import FiniteStateModel
from specjax.models.logits import as_probability_model
from specjax.models.markov import MarkovChain

__all__ = ["PromptedModel", "with_prompt"]


def _check_prompt(prompt, num_states: int) -> np.ndarray:
    if any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(prompt)):
        raise ValueError("prompt must be concrete token ids (it fixes the models' start), got a "
                         "traced value")
    ids = np.asarray(prompt)
    if ids.ndim == 0:
        ids = ids[None]
    if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"prompt must be a non-empty sequence of token ids, got {prompt!r}")
    if int(ids.min()) < 0 or int(ids.max()) >= num_states:
        raise ValueError(f"prompt must hold ids in [0, V) = [0, {num_states}), got "
                         f"{ids.tolist()}")
    return ids.astype(np.int32)


@pytree_dataclass(init_on_unflatten=False)
class PromptedModel(ProtocolModel):
    """A protocol model after a fixed prompt (``with_prompt``): its state is ``(the model's
    state, whether x_0 was emitted)``; before ``x_0`` the row is the one-hot of the prompt's last
    token, after it the model's own.

    Attributes:
      model: the wrapped model (a pytree child).
      prompt: ``(k,)`` int32 token ids (a leaf).
    """

    kind: ClassVar[ModelKind] = ModelKind.PROTOCOL

    model: Any = array_field()
    prompt: Any = array_field()

    def __post_init__(self):
        if not is_autoregressive_model(self.model):
            raise ValueError(f"model must be a model of the protocol, got "
                             f"{type(self.model).__name__}")
        object.__setattr__(self, "prompt",
                           jnp.asarray(_check_prompt(self.prompt, self.model.num_states)))

    @property
    def num_states(self) -> int:
        return self.model.num_states

    def init_state(self):
        def step(state, token):
            return self.model.update(state, token), None

        state, _ = jax.lax.scan(step, self.model.init_state(), self.prompt[:-1])
        return state, jnp.asarray(False)

    def probs(self, state):
        inner, started = state
        row = self.model.probs(inner)
        first = jax.nn.one_hot(self.prompt[-1], self.num_states, dtype=row.dtype)
        return jnp.where(started, row, first)

    def update(self, state, token):
        inner, _ = state
        return self.model.update(inner, token), jnp.asarray(True)


def with_prompt(model, prompt):
    """``model`` conditioned on a fixed ``prompt``: every chain starts with ``x_0 = prompt[-1]``
    in the context of the whole prompt.

    * A ``MarkovChain`` gives a ``MarkovChain`` whose ``init`` is the one-hot of the last token.
      Its positions still count from ``x_0``: ``x_1`` follows ``trans[0]``, and the earlier
      prompt tokens are ignored (a Markov chain's next token depends on the last one only).
    * A ``FiniteStateModel`` gives a ``FiniteStateModel`` with one more state, the start, whose
      row is that one-hot and whose transitions are those of the state after
      ``prompt[:-1]``; the same prompt on two models that share their states keeps them shared,
      so the exact theory applies. The prompt moves the model through its states: the
      position-indexed lift of a Markov chain (``from_markov_chain``) goes one layer per prompt
      token, so after a prompt of ``k`` tokens ``x_1`` follows ``trans[k - 1]``, not
      ``trans[0]`` as the prompted ``MarkovChain`` does (the two agree for one token, and for a
      stationary chain).
    * Any other protocol model (an ``NGramModel``, a neural model, one that gives logits) gives
      a ``PromptedModel``.

    Args:
      model: any model.
      prompt: a non-empty sequence of token ids in ``[0, V)`` (concrete: it fixes the start),
        or one id. The models may be traced.

    Returns:
      A model of the same kind where one exists, else a ``PromptedModel``.

    Raises:
      ValueError: not a model, or a bad prompt.

    Example:
      >>> import jax, specjax
      >>> draft, target = specjax.paper_instance()
      >>> d, t = specjax.models.with_prompt(draft, [3]), specjax.models.with_prompt(target, [3])
      >>> trace = specjax.decode(jax.random.key(0), specjax.Speculative(4), d, t, 100)
      >>> bool((trace.tokens[:, 0] == 3).all())
      True
    """
    if isinstance(model, MarkovChain):
        ids = _check_prompt(prompt, model.num_states)
        init = jax.nn.one_hot(int(ids[-1]), model.num_states, dtype=model.init.dtype)
        init = jnp.broadcast_to(init, model.init.shape)  # a batch of chains too
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(model),
                                            [init, model.trans])
    model = as_probability_model(model)
    if not is_autoregressive_model(model):
        raise ValueError(f"model must be a MarkovChain or a model of the protocol "
                         f"(num_states, init_state, probs or logits, update), got "
                         f"{type(model).__name__}")
    ids = _check_prompt(prompt, model.num_states)
    if isinstance(model, FiniteStateModel):
        state = model.start  # traced once the walk starts under jit: jnp indexing
        for token in ids[:-1]:
            state = model.next_state[state, int(token)]
        row = jax.nn.one_hot(int(ids[-1]), model.num_states, dtype=model.table.dtype)
        return FiniteStateModel(
            start=model.num_contexts,
            next_state=jnp.concatenate([model.next_state, model.next_state[state][None]]),
            table=jnp.concatenate([model.table, row[None]]))
    return PromptedModel(model=model, prompt=jnp.asarray(ids))
