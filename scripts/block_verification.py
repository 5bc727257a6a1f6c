"""Block verification (Sun et al. 2024) against token-wise SD, exact beside simulated.

On the paper's instance (V = 7, T = 50, uniform prompt) and a few random ones, for K = 1..5:

* per call: the expected number of drafts accepted by the first call (position 1, prompt drawn
  from the uniform prompt law), exactly for token-wise SD, block verification and the
  joint-coupling bound ``sum_i sum_x min(p(x_{1:i}), q(x_{1:i}))``, with the relative gain of
  block over token-wise, and simulated values (mean +- standard error) from the samplers (the
  first call of each whole-sequence run: it accepted ``s - 2`` drafts when the second call starts
  at position ``s``);
* whole sequence: expected target calls for T = 50, exactly (``specjax.expected_calls`` and
  ``exact(BlockVerification(K), ...).expected_calls``) and simulated (``num_calls.mean()`` of
  ``speculative_decoding(..., lookahead=K)`` and ``decode(key, BlockVerification(K), ...)``).

Exact values in float64; samplers in float32. Default run: under a minute on 2 CPU cores.

Usage: python scripts/block_verification.py [--max-lookahead 5] [--num-chains 20000]
       [--horizon 50] [--random-instances 2]
"""

from __future__ import annotations

import argparse

import jax
import numpy as np

import specjax
from specjax import theory


def block_accepted_length(draft, target, *, lookahead):
    """Block verification's expected accepted drafts of the first call, per previous token."""
    return specjax.accepted_length(specjax.BlockVerification(lookahead), draft, target)


def instances(horizon: int, num_random: int):
    """``[(name, draft, target)]``: the paper's instance, then random ones (Dirichlet rows,
    concentration 1 and 0.3 in turn: peaked rows are where joint verification gains most)."""
    out = [("paper (seed 10)", *specjax.paper_instance(horizon=horizon))]
    for i in range(num_random):
        concentration = 1.0 if i % 2 == 0 else 0.3
        key_d, key_t = jax.random.split(jax.random.key(100 + i))
        out.append((f"random {i + 1} (alpha={concentration:g})",
                    specjax.random_markov_chain(key_d, 7, horizon, concentration),
                    specjax.random_markov_chain(key_t, 7, horizon, concentration)))
    return out


def as_float64(model):
    """The model in float64, rows renormalised (float32 rows sum to one only to about 1e-7)."""
    init, trans = (np.asarray(x, np.float64) for x in (model.init, model.trans))
    return specjax.MarkovChain(init / init.sum(), trans / trans.sum(-1, keepdims=True))


def first_call_accepted(trace) -> np.ndarray:
    """Drafts accepted by each chain's first call: the second call starts at ``s = tau + 2``."""
    new_call = np.asarray(trace.new_call)
    return new_call[:, 1:].argmax(-1)


def mean_se(x) -> tuple[float, float]:
    x = np.asarray(x, np.float64)
    return float(x.mean()), float(x.std(ddof=1) / np.sqrt(x.size))


def run(horizon: int, max_lookahead: int, num_chains: int, num_random: int, seed: int):
    per_call, sequence = [], []
    for name, draft, target in instances(horizon, num_random):
        for k in range(1, max_lookahead + 1):
            key = jax.random.fold_in(jax.random.key(seed), k)
            sd = specjax.speculative_decoding(key, draft, target, num_chains, lookahead=k)
            bv = specjax.decode(key, specjax.BlockVerification(k), draft, target, num_chains)
            with jax.enable_x64(True):
                d64, t64 = as_float64(draft), as_float64(target)
                prompt = np.asarray(t64.init)
                exact = {f: float(prompt @ np.asarray(fn(d64, t64, lookahead=k)))
                         for f, fn in (("tokenwise", theory.exact_tokenwise_accepted_length),
                                       ("block", block_accepted_length),
                                       ("joint", theory.exact_joint_accepted_length))}
                sd_calls = float(specjax.expected_calls(d64, t64, lookahead=k))
                bv_calls = float(specjax.exact(specjax.BlockVerification(k), d64,
                                               t64).expected_calls)
            token_sim, token_se = mean_se(first_call_accepted(sd))
            block_sim, block_se = mean_se(first_call_accepted(bv))
            per_call.append(dict(
                instance=name, K=k, **exact, gain=exact["block"] / exact["tokenwise"] - 1,
                tokenwise_sim=token_sim, tokenwise_se=token_se,
                block_sim=block_sim, block_se=block_se))
            sd_sim, sd_se = mean_se(sd.num_calls)
            bv_sim, bv_se = mean_se(bv.num_calls)
            sequence.append(dict(
                instance=name, K=k, sd_calls=sd_calls, sd_calls_sim=sd_sim, sd_se=sd_se,
                block_calls=bv_calls, block_calls_sim=bv_sim, block_se=bv_se,
                saving=1 - bv_calls / sd_calls))
    return per_call, sequence


def print_tables(per_call, sequence, horizon: int, num_chains: int) -> None:
    print(f"Drafts accepted by one call from the prompt (exact; simulated: {num_chains} chains, "
          "mean +- se)\n")
    print("| instance | K | token-wise | simulated | block | simulated | gain | joint bound |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in per_call:
        print(f"| {r['instance']} | {r['K']} | {r['tokenwise']:.4f} | "
              f"{r['tokenwise_sim']:.4f} +- {r['tokenwise_se']:.4f} | {r['block']:.4f} | "
              f"{r['block_sim']:.4f} +- {r['block_se']:.4f} | {100 * r['gain']:+.2f}% | "
              f"{r['joint']:.4f} |")
    print(f"\nTarget calls for the whole sequence, T = {horizon} (exact; simulated: "
          f"{num_chains} chains)\n")
    print("| instance | K | SD exact | SD simulated | block exact | block simulated | saving |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in sequence:
        print(f"| {r['instance']} | {r['K']} | {r['sd_calls']:.3f} | "
              f"{r['sd_calls_sim']:.3f} +- {r['sd_se']:.3f} | {r['block_calls']:.3f} | "
              f"{r['block_calls_sim']:.3f} +- {r['block_se']:.3f} | "
              f"{100 * r['saving']:.2f}% |")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-lookahead", type=int, default=5)
    parser.add_argument("--num-chains", type=int, default=20_000)
    parser.add_argument("--horizon", type=int, default=50)
    parser.add_argument("--random-instances", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true", help="return the rows, print nothing")
    args = parser.parse_args(argv)
    if args.horizon < args.max_lookahead + 2:
        parser.error("--horizon must be at least --max-lookahead + 2 (the first call's "
                     "accepted length is read off where the second call starts)")
    per_call, sequence = run(args.horizon, args.max_lookahead, args.num_chains,
                             args.random_instances, args.seed)
    if not args.quiet:
        print_tables(per_call, sequence, args.horizon, args.num_chains)
    return dict(per_call=per_call, sequence=sequence)


if __name__ == "__main__":
    main()
