"""Reproduce the paper's figures and numbers: exact values beside simulated ones.

``reproduce(out_dir)`` (``python -m specjax reproduce --out DIR``) writes the PNG figures of the
paper's "Numerical Simulation Details" (Figures 2, 3, 4 and the ``T = 100`` appendix figure), a
``summary.md`` and a ``summary.json`` with every number. Each experiment is a function returning
plain arrays and numbers (no plotting), so notebooks and tests can call them directly; plotting
lives in ``specjax.experiments.plots``.

The setting is the paper's: non-stationary Markov chains with 7 states, horizon ``T = 50``,
uniform prompt, rows drawn from a Dirichlet(1) with seed 10. The paper's own random draws are
unknown, so its numbers (16.41 rejections, acceleration 3.05) are printed beside ours, not
expected to match.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np

from specjax.models import markov as _models
from specjax._progress import Progress
from specjax.experiments import report as _report
from specjax.decoders import multi_draft
from specjax.decoders import verification as _verify
from specjax.experiments.report import FIGURES  # noqa: F401 - re-exported: the names of the figures
from specjax.experiments.report import z_score
from specjax.models.markov import MarkovChain
from specjax.sampling.samplers import batch_speculative_decoding
from specjax.sampling.samplers import biased_speculative_decoding
from specjax.sampling.samplers import speculative_decoding
from specjax.theory.values import batch_expected_rejections
from specjax.theory.laws import biased_output_chain
from specjax.theory.values import exact_biased_speculative_decoding
from specjax.theory.values import expected_rejections
from specjax.theory.laws import sequence_kl

PAPER = {
    "expected_rejections_T50": 16.41,
    "acceleration_T50": 3.05,
    "runs_to_converge": 5000,
}


FIGURE2_DRAFTS = (4, 5)  # Figure 2(b)
APPENDIX_DRAFTS = (2,)  # the T = 100 appendix figure


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


def mean_se(x) -> tuple[float, float]:
    """Sample mean and its standard error (``std / sqrt(n)``, ``ddof = 1``)."""
    x = np.asarray(x, np.float64)
    return float(x.mean()), (float(x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else 0.0)


def running_mean(x) -> tuple[np.ndarray, np.ndarray]:
    """Running mean of ``x[:n]`` and its standard error, for ``n = 1..N``."""
    x = np.asarray(x, np.float64)
    n = np.arange(1, x.size + 1)
    mean = np.cumsum(x) / n
    second = np.cumsum(x * x) / n
    var = np.maximum(second - mean * mean, 0) * n / np.maximum(n - 1, 1)
    return mean, np.sqrt(var / n)


def _counts(trace_fn, key, num_runs, progress, label, chunk=50_000):
    """Concatenated ``num_rejections`` of ``trace_fn(key, C)`` over chunks of at most ``chunk``."""
    out, done, i = [], 0, 0
    while done < num_runs:
        size = min(chunk, num_runs - done)
        out.append(np.asarray(trace_fn(jax.random.fold_in(key, i), size).num_rejections))
        done, i = done + size, i + 1
    progress.step(label)
    return np.concatenate(out)


# --- Figure 2 and the T = 100 appendix figure ----------------------------------------------------


def convergence(key, draft, target, num_runs, num_drafts=FIGURE2_DRAFTS, progress=None):
    """Figure 2(a, b): running means of SD and batch SD rejections beside Theorems 1 and 3.

    Returns a dict: ``{"sd": {...}, "batch": {M: {...}}}``, each entry with ``exact``,
    ``running_mean``, ``running_se``, ``mean`` and ``se`` (over all runs).
    """
    progress = progress or Progress(1 + len(num_drafts), enabled=False)

    def entry(samples, exact):
        mean, se = running_mean(samples)
        return {"exact": float(exact), "running_mean": mean, "running_se": se,
                "mean": float(mean[-1]), "se": float(se[-1])}

    sd = _counts(lambda k, c: speculative_decoding(k, draft, target, c), jax.random.fold_in(key, 0),
                 num_runs, progress, "SD running mean")
    result = {"sd": entry(sd, expected_rejections(draft, target)), "batch": {}}
    for m in num_drafts:
        samples = _counts(
            lambda k, c, m=m: batch_speculative_decoding(k, draft, target, c, num_drafts=m),
            jax.random.fold_in(key, m), num_runs, progress, f"batch SD M={m} running mean")
        result["batch"][m] = entry(samples, batch_expected_rejections(draft, target,
                                                                      num_drafts=m))
    return result


def far_drafts(max_drafts) -> list:
    """The ``M`` far beyond ``max_drafts`` (up to ``10^4``) where ``scaling`` is exact too."""
    return [m for m in (100, 300, 1000, 3000, 10_000) if m > max_drafts]


def scaling_steps(max_drafts, simulated_drafts) -> int:
    """The progress steps of ``scaling``: one per exact value (``M = 1..max_drafts``, the far
    ``M``, the limit; each ``M`` compiles its own program) and one per simulated ``M``."""
    return max_drafts + len(far_drafts(max_drafts)) + 1 + len(simulated_drafts)


def scaling(key, draft, target, max_drafts, simulated_drafts, num_runs, progress=None):
    """Figure 2(c): exact ``E[N_rej]`` for ``M = 1..max_drafts`` and at a few ``M`` up to
    ``10^4``, the ``M -> inf`` limit, and Monte Carlo points (mean, se) at ``simulated_drafts``."""
    progress = progress or Progress(scaling_steps(max_drafts, simulated_drafts), enabled=False)

    def exact_at(m):
        value = float(batch_expected_rejections(draft, target, num_drafts=m))
        progress.step(f"exact batch SD M={m}")
        return value

    drafts = list(range(1, max_drafts + 1))
    exact = [exact_at(m) for m in drafts]
    # Far beyond max_drafts, exactly: the approach to the limit (geometric, but with rate
    # 1 - p(x*), which can be very close to 1).
    far = far_drafts(max_drafts)
    far_exact = [exact_at(m) for m in far]
    limit = exact_at(math.inf)
    simulated = {}
    for m in simulated_drafts:
        samples = _counts(
            lambda k, c, m=m: batch_speculative_decoding(k, draft, target, c, num_drafts=m),
            jax.random.fold_in(key, 1000 + m), num_runs, progress, f"batch SD M={m}")
        simulated[m] = mean_se(samples)
    return {"num_drafts": drafts, "exact": exact, "far_num_drafts": far, "far_exact": far_exact,
            "limit": limit, "simulated": simulated,
            "sd": float(expected_rejections(draft, target))}


# --- Figure 3: the rejection / bias trade-off of one token ---------------------------------------


def one_token_chains(p, q):
    """``(draft, target)`` chains of horizon 1 whose prompt is token 0 and whose first transition
    from token 0 is ``p`` (draft) and ``q`` (target): the samplers then verify one token."""
    p, q = jnp.asarray(p), jnp.asarray(q)
    v = p.shape[-1]
    init = jnp.zeros((v,), p.dtype).at[0].set(1)
    uniform = jnp.full((1, v, v), 1.0 / v, p.dtype)
    return (MarkovChain(init, uniform.at[0, 0].set(p)), MarkovChain(init, uniform.at[0, 0].set(q)))


def tv_deviation_bound(law, num_runs, delta=1e-6):
    """A bound on ``|TV(empirical law, q) - TV(law, q)|`` for ``num_runs`` draws from ``law``
    that fails with probability at most ``delta``: the bias ``E|hat - law|_1 / 2 <=
    sum sqrt(law (1 - law) / n) / 2`` plus McDiarmid's deviation ``sqrt(log(2 / delta) / 2n)``
    (one draw moves the empirical TV by at most ``1 / n``)."""
    law = np.asarray(law, np.float64)
    bias = 0.5 * np.sum(np.sqrt(np.clip(law * (1 - law), 0, None) / num_runs))
    return float(bias + math.sqrt(math.log(2 / delta) / (2 * num_runs)))


def _empirical_law(tokens, num_states):
    return np.bincount(np.asarray(tokens), minlength=num_states) / tokens.shape[0]


SWEEP_POINTS = 11  # Figure 3's eps sweep when Settings.epsilons is None


def sweep_epsilons(p, q, epsilons=None) -> list:
    """``epsilons`` as a list; ``None`` is 11 values from 0 to ``max(p - q)``, beyond which
    ``b = 1`` everywhere (every draft accepted) and nothing changes."""
    if epsilons is not None:
        return list(epsilons)
    return [round(x, 6) for x in np.linspace(0.0, float(jnp.max(p - q)), SWEEP_POINTS)]


def tradeoff(key, p, q, epsilons, num_runs, progress=None):
    """Figure 3(b, c): for ``b = min(1, (q + eps) / p)``, exact ``P(reject)`` and ``Loss*_TV``
    (Theorem 4) and simulated ``P(reject)`` and TV of the output law to ``q``, for Decoding-OPT
    (residual ``P*``) and Decoding-UNO (residual ``q``). By Theorem 5, OPT's points lie on the
    line ``P(reject) + TV = TV(p, q)``; UNO's lie above it. ``epsilons=None`` sweeps 11 values
    from 0 to ``max(p - q)``."""
    epsilons = sweep_epsilons(p, q, epsilons)
    progress = progress or Progress(2 * len(epsilons), enabled=False)
    draft, target = one_token_chains(p, q)
    v = p.shape[-1]
    rows = []
    for i, eps in enumerate(epsilons):
        b = _verify.acceptance_probability(p, q, epsilon=eps)
        row = {"epsilon": float(eps), "reject_exact": float(_verify.rejection_probability(p, b)),
               "loss_star": float(_verify.tv_loss_star(p, q, b))}
        for j, residual in enumerate(("optimal", "target")):
            trace = biased_speculative_decoding(jax.random.fold_in(key, 10 * i + j), draft,
                                                target, num_runs, epsilon=eps, residual=residual)
            reject = float(np.mean(np.asarray(trace.rejected[:, 0])))
            law = _empirical_law(trace.tokens[:, 1], v)
            name = "opt" if residual == "optimal" else "uno"
            exact_law = np.asarray(biased_output_chain(draft, target, epsilon=eps,
                                                       residual=residual).trans[0, 0],
                                   np.float64)
            # The standard error of a frequency from its exact probability (the sample's own
            # is 0, and meaningless, when rejections are rare or impossible).
            p_rej = row["reject_exact"]
            row[f"{name}_reject"] = reject
            row[f"{name}_reject_se"] = math.sqrt(max(p_rej * (1 - p_rej), 0.0) / num_runs)
            row[f"{name}_tv_simulated"] = float(0.5 * np.abs(law - np.asarray(q)).sum())
            row[f"{name}_tv_exact"] = float(0.5 * np.abs(exact_law - np.asarray(q)).sum())
            row[f"{name}_tv_bound"] = tv_deviation_bound(exact_law, num_runs)
            row[f"{name}_tv_bar"] = tv_deviation_bound(exact_law, num_runs, delta=0.05)
            progress.step(f"biased SD eps={eps:g} {name}")
        rows.append(row)
    return {"tv": float(_verify.tv_distance(p, q)), "rows": rows}


# --- Figure 4: batch improvement of one token ----------------------------------------------------


def bernoulli(u, dtype=None):
    """``Ber(u)`` as a two-token row ``(1 - u, u)``."""
    return jnp.array([1 - u, u], dtype or jnp.result_type(float))


def uniform_subset(num_states, support, dtype=None):
    """Uniform on the first ``support`` of ``num_states`` tokens."""
    dtype = dtype or jnp.result_type(float)
    return jnp.where(jnp.arange(num_states) < support, 1.0 / support, 0.0).astype(dtype)


def improvement_cases():
    """``(label, p, q, closed form of M)`` for Figure 4's Bernoulli and uniform examples."""
    cases = [(f"Ber: u = {u}", bernoulli(u), bernoulli(0.5),
              lambda m, u=u: abs(u - 0.5) * (1 - u ** (m - 1))) for u in (0.6, 0.75, 0.9)]
    cases += [(f"Unif: r = {r}", uniform_subset(12, 12), uniform_subset(12, 12 // r),
               lambda m, r=r: (1 - 1 / r) - (1 - 1 / r) ** m) for r in (2, 3, 6)]
    return cases


def improvement(key, max_drafts, simulated_drafts, num_runs, progress=None):
    """Figure 4: single-token batch improvement ``TV(q, p) - prod_m TV(q^m, p)`` against ``M``.

    Cases: ``q = Ber(0.5)``, ``p = Ber(u)`` for ``u = 0.6, 0.75, 0.9`` (closed form
    ``|u - v| (1 - u^{M - 1})``) and ``p`` uniform on ``V = 12`` tokens, ``q`` uniform on
    ``V' = V / r`` of them for ``r = 2, 3, 6`` (closed form ``(1 - 1/r) - (1 - 1/r)^M``). The
    simulated value is ``TV(p, q)`` minus the batch sampler's first-token rejection rate.
    """
    cases = improvement_cases()
    progress = progress or Progress(len(cases), enabled=False)
    drafts = list(range(1, max_drafts + 1))
    out = []
    for i, (label, p, q, closed) in enumerate(cases):
        tv = float(_verify.tv_distance(p, q))
        draft, target = one_token_chains(p, q)
        exact = [float(multi_draft.batch_improvement(p, q, num_drafts=m)) for m in drafts]
        simulated = {}
        for m in simulated_drafts:
            trace = batch_speculative_decoding(jax.random.fold_in(key, 100 * i + m), draft,
                                               target, num_runs, num_drafts=m)
            rate, se = mean_se(trace.rejected[:, 0])
            simulated[m] = (tv - rate, se)
        out.append({"label": label, "tv": tv, "num_drafts": drafts, "exact": exact,
                    "closed_form": [float(closed(m)) for m in drafts], "simulated": simulated})
        progress.step(f"batch improvement {label}")
    return out


# --- Table 1 on Markov chains, exactly -----------------------------------------------------------


def table1(draft, target, epsilons, progress=None):
    """Decoding-OPT vs Decoding-UNO with exact quantities instead of LLM-judge win rates.

    For each ``eps``: per-token TV of the output law to the target (averaged over positions, each
    context weighted by the decoder's own law of ``x_{n-1}``), whole-sequence ``KL(output || q)``,
    and the rejection rate ``E[N_rej] / T`` of each decoder.
    """
    progress = progress or Progress(len(epsilons), enabled=False)
    rows = []
    horizon = target.horizon
    for eps in epsilons:
        row = {"epsilon": float(eps)}
        for name, residual in (("opt", "optimal"), ("uno", "target")):
            out = biased_output_chain(draft, target, epsilon=eps, residual=residual)
            exact = exact_biased_speculative_decoding(draft, target, epsilon=eps,
                                                      residual=residual)
            context = exact.marginals[:-1]  # (T, V): the decoder's law of x_{n-1}
            tv_rows = _verify.tv_distance(out.trans, target.trans)
            row[f"{name}_tv_per_token"] = float(jnp.sum(context * tv_rows) / horizon)
            row[f"{name}_kl"] = float(sequence_kl(out, target))
            row[f"{name}_reject_rate"] = float(exact.expected_rejections / horizon)
            row[f"{name}_tv_rows"] = tv_rows
        # Theorem 4, context by context: OPT's output row is never further from q than UNO's.
        gap = row.pop("opt_tv_rows") - row.pop("uno_tv_rows")
        row["max_row_tv_opt_minus_uno"] = float(jnp.max(gap))
        rows.append(row)
        progress.step(f"Table 1 eps={eps:g}")
    return rows


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


def check_out_dir(out_dir) -> pathlib.Path:
    """``out_dir`` as a path, checked before any work: it must be a folder that exists and is
    writable, or a path that can be created (under a writable folder, not under a file).

    Writes nothing that stays: an existing folder is checked by creating and removing a
    temporary file in it; a missing one by the permissions of its nearest existing parent.

    Raises:
      ValueError: saying why (empty, exists and is not a folder, under a file, not writable,
        or holds a folder where an output file goes).
    """
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
        for name in output_names():
            if (out / name).is_dir():
                raise ValueError(f"{str(out / name)!r} is a folder, where reproduce writes the "
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
    return out


def make_out_dir(out_dir) -> pathlib.Path:
    """``check_out_dir``, then creates the folder (and its parents) if needed."""
    out = check_out_dir(out_dir)
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
        _report.write_text(out / "summary.md",
                           _report.summary_markdown(results, PAPER, Z_TOLERANCE))
        _report.write_text(out / "summary.json", json.dumps(_report.jsonable(results), indent=1,
                                                            allow_nan=False))
        bar.step("summary.md and summary.json written")
        _report.write_figures(results, out)
        bar.step("figures written")
    return results
