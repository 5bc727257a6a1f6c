"""Engine traces: what a serving engine drafted and accepted per target call, and what follows.

An engine logs, per target call ``i``, the drafts it verified, the draft's rows they were drawn
from, the target's rows at the drafted positions (and the one after them), and how many drafts
it accepted, ``A_i``. Given the drafts and rows, the law of ``A_i`` over the verifier's random
numbers is exact (``specjax.verify_drafts_law``; ``specjax.verify_tree_law`` for token trees),
which gives three things:

* **Rao-Blackwellised estimates.** Counting estimates the mean accepted length by the weighted
  mean of the observed ``A_i``. Replacing each ``A_i`` by its conditional expectation
  ``c_i = E[A_i | drafts, rows of call i]`` (the mean of its exact law) gives the estimator
  ``sum_i w_i c_i / sum_i w_i``. It is **unbiased** for what counting estimates: ``A_i - c_i``
  has mean zero given everything that happened before the verifier drew its random numbers
  (the drafts, the rows, and the earlier calls whose outcomes chose this call's context), so
  ``sum_i w_i (A_i - c_i)`` is a martingale of mean zero, for calls in sequence as for
  independent ones. Its **variance is smaller**: ``Var(A) = Var(c) + E[Var(A | drafts)]``, the
  law of total variance, and the second term, the verifier's own randomness, is gone. The
  variance ratio ``Var(A) / Var(c)`` is how many times more calls counting needs for the same
  standard error. The acceptance rate ``sum_i w_i A_i / sum_i w_i K_i`` (accepted over drafted
  tokens, ``K_i`` the call's drafts) is estimated in the same way.
* **Counterfactuals.** On the same drafts and rows, the exact law of every other verification
  rule that these drafts serve gives that rule's Rao-Blackwellised estimates: what the engine
  would have accepted under strict verification, typical acceptance, lenient or top-k SD,
  SGLang's thresholds, biased SD or block verification, with no new run.
* **A consistency check.** The observed counts against their exact laws (``check_trace``): an
  engine whose sampler is not the rule it declares is caught by its own logs.

Standard errors treat the calls as independent (``sqrt(n / (n - 1) sum_i w_i^2 (x_i - m)^2) /
sum_i w_i``, a ratio estimator's sandwich form); calls of one sequence are weakly dependent
through their contexts, so with few long sequences read them as approximate.

**Which rules.** Chains: every rule ``verify_drafts_law`` takes, since they all draft one token
per position from the draft's row and the trace holds those rows: ``Speculative``,
``BiasedSpeculative``, ``LenientSpeculative``, ``TopKAcceptance``, ``TypicalAcceptance``,
``ThresholdVerification``, ``specjax.decoders.StrictVerification``, any ``RejectionRule`` and
``BlockVerification`` (which is also Traversal Verification on a chain). Trees: every
``TokenTree`` of the trace's parent array (``"iid"``, ``"without_replacement"``, ``"top_k"``
children) and ``BatchSpeculative(M, lookahead=K)`` when the trace's tree is ``(M, 1, ..., 1)``,
through ``verify_tree_law``. A counterfactual rule evaluated on drafts its own drafting would
not have produced (``"top_k"`` verification of sampled children, ``"iid"`` verification of
children drawn without replacement) gives what that rule accepts *on these drafts*, not its
value under its own drafting. Not covered: rules that need drafts sampled differently or more
of them (``OptimalMultiDraft``, ``SpecHub``, ``GumbelList``, ``KSequential``,
``ImportanceWeighted``: several drafts per position, coupled; adaptive drafting changes which
drafts exist, though a trace of adaptive drafts is read with its ragged ``num_drafts``), and
Traversal Verification and the optimal multi-draft verifier of a tree, which have no given-tree
law in specjax yet.

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

import math
import os
import zipfile
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from specjax._files import atomic_write
from specjax.auditing.audit import check_alpha
from specjax.auditing.compare import UNTESTED
from specjax.auditing.compare import check_min_variance
from specjax.auditing.compare import generalised_chi2_test
from specjax.auditing.compare import is_tested
from specjax.auditing.given import check_inputs
from specjax.auditing.given import verify_drafts_law
from specjax.auditing.given_tree import check_tree_inputs
from specjax.auditing.given_tree import tree_of
from specjax.auditing.given_tree import verify_tree_law
from specjax.decoders.tree import TokenTree

__all__ = ["EngineTrace", "TraceEstimate", "TraceCheck", "trace_law", "estimate_trace",
           "counterfactuals", "check_trace", "format_estimates"]

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


# ---------------------------------------------------------------------------------------------
# Laws and estimates.


def _law(decoder, trace: EngineTrace) -> np.ndarray:
    if trace.is_tree:
        tree = tree_of(decoder)
        if tuple(tree.shape.parents) != tuple(trace.parents.tolist()):
            raise ValueError(f"decoder must verify the trace's tree (parents "
                             f"{trace.parents.tolist()}), got {decoder!r} with parents "
                             f"{list(tree.shape.parents)}")
        law = verify_tree_law(decoder, trace.draft_tokens, trace.draft_probs, trace.target_probs,
                              num_nodes=(trace.drafted() + 1).astype(np.int32)).num_accepted
    else:
        counts = None if trace.num_drafts is None else trace.num_drafts.astype(np.int32)
        law = verify_drafts_law(decoder, trace.draft_tokens, trace.draft_probs,
                                trace.target_probs, num_drafts=counts).num_accepted
    law = np.clip(np.asarray(law, np.float64), 0, None)
    return law / law.sum(1, keepdims=True)


def trace_law(decoder, trace: EngineTrace) -> np.ndarray:
    """The exact law of each call's accepted drafts given its drafts and rows, under ``decoder``.

    Args:
      decoder: the verification rule; a chain trace takes any decoder ``verify_drafts_law``
        takes, a tree trace a ``specjax.TokenTree`` of its parent array (or the matching
        ``specjax.BatchSpeculative(M, lookahead=K)``).
      trace: an ``EngineTrace``.

    Returns:
      float64 ``(N, K + 1)`` (a tree: ``(N, D + 1)``): ``P(call i accepts n drafts)``, the
      ``num_accepted`` of ``verify_drafts_law`` (``verify_tree_law``), rows renormalised.

    Raises:
      ValueError: an invalid trace, a decoder without a law on these drafts.

    Example:
      >>> import numpy as np, specjax
      >>> from specjax.auditing.traces import EngineTrace, trace_law
      >>> trace = EngineTrace(np.array([[1]]), np.array([[[0.5, 0.5]]]),
      ...                     np.array([[[0.2, 0.8], [1.0, 0.0]]]), np.array([1]))
      >>> trace_law(specjax.Speculative(), trace).round(3).tolist()  # accept w.p. min(1, .8/.5)
      [[0.0, 1.0]]
    """
    return _law(decoder, _check(trace, ""))


class TraceEstimate(NamedTuple):
    """One rule's mean accepted drafts and acceptance rate on a trace.

    Attributes:
      rule: the rule's name.
      mean_accepted: Rao-Blackwellised mean accepted drafts per call, ``sum w c / sum w``.
      mean_accepted_se: its standard error.
      acceptance_rate: Rao-Blackwellised accepted over drafted tokens, ``sum w c / sum w K``.
      acceptance_rate_se: its standard error.
      counted_mean_accepted: the observed ``sum w A / sum w`` (NaN for a counterfactual rule).
      counted_mean_accepted_se: its standard error (NaN likewise).
      counted_acceptance_rate: the observed ``sum w A / sum w K`` (NaN likewise).
      counted_acceptance_rate_se: its standard error (NaN likewise).
      variance_ratio: ``counted_mean_accepted_se^2 / mean_accepted_se^2``: how many times more
        calls counting needs (NaN for a counterfactual rule; inf when the conditional means do
        not vary).
      num_calls: ``N``.
      law: float64 ``(N, K + 1)``, each call's exact law of accepted drafts (``trace_law``).
    """

    rule: str
    mean_accepted: float
    mean_accepted_se: float
    acceptance_rate: float
    acceptance_rate_se: float
    counted_mean_accepted: float
    counted_mean_accepted_se: float
    counted_acceptance_rate: float
    counted_acceptance_rate_se: float
    variance_ratio: float
    num_calls: int
    law: np.ndarray


def _ratio(x, y, w):
    """``(sum w x / sum w y, its standard error)`` over independent calls (sandwich form with
    the ``n / (n - 1)`` correction, ``n`` the calls of positive weight; NaN for one call or
    ``sum w y = 0``)."""
    n = int(np.count_nonzero(w))
    denominator = float((w * y).sum())
    if denominator <= 0:
        return math.nan, math.nan
    value = float((w * x).sum()) / denominator
    if n < 2:
        return value, math.nan
    spread = float((w ** 2 * (x - value * y) ** 2).sum()) * n / (n - 1)
    return value, math.sqrt(spread) / denominator


def _name(decoder) -> str:
    return repr(decoder)


def _estimate(name, law, trace: EngineTrace, counted: bool) -> TraceEstimate:
    w = np.ones(trace.num_calls) if trace.weights is None else trace.weights
    ones = np.ones(trace.num_calls)
    drafted = trace.drafted().astype(np.float64)
    means = law @ np.arange(law.shape[1], dtype=np.float64)
    mean, mean_se = _ratio(means, ones, w)
    rate, rate_se = _ratio(means, drafted, w)
    nan = (math.nan,) * 5
    if counted:
        observed = trace.accepted.astype(np.float64)
        c_mean, c_mean_se = _ratio(observed, ones, w)
        c_rate, c_rate_se = _ratio(observed, drafted, w)
        ratio = (c_mean_se / mean_se) ** 2 if mean_se > 0 else (
            math.inf if c_mean_se > 0 else math.nan)
        nan = (c_mean, c_mean_se, c_rate, c_rate_se, ratio)
    return TraceEstimate(name, mean, mean_se, rate, rate_se, *nan, trace.num_calls, law)


def estimate_trace(decoder, trace: EngineTrace, *, name: str | None = None) -> TraceEstimate:
    """The engine's mean accepted drafts and acceptance rate, counted and Rao-Blackwellised.

    Args:
      decoder: the rule the engine declares (``specjax.Speculative()`` for SD); see
        ``trace_law``.
      trace: an ``EngineTrace``.
      name: the rule's name in the result (default: ``repr(decoder)``).

    Returns:
      ``TraceEstimate``, counting fields and ``variance_ratio`` included. The Rao-Blackwellised
      estimate is unbiased only if the engine implements ``decoder``: ``check_trace`` tests it.

    Example:
      >>> import numpy as np, specjax
      >>> from specjax.auditing.traces import EngineTrace, estimate_trace
      >>> p = np.array([[[0.5, 0.5]]] * 2); q = np.array([[[0.4, 0.6], [1.0, 0.0]]] * 2)
      >>> trace = EngineTrace(np.array([[0], [1]]), p, q, np.array([0, 1]))
      >>> e = estimate_trace(specjax.Speculative(), trace)  # accepts w.p. 0.8 and 1
      >>> round(e.mean_accepted, 3), e.counted_mean_accepted
      (0.9, 0.5)
    """
    trace = _check(trace, "")
    return _estimate(_name(decoder) if name is None else name, _law(decoder, trace), trace,
                     True)


def counterfactuals(trace: EngineTrace, decoders) -> dict:
    """Other rules' Rao-Blackwellised estimates on the trace's drafts: what each would have
    accepted on the same drafts and rows.

    Args:
      trace: an ``EngineTrace``.
      decoders: a mapping name -> decoder, or a sequence of decoders (named by ``repr``);
        each one ``trace_law`` takes (see the module docstring for which rules are covered).

    Returns:
      ``{name: TraceEstimate}`` in the given order, the counting fields NaN (no run observed
      them).

    Raises:
      ValueError: an invalid trace, no decoder, or a decoder without a law on these drafts.

    Example:
      >>> import numpy as np, specjax
      >>> from specjax.auditing.traces import EngineTrace, counterfactuals
      >>> p = np.array([[[0.5, 0.5]]]); q = np.array([[[0.4, 0.6], [1.0, 0.0]]])
      >>> trace = EngineTrace(np.array([[0]]), p, q, np.array([1]))
      >>> rules = {"SD": specjax.Speculative(), "lenient 0.5": specjax.LenientSpeculative(0.5)}
      >>> {k: round(e.mean_accepted, 3) for k, e in counterfactuals(trace, rules).items()}
      {'SD': 0.8, 'lenient 0.5': 1.0}
    """
    trace = _check(trace, "")
    named = dict(decoders) if isinstance(decoders, Mapping) else {
        _name(d): d for d in decoders}
    if not named:
        raise ValueError("decoders must hold at least one decoder")
    return {name: _estimate(name, _law(d, trace), trace, False) for name, d in named.items()}


def format_estimates(estimates) -> str:
    """A Markdown table of ``TraceEstimate`` values (a sequence, or a mapping's values): the
    Rao-Blackwellised mean accepted drafts and acceptance rate with their standard errors, and
    the counted ones and the variance ratio where observed."""

    def pm(value, se):
        return "" if math.isnan(value) else f"{value:.4f} ± {se:.4f}"

    items = list(estimates.values() if isinstance(estimates, Mapping) else estimates)
    lines = ["| rule | mean accepted | acceptance rate | counted mean accepted | "
             "variance ratio |", "| --- | --- | --- | --- | --- |"]
    for e in items:
        ratio = "" if math.isnan(e.variance_ratio) else f"{e.variance_ratio:.2f}"
        lines.append(f"| {e.rule} | {pm(e.mean_accepted, e.mean_accepted_se)} | "
                     f"{pm(e.acceptance_rate, e.acceptance_rate_se)} | "
                     f"{pm(e.counted_mean_accepted, e.counted_mean_accepted_se)} | {ratio} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Consistency of the observed counts with the declared rule.


class TraceCheck(NamedTuple):
    """What ``check_trace`` found.

    Attributes:
      flagged: whether the trace is inconsistent with the declared rule (an impossible count,
        or a p-value below ``alpha / num_tests``).
      impossible: calls whose observed count has probability zero under their exact law.
      impossible_calls: up to 5 of them, by index.
      counts_pvalue: p-value of the histogram of accepted counts against the calls' laws
        (``generalised_chi2_test``: a sum of independent multinomials with different laws).
      mean_pvalue: p-value of the total accepted, ``(sum A - sum E[A]) / sqrt(sum Var[A])``
        against the standard normal, two-sided (the direction most wrong rules move).
      mean_accepted: the observed mean accepted drafts per call (unweighted).
      mean_accepted_expected: its exact expectation given the drafts.
      mean_accepted_se: its standard error under the exact laws.
      num_calls: ``N``.
      num_tests: 2 (each at level ``alpha / 2``).
      alpha: the false-alarm rate of ``flagged`` (asymptotic, Bonferroni).
      tested: False when ``min_variance`` pooled every category away and no count is
        impossible: ``flagged`` False then rests on no evidence (summary: NOT TESTED).
    """

    flagged: bool
    impossible: int
    impossible_calls: list
    counts_pvalue: float
    mean_pvalue: float
    mean_accepted: float
    mean_accepted_expected: float
    mean_accepted_se: float
    num_calls: int
    num_tests: int
    alpha: float
    tested: bool = True

    def summary(self) -> str:
        """A human-readable verdict."""
        verdict = "FLAGGED" if self.flagged else "ok" if self.tested else UNTESTED
        return "\n".join([
            f"trace check: {verdict} (false-alarm rate {self.alpha:g}: {self.num_tests} tests "
            f"at {self.alpha / self.num_tests:.3g} each; {self.num_calls} calls)",
            f"  impossible counts: {self.impossible}"
            + (f" (calls {self.impossible_calls})" if self.impossible else ""),
            f"  accepted counts p-value: {self.counts_pvalue:.3g}",
            f"  mean accepted {self.mean_accepted:.4f} against {self.mean_accepted_expected:.4f}"
            f" ± {self.mean_accepted_se:.4f}: p-value {self.mean_pvalue:.3g}"])

    def __str__(self) -> str:
        return self.summary()


def check_trace(decoder, trace: EngineTrace, *, alpha: float = 1e-3,
                min_variance: float = 5.0) -> TraceCheck:
    """Test whether a trace's accepted counts are consistent with the rule the engine declares.

    Each call's count is one draw from its exact law (``trace_law``); the weights are not used
    (they weigh estimates, not evidence). Two tests, each at ``alpha / 2``: the histogram of
    the counts (``generalised_chi2_test``, categories of small variance pooled by
    ``min_variance``) and the total count's z-score; and impossible counts, a proof of a bug.

    Args:
      decoder: the declared rule.
      trace: an ``EngineTrace``.
      alpha: the false-alarm rate, in ``(0, 1)``.
      min_variance: a positive finite number (see ``specjax.compare_outputs``).

    Returns:
      ``TraceCheck`` (``print(result)`` for a verdict).

    Raises:
      ValueError: an invalid trace or decoder, ``alpha`` or ``min_variance``.

    Example:
      >>> import numpy as np, specjax
      >>> from specjax.auditing.traces import EngineTrace, check_trace
      >>> p = np.array([[[0.5, 0.5]]]); q = np.array([[[0.0, 1.0], [1.0, 0.0]]])
      >>> trace = EngineTrace(np.array([[0]]), p, q, np.array([1]))  # accepted: q(0) = 0
      >>> result = check_trace(specjax.Speculative(), trace)
      >>> result.flagged, result.impossible
      (True, 1)
    """
    alpha = check_alpha(alpha)
    min_variance = check_min_variance(min_variance)
    trace = _check(trace, "")
    law = _law(decoder, trace)
    calls = np.arange(trace.num_calls)
    impossible = law[calls, trace.accepted] <= 0
    examples = [int(i) for i in np.flatnonzero(impossible)[:5]]
    observed = np.bincount(trace.accepted, minlength=law.shape[1])
    _, dof, counts_p = generalised_chi2_test(law, observed, 1, min_variance)
    values = np.arange(law.shape[1], dtype=np.float64)
    means = law @ values
    variance = float((law @ values ** 2 - means ** 2).clip(0).sum())
    total = float(trace.accepted.sum()) - float(means.sum())
    mean_p = math.erfc(abs(total) / math.sqrt(2 * variance)) \
        if variance >= min_variance else 1.0
    num_tests = 2
    flagged = bool(impossible.any() or min(counts_p, mean_p) < alpha / num_tests)
    return TraceCheck(
        flagged=flagged, impossible=int(impossible.sum()), impossible_calls=examples,
        counts_pvalue=float(counts_p), mean_pvalue=float(mean_p),
        mean_accepted=float(trace.accepted.mean()),
        mean_accepted_expected=float(means.mean()),
        mean_accepted_se=math.sqrt(variance) / trace.num_calls, num_calls=trace.num_calls,
        num_tests=num_tests, alpha=alpha,
        tested=bool(impossible.any()) or is_tested([dof, int(variance >= min_variance)], [law]))
