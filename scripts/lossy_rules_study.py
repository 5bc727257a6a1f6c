"""The engines' lossy verification rules, placed against the paper's Pareto front (Theorem 5).

Rules (decoders, each swept over its setting): biased SD with Theorem 4's residual (Decoding-OPT,
which lies on the front), typical acceptance (Medusa, vLLM: argmax residual), lenient SD
(``min(1, q / (l p))``, residual ``[q - p]_+``), top-k acceptance (residual ``[q - p]_+``) and
SGLang's threshold verification (residual: the target without the rejected token). Everything is
exact, in float64, on the paper's instance and on a larger random pair (``--states``,
``--concentration``).

Per token (a target call's row ``p``, ``q``), with ``b`` the rule's acceptance probabilities:

* ``reject = sum (1 - b) p``, the rejection probability;
* ``tv = TV(b p + rejected mass, q)``, the bias of the token the rule emits;
* Theorem 5's front: ``reject + Loss*(b) >= TV(p, q)`` with equality for Decoding-OPT, and
  ``Loss*(b) <= tv``; so ``gap = reject + tv - TV(p, q) >= 0`` is how far the rule lies above the
  front, and ``tv - Loss*(b)`` how much of its bias Theorem 4's optimal residual would remove for
  the same acceptance (``removable``, also as a share of ``tv``).

These are averaged over the rows the target visits (position ``n``, previous token ``a`` with the
target's marginal law). Over whole sequences (``K = T``): ``E[N_rej]`` (``specjax.exact``) and the
KL divergence of the output's law from the target's (``specjax.theory.sequence_kl`` of
``specjax.output_chain``), with the rule's own residual and with Theorem 4's.

Usage: python scripts/lossy_rules_study.py [--states 32] [--horizon 50] [--concentration 0.3]
       [--seed 0] [--out docs/lossy_rules_front.png]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

import specjax
from specjax.decoders import verification


def rule_sweeps():
    """``{family: [(setting label, decoder), ...]}``."""
    return {
        "biased SD, optimal residual (Decoding-OPT)": [
            (f"eps = {e:g}", specjax.BiasedSpeculative(e)) for e in (0.0, 0.02, 0.05, 0.1, 0.2,
                                                                      0.4, 1.0)],
        "typical acceptance (Medusa, vLLM)": [
            (f"threshold = {t:g}, alpha = {a:g}", specjax.TypicalAcceptance(t, a))
            for t, a in ((0.09, 0.01), (0.09, 0.03), (0.09, 0.1), (0.09, 0.3), (0.3, 1.0))],
        "lenient SD": [(f"l = {l:g}", specjax.LenientSpeculative(l))
                       for l in (1.0, 0.8, 0.6, 0.4, 0.2)],
        "top-k acceptance": [(f"k = {k}", specjax.TopKAcceptance(k)) for k in (0, 1, 2, 3)],
        "SGLang threshold": [
            (f"single = {s:g}, acc = {a:g}", specjax.ThresholdVerification(s, a))
            for s, a in ((1.0, 1.0), (0.5, 1.0), (0.3, 0.8), (0.2, 0.5), (0.1, 0.3))],
    }


@functools.cache
def _optimal_rule(rule):
    """The same acceptance with Theorem 4's residual (the least biased one for it)."""
    if "residual" in {f.name for f in dataclasses.fields(rule)}:
        return dataclasses.replace(rule, residual="optimal")
    return specjax.RejectionRule(rule.acceptance,
                                 lambda p, q, b: verification.optimal_residual(p, q, b))


def row_metrics(rule, draft, target):
    """Per-token averages (over the target's visits) of reject, tv, Loss*, TV(p, q)."""
    p, q = draft.trans, target.trans
    weight = specjax.marginals(target)[:-1]  # (T, V): law of the previous token
    law = rule.laws(p, q)[1]
    b = rule.acceptance(p, q)
    out = law.accepted + law.rejected
    values = dict(reject=jnp.sum(law.rejected, -1), tv=verification.tv_distance(out, q),
                  loss_star=verification.tv_loss_star(p, q, b),
                  tv_pq=verification.tv_distance(p, q))
    horizon = q.shape[0]
    return {k: float(jnp.sum(weight * v) / horizon) for k, v in values.items()}


def evaluate(rule, draft, target):
    metrics = row_metrics(rule, draft, target)
    optimal = _optimal_rule(rule)
    metrics["optimal_tv"] = row_metrics(optimal, draft, target)["tv"]
    metrics["rejections"] = float(specjax.exact(rule, draft, target).expected_rejections)
    metrics["kl"] = float(specjax.theory.sequence_kl(specjax.output_chain(rule, draft, target),
                                                     target))
    metrics["kl_optimal"] = float(specjax.theory.sequence_kl(
        specjax.output_chain(optimal, draft, target), target))
    metrics["gap"] = metrics["reject"] + metrics["tv"] - metrics["tv_pq"]
    metrics["removable"] = metrics["tv"] - metrics["loss_star"]
    return metrics


def run_instance(name, draft, target):
    rows = {}
    for family, sweep in rule_sweeps().items():
        for setting, rule in sweep:
            m = evaluate(rule, draft, target)
            # Theorem 4 and 5 as run-time checks (not assumptions of the table).
            assert m["gap"] >= -1e-9, (family, setting, m)
            assert abs(m["optimal_tv"] - m["loss_star"]) < 1e-9, (family, setting, m)
            rows[(family, setting)] = m
    print(f"\n{name}: TV(p, q) per token {next(iter(rows.values()))['tv_pq']:.4f}, SD's "
          f"E[N_rej] {rows[(next(iter(rule_sweeps())), 'eps = 0')]['rejections']:.3f}\n")
    print("| rule | setting | E[N_rej] | reject / token | TV / token | above the front | "
          "removable by Theorem 4 | sequence KL | KL, Theorem 4's residual |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    def clean(v):  # -0.0000 from rounding reads as a sign
        return 0.0 if abs(v) < 1e-12 else v

    for (family, setting), m in rows.items():
        m["gap"], m["removable"] = clean(m["gap"]), clean(m["removable"])
        share = m["removable"] / m["tv"] if m["tv"] > 1e-12 else 0.0
        print(f"| {family} | {setting} | {m['rejections']:.3f} | {m['reject']:.4f} | "
              f"{m['tv']:.4f} | {m['gap']:.4f} | {m['removable']:.4f} ({share:.0%}) | "
              f"{m['kl']:.4g} | {m['kl_optimal']:.4g} |")
    return rows


def plot(results, path):
    import matplotlib  # noqa: PLC0415 - only the figure needs it
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, axes = plt.subplots(1, len(results), figsize=(6.2 * len(results), 4.8))
    axes = np.atleast_1d(axes)
    markers = dict(zip(rule_sweeps(), "o^sDv"))
    for ax, (name, rows) in zip(axes, results.items()):
        tv_pq = next(iter(rows.values()))["tv_pq"]
        ax.plot([0, tv_pq], [tv_pq, 0], color="black", lw=1.4, ls="--", zorder=5,
                label="Pareto front (Theorem 5)")
        for i, family in enumerate(rule_sweeps()):
            pts = [m for (f, _), m in rows.items() if f == family]
            color = f"C{i}"
            ax.plot([m["tv"] for m in pts], [m["reject"] for m in pts], marker=markers[family],
                    color=color, label=family, lw=1)
            if family.startswith("biased"):
                continue
            ax.plot([m["loss_star"] for m in pts], [m["reject"] for m in pts],
                    marker=markers[family], color=color, mfc="none", ls=":", lw=1)
        ax.set_xlabel("bias per token: TV(output token, target)")
        ax.set_ylabel("rejection probability per token")
        ax.set_title(f"{name}\n(hollow: the same acceptance with Theorem 4's residual)",
                     fontsize=10)
        ax.set_xlim(left=-0.01)
        ax.set_ylim(bottom=-0.01)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--states", type=int, default=32)
    parser.add_argument("--horizon", type=int, default=50)
    parser.add_argument("--concentration", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="docs/lossy_rules_front.png")
    parser.add_argument("--skip-paper", action="store_true",
                        help="only the random pair (a quick smoke run)")
    args = parser.parse_args(argv)
    # The instances are drawn as everywhere else (float32), then evaluated in float64: drawn
    # under x64, the same seeds would give other chains than the paper's instance.
    k1, k2 = jax.random.split(jax.random.key(args.seed))
    instances = {} if args.skip_paper else {
        "paper's instance (V = 7, T = 50)": specjax.paper_instance()}
    instances |= {
        f"random pair (V = {args.states}, T = {args.horizon}, concentration "
        f"{args.concentration:g})": (
            specjax.random_markov_chain(k1, args.states, args.horizon, args.concentration),
            specjax.random_markov_chain(k2, args.states, args.horizon, args.concentration)),
    }
    with jax.enable_x64(True):
        results = {}
        for name, (draft, target) in instances.items():
            draft, target = (specjax.MarkovChain(*(np.asarray(a, np.float64) / np.asarray(
                a, np.float64).sum(-1, keepdims=True) for a in (m.init, m.trans)))
                for m in (draft, target))
            results[name] = run_instance(name, draft, target)
    if args.out:
        plot(results, args.out)
        print(f"\nfigure: {args.out}")
    return results


if __name__ == "__main__":
    main()
