"""Multi-draft verification beside the paper's batch SD, and deterministic (greedy) drafts.

For each instance (the paper's, and random Dirichlet pairs with flat and peaked rows), prints the
exact expected rejections E[N_rej] (K = T) of:

* SD with a sampled draft, and SD with the greedy (argmax, one-hot) draft of the same model;
* batch SD with M drafts drawn with replacement (the paper's Algorithm 4, Theorem 3) and without
  replacement (multi-candidate SD / recursive rejection sampling, Yang et al. 2024), M = 2, 3, 4;

then, for M = 4, the simulated means of both batch samplers with their standard errors.

Usage: python scripts/multi_draft.py [--chains 20000] [--horizon 50] [--states 7] [--seeds 3]
"""

from __future__ import annotations

import argparse
import math

import jax
import numpy as np

import specjax


def instances(num_states: int, horizon: int, seeds: int):
    yield "paper", *specjax.paper_instance(num_states=num_states, horizon=horizon)
    for concentration in (1.0, 0.3):
        for seed in range(seeds):
            key_d, key_t = jax.random.split(jax.random.key(100 + seed))
            yield (f"dir({concentration:g}) #{seed}",
                   specjax.random_markov_chain(key_d, num_states, horizon, concentration),
                   specjax.random_markov_chain(key_t, num_states, horizon, concentration))


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chains", type=int, default=20_000)
    parser.add_argument("--horizon", type=int, default=50)
    parser.add_argument("--states", type=int, default=7)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args(argv)
    drafts = (2, 3, 4)
    print(f"Exact E[N_rej] with K = T (T = {args.horizon}, V = {args.states}); WR: drafts with "
          f"replacement (Theorem 3), WOR: without; gain: (WR - WOR) / WR.")
    header = f"{'instance':<14}{'SD':>9}{'greedy':>9}"
    for m in drafts:
        header += f"{f'WR M={m}':>10}{f'WOR M={m}':>10}{'gain':>8}"
    print(header)
    print("-" * len(header))
    rows = []
    for name, draft, target in instances(args.states, args.horizon, args.seeds):
        row = dict(instance=name,
                   sd=float(specjax.expected_rejections(draft, target)),
                   greedy=float(specjax.expected_rejections(specjax.models.greedy_draft(draft),
                                                            target)))
        line = f"{name:<14}{row['sd']:>9.3f}{row['greedy']:>9.3f}"
        for m in drafts:
            wr = float(specjax.batch_expected_rejections(draft, target, num_drafts=m))
            wor = float(specjax.batch_expected_rejections(draft, target, num_drafts=m,
                                                          replacement=False))
            row[f"wr{m}"], row[f"wor{m}"] = wr, wor
            gain = 100 * (wr - wor) / wr if wr > 0 else 0.0  # wr = 0 only when p = q
            line += f"{wr:>10.3f}{wor:>10.3f}{gain:>7.1f}%"
        print(line, flush=True)
        rows.append(row)

    print(f"\nSimulated, M = 4, {args.chains:,} chains (mean +- standard error; z against exact):")
    key = jax.random.key(0)
    for row, (name, draft, target) in zip(rows, instances(args.states, args.horizon, args.seeds)):
        line = f"{name:<14}"
        for replacement, exact in ((True, row["wr4"]), (False, row["wor4"])):
            trace = specjax.batch_speculative_decoding(key, draft, target, args.chains,
                                                       num_drafts=4, replacement=replacement)
            x = np.asarray(trace.num_rejections, np.float64)
            mean, se = x.mean(), x.std(ddof=1) / math.sqrt(x.size)
            z = (mean - exact) / se if se > 0 else 0.0
            label = "WR" if replacement else "WOR"
            line += f"  {label} {mean:8.3f} +- {se:.3f} (z = {z:+.2f})"
            row[f"sim_{label.lower()}4"] = (mean, se, z)
        print(line, flush=True)
    return rows


if __name__ == "__main__":
    main()
