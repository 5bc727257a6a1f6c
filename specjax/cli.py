"""``python -m specjax``: reproduce the paper, or simulate the default instance.

* ``python -m specjax reproduce --out DIR`` (also ``python -m specjax`` with no arguments, into
  ``figures``): every figure of the paper's numerical simulations as PNG files, and
  ``summary.md`` / ``summary.json`` with every number, exact values beside simulated ones and the
  paper's beside ours (``specjax.reproduce``).
* ``python -m specjax simulate``: mean rejections and target calls of SD, SD with lookahead 4 and
  batch SD with their Monte Carlo standard errors beside the exact values (Theorem 1, Theorem 3).
"""

from __future__ import annotations

import argparse
import math
import time

import jax

import specjax
from specjax.models import markov as _models
from specjax.experiments.reproduce import mean_se


def _instance_arguments(parser):
    parser.add_argument("--seed", type=int, default=_models.PAPER_SEED,
                        help="seed of the random draft/target instance (paper: 10)")
    parser.add_argument("--states", type=int, default=_models.PAPER_NUM_STATES, help="V")
    parser.add_argument("--horizon", type=int, default=_models.PAPER_HORIZON, help="T")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specjax", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command")
    rep = commands.add_parser("reproduce", help="the paper's figures and numbers")
    rep.add_argument("--out", default="figures", help="output folder (default: figures)")
    rep.add_argument("--quick", action="store_true",
                     help="toy sizes (about 30 s, mostly compilation; for tests)")
    rep.add_argument("--num-runs", type=int, default=None,
                     help="runs per running-mean curve (default 20,000)")
    rep.add_argument("--seed", type=int, default=_models.PAPER_SEED,
                     help="seed of the random instance (paper: 10)")
    rep.add_argument("--no-progress", action="store_true", help="no progress bar")
    sim = commands.add_parser("simulate", help="Monte Carlo vs exact table on one instance")
    sim.add_argument("--num-chains", type=int, default=200_000, help="chains per decoder")
    _instance_arguments(sim)
    args = parser.parse_args(argv)
    if args.command == "reproduce":
        if args.num_runs is not None and args.num_runs < 2:
            rep.error(f"--num-runs must be at least 2 (a standard error needs two runs), got "
                      f"{args.num_runs}")
        from specjax.experiments import reproduce
        try:
            reproduce.check_out_dir(args.out)
        except ValueError as err:
            rep.error(f"--out {err}")
    if args.command == "simulate":
        if args.num_chains < 2:
            sim.error(f"--num-chains must be at least 2, got {args.num_chains}")
        simulate(args)
    else:
        if args.command is None:
            args = rep.parse_args([])
        run_reproduce(args)


def run_reproduce(args) -> None:
    import dataclasses

    from specjax.experiments import reproduce
    settings = reproduce.Settings.quick() if args.quick else reproduce.Settings()
    settings = dataclasses.replace(settings, seed=args.seed)
    if args.num_runs is not None:
        settings = dataclasses.replace(settings, num_runs=args.num_runs)
    start = time.perf_counter()
    print(f"specjax {specjax.__version__}: reproducing the paper's numerical simulations into "
          f"{args.out}/ on {jax.devices()[0].platform} ...", flush=True)
    results = reproduce.reproduce(args.out, settings, progress=not args.no_progress)
    sd = results["convergence"]["sd"]
    failed = [c for c in results["checks"] if not c["ok"]]
    t = settings.horizon
    print(f"SD, T = {t}: E[N_rej] = {sd['exact']:.3f} exact (Theorem 1), {sd['mean']:.3f} ± "
          f"{sd['se']:.3f} simulated; acceleration T / E[N_rej] = {t / sd['exact']:.2f} "
          f"(paper, with its own random instance: {reproduce.PAPER['expected_rejections_T50']}"
          f" and {reproduce.PAPER['acceleration_T50']}).")
    for m, e in results["convergence"]["batch"].items():
        print(f"batch SD, M = {m}: E[N_rej] = {e['exact']:.3f} exact (Theorem 3), "
              f"{e['mean']:.3f} ± {e['se']:.3f} simulated.")
    print(f"batch SD as M -> infinity: {results['scaling']['limit']:.3f} (never 0).")
    print(f"checks: {len(results['checks']) - len(failed)} of {len(results['checks'])} hold"
          + "".join(f"\n  FAILED: {c['check']} ({c['detail']})" for c in failed))
    names = list(reproduce.FIGURES) + ["summary.md", "summary.json"]
    print(f"wrote {', '.join(names)} to {args.out}/ in {time.perf_counter() - start:.0f} s.")


def simulate(args) -> None:
    draft, target = specjax.paper_instance(args.seed, args.states, args.horizon)
    c, horizon = args.num_chains, args.horizon
    print(f"specjax {specjax.__version__}: random non-stationary Markov chains, V = {args.states}, "
          f"T = {horizon}, uniform prompt, seed {args.seed}; {c:,} chains per decoder "
          f"on {jax.devices()[0].platform}.")
    print("(The paper's own random draws are unknown, so its 16.41 rejections are not expected.)")
    runs = [
        ("autoregressive (Alg. 3)", lambda k: specjax.autoregressive_decoding(k, target, c),
         None),
        ("SD, K = T (Alg. 1)", lambda k: specjax.speculative_decoding(k, draft, target, c),
         specjax.exact_speculative_decoding(draft, target)),
        ("SD, K = 4", lambda k: specjax.speculative_decoding(k, draft, target, c, lookahead=4),
         specjax.exact_speculative_decoding(draft, target, lookahead=4)),
    ] + [
        (f"batch SD, M = {m} (Alg. 4)",
         lambda k, m=m: specjax.batch_speculative_decoding(k, draft, target, c, num_drafts=m),
         specjax.exact_batch_speculative_decoding(draft, target, num_drafts=m))
        for m in (2, 4, 5)
    ]
    header = f"{'decoder':<26}{'N_rej':>9}{'± se':>8}{'exact':>9}{'calls':>9}{'± se':>8}" \
             f"{'exact':>9}{'T/calls':>9}{'wall*':>8}"
    print(header)
    print("-" * len(header))
    key = jax.random.key(args.seed)
    for i, (name, run, exact) in enumerate(runs):
        start = time.perf_counter()
        trace = jax.block_until_ready(run(jax.random.fold_in(key, i)))
        elapsed = time.perf_counter() - start
        rej, rej_se = mean_se(trace.num_rejections)
        calls, calls_se = mean_se(trace.num_calls)
        exact_rej = 0.0 if exact is None else float(exact.expected_rejections)
        exact_calls = float(horizon) if exact is None else float(exact.expected_calls)
        print(f"{name:<26}{rej:>9.3f}{rej_se:>8.3f}{exact_rej:>9.3f}{calls:>9.3f}{calls_se:>8.3f}"
              f"{exact_calls:>9.3f}{horizon / calls:>9.2f}{elapsed:>7.2f}s")
    limit = float(specjax.batch_expected_rejections(draft, target, num_drafts=math.inf))
    print(f"exact: specjax.exact_* (no sampling). Batch SD as M -> infinity: {limit:.3f} "
          "rejections; it never reaches 0 (the paper's Proposition).")
    print("* wall time of the first call, compilation included.")


if __name__ == "__main__":
    main()
