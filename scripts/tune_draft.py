"""Tune a draft by gradient on exact decoding costs, against the KL-fit (distilled) draft.

On the paper's default instance (random non-stationary target, V = 7, T = 50, seed 10) this:

1. draws a random initial draft of the chosen family (``--family``), the start of every tuning;
2. fits the family to the target by maximum likelihood (forward KL: the usual distillation);
3. tunes the draft with Adam on the exact expected rejections of SD (Theorem 1), on those of
   batch SD with ``--num-drafts`` drafts (Theorem 3) and, when ``--objective`` names another
   objective, on that one too;
4. prints the exact value of every objective for every draft, and confirms each tuned draft's
   exact figures with a Monte Carlo run of the samplers (mean and standard error);
5. writes ``results.json`` and every chain as ``.npz`` (arrays ``init`` and ``trans``) to
   ``--out``: ``target.npz``, ``initial.npz``, ``kl_fit.npz``, ``tuned_sd.npz``,
   ``tuned_batch.npz`` (and ``tuned_<objective>.npz``).

Usage: python scripts/tune_draft.py [--family stationary] [--objective calls] [--steps 1000]
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import time

import jax
import numpy as np
import optax

import specjax
from specjax.models import markov as _models
from specjax.experiments.reproduce import mean_se
from specjax.experiments.reproduce import z_score


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=_models.PAPER_SEED,
                        help="seed of the target instance and of the initial draft (paper: 10)")
    parser.add_argument("--states", type=int, default=_models.PAPER_NUM_STATES, help="V")
    parser.add_argument("--horizon", type=int, default=_models.PAPER_HORIZON, help="T")
    parser.add_argument("--family", default="stationary", choices=sorted(specjax.tuning.families.FAMILIES))
    parser.add_argument("--rank", type=int, default=2, help="rank of the lowrank family")
    parser.add_argument("--objective", default="calls", choices=specjax.tuning.objectives.OBJECTIVES,
                        help="a third objective to tune for (sd and batch are always tuned)")
    parser.add_argument("--num-drafts", type=int, default=4, help="M of the batch objective")
    parser.add_argument("--lookahead", type=int, default=4, help="K of the calls objective")
    parser.add_argument("--epsilon", type=float, default=0.05, help="eps of the biased objective")
    parser.add_argument("--weight", type=float, default=2.0,
                        help="lambda of the biased objective (price of Loss*_TV)")
    parser.add_argument("--steps", type=int, default=1000, help="Adam steps per tuning")
    parser.add_argument("--learning-rate", type=float, default=0.05)
    parser.add_argument("--num-chains", type=int, default=100_000,
                        help="Monte Carlo chains per confirmation (0 skips them)")
    parser.add_argument("--x64", action="store_true", help="run in float64")
    parser.add_argument("--out", default="tune_draft_out", help="output folder")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    return parser.parse_args(argv)


def save_chain(path: pathlib.Path, chain: specjax.MarkovChain) -> None:
    np.savez(path, init=np.asarray(chain.init), trans=np.asarray(chain.trans))


def monte_carlo(key, draft, target, objectives, num_chains):
    """Sampler estimates (mean, se) of the objectives that a sampler measures."""
    out = {}
    for i, obj in enumerate(objectives):
        k = jax.random.fold_in(key, i)
        if obj.kind == "sd":
            trace = specjax.speculative_decoding(k, draft, target, num_chains,
                                                 lookahead=obj.lookahead)
            out[obj.label] = mean_se(trace.num_rejections)
        elif obj.kind == "batch":
            trace = specjax.batch_speculative_decoding(k, draft, target, num_chains,
                                                       num_drafts=obj.num_drafts)
            out[obj.label] = mean_se(trace.num_rejections)
        elif obj.kind == "calls":
            trace = specjax.speculative_decoding(k, draft, target, num_chains,
                                                 lookahead=obj.lookahead)
            out[obj.label] = mean_se(trace.num_calls)
        # "biased" mixes rejections with Loss*_TV (not a sampled quantity); "kl" is not sampled.
    return out


def run(args):
    _, target = specjax.paper_instance(args.seed, args.states, args.horizon)
    family = specjax.tuning.draft_family(args.family, args.states, args.horizon, rank=args.rank)
    named = specjax.tuning.make_objective  # the objectives by name, with their labels
    objectives = [named("sd"), named("batch", num_drafts=args.num_drafts),
                  named("calls", lookahead=args.lookahead),
                  specjax.tuning.biased_tradeoff(args.epsilon, weight=args.weight),
                  specjax.tuning.kl_divergence()]
    by_kind = {obj.kind: obj for obj in objectives}
    tuned_for = ["sd", "batch"] + ([args.objective] if args.objective not in ("sd", "batch")
                                   else [])
    # Adam with a cosine-decayed step: the objectives are piecewise linear in the probabilities,
    # so a constant step keeps hovering around the kinks; the decay settles on the optimum.
    optimizer = optax.adam(optax.cosine_decay_schedule(args.learning_rate, args.steps))

    initial = family.init(jax.random.key(args.seed))
    params = {"initial": initial, "kl_fit": specjax.tuning.kl_fit(family, target)}
    histories, seconds = {}, {}
    for kind in tuned_for:
        start = time.perf_counter()
        result = specjax.tune_draft(family, initial, target, by_kind[kind], num_steps=args.steps,
                                    optimizer=optimizer, progress=not args.quiet)
        seconds[kind] = time.perf_counter() - start
        params[f"tuned_{kind}"] = result.params
        histories[f"tuned_{kind}"] = np.asarray(result.history).tolist()

    chains = {name: family.chain(p) for name, p in params.items()}
    table = {name: {obj.label: float(obj(chain, target)) for obj in objectives}
             for name, chain in chains.items()}

    mc = {}
    if args.num_chains > 0:
        key = jax.random.key(args.seed + 1)
        for i, name in enumerate(n for n in chains if n.startswith("tuned_")):
            estimates = monte_carlo(jax.random.fold_in(key, i), chains[name], target,
                                    objectives, args.num_chains)
            mc[name] = {label: {"mean": m, "se": se, "exact": table[name][label],
                                "z": z_score(m, se, table[name][label])}
                        for label, (m, se) in estimates.items()}
    return target, family, objectives, chains, table, mc, histories, seconds


def print_table(objectives, table, mc):
    labels = [obj.label for obj in objectives]
    widths = [max(10, len(lab) + 2) for lab in labels]
    print(f"{'draft':<14}" + "".join(f"{lab:>{w}}" for lab, w in zip(labels, widths)))
    for name, row in table.items():
        print(f"{name:<14}" + "".join(f"{row[lab]:>{w}.4f}" for lab, w in zip(labels, widths)))
    if mc:
        print("\nMonte Carlo confirmation (sampler mean ± standard error; z = (mean - exact) / se):")
        for name, estimates in mc.items():
            cells = [f"{lab} {e['mean']:.4f} ± {e['se']:.4f} (exact {e['exact']:.4f}, "
                     f"z = {e['z']:+.2f})" for lab, e in estimates.items()]
            print(f"  {name:<12} " + "; ".join(cells))


def _finite_or_none(obj):
    if isinstance(obj, dict):
        return {k: _finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite_or_none(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def main(argv=None):
    args = parse_args(argv)
    with jax.enable_x64(args.x64):
        target, family, objectives, chains, table, mc, histories, seconds = run(args)
        print(f"specjax {specjax.__version__}: draft family {family.name!r} tuned with Adam "
              f"(lr {args.learning_rate}, cosine decay, {args.steps} steps) on a random target, V = "
              f"{args.states}, T = {args.horizon}, seed {args.seed}, "
              f"{'float64' if args.x64 else 'float32'}.")
        print("Exact expected values of each objective (rows: drafts; lower is better):\n")
        print_table(objectives, table, mc)
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        save_chain(out / "target.npz", target)
        for name, chain in chains.items():
            save_chain(out / f"{name}.npz", chain)
    results = {
        "settings": {k: v for k, v in vars(args).items()},
        "family": family.name,
        "objectives": [obj.label for obj in objectives],
        "table": table,
        "monte_carlo": mc,
        "history": histories,
        "tuning_seconds": seconds,
    }
    # JSON has no inf/NaN: a non-finite figure (e.g. an infinite KL) is written as null.
    (out / "results.json").write_text(json.dumps(_finite_or_none(results), indent=2,
                                                 allow_nan=False))
    print(f"\nwrote {out / 'results.json'} and {len(chains) + 1} chains (.npz) to {out}/")
    for name, estimates in mc.items():
        worst = max((abs(e["z"]) for e in estimates.values()), default=0.0)
        if not math.isfinite(worst) or worst > 5:
            print(f"warning: {name}: a Monte Carlo estimate is {worst:.1f} standard errors away "
                  "from its exact value")
    return results


if __name__ == "__main__":
    main()
