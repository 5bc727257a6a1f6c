"""The paper's experiments as functions: each returns plain arrays and numbers (no plotting), so
notebooks and tests can call them directly.

* ``convergence`` (Figure 2 and the ``T = 100`` appendix figure): running means of the rejections
  of SD and batch SD against the theorems' exact values;
* ``scaling`` (Figure 2(c)): batch SD's expected rejections as the number of drafts grows;
* ``tradeoff`` (Figure 3): the rejection / bias trade-off of one token;
* ``improvement`` (Figure 4): batch SD's improvement on one token, exact, closed form and simulated;
* ``table1`` (Table 1): OPT against UNO on Markov chains, exactly.

``specjax.experiments.reproduce`` runs them all at the paper's setting (and serves these names
too); ``specjax.experiments.plots`` draws them.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from specjax._progress import Progress
from specjax.decoders import multi_draft
from specjax.decoders import verification as _verify
from specjax.models.markov import MarkovChain
from specjax.sampling.samplers import batch_speculative_decoding
from specjax.sampling.samplers import biased_speculative_decoding
from specjax.sampling.samplers import speculative_decoding
from specjax.theory.values import batch_expected_rejections
from specjax.theory.laws import biased_output_chain
from specjax.theory.values import exact_biased_speculative_decoding
from specjax.theory.values import expected_rejections
from specjax.theory.laws import sequence_kl

__all__ = [
    "APPENDIX_DRAFTS",
    "FIGURE2_DRAFTS",
    "PAPER",
    "SWEEP_POINTS",
    "bernoulli",
    "convergence",
    "far_drafts",
    "improvement",
    "improvement_cases",
    "mean_se",
    "one_token_chains",
    "running_mean",
    "scaling",
    "scaling_steps",
    "sweep_epsilons",
    "table1",
    "tradeoff",
    "tv_deviation_bound",
    "uniform_subset",
]

PAPER = {
    "expected_rejections_T50": 16.41,
    "acceleration_T50": 3.05,
    "runs_to_converge": 5000,
}


FIGURE2_DRAFTS = (4, 5)  # Figure 2(b)
APPENDIX_DRAFTS = (2,)  # the T = 100 appendix figure


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
