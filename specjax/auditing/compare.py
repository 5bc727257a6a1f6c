"""Is an engine's rejection sampler right? Its outputs tested against specjax's exact law.

An engine author runs their sampler on given inputs (drafted ids, draft and target rows), many
times or over many requests, and hands the emitted tokens to ``compare_outputs``. Since every
token but the last is a given draft, each output is the pair (length ``n + 1``, last token
``y``), whose exact law ``verify_drafts_law`` computes per request (with stop tokens and a
dropped bonus when the engine uses them). Three kinds of evidence:

* **impossible outcomes**: an output of probability zero under the exact law (a token of zero
  target mass, a recovered token the residual cannot produce, an accepted token that is not the
  draft, ``n`` above ``K_b``, malformed padding). One is proof of a bug: no false alarm.
* **goodness of fit**, for the whole outcome ``(n, y)``, for the length, and per position ``j``
  (absent / draft kept / last token ``y`` here): the counts of each category summed
  over runs and requests against their expectations, by the chi-square statistic of a sum of
  independent multinomials with different laws (``d^T C^+ d`` with ``C`` their summed
  covariance; for identical requests it is Pearson's statistic). Categories whose count has a
  variance below ``min_variance`` (``sum_b R P_b (1 - P_b)``: the number of random events behind
  it, not its expectation, which requests that surely emit a category inflate) are pooled, and a
  pool of too small a variance is folded into a kept category. Asymptotic in the number of runs
  times requests.
* the mean length against its exact mean and standard error (reported, not tested separately:
  the length's test contains it). Without stop tokens and with the bonus, the length is one more
  than the number of drafts accepted.

**False alarms**: with ``m = K + 3`` tests, each at level ``alpha / m``, a correct sampler is
flagged with probability at most about ``alpha`` (Bonferroni over asymptotic p-values).
Measured on correct samplers (1,500 replicates each; 500 requests run once, and 50 requests run
4 times, ragged ``K <= 4``): a fraction 0.0101 and 0.0087 of the tests' p-values fell below 0.01
and 0.0011 and 0.0012 below 0.001. Impossible outcomes never raise a false alarm; but note that a bug which shows only at ``u = 0.0`` exactly (a test
``q / p >= u``) shows in outputs only if the runs drew ``u = 0.0``: pass such uniforms to the
sampler under test (engines' own tests do) or audit the rule with ``specjax.audit_exact``.
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import numpy as np

from specjax.auditing.audit import check_alpha
from specjax.auditing.audit import chi2_sf
from specjax.auditing.given import PAD
from specjax.auditing.given import _law
from specjax.auditing.given import check_endings
from specjax.auditing.given import check_given_decoder
from specjax.auditing.given import check_inputs

__all__ = ["EngineComparison", "compare_outputs"]

_MAX_CATEGORIES = 2000  # categories kept per test (the rest pooled): bounds the covariance


class EngineComparison(NamedTuple):
    """What ``compare_outputs`` found.

    Attributes:
      flagged: whether the sampler is found wrong (an impossible outcome, or a p-value below
        ``alpha / num_tests``).
      impossible: number of runs whose output has probability zero under the exact law.
      impossible_examples: up to 5 of them, as ``(run, request, tokens)`` tuples.
      outcome_pvalue: p-value of the whole outcome ``(n, y)``.
      length_pvalue: p-value of the output's length.
      position_pvalues: ``(K + 1,)``; p-value of position ``j``'s outcome (absent, the draft
        kept, or the last token, and which).
      length_counts: ``(K + 1,)``; how many runs emitted ``n + 1`` tokens.
      length_expected: ``(K + 1,)``; their exact expectations.
      mean_length: mean number of tokens emitted, over runs and requests (the possible outputs;
        NaN when every output is impossible).
      mean_length_expected: its exact expectation.
      mean_length_se: the standard error of ``mean_length`` under the exact law.
      num_runs: runs per request ``R``.
      num_tests: ``K + 3`` (each at level ``alpha / num_tests``).
      alpha: the false-alarm rate of ``flagged`` (about, asymptotically).
      tested: whether the verdict rests on a test. False when ``min_variance`` pooled every
        category of every test away although the law is random (too few runs for it) and no
        output is impossible: then ``flagged`` is False without any evidence (every p-value is
        1 with zero degrees of freedom) and ``summary()`` says NOT TESTED, not ok.
    """

    flagged: bool
    impossible: int
    impossible_examples: list
    outcome_pvalue: float
    length_pvalue: float
    position_pvalues: np.ndarray
    length_counts: np.ndarray
    length_expected: np.ndarray
    mean_length: float
    mean_length_expected: float
    mean_length_se: float
    num_runs: int
    num_tests: int
    alpha: float
    tested: bool = True

    def summary(self) -> str:
        """A human-readable verdict."""
        level = self.alpha / self.num_tests
        verdict = "FLAGGED" if self.flagged else "ok" if self.tested else UNTESTED
        lines = [f"engine comparison: {verdict} "
                 f"(false-alarm rate {self.alpha:g}: {self.num_tests} tests at {level:.3g} each)",
                 f"  impossible outputs: {self.impossible}"
                 + "".join(f"\n    run {r}, request {b}: {list(t)}"
                           for r, b, t in self.impossible_examples),
                 f"  outcome (n, y) p-value: {self.outcome_pvalue:.3g}",
                 f"  length p-value: {self.length_pvalue:.3g}; mean "
                 + (f"{self.mean_length:.4f}" if math.isfinite(self.mean_length) else
                    "n/a (no possible output)")
                 + f" against {self.mean_length_expected:.4f} "
                 f"± {self.mean_length_se:.4f}",
                 "  per position p-values: "
                 + ", ".join(f"{v:.3g}" for v in np.atleast_1d(self.position_pvalues))]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


def check_min_variance(min_variance) -> float:
    """``min_variance`` as a float, or ``ValueError`` naming it unless it is a positive finite
    number (an infinite one pools every category away: a test without power)."""
    if isinstance(min_variance, bool) or not isinstance(min_variance, numbers.Real) \
            or not 0 < float(min_variance) < math.inf:
        raise ValueError(f"min_variance must be a positive finite number, got "
                         f"{min_variance!r}")
    return float(min_variance)


#: A law whose every ``P (1 - P)`` is below this is deterministic (up to float32 rounding): its
#: outcomes are fully tested by the impossible ones, with no category of variance to pool.
_DETERMINISTIC = 1e-6

#: What the summaries say of a result that could not test (``tested`` False).
UNTESTED = ("NOT TESTED: min_variance pooled every category of every test away (zero degrees "
            "of freedom, no power): give more samples or a smaller min_variance")


def is_tested(dofs, laws) -> bool:
    """Whether a verdict rests on a test: some test has positive degrees of freedom, or the law
    is deterministic (its impossible outcomes are the whole test). ``dofs``: the tests' degrees
    of freedom; ``laws``: arrays ``(B, C)`` of their category laws. False when ``min_variance``
    pooled every category of a random law away (too few samples for it): a verdict without any
    test, which must not read as a pass."""
    if any(d > 0 for d in dofs):
        return True
    laws = [np.asarray(law, np.float64) for law in laws if np.size(law)]
    # No law at all (nothing was drawn: every request drafted nothing) is nothing tested.
    return bool(laws) and max(float((law * (1 - law)).max()) for law in laws) <= _DETERMINISTIC


def _generalised_chi2(laws: np.ndarray, observed: np.ndarray, runs: int,
                      min_variance: float) -> float:
    """p-value of ``generalised_chi2_test``."""
    return generalised_chi2_test(laws, observed, runs, min_variance)[2]


def generalised_chi2_test(laws: np.ndarray, observed: np.ndarray, runs: int,
                          min_variance: float) -> tuple[float, int, float]:
    """``(statistic, degrees of freedom, p-value)`` of the counts ``observed`` (``(C,)``,
    summed over runs and requests) against ``runs`` draws from each row of ``laws`` (``(B, C)``,
    rows summing to one): the quadratic form of ``observed - expected`` in the pseudo-inverse
    of its covariance, against chi-square with the covariance's rank as degrees of freedom.

    Validity needs each category's count to be a sum of many random events, so categories are
    kept by the *variance* of their count, ``runs sum_b P_b (1 - P_b)`` (an expectation can be
    large while the count is nearly deterministic: requests that surely emit it); the others are
    pooled, and a pool of too small a variance is folded into the kept category of smallest
    variance (dropping it would leave its rare events in the statistic through the sum). When no
    category is kept the result is ``(0.0, 0, 1.0)``: zero degrees of freedom, nothing tested
    (``is_tested`` tells a verdict made of such tests alone)."""
    variance = runs * (laws * (1 - laws)).sum(0)
    keep = np.flatnonzero(variance >= min_variance)
    if keep.size > _MAX_CATEGORIES:
        keep = keep[np.argsort(variance[keep])[-_MAX_CATEGORIES:]]
    if keep.size == 0:
        return 0.0, 0, 1.0
    rest = np.ones(variance.shape, bool)
    rest[keep] = False
    groups = laws[:, keep]
    counts = observed[keep].astype(np.float64)
    if rest.any():
        pool_law = laws[:, rest].sum(1)
        pool_count = float(observed[rest].sum())
        if runs * (pool_law * (1 - pool_law)).sum() >= min_variance:
            groups = np.concatenate([groups, pool_law[:, None]], axis=1)
            counts = np.append(counts, pool_count)
        else:
            smallest = int(np.argmin(variance[keep]))
            groups[:, smallest] += pool_law
            counts[smallest] += pool_count
    diff = counts - runs * groups.sum(0)
    cov = runs * (np.diag(groups.sum(0)) - groups.T @ groups)
    w, vecs = np.linalg.eigh(cov)
    positive = w > 1e-9 * max(float(w.max()), 1e-300)
    if not positive.any():
        return 0.0, 0, 1.0
    proj = vecs[:, positive].T @ diff
    stat = float((proj ** 2 / w[positive]).sum())
    dof = int(positive.sum())
    return stat, dof, float(chi2_sf(stat, dof))


def _parse(tokens: np.ndarray, drafts: np.ndarray, counts: np.ndarray, num_tokens: int):
    """``(n, y, valid)`` per run from padded outputs ``(R, B, K + 1)``."""
    is_pad = tokens == PAD
    length = np.where(is_pad.any(-1), is_pad.argmax(-1), tokens.shape[-1])
    n = length - 1
    after = np.arange(tokens.shape[-1]) >= length[..., None]
    valid = (length >= 1) & np.all(np.where(after, is_pad, True), axis=-1)
    valid &= n <= counts[None]
    kept = np.arange(drafts.shape[-1]) < n[..., None]
    valid &= np.all(np.where(kept, tokens[..., :-1] == drafts[None], True), axis=-1)
    y = np.take_along_axis(tokens, np.clip(n, 0, None)[..., None], -1)[..., 0]
    valid &= (y >= 0) & (y < num_tokens)
    return np.clip(n, 0, None), np.clip(y, 0, num_tokens - 1), valid


def compare_outputs(decoder, draft_tokens, draft_probs, target_probs, tokens, *,
                    num_drafts=None, stop_tokens=None, bonus: bool = True, alpha: float = 1e-3,
                    min_variance: float = 5.0) -> EngineComparison:
    """Test an engine's verification outputs against specjax's exact law of them.

    Args:
      decoder: the rule the engine claims to implement (``specjax.Speculative()`` for SD).
      draft_tokens, draft_probs, target_probs, num_drafts: the inputs the engine was given,
        as for ``specjax.verify_drafts`` (``draft_probs`` the rows the drafts were drawn
        from, ``None`` for greedy or n-gram drafts).
      stop_tokens, bonus: the engine's end-of-sequence ids and whether it emits the bonus
        token, as for ``specjax.verify_drafts``.
      tokens: the engine's outputs, ``(R, B, K + 1)`` for ``R`` runs of the ``B`` requests
        (``(B, K + 1)`` for one run; ``(R, K + 1)`` when ``draft_tokens`` is ``(K,)``):
        the accepted drafts, the recovered or bonus token, then ``-1`` padding.
      alpha: the false-alarm rate of the verdict, in ``(0, 1)``.
      min_variance: categories whose count has a smaller variance under the exact law are
        pooled (chi-square validity; see the module docstring); a positive finite number.
        When it leaves no category to test in any test (too few runs for it, or too large a
        value) and no output is impossible, the result says so (``tested`` False, a summary
        of NOT TESTED), not a pass.

    Returns:
      ``EngineComparison`` (``print(result)`` for a verdict).

    Raises:
      ValueError: bad inputs (as ``verify_drafts``), outputs of the wrong shape or dtype (no run,
        unsigned ids), ``alpha`` outside ``(0, 1)``, a ``min_variance`` that is not a positive
        finite number (an infinite one would pool every category away); before any work.

    Example:
      >>> import jax, jax.numpy as jnp, specjax
      >>> p = jnp.array([[0.5, 0.5, 0.0]]); q = jnp.array([[0.4, 0.4, 0.2], [0.3, 0.3, 0.4]])
      >>> x = jnp.array([1])
      >>> runs = specjax.verify_drafts(  # 2,000 runs of one request, as a batch of copies
      ...     jax.random.key(0), specjax.Speculative(), jnp.tile(x, (2000, 1)),
      ...     jnp.tile(p, (2000, 1, 1)), jnp.tile(q, (2000, 1, 1))).tokens
      >>> result = specjax.compare_outputs(specjax.Speculative(), x, p, q, runs)
      >>> result.flagged, result.impossible
      (False, 0)
    """
    check_given_decoder(decoder)
    inputs = check_inputs(draft_tokens, draft_probs, target_probs, num_drafts)
    stop, with_bonus = check_endings(stop_tokens, bonus, inputs.target_probs.shape[-1])
    alpha = check_alpha(alpha)
    min_variance = check_min_variance(min_variance)
    num_requests, lookahead = inputs.tokens.shape
    num_tokens = inputs.target_probs.shape[-1]
    out = np.asarray(tokens)
    if not np.issubdtype(out.dtype, np.signedinteger):
        raise ValueError(f"tokens must hold signed integer ids (padded with -1), got dtype "
                         f"{out.dtype}")
    base = (num_requests, lookahead + 1) if inputs.batched else (lookahead + 1,)
    if out.shape == base and inputs.batched:
        out = out[None]
    elif out.ndim == len(base) + 1 and out.shape[1:] == base:
        pass
    else:
        raise ValueError(f"tokens must have shape (R,) + {base} (R runs) or {base} (one run of "
                         f"a batch), got {out.shape}")
    out = out.reshape(out.shape[0], num_requests, lookahead + 1)
    runs = out.shape[0]
    if runs == 0 or num_requests == 0:
        raise ValueError(f"tokens must hold at least one run of at least one request, got "
                         f"{runs} runs of {num_requests} requests")
    law = _law(decoder, inputs._replace(batched=None), stop, with_bonus, True)
    outcome = np.array(law.outcome, np.float64)  # (B, K + 1, V), a writable copy
    outcome /= outcome.sum((1, 2), keepdims=True)
    counts = np.asarray(inputs.num_drafts)
    # the checked ids (padding clipped into range): the kept positions n <= K_b compare equal
    n, y, valid = _parse(out, np.asarray(inputs.tokens), counts, num_tokens)
    prob = outcome[np.arange(num_requests)[None], n, y]
    impossible = ~valid | (prob <= 0)
    examples = [(int(r), int(b), out[r, b].tolist()) for r, b in np.argwhere(impossible)[:5]]
    ok = ~impossible

    def observed(index, size):
        return np.bincount(index[ok], minlength=size)

    tests_per_position = []
    dofs, tested = [], []

    def test(laws, counts):
        _, dof, pvalue = generalised_chi2_test(laws, counts, runs, min_variance)
        dofs.append(dof)
        tested.append(laws)
        return pvalue

    cells = n * num_tokens + y
    flat = outcome.reshape(num_requests, -1)
    outcome_p = test(flat, observed(cells, flat.shape[1]))
    length_law = outcome.sum(-1)  # (B, K + 1): P(n + 1 tokens)
    length_counts = observed(n, lookahead + 1)
    length_p = test(length_law, length_counts)
    for j in range(lookahead + 1):
        # categories: absent (n < j), draft kept (n > j), last token y here (V of them)
        laws = np.concatenate([length_law[:, :j].sum(1, keepdims=True),
                               length_law[:, j + 1:].sum(1, keepdims=True), outcome[:, j]],
                              axis=1)
        index = np.where(n < j, 0, np.where(n > j, 1, 2 + y))
        tests_per_position.append(test(laws, observed(index, num_tokens + 2)))
    mean_law = (length_law * np.arange(1, lookahead + 2)).sum(1)
    var_law = (length_law * np.arange(1, lookahead + 2) ** 2).sum(1) - mean_law ** 2
    total = runs * num_requests
    num_tests = lookahead + 3
    pvalues = np.array([outcome_p, length_p, *tests_per_position])
    flagged = bool(impossible.any() or (pvalues < alpha / num_tests).any())
    return EngineComparison(
        flagged=flagged, impossible=int(impossible.sum()), impossible_examples=examples,
        outcome_pvalue=outcome_p, length_pvalue=length_p,
        position_pvalues=np.array(tests_per_position), length_counts=length_counts,
        length_expected=runs * length_law.sum(0),
        mean_length=float((n + 1)[ok].mean()) if ok.any() else math.nan,
        mean_length_expected=float(mean_law.mean()),
        mean_length_se=float(math.sqrt(max(var_law.sum() * runs, 0.0)) / total),
        num_runs=runs, num_tests=num_tests, alpha=alpha,
        tested=bool(impossible.any()) or is_tested(dofs, tested))
