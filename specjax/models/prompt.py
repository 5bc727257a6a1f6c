"""A fixed prompt instead of a sampled first token: ``with_prompt``.

Every engine draws ``x_0`` from the target's ``probs(init_state())`` and updates both models with
it. A model conditioned on a prompt ``(y_1, ..., y_k)`` starts in the context after ``y_1..y_{k-1}``
and gives ``y_k`` probability one there, so ``x_0 = y_k`` in every chain and ``x_1..x_T`` continue
the whole prompt. Give the same prompt to the draft and the target.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specjax._pytree import array_field
from specjax._pytree import pytree_dataclass
from specjax.models.autoregressive import FiniteStateModel
from specjax.models.autoregressive import is_autoregressive_model
from specjax.models.logits import as_probability_model
from specjax.models.markov import MarkovChain


def _check_prompt(prompt, num_states: int) -> np.ndarray:
    if isinstance(prompt, jax.core.Tracer):
        raise ValueError("prompt must be concrete token ids (it fixes the models' start), got a "
                         "traced array")
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
class PromptedModel:
    """A protocol model after a fixed prompt (``with_prompt``): its state is ``(the model's
    state, whether x_0 was emitted)``; before ``x_0`` the row is the one-hot of the prompt's last
    token, after it the model's own.

    Attributes:
      model: the wrapped model (a pytree child).
      prompt: ``(k,)`` int32 token ids (a leaf).
    """

    model: Any = array_field()
    prompt: Any = array_field()

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

    * A ``MarkovChain`` gives a ``MarkovChain`` whose ``init`` is the one-hot of the last token
      (the earlier tokens do not change a Markov chain's law).
    * A ``FiniteStateModel`` gives a ``FiniteStateModel`` with one more state, the start, whose
      row is that one-hot and whose transitions are those of the state after
      ``prompt[:-1]``; the same prompt on two models that share their states keeps them shared,
      so the exact theory applies.
    * Any other protocol model (an ``NGramModel``, a neural model, one that gives logits) gives
      a ``PromptedModel``.

    Args:
      model: any model.
      prompt: a non-empty sequence of token ids in ``[0, V)`` (concrete), or one id.

    Returns:
      A model of the same kind where one exists, else a ``PromptedModel``.

    Raises:
      ValueError: not a model, or a bad prompt.

    Example:
      >>> import jax, specjax
      >>> draft, target = specjax.paper_instance()
      >>> d, t = specjax.with_prompt(draft, [3]), specjax.with_prompt(target, [3])
      >>> trace = specjax.decode(jax.random.key(0), specjax.Speculative(4), d, t, 100)
      >>> bool((trace.tokens[:, 0] == 3).all())
      True
    """
    if isinstance(model, MarkovChain):
        ids = _check_prompt(prompt, model.num_states)
        init = jax.nn.one_hot(int(ids[-1]), model.num_states, dtype=model.init.dtype)
        return MarkovChain(init=init, trans=model.trans)
    model = as_probability_model(model)
    if not is_autoregressive_model(model):
        raise ValueError(f"model must be a MarkovChain or a model of the protocol "
                         f"(num_states, init_state, probs or logits, update), got "
                         f"{type(model).__name__}")
    ids = _check_prompt(prompt, model.num_states)
    if isinstance(model, FiniteStateModel):
        next_state = np.asarray(model.next_state)
        state = model.start
        for token in ids[:-1]:
            state = int(next_state[state, token])
        row = jax.nn.one_hot(int(ids[-1]), model.num_states, dtype=model.table.dtype)
        return FiniteStateModel(
            start=model.num_contexts,
            next_state=jnp.concatenate([model.next_state, model.next_state[state][None]]),
            table=jnp.concatenate([model.table, row[None]]))
    return PromptedModel(model=model, prompt=jnp.asarray(ids))
