"""Audits the correct and the deliberately broken verification rules of ``specjax.auditing``.

Three (draft, target) rows over ``V`` tokens, in float32:

* ``peaked``: LLM-like next-token laws: a target that puts most of its mass on a few tokens
  (softmax of Zipf-like logits at temperature 0.7) and a draft that is a noisy copy of it;
* ``disjoint``: draft on the first half of the vocabulary, target on the second;
* ``p = q``: the same Dirichlet row twice.

Each rule is audited on every row by Monte Carlo (``audit``, ``--num-samples`` drafts per row)
and exactly (``audit_exact`` on its uniform form). The table has one line per rule and row:
acceptance against the optimum ``sum min(d, q)`` (``d`` the draft's law), the TV bias and its
noise level, the chi-square p-value, the Monte Carlo verdict, and the exact acceptance, bias
and verdict. The rows where a broken rule is unbiased (e.g. every rule at ``p = q``, where the
residual is never used) show that a bug can hide on the rows one happens to test.

``main(argv)`` returns the rows as dicts. Usage:
python scripts/audit_rules.py [--num-samples 200000] [--vocab 16] [--grid 65536] [--rules ...]
"""

from __future__ import annotations

import argparse

import jax
import numpy as np

from specjax.auditing.audit import BROKEN_RULES
from specjax.auditing.audit import CORRECT_RULES
from specjax.auditing.audit import audit
from specjax.auditing.audit import audit_exact

RULES = {**CORRECT_RULES, **BROKEN_RULES}


def instance_rows(vocab: int, seed: int = 0):
    """``(names, p, q)``: the three rows as ``(3, V)`` float32 arrays."""
    rng = np.random.default_rng(seed)
    logits = -1.5 * np.log(np.arange(1, vocab + 1)) + 0.5 * rng.standard_normal(vocab)
    softmax = lambda z: np.exp(z - z.max()) / np.exp(z - z.max()).sum()  # noqa: E731
    q_peaked = softmax(logits / 0.7)
    p_peaked = softmax((logits + 0.7 * rng.standard_normal(vocab)) / 0.7)
    half = vocab // 2
    p_disjoint = np.r_[np.full(half, 1 / half), np.zeros(vocab - half)]
    q_disjoint = np.r_[np.zeros(half), np.full(vocab - half, 1 / (vocab - half))]
    same = rng.dirichlet(np.ones(vocab))
    p = np.stack([p_peaked, p_disjoint, same]).astype(np.float32)
    q = np.stack([q_peaked, q_disjoint, same]).astype(np.float32)
    p /= p.sum(-1, keepdims=True)
    q /= q.sum(-1, keepdims=True)
    return ["peaked", "disjoint", "p = q"], p, q


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-samples", type=int, default=200_000)
    parser.add_argument("--vocab", type=int, default=16)
    parser.add_argument("--grid", type=int, default=2**16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--alpha", type=float, default=1e-6)
    parser.add_argument("--rules", nargs="+", default=list(RULES), choices=list(RULES))
    args = parser.parse_args(argv)

    names, p, q = instance_rows(args.vocab, args.seed)
    key = jax.random.key(args.seed)
    rows = []
    for rule_name in args.rules:
        rule = RULES[rule_name]
        mc = audit(key, rule.verify, p, q, num_samples=args.num_samples, drafting=rule.drafting,
                   alpha=args.alpha)
        ex = audit_exact(rule.verify_u, p, q, drafting=rule.drafting, grid=args.grid)
        for b, row_name in enumerate(names):
            notes = []
            if ex.isolated_tokens[b].any():
                notes.append("q = 0 token at u = 0.0" if (ex.isolated_tokens[b]
                                                          & (ex.target[b] == 0)).any()
                             else "token at u = 0.0")
            if mc.accepts_more_than_possible[b] or ex.accepts_more_than_possible[b]:
                notes.append("accepts > optimum")
            rows.append(dict(
                rule=rule_name, drafting=rule.drafting, row=row_name,
                acceptance=float(mc.acceptance_rate[b]), acceptance_se=float(
                    mc.acceptance_rate_se[b]), optimum=float(mc.optimal_acceptance[b]),
                tv_bias=float(mc.tv_bias[b]), tv_noise=float(mc.tv_bias_bound[b]),
                pvalue=float(mc.chi2_pvalue[b]), biased=bool(mc.biased[b]),
                exact_acceptance=float(ex.acceptance_rate[b]), exact_tv=float(ex.tv_bias[b]),
                exact_biased=bool(ex.biased[b]), notes="; ".join(notes)))

    print(f"V = {args.vocab}, float32; Monte Carlo: {args.num_samples:,} drafts per row, "
          f"alpha = {args.alpha:g} per row; exact: grid 2^{int(np.log2(args.grid))} + bisection")
    header = (f"{'rule':<27} {'drafting':<8} {'row':<9} {'acceptance':>17} {'optimum':>8} "
              f"{'TV bias':>8} {'noise':>7} {'chi2 p':>8} {'MC':>6} | {'exact acc':>9} "
              f"{'exact TV':>9} {'exact':>6}  notes")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['rule']:<27} {r['drafting']:<8} {r['row']:<9} "
              f"{r['acceptance']:>8.4f} ± {r['acceptance_se']:.4f} {r['optimum']:>8.4f} "
              f"{r['tv_bias']:>8.4f} {r['tv_noise']:>7.4f} {r['pvalue']:>8.2g} "
              f"{'BIASED' if r['biased'] else 'ok':>6} | {r['exact_acceptance']:>9.4f} "
              f"{r['exact_tv']:>9.2e} {'BIASED' if r['exact_biased'] else 'ok':>6}  {r['notes']}")
    return rows


if __name__ == "__main__":
    main()
