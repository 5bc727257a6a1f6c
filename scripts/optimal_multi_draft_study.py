"""The optimal verifier of M drafts beside batch SD and the schemes of the field: single-token
acceptance, a toy, whole decodes, tuning.

Every column is a decoder of the library, its acceptance the accepted mass of its root law
(``decoder.laws(p, q)[0].accepted``): the optimum (``OptimalMultiDraft``) and batch SD
(``BatchSpeculative``), each with i.i.d. drafts and without replacement; SpecTr's k-sequential
selection (``KSequential``); importance-weighted selection then SD (``ImportanceWeighted``); the
Gumbel-max list coupling (``GumbelList``); SpecHub (``SpecHub``, M = 2 only, whose draft pair
always holds the draft's most likely token, so it is not bounded by the i.i.d. optimum).

(a) Single-token acceptance against M = 1..8 on random Dirichlet row pairs (V = 50, 2,000 pairs,
    concentration 0.5 and 5.0; the mean over rows). The schemes that enumerate ``V^M`` draws
    (without replacement, importance-weighted, Gumbel list) run in chunks of rows as large as
    the library accepts (each decoder's ``check``); a single row refused is shown as "-"; for
    time they stop at M = 3 (``--wor-max-drafts``, ``--enum-max-drafts``). The script prints
    the smallest margin of the optimum over batch SD and the largest excess of each i.i.d.
    scheme over the i.i.d. optimum (never above 0 if the optimum is right). Figure
    ``optimal_multi_draft_acceptance.png``, one panel per concentration.
(b) Khisti et al.'s toy (ICLR 2025, Figure 2): V = 3, p uniform, M = 2 drafts,
    q = [1/3, q2, 2/3 - q2] and q = [1/6, q2, 5/6 - q2] with q2 over its valid range; every
    scheme. Figure ``optimal_multi_draft_toy.png``, one panel per family of q.
(c) E[N_rej] (K = T) on the paper's instance (``specjax.paper_instance()``: V = 7, T = 50) for
    M = 2, 4, 8 and every scheme (SpecHub at M = 2), exact (``specjax.exact``) beside simulated
    (``specjax.decoding_statistics``, mean +- standard error, z = (simulated - exact) / se). A
    decoder the library refuses (a ``V^M`` enumeration x 350 rows above 2^26) is shown as
    refused.
(d) A stationary draft tuned (Adam, cosine decay, from the KL fit) for the exact E[N_rej] of
    OptimalMultiDraft(M) and one tuned for BatchSpeculative(M) on the paper's instance
    (M = 4), cross-evaluated under both decoders (with the KL fit as the reference). The tuner
    skips (and counts) any step with a non-finite objective or gradient; the count is printed,
    0 when the gradients of both exact values stayed finite. Figure
    ``optimal_multi_draft_tuning.png``: each objective against the step (% change from the KL fit).

Usage: python scripts/optimal_multi_draft_study.py [--out docs] [--chains 20000] [--steps 300]
       [--rows 2000] [--states 50] [--max-drafts 8] [--quick]
"""

from __future__ import annotations

import argparse
import math
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import specjax
from specjax.experiments.reproduce import mean_se

FIGURES = {"a": "optimal_multi_draft_acceptance.png", "b": "optimal_multi_draft_toy.png",
           "d": "optimal_multi_draft_tuning.png"}
CURVES = ("optimal iid", "optimal wor", "batch iid", "batch wor", "k-sequential", "importance",
          "Gumbel list", "SpecHub")

#: The root verifier of each curve for M drafts (None: not defined for that M). Every column of
#: the tables is a decoder of the library: its root law's accepted mass is the acceptance.
SCHEMES = {
    "optimal iid": lambda m: specjax.OptimalMultiDraft(m),
    "optimal wor": lambda m: specjax.OptimalMultiDraft(m, replacement=False),
    "batch iid": lambda m: specjax.BatchSpeculative(m),
    "batch wor": lambda m: specjax.BatchSpeculative(m, replacement=False),
    "k-sequential": lambda m: specjax.KSequential(m),
    "importance": lambda m: specjax.ImportanceWeighted(m),
    "Gumbel list": lambda m: specjax.GumbelList(m),
    "SpecHub": lambda m: specjax.SpecHub() if m == 2 else None,
}
#: The curves whose root enumerates ``V^M`` draws (run up to ``--wor-max-drafts`` /
#: ``--enum-max-drafts`` drafts, for time).
WITHOUT_REPLACEMENT = ("optimal wor", "batch wor")
ENUMERATED = ("importance", "Gumbel list")
#: The curves whose drafts are i.i.d. from p, so the i.i.d. optimum bounds them.
IID = ("optimal iid", "batch iid", "k-sequential", "importance", "Gumbel list")


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


#: Color, line style and marker of each acceptance curve (the marker only where M is discrete).
STYLES = {"optimal iid": ("C0", "-", "o"), "optimal wor": ("C0", "--", "s"),
          "batch iid": ("C1", "-", "o"), "batch wor": ("C1", "--", "s"),
          "k-sequential": ("C2", "-", "^"), "importance": ("C3", "-", "v"),
          "Gumbel list": ("C4", "-", "D"), "SpecHub": ("C5", "none", "*")}


def _curve_label(name: str) -> str:
    if name == "SpecHub":
        return "SpecHub (M = 2; its drafts are not i.i.d.)"
    if name == "importance":
        return "importance-weighted selection"
    return name.replace("wor", "w/o replacement").replace("iid", "i.i.d.")


def _finish(ax, title: str, xlabel: str, ylabel: str, legend: bool = True) -> None:
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if legend:
        ax.legend(fontsize=8)


def _shared_legend(fig, ax) -> None:
    """One legend for all panels, below them (eight curves would hide the data in a panel)."""
    fig.legend(*ax.get_legend_handles_labels(), loc="lower center", ncol=4, fontsize=8)


def _save(plt, fig, path, bottom: float = 0.0):
    fig.tight_layout(rect=(0, bottom, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def markdown(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def fmt(x, digits=4) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


# --- single-token acceptance --------------------------------------------------------------------

_ROOT_ACCEPTANCE = jax.jit(lambda decoder, p, q: jnp.sum(decoder.laws(p, q)[0].accepted, -1))


class NotDefined(Exception):
    """The scheme has no verifier for this number of drafts (SpecHub: M = 2 only)."""


def _chunk(decoder, rows: int, states: int) -> int:
    """The most rows the library evaluates at once for ``decoder`` (its own ``check``, halved
    until it passes); re-raises the library's ValueError when a single row is refused."""
    chunk = rows
    while True:
        try:
            decoder.check(states, chunk)
            return chunk
        except ValueError:
            if chunk == 1:
                raise
            chunk = max(1, chunk // 2)


def acceptance(curve: str, p: np.ndarray, q: np.ndarray, m: int) -> np.ndarray:
    """Per-row acceptance at the root of ``curve``'s decoder with ``m`` drafts, in chunks of rows
    as large as the library accepts (a padded last chunk, so each setting compiles once).
    Raises the library's ValueError when a single row is refused, ``NotDefined`` when the scheme
    has no verifier for ``m``."""
    decoder = SCHEMES[curve](m)
    if decoder is None:
        raise NotDefined(curve, m)
    rows, states = p.shape
    chunk = _chunk(decoder, rows, states)
    pad = -rows % chunk
    if pad:
        uniform = np.full((pad, states), 1 / states, p.dtype)
        p, q = np.concatenate([p, uniform]), np.concatenate([q, uniform])
    out = [np.asarray(_ROOT_ACCEPTANCE(decoder, p[i:i + chunk], q[i:i + chunk]), np.float64)
           for i in range(0, rows + pad, chunk)]
    return np.concatenate(out)[:rows]


def dirichlet_pairs(seed: int, rows: int, states: int, concentration: float):
    rng = np.random.default_rng(seed)
    alpha = np.full(states, concentration)
    p = rng.dirichlet(alpha, size=rows).astype(np.float32)
    q = rng.dirichlet(alpha, size=rows).astype(np.float32)
    return p, q


def _skip(name: str, m: int, args) -> bool:
    """A curve not run at this M for time (the enumerating ones beyond their cap)."""
    return ((name in WITHOUT_REPLACEMENT and m > args.wor_max_drafts)
            or (name in ENUMERATED and m > args.enum_max_drafts))


def part_a(args) -> dict:
    drafts = range(1, args.max_drafts + 1)
    result = {}
    for concentration in args.concentrations:
        p, q = dirichlet_pairs(args.seed, args.rows, args.states, concentration)
        curves = {name: {} for name in CURVES}
        notes = {}
        min_gap = {"iid": math.inf, "wor": math.inf}
        above = {name: -math.inf for name in IID}  # max over rows of scheme - i.i.d. optimum
        for m in drafts:
            per_row = {}
            for name in CURVES:
                if _skip(name, m, args):
                    notes[(name, m)] = "not run"
                    continue
                try:
                    per_row[name] = acceptance(name, p, q, m)
                except NotDefined:
                    continue
                except ValueError:
                    notes[(name, m)] = "refused"
                    continue
                curves[name][m] = float(per_row[name].mean())
            for how in ("iid", "wor"):
                if f"optimal {how}" in per_row and f"batch {how}" in per_row:
                    gap = per_row[f"optimal {how}"] - per_row[f"batch {how}"]
                    min_gap[how] = min(min_gap[how], float(gap.min()))
            for name in IID:
                if name in per_row and "optimal iid" in per_row:
                    diff = per_row[name] - per_row["optimal iid"]
                    above[name] = max(above[name], float(diff.max()))
        result[concentration] = dict(curves=curves, notes=notes, min_gap=min_gap, above=above)

    print(f"(a) Single-token acceptance, mean over {args.rows:,} Dirichlet row pairs, "
          f"V = {args.states} (-: not defined (SpecHub: M = 2 only), not run (without "
          f"replacement beyond M = {args.wor_max_drafts}, importance and Gumbel list beyond "
          f"M = {args.enum_max_drafts}) or refused by the library)")
    for concentration, res in result.items():
        print(f"\nconcentration {concentration:g}\n")
        rows = []
        for m in drafts:
            rows.append([m] + [fmt(res["curves"][name].get(m)) for name in CURVES])
        print(markdown(["M"] + list(CURVES), rows))
        refused = sorted({m for (name, m), why in res["notes"].items() if why == "refused"})
        print(f"\nmin over rows and M of optimum - batch SD: i.i.d. {res['min_gap']['iid']:+.2e}, "
              f"without replacement {res['min_gap']['wor']:+.2e}"
              + (f"; refused by the library: M = {', '.join(map(str, refused))}"
                 if refused else ""))
        print("max over rows and M of scheme - i.i.d. optimum (<= 0: never above it): "
              + ", ".join(f"{name} {value:+.2e}" for name, value in res["above"].items()
                          if name != "optimal iid" and value > -math.inf))

    plt = _plt()
    fig, axes = plt.subplots(1, len(result), figsize=(5.5 * len(result), 4.6), squeeze=False)
    for ax, (concentration, res) in zip(axes[0], result.items()):
        for name in CURVES:
            pts = res["curves"][name]
            if not pts:
                continue
            color, ls, marker = STYLES[name]
            ax.plot(list(pts), list(pts.values()), color=color, ls=ls, marker=marker,
                    ms=9 if name == "SpecHub" else 4, label=_curve_label(name))
        _finish(ax, f"Dirichlet({concentration:g}), V = {args.states}, {args.rows:,} row pairs",
                "number of drafts M", "mean acceptance at the root", legend=False)
    _shared_legend(fig, axes[0][0])
    return dict(result=result, figure=_save(plt, fig, args.out / FIGURES["a"], bottom=0.14))


# --- Khisti et al.'s toy ------------------------------------------------------------------------

def part_b(args) -> dict:
    families = {"q = [1/3, q2, 2/3 - q2]": (1 / 3, 2 / 3), "q = [1/6, q2, 5/6 - q2]": (1 / 6, 5 / 6)}
    result = {}
    for name, (q1, rest) in families.items():
        q2 = np.linspace(0, rest, args.grid)
        q = np.stack([np.full_like(q2, q1), q2, rest - q2], -1).astype(np.float32)
        q = np.maximum(q, 0)
        p = np.full_like(q, 1 / 3)
        result[name] = dict(q2=q2, **{c: acceptance(c, p, q, 2) for c in CURVES})

    print("\n(b) Khisti et al.'s toy: V = 3, p uniform, M = 2; acceptance against q2\n")
    for name, res in result.items():
        print(f"{name}\n")
        picks = np.unique(np.linspace(0, args.grid - 1, min(args.grid, 7)).round().astype(int))
        rows = [[f"{res['q2'][i]:.4f}"] + [fmt(res[c][i]) for c in CURVES] for i in picks]
        print(markdown(["q2"] + list(CURVES), rows))
        print()

    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6))
    for ax, (name, res) in zip(axes, result.items()):
        for c in CURVES:
            color, ls, _ = STYLES[c]
            ax.plot(res["q2"], res[c], color=color, ls=":" if ls == "none" else ls,
                    label=_curve_label(c))
        _finish(ax, f"p uniform, M = 2, {name}", "q2", "acceptance", legend=False)
    _shared_legend(fig, axes[0])
    return dict(result=result, figure=_save(plt, fig, args.out / FIGURES["b"], bottom=0.14))


# --- whole decodes on the paper's instance ------------------------------------------------------

#: Row names of table (c).
PAPER_NAMES = {"optimal iid": "optimal, i.i.d.", "optimal wor": "optimal, w/o replacement",
               "batch iid": "batch SD, i.i.d.", "batch wor": "batch SD, w/o replacement",
               "k-sequential": "k-sequential", "importance": "importance-weighted",
               "Gumbel list": "Gumbel list", "SpecHub": "SpecHub"}


def part_c(args) -> dict:
    draft, target = specjax.paper_instance(num_states=args.paper_states, horizon=args.horizon)
    decoders = [("SD", 1, specjax.Speculative())]
    for m in args.paper_drafts:
        built = ((PAPER_NAMES[name], m, SCHEMES[name](m)) for name in CURVES)
        decoders += [row for row in built if row[2] is not None]
    key = jax.random.key(args.seed)
    rows, table = [], []
    for name, m, decoder in decoders:
        try:
            exact = float(specjax.exact(decoder, draft, target).expected_rejections)
        except ValueError:
            rows.append(dict(decoder=name, M=m, exact=None))
            table.append([name, m, "refused", "refused", ""])
            continue
        if args.simulate == "iid" and name not in ("optimal, i.i.d.", "batch SD, i.i.d."):
            rows.append(dict(decoder=name, M=m, exact=exact))
            table.append([name, m, f"{exact:.4f}", "-", ""])
            continue
        stats = specjax.decoding_statistics(key, decoder, draft, target, args.chains)
        mean, se = mean_se(stats.num_rejections)
        z = (mean - exact) / se if se > 0 else 0.0
        rows.append(dict(decoder=name, M=m, exact=exact, mean=mean, se=se, z=z))
        table.append([name, m, f"{exact:.4f}", f"{mean:.4f} +- {se:.4f}", f"{z:+.2f}"])
    print(f"(c) E[N_rej] (K = T) on the paper's instance (V = {args.paper_states}, "
          f"T = {args.horizon}); simulated: {args.chains:,} chains, mean +- standard error\n")
    print(markdown(["decoder", "M", "exact", "simulated", "z"], table))
    return dict(rows=rows)


# --- tuning -------------------------------------------------------------------------------------

def part_d(args) -> dict:
    _, target = specjax.paper_instance(num_states=args.paper_states, horizon=args.horizon)
    family = specjax.tuning.StationaryDraft(num_states=args.paper_states, horizon=args.horizon)
    fit = specjax.tuning.kl_fit(family, target)
    m = args.tune_drafts
    decoders = {"optimal": specjax.OptimalMultiDraft(m), "batch SD": specjax.BatchSpeculative(m)}
    costs = {name: specjax.objective(dec, "rejections") for name, dec in decoders.items()}
    print(f"\n(d) Stationary drafts tuned for exact E[N_rej] on the paper's instance (V = "
          f"{args.paper_states}, T = {args.horizon}), M = {m}, {args.steps} Adam steps from the "
          f"KL fit\n")
    optimizer = optax.adam(optax.cosine_decay_schedule(args.learning_rate, args.steps))
    drafts = {"KL fit": family.chain(fit)}
    histories, skipped = {}, {}
    for name, cost in costs.items():
        res = specjax.tune_draft(family, fit, target, cost, num_steps=args.steps,
                                 optimizer=optimizer)
        drafts[f"tuned for {name}"] = res.draft
        histories[name] = np.asarray(res.history)
        skipped[name] = int(res.skipped)
    table = {draft_name: {name: float(cost(chain, target)) for name, cost in costs.items()}
             for draft_name, chain in drafts.items()}
    header = ["draft"] + [f"E[N_rej] {decoders[name].label}" for name in costs]
    print(markdown(header, [[d] + [f"{v:.4f}" for v in vals.values()]
                            for d, vals in table.items()]))
    # The tuner skips every step whose objective, gradient or new parameters are not finite:
    # no skipped step means the gradient of each exact value was finite all along.
    print("\nsteps skipped by the tuner (non-finite objective or gradient): "
          + ", ".join(f"{name} {count}" for name, count in skipped.items()))

    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (name, hist) in enumerate(histories.items()):
        ax.plot(np.arange(hist.size), 100 * (hist / hist[0] - 1), color=f"C{i}",
                label=f"tuned for {decoders[name].label} (KL fit: {hist[0]:.3f})")
    _finish(ax, f"stationary draft, paper instance, M = {m}", "Adam step",
            "own exact E[N_rej] vs the KL fit (%)")
    return dict(table=table, skipped=skipped,
                figure=_save(plt, fig, args.out / FIGURES["d"]))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("docs"),
                        help="folder of the figures")
    parser.add_argument("--parts", default="abcd", help="which parts to run, e.g. 'ab'")
    parser.add_argument("--rows", type=int, default=2000, help="(a) row pairs")
    parser.add_argument("--states", type=int, default=50, help="(a) V")
    parser.add_argument("--concentrations", type=float, nargs="+", default=[0.5, 5.0])
    parser.add_argument("--max-drafts", type=int, default=8, help="(a) M = 1..this")
    parser.add_argument("--wor-max-drafts", type=int, default=3,
                        help="(a) largest M run without replacement (time)")
    parser.add_argument("--enum-max-drafts", type=int, default=3,
                        help="(a) largest M run for importance-weighted selection and the "
                             "Gumbel list coupling (V^M enumerations; time)")
    parser.add_argument("--grid", type=int, default=201, help="(b) values of q2")
    parser.add_argument("--paper-drafts", type=int, nargs="+", default=[2, 4, 8], help="(c) M")
    parser.add_argument("--paper-states", type=int, default=7, help="(c, d) V")
    parser.add_argument("--horizon", type=int, default=50, help="(c, d) T")
    parser.add_argument("--chains", type=int, default=20_000, help="(c) simulated chains")
    parser.add_argument("--simulate", choices=["all", "iid"], default="all",
                        help="(c) simulate every decoder, or only the i.i.d. optimum and "
                             "batch SD (-: exact only)")
    parser.add_argument("--tune-drafts", type=int, default=4, help="(d) M")
    parser.add_argument("--steps", type=int, default=300, help="(d) Adam steps")
    parser.add_argument("--learning-rate", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes (smoke test): (a) on 21 rows of V = 3, the shape "
                             "of (b)'s grid, M <= 2, T = 8, 2,000 chains (i.i.d. multi-draft "
                             "only), 20 steps")
    args = parser.parse_args(argv)
    if args.quick:
        # (a)'s rows the shape of (b)'s grid (V = 3, 21 rows): its M = 2 root laws are the
        # same compiled programs as (b)'s, one per scheme, instead of a second set.
        args.rows, args.states, args.max_drafts, args.wor_max_drafts = 21, 3, 2, 2
        args.enum_max_drafts = 2
        args.grid, args.paper_drafts, args.horizon = 21, [2], 8
        args.chains, args.steps, args.tune_drafts, args.simulate = 2000, 20, 2, "iid"
    args.out.mkdir(parents=True, exist_ok=True)
    out = {}
    for part, fn in (("a", part_a), ("b", part_b), ("c", part_c), ("d", part_d)):
        if part in args.parts:
            start = time.perf_counter()
            out[part] = fn(args)
            print(f"\n[({part}) {time.perf_counter() - start:.1f} s]\n", flush=True)
    return out


if __name__ == "__main__":
    main()
