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

**The file layout** (``EngineTrace``, its ``save`` and ``load``): see
``specjax.auditing.traces_files``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from specjax.auditing.audit import check_alpha
from specjax.auditing.compare import UNTESTED
from specjax.auditing.compare import check_min_variance
from specjax.auditing.compare import generalised_chi2_test
from specjax.auditing.compare import is_tested
from specjax.auditing.given import verify_drafts_law
from specjax.auditing.given_tree import tree_of
from specjax.auditing.given_tree import verify_tree_law
from specjax.auditing.traces_files import FIELDS  # noqa: F401 - the module's API, as before
from specjax.auditing.traces_files import EngineTrace
from specjax.auditing.traces_files import _check

__all__ = ["EngineTrace", "TraceEstimate", "TraceCheck", "trace_law", "estimate_trace",
           "counterfactuals", "check_trace", "format_estimates"]


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
