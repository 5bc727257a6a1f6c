"""The written outputs of ``specjax.experiments.reproduce``: ``summary.md``, ``summary.json`` and the PNGs."""

from __future__ import annotations

import contextlib
import math
import pathlib

import jax
import numpy as np

from specjax import _files
from specjax._progress import check_interrupt

__all__ = [
    "FIGURES",
    "TEMPORARY_SUFFIX",
    "atomic_write",
    "jsonable",
    "summary_markdown",
    "temporary_name",
    "write_figures",
    "write_text",
    "write_texts",
    "z_score",
]


# Written once, in specjax._files (also what Recording.save uses); kept here by name.
TEMPORARY_SUFFIX = _files.TEMPORARY_SUFFIX
temporary_name = _files.temporary_name
atomic_write = _files.atomic_write


def write_text(path, text: str) -> None:
    """Writes ``text`` to ``path`` (UTF-8) through ``atomic_write``."""
    with atomic_write(path) as f:
        f.write(text)


def write_texts(files) -> None:
    """Writes several files both or neither, as far as a file system allows: every text to its
    temporary file first (``atomic_write``, UTF-8), then the temporaries renamed onto their
    paths in order.

    An exception (or Ctrl-C) while writing removes every temporary file and leaves every path
    as it was; so does a failed first rename. Only a rename failing after the first succeeded
    (which a full disk or a missing permission does not cause: those fail the writes) leaves
    the earlier paths replaced.

    Args:
      files: ``{path: text}`` (or ``(path, text)`` pairs), renamed in this order.
    """
    items = list(files.items()) if isinstance(files, dict) else list(files)
    with contextlib.ExitStack() as stack:
        # Entered last to first: the stack leaves them (renames) first to last, and an
        # exception in one rename reaches the files after it, which remove their temporaries.
        opened = [(stack.enter_context(atomic_write(path)), text)
                  for path, text in reversed(items)]
        for f, text in opened:
            f.write(text)


def z_score(mean, se, exact):
    """``(mean - exact) / se``; with ``se = 0``, 0 if ``mean == exact`` (to 1e-12), else inf."""
    if se > 0:
        return (mean - exact) / se
    return 0.0 if abs(mean - exact) <= 1e-12 * max(1.0, abs(exact)) else math.inf


def jsonable(obj):
    """Results without the long running-mean arrays (sampled at N = 10, 100, 1000, ...)."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if k == "running_mean":
                n = [10 ** i for i in range(1, 10) if 10 ** i <= len(v)]
                out["running_mean_at"] = {str(i): float(v[i - 1]) for i in n}
            elif k != "running_se":
                out[str(k)] = jsonable(v)
        return out
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (np.ndarray, jax.Array)):
        return np.asarray(obj).tolist()
    if isinstance(obj, (np.floating, np.integer)):
        return obj.item()
    return obj


def _fmt_mc(mean, se, exact):
    return f"{mean:.3f} ± {se:.3f} | {exact:.3f} | {z_score(mean, se, exact):+.2f}"


def summary_markdown(results, paper, z_tolerance) -> str:
    """``summary.md``: every number of the reproduction, the paper's beside ours."""
    s = results["settings"]
    conv, sc, tr = results["convergence"], results["scaling"], results["tradeoff"]
    lconv, lsc = results["long_convergence"], results["long_scaling"]
    t, tl = s["horizon"], s["long_horizon"]
    sd = conv["sd"]
    lines = [
        "# specjax: reproduction of *A Theoretical Perspective for Speculative Decoding "
        "Algorithm* (NeurIPS 2024)",
        "",
        f"Setting (the paper's appendix \"Numerical Simulation Details\"): non-stationary Markov "
        f"chains with {s['num_states']} states, horizon T = {t} (and T = {tl}), uniform prompt, "
        f"draft and target rows drawn from a Dirichlet(1) with seed {s['seed']}; "
        f"{s['num_runs']:,} runs per running mean, {s['token_runs']:,} per single-token point. "
        "The paper's own random draws are unknown, so its values are not expected to match ours: "
        "they are printed beside them. Exact values are specjax's (no sampling); simulated ones "
        "are mean ± standard error; z = (simulated - exact) / se.",
        "",
        "## Figure 2: SD and batch SD (T = %d)" % t,
        "",
        "| quantity | paper | simulated ± se | exact | z |",
        "| --- | --- | --- | --- | --- |",
        f"| SD: E[N_rej] (Theorem 1) | {paper['expected_rejections_T50']} | "
        f"{_fmt_mc(sd['mean'], sd['se'], sd['exact'])} |",
        f"| SD: acceleration T / E[N_rej] | {paper['acceleration_T50']} | | "
        f"{t / sd['exact']:.3f} | |",
    ]
    for m, e in conv["batch"].items():
        lines.append(f"| batch SD, M = {m}: E[N_rej] (Theorem 3) | (plotted only) | "
                     f"{_fmt_mc(e['mean'], e['se'], e['exact'])} |")
    lines += ["", "Figure 2(c): exact E[N_rej] against M (Theorem 3); M = 1 is SD.", "",
              "| M | " + " | ".join(str(m) for m in sc["num_drafts"]) + " | inf |",
              "| --- |" + " --- |" * (len(sc["num_drafts"]) + 1),
              "| E[N_rej] | " + " | ".join(f"{v:.3f}" for v in sc["exact"])
              + f" | {sc['limit']:.3f} |", ""]
    if sc.get("far_num_drafts"):
        lines += ["Further out, exactly: " + "; ".join(
            f"M = {m}: {v:.3f}" for m, v in zip(sc["far_num_drafts"], sc["far_exact"]))
            + f"; M -> inf: {sc['limit']:.3f}.", ""]
    lines += ["Simulated points: " + "; ".join(
        f"M = {m}: {_fmt_mc(mean, se, sc['exact'][m - 1])}"
        for m, (mean, se) in sc["simulated"].items()) + " (simulated ± se | exact | z).", ""]
    lines += [f"The limit M -> infinity is {sc['limit']:.3f} > 0: more drafts do not remove "
              "rejections (the paper's Proposition). The reason is the depth-first structure "
              "(the Proposition's own limit formula counts the improvement only where the "
              "previous token was rejected): more drafts only help the first token of each "
              "target call, whose rejection tends to the mass of q where p = 0 (here 0: "
              "Dirichlet rows have no zeros), while the tokens after it are verified one draft "
              "at a time as in SD and keep their rejections. It is not, as Section 3.2's "
              "intuition says, that a large mismatch makes rejection unavoidable for every "
              "token. The approach is slow: its rate is 1 - p(x*) at the token x* maximising "
              "q / p, which is close to 1 when p(x*) is small.",
              "", f"## Appendix figure: T = {tl}", "",
              "| quantity | simulated ± se | exact | z |", "| --- | --- | --- | --- |",
              f"| SD: E[N_rej] | {_fmt_mc(lconv['sd']['mean'], lconv['sd']['se'], lconv['sd']['exact'])} |",
              f"| SD: acceleration T / E[N_rej] | | {tl / lconv['sd']['exact']:.3f} | |"]
    for m, e in lconv["batch"].items():
        lines.append(f"| batch SD, M = {m} | {_fmt_mc(e['mean'], e['se'], e['exact'])} |")
    lines += [f"| batch SD, M = {lsc['num_drafts'][-1]} | | {lsc['exact'][-1]:.3f} | |",
              f"| batch SD, M -> inf | | {lsc['limit']:.3f} | |", ""]
    lines += ["## Figure 3: rejection vs bias for one token (Theorems 4-5)", "",
              f"One token: the rows p = draft, q = target at position 1 after x_0 = 0; "
              f"TV(p, q) = {tr['tv']:.4f}. b = min(1, (q + eps) / p).", "",
              "| eps | P(reject) exact | simulated ± se | Loss*_TV | P(reject) + Loss* | "
              "TV(OPT, q) exact | simulated | TV(UNO, q) exact | simulated |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in tr["rows"]:
        lines.append(
            f"| {r['epsilon']:g} | {r['reject_exact']:.4f} | {r['opt_reject']:.4f} ± "
            f"{r['opt_reject_se']:.4f} | {r['loss_star']:.4f} | "
            f"{r['reject_exact'] + r['loss_star']:.4f} | {r['opt_tv_exact']:.4f} | "
            f"{r['opt_tv_simulated']:.4f} | {r['uno_tv_exact']:.4f} | {r['uno_tv_simulated']:.4f} |")
    lines += ["", "(Simulated TVs are those of the empirical output law: noisy, of order "
              "sqrt(V / runs), and biased upwards where the exact TV is 0.)", "",
              "## Figure 4: batch improvement of one token", "",
              "| case | M | exact | closed form | simulated ± se |", "| --- | --- | --- | --- | --- |"]
    for case in results["improvement"]:
        for m, ex, cf in zip(case["num_drafts"], case["exact"], case["closed_form"]):
            sim = case["simulated"].get(m)
            cell = f"{sim[0]:.4f} ± {sim[1]:.4f}" if sim else ""
            lines.append(f"| {case['label']} | {m} | {ex:.4f} | {cf:.4f} | {cell} |")
    lines += ["", "## Table 1 on Markov chains, exactly", "",
              "The paper compares Decoding-OPT (residual P*) with Decoding-UNO (residual q) by "
              "win rates of LLM judges (pythia-70m draft, pythia-2.8b target). Here the same "
              "claim with exact quantities on the T = %d instance: per-token TV of the output "
              "law to the target (contexts weighted by each decoder's own law of x_{n-1}, "
              "averaged over positions), whole-sequence KL(output || target), and the rejection "
              "rate E[N_rej] / T." % t, "",
              "| eps | TV/token OPT | TV/token UNO | KL OPT | KL UNO | reject rate OPT | "
              "reject rate UNO |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in results["table1"]:
        lines.append(f"| {r['epsilon']:g} | {r['opt_tv_per_token']:.4f} | "
                     f"{r['uno_tv_per_token']:.4f} | {r['opt_kl']:.4f} | {r['uno_kl']:.4f} | "
                     f"{r['opt_reject_rate']:.4f} | {r['uno_reject_rate']:.4f} |")
    failed = [c for c in results["checks"] if not c["ok"]]
    lines += ["", f"## Checks: {len(results['checks']) - len(failed)} of "
              f"{len(results['checks'])} hold", "",
              f"Statistical checks use |z| < {z_tolerance} (false-failure rate about 7e-6 "
              "each).", ""]
    lines += [f"- {'ok' if c['ok'] else 'FAILED'}: {c['check']} ({c['detail']})"
              for c in results["checks"]]
    return "\n".join(lines) + "\n"


# Each figure: the experiment it draws, its plot (a ``specjax.experiments.plots`` function) and the setting
# giving the horizon in its title (``None``: the plot takes no horizon).
FIGURES = {
    "fig2ab_convergence.png": ("convergence", "running_means", "horizon"),
    "fig2c_rejections_vs_M.png": ("scaling", "scaling", "horizon"),
    "fig3_pareto.png": ("tradeoff", "pareto", None),
    "fig4_batch_improvement.png": ("improvement", "improvement", None),
    "figA_T100_convergence.png": ("long_convergence", "running_means", "long_horizon"),
    "figA_T100_rejections_vs_M.png": ("long_scaling", "scaling", "long_horizon"),
}


def write_figures(results, out_dir) -> list:
    """Writes the PNG figures to ``out_dir``, each through ``atomic_write``; returns their
    paths."""
    import matplotlib.pyplot as plt

    from specjax.experiments import plots
    paths = []
    for name, (experiment, plot, horizon) in FIGURES.items():
        extra = () if horizon is None else (results["settings"][horizon],)
        fig = getattr(plots, plot)(results[experiment], *extra)
        path = pathlib.Path(out_dir) / name
        try:
            with atomic_write(path, binary=True) as f:
                fig.savefig(f, format="png", dpi=120)
        finally:
            plt.close(fig)
        paths.append(path)
        check_interrupt()  # a Ctrl-C lost while drawing (specjax._progress)
    return paths


