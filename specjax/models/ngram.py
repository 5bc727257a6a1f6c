"""N-gram models: ``NGramModel`` (a table over the contexts of the last ``n - 1`` tokens, fitted
by counting a corpus) and ``ngram_counts``.

**Start-of-sequence convention.** Contexts before the start are padded with token 0:
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
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax._pytree import array_field
from specjax._pytree import pytree_dataclass
from specjax.models.autoregressive import check_order
from specjax.models.autoregressive import check_table_size
from specjax.models.base import ModelKind
from specjax.models.base import ProtocolModel
from specjax.models.finite_state import FiniteStateModel


def _float_dtype(dtype):
    return jnp.result_type(float) if dtype is None else jnp.dtype(dtype)


def _shift(state, token, num_states: int, context_length: int):
    """The index of the last ``context_length`` tokens after appending ``token``."""
    if context_length == 0:
        return jnp.zeros_like(state)
    keep = num_states ** (context_length - 1)
    return (state % keep) * num_states + jnp.asarray(token, jnp.int32)


@pytree_dataclass(init_on_unflatten=False)
class NGramModel(ProtocolModel):
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

    kind: ClassVar[ModelKind] = ModelKind.PROTOCOL

    table: jax.Array = array_field()
    order: int

    def __post_init__(self):
        order = self.order
        check_order(order)
        table = jnp.asarray(self.table)
        if table.ndim != 2 or table.shape[1] < 1:
            raise ValueError(f"table must have shape (V**(order-1), V), got shape {table.shape}")
        num_states = table.shape[1]
        contexts = num_states ** (order - 1)
        check_table_size("order", contexts, num_states)
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

    @property
    def dtype(self):
        """The dtype of the probabilities (``table``'s)."""
        return self.table.dtype

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
        check_table_size("context_length", v ** length, v)
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
    check_order(order)
    _checks.check_positive_int("num_states", num_states)
    check_table_size("order", num_states ** (order - 1), num_states)
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


__all__ = ["NGramModel", "ngram_counts"]
