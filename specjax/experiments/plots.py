"""Plots of the reproduction experiments (``specjax.experiments.reproduce``): one function per figure.

Each takes an experiment's result and returns a matplotlib ``Figure``; theory is drawn as lines,
simulations as points or running means with 95% bands (1.96 standard errors).
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "SIMULATED",
    "THEORY",
    "Z95",
    "improvement",
    "pareto",
    "running_mean_panel",
    "running_means",
    "scaling",
]

Z95 = 1.96
THEORY = "C1"
SIMULATED = ["C0", "C4", "C2", "C3", "C5", "C6"]


def _plt():
    import matplotlib.pyplot as plt
    return plt


def running_mean_panel(ax, entry, label, color, theory_label, theory_color, start=10):
    """Draws a running mean with its 95% band from ``start`` runs on, and the exact value."""
    mean, se = entry["running_mean"], entry["running_se"]
    n = np.arange(1, mean.size + 1)
    sel = slice(min(start, mean.size) - 1, None)
    ax.plot(n[sel], mean[sel], color=color, lw=1.2, label=label)
    ax.fill_between(n[sel], (mean - Z95 * se)[sel], (mean + Z95 * se)[sel], color=color,
                    alpha=0.25, lw=0)
    ax.axhline(entry["exact"], color=theory_color, ls="--", lw=1.5, label=theory_label)


def running_means(conv, horizon, title_prefix=""):
    """Figure 2(a) and 2(b) (or the appendix's ``T = 100`` panels): running means vs theory."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    sd = conv["sd"]
    running_mean_panel(axes[0], sd, "simulated mean (95% band)", SIMULATED[0],
             f"Theorem 1: {sd['exact']:.3f}", THEORY)
    axes[0].set_title(f"{title_prefix}SD, T = {horizon}: acceleration T / E[N_rej] = "
                      f"{horizon / sd['exact']:.2f}")
    theory_colors = [THEORY, "C3", "C5"]
    for i, (m, entry) in enumerate(conv["batch"].items()):
        running_mean_panel(axes[1], entry, f"M = {m}, simulated", SIMULATED[i + 1],
                 f"M = {m}, Theorem 3: {entry['exact']:.3f}", theory_colors[i % 3])
    axes[1].set_title(f"{title_prefix}batch SD, T = {horizon}")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("number of runs N")
        ax.set_ylabel("mean rejections per sequence")
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def scaling(sc, horizon, title_prefix=""):
    """Figure 2(c): exact ``E[N_rej]`` against ``M`` (left, from 0: rejections never reach it)
    and on a log scale up to ``M = 10^4`` (right: the slow approach to the limit)."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    ax = axes[0]
    ax.plot(sc["num_drafts"], sc["exact"], "-", color=THEORY, label="Theorem 3 (exact)")
    ax.axhline(sc["limit"], color="k", ls=":", label=f"M -> inf limit: {sc['limit']:.3f}")
    ms = sorted(sc["simulated"])
    if ms:
        means = [sc["simulated"][m][0] for m in ms]
        errs = [Z95 * sc["simulated"][m][1] for m in ms]
        ax.errorbar(ms, means, yerr=errs, fmt="o", color=SIMULATED[0], ms=4, capsize=3,
                    label="simulated (95% CI)")
    ax.plot([1], [sc["sd"]], "s", color="k", ms=6, label=f"M = 1 is SD: {sc['sd']:.3f}")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{title_prefix}batch SD vs M, T = {horizon}")
    ax = axes[1]
    drafts = list(sc["num_drafts"]) + list(sc.get("far_num_drafts", []))
    values = list(sc["exact"]) + list(sc.get("far_exact", []))
    ax.plot(drafts, values, "o-", color=THEORY, ms=3, label="Theorem 3 (exact)")
    ax.axhline(sc["limit"], color="k", ls=":", label="M -> inf limit")
    ax.set_xscale("log")
    ax.set_title("the approach to the limit (log M)")
    for ax in axes:
        ax.set_xlabel("number of drafts M")
        ax.set_ylabel("expected rejections E[N_rej]")
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def pareto(tr):
    """Figure 3: (a) the Pareto front and its regions; (b) simulated OPT and UNO points in the
    (P(reject), TV bias) plane; (c) P(reject) and Loss*_TV against eps."""
    plt = _plt()
    tv = tr["tv"]
    rows = tr["rows"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    x = np.linspace(0, tv, 50)
    ax.fill_between(x, tv - x, np.full_like(x, tv * 1.05), color="C2", alpha=0.2,
                    label="realisable")
    ax.fill_between(x, 0, tv - x, color="C3", alpha=0.15, label="not realisable")
    ax.plot(x, tv - x, "k-", lw=2, label="Pareto front: Loss* = TV(p, q) - P(reject)")
    ax.plot([tv], [0], "s", color="C0", label="SD (unbiased)")
    ax.plot([0], [tv], "^", color="C1", label="accept every draft (output = p)")
    ax.set_title("(a) Theorem 5: rejection vs bias")
    ax = axes[1]
    ax.plot(x, tv - x, "k-", lw=2, label="Pareto front")
    for name, marker, color, label in (("opt", "o", "C0", "Decoding-OPT (P*)"),
                                       ("uno", "x", "C3", "Decoding-UNO (P = q)")):
        ax.errorbar([r[f"{name}_reject"] for r in rows], [r[f"{name}_tv_simulated"] for r in rows],
                    xerr=[Z95 * r[f"{name}_reject_se"] for r in rows],
                    yerr=[r[f"{name}_tv_bar"] for r in rows], fmt=marker, color=color,
                    ms=5, label=f"{label}, simulated (95% bars)")
    ax.set_title("(b) simulated decoders over an eps sweep")
    for ax in axes[:2]:
        ax.set_xlabel("P(reject)")
        ax.set_ylabel("TV(output law, q)")
        ax.legend(fontsize=7)
    ax = axes[2]
    eps = [r["epsilon"] for r in rows]
    ax.plot(eps, [r["reject_exact"] for r in rows], "-", color="C0", label="P(reject), exact")
    ax.plot(eps, [r["loss_star"] for r in rows], "-", color=THEORY, label="Loss*_TV (Theorem 4)")
    ax.plot(eps, [r["reject_exact"] + r["loss_star"] for r in rows], "k--",
            label="sum = TV(p, q)")
    ax.errorbar(eps, [r["opt_reject"] for r in rows],
                yerr=[Z95 * r["opt_reject_se"] for r in rows], fmt="o", color="C0", ms=4,
                label="P(reject), simulated (95% bars)")
    ax.errorbar(eps, [r["opt_tv_simulated"] for r in rows],
                yerr=[r["opt_tv_bar"] for r in rows], fmt="o", color=THEORY, ms=4,
                label="TV of OPT's output, simulated")
    ax.set_xlabel("over-acceptance eps in b = min(1, (q + eps) / p)")
    ax.set_ylabel("probability")
    ax.set_title("(c) the trade-off against eps")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def improvement(cases):
    """Figure 4: single-token batch improvement against ``M``, closed form and simulated."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for ax, prefix, title in ((axes[0], "Ber", "p = Ber(u), q = Ber(0.5)"),
                              (axes[1], "Unif", "p = Unif(V), q = Unif(V / r), V = 12")):
        for i, case in enumerate(c for c in cases if c["label"].startswith(prefix)):
            color = SIMULATED[i]
            ax.plot(case["num_drafts"], case["closed_form"], "-", color=color,
                    label=f"{case['label'].split(': ')[1]}, closed form")
            sim = case["simulated"]
            ax.errorbar(list(sim), [s[0] for s in sim.values()],
                        yerr=[Z95 * s[1] for s in sim.values()], fmt="o", color=color,
                        ms=4, capsize=2, label="simulated (95% CI)" if i == 0 else None)
            ax.axhline(case["tv"], color=color, ls=":", lw=1)
        ax.set_xlabel("number of drafts M")
        ax.set_ylabel("batch improvement TV(q, p) - prod TV(q^m, p)")
        ax.set_title(title + " (dotted: the limit TV)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
