"""Auditing a single-step verification rule: is it unbiased, and what does it cost?

A serving engine's verification step is a function ``verify(key, p, q, x) -> (accepted, token)``
(draft row ``p``, target row ``q``, drafted token ``x``). It is correct when the emitted token's
law is exactly ``q`` whatever ``p`` is, and efficient when it accepts as often as any unbiased rule
can: ``sum_x min(d(x), q(x))`` where ``d`` is the law the drafts were drawn from (``p`` for
ordinary SD, the one-hot of ``argmax p`` for a greedy draft). Bugs found in real engines (a rule
that accepts every draft, a residual computed from the wrong distribution, a greedy draft scored
with the softmax it did not sample from, a zero-probability token accepted at ``u = 0.0``) are
all visible in these two numbers, and the last only at a single point of ``u``.

* ``audit(key, verify, p, q)``: Monte Carlo. Draws ``num_samples`` drafts per row, runs the rule
  on each (``vmap`` under ``jit``, in chunks of bounded memory), and tests the emitted tokens'
  counts against ``q`` by a chi-square test, the acceptance rate against the optimum.
* ``audit_exact(verify_u, p, q)`` (in ``specjax.auditing.audit_exact``, served from here too):
  the rule written as a function of one uniform ``u`` in ``[0, 1)``; integrates over ``u``
  exactly (a grid plus bisection of every change of outcome), and evaluates ``u = 0.0`` itself.

Both return an ``AuditReport``. The example rules (``speculative_rule``, ``greedy_rule`` and the
broken ``accept_all``, ``wrong_residual``, ``greedy_scored_with_softmax``,
``accepts_at_zero_uniform``, each also in uniform form ``*_u``; ``from_uniform``) live in
``specjax.auditing.rules`` and are re-exported here (and served from ``specjax.auditing``).
What both audits share (the argument checks, the chi-square tail ``chi2_sf``, the host-side
helpers) is in ``specjax.auditing.audit_shared``, served from here too; ``first_row`` is here.

A useful fact for reading a report: an unbiased rule cannot accept more than the optimum, and a
rule that does is biased by at least the excess in total variation, since each token ``y``
accepted as a draft contributes ``P(x = y, accepted) <= d(y)`` to the output, so
``TV(output, q) >= sum_y [P(x = y, accepted) - q(y)]_+ >= acceptance - sum_y min(d(y), q(y))``.
"""

from __future__ import annotations

import functools
import math
import statistics
from typing import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax.auditing.audit_shared import HOST_CHECK
from specjax.auditing.audit_shared import _chi2_pvalues
from specjax.auditing.audit_shared import _typed_key
from specjax.auditing.audit_shared import check_alpha
from specjax.auditing.audit_shared import check_drafting
from specjax.auditing.audit_shared import check_rows
from specjax.auditing.audit_shared import check_rule
from specjax.auditing.audit_shared import chi2_sf  # noqa: F401 - served from here too
from specjax.auditing.audit_shared import draft_law_of
from specjax.auditing.audit_shared import drafting_name
from specjax.auditing.audit_shared import normalised
from specjax.auditing.rules import BROKEN_RULES
from specjax.auditing.rules import CORRECT_RULES
from specjax.auditing.rules import Rule
from specjax.auditing.rules import accept_all
from specjax.auditing.rules import accept_all_u
from specjax.auditing.rules import accepts_at_zero_uniform
from specjax.auditing.rules import accepts_at_zero_uniform_u
from specjax.auditing.rules import from_uniform
from specjax.auditing.rules import greedy_rule
from specjax.auditing.rules import greedy_rule_u
from specjax.auditing.rules import greedy_scored_with_softmax
from specjax.auditing.rules import greedy_scored_with_softmax_u
from specjax.auditing.rules import speculative_rule
from specjax.auditing.rules import speculative_rule_u
from specjax.auditing.rules import wrong_residual
from specjax.auditing.rules import wrong_residual_u

__all__ = [
    "AuditReport", "audit", "audit_exact", "Rule", "CORRECT_RULES", "BROKEN_RULES", "from_uniform",
    "speculative_rule", "speculative_rule_u", "greedy_rule", "greedy_rule_u", "accept_all",
    "accept_all_u", "wrong_residual", "wrong_residual_u", "greedy_scored_with_softmax",
    "greedy_scored_with_softmax_u", "accepts_at_zero_uniform", "accepts_at_zero_uniform_u",
]

_MAX_SAMPLES = 2**31 - 1  # int32 counts
_CHUNK_ELEMENTS = 1 << 22  # rows x samples x V per chunk: tens of MB of working memory


class AuditReport(NamedTuple):
    """What ``audit`` / ``audit_exact`` found, per row (leading ``B`` only for batched input).

    Attributes:
      output_law: ``(B, V)``; the law of the emitted token (empirical, or exact).
      target: ``(B, V)``; ``q``, normalised in float64.
      tv_bias: ``(B,)``; ``TV(output_law, q)``.
      tv_bias_bound: ``(B,)``; Monte Carlo: the noise level of ``tv_bias``: an unbiased rule
        gives ``tv_bias > tv_bias_bound`` with probability at most ``alpha`` (McDiarmid's
        inequality around ``E TV <= (1/2) sum_y sqrt(q(y) (1 - q(y)) / N)``). Exact: the float
        tolerance ``tol`` below which a bias is attributed to rounding.
      chi2_pvalue: ``(B,)``; chi-square p-value of the emitted tokens' counts against ``q`` over
        the tokens with ``q > 0`` (bins of expected count below 5 pooled); NaN in exact mode.
      impossible_tokens: ``(B, V)``; per token with ``q = 0`` (0 elsewhere): how often it was
        emitted (Monte Carlo counts) or its exact probability (exact mode).
      invalid_tokens: ``(B,)``; emitted tokens outside ``[0, V)`` (count, or exact probability).
      isolated_tokens: ``(B, V)`` bool; exact mode: tokens emitted at ``u = 0.0`` exactly but not
        just above it (an outcome of measure zero that a float uniform still produces, with
        probability ``2^-23`` in float32); all False in Monte Carlo.
      acceptance_rate: ``(B,)``; fraction of drafts accepted.
      acceptance_rate_se: ``(B,)``; its binomial standard error (0 in exact mode).
      optimal_acceptance: ``(B,)``; ``sum min(d, q)`` with ``d`` the law the drafts were drawn
        from (``p``; the one-hot of ``argmax p`` for greedy drafts; the drafts' empirical law for
        a drafting function).
      acceptance_gap: ``(B,)``; ``optimal_acceptance - acceptance_rate`` (what the rule leaves on
        the table; negative beyond noise only for a biased rule).
      biased: ``(B,)`` bool; Monte Carlo: ``chi2_pvalue < alpha``, an impossible token or an
        invalid token seen. Exact: ``tv_bias > tol``, any impossible or invalid mass, an impossible
        isolated token, or acceptance above the optimum.
      accepts_more_than_possible: ``(B,)`` bool; acceptance significantly above the optimum (a
        one-sided test at level ``alpha``; exact: above by more than ``tol``), which only a
        biased rule can do, by at least the excess in TV.
      num_samples: drafts per row (0 in exact mode).
      alpha: the false-alarm rate per row and per test (Monte Carlo); NaN in exact mode.
      drafting: ``"sample"``, ``"greedy"`` or the drafting function's name.
      exact: whether the numbers are exact (``audit_exact``).
      unresolved: ``(B,)``; exact mode: grid cells where bisection met a third outcome, i.e. the
        rule has a piece narrower than the grid spacing there (the law may then be off by up to
        the cell width each); 0 in Monte Carlo.
    """

    output_law: np.ndarray  # shape=(B, V), float64
    target: np.ndarray  # shape=(B, V), float64
    tv_bias: np.ndarray  # shape=(B,)
    tv_bias_bound: np.ndarray  # shape=(B,)
    chi2_pvalue: np.ndarray  # shape=(B,)
    impossible_tokens: np.ndarray  # shape=(B, V)
    invalid_tokens: np.ndarray  # shape=(B,)
    isolated_tokens: np.ndarray  # shape=(B, V), bool
    acceptance_rate: np.ndarray  # shape=(B,)
    acceptance_rate_se: np.ndarray  # shape=(B,)
    optimal_acceptance: np.ndarray  # shape=(B,)
    acceptance_gap: np.ndarray  # shape=(B,)
    biased: np.ndarray  # shape=(B,), bool
    accepts_more_than_possible: np.ndarray  # shape=(B,), bool
    num_samples: int
    alpha: float
    drafting: str
    exact: bool
    unresolved: np.ndarray  # shape=(B,), int

    @property
    def any_biased(self) -> bool:
        """Whether any audited row was found biased."""
        return bool(np.any(self.biased))

    def summary(self) -> str:
        """A human-readable table, one line per row, with the verdict."""
        mode = ("exact (integrated over u)" if self.exact else
                f"Monte Carlo, {self.num_samples:,} drafts per row, alpha = {self.alpha:g} per row")
        rows = [np.atleast_1d(np.asarray(f)) for f in (
            self.biased, self.accepts_more_than_possible, self.acceptance_rate,
            self.acceptance_rate_se, self.optimal_acceptance, self.tv_bias, self.tv_bias_bound,
            self.chi2_pvalue, self.invalid_tokens, self.unresolved)]
        impossible = np.atleast_2d(self.impossible_tokens)
        isolated = np.atleast_2d(self.isolated_tokens)
        lines = [f"verification audit: {mode}, drafting = {self.drafting!r}",
                 f"{'row':>3}  {'verdict':<9} {'acceptance':>18} {'optimum':>8} "
                 f"{'TV bias':>9} {'noise/tol':>9} {'chi2 p':>9}  notes"]
        for b, (bias, more, acc, se, opt, tv, bound, pv, invalid, unres) in enumerate(zip(*rows)):
            notes = []
            if more:
                notes.append("accepts more than any unbiased rule can")
            bad = np.flatnonzero(impossible[b] > 0)
            if bad.size:
                what = "times" if not self.exact else "probability"
                notes.append("emits q = 0 tokens " + ", ".join(
                    f"{t} ({impossible[b, t]:.3g} {what})" for t in bad[:4]))
            iso = np.flatnonzero(isolated[b])
            if iso.size:
                zero = np.atleast_2d(self.target)[b] == 0
                notes.append("at u = 0.0 only, emits " + ", ".join(
                    f"{t}{' (q = 0)' if zero[t] else ''}" for t in iso[:4]))
            if invalid > 0:
                notes.append(f"tokens outside [0, V): {invalid:.3g}")
            if unres:
                notes.append(f"{unres} grid cells unresolved (pieces narrower than the grid)")
            acc_txt = f"{acc:.5f}" if self.exact else f"{acc:.5f} ± {se:.5f}"
            pv_txt = "n/a" if np.isnan(pv) else f"{pv:.3g}"
            lines.append(f"{b:>3}  {'BIASED' if bias else 'ok':<9} {acc_txt:>18} {opt:>8.5f} "
                         f"{tv:>9.5f} {bound:>9.2g} {pv_txt:>9}  {'; '.join(notes)}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


# ---------------------------------------------------------------------------------------------
# Monte Carlo.


def _draft(key, p_row, drafting):
    if drafting == "sample":
        return jax.random.categorical(key, jnp.log(p_row)).astype(jnp.int32)
    if drafting == "greedy":
        return jnp.argmax(p_row).astype(jnp.int32)
    return jnp.asarray(drafting(key, p_row), jnp.int32)


@functools.partial(jax.jit, static_argnames=("verify", "drafting", "num_samples", "chunk"))
def _simulate(key, p, q, *, verify, drafting, num_samples, chunk):
    """Counts of emitted tokens, drafts, acceptances and out-of-range tokens, per row.

    Sample ``i`` of row ``b`` uses ``fold_in(fold_in(key, b), i)``: results do not depend on the
    chunking, and a single row equals row 0 of a batch.
    """
    num_tokens = p.shape[-1]
    num_chunks = -(-num_samples // chunk)

    def one(key_row, p_row, q_row, i):
        key_draft, key_verify = jax.random.split(jax.random.fold_in(key_row, i))
        x = _draft(key_draft, p_row, drafting)
        accepted, token = verify(key_verify, p_row, q_row, x)
        return x, jnp.asarray(accepted, bool), jnp.asarray(token, jnp.int32)

    def count(values, weight):
        inside = (values >= 0) & (values < num_tokens)
        return jnp.zeros(num_tokens, jnp.int32).at[jnp.where(inside, values, 0)].add(
            (weight & inside).astype(jnp.int32))

    def row(key_row, p_row, q_row):
        def body(carry, c):
            tokens, drafts, accepted, invalid = carry
            idx = c * chunk + jnp.arange(chunk, dtype=jnp.uint32)
            valid = idx < num_samples
            x, acc, tok = jax.vmap(one, in_axes=(None, None, None, 0))(key_row, p_row, q_row, idx)
            outside = valid & ((tok < 0) | (tok >= num_tokens))
            return (tokens + count(tok, valid), drafts + count(x, valid),
                    accepted + jnp.sum(valid & acc, dtype=jnp.int32),
                    invalid + jnp.sum(outside, dtype=jnp.int32)), None

        zeros = jnp.zeros(num_tokens, jnp.int32)
        init = (zeros, zeros, jnp.int32(0), jnp.int32(0))
        return jax.lax.scan(body, init, jnp.arange(num_chunks, dtype=jnp.uint32))[0]

    keys = jax.vmap(lambda b: jax.random.fold_in(key, b))(jnp.arange(p.shape[0], dtype=jnp.uint32))
    return jax.vmap(row)(keys, p, q)


def audit(key: jax.Array, verify: Callable, p, q, *, num_samples: int = 200_000,
          drafting="sample", alpha: float = 1e-6) -> AuditReport:
    """Monte Carlo audit of a verification rule: bias against ``q`` and acceptance against optimum.

    For each row, draws ``num_samples`` drafts ``x`` (``x ~ p``, ``x = argmax p``, or
    ``drafting(key, p)``), runs ``verify(key, p, q, x)`` on each (``vmap`` under ``jit``, in
    chunks of bounded memory) and compares the emitted tokens' counts with ``q``.

    False alarms: for an unbiased rule each audited row is reported ``biased`` with probability at
    most about ``alpha`` (the chi-square test's asymptotic level, bins of expected count below 5
    pooled; an impossible token is never a false alarm), and ``accepts_more_than_possible`` with
    probability at most about ``alpha`` (one-sided normal test). Auditing ``B`` rows, the chance of
    any false alarm is at most about ``2 B alpha``.

    Power: a bias of ``TV = t`` gives the chi-square a non-centrality of at least ``4 N t^2``
    (Cauchy-Schwarz), against critical values at ``alpha = 1e-6`` of 24, 31, 47 and 182 for 1, 3,
    10 and 100 degrees of freedom (pooled bins minus one). With ``N = 200,000`` a bias
    ``t = 0.01`` is detected with probability above 0.996 up to 10 degrees of freedom, but only
    about 0.45 with 100: for large ``V`` raise ``num_samples`` or audit in exact mode.

    Args:
      key: a PRNG key; sample ``i`` of row ``b`` uses ``fold_in(fold_in(key, b), i)`` split into
        a drafting key and the key passed to ``verify``.
      verify: ``(key, p, q, x) -> (accepted, token)``, jax-traceable (it is vmapped and jitted;
        pass the same function object to reuse the compilation). ``p``, ``q`` are the ``(V,)``
        rows, ``x`` an int32 scalar.
      p: ``(V,)`` draft row or ``(B, V)`` rows (the softmax the rule sees, even for greedy drafts).
      q: target row(s), same shape as ``p``.
      num_samples: drafts per row ``N``.
      drafting: ``"sample"`` (ordinary SD), ``"greedy"`` (a deterministic draft), or a function
        ``(key, p) -> x``, whose draft law is then estimated by the drafts' empirical law (the
        optimum and its test allow for that estimate's error).
      alpha: false-alarm rate per row and per test, in ``(0, 1)``.

    Returns:
      ``AuditReport`` (fields per row when ``p`` is ``(B, V)``; ``print(report)`` for a table).

    Raises:
      ValueError: bad key, shapes, probabilities (negative, NaN, rows not summing to one),
        ``num_samples``, ``drafting``, ``alpha``, or a ``verify`` that does not return two
        scalars; before any sampling.

    A host-side check (its report holds Python numbers): call it outside ``jax.jit``, ``vmap``
    and ``grad``; with a traced key, ``p`` or ``q`` it raises ``ValueError`` saying so. Under
    ``jax.jit(audit)`` JAX itself refuses ``verify`` first ("Error interpreting argument": a
    function is not a JAX type); ``verify`` may use ``jit`` and ``vmap`` inside.
    """
    _checks.refuse_traced("audit", HOST_CHECK, key=key, p=p, q=q)
    key = _typed_key(key)
    p, q, batched = check_rows(p, q)
    _checks.check_positive_int("num_samples", num_samples)
    if num_samples > _MAX_SAMPLES:
        raise ValueError(f"num_samples must be at most {_MAX_SAMPLES} (int32 counts), "
                         f"got {num_samples}")
    check_drafting(drafting, exact=False)
    alpha = check_alpha(alpha)
    check_rule("verify", verify, key, p[0], q[0])
    if callable(drafting):
        try:
            out = jax.eval_shape(drafting, key, p[0])
        except (TypeError, ValueError) as err:
            raise ValueError(f"drafting must be a jax-traceable drafting(key, p) -> x; tracing "
                             f"it failed: {err}") from err
        if getattr(out, "shape", None) != () or not jnp.issubdtype(out.dtype, jnp.integer):
            raise ValueError(f"drafting must return an integer scalar token, got {out}")

    num_rows, num_tokens = p.shape
    max_chunk = max(1, _CHUNK_ELEMENTS // (num_rows * num_tokens))
    chunk = -(-num_samples // -(-num_samples // max_chunk))
    tokens, drafts, accepted, invalid = jax.device_get(_simulate(
        key, p, q, verify=verify, drafting=drafting, num_samples=num_samples, chunk=chunk))

    n = num_samples
    target = normalised(q)
    law = tokens / n
    if callable(drafting):
        draft_law = drafts / n
    else:
        draft_law = draft_law_of(normalised(p), p, drafting)
    rate = accepted / n
    se = np.sqrt(rate * (1 - rate) / n)
    optimum = np.minimum(draft_law, target).sum(-1)
    z = statistics.NormalDist().inv_cdf(1 - alpha)
    # One-sided test of acceptance <= optimum, with the null's own variance (conservative where
    # the normal approximation is poor: few rejections expected).
    slack = z * np.sqrt(np.clip(optimum * (1 - optimum), 0, None) / n) + 1e-9
    if callable(drafting):  # |optimum_hat - optimum| <= 2 TV(empirical drafts, draft law)
        slack = slack + np.sqrt(draft_law * (1 - draft_law) / n).sum(-1) \
            + 2 * math.sqrt(math.log(2 / alpha) / (2 * n))
    impossible = np.where(target == 0, tokens, 0)
    pvalue = _chi2_pvalues(tokens, target, n)
    noise = 0.5 * np.sqrt(target * (1 - target) / n).sum(-1) + math.sqrt(math.log(1 / alpha)
                                                                          / (2 * n))
    report = AuditReport(
        output_law=law, target=target, tv_bias=0.5 * np.abs(law - target).sum(-1),
        tv_bias_bound=noise, chi2_pvalue=pvalue, impossible_tokens=impossible,
        invalid_tokens=invalid, isolated_tokens=np.zeros(law.shape, bool), acceptance_rate=rate,
        acceptance_rate_se=se, optimal_acceptance=optimum, acceptance_gap=optimum - rate,
        biased=(pvalue < alpha) | (impossible.sum(-1) > 0) | (invalid > 0),
        accepts_more_than_possible=rate - optimum > slack, num_samples=n, alpha=alpha,
        drafting=drafting_name(drafting), exact=False,
        unresolved=np.zeros(num_rows, np.int64))
    return report if batched else first_row(report)


def first_row(report: AuditReport) -> AuditReport:
    """The report of a single ``(V,)`` pair: every per-row field's row 0."""
    per_row = {"num_samples", "alpha", "drafting", "exact"}
    return report._replace(**{
        name: (value if name in per_row else value[0])
        for name, value in report._asdict().items()})


# The exact audit, served from here too (``from specjax.auditing.audit import audit_exact``).
# Imported last: its module imports the report and the checks above, and ``specjax.auditing``
# imports this module first.
from specjax.auditing.audit_exact import audit_exact  # noqa: E402
