"""Autoregressive language models beyond Markov chains: the protocol every engine takes.

**The protocol.** A model is any JAX pytree (arrays as leaves, static settings as aux data) with

* ``num_states``: ``V``, the number of tokens (a Python int);
* ``init_state() -> state``: the context before ``x_0`` (a pytree of arrays);
* ``probs(state) -> (V,)``: the next-token probabilities in that context;
* ``update(state, token) -> state``: the context after emitting ``token`` (an int32 scalar).

``probs`` and ``update`` work on one context and must be traceable (``jit``/``vmap``-safe, no
Python branching on values); the engines ``vmap`` them over chains. Optional members:
``logits(state)`` instead of ``probs`` (the engines take its softmax, ``ProcessedModel``), and
``probs_block(state, tokens)`` (or ``logits_block``) scoring the ``K + 1`` contexts of a call in
one evaluation for ``decode(..., batched_scoring=True)`` (``probs_block`` below). A decoded sequence is
``x_0..x_T``: ``x_0`` (the prompt) is drawn from the *target*'s ``probs(init_state())``, as
``MarkovChain.init``, then ``x_1..x_T`` are decoded, and both draft and target update on every
emitted token. ``AutoregressiveModel`` is the protocol as a ``typing.Protocol`` (for type
checkers); ``specjax.models.base`` declares it as base classes, every member with its default,
and ``as_model`` reads a user's object against it (the one place that does).

**Models of the protocol**, each in its module (and importable from this one too):

* ``NGramModel`` (``specjax.models.ngram``): order ``n``, a ``(V**(n-1), V)`` table of
  next-token laws indexed by the last ``n - 1`` tokens; ``NGramModel.fit`` counts a corpus with
  additive smoothing and optional interpolation with lower orders.
* ``FiniteStateModel`` (``specjax.models.finite_state``): a model with ``S`` integer states,
  ``next_state (S, V)`` and rows ``table (S, V)``: the view the exact theory needs
  (``specjax.theory.finite_state``). ``NGramModel.as_finite_state`` lifts an n-gram to the
  ``V**L`` contexts of length ``L``, so a bigram draft and a 4-gram target share the 4-gram's
  state space; ``from_markov_chain`` lifts any ``MarkovChain``.
* ``GreedyModel`` and ``greedy_draft`` (``specjax.models.greedy``): the deterministic draft of
  any model.
* ``StaticLeaves`` and ``with_static_leaves`` (``specjax.models.static_leaves``): a model whose
  leaves that are not arrays travel through ``jit`` as static data.

This module also holds the checks the models share: ``MAX_TABLE_SIZE``, ``check_table_size``,
``check_order``.
"""

from __future__ import annotations

import numbers
from typing import Protocol
from typing import runtime_checkable

import jax

from specjax.models.base import ProtocolModel
from specjax.models.base import as_model
from specjax.models.base import model_view
from specjax.models.base import scan_rows  # noqa: F401 - served from here too

#: Largest table (``S * V`` entries, contexts times tokens) an n-gram or a lifted state space may
#: have: 2**26 entries is 256 MiB in float32, and keeps every index ``c V + x`` within int32.
MAX_TABLE_SIZE = 2**26


@runtime_checkable
class AutoregressiveModel(Protocol):
    """What the generic engines need of a model (see the module docstring).

    A structural type: any pytree with these four members qualifies, no inheritance needed.
    ``isinstance`` checks only that the members exist (a ``runtime_checkable`` protocol).
    """

    @property
    def num_states(self) -> int:
        """``V``, the number of tokens (static)."""

    def init_state(self):
        """The context before ``x_0`` (a pytree of arrays)."""

    def probs(self, state) -> jax.Array:
        """``(V,)`` next-token probabilities in ``state``."""

    def update(self, state, token):
        """The state after emitting ``token`` (an int32 scalar) in ``state``."""


def is_autoregressive_model(obj) -> bool:
    """True when ``obj`` is a model of the protocol with ``probs`` (``num_states``,
    ``init_state``, ``probs``, ``update``; ``specjax.models.base.model_view``); ``MarkovChain``,
    which keeps its own position-indexed fast path, is not. A model that gives ``logits`` alone
    is one after ``specjax.models.process_model``."""
    view = model_view(obj)
    return isinstance(view, ProtocolModel) and view.has_probs


def probs_block(model, state, tokens) -> jax.Array:
    """``(K + 1, V)``: the model's rows in ``state`` and after each prefix of ``tokens (K,)``.

    Row ``j`` is ``probs`` after ``tokens[:j]``: what a serving engine's target computes in one
    batched evaluation of the ``K`` drafted positions and the one after them. A model that can
    score a block at once defines ``probs_block(state, tokens)`` with that meaning (an optional
    member of the protocol; ``decode(..., batched_scoring=True)`` calls it once per call);
    otherwise the rows come from a scan of ``probs`` and ``update``
    (``specjax.models.base.ProtocolModel.probs_block``).
    """
    return as_model(model).probs_block(state, tokens)


def check_table_size(name: str, contexts: int, num_states: int) -> None:
    if contexts * num_states > MAX_TABLE_SIZE:
        raise ValueError(
            f"{name} gives {contexts} contexts x {num_states} tokens = "
            f"{contexts * num_states} entries, above MAX_TABLE_SIZE = 2**26")


def check_order(order) -> None:
    if isinstance(order, bool) or not isinstance(order, numbers.Integral) or order < 1:
        raise ValueError(f"order must be an integer >= 1, got {order!r}")


# The models of the protocol, served from here too (``from specjax.models.autoregressive import
# NGramModel``). Imported last: their modules import the protocol and the checks above, and
# ``specjax.models`` imports this module before them.
from specjax.models.finite_state import FiniteStateModel  # noqa: E402
from specjax.models.greedy import GreedyModel  # noqa: E402
from specjax.models.greedy import greedy_draft  # noqa: E402
from specjax.models.ngram import NGramModel  # noqa: E402
from specjax.models.ngram import ngram_counts  # noqa: E402
from specjax.models.static_leaves import StaticLeaves  # noqa: E402
from specjax.models.static_leaves import with_static_leaves  # noqa: E402

__all__ = [
    "AutoregressiveModel",
    "FiniteStateModel",
    "GreedyModel",
    "MAX_TABLE_SIZE",
    "NGramModel",
    "greedy_draft",
    "is_autoregressive_model",
    "ngram_counts",
]
