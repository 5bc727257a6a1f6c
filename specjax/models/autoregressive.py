"""Autoregressive language models beyond Markov chains: the protocol, n-grams, finite-state models.

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
emitted token. ``AutoregressiveModel`` is the protocol as a ``typing.Protocol``.

**Models here.**

* ``NGramModel``: order ``n``, a ``(V**(n-1), V)`` table of next-token laws indexed by the last
  ``n - 1`` tokens; ``NGramModel.fit`` counts a corpus with additive smoothing and optional
  interpolation with lower orders.
* ``FiniteStateModel``: a model with ``S`` integer states, ``next_state (S, V)`` and rows
  ``table (S, V)``: the view the exact theory needs (``specjax.theory.finite_state``).
  ``NGramModel.as_finite_state`` lifts an n-gram to the ``V**L`` contexts of length ``L``, so a
  bigram draft and a 4-gram target share the 4-gram's state space; ``from_markov_chain`` lifts any
  ``MarkovChain``.

**Start-of-sequence convention (n-grams).** Contexts before the start are padded with token 0:
the context of ``x_0`` is ``(0, ..., 0)``, of ``x_1`` is ``(0, ..., 0, x_0)``, and ``fit`` counts
the corpus the same way. Every context is then a real ``(n - 1)``-tuple of tokens, so the
contexts are exactly ``V**(n-1)`` (and lifted states exactly ``V**L``), with no reserved index.
To keep the start apart from the text, reserve token 0 for it (a token the corpus never emits
otherwise: smoothing gives it a small probability, interpolation without smoothing none).

Context index: the last ``k`` tokens ``(y_1, ..., y_k)`` (oldest first) are the integer
``sum_i y_i V**(k - i)``, the newest token least significant, so ``update`` is
``(c mod V**(k-1)) V + x`` and the order-``j`` context of a longer one is ``c mod V**(j-1)``.
"""

from __future__ import annotations

import numbers
from typing import Protocol
from typing import runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax._pytree import array_field
from specjax._pytree import pytree_dataclass
from specjax.models.markov import MarkovChain
from specjax.models.markov import check_chain
from specjax.models.markov import greedy_chain as _greedy_chain
from specjax.models.markov import one_hot_argmax

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
    """True when ``obj`` has the protocol's members (``num_states``, ``init_state``, ``probs``,
    ``update``); ``MarkovChain``, which keeps its own position-indexed fast path, has not."""
    return isinstance(obj, AutoregressiveModel) and not isinstance(obj, type) and all(
        callable(getattr(obj, name)) for name in ("init_state", "probs", "update"))


def probs_block(model, state, tokens) -> jax.Array:
    """``(K + 1, V)``: the model's rows in ``state`` and after each prefix of ``tokens (K,)``.

    Row ``j`` is ``probs`` after ``tokens[:j]``: what a serving engine's target computes in one
    batched evaluation of the ``K`` drafted positions and the one after them. A model that can
    score a block at once defines ``probs_block(state, tokens)`` with that meaning (an optional
    member of the protocol; ``decode(..., batched_scoring=True)`` calls it once per call);
    otherwise the rows come from a scan of ``probs`` and ``update``.
    """
    own = getattr(model, "probs_block", None)
    if callable(own):
        return own(state, tokens)
    return scan_rows(model.probs, model.update, state, tokens)


def scan_rows(row, update, state, tokens) -> jax.Array:
    """``(K + 1, ...)``: ``row(state)`` after each prefix of ``tokens``, one position at a time."""

    def step(s, x):
        return update(s, x), row(s)

    last, rows = jax.lax.scan(step, state, tokens)
    return jnp.concatenate([rows, row(last)[None]], axis=0)


def _float_dtype(dtype):
    return jnp.result_type(float) if dtype is None else jnp.dtype(dtype)


def _check_table_size(name: str, contexts: int, num_states: int) -> None:
    if contexts * num_states > MAX_TABLE_SIZE:
        raise ValueError(
            f"{name} gives {contexts} contexts x {num_states} tokens = "
            f"{contexts * num_states} entries, above MAX_TABLE_SIZE = 2**26")


def _check_order(order) -> None:
    if isinstance(order, bool) or not isinstance(order, numbers.Integral) or order < 1:
        raise ValueError(f"order must be an integer >= 1, got {order!r}")


# ----------------------------------------------------------------------------------- n-grams


def _shift(state, token, num_states: int, context_length: int):
    """The index of the last ``context_length`` tokens after appending ``token``."""
    if context_length == 0:
        return jnp.zeros_like(state)
    keep = num_states ** (context_length - 1)
    return (state % keep) * num_states + jnp.asarray(token, jnp.int32)


@pytree_dataclass(init_on_unflatten=False)
class NGramModel:
    """An n-gram: ``P(x_t | x_{t-n+1}, ..., x_{t-1})`` from a table over the ``V**(n-1)`` contexts.

    The state is the int32 index of the last ``n - 1`` tokens (newest least significant, padded
    with token 0 before the start; see the module docstring). Order 1 is a unigram (one context).

    Attributes:
      table: ``(V**(n-1), V)``; ``table[c]`` is the next-token law in context ``c`` (a leaf).
      order: ``n`` (static: aux data of the pytree).

    A frozen dataclass and a pytree (``specjax._pytree.pytree_dataclass``); construction
    validates (values when concrete), unflattening does not (gradients, placeholders).

    Example:
      >>> import numpy as np, specjax.models as models
      >>> lm = models.NGramModel.fit([np.array([1, 2, 1, 2, 1])], order=2, num_states=3,
      ...                            smoothing=0.0)
      >>> [float(v) for v in lm.probs(lm.update(lm.init_state(), 1))]  # 2 always follows 1
      [0.0, 0.0, 1.0]
      >>> lm.as_finite_state(2).num_contexts  # the contexts of the last two tokens
      9
    """

    table: jax.Array = array_field()
    order: int

    def __post_init__(self):
        order = self.order
        _check_order(order)
        table = jnp.asarray(self.table)
        if table.ndim != 2 or table.shape[1] < 1:
            raise ValueError(f"table must have shape (V**(order-1), V), got shape {table.shape}")
        num_states = table.shape[1]
        contexts = num_states ** (order - 1)
        _check_table_size("order", contexts, num_states)
        if table.shape[0] != contexts:
            raise ValueError(
                f"table must have V**(order-1) = {contexts} rows for order {order} and "
                f"V = {num_states}, got shape {table.shape}")
        if not jnp.issubdtype(table.dtype, jnp.floating):
            table = table.astype(jnp.result_type(float))
        _checks.check_probabilities("table", table)
        object.__setattr__(self, "table", table)
        object.__setattr__(self, "order", int(order))

    @property
    def num_states(self) -> int:
        """``V``."""
        return self.table.shape[-1]

    @property
    def num_contexts(self) -> int:
        """``V**(n-1)``."""
        return self.table.shape[-2]

    def init_state(self) -> jax.Array:
        """Context 0: ``n - 1`` padding tokens 0."""
        return jnp.zeros((), jnp.int32)

    def probs(self, state) -> jax.Array:
        """``(V,)``: the row of context ``state``."""
        return self.table[state]

    def update(self, state, token) -> jax.Array:
        """Drops the oldest token of the context and appends ``token``."""
        return _shift(state, token, self.num_states, self.order - 1)

    @classmethod
    def fit(cls, sequences, *, order: int, num_states: int, smoothing=1.0, backoff=None,
            dtype=None) -> "NGramModel":
        """Estimates an n-gram from integer token sequences (NumPy counting, float64 arithmetic).

        Each sequence ``y_0..y_L`` counts ``L + 1`` events ``(context of y_t, y_t)``, the
        contexts padded with token 0 before the start, as the model generates them.

        * ``backoff=None`` (additive, Lidstone): ``P(x | c) = (N(c, x) + a) / (N(c) + a V)`` with
          ``a = smoothing``; ``a = 1`` is Laplace, ``a = 0`` maximum likelihood. A context with
          no count and ``a = 0`` gets the uniform law (a convention: rows are always laws).
        * ``backoff=beta > 0`` (interpolation): the unigram is additive as above, and each order
          ``k = 2..n`` shrinks towards the order below,
          ``P_k(x | c) = (N(c, x) + beta P_{k-1}(x | c')) / (N(c) + beta)`` with ``c'`` the
          ``k - 2`` newest tokens of ``c``: a convex combination of the counts and the lower
          order with weight ``N(c) / (N(c) + beta)`` on the counts (Witten-Bell style with a
          constant ``beta``; a hierarchical Dirichlet prior's posterior mean). Every row is a
          proper law; with ``smoothing > 0`` no entry is zero, and an unseen context gets the
          lower order's row exactly.

        Args:
          sequences: a list of 1-D integer arrays (or a 2-D integer array, one sequence a row)
            with tokens in ``[0, V)``.
          order: ``n >= 1``.
          num_states: ``V``.
          smoothing: the additive pseudo-count ``a >= 0``.
          backoff: ``None`` or the interpolation strength ``beta > 0``.
          dtype: the table's float dtype (default: float64 under ``jax_enable_x64``, else
            float32).

        Returns:
          ``NGramModel``.
        """
        counts = ngram_counts(sequences, order=order, num_states=num_states)
        smoothing = _checks.check_finite_non_negative("smoothing", smoothing)
        if backoff is not None:
            beta = _checks.check_finite_non_negative("backoff", backoff)
            if beta <= 0:
                raise ValueError(f"backoff must be None or a positive number, got {backoff!r}")
        if backoff is None:
            table = _additive(counts, smoothing)
        else:
            table = _additive(counts.reshape(-1, 1, num_states).sum(0), smoothing)
            for k in range(2, order + 1):
                counts_k = counts.reshape(-1, num_states ** (k - 1), num_states).sum(0)
                lower = np.tile(table, (num_states, 1))  # context c -> c mod V**(k-2)
                totals = counts_k.sum(-1, keepdims=True)
                table = (counts_k + beta * lower) / (totals + beta)
        return cls(jnp.asarray(table, _float_dtype(dtype)), order)

    def as_finite_state(self, context_length: int | None = None) -> "FiniteStateModel":
        """The same model on the ``S = V**L`` contexts of the last ``L`` tokens.

        ``L >= n - 1``: the n-gram reads the ``n - 1`` newest tokens of the lifted context, so a
        bigram draft and a 4-gram target lifted to ``L = 3`` share one state space (identical
        ``next_state`` and start), as the exact theory needs. The rows are gathered from
        ``table`` (differentiable in it).

        Args:
          context_length: ``L`` (default ``n - 1``).

        Returns:
          ``FiniteStateModel`` with start 0 (the all-padding context).

        Raises:
          ValueError: ``L < n - 1``, or ``S V`` above ``MAX_TABLE_SIZE``.
        """
        length = self.order - 1 if context_length is None else context_length
        if isinstance(length, bool) or not isinstance(length, numbers.Integral) \
                or length < self.order - 1:
            raise ValueError(f"context_length must be an integer >= order - 1 = "
                             f"{self.order - 1}, got {context_length!r}")
        v = self.num_states
        _check_table_size("context_length", v ** length, v)
        states = np.arange(v ** length, dtype=np.int64)
        tokens = np.arange(v, dtype=np.int64)
        if length == 0:
            next_state = np.zeros((1, v), np.int64)
        else:
            next_state = (states % v ** (length - 1))[:, None] * v + tokens
        rows = states % v ** (self.order - 1)
        return FiniteStateModel(0, next_state.astype(np.int32), self.table[rows])

    def __repr__(self) -> str:
        return f"NGramModel(order={self.order}, V={self.num_states}, dtype={self.table.dtype})"


def _additive(counts: np.ndarray, smoothing: float) -> np.ndarray:
    """``(N(c, x) + a) / (N(c) + a V)``; uniform where that is ``0 / 0``."""
    num = counts + smoothing
    den = num.sum(-1, keepdims=True)
    uniform = np.full_like(num, 1.0 / counts.shape[-1])
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), uniform)


def ngram_counts(sequences, *, order: int, num_states: int) -> np.ndarray:
    """``N(c, x)``: how often token ``x`` follows context ``c`` (padded with token 0).

    Args:
      sequences: a list of 1-D integer arrays (or a 2-D integer array) with tokens in ``[0, V)``.
      order: ``n >= 1``.
      num_states: ``V``.

    Returns:
      ``(V**(n-1), V)`` int64 counts.
    """
    _check_order(order)
    _checks.check_positive_int("num_states", num_states)
    _check_table_size("order", num_states ** (order - 1), num_states)
    if isinstance(sequences, (np.ndarray, jax.Array)):
        sequences = [sequences] if np.ndim(sequences) == 1 else list(sequences)
    counts = np.zeros(num_states ** order, np.int64)
    for i, seq in enumerate(sequences):
        seq = np.asarray(seq)
        if seq.ndim != 1 or not (np.issubdtype(seq.dtype, np.integer) or seq.size == 0):
            raise ValueError(f"sequences must be 1-D integer arrays; sequence {i} has dtype "
                             f"{seq.dtype} and shape {seq.shape}")
        seq = seq.astype(np.int64)
        if seq.size and (seq.min() < 0 or seq.max() >= num_states):
            raise ValueError(f"sequences must hold tokens in [0, {num_states}); sequence {i} "
                             f"has tokens in [{seq.min()}, {seq.max()}]")
        padded = np.concatenate([np.zeros(order - 1, np.int64), seq])
        codes = np.zeros(seq.size, np.int64)
        for k in range(order):  # oldest context token most significant, the token itself least
            codes = codes * num_states + padded[k:k + seq.size]
        counts += np.bincount(codes, minlength=num_states ** order)
    return counts.reshape(num_states ** (order - 1), num_states)


# ------------------------------------------------------------------------ finite-state models


@pytree_dataclass(init_on_unflatten=False)
class FiniteStateModel:
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

    start: int
    next_state: jax.Array = array_field()
    table: jax.Array = array_field()

    def __post_init__(self):
        start = self.start
        table = jnp.asarray(self.table)
        next_state = jnp.asarray(self.next_state)
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
        if _checks.is_concrete(next_state) and next_state.size and (
                int(next_state.min()) < 0 or int(next_state.max()) >= num_contexts):
            raise ValueError(f"next_state must hold states in [0, {num_contexts}), got values "
                             f"in [{int(next_state.min())}, {int(next_state.max())}]")
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
        _check_table_size("chain", 1 + layers * v, v)
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


@pytree_dataclass(init_on_unflatten=False)
class GreedyModel:
    """Any protocol model made deterministic: ``probs`` is one-hot at the wrapped model's argmax
    (ties to the lowest index); states and updates are the wrapped model's.

    A frozen dataclass and a pytree whose child is the wrapped model (its leaves are this
    model's leaves)."""

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


# ------------------------------------------------------------------- models with static leaves


def _traceable(leaf) -> bool:
    """Whether ``jit`` can take ``leaf`` as an argument: an array or a number."""
    return isinstance(leaf, (jax.Array, np.ndarray, np.generic, numbers.Number))


@jax.tree_util.register_pytree_node_class
class StaticLeaves:
    """A protocol model whose leaves that are not arrays (an equinox module's activation
    function, say) travel as static data, so the engines can pass it through ``jit``.

    ``with_static_leaves`` builds it; ``decode`` and ``decoding_statistics`` apply it to every
    model. The arrays stay leaves (traced, differentiable); the other leaves are part of the
    compiled program, compared by equality (functions by identity).

    Attributes:
      model: the wrapped model, rebuilt from its arrays and static leaves.
    """

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
