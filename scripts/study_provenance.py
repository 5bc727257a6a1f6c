"""Provenance of drafts and strict verification: the tables of docs/guides/provenance.md.

1. **Top-k drafts declared whole** (transformers #47932): rows of random logits over ``V``
   tokens, drafts sampled from their top-``k`` while the whole rows are declared. The mean TV
   between the two laws, and the share of ``--reps`` repetitions that ``check_provenance`` flags
   (``alpha = 1e-3``, ``K = 2``) for ``B`` requests (every row a different law).
2. **bfloat16 drafts** (DeepSpec #31): bfloat16 logits (a model's output, ``offset + 4 N(0, 1)``:
   real logits are not centred and bfloat16 rounds on the scale of their magnitude), declared as
   the float32 softmax at temperature ``t``, sampled through temperature and softmax in
   bfloat16. Per row: the TV and the chi-square divergence ``sum (r - p)^2 / p``, and the
   draws of one recurring context that the token binning needs for power 0.9 (noncentral
   chi-square); then the measured share flagged at that size (one recurring row: the token
   binning is Pearson's test, computed by the check's own helper) and with ``--max-distinct``
   rows all different (unbiased rounding averages out: flagged at about the false-alarm rate).
3. **False alarms**: correct drafts (``B`` requests, ragged ``num_drafts``, every row a different
   law), ``--reps-null`` repetitions at ``alpha = 0.05`` and ``0.01``: the share flagged against
   the binomial bound, and the share of single p-values below 0.01.
4. **Strict verification against SD**: exact expected target calls on the paper's instance and
   on n-gram models of the standard library's source (``scripts/ngram_demo.py``'s corpus), at
   several ``K``; sampled and greedy drafts.

Usage: python scripts/study_provenance.py [--reps 20] [--reps-distinct 10] [--reps-null 200]
       [--quick]
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from scipy import optimize
from scipy import stats

import specjax
from specjax.auditing import check_provenance
from specjax.auditing.compare import generalised_chi2_test

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import ngram_demo  # noqa: E402  (the corpus and its character classes, written once)


def softmax(logits):
    z = np.exp(logits - logits.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def draw(rng, rows):
    """One draw per row ``(..., V)`` by the inverse CDF."""
    u = rng.random(rows.shape[:-1])
    return np.minimum((np.cumsum(rows, -1) <= u[..., None]).sum(-1), rows.shape[-1] - 1)


def top_k(rows, k):
    keep = rows >= np.sort(rows, -1)[..., -k:-k + 1]
    kept = np.where(keep, rows, 0)
    return kept / kept.sum(-1, keepdims=True)


def table(header, rows):
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()


def study_top_k(args, rng):
    print("## 1. Top-k drafts, whole rows declared (transformers #47932)\n")
    rows_out = []
    for num_tokens, sigma, k in args.top_k_cases:
        for requests in args.requests:
            flagged = 0
            tvs = []
            for _ in range(args.reps):
                rows = softmax(sigma * rng.standard_normal((requests, 2, num_tokens)))
                sampled = top_k(rows, k)
                tvs.append(0.5 * np.abs(sampled - rows).sum(-1).mean())
                flagged += check_provenance(draw(rng, sampled), rows).flagged
            rows_out.append([str(num_tokens), f"{sigma:g}", str(k), f"{np.mean(tvs):.3f}",
                             f"{requests:,}", f"{flagged}/{args.reps}"])
    table(["V", "logit scale", "top-k", "mean TV", "requests B", "flagged"], rows_out)


def bf16_laws(num_tokens, offset, temperature, count, seed=0):
    """``(declared, sampled)`` ``(count, V)`` float64: the float32 softmax of bfloat16 logits
    at ``temperature``, and the law of temperature and softmax in bfloat16."""
    logits = (offset + 4.0 * jax.random.normal(jax.random.key(seed), (count, num_tokens))
              ).astype(jnp.bfloat16)
    declared = np.asarray(jax.nn.softmax(logits.astype(jnp.float32) / temperature), np.float64)
    sampled = np.asarray(jax.nn.softmax(logits / jnp.bfloat16(temperature)).astype(jnp.float32),
                         np.float64)
    return (declared / declared.sum(-1, keepdims=True),
            sampled / sampled.sum(-1, keepdims=True))


def draws_needed(divergence, dof, level, power=0.9):
    """Draws of one recurring row whose Pearson statistic (noncentrality ``N divergence``)
    exceeds the level's critical value with probability ``power``."""
    critical = stats.chi2.isf(level, dof)
    lam = optimize.brentq(lambda x: stats.ncx2.sf(critical, dof, x) - power, 1e-6, 1e9)
    return lam / divergence


def study_bf16(args, rng):
    print("## 2. bfloat16 drafts, float32 law declared (DeepSpec #31)\n")
    level = 1e-3 / 4  # check_provenance's per-test level for K = 1, two binnings
    rows_out = []
    measured = []
    for num_tokens in args.bf16_vocab:
        for offset in (0.0, 20.0):
            for temperature in (1.0, 0.7):
                declared, sampled = bf16_laws(num_tokens, offset, temperature, 64)
                tv = 0.5 * np.abs(sampled - declared).sum(-1)
                divergence = ((sampled - declared) ** 2 / declared).sum(-1)
                median = int(np.argsort(divergence)[len(divergence) // 2])
                need = draws_needed(divergence[median], num_tokens - 1, level)
                rows_out.append([str(num_tokens), f"{offset:g}", f"{temperature:g}",
                                 f"{tv.mean():.1e}", f"{divergence.mean():.1e}",
                                 f"{need:.2g}"])
                if need <= args.max_draws:
                    measured.append((num_tokens, offset, temperature, declared[median],
                                     sampled[median], int(np.ceil(need))))
    table(["V", "logit offset", "temperature", "mean TV", "mean chi2 divergence",
           "draws of one context for power 0.9"], rows_out)
    rows_out = []
    for num_tokens, offset, temperature, declared, sampled, need in measured:
        recurring = 0
        for _ in range(args.reps):  # one recurring row: the token binning is Pearson's test
            counts = rng.multinomial(need, sampled)
            recurring += generalised_chi2_test(declared[None], counts, need, 5.0)[2] < level
        distinct = 0
        different = min(need, args.max_distinct)
        for rep in range(args.reps_distinct):
            rows, law = bf16_laws(num_tokens, offset, temperature, different, seed=rep + 1)
            distinct += check_provenance(draw(rng, law)[:, None], rows[:, None]).flagged
        rows_out.append([str(num_tokens), f"{offset:g}", f"{temperature:g}", f"{need:,}",
                         f"{recurring}/{args.reps}", f"{different:,}",
                         f"{distinct}/{args.reps_distinct}"])
    table(["V", "logit offset", "temperature", "draws", "flagged (one recurring context)",
           "rows all different", "flagged (all different)"], rows_out)


def study_false_alarms(args, rng):
    print("## 3. False alarms on correct drafts\n")
    requests, lookahead, num_tokens = 500, 3, 64
    rows_out = []
    for alpha in (0.05, 0.01):
        flagged, small, total = 0, 0, 0
        for _ in range(args.reps_null):
            rows = softmax(2.0 * rng.standard_normal((requests, lookahead, num_tokens)))
            counts = rng.integers(0, lookahead + 1, requests)
            check = check_provenance(draw(rng, rows), rows, num_drafts=counts, alpha=alpha)
            flagged += check.flagged
            small += int((check.pvalues < 0.01).sum())
            total += check.pvalues.size
        bound = stats.binom.ppf(1 - 1e-3, args.reps_null, alpha)
        rows_out.append([f"{alpha:g}", f"{flagged}/{args.reps_null}", f"{int(bound)}",
                         f"{small / total:.4f}"])
    table(["alpha", "flagged", "binomial(reps, alpha) 99.9% quantile",
           "share of p-values < 0.01"], rows_out)


def ngram_pair(num_states, max_bytes):
    texts = ngram_demo.read_corpus(max_bytes)
    classes = ngram_demo.character_classes(texts, num_states)
    sequences = ngram_demo.encode(texts, classes, num_states)
    fit = dict(num_states=num_states, smoothing=0.5, backoff=2.0)
    draft = specjax.NGramModel.fit(sequences, order=2, **fit)
    target = specjax.NGramModel.fit(sequences, order=3, **fit)
    return draft.as_finite_state(2), target.as_finite_state(2)


def study_strict(args):
    print("## 4. Strict verification against SD: exact expected target calls\n")
    strict = specjax.decoders.StrictVerification
    paper = specjax.paper_instance()
    ngram = ngram_pair(args.ngram_states, args.ngram_bytes)
    rows_out = []
    for name, (draft, target), kw in (("paper's instance (T = 50)", paper, {}),
                                      (f"n-grams, V = {args.ngram_states} (T = {args.horizon})",
                                       ngram, dict(horizon=args.horizon))):
        for greedy in (False, True):
            d = specjax.models.greedy_draft(draft) if greedy else draft
            for k in (None, 2, 4, 8):
                sd = float(specjax.exact(specjax.Speculative(lookahead=k), d, target,
                                         **kw).expected_calls)
                st = float(specjax.exact(strict(lookahead=k), d, target, **kw).expected_calls)
                rows_out.append([name, "greedy" if greedy else "sampled",
                                 "T" if k is None else str(k), f"{sd:.3f}", f"{st:.3f}",
                                 f"{st / sd:.3f}"])
    table(["models", "draft", "K", "SD E[calls]", "strict E[calls]", "strict / SD"], rows_out)


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--reps-distinct", type=int, default=10)
    parser.add_argument("--reps-null", type=int, default=200)
    parser.add_argument("--max-draws", type=int, default=200_000)
    parser.add_argument("--max-distinct", type=int, default=5_000)
    parser.add_argument("--ngram-states", type=int, default=12)
    parser.add_argument("--ngram-bytes", type=int, default=300_000)
    parser.add_argument("--horizon", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="toy sizes (a smoke test)")
    args = parser.parse_args(argv)
    args.top_k_cases = [(1000, 2.0, 50), (1000, 3.0, 50), (1000, 3.0, 200)]
    args.requests = (100, 300, 1000)
    args.bf16_vocab = (1000, 32000)
    if args.quick:
        args.reps, args.reps_null, args.max_draws, args.max_distinct = 2, 4, 60_000, 2_000
        args.reps_distinct = 2
        args.top_k_cases, args.requests, args.bf16_vocab = [(64, 2.0, 8)], (100,), (64,)
        args.ngram_states, args.ngram_bytes, args.horizon = 6, 20_000, 8
    return args


def main(argv=None):
    args = parse(argv)
    rng = np.random.default_rng(args.seed)
    start = time.perf_counter()
    study_top_k(args, rng)
    study_bf16(args, rng)
    study_false_alarms(args, rng)
    study_strict(args)
    print(f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
