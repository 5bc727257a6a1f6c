"""Reproduce the paper's figures and numbers: exact values beside simulated ones.

``reproduce(out_dir)`` (``python -m specjax reproduce --out DIR``) writes the PNG figures of the
paper's "Numerical Simulation Details" (Figures 2, 3, 4 and the ``T = 100`` appendix figure), a
``summary.md`` and a ``summary.json`` with every number. Each experiment is a function returning
plain arrays and numbers (no plotting), in ``specjax.experiments.paper`` (its names are served
from here too), so notebooks and tests can call them directly; plotting lives in
``specjax.experiments.plots``. This module holds the run: its ``Settings``, the checks of the
results against the theory, and the output folder.

The setting is the paper's: non-stationary Markov chains with 7 states, horizon ``T = 50``,
uniform prompt, rows drawn from a Dirichlet(1) with seed 10. The paper's own random draws are
unknown, so its numbers (16.41 rejections, acceleration 3.05) are printed beside ours, not
expected to match.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib

import jax
import numpy as np

from specjax.models import markov as _models
from specjax._progress import Progress
from specjax.experiments import report as _report
from specjax.experiments.paper import APPENDIX_DRAFTS
from specjax.experiments.paper import FIGURE2_DRAFTS
from specjax.experiments.paper import PAPER
from specjax.experiments.paper import SWEEP_POINTS
from specjax.experiments.paper import bernoulli  # noqa: F401 - served from here too
from specjax.experiments.paper import convergence
from specjax.experiments.paper import far_drafts  # noqa: F401 - served from here too
from specjax.experiments.paper import improvement
from specjax.experiments.paper import improvement_cases
from specjax.experiments.paper import mean_se  # noqa: F401 - served from here too
from specjax.experiments.paper import one_token_chains  # noqa: F401 - served from here too
from specjax.experiments.paper import running_mean  # noqa: F401 - served from here too
from specjax.experiments.paper import scaling
from specjax.experiments.paper import scaling_steps
from specjax.experiments.paper import sweep_epsilons
from specjax.experiments.paper import table1
from specjax.experiments.paper import tradeoff
from specjax.experiments.paper import tv_deviation_bound  # noqa: F401 - served from here too
from specjax.experiments.paper import uniform_subset  # noqa: F401 - served from here too
from specjax.experiments.report import FIGURES  # noqa: F401 - re-exported: the names of the figures
from specjax.experiments.report import z_score

__all__ = [
    "SUMMARIES",
    "Settings",
    "Z_TOLERANCE",
    "check_out_dir",
    "checks",
    "experiment_steps",
    "make_out_dir",
    "output_names",
    "reproduce",
    "reproduce_steps",
    "run_experiments",
]


@dataclasses.dataclass(frozen=True)
class Settings:
    """Sizes of a reproduction run (the defaults are the paper's setting)."""

    seed: int = _models.PAPER_SEED
    num_states: int = _models.PAPER_NUM_STATES
    horizon: int = _models.PAPER_HORIZON
    long_horizon: int = 100  # the appendix figure
    num_runs: int = 20_000  # chains per running-mean curve (the paper shows about 5,000-10,000)
    max_drafts: int = 30  # Figure 2(c): M = 1..max_drafts
    simulated_drafts: tuple = (1, 2, 4, 8, 16)  # Figure 2(c): simulated points
    token_runs: int = 200_000  # single-token experiments (Figures 3 and 4)
    # Figure 3: None sweeps eps over 11 points from 0 to max(p - q), beyond which b = 1 everywhere
    # (every draft accepted) and nothing changes.
    epsilons: tuple | None = None
    table_epsilons: tuple = (0.1, 0.2, 0.4, 0.8)  # Table 1
    improvement_drafts: int = 10  # Figure 4: M = 1..improvement_drafts (exact, closed form)
    improvement_simulated: tuple = (1, 2, 3, 5, 8)  # Figure 4: simulated points

    @classmethod
    def quick(cls) -> "Settings":
        """Toy sizes for tests: every experiment runs, in seconds."""
        return cls(num_states=4, horizon=8, long_horizon=10, num_runs=2_000, max_drafts=6,
                   simulated_drafts=(1, 3), token_runs=20_000, epsilons=(0.0, 0.1, 0.4),
                   improvement_drafts=4, improvement_simulated=(2,))


# --- the whole reproduction ----------------------------------------------------------------------


def _check(name, ok, detail):
    return {"check": name, "ok": bool(ok), "detail": detail}


Z_TOLERANCE = 4.5  # per check, a false-failure rate of 7e-6 under the normal approximation


def experiment_steps(settings: Settings) -> int:
    """The progress steps of ``run_experiments``: one per simulation (running means, ``M``
    points, ``eps`` x (OPT, UNO), Figure 4 cases) and per exact computation that compiles a
    program of its own (each ``M`` of Figure 2(c) and of the appendix, each ``eps`` of Table 1)."""
    s = settings
    num_epsilons = SWEEP_POINTS if s.epsilons is None else len(s.epsilons)
    return ((1 + len(FIGURE2_DRAFTS)) + scaling_steps(s.max_drafts, s.simulated_drafts)
            + 2 * num_epsilons + len(improvement_cases()) + (1 + len(APPENDIX_DRAFTS))
            + scaling_steps(s.max_drafts, ()) + len(s.table_epsilons))


def reproduce_steps(settings: Settings) -> int:
    """The progress steps of ``reproduce``: the experiments', then the summary and the figures."""
    return experiment_steps(settings) + 2


def run_experiments(settings: Settings = Settings(), progress: bool | Progress = True) -> dict:
    """Runs every experiment; returns the results (arrays included) as a dict.

    ``progress``: show a progress bar (``True``), or not, or a ``Progress`` to advance (by
    ``experiment_steps(settings)`` steps; ``reproduce`` passes its own, which goes on through
    the summary and the figures).
    """
    if isinstance(progress, Progress):
        return _run_experiments(settings, progress)
    with Progress(experiment_steps(settings), enabled=progress) as bar:
        return _run_experiments(settings, bar)


def _run_experiments(s: Settings, bar: Progress) -> dict:
    key = jax.random.key(s.seed)
    draft, target = _models.paper_instance(s.seed, s.num_states, s.horizon)
    long_draft, long_target = _models.paper_instance(s.seed, s.num_states, s.long_horizon)
    p, q = draft.trans[0, 0], target.trans[0, 0]  # one token: position 1 after x_0 = 0
    epsilons = sweep_epsilons(p, q, s.epsilons)
    results = {"settings": dataclasses.asdict(s), "paper": PAPER}
    results["convergence"] = convergence(jax.random.fold_in(key, 1), draft, target, s.num_runs,
                                         FIGURE2_DRAFTS, progress=bar)
    results["scaling"] = scaling(jax.random.fold_in(key, 2), draft, target, s.max_drafts,
                                 s.simulated_drafts, s.num_runs, progress=bar)
    results["tradeoff"] = tradeoff(jax.random.fold_in(key, 3), p, q, epsilons, s.token_runs,
                                   progress=bar)
    results["improvement"] = improvement(jax.random.fold_in(key, 4), s.improvement_drafts,
                                         s.improvement_simulated, s.token_runs, progress=bar)
    results["long_convergence"] = convergence(jax.random.fold_in(key, 5), long_draft,
                                              long_target, s.num_runs, APPENDIX_DRAFTS,
                                              progress=bar)
    results["long_scaling"] = scaling(jax.random.fold_in(key, 6), long_draft, long_target,
                                      s.max_drafts, (), s.num_runs, progress=bar)
    results["table1"] = table1(draft, target, s.table_epsilons, progress=bar)
    results["checks"] = checks(results)
    return results


def checks(results) -> list[dict]:
    """What the theory says, checked against what was computed and simulated."""
    out = []
    for which in ("convergence", "long_convergence"):
        conv = results[which]
        entries = [("SD", conv["sd"])] + [(f"batch M={m}", e) for m, e in conv["batch"].items()]
        for name, e in entries:
            z = z_score(e["mean"], e["se"], e["exact"])
            out.append(_check(f"{which}: {name} mean within {Z_TOLERANCE} SE of the theorem",
                              abs(z) < Z_TOLERANCE, f"z = {z:+.2f}"))
    for which in ("scaling", "long_scaling"):
        sc = results[which]
        exact = np.array(sc["exact"])
        out.append(_check(f"{which}: M = 1 equals SD (Theorem 1)",
                          abs(exact[0] - sc["sd"]) <= 1e-4 * max(1.0, sc["sd"]),
                          f"{exact[0]:.6f} vs {sc['sd']:.6f}"))
        out.append(_check(f"{which}: E[N_rej] decreases in M towards a positive limit",
                          bool(np.all(np.diff(exact) <= 1e-6)) and 0 < sc["limit"] <= exact[-1]
                          + 1e-6, f"M = {len(exact)}: {exact[-1]:.4f}, limit {sc['limit']:.4f}"))
        for m, (mean, se) in sc["simulated"].items():
            z = z_score(mean, se, exact[m - 1])
            out.append(_check(f"{which}: simulated M = {m} within {Z_TOLERANCE} SE",
                              abs(z) < Z_TOLERANCE, f"z = {z:+.2f}"))
    tr = results["tradeoff"]
    for r in tr["rows"]:
        on_line = abs(r["reject_exact"] + r["loss_star"] - tr["tv"])
        out.append(_check(f"tradeoff eps={r['epsilon']:g}: b is at least SD's acceptance, so "
                          "P(reject) + Loss* = TV (Theorem 5)", on_line < 1e-5,
                          f"|difference| = {on_line:.1e}"))
        out.append(_check(f"tradeoff eps={r['epsilon']:g}: OPT's exact output is Loss* from q "
                          "(Theorem 4)", abs(r["opt_tv_exact"] - r["loss_star"]) < 1e-5,
                          f"{r['opt_tv_exact']:.6f} vs {r['loss_star']:.6f}"))
        for name in ("opt", "uno"):
            z = z_score(r[f"{name}_reject"], r[f"{name}_reject_se"], r["reject_exact"])
            out.append(_check(f"tradeoff eps={r['epsilon']:g}: {name.upper()}'s simulated "
                              f"P(reject) within {Z_TOLERANCE} SE", abs(z) < Z_TOLERANCE,
                              f"z = {z:+.2f}"))
            gap = abs(r[f"{name}_tv_simulated"] - r[f"{name}_tv_exact"])
            out.append(_check(f"tradeoff eps={r['epsilon']:g}: {name.upper()}'s simulated "
                              "output TV matches its exact value (bound failing w.p. 1e-6)",
                              gap <= r[f"{name}_tv_bound"],
                              f"|difference| = {gap:.4f} <= {r[f'{name}_tv_bound']:.4f}"))
    for case in results["improvement"]:
        gap = max(abs(a - b) for a, b in zip(case["exact"], case["closed_form"]))
        out.append(_check(f"batch improvement {case['label']}: exact = closed form (Section 3.2)",
                          gap < 1e-5, f"max |difference| = {gap:.1e}"))
        zs = [z_score(sim, se, case["exact"][m - 1]) for m, (sim, se) in case["simulated"].items()]
        worst = max(abs(z) for z in zs)
        out.append(_check(f"batch improvement {case['label']}: simulated within {Z_TOLERANCE} SE",
                          worst < Z_TOLERANCE, f"max |z| = {worst:.2f}"))
    for r in results["table1"]:
        gap = r["max_row_tv_opt_minus_uno"]
        out.append(_check(f"Table 1 eps={r['epsilon']:g}: in every context, OPT's output is no "
                          "further from q in TV than UNO's (Theorem 4)", gap <= 1e-6,
                          f"max TV(OPT) - TV(UNO) over rows = {gap:.1e}"))
    return out


SUMMARIES = ("summary.md", "summary.json")


def output_names() -> list[str]:
    """The files ``reproduce`` writes into its folder: the figures, then the summaries."""
    return list(FIGURES) + list(SUMMARIES)


def _probe_writable(folder: pathlib.Path) -> None:
    """Creates and removes a temporary file in ``folder``; raises ``OSError`` if it cannot."""
    probe = _report.temporary_name(folder / "write-test")
    os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    os.unlink(probe)


def _probe_creatable(folder: pathlib.Path) -> None:
    """Creates and removes a temporary folder in ``folder``; raises ``OSError`` if it cannot
    (``/proc``, a read-only file system: ``os.access`` says yes there to root)."""
    probe = _report.temporary_name(folder / "mkdir-test")
    os.mkdir(probe)
    os.rmdir(probe)


def check_out_dir(out_dir, names=None, writer: str = "reproduce") -> pathlib.Path:
    """``out_dir`` as a path, checked before any work: it must be a folder that exists and is
    writable, or a path that can be created (under a writable folder, not under a file), and
    each output file's path in it must be free for a file (not a folder).

    Writes nothing that stays: an existing folder is checked by creating and removing a
    temporary file in it; a missing one by the permissions of its nearest existing parent and
    by creating and removing a temporary folder there.

    Args:
      out_dir: the output folder.
      names: the files written into it (default: ``reproduce``'s, ``output_names()``).
      writer: who writes them, as the message says (``python -m specjax bench`` passes
        ``"bench"``).

    Raises:
      ValueError: saying why (empty, exists and is not a folder, under a file, not writable,
        or holds a folder where an output file goes).
    """
    names = output_names() if names is None else list(names)
    if str(out_dir) == "":
        raise ValueError("'' is empty: give a folder, such as figures")
    out = pathlib.Path(out_dir)
    if os.path.lexists(out) and not out.exists():
        raise ValueError(f"{str(out)!r} is a broken symbolic link")
    if out.exists():
        if not out.is_dir():
            raise ValueError(f"{str(out)!r} exists and is not a folder")
        try:
            _probe_writable(out)
        except OSError as err:
            raise ValueError(f"{str(out)!r} is not writable ({err.strerror or err})") from None
        for name in names:
            if (out / name).is_dir():
                raise ValueError(f"{str(out / name)!r} is a folder, where {writer} writes the "
                                 f"file {name}")
        return out
    # A folder to create: its nearest existing parent must be a writable folder.
    parent = out.absolute().parent
    while not os.path.lexists(parent):
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{str(out)!r} cannot be created: {str(parent)!r} is a file, not a "
                         "folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{str(out)!r} cannot be created: {str(parent)!r} is not writable")
    try:
        _probe_creatable(parent)
    except OSError as err:
        raise ValueError(f"{str(out)!r} cannot be created: {str(parent)!r} is not writable "
                         f"({err.strerror or err})") from None
    return out


def make_out_dir(out_dir, names=None, writer: str = "reproduce") -> pathlib.Path:
    """``check_out_dir`` (with the same arguments), then creates the folder (and its parents)
    if needed."""
    out = check_out_dir(out_dir, names, writer)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"{str(out)!r} cannot be created ({err.strerror or err})") from None
    return out


def reproduce(out_dir="figures", settings: Settings = Settings(), progress: bool = True) -> dict:
    """Runs every experiment and writes the figures, ``summary.md`` and ``summary.json``.

    Args:
      out_dir: the output folder (created if needed; ``check_out_dir`` says what it must be).
        Each file is written whole or not at all (``report.atomic_write``). Figures are drawn
        with matplotlib's current backend (Agg when there is no display).
      settings: sizes (``Settings()`` is the paper's setting; ``Settings.quick()`` toy sizes).
      progress: show a progress bar on standard error.

    Returns:
      The results dict (as in ``summary.json``, plus the running-mean arrays).

    Raises:
      ValueError: ``out_dir`` is not a writable folder, nor one that can be created (before
        any experiment runs).
    """
    out = make_out_dir(out_dir)
    # One bar from the first simulation to the last figure written.
    with Progress(reproduce_steps(settings), enabled=progress) as bar:
        results = run_experiments(settings, bar)
        # The numbers first: a plotting failure must not lose them. Every file is written
        # whole or not at all (``report.atomic_write``): an interrupted run leaves no partial
        # file, and a rerun into the same folder replaces them.
        # The two summaries both or neither (``report.write_texts``).
        _report.write_texts({
            out / "summary.md": _report.summary_markdown(results, PAPER, Z_TOLERANCE),
            out / "summary.json": json.dumps(_report.jsonable(results), indent=1,
                                             allow_nan=False)})
        bar.step("summary.md and summary.json written")
        _report.write_figures(results, out)
        bar.step("figures written")
    return results
