"""Adaptive draft lengths against the draft's cost: fixed lookaheads, the heuristics and the optimal
policy, exactly, on two instances; a table of regrets and a figure.

For each draft-to-target cost ratio ``c`` (a draft pass costs ``c``, a target call 1, whatever the
number of tokens it scores) and at most ``K`` drafts per call (``--max-lookahead``, 4), the exact
expected time to decode the ``T`` tokens (``specjax.theory.decoding_time``) of:

* ``fixed K``: SD with lookahead ``k = 1..K``, and the best of them (``best_lookahead``);
* ``SpecDec++``: ``RejectionThreshold(t)`` (stop once ``1 - A > t``, ``A`` the exact probability
  that every draft so far is kept), at its released default ``t = 0.3`` and at the best ``t`` of
  a grid (``--grid`` points in (0, 1), swept under ``jax.vmap``: the threshold is a traced leaf);
* ``entropy``: ``EntropyThreshold(t)`` (stop when the draft's next row has entropy above ``t``
  nats), best ``t`` of a grid over ``(0, log V]``;
* ``confidence``: ``ConfidenceThreshold(t)`` (stop when the last draft's probability is below
  ``t``), best ``t`` of a grid over ``(0, 1)``;
* ``HF +2/-1``: HuggingFace's schedule (``HeuristicSchedule``: the lookahead carried from call
  to call, +2 after a call that kept every draft, -1 after a rejection), within ``[1, K]``,
  starting at ``K`` (HuggingFace's default, 20, capped);
* ``optimal``: ``optimal_stopping`` (backward induction), the least expected time of any
  stopping policy with at most ``K`` drafts.

Then the long run: on a stationary pair (the n-gram chains; for the paper's instance, its rows at
position 1 repeated at every position), the time per token of every scheme
(``stationary_rate``) against the best possible (``optimal_rate``, the average-cost semi-Markov
decision problem), as regrets.

The heuristics are given their best threshold *in hindsight* (tuned on the exact time), so their
regret is a lower bound on what a tuned-online heuristic pays. Speed-up = ``T`` target calls
(autoregressive decoding) over the expected time. Regret = time / optimal time - 1.

Then, at ``c = --sim-cost``, Monte Carlo beside the exact values for the optimal policy and the
tuned SpecDec++ rule: the mean number of calls of ``specjax.decoding_statistics`` (mean +- standard
error, ``z`` the difference in standard errors).

Instances: the paper's (``specjax.paper_instance()``, V = 7, T = 50) and the character n-grams of
``scripts/token_tree_study.py`` (a bigram draft and a trigram target over 4 character classes of
the standard library's Python sources, lifted to a stationary ``MarkovChain`` over its 16
contexts, ``--horizon`` = 32).

Figure ``adaptive_drafting.png``: speed-up against ``c``, one panel per instance.

Usage: python scripts/adaptive_study.py [--out docs/adaptive_drafting.png] [--max-lookahead 4]
       [--costs 0.02,0.05,0.1,0.2,0.3,0.5] [--grid 19] [--sim-cost 0.1] [--num-chains 20000]
       [--skip-ngram]
       tiny: --costs 0.1 --max-lookahead 2 --grid 3 --num-chains 200 --skip-ngram
The default run takes about 2.5 minutes on an idle 2-core CPU (float64).
"""

from __future__ import annotations

import argparse
import math
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

import specjax

ROOT = pathlib.Path(__file__).resolve().parents[1]
HEURISTICS = ("SpecDec++ 0.3", "SpecDec++ tuned", "entropy tuned", "confidence tuned",
              "HF +2/-1")


def sweep(make_policy, thresholds, draft, target, costs, k) -> np.ndarray:
    """Exact expected times of ``AdaptiveSpeculative(make_policy(t), max_lookahead=k)`` for every
    ``t`` of ``thresholds`` (rows) and every cost model of ``costs`` (columns), under one
    compilation (the costs are constants of the program: one program for all of them, not one
    per cost)."""

    def time_at(threshold):
        decoder = specjax.AdaptiveSpeculative(make_policy(threshold), max_lookahead=k)
        return jnp.stack([specjax.expected_time(decoder, draft, target, cost) for cost in costs])

    return np.asarray(jax.jit(jax.vmap(time_at))(jnp.asarray(thresholds)))


def sweeps(draft, target, costs, k, grid) -> dict:
    """``{name: (thresholds, times (grid, costs))}`` of the tuned heuristics (``sweep``)."""
    cost_models = [specjax.CostModel(draft_cost=c, target_cost=1.0) for c in costs]
    return {name: (thresholds, sweep(policy, thresholds, draft, target, cost_models, k))
            for name, (policy, thresholds) in threshold_grids(target, grid).items()}


def threshold_grids(target, grid: int) -> dict:
    """``{name: (policy class, thresholds)}`` of the tuned heuristics."""
    interior = np.linspace(0, 1, grid + 2)[1:-1]
    max_entropy = math.log(target.num_states)
    return {
        "SpecDec++ tuned": (specjax.decoders.RejectionThreshold, interior),
        "entropy tuned": (specjax.decoders.EntropyThreshold,
                          max_entropy * np.linspace(0, 1, grid + 1)[1:]),
        "confidence tuned": (specjax.decoders.ConfidenceThreshold, interior),
    }


def hf_schedule(k: int):
    """HuggingFace's +2 / -1 schedule within ``[1, K]``, from ``K`` (its default, 20, capped)."""
    return specjax.HeuristicSchedule(k, max_lookahead=k)


def stationary_pair(draft, target):
    """``(draft, target, description)``: the chains if stationary, else their rows at position 1
    repeated (a stationary chain of the same shape)."""
    def is_stationary(model):
        trans = np.asarray(model.trans)
        return np.array_equal(trans, np.broadcast_to(trans[:1], trans.shape))

    if is_stationary(draft) and is_stationary(target):
        return draft, target, "the chains themselves (stationary)"
    lift = [specjax.MarkovChain(m.init, jnp.broadcast_to(m.trans[0], m.trans.shape))
            for m in (draft, target)]
    return lift[0], lift[1], "the rows of position 1 at every position"


def long_run(draft, target, c: float, k: int, grid: int) -> dict:
    """Time per token in the long run on a stationary pair (``stationary_rate``) of every scheme
    and of the optimum (``optimal_rate``): ``{name: (time per token, setting)}``."""
    cost = specjax.CostModel(draft_cost=c, target_cost=1.0)

    def rate(decoder):
        return float(specjax.theory.stationary_rate(decoder, draft, target, cost).time_per_token)

    fixed = [rate(specjax.AdaptiveSpeculative(specjax.decoders.FixedLength(j), max_lookahead=j))
             for j in range(1, k + 1)]
    out = {"best fixed K": (min(fixed), 1 + int(np.argmin(fixed)))}
    for name, (policy, thresholds) in threshold_grids(target, grid).items():
        swept = [rate(specjax.AdaptiveSpeculative(policy(float(t)), max_lookahead=k))
                 for t in thresholds]
        i = int(np.argmin(swept))
        out[name] = (swept[i], float(thresholds[i]))
    specdec = specjax.AdaptiveSpeculative(specjax.decoders.RejectionThreshold(0.3),
                                          max_lookahead=k)
    out["SpecDec++ 0.3"] = (rate(specdec), 0.3)
    out["HF +2/-1"] = (rate(hf_schedule(k)), k)
    best = specjax.optimal_rate(draft, target, cost, max_lookahead=k)
    out["optimal"] = (float(best.time_per_token), bool(best.threshold_form))
    return out


def one_cost(draft, target, c: float, k: int, swept: dict) -> dict:
    """Every scheme's exact expected time at draft cost ``c``: ``{name: (time, setting)}``;
    ``swept`` the tuned heuristics' ``{name: (thresholds, times at c)}``."""
    cost = specjax.CostModel(draft_cost=c, target_cost=1.0)
    out = {}
    fixed = specjax.theory.best_lookahead(draft, target, cost, max_lookahead=k)
    times = np.asarray(fixed.times, np.float64)
    for j in range(1, k + 1):
        out[f"fixed K = {j}"] = (float(times[j]), j)
    best_j = 1 + int(np.argmin(times[1:]))  # the best K >= 1 (K = 0 is autoregressive)
    out["best fixed K"] = (float(times[best_j]), best_j)
    for name, (thresholds, times) in swept.items():
        i = int(np.argmin(times))
        out[name] = (float(times[i]), float(thresholds[i]))
    default = specjax.AdaptiveSpeculative(specjax.decoders.RejectionThreshold(0.3), max_lookahead=k)
    out["SpecDec++ 0.3"] = (float(specjax.expected_time(default, draft, target, cost)), 0.3)
    out["HF +2/-1"] = (float(specjax.expected_time(hf_schedule(k), draft, target, cost)), k)
    best = specjax.theory.optimal_stopping(draft, target, cost, max_lookahead=k)
    out["optimal"] = (float(best.expected_time), bool(best.threshold_form))
    out["_optimal"] = best
    return out


def simulate(key, decoder, draft, target, num_chains: int) -> tuple[float, float, float]:
    """``(exact E[calls], simulated mean, its standard error)``."""
    exact = float(specjax.exact(decoder, draft, target).expected_calls)
    stats = specjax.decoding_statistics(key, decoder, draft, target, num_chains)
    calls = np.asarray(stats.num_calls, np.float64)
    mean = float(calls.mean())
    se = float(calls.std(ddof=1)) / math.sqrt(num_chains)
    return exact, mean, se


def print_regrets(rows: dict, optimum: str, digits: int) -> None:
    """A Markdown table, one row per cost: each scheme's value / the optimum's - 1."""
    names = ["best fixed K", *HEURISTICS]
    print("| c | " + " | ".join(names) + f" | {optimum} | threshold form |")
    print("|" + " --- |" * (len(names) + 3))
    for c, row in rows.items():
        opt = row["optimal"][0]
        cells = [f"{row[n][0] / opt - 1:+.2%}" for n in names]
        print(f"| {c:g} | " + " | ".join(cells) + f" | {opt:.{digits}f} | {row['optimal'][1]} |")


def study(name, draft, target, args, key) -> dict:
    k, horizon = args.max_lookahead, target.horizon
    print(f"\n## {name}")
    swept = sweeps(draft, target, args.costs, k, args.grid)
    rows = {}
    for j, c in enumerate(args.costs):
        at_c = {label: (thresholds, times[:, j]) for label, (thresholds, times) in swept.items()}
        rows[c] = one_cost(draft, target, c, k, at_c)
    print(f"\nSpeed-up over autoregressive decoding (T / expected time), K <= {k}")
    names = ["best fixed K", *HEURISTICS, "optimal"]
    print("| c | " + " | ".join(names) + " | best K | tuned SpecDec++ t |")
    print("|" + " --- |" * (len(names) + 3))
    for c, row in rows.items():
        cells = [f"{horizon / row[n][0]:.3f}" for n in names]
        print(f"| {c:g} | " + " | ".join(cells)
              + f" | {row['best fixed K'][1]} | {row['SpecDec++ tuned'][1]:.2f} |")
    print("\nRegret (expected time / optimal - 1)")
    print_regrets(rows, "optimal time", 3)
    # Is a constant threshold on the rejection probability optimal here?
    regrets = [row["SpecDec++ tuned"][0] / row["optimal"][0] - 1 for row in rows.values()]
    verdict = ("a constant threshold matches the optimum" if max(regrets) < 1e-9 else
               "no constant threshold of the grid is optimal")
    print(f"\nBest constant SpecDec++ threshold (grid of {args.grid}) vs the optimum: regret "
          f"{min(regrets):.3%} to {max(regrets):.3%} over c: {verdict}.")

    steady_draft, steady_target, what = stationary_pair(draft, target)
    steady = {c: long_run(steady_draft, steady_target, c, k, args.grid) for c in args.costs}
    print(f"\nLong run (stationary_rate, optimal_rate) on {what}: time per token, regret "
          "(time per token / optimal - 1)")
    print_regrets(steady, "optimal time per token", 4)

    sims = {}
    if args.sim_cost in rows:
        row = rows[args.sim_cost]
        decoders = {
            "optimal": row["_optimal"].decoder,
            "SpecDec++ tuned": specjax.AdaptiveSpeculative(
                specjax.decoders.RejectionThreshold(row["SpecDec++ tuned"][1]), max_lookahead=k),
        }
        print(f"\nMonte Carlo at c = {args.sim_cost:g}: E[calls], {args.num_chains} chains")
        print("| policy | exact | simulated | z |")
        print("| --- | --- | --- | --- |")
        for label, decoder in decoders.items():
            key, sub = jax.random.split(key)
            exact, mean, se = simulate(sub, decoder, draft, target, args.num_chains)
            z = (mean - exact) / se if se > 0 else 0.0
            sims[label] = (exact, mean, se, z)
            print(f"| {label} | {exact:.4f} | {mean:.4f} +- {se:.4f} | {z:+.2f} |")
    return {"name": name, "horizon": horizon, "rows": rows, "sims": sims, "max_lookahead": k,
            "long_run": steady}


def plot(results, path) -> None:
    import matplotlib  # noqa: PLC0415 - only the figure needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    import matplotlib.ticker  # noqa: PLC0415

    fig, axes = plt.subplots(1, len(results), figsize=(5.4 * len(results), 4.2), squeeze=False)
    for ax, result in zip(axes[0], results):
        costs = sorted(result["rows"])
        horizon, k = result["horizon"], result["max_lookahead"]
        speed = {n: [horizon / result["rows"][c][n][0] for c in costs]
                 for n in result["rows"][costs[0]] if not n.startswith("_")}
        for j in range(1, k + 1):
            ax.plot(costs, speed[f"fixed K = {j}"], color="0.75", lw=1,
                    label="fixed K = 1..%d" % k if j == 1 else None)
        styles = {"best fixed K": ("k", "--"), "SpecDec++ 0.3": ("tab:orange", ":"),
                  "SpecDec++ tuned": ("tab:orange", "-"), "entropy tuned": ("tab:green", "-"),
                  "confidence tuned": ("tab:purple", "-"), "HF +2/-1": ("tab:blue", "-."),
                  "optimal": ("tab:red", "-")}
        for n, (color, style) in styles.items():
            ax.plot(costs, speed[n], color=color, ls=style, marker="o", ms=3,
                    lw=2 if n == "optimal" else 1.3, label=n)
        ax.axhline(1.0, color="0.5", lw=0.8)
        ax.set_xscale("log")
        ax.set_xticks(costs, [f"{c:g}" for c in costs])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("draft cost / target call (c)")
        ax.set_ylabel("speed-up over autoregressive")
        ax.set_title(result["name"], fontsize=10)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-lookahead", type=int, default=4)
    parser.add_argument("--costs", type=lambda s: [float(x) for x in s.split(",")],
                        default=[0.02, 0.05, 0.1, 0.2, 0.3, 0.5])
    parser.add_argument("--grid", type=int, default=19, help="thresholds per heuristic")
    parser.add_argument("--sim-cost", type=float, default=0.1)
    parser.add_argument("--num-chains", type=int, default=20_000)
    _token_tree_study().instance_arguments(parser, ROOT / "docs" / "adaptive_drafting.png")
    return parser.parse_args(argv)


def _token_tree_study():
    """``scripts/token_tree_study.py``: its instances, run by ``run_instances``."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import token_tree_study  # noqa: PLC0415 - the same instances as its study
    finally:
        sys.path.pop(0)
    return token_tree_study


def main(argv=None):
    args = parse(argv)
    with jax.enable_x64(True):  # float64 throughout; the previous setting is restored
        return _token_tree_study().run_instances(args, study, plot)


if __name__ == "__main__":
    main(sys.argv[1:])
