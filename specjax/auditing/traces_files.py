"""An engine trace and its file: ``EngineTrace`` (re-exported by ``specjax.auditing.traces``,
which reads it: laws, estimates, counterfactuals, checks), its checks, ``save`` and ``load``.

**The file layout** (``EngineTrace.save`` / ``EngineTrace.load``, a NumPy ``.npz``), ``N``
calls:

* ``draft_tokens``: int ``(N, K)``, the drafted ids of each call (entries past ``num_drafts``
  are padding, never read). A tree: int ``(N, M)``, the token of each of its ``M`` nodes, node 0
  the root (the last accepted token, not read).
* ``draft_probs``: float ``(N, K, V)``, row ``j`` the draft's law draft ``j`` was drawn from;
  absent for greedy or n-gram drafts (scored with their one-hot). A tree: ``(N, M, V)``, row
  ``i`` the law node ``i``'s children were drawn from; absent for ``"top_k"`` trees.
* ``target_probs``: float ``(N, K + 1, V)``, the target's rows at the drafted positions and the
  one after them (the bonus row). A tree: ``(N, M, V)``, row ``i`` after the path to node ``i``.
* ``accepted``: int ``(N,)``, the drafts the engine accepted per call (the depth of the accepted
  node for a tree), in ``[0, num_drafts]``.
* ``num_drafts`` (optional): int ``(N,)``, the drafts of each call (ragged calls); default ``K``.
  A tree: its drafted nodes, ``N_b - 1`` (the call uses nodes ``0..N_b - 1``).
* ``weights`` (optional): float ``(N,)``, non-negative, each call's weight in the estimates.
* ``parents`` (optional, trees only): int ``(M,)``, the tree's parent array (``parents[0] =
  -1``, ``0 <= parents[i] < i``); its presence makes the trace a tree trace.

Only the full rows are taken: top-k and typical acceptance and block verification read whole
rows, so a log of the drafted tokens' probabilities alone serves too few rules.
"""

from __future__ import annotations

import os
import zipfile
from typing import NamedTuple

import numpy as np

from specjax._files import atomic_write
from specjax.auditing.given import check_inputs
from specjax.auditing.given_tree import check_tree_inputs
from specjax.decoders.tree import TokenTree

__all__ = ["EngineTrace", "FIELDS"]

#: The arrays of the ``.npz`` layout, in order (the optional ones may be absent).
FIELDS = ("draft_tokens", "draft_probs", "target_probs", "accepted", "num_drafts", "weights",
          "parents")
_OPTIONAL = ("draft_probs", "num_drafts", "weights", "parents")


class EngineTrace(NamedTuple):
    """What an engine did, per target call: its drafts, their rows, and what it accepted.

    The fields are the ``.npz`` layout's arrays (see the module docstring), NumPy arrays or
    ``None`` for the optional ones. ``EngineTrace(...)`` stores what it is given;
    ``checked()``, ``load`` and every function of this module check it.

    Attributes:
      draft_tokens: int ``(N, K)`` drafted ids; a tree's ``(N, M)`` node tokens (node 0 the root).
      draft_probs: float ``(N, K, V)`` draft rows at the drafted positions (``(N, M, V)`` for a
        tree: the rows each node's children were drawn from), or ``None`` for greedy drafts
        (chains) and ``"top_k"`` trees.
      target_probs: float ``(N, K + 1, V)`` target rows, bonus row last (``(N, M, V)`` for a
        tree).
      accepted: int ``(N,)``, drafts accepted per call.
      num_drafts: int ``(N,)`` drafts per call (a tree: drafted nodes), or ``None`` for all.
      weights: float ``(N,)`` non-negative weights of the calls, or ``None`` for equal ones.
      parents: int ``(M,)`` parent array of the calls' token tree, or ``None`` for chains.

    Example:
      >>> import numpy as np
      >>> from specjax.auditing.traces import EngineTrace
      >>> trace = EngineTrace(
      ...     draft_tokens=np.array([[1]]), draft_probs=np.array([[[0.5, 0.5]]]),
      ...     target_probs=np.array([[[0.2, 0.8], [1.0, 0.0]]]), accepted=np.array([1]))
      >>> trace.checked().num_calls, trace.lookahead, trace.is_tree
      (1, 1, False)
    """

    draft_tokens: np.ndarray  # (N, K) int, or (N, M) for a tree
    draft_probs: np.ndarray | None  # (N, K, V), or (N, M, V) for a tree
    target_probs: np.ndarray  # (N, K + 1, V), or (N, M, V) for a tree
    accepted: np.ndarray  # (N,) int
    num_drafts: np.ndarray | None = None  # (N,) int
    weights: np.ndarray | None = None  # (N,) float
    parents: np.ndarray | None = None  # (M,) int, trees only

    @property
    def is_tree(self) -> bool:
        """Whether the calls verified token trees (``parents`` given)."""
        return self.parents is not None

    @property
    def num_calls(self) -> int:
        """``N``, the target calls logged."""
        return int(np.shape(self.draft_tokens)[0])

    @property
    def lookahead(self) -> int:
        """``K`` (a chain), or the tree's depth ``D``: the most drafts a call can accept."""
        if self.is_tree:
            return int(_depths(np.asarray(self.parents)).max())
        return int(np.shape(self.draft_tokens)[1])

    def drafted(self) -> np.ndarray:
        """``(N,)`` int: the drafts (a tree: drafted nodes) of each call."""
        if self.num_drafts is not None:
            return np.asarray(self.num_drafts, np.int64)
        width = np.shape(self.draft_tokens)[1] - (1 if self.is_tree else 0)
        return np.full(self.num_calls, width, np.int64)

    def checked(self, where: str = "") -> EngineTrace:
        """This trace with every array checked (shapes, dtypes, ids, the rows the laws read,
        ``accepted``, ``weights``, ``parents``) and converted to NumPy; a ``ValueError`` naming
        the bad argument (prefixed with ``where``, e.g. a file's path) otherwise."""
        return _check(self, where)

    def save(self, path) -> None:
        """Write the trace to ``path`` as ``.npz`` (the module's layout; ``None`` fields are
        left out), all at once: a reader never sees a partial file.

        Raises:
          ValueError: an invalid trace (checked before anything is written).
        """
        trace = self.checked()
        arrays = {name: value for name, value in trace._asdict().items() if value is not None}
        with atomic_write(path, binary=True) as f:
            np.savez(f, **arrays)

    @classmethod
    def load(cls, path) -> EngineTrace:
        """Read a trace written in the module's ``.npz`` layout, checked.

        Raises:
          ValueError: a file that is not such an ``.npz``, a missing or unknown array, or
            invalid contents; the message starts with ``path``.
          FileNotFoundError: no file at ``path``.
        """
        where = os.fspath(path)
        try:
            with np.load(path, allow_pickle=False) as data:
                arrays = {name: data[name] for name in data.files}
        except (zipfile.BadZipFile, OSError, EOFError) as error:
            if isinstance(error, FileNotFoundError):
                raise
            raise ValueError(f"{where}: not a readable .npz trace ({error})") from None
        except ValueError as error:  # object arrays (pickles) are refused
            raise ValueError(f"{where}: {error}") from None
        unknown = sorted(set(arrays) - set(FIELDS))
        if unknown:
            raise ValueError(f"{where}: unknown arrays {unknown}; a trace holds {list(FIELDS)}")
        missing = [name for name in FIELDS if name not in arrays and name not in _OPTIONAL]
        if missing:
            raise ValueError(f"{where}: missing arrays {missing} (required: draft_tokens, "
                             f"target_probs, accepted)")
        return cls(**{name: arrays.get(name) for name in FIELDS}).checked(where)


def _depths(parents: np.ndarray) -> np.ndarray:
    depth = np.zeros(len(parents), np.int64)
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
    return depth


def _int_array(name, x, shape, where):
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.integer):
        raise ValueError(f"{where}{name} must hold integers, got dtype {x.dtype}")
    if x.shape != shape:
        raise ValueError(f"{where}{name} must have shape {shape}, got {x.shape}")
    return x.astype(np.int64)


def _check_parents(parents, where):
    parents = np.asarray(parents)
    if not np.issubdtype(parents.dtype, np.integer) or parents.ndim != 1 or parents.size < 2:
        raise ValueError(f"{where}parents must be a 1-D int parent array of at least 2 nodes, "
                         f"got dtype {parents.dtype} and shape {parents.shape}")
    below = np.arange(parents.size)
    if parents[0] != -1 or np.any(parents[1:] < 0) or np.any(parents[1:] >= below[1:]):
        raise ValueError(f"{where}parents must have parents[0] = -1 and 0 <= parents[i] < i, "
                         f"got {parents.tolist()}")
    return parents.astype(np.int64)


def _check(trace, where: str) -> EngineTrace:
    where = f"{where}: " if where else ""
    if not isinstance(trace, EngineTrace):
        raise ValueError(f"{where}trace must be a specjax EngineTrace, got {type(trace)!r}")
    tokens = np.asarray(trace.draft_tokens)
    if not np.issubdtype(tokens.dtype, np.integer) or tokens.ndim != 2 or tokens.shape[0] < 1:
        raise ValueError(f"{where}draft_tokens must be ints of shape (N, K) (a tree: (N, M)) "
                         f"with N >= 1 calls, got dtype {tokens.dtype} and shape {tokens.shape}")
    num_calls, width = tokens.shape
    parents = None if trace.parents is None else _check_parents(trace.parents, where)
    draft = None if trace.draft_probs is None else np.asarray(trace.draft_probs)
    target = np.asarray(trace.target_probs)
    for name, x in (("draft_probs", draft), ("target_probs", target)):
        if x is not None and not np.issubdtype(x.dtype, np.floating):
            raise ValueError(f"{where}{name} must hold floating-point probabilities, got dtype "
                             f"{x.dtype}")
    if parents is not None and parents.size != width:
        raise ValueError(f"{where}parents must have one entry per node: {width} as "
                         f"draft_tokens (N, M), got {parents.size}")
    most = width - 1 if parents is not None else width
    counts = None
    if trace.num_drafts is not None:
        counts = _int_array("num_drafts", trace.num_drafts, (num_calls,), where)
        if np.any((counts < 0) | (counts > most)):
            bad = int(counts[(counts < 0) | (counts > most)][0])
            raise ValueError(f"{where}num_drafts must lie in [0, {most}], got {bad}")
    drafted = counts if counts is not None else np.full(num_calls, most, np.int64)
    try:
        if parents is None:
            check_inputs(tokens, draft, target, None if counts is None else counts.astype(
                np.int32))
        else:
            tree = TokenTree.from_parents(tuple(parents.tolist()),
                                          children="top_k" if draft is None else "iid")
            check_tree_inputs(tree, tokens, draft, target, (drafted + 1).astype(np.int32))
    except ValueError as error:
        raise ValueError(f"{where}{error}") from None
    accepted = _int_array("accepted", trace.accepted, (num_calls,), where)
    if parents is None:
        ceiling = drafted
    else:  # the deepest node among the call's first N_b nodes
        ceiling = np.maximum.accumulate(_depths(parents))[drafted]
    bad = np.flatnonzero((accepted < 0) | (accepted > ceiling))
    if bad.size:
        i = int(bad[0])
        bound = "the depth reached" if parents is not None else "num_drafts"
        raise ValueError(f"{where}accepted must lie in [0, {bound}] per call, got "
                         f"{int(accepted[i])} at call {i} (at most {int(ceiling[i])})")
    weights = None
    if trace.weights is not None:
        weights = np.asarray(trace.weights)
        if not (np.issubdtype(weights.dtype, np.floating)
                or np.issubdtype(weights.dtype, np.integer)) or weights.shape != (num_calls,):
            raise ValueError(f"{where}weights must be numbers of shape ({num_calls},), got "
                             f"dtype {weights.dtype} and shape {weights.shape}")
        weights = weights.astype(np.float64)
        if not np.all(np.isfinite(weights) & (weights >= 0)) or weights.sum() <= 0:
            raise ValueError(f"{where}weights must be finite, non-negative and not all zero")
    return EngineTrace(tokens, draft, target, accepted, counts, weights, parents)
