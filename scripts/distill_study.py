"""Distilling a draft for decoding cost: forward KL, total variation (DistillSpec) and SD(K)'s
expected rejections at K = 1, 4 and inf, compared on held-out rollouts and exactly.

A random non-stationary Markov chain target (``V`` states, horizon ``T``, Dirichlet(1) rows) and a
stationary Markov chain draft (one ``(V, V)`` logit matrix: it cannot equal the target, so the
objectives disagree). Target rollouts are recorded once (training and held-out sets, independent
keys); five drafts are distilled from the same uniform start on the training rollouts with Adam
and a cosine step decay, full batch, in float64:

* ``forward KL``: ``sum_t KL(q_t || p_t)`` on the target's rows along the rollouts;
* ``TV (DistillSpec)``: ``sum_t TV(q_t, p_t)`` on the same rows;
* ``rejections, K``: ``specjax.pairs.distill.decoding_objective(Speculative(K), ...)``, SD(K)'s
  expected rejections given each rollout, from ``p_theta(x_t)`` and ``q_t(x_t)`` alone.

Each draft is then evaluated on SD's expected rejections at K = 1, 4 and inf, exactly
(``specjax.exact``: the chain is its own finite-state lift) and on the held-out rollouts (the same
objective, mean +- standard error). A second table gives each draft's held-out difference from
the KL draft with the standard error of the paired difference (same rollouts).

Seeds are fixed (0: target, training and held-out keys split from it) and were not tuned.

Usage: python scripts/distill_study.py [--quick] [--states 8] [--horizon 16] [--train 4000]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import specjax
from specjax.pairs.distill import decoding_objective
from specjax.pairs.distill import divergence_objective

LOOKAHEADS = (1, 4, None)


def _label(lookahead):
    return "inf" if lookahead is None else str(lookahead)


def study(*, seed=0, states=8, horizon=16, train=4000, held_out=4000, steps=1000,
          learning_rate=0.1):
    """Returns a dict: ``rows`` (one per draft: exact and held-out rejections at each K, with
    standard errors and paired differences from the KL draft) and the settings."""
    key_target, key_train, key_test = jax.random.split(jax.random.key(seed), 3)
    target = specjax.random_markov_chain(key_target, states, horizon)
    family = specjax.tuning.StationaryDraft(states, horizon)

    def apply(params, tokens):  # the stationary draft's logits along the tokens
        return jnp.broadcast_to(params, (horizon, states, states))[
            jnp.arange(horizon)[None], tokens[:, :-1]]

    # Recorded once, with the start draft and the target's rows (for the KL and TV baselines).
    start = family.chain(family.uniform())
    train_rec = specjax.record(key_train, start, target, train, keep_rows=True)
    test_rec = specjax.record(key_test, start, target, held_out, keep_rows=True)
    objectives = {
        "forward KL": divergence_objective(apply, "kl", logits=True),
        "TV (DistillSpec)": divergence_objective(apply, "tv", logits=True),
        **{f"rejections, K = {_label(k)}":
           (lambda loss: lambda *a: loss(*a).value)(
               decoding_objective(specjax.Speculative(k), apply, logits=True))
           for k in LOOKAHEADS},
    }
    optimizer = optax.adam(optax.cosine_decay_schedule(learning_rate, steps))

    def fit(loss):
        @jax.jit
        def run(params, recording):
            def step(carry, _):
                params, state = carry
                value, grad = jax.value_and_grad(loss)(params, recording)
                updates, state = optimizer.update(grad, state, params)
                return (optax.apply_updates(params, updates), state), value
            (params, _), history = jax.lax.scan(step, (params, optimizer.init(params)), None,
                                                length=steps)
            return params, history
        return run(family.uniform(), train_rec)

    evaluate = {k: jax.jit(lambda p, rec, loss=decoding_objective(
        specjax.Speculative(k), apply, logits=True): loss(p, rec).per_sequence)
        for k in LOOKAHEADS}
    rows, per_sequence = [], {}

    def evaluated(name, params, start):
        draft = family.chain(params)
        row = {"draft": name, "seconds": time.perf_counter() - start}
        for k in LOOKAHEADS:
            values = np.asarray(evaluate[k](params, test_rec))
            per_sequence[name, k] = values
            row[f"exact_{_label(k)}"] = float(
                specjax.exact(specjax.Speculative(k), draft, target).expected_rejections)
            row[f"held_out_{_label(k)}"] = float(values.mean())
            row[f"held_out_se_{_label(k)}"] = float(values.std(ddof=1) / np.sqrt(values.size))
        return row

    for name, loss in objectives.items():
        start = time.perf_counter()
        params, _ = fit(loss)
        rows.append(evaluated(name, params, start))
    for k in LOOKAHEADS:  # references: the family's best draft for SD(K), from the exact cost
        start = time.perf_counter()
        params = specjax.tune_draft(family, family.uniform(), target,
                                    specjax.objective(specjax.Speculative(k), "rejections"),
                                    num_steps=steps, optimizer=optimizer).params
        rows.append(evaluated(f"exact optimum, K = {_label(k)}", params, start))
    for row in rows:
        for k in LOOKAHEADS:
            diff = per_sequence[row["draft"], k] - per_sequence["forward KL", k]
            row[f"diff_{_label(k)}"] = float(diff.mean())
            row[f"diff_se_{_label(k)}"] = float(diff.std(ddof=1) / np.sqrt(diff.size))
    return {"rows": rows, "seed": seed, "states": states, "horizon": horizon, "train": train,
            "held_out": held_out, "steps": steps, "learning_rate": learning_rate}


def table(result) -> str:
    """The two markdown tables, as printed."""
    heads = "".join(f" SD({_label(k)}) exact | SD({_label(k)}) held-out |" for k in LOOKAHEADS)
    lines = ["| draft distilled by |" + heads,
             "| --- |" + " ---: | ---: |" * len(LOOKAHEADS)]
    for row in result["rows"]:
        cells = "".join(f" {row[f'exact_{_label(k)}']:.4f} | {row[f'held_out_{_label(k)}']:.3f}"
                        f" ± {row[f'held_out_se_{_label(k)}']:.3f} |" for k in LOOKAHEADS)
        lines.append(f"| {row['draft']} |" + cells)
    lines += ["", "| draft distilled by |" + "".join(
        f" SD({_label(k)}) exact - KL | SD({_label(k)}) held-out - KL |" for k in LOOKAHEADS),
        "| --- |" + " ---: | ---: |" * len(LOOKAHEADS)]
    kl = result["rows"][0]
    for row in result["rows"][1:]:
        cells = "".join(
            f" {row[f'exact_{_label(k)}'] - kl[f'exact_{_label(k)}']:+.4f} |"
            f" {row[f'diff_{_label(k)}']:+.4f} ± {row[f'diff_se_{_label(k)}']:.4f} |"
            for k in LOOKAHEADS)
        lines.append(f"| {row['draft']} |" + cells)
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="toy sizes (V = 4, T = 6, 200 rollouts, 30 steps) for the tests")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--states", type=int, default=8)
    parser.add_argument("--horizon", type=int, default=16)
    parser.add_argument("--train", type=int, default=4000, help="training rollouts")
    parser.add_argument("--held-out", type=int, default=4000, help="held-out rollouts")
    parser.add_argument("--steps", type=int, default=1000, help="Adam steps per draft")
    args = parser.parse_args(argv)
    sizes = dict(states=args.states, horizon=args.horizon, train=args.train,
                 held_out=args.held_out, steps=args.steps)
    if args.quick:
        sizes = dict(states=4, horizon=6, train=200, held_out=200, steps=30)
    with jax.enable_x64(True):
        result = study(seed=args.seed, **sizes)
    print(f"SD's expected rejections E[N_rej] of stationary drafts distilled for a random "
          f"V = {result['states']}, T = {result['horizon']} Markov chain target (seed "
          f"{result['seed']}) on {result['train']:,} target rollouts ({result['steps']} Adam "
          f"steps, float64); exact, and held-out on {result['held_out']:,} other rollouts "
          f"(mean ± standard error).\n")
    print(table(result))
    return result


if __name__ == "__main__":
    main()
