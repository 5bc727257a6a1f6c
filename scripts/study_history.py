"""Penalties and grammar masks under SD: the exact total variation of each engine bug class from
the processed target's law, and its detection by a sequence-level goodness-of-fit test.

On a small instance (``V = 3`` tokens, horizon ``T``, lookahead ``K``: stationary Dirichlet chains
lifted to ``V + 1`` states), for the engine loop of ``specjax.auditing.history`` with each
bookkeeping option (``rows``, ``record``) and draft processing:

* ``TV``: the exact total variation between the engine's law of ``x_0..x_T`` (``history_law``,
  enumerated in float64) and the processed target's (``sequence_law`` of ``penalize`` or
  ``constrain``), beside the literal per-token check ``TV (MC)``: the empirical TV of
  ``--chains`` runs of ``sample_history`` minus that of the correct engine's runs (a rough,
  biased estimate: the side-by-side sanity check, not a test);
* ``chi2``: the chi-square divergence (noncentrality per sample);
* ``N``: sequences at which ``sequence_fit`` at false-alarm rate ``--alpha`` misses the bug with
  probability at most ``1e-4`` (noncentral chi-square on the pooled categories; for a law with
  mass ``m`` outside the reference's support, the ``N`` at which no impossible sequence shows
  with probability ``(1 - m)^N <= 1e-4``);
* ``flagged``: the verdict of ``sequence_fit`` on ``N`` runs of ``sample_history`` (seed 0);
* a speculative path that ignores the penalties (its rows unpenalised) for comparison;
* ``E[calls]`` for the grammar's draft masked or not: ``specjax.exact`` on ``constrain``'ed
  models (the unmasked draft is lossless and pays in calls).

Usage: python scripts/study_history.py [--horizon 3] [--lookahead 2] [--seed 3] [--alpha 1e-3]
       [--chains 200000]
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np
from scipy import stats as sps

import specjax
from specjax.auditing.history import history_law
from specjax.auditing.history import sample_history
from specjax.auditing.history import sequence_fit
from specjax.auditing.history import sequence_law
from specjax.models import Grammar
from specjax.models import Penalties
from specjax.models import constrain
from specjax.models import penalize

V = 3
MISS = 1e-4
GRAMMAR = Grammar(np.array([[True, False, True], [False, True, True], [True, True, False]]),
                  np.array([[1, 1, 2], [0, 2, 0], [0, 1, 1]]))


def instance(seed: int):
    rng = np.random.default_rng(seed)
    rows = rng.dirichlet(np.ones(V), (2, 1, V))
    init = np.full((V,), 1 / V)
    return tuple(specjax.FiniteStateModel.from_markov_chain(specjax.MarkovChain(init, r),
                                                            stationary=True) for r in rows)


def pooled(law, reference, n, min_variance=5.0):
    variance = n * reference * (1 - reference)
    keep = variance >= min_variance
    p, q = list(law[keep]), list(reference[keep])
    rest_q, rest_p = reference[~keep].sum(), law[~keep].sum()
    if n * rest_q * (1 - rest_q) >= min_variance:
        p.append(rest_p)
        q.append(rest_q)
    elif q:
        i = int(np.argmin(variance[keep]))
        p[i] += rest_p
        q[i] += rest_q
    return np.array(p), np.array(q)


def detection_size(law, reference, alpha):
    outside = float(law.probs[reference.probs <= 0].sum())
    if outside > 0:  # an impossible sequence is proof: N for P(none in N) <= MISS
        return int(np.ceil(np.log(MISS) / np.log1p(-outside)))
    n = 100
    while n < 10**8:
        p, q = pooled(law.probs, reference.probs, n)
        df = len(q) - 1
        if sps.ncx2.cdf(sps.chi2.isf(alpha, df), df, n * float(((p - q) ** 2 / q).sum())) <= MISS:
            return n
        n = int(n * 1.05) + 1
    return None


def empirical_tv(tokens, reference):
    codes = (np.asarray(tokens, np.int64) * V ** np.arange(tokens.shape[1])[::-1]).sum(1)
    freq = np.bincount(codes, minlength=reference.probs.size) / tokens.shape[0]
    return 0.5 * np.abs(freq - reference.probs).sum()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--horizon", type=int, default=3)
    parser.add_argument("--lookahead", type=int, default=2)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--alpha", type=float, default=1e-3)
    parser.add_argument("--chains", type=int, default=200_000)
    args = parser.parse_args(argv)
    jax.config.update("jax_enable_x64", True)
    T, K = args.horizon, args.lookahead
    draft, target = instance(args.seed)
    pen = Penalties(repetition=2.0, frequency=1.0, presence=0.5, cap=max(T - 1, 1))
    settings = dict(horizon=T, lookahead=K)
    cases = [
        ("penalties, correct", pen, None, "per_position", "accepted"),
        ("penalties, correct, penalised draft", pen, pen._replace(repetition=1.5),
         "per_position", "accepted"),
        ("(a) one token per step (SGLang #33643)", pen, None, "per_position", "last"),
        ("(a') + penalties of the step's start", pen, None, "call_start", "last"),
        ("(b) rejected drafts counted (vmlx #357)", pen, None, "per_position", "drafted"),
        ("(b) same, penalised draft", pen, pen._replace(repetition=1.5), "per_position",
         "drafted"),
        ("rows of the call's start (SGLang relaxed)", pen, None, "call_start", "accepted"),
        ("penalties ignored (vLLM #18902)", Penalties(cap=pen.cap), None,
         "per_position", "accepted"),
        ("grammar, correct, masked draft", GRAMMAR, GRAMMAR, "per_position", "accepted"),
        ("(c) grammar, unmasked draft", GRAMMAR, None, "per_position", "accepted"),
        ("grammar, window masked at call start", GRAMMAR, None, "call_start", "accepted"),
    ]
    correct = sequence_law(penalize(target, pen), T)
    references = {id(pen): correct, id(GRAMMAR): sequence_law(constrain(target, GRAMMAR), T)}
    start = time.perf_counter()
    key = jax.random.key(0)
    baseline = {}
    rows_out = []
    print(f"V = {V}, T = {T}, K = {K}, penalties {tuple(pen)} (repetition, frequency, presence, "
          f"cap); alpha = {args.alpha:g}, miss <= {MISS:g}\n")
    head = (f"{'case':44s} {'rows':>12s} {'record':>8s} {'TV':>8s} {'TV (MC)':>8s} "
            f"{'chi2':>9s} {'N':>7s} {'flagged':>8s}")
    print(head)
    print("-" * len(head))
    for name, proc, draft_proc, rows, record in cases:
        reference = references.get(id(proc), correct)  # ignored penalties: against pen's
        law = history_law(draft, target, proc, draft_processing=draft_proc, rows=rows,
                          record=record, **settings)
        tv = law.total_variation(reference)
        tokens = sample_history(key, draft, target, proc, args.chains, draft_processing=draft_proc,
                                rows=rows, record=record, **settings)
        mc = empirical_tv(np.asarray(tokens), reference)
        if (id(proc), draft_proc is None) not in baseline and tv < 1e-12:
            baseline[id(proc), draft_proc is None] = mc
        mc -= baseline.get((id(proc), draft_proc is None), baseline.get((id(proc), False), 0.0))
        chi2 = law.chi_square_divergence(reference)
        n = detection_size(law, reference, args.alpha) if tv > 1e-12 else None
        if n is not None:
            sample = sample_history(jax.random.fold_in(key, len(rows_out)), draft, target, proc,
                                    n, draft_processing=draft_proc, rows=rows, record=record,
                                    **settings)
            flagged = sequence_fit(sample, reference, alpha=args.alpha).flagged
        else:
            flagged = sequence_fit(tokens[:2000], reference, alpha=args.alpha).flagged
        rows_out.append((name, rows, record, tv, mc, chi2, n, flagged))
        print(f"{name:44s} {rows:>12s} {record:>8s} {tv:8.4f} {mc:8.4f} {chi2:9.4f} "
              f"{n if n is not None else '-':>7} {str(flagged):>8s}")
    calls = {}
    for label, draft_grammar in (("masked", GRAMMAR), ("unmasked", GRAMMAR._replace(
            allowed=np.ones_like(GRAMMAR.allowed)))):
        theory = specjax.exact(specjax.Speculative(lookahead=K), constrain(draft, draft_grammar),
                               constrain(target, GRAMMAR), horizon=T)
        calls[label] = float(theory.expected_calls)
    print(f"\ngrammar: E[calls] with the draft masked {calls['masked']:.4f}, unmasked "
          f"{calls['unmasked']:.4f} (T = {T}; exact)")
    print(f"({time.perf_counter() - start:.1f} s)")
    return rows_out, calls


if __name__ == "__main__":
    main()
