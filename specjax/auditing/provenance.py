"""Were the drafts drawn from the law the engine declared for them? A provenance check.

``verify_drafts`` and ``compare_outputs`` take the draft law an engine hands its verifier as
given: an engine that samples its drafts from one law and declares another passes them both,
and its output is biased. Two such bugs shipped: transformers #47932 (drafts sampled from the
top-k-processed logits, the unprocessed logits returned as the draft law; fixed by PR #48007)
and DeepSpec #31 (drafts sampled from bfloat16 logits, the float32 law used for verification).
``check_provenance`` tests engine dumps of drafted tokens against the declared rows directly.

**The test.** Every draft ``x_{b,j}`` is one draw from its declared row ``p_{b,j}``, and every
row may be a different law. Fix, before looking at the drafts, a map ``g`` from (row, token) to
one of ``C`` categories (the *binning*). Under the null hypothesis the category of draft
``(b, j)`` is one draw from the row's category law ``P_{b,j}(c) = sum_{v: g(v) = c} p_{b,j}(v)``,
so the category counts of the drafts at position ``j`` are a sum of independent multinomials
with different laws (requests are independent). Their chi-square statistic is ``d^T S^+ d``
(``d`` the counts minus their expectation ``sum_b P_b``, ``S = sum_b (diag P_b - P_b P_b^T)``
their covariance), chi-square with ``rank C`` degrees of freedom asymptotically: the statistic
of ``compare_outputs``, computed by the same helper, with categories of small variance pooled.
Pooled over positions the counts are a martingale (position ``j + 1``'s row is declared given
the draft at ``j``), whose predictable covariance is the same sum, so one more test pools every
position. Two binnings:

* ``"probability"``: the draft's declared probability, on a log2 scale: category ``k`` holds
  the tokens with ``p(v)`` in ``[2^-(k+1), 2^-k)`` (``k < num_bins - 1``; the last bin holds
  the rest of the support). The categories mean the same thing in every row, so pooling rows of
  different laws keeps the power against a law that moves mass between likely and unlikely
  tokens: top-k or top-p truncation (no draft in the tail bins), temperature. This is the
  probability integral transform of the draft binned on the declared probability's scale. It
  is blind to a perturbation that is not monotone in ``p``, such as rounding.
* ``"token"``: the token id (Pearson's test when every row is the same law). Powerful when the
  same declared law recurs (many runs of one context), where it sees any difference; over rows
  of different laws an unbiased perturbation (bfloat16 rounding) averages out.

Chosen this way because a test must be valid when every row is a different law (an engine's dump:
every context differs) and needs no model of the alternative; a per-row test (one draw per law)
has no power, and a test on the sum of the declared laws against the token counts alone is
the ``"token"`` binning.

**False alarms**: the ``len(bins) * (K + 1)`` tests (per position and pooled, per binning) are
each run at level ``alpha / num_tests`` (Bonferroni over asymptotic p-values), so correct
drafts are flagged with probability at most about ``alpha``. A draft of declared probability
zero is proof (``impossible``) and flags the check whatever ``alpha``.

**Cost**: one position's rows are read in float64 at a time; the token binning's pooled test
holds the laws of every drafted row (``sum_b K_b`` rows of ``V``) and its statistic keeps the
2,000 categories of largest variance, as ``compare_outputs`` does (an eigendecomposition of
their covariance).
"""

from __future__ import annotations

import numbers
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from specjax.auditing.audit import check_alpha
from specjax.auditing.compare import UNTESTED
from specjax.auditing.compare import check_min_variance
from specjax.auditing.compare import generalised_chi2_test
from specjax.auditing.compare import is_tested
from specjax.auditing.given import check_num_drafts
from specjax.auditing.given import check_token_ids
from specjax.auditing.given import check_valid_rows

__all__ = ["ProvenanceCheck", "check_provenance"]

#: The binnings of ``check_provenance`` (see the module docstring).
BINNINGS = ("probability", "token")


class ProvenanceCheck(NamedTuple):
    """What ``check_provenance`` found.

    Attributes:
      flagged: whether the drafts are found not drawn from the declared law (a draft of
        declared probability zero, or a p-value below ``alpha / num_tests``).
      impossible: number of drafts whose declared probability is zero.
      impossible_examples: up to 5 of them, as ``(request, position, token)`` tuples.
      bins: the binnings tested, in the order of the rows below.
      statistics: ``(len(bins), K + 1)``; the chi-square statistic of each binning at each
        position ``j < K``, then pooled over the positions (last column).
      dof: ``(len(bins), K + 1)``; their degrees of freedom (0: nothing to test).
      pvalues: ``(len(bins), K + 1)``; their p-values.
      num_rows: ``(K,)``; the drafts tested at each position (requests with ``num_drafts > j``).
      num_tests: ``len(bins) * (K + 1)`` (each at level ``alpha / num_tests``).
      alpha: the false-alarm rate of ``flagged`` (about, asymptotically).
      tested: whether the verdict rests on a test. False when ``min_variance`` pooled every
        category of every test away although the declared rows are random (too few drafts for
        it) and no draft is impossible: then ``flagged`` is False without any evidence (every
        ``dof`` is 0) and ``summary()`` says NOT TESTED, not ok.
    """

    flagged: bool
    impossible: int
    impossible_examples: list
    bins: tuple
    statistics: np.ndarray
    dof: np.ndarray
    pvalues: np.ndarray
    num_rows: np.ndarray
    num_tests: int
    alpha: float
    tested: bool = True

    def summary(self) -> str:
        """A human-readable verdict."""
        level = self.alpha / self.num_tests
        verdict = "FLAGGED" if self.flagged else "ok" if self.tested else UNTESTED
        lines = [f"provenance check: {verdict} "
                 f"(false-alarm rate {self.alpha:g}: {self.num_tests} tests at {level:.3g} each)",
                 f"  drafts of declared probability zero: {self.impossible}"
                 + "".join(f"\n    request {b}, position {j}: token {v}"
                           for b, j, v in self.impossible_examples)]
        for name, stats, dof, pvalues in zip(self.bins, self.statistics, self.dof, self.pvalues):
            cells = [f"{s:.1f}/{d} (p {p:.3g})" for s, d, p in zip(stats, dof, pvalues)]
            lines.append(f"  {name} bins, chi2/dof per position: " + ", ".join(cells[:-1])
                         + f"; pooled: {cells[-1]}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


def _check(draft_tokens, draft_probs, num_drafts, bins, num_bins, min_variance):
    """``(tokens (B, K), rows (B, K, V) float64, counts (B,), bins)``, or ``ValueError``."""
    tokens = np.asarray(draft_tokens)
    if not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"draft_tokens must hold integer token ids, got dtype {tokens.dtype}")
    if tokens.ndim not in (1, 2):
        raise ValueError(f"draft_tokens must have shape (K,) or (B, K), got {tokens.shape}")
    batched = tokens.ndim == 2
    if draft_probs is None:
        raise ValueError("draft_probs must be the declared draft rows (B, K, V); got None")
    rows = np.asarray(draft_probs)  # NumPy: float64 rows keep their precision without x64
    if not jnp.issubdtype(rows.dtype, jnp.floating):
        raise ValueError(f"draft_probs must hold floating-point probabilities, got dtype "
                         f"{rows.dtype}")
    if rows.ndim != (3 if batched else 2):
        raise ValueError(f"draft_probs must have {3 if batched else 2} axes, got shape "
                         f"{rows.shape}")
    tokens = tokens if batched else tokens[None]
    rows = rows if batched else rows[None]
    num_requests, lookahead = tokens.shape
    if rows.shape[:2] != (num_requests, lookahead) or rows.shape[-1] < 1:
        want = "(B, K, V)" if batched else "(K, V)"
        raise ValueError(f"draft_probs must have shape {want} with B, K = {num_requests}, "
                         f"{lookahead} from draft_tokens, got {np.shape(draft_probs)}")
    counts = np.asarray(check_num_drafts(num_drafts, num_requests, lookahead, batched))
    valid = np.arange(lookahead)[None] < counts[:, None]
    check_token_ids(tokens[valid], rows.shape[-1])
    bins = (bins,) if isinstance(bins, str) else tuple(bins)
    if not bins or any(name not in BINNINGS for name in bins) or len(set(bins)) != len(bins):
        raise ValueError(f"bins must be one or more distinct names of {BINNINGS}, got {bins!r}")
    if isinstance(num_bins, bool) or not isinstance(num_bins, numbers.Integral) or num_bins < 2:
        raise ValueError(f"num_bins must be an integer >= 2, got {num_bins!r}")
    check_min_variance(min_variance)
    check_valid_rows([("draft_probs", rows, valid)], batched)
    return np.where(valid, tokens, 0), rows, valid, bins


def _binned(name: str, rows: np.ndarray, drafts: np.ndarray, num_bins: int):
    """``(category laws (N, C), drafts' categories (N,))`` of the rows ``(N, V)`` under a
    binning."""
    if name == "token":
        return rows, drafts
    level = np.floor(-np.log2(np.where(rows > 0, rows, 1.0)))
    category = np.clip(level, 0, num_bins - 1).astype(np.int64)
    index = (np.arange(len(rows))[:, None] * num_bins + category).ravel()
    laws = np.bincount(index, weights=rows.ravel(), minlength=len(rows) * num_bins)
    return laws.reshape(len(rows), num_bins), \
        np.take_along_axis(category, drafts[:, None], -1)[:, 0]


def check_provenance(draft_tokens, draft_probs, *, num_drafts=None, alpha: float = 1e-3,
                     bins=BINNINGS, num_bins: int = 24,
                     min_variance: float = 5.0) -> ProvenanceCheck:
    """Test that an engine's drafted tokens were drawn from the draft law it declared for them.

    Args:
      draft_tokens: ``(B, K)`` drafted ids of ``B`` requests (``(K,)`` for one); entries at or
        after a request's ``num_drafts`` are padding and never read.
      draft_probs: ``(B, K, V)`` the rows the engine declared the drafts were drawn from (what
        it hands its verifier), each drawn given the drafts before it.
      num_drafts: ``(B,)`` ints in ``[0, K]``, the drafts of each request (ragged batches, as
        for ``specjax.verify_drafts``); ``None`` for ``K`` everywhere.
      alpha: the false-alarm rate of the verdict, in ``(0, 1)``.
      bins: the binnings to test, names of ``BINNINGS`` (``"probability"``, ``"token"``; see
        the module docstring), a name or a tuple.
      num_bins: the ``"probability"`` binning's number of log2 bins (the last holds the declared
        probabilities below ``2^-(num_bins - 1)``).
      min_variance: categories whose count has a smaller variance under the declared law are
        pooled (chi-square validity, as for ``compare_outputs``); a positive finite number.
        When it leaves no category to test in any test (too few drafts for it, or too large a
        value) and no draft is impossible, the result says so (``tested`` False, a summary of
        NOT TESTED), not a pass.

    Returns:
      ``ProvenanceCheck`` (``print(result)`` for a verdict).

    Raises:
      ValueError: ids that are not integers or fall outside ``[0, V)``, rows that are not
        probability rows, shapes that do not match, a bad ``num_drafts``, ``bins``, ``num_bins``,
        ``alpha`` or ``min_variance`` (a positive finite number); before any work.

    Example:
      >>> import jax, jax.numpy as jnp, specjax
      >>> logits = 2.0 * jax.random.normal(jax.random.key(0), (3000, 2, 16))
      >>> rows = jax.nn.softmax(logits)
      >>> drafts = jax.random.categorical(jax.random.key(1), logits)  # (3000, 2)
      >>> check = specjax.auditing.check_provenance(drafts, rows)
      >>> check.flagged, check.impossible
      (False, 0)
      >>> top4 = jnp.where(logits >= jnp.sort(logits)[..., -4:-3], logits, -jnp.inf)
      >>> drafts = jax.random.categorical(jax.random.key(1), top4)   # top-k, rows declared whole
      >>> specjax.auditing.check_provenance(drafts, rows).flagged
      True
    """
    alpha = check_alpha(alpha)
    tokens, rows, valid, bins = _check(draft_tokens, draft_probs, num_drafts, bins, num_bins,
                                       min_variance)
    min_variance = float(min_variance)
    lookahead = rows.shape[1]
    drawn = np.take_along_axis(rows, tokens[..., None], -1)[..., 0]  # padding never read
    impossible = valid & (drawn <= 0)
    examples = [(int(b), int(j), int(tokens[b, j])) for b, j in np.argwhere(impossible)[:5]]
    ok = valid & ~impossible
    statistics = np.zeros((len(bins), lookahead + 1))
    dof = np.zeros((len(bins), lookahead + 1), np.int64)
    pvalues = np.ones((len(bins), lookahead + 1))
    pooled = [([], 0) for _ in bins]  # per binning: the category laws and counts so far

    def test(i, j, laws, counts):
        if len(laws):
            statistics[i, j], dof[i, j], pvalues[i, j] = generalised_chi2_test(
                laws, counts, 1, min_variance)

    for j in range(lookahead):
        use = valid[:, j]
        position = np.asarray(rows[use, j], np.float64)  # one position at a time in float64
        position /= position.sum(-1, keepdims=True)
        for i, name in enumerate(bins):
            laws, drafted = _binned(name, position, tokens[use, j], num_bins)
            counts = np.bincount(drafted[ok[use, j]], minlength=laws.shape[1])
            test(i, j, laws, counts)
            pooled[i] = (pooled[i][0] + [laws], pooled[i][1] + counts)
    for i, (laws, counts) in enumerate(pooled):
        if lookahead > 1:
            test(i, lookahead, np.concatenate(laws), counts)
        else:  # K = 1: the pooled test is position 0's (K = 0: nothing to test)
            statistics[i, -1], dof[i, -1], pvalues[i, -1] = \
                statistics[i, 0], dof[i, 0], pvalues[i, 0]
    tested = bool(impossible.any()) or is_tested(
        dof.ravel().tolist(), [np.concatenate(laws) for laws, _ in pooled if laws])
    num_tests = len(bins) * (lookahead + 1)
    flagged = bool(impossible.any() or (pvalues < alpha / num_tests).any())
    return ProvenanceCheck(flagged=flagged, impossible=int(impossible.sum()),
                           impossible_examples=examples, bins=bins, statistics=statistics,
                           dof=dof, pvalues=pvalues, num_rows=valid.sum(0), num_tests=num_tests,
                           alpha=alpha, tested=tested)
