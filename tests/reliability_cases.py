"""The reliability battery of issue 19: bad inputs and faults, tried as a new user would, across
every public entry point of specjax and its command line.

Each ``Case`` is one call with one input kind (its *class*), run through one entry point, and an
expectation:

* ``error=("name", ...)``: a ``ValueError`` whose message names one of these arguments;
* ``check=f``: the call returns, and ``f(result)`` is True (a sampler's token histogram close to
  the target's marginals, an exact value equal to a float64 reference, ...). Every returned
  floating-point array must also be finite (a result full of NaN is silent).

A case may give both (either a clear refusal or a right result is fine).

``classify(case)`` runs a case and returns an ``Outcome``: ``"clear error"``, ``"right"``,
``"silent"`` (it returned, and the check failed or it should have raised), ``"cryptic"`` (another
exception type, a ``ValueError`` that does not name the argument, or a valid input refused) or
``"crash"`` (out of memory, abort, killed, or no answer within the time limit).

Size cases (``isolate=True``) never run in the calling process: they run in a child process
limited to ``CHILD_ADDRESS_SPACE`` bytes of address space and ``CASE_TIMEOUT`` seconds per case,
with ``specjax._memory.available_bytes`` patched to ``PATCHED_AVAILABLE`` bytes when that module
exists, so that a library that does not refuse them crashes the child, not the caller.

``tests/test_reliability.py`` asserts "clear error" or "right" for every case;
``scripts/reliability_battery.py`` prints the counts per class and outcome.
"""

from __future__ import annotations

import contextlib
import itertools
import dataclasses
import functools
import importlib
import io
import json
import math
import os
import re
import selectors
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from compile_flags import without_fast_compile

import specjax
import specjax.compat  # the deprecated conveniences' own cases (their warnings are recorded)

OUTCOMES = ("clear error", "right", "silent", "cryptic", "crash")
PASSING = ("clear error", "right")

#: Address-space limit of the child that runs the size cases (3 GiB).
CHILD_ADDRESS_SPACE = 3 << 30
#: What ``specjax._memory.available_bytes`` says in that child (2 GB).
PATCHED_AVAILABLE = 2 * 10**9
#: Seconds a size case may take in the child before it counts as a crash (a hang).
CASE_TIMEOUT = 120.0  # generous: a 2-core machine running the suite on both cores is slow

#: Modules (beside this one) whose ``add_cases(add, specjax)`` add the cases of issue 52.
RECENT_CASE_MODULES = ("reliability_recent_pairs", "reliability_recent_cli",
                       "reliability_recent_models", "reliability_recent_more")

V, T, C = 4, 3, 4000  # tokens, horizon, chains of every sampler case

# ---------------------------------------------------------------------------------------------
# Cases.


@dataclasses.dataclass(frozen=True)
class Case:
    """One battery case (see the module docstring)."""

    kind: str  # the input class
    entry: str  # the public entry point
    what: str  # a short description
    run: Callable[[], Any] = dataclasses.field(repr=False, compare=False)
    error: tuple = ()  # argument names, one of which a clear ValueError names
    check: Callable[[Any], bool] | None = dataclasses.field(default=None, repr=False,
                                                            compare=False)
    isolate: bool = False  # run in a memory-limited child process

    @property
    def id(self) -> str:
        text = f"{self.kind}|{self.entry}|{self.what}"
        return re.sub(r"[^A-Za-z0-9_.=|+*-]+", "_", text).strip("_")

    @property
    def expectation(self) -> str:
        parts = []
        if self.error:
            parts.append("ValueError naming " + " or ".join(repr(n) for n in self.error))
        if self.check is not None:
            parts.append("a right result")
        return " or ".join(parts)


@dataclasses.dataclass(frozen=True)
class Outcome:
    outcome: str
    detail: str = ""
    seconds: float = 0.0


class CliTraceback(RuntimeError):
    """An exception escaped the command line's ``main`` (the user sees a traceback)."""


# ---------------------------------------------------------------------------------------------
# Inputs (built lazily, once per process) and float64 references in NumPy.


def built_once(build):
    """``functools.cache`` for the inputs, built as concrete arrays even when the first call comes
    from inside a ``jax.jit`` trace (several cases call ``draft()`` in a jitted lambda, and which
    case a worker runs first depends on xdist's scheduling): otherwise the cache would keep the
    trace's tracers and every later case would fail on a leaked tracer."""
    @functools.cache
    @functools.wraps(build)
    def cached(*args):
        with jax.ensure_compile_time_eval():
            return build(*args)
    return cached


@functools.cache
def np_pair():
    """``(init, p, q)``: float64 NumPy arrays of a random draft/target pair, ``V = 4, T = 3``."""
    rng = np.random.default_rng(19)
    init = rng.dirichlet(np.ones(V))
    p = rng.dirichlet(np.ones(V), size=(T, V))
    q = rng.dirichlet(np.ones(V), size=(T, V))
    p[0, 1] = [0.5, 0.5, 0.0, 0.0]  # zeros and disjoint supports somewhere
    q[0, 1] = [0.0, 0.0, 0.5, 0.5]
    p[1, 2] = q[1, 2]  # p = q somewhere
    return init, p, q


@built_once
def pair():
    """The float32 ``(draft, target)`` MarkovChains of ``np_pair``."""
    init, p, q = np_pair()
    return (specjax.MarkovChain(jnp.asarray(init, jnp.float32), jnp.asarray(p, jnp.float32)),
            specjax.MarkovChain(jnp.asarray(init, jnp.float32), jnp.asarray(q, jnp.float32)))


def draft():
    return pair()[0]


def target():
    return pair()[1]


@built_once
def key():
    return jax.random.key(0)


@built_once
def rows():
    """One draft row and one target row ``(V,)`` (float32) from the pair."""
    _, p, q = np_pair()
    return jnp.asarray(p[2, 0], jnp.float32), jnp.asarray(q[2, 0], jnp.float32)


def np_marginals(init, trans):
    out = [np.asarray(init, np.float64)]
    for n in range(trans.shape[0]):
        out.append(out[-1] @ np.asarray(trans[n], np.float64))
    return np.stack(out)


def np_normalise(w):
    s = w.sum(-1, keepdims=True)
    return np.where(s > 0, w / np.where(s > 0, s, 1), 0.0)


def np_rule_output(p, q, b, res):
    """Output rows of one step of Algorithm 2: ``b p + (1 - sum b p) normalise(res)``."""
    acc = b * p
    return acc + (1 - acc.sum(-1, keepdims=True)) * np_normalise(res)


def np_biased_output(p, q, eps):
    b = np.where(p > 0, np.minimum(1, (q + eps) / np.where(p > 0, p, 1)), 1.0)
    return np_rule_output(p, q, b, np.maximum(q - b * p, 0))


def np_sd_rejections(init, p, q):
    """Theorem 1: ``sum_n E_{x_{n-1} ~ q}[TV(p_n, q_n)]``."""
    mu = np_marginals(init, q)
    tv = 0.5 * np.abs(p - q).sum(-1)  # (T, V)
    return float(sum(mu[n] @ tv[n] for n in range(p.shape[0])))


@functools.cache
def reference64(name: str) -> float:
    """Float64 values of the library itself on the pair (``jax_enable_x64``): the trusted path
    the project's suite checks against the paper's pseudo-code."""
    init, p, q = np_pair()
    with jax.enable_x64(True):
        d = specjax.MarkovChain(jnp.asarray(init), jnp.asarray(p))
        t = specjax.MarkovChain(jnp.asarray(init), jnp.asarray(q))
        if name == "sd":
            return float(specjax.expected_rejections(d, t))
        if name == "sd_k2":
            return float(specjax.expected_rejections(d, t, lookahead=2))
        if name == "calls":
            return float(specjax.expected_calls(d, t))
        if name == "batch_inf":
            return float(specjax.batch_expected_rejections(d, t, num_drafts=math.inf))
        if name.startswith("batch"):
            return float(specjax.batch_expected_rejections(d, t, num_drafts=int(name[5:])))
        if name == "block2_calls":
            return float(specjax.exact(specjax.BlockVerification(2), d, t).expected_calls)
        if name == "biased":
            return float(specjax.exact(specjax.BiasedSpeculative(0.1), d, t).expected_rejections)
    raise KeyError(name)


# ---------------------------------------------------------------------------------------------
# Checks.


def close(x, ref, rtol=1e-4, atol=1e-5) -> bool:
    return bool(np.allclose(np.asarray(x, np.float64), ref, rtol=rtol, atol=atol))


def hist_close(tokens, marg, num_states=V) -> bool:
    """Per-position token frequencies within 5 standard errors (+ 0.005) of ``marg``."""
    tokens = np.asarray(tokens)
    n = tokens.shape[0]
    freq = np.stack([np.bincount(tokens[:, i], minlength=num_states)[:num_states] / n
                     for i in range(tokens.shape[1])])
    tol = 5 * np.sqrt(marg * (1 - marg) / n) + 0.005
    return freq.shape == marg.shape and bool(np.all(np.abs(freq - marg) <= tol))


def target_marginals():
    init, _, q = np_pair()
    return np_marginals(init, q)


def trace_right(marg=None):
    """Check of a ``DecodingTrace``: shapes, and the token histogram against ``marg``."""
    def check(trace):
        m = target_marginals() if marg is None else marg
        return trace.tokens.shape == (C, m.shape[0]) and hist_close(trace.tokens, m)
    return check


def stats_right(trace_stats):
    m = target_marginals()
    counts = np.asarray(trace_stats.final_token_counts, np.float64)
    n = counts.sum()
    tol = 5 * np.sqrt(m[-1] * (1 - m[-1]) / n) + 0.005
    return n == C and bool(np.all(np.abs(counts / n - m[-1]) <= tol))


def exact_right(name, marg=None, rtol=1e-4):
    def check(result):
        value = result.expected_rejections if hasattr(result, "expected_rejections") else result
        ok = close(value, reference64(name), rtol=rtol, atol=rtol)
        if marg is not None and hasattr(result, "marginals"):
            ok = ok and close(result.marginals, marg, rtol=rtol, atol=rtol)
        return ok
    return check


def is_law(x, atol=1e-3) -> bool:
    x = np.asarray(x, np.float64)
    return bool(np.all(x >= -1e-7) and np.allclose(x.sum(-1), 1, atol=atol))


def returned(_result) -> bool:
    return True


def finite_leaves(result) -> tuple[bool, str]:
    """Every floating-point array leaf of ``result`` finite."""
    try:
        leaves = jax.tree_util.tree_leaves(result)
    except Exception:  # noqa: BLE001 - not a pytree: nothing to check
        return True, ""
    for leaf in leaves:
        if isinstance(leaf, (jax.Array, np.ndarray)) and jnp.issubdtype(leaf.dtype, jnp.inexact):
            if not bool(np.all(np.isfinite(np.asarray(leaf, np.float64)))):
                return False, f"non-finite values in a result array of shape {leaf.shape}"
    return True, ""


# ---------------------------------------------------------------------------------------------
# The battery.


def chain_from(init, trans):
    return specjax.MarkovChain(init, trans)


def unvalidated(init, trans):
    """A chain built without validation (the pytree protocol's ``tree_unflatten``)."""
    return specjax.MarkovChain.tree_unflatten(None, (jnp.asarray(init), jnp.asarray(trans)))


def bad_trans(kind: str):
    """``(init, trans)`` float32 arrays with one fault."""
    init, p, _ = np_pair()
    init, trans = init.astype(np.float32).copy(), p.astype(np.float32).copy()
    if kind == "nan":
        trans[1, 2, 0] = np.nan
    elif kind == "negative":
        trans[1, 2] = [0.7, -0.2, 0.3, 0.2]
    elif kind == "sum 1.1":
        trans[2, 3] *= 1.1
    elif kind == "sum 0.9":
        trans[0, 0] *= 0.9
    elif kind == "zero row":
        trans[2, 1] = 0.0
    elif kind == "inf":
        trans[0, 3, 1] = np.inf
    elif kind == "init nan":
        init[0] = np.nan
    elif kind == "init sum 2":
        init = init * 2
    return init, trans


def _dyadic_rows(dtype):
    """A chain whose rows are exact in float16/bfloat16 (dyadic values summing to one)."""
    base = np.array([0.5, 0.25, 0.125, 0.125])
    trans_p = np.stack([[np.roll(base, a + n) for a in range(V)] for n in range(T)])
    trans_q = np.stack([[np.roll(base[::-1], 2 * a + n) for a in range(V)] for n in range(T)])
    init = np.full(V, 0.25)
    mk = lambda tr: specjax.MarkovChain(jnp.asarray(init, dtype), jnp.asarray(tr, dtype))
    return (mk(trans_p), mk(trans_q)), (init, trans_p, trans_q)


@built_once
def half_pair(dtype_name: str):
    return _dyadic_rows(jnp.dtype(dtype_name))


def half_marginals(dtype_name):
    _, (init, _, q) = half_pair(dtype_name)
    return np_marginals(init, q)


def _rounded_rows(dtype):
    """Dirichlet rows rounded to ``dtype``: their sums are off by up to the dtype's rounding."""
    init, p, q = np_pair()
    return jnp.asarray(init, dtype), jnp.asarray(q, dtype)


# --------------------------------------------------------------------- a user's protocol model

@jax.tree_util.register_pytree_node_class
class TableModel:
    """A user's protocol model: state 0 before ``x_0``, state ``1 + x`` after token ``x``."""

    def __init__(self, table):
        self.table = table

    def tree_flatten(self):
        return (self.table,), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)

    @property
    def num_states(self):
        return self.table.shape[-1]

    def init_state(self):
        return jnp.zeros((), jnp.int32)

    def probs(self, state):
        return self.table[state]

    def update(self, state, token):
        return 1 + jnp.asarray(token, jnp.int32)


class PlainModel(TableModel):
    """The same model, not registered as a pytree."""


class FloatStatesModel(TableModel):
    @property
    def num_states(self):
        return float(self.table.shape[-1])


class WideRowModel(TableModel):
    def probs(self, state):
        return jnp.concatenate([self.table[state], jnp.zeros((1,), self.table.dtype)])


@functools.cache
def np_tables():
    """``(draft_table, target_table)`` ``(V + 1, V)``: row 0 the prompt law, row ``1 + a`` the
    law after token ``a`` (a stationary bigram)."""
    init, p, q = np_pair()
    return (np.concatenate([init[None], p[0]]), np.concatenate([init[None], q[0]]))


def table_model(which: str, fault: str = "", cls=TableModel):
    table = np_tables()[0 if which == "draft" else 1].astype(np.float32).copy()
    if fault == "later negative":
        table[2] = [0.8, -0.3, 0.3, 0.2]
    elif fault == "later sum 2":
        table[3] *= 2
    elif fault == "later nan":
        table[1, 1] = np.nan
    elif fault == "later zero":
        table[4] = 0
    return cls(jnp.asarray(table))


def table_model_marginals(horizon=T):
    _, tq = np_tables()
    return np_marginals(tq[0], np.broadcast_to(tq[1:], (horizon, V, V)))


# --------------------------------------------------------------------------------- user rules

def sd_accept(p, q):
    return jnp.minimum(1, q / jnp.where(p > 0, p, 1))


def sd_residual(p, q, b):
    return jnp.maximum(q - p, 0)


def accept_above_one(p, q):
    return 2 * jnp.ones_like(p)


def accept_negative(p, q):
    return -0.5 * jnp.ones_like(p)


def accept_nan(p, q):
    return jnp.full_like(p, jnp.nan)


def accept_scalar(p, q):
    return jnp.minimum(1, q[0] / p[0])


def accept_python(p, q):
    return jnp.full_like(p, float(q[0] > p[0]))  # a Python branch on a traced value


def half_accept(p, q):
    return 0.5 * jnp.ones_like(p)


def residual_zero(p, q, b):
    return jnp.zeros_like(q)


def residual_nan(p, q, b):
    return jnp.full_like(q, jnp.nan)


def residual_negative(p, q, b):
    return q - p


USER_RULES = {
    # name: (accept_prob, residual, expected error names, or None for a valid rule)
    "SD written by the user": (sd_accept, sd_residual, None),
    "accept_prob 2 (above one)": (accept_above_one, sd_residual, ("accept_prob",)),
    "accept_prob -0.5": (accept_negative, sd_residual, ("accept_prob",)),
    "accept_prob NaN": (accept_nan, sd_residual, ("accept_prob",)),
    "accept_prob a scalar": (accept_scalar, sd_residual, ("accept_prob",)),
    "accept_prob branches on a value": (accept_python, sd_residual, ("accept_prob",)),
    "all-zero residual where rejection is possible": (half_accept, residual_zero, ("residual",)),
    "NaN residual": (sd_accept, residual_nan, ("residual",)),
    "negative residual q - p": (half_accept, residual_negative, ("residual",)),
}


def user_rule_output():
    init, p, q = np_pair()
    return np_marginals(init, q)  # the valid rule is SD: unbiased


# --------------------------------------------------------------------------------- the CLI

@dataclasses.dataclass
class CliOutput:
    stdout: str
    stderr: str


def cli(*argv):
    """A case body that runs ``python -m specjax ARGV`` in-process: an argparse error (exit
    status 2) becomes a ``ValueError`` with its message, any escaping exception a
    ``CliTraceback`` (the user would see a traceback)."""
    def run():
        from specjax import cli as specjax_cli
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                specjax_cli.main([str(a) for a in argv])
            except SystemExit as exit_:
                if exit_.code not in (0, None):
                    raise ValueError(f"exit status {exit_.code}: "
                                     f"{err.getvalue().strip()[-500:]}") from None
            except Exception as error:
                raise CliTraceback(f"{type(error).__name__}: {error}") from error
        return CliOutput(out.getvalue(), err.getvalue())
    return run


def cli_simulated(result) -> bool:
    return "batch SD, M = 5" in result.stdout and "nan" not in result.stdout.lower()


# ---------------------------------------------------------------------------------------------

def _cases() -> list[Case]:
    cases: list[Case] = []

    def add(kind, entry, what, run, error=(), check=None, isolate=False):
        if isinstance(error, str):
            error = (error,)
        cases.append(Case(kind, entry, what, run, tuple(error), check, isolate))

    S = specjax
    d, t = draft, target  # lazily evaluated
    k = key

    # ----------------------------------------------------------------- probabilities
    kind = "probabilities"
    for fault in ("nan", "negative", "sum 1.1", "sum 0.9", "zero row", "inf", "init nan",
                  "init sum 2"):
        name = "init" if fault.startswith("init") else "trans"
        add(kind, "MarkovChain", f"{fault}",
            lambda fault=fault: chain_from(*bad_trans(fault)), name)
    init0, p0, _ = np_pair()
    add(kind, "MarkovChain", "init shape (V+1,)",
        lambda: chain_from(np.ones(V + 1) / (V + 1), p0), "init")
    add(kind, "MarkovChain", "trans (T, V, V+1)",
        lambda: chain_from(init0, np.ones((T, V, V + 1)) / (V + 1)), "trans")
    add(kind, "MarkovChain", "trans 2-D", lambda: chain_from(init0, p0[0]), "trans")
    add(kind, "MarkovChain", "T = 0", lambda: chain_from(init0, np.ones((0, V, V)) / V),
        ("trans", "horizon"))
    add(kind, "MarkovChain", "V = 0", lambda: chain_from(np.ones(0), np.ones((T, 0, 0))),
        ("init", "trans"))
    add(kind, "MarkovChain", "nested lists (valid)",
        lambda: chain_from(init0.tolist(), p0.tolist()),
        check=lambda c: c.trans.shape == (T, V, V) and is_law(c.trans))
    add(kind, "MarkovChain", "a string", lambda: chain_from("uniform", p0), "init")
    add(kind, "MarkovChain.from_logits", "NaN logits",
        lambda: S.MarkovChain.from_logits(np.zeros(V), np.where(np.eye(V) > 0, np.nan, 0.0)
                                          [None].repeat(T, 0)), "trans_logits")
    add(kind, "MarkovChain.from_logits", "+inf logit",
        lambda: S.MarkovChain.from_logits(np.zeros(V), np.full((T, V, V), 0.0)
                                          + np.where(np.arange(V) == 1, np.inf, 0.0)),
        "trans_logits")
    add(kind, "MarkovChain.from_logits", "an all -inf row",
        lambda: S.MarkovChain.from_logits(np.zeros(V), np.full((T, V, V), -np.inf)),
        "trans_logits")
    add(kind, "MarkovChain.from_logits", "init_logits shape (V+1,)",
        lambda: S.MarkovChain.from_logits(np.zeros(V + 1), np.zeros((T, V, V))), "init_logits")
    add(kind, "MarkovChain.from_logits", "logits 1e4 apart (valid, one-hot rows)",
        lambda: S.MarkovChain.from_logits(np.zeros(V), np.eye(V)[None].repeat(T, 0) * 1e4),
        check=lambda c: is_law(c.trans) and close(c.trans[0], np.eye(V)))

    # models passed to the entry points
    wrong_v = lambda: _uniform_pair(V + 1, T)[0]
    wrong_t = lambda: _uniform_pair(V, T + 1)[0]
    bad_draft = lambda: unvalidated(*bad_trans("negative"))
    entries = {
        "decode": lambda a, b: S.decode(k(), S.Speculative(), a, b, C),
        "decoding_statistics": lambda a, b: S.decoding_statistics(k(), S.Speculative(), a, b, C),
        "exact": lambda a, b: S.exact(S.Speculative(), a, b),
        "expected_rejections": lambda a, b: S.expected_rejections(a, b),
        "batch_expected_rejections": lambda a, b: S.batch_expected_rejections(
            a, b, num_drafts=3),
        "accepted_length": lambda a, b: S.accepted_length(S.Speculative(2), a, b),
        "output_chain": lambda a, b: S.output_chain(S.Speculative(), a, b),
        "sequence_kl": lambda a, b: S.theory.sequence_kl(a, b),
    }
    for entry, fn in entries.items():
        names = ("model_a", "model_b") if entry == "sequence_kl" else ("draft", "target")
        add(kind, entry, "draft V+1 tokens", lambda fn=fn: fn(wrong_v(), t()), names)
        add(kind, entry, "draft horizon T+1", lambda fn=fn: fn(wrong_t(), t()), names)
        if entry in ("decode", "exact", "sequence_kl", "accepted_length"):
            add(kind, entry, "draft a tuple (init, trans)",
                lambda fn=fn: fn((d().init, d().trans), t()), names[:1])
        if entry in ("decode", "exact", "expected_rejections", "decoding_statistics"):
            add(kind, entry, "unvalidated draft with a negative row (tree_unflatten)",
                lambda fn=fn: fn(bad_draft(), t()), names[:1])
    add(kind, "exact", "a stacked batch of two targets",
        lambda: S.exact(S.Speculative(), d(), jax.tree_util.tree_map(
            lambda x: jnp.stack([x, x]), t())), "target")

    # single-token functions
    p1 = lambda: rows()[0]
    q1 = lambda: rows()[1]
    b1 = lambda: jnp.minimum(1, q1() / p1())
    nan_row = lambda: p1().at[1].set(jnp.nan)
    neg_row = lambda: jnp.asarray([0.7, -0.2, 0.3, 0.2], jnp.float32)
    two_row = lambda: 2 * p1()
    short = lambda: jnp.full((V + 1,), 1 / (V + 1), jnp.float32)
    P, Q = (lambda: np.asarray(p1(), np.float64)), (lambda: np.asarray(q1(), np.float64))
    B = lambda: np.minimum(1, Q() / P())
    singles = {
        # name: (call(p, q), names for a bad p, reference(p, q) or None)
        "tv_distance": (lambda p, q: S.tv_distance(p, q), ("p",),
                        lambda: 0.5 * np.abs(P() - Q()).sum()),
        "speculative_residual": (lambda p, q: S.speculative_residual(p, q), ("p",),
                                 lambda: np_normalise(np.maximum(Q() - P(), 0))),
        "residual_distribution": (lambda p, q: S.residual_distribution(q, p), ("p",),
                                  lambda: np_normalise(np.maximum(Q() - P(), 0))),
        "acceptance_probability": (lambda p, q: S.acceptance_probability(p, q, epsilon=0.1),
                                   ("p",), lambda: np.minimum(1, (Q() + 0.1) / P())),
        "optimal_residual": (lambda p, q: S.optimal_residual(p, q, b1()), ("p",),
                             lambda: np_normalise(np.maximum(Q() - B() * P(), 0))),
        "rejection_probability": (lambda p, q: S.rejection_probability(p, b1()), ("p",),
                                  lambda: ((1 - B()) * P()).sum()),
        "tv_loss_star": (lambda p, q: S.tv_loss_star(p, q, b1()), ("p",), lambda: 0.0),
        "verification_law": (lambda p, q: S.verification_law(p, b1(), jnp.maximum(q - p, 0)),
                             ("p",), None),
        "batch_improvement": (lambda p, q: S.batch_improvement(p, q, num_drafts=2), ("p",),
                              None),
        "batch_residual_mass": (lambda p, q: S.decoders.batch_residual_mass(p, q, num_drafts=2),
                                ("p",), None),
        "pareto_front": (lambda p, q: S.theory.pareto_front(p, q, jnp.asarray([0.0, 0.1])), ("p",),
                         None),
        "optimal_acceptance": (lambda p, q: S.optimal_acceptance(p, q, num_drafts=2), ("p",),
                               lambda: 1 - max(P()[list(a)].sum() ** 2 - Q()[list(a)].sum()
                                               for r in range(V + 1)
                                               for a in itertools.combinations(range(V), r))),
    }
    for entry, (fn, names, ref) in singles.items():
        add(kind, entry, "p NaN", lambda fn=fn: fn(nan_row(), q1()), names)
        if entry in ("tv_distance", "speculative_residual", "acceptance_probability",
                     "verification_law", "batch_improvement", "optimal_acceptance"):
            add(kind, entry, "p negative", lambda fn=fn: fn(neg_row(), q1()), names)
            add(kind, entry, "p sums to 2", lambda fn=fn: fn(two_row(), q1()), names)
        if entry not in ("rejection_probability", "verification_law"):
            add(kind, entry, "p has V+1 tokens, q V", lambda fn=fn: fn(short(), q1()),
                ("p", "q"))
        check = returned if ref is None else (lambda r, ref=ref: close(r, ref()))
        add(kind, entry, "valid rows", lambda fn=fn: fn(p1(), q1()), check=check)
    for entry, fn in (("optimal_residual", lambda b: S.optimal_residual(p1(), q1(), b)),
                      ("rejection_probability", lambda b: S.rejection_probability(p1(), b)),
                      ("tv_loss_star", lambda b: S.tv_loss_star(p1(), q1(), b)),
                      ("verification_law", lambda b: S.verification_law(p1(), b, q1()))):
        add(kind, entry, "accept_prob 1.5", lambda fn=fn: fn(jnp.full((V,), 1.5)),
            "accept_prob")
        if entry == "verification_law":
            add(kind, entry, "accept_prob NaN", lambda fn=fn: fn(jnp.full((V,), jnp.nan)),
                "accept_prob")
    add(kind, "verification_law", "residual negative",
        lambda: S.verification_law(p1(), b1() * 0.5, q1() - p1()), "residual")

    # ----------------------------------------------------------------- dtypes
    kind = "dtypes"
    for dt in ("float16", "bfloat16"):
        hp = lambda dt=dt: half_pair(dt)[0]
        hm = lambda dt=dt: half_marginals(dt)
        add(kind, "decode", f"{dt} exact rows, Speculative",
            lambda hp=hp: S.decode(k(), S.Speculative(), *hp(), C),
            check=lambda r, hm=hm: hist_close(r.tokens, hm()))
        if dt == "float16":
          add(kind, "batch_speculative_decoding", f"{dt} exact rows",
              lambda hp=hp: S.batch_speculative_decoding(k(), *hp(), C, num_drafts=2),
              check=lambda r, hm=hm: hist_close(r.tokens, hm()))
          add(kind, "autoregressive_decoding", f"{dt} exact rows",
              lambda hp=hp: S.autoregressive_decoding(k(), hp()[1], C),
              check=lambda r, hm=hm: hist_close(r.tokens, hm()))
          add(kind, "decoding_statistics", f"{dt} exact rows",
              lambda hp=hp: S.decoding_statistics(k(), S.Speculative(), *hp(), C),
              check=lambda r, hm=hm: hist_close(
                  np.repeat(np.arange(V), np.asarray(r.final_token_counts))[:, None],
                  hm()[-1:]))
        add(kind, "exact", f"{dt} exact rows",
            lambda hp=hp: S.exact(S.Speculative(), *hp()),
            check=lambda r, dt=dt: close(r.expected_rejections, _half_sd(dt), rtol=2e-2,
                                         atol=2e-2))
        add(kind, "MarkovChain", f"{dt} Dirichlet rows rounded to {dt}",
            lambda dt=dt: chain_from(*_rounded_rows(jnp.dtype(dt))),
            check=lambda c, dt=dt: c.trans.dtype == jnp.dtype(dt))
        add(kind, "random_markov_chain", f"then cast to {dt}",
            lambda dt=dt: chain_from(*(x.astype(dt) for x in (
                lambda c: (c.init, c.trans))(S.random_markov_chain(k(), V, T)))),
            check=lambda c, dt=dt: c.trans.dtype == jnp.dtype(dt))
        add(kind, "tv_distance", f"{dt} rows",
            lambda dt=dt: S.tv_distance(p1().astype(dt), q1().astype(dt)),
            check=lambda r: close(r, 0.5 * np.abs(P() - Q()).sum(), rtol=2e-2, atol=1e-2))
        add(kind, "speculative_residual", f"{dt} rows",
            lambda dt=dt: S.speculative_residual(p1().astype(dt), q1().astype(dt)),
            check=lambda r: is_law(r, atol=2e-2))
    add(kind, "decode", "float16 draft, float32 target",
        lambda: S.decode(k(), S.Speculative(), half_pair("float16")[0][0],
                         _as32(half_pair("float16")[0][1]), C),
        check=lambda r: hist_close(r.tokens, half_marginals("float16")))
    add(kind, "exact", "float16 draft, float32 target",
        lambda: S.exact(S.Speculative(), half_pair("float16")[0][0],
                        _as32(half_pair("float16")[0][1])),
        check=lambda r: close(r.expected_rejections, _half_sd("float16"), rtol=1e-3,
                              atol=1e-3))
    add(kind, "decode", "integer one-hot rows",
        lambda: S.decode(k(), S.Speculative(), *_int_pair(), C),
        check=lambda r: hist_close(r.tokens, _int_marginals()))
    add(kind, "decode", "float64 NumPy rows with x64 off",
        lambda: S.decode(k(), S.Speculative(), *(chain_from(init0, x) for x in np_pair()[1:]),
                         C), check=trace_right())
    add(kind, "MarkovChain", "complex rows", lambda: chain_from(init0.astype(complex),
                                                               p0.astype(complex)),
        ("init", "trans"))
    add(kind, "MarkovChain", "string rows", lambda: chain_from(init0.astype(str), p0),
        ("init",))
    add(kind, "audit_exact", "float16 rows, SD rule",
        lambda: S.audit_exact(specjax.auditing.rules.speculative_rule_u,
                              p1().astype("float16"), q1().astype("float16"), grid=1024),
        check=lambda r: not r.any_biased)
    add(kind, "decode", "float16 Dirichlet rows renormalised in float16",
        lambda: S.decode(k(), S.Speculative(), *_f16_dirichlet(), C),
        check=lambda r: hist_close(r.tokens, _f16_dirichlet_marginals()))

    # ----------------------------------------------------------------- keys
    kind = "keys"
    bad_keys = {
        "None": lambda: None,
        "a string": lambda: "seed",
        "the int 0": lambda: 0,
        "a split key array (2,)": lambda: jax.random.split(k()),
        "uint32 of shape (3,)": lambda: jnp.zeros((3,), jnp.uint32),
        "float [0., 1.]": lambda: jnp.array([0.0, 1.0]),
    }
    every_key = ("decode", "random_markov_chain")  # every bad key; the others get three
    key_entries = {
        "decode": (lambda kk: S.decode(kk, S.Speculative(), d(), t(), C), trace_right()),
        "decoding_statistics": (lambda kk: S.decoding_statistics(kk, S.Speculative(), d(), t(),
                                                                 C), stats_right),
        "autoregressive_decoding": (lambda kk: S.autoregressive_decoding(kk, t(), C),
                                    trace_right()),
        "speculative_decoding": (lambda kk: S.speculative_decoding(kk, d(), t(), C),
                                 trace_right()),
        "batch_speculative_decoding": (lambda kk: S.batch_speculative_decoding(
            kk, d(), t(), C, num_drafts=2), trace_right()),
        "biased_speculative_decoding": (lambda kk: S.biased_speculative_decoding(
            kk, d(), t(), C, epsilon=0.0), trace_right()),
        "rejection_decoding": (lambda kk: S.rejection_decoding(
            kk, d(), t(), C, accept_prob=sd_accept, residual=sd_residual), trace_right()),
        "compat.block_verification_decoding": (
            lambda kk: S.compat.block_verification_decoding(kk, d(), t(), C, lookahead=2),
            trace_right()),
        "random_markov_chain": (lambda kk: S.random_markov_chain(kk, V, T),
                                lambda c: is_law(c.trans)),
        "audit": (lambda kk: S.audit(kk, specjax.auditing.rules.speculative_rule, p1(), q1(),
                                     num_samples=20_000), lambda r: not r.any_biased),
        "FullDraft.init": (lambda kk: S.tuning.FullDraft(V, T).init(kk), returned),
    }
    for entry, (fn, check) in key_entries.items():
        for what, make in list(bad_keys.items())[:None if entry in every_key else 3]:
            add(kind, entry, f"key {what}", lambda fn=fn, make=make: fn(make()), "key")
        if entry in every_key:
            add(kind, entry, "raw key jax.random.PRNGKey(0) (valid)",
                lambda fn=fn: fn(jax.random.PRNGKey(0)), check=check)

    # ----------------------------------------------------------------- static settings
    kind = "static settings"
    for value in (0, 2.5, True, "array"):
        v = jnp.asarray(2) if value == "array" else value
        what = "jnp.asarray(2)" if value == "array" else repr(value)
        add(kind, "Speculative", f"lookahead {what}", lambda v=v: S.Speculative(lookahead=v),
            "lookahead")
    for value in (0, 2.5, True, "array", "nan"):
        v = {"array": jnp.asarray(4), "nan": math.nan}.get(value, value)
        what = {"array": "jnp.asarray(4)", "nan": "NaN"}.get(value, repr(value))
        add(kind, "BatchSpeculative", f"num_drafts {what}", lambda v=v: S.BatchSpeculative(v),
            "num_drafts")
    add(kind, "BatchSpeculative", "replacement 'no'",
        lambda: S.BatchSpeculative(2, replacement="no"), "replacement")
    for value in (2.5, True, "array"):  # 0: with the frontier names below
        v = jnp.asarray(2) if value == "array" else value
        what = "jnp.asarray(2)" if value == "array" else repr(value)
        add(kind, "OptimalMultiDraft", f"num_drafts {what}", lambda v=v: S.OptimalMultiDraft(v),
            "num_drafts")
    add(kind, "OptimalMultiDraft", "replacement 'no'",
        lambda: S.OptimalMultiDraft(2, replacement="no"), "replacement")
    add(kind, "OptimalMultiDraft", "sequence_optimal 'yes'",
        lambda: S.OptimalMultiDraft(2, sequence_optimal="yes"), "sequence_optimal")
    add(kind, "OptimalMultiDraft", "lookahead 0",
        lambda: S.OptimalMultiDraft(2, lookahead=0), "lookahead")
    add(kind, "BiasedSpeculative", "residual 'foo'",
        lambda: S.BiasedSpeculative(0.1, residual="foo"), "residual")
    add(kind, "BiasedSpeculative", "lookahead 0", lambda: S.BiasedSpeculative(0.1, lookahead=0),
        "lookahead")
    for value in (0, 1.5, "array"):
        v = jnp.asarray(2) if value == "array" else value
        add(kind, "BlockVerification", f"lookahead {value!r}",
            lambda v=v: S.BlockVerification(v), "lookahead")
    add(kind, "RejectionRule", "lookahead 0",
        lambda: S.RejectionRule(sd_accept, sd_residual, lookahead=0), "lookahead")
    for value in (0, 2.5, None, "array", "100"):
        v = jnp.asarray(100) if value == "array" else value
        what = "jnp.asarray(100)" if value == "array" else repr(value)
        add(kind, "decode", f"num_chains {what}",
            lambda v=v: S.decode(k(), S.Speculative(), d(), t(), v), "num_chains")
    add(kind, "decoding_statistics", "num_chains None",
        lambda: S.decoding_statistics(k(), S.Speculative(), d(), t()), "num_chains")
    add(kind, "decoding_statistics", "num_chains 0",
        lambda: S.decoding_statistics(k(), S.Speculative(), d(), t(), 0), "num_chains")
    for value in (0, 2.5):
        add(kind, "decoding_statistics", f"chunk_size {value!r}",
            lambda v=value: S.decoding_statistics(k(), S.Speculative(), d(), t(), C,
                                                  chunk_size=v), "chunk_size")
    add(kind, "decoding_statistics", "chunk_size 1000 of 4000 chains (valid)",
        lambda: S.decoding_statistics(k(), S.Speculative(), d(), t(), C, chunk_size=1000),
        check=stats_right)
    add(kind, "decode", "sharding 'chains'",
        lambda: S.decode(k(), S.Speculative(), d(), t(), C, sharding="chains"), "sharding")
    add(kind, "decode", "horizon T+1 for MarkovChains",
        lambda: S.decode(k(), S.Speculative(), d(), t(), C, horizon=T + 1), "horizon")
    add(kind, "decode", "decoder the class Speculative",
        lambda: S.decode(k(), S.Speculative, d(), t(), C), "decoder")
    add(kind, "exact", "decoder a string",
        lambda: S.exact("speculative", d(), t()), "decoder")
    add(kind, "speculative_decoding", "lookahead 0",
        lambda: S.speculative_decoding(k(), d(), t(), C, lookahead=0), "lookahead")
    for value in (0, 2.5, "array"):
        v = jnp.asarray(2) if value == "array" else value
        add(kind, "expected_rejections", f"lookahead {value!r}",
            lambda v=v: S.expected_rejections(d(), t(), lookahead=v), "lookahead")
    add(kind, "expected_rejections", "lookahead 10 > T (acts as T)",
        lambda: S.expected_rejections(d(), t(), lookahead=10), check=exact_right("sd"))
    for value in (0, "array"):
        v = jnp.asarray(3) if value == "array" else value
        add(kind, "batch_expected_rejections", f"num_drafts {value!r}",
            lambda v=v: S.batch_expected_rejections(d(), t(), num_drafts=v), "num_drafts")
    add(kind, "batch_expected_rejections", "num_drafts math.inf (valid)",
        lambda: S.batch_expected_rejections(d(), t(), num_drafts=math.inf),
        check=exact_right("batch_inf"))
    add(kind, "compat.exact_speculative_decoding", "lookahead 0",
        lambda: S.compat.exact_speculative_decoding(d(), t(), lookahead=0), "lookahead")
    add(kind, "compat.exact_speculative_decoding", "lookahead 2 (valid)",
        lambda: S.compat.exact_speculative_decoding(d(), t(), lookahead=2),
        check=exact_right("sd_k2"))
    add(kind, "compat.exact_batch_speculative_decoding", "num_drafts 0",
        lambda: S.compat.exact_batch_speculative_decoding(d(), t(), num_drafts=0),
        "num_drafts")
    add(kind, "expected_calls", "lookahead 0",
        lambda: S.expected_calls(d(), t(), lookahead=0), "lookahead")
    add(kind, "expected_calls", "K = T (valid)", lambda: S.expected_calls(d(), t()),
        check=lambda r: close(r, reference64("calls")))
    add(kind, "batch_improvement", "num_drafts 0",
        lambda: S.batch_improvement(p1(), q1(), num_drafts=0), "num_drafts")
    add(kind, "optimal_acceptance", "replacement 1",
        lambda: S.optimal_acceptance(p1(), q1(), num_drafts=2, replacement=1), "replacement")
    for value in (0, T + 1, 1.5):
        add(kind, "accepted_length", f"position {value!r}",
            lambda v=value: S.accepted_length(S.Speculative(2), d(), t(), position=v),
            "position")
    add(kind, "compat.exact_block_accepted_length", "prev_token V",
        lambda: S.compat.exact_block_accepted_length(d(), t(), lookahead=2, prev_token=V),
        "prev_token")
    add(kind, "exact_tokenwise_accepted_length", "position 0",
        lambda: S.theory.exact_tokenwise_accepted_length(d(), t(), lookahead=2, position=0),
        "position")
    add(kind, "exact_joint_accepted_length", "lookahead 0",
        lambda: S.theory.exact_joint_accepted_length(d(), t(), lookahead=0), "lookahead")
    add(kind, "compat.exact_block_expected_calls", "lookahead 2 (valid)",
        lambda: S.compat.exact_block_expected_calls(d(), t(), lookahead=2),
        check=lambda r: close(r, reference64("block2_calls")))
    add(kind, "random_markov_chain", "num_states 0",
        lambda: S.random_markov_chain(k(), 0, T), "num_states")
    add(kind, "random_markov_chain", "num_states 2.5",
        lambda: S.random_markov_chain(k(), 2.5, T), "num_states")
    add(kind, "random_markov_chain", "horizon 0",
        lambda: S.random_markov_chain(k(), V, 0), "horizon")
    add(kind, "paper_instance", "num_states 0", lambda: S.paper_instance(num_states=0),
        "num_states")
    add(kind, "paper_instance", "seed 'ten'", lambda: S.paper_instance(seed="ten"), "seed")
    add(kind, "draft_family", "name 'foo'", lambda: S.tuning.draft_family("foo", V, T),
        ("name", "family"))
    add(kind, "LowRankDraft", "rank 0", lambda: S.tuning.LowRankDraft(V, T, rank=0), "rank")
    add(kind, "LowRankDraft", "rank V+1", lambda: S.tuning.LowRankDraft(V, T, rank=V + 1), "rank")
    add(kind, "FullDraft", "num_states 0", lambda: S.tuning.FullDraft(0, T), "num_states")
    add(kind, "StationaryDraft", "horizon -1", lambda: S.tuning.StationaryDraft(V, -1), "horizon")
    add(kind, "ContextFreeDraft", "num_states '4'", lambda: S.tuning.ContextFreeDraft("4", T),
        "num_states")
    add(kind, "objective", "quantity 'foo'", lambda: S.objective(S.Speculative(), "foo"),
        "quantity")
    add(kind, "make_objective", "name 'foo'", lambda: S.tuning.make_objective("foo"),
        ("name", "objective"))
    add(kind, "compat.sd_rejections", "lookahead 0",
        lambda: S.compat.sd_rejections(lookahead=0),
        "lookahead")
    add(kind, "compat.batch_rejections", "num_drafts 0",
        lambda: S.compat.batch_rejections(0), "num_drafts")
    add(kind, "compat.target_calls", "lookahead -1",
        lambda: S.compat.target_calls(lookahead=-1),
        "lookahead")
    fam = lambda: S.tuning.FullDraft(V, T)
    sd = lambda: S.objective(S.Speculative())  # SD's expected rejections
    add(kind, "tune_draft", "num_steps 0",
        lambda: S.tune_draft(fam(), fam().uniform(), t(), sd(), num_steps=0),
        "num_steps")
    add(kind, "tune_draft", "log_every 0",
        lambda: S.tune_draft(fam(), fam().uniform(), t(), sd(), num_steps=2,
                             log_every=0), "log_every")
    add(kind, "tune_draft", "optimizer 'adam'",
        lambda: S.tune_draft(fam(), fam().uniform(), t(), sd(), num_steps=2,
                             optimizer="adam"), "optimizer")
    add(kind, "tune_draft", "objective 'sd'",
        lambda: S.tune_draft(fam(), fam().uniform(), t(), "sd", num_steps=2), "objective")
    add(kind, "tune_draft", "5 steps of SD rejections (valid)",
        lambda: S.tune_draft(fam(), fam().uniform(), t(), sd(), num_steps=5),
        check=lambda r: float(r.value) <= float(S.expected_rejections(
            fam().chain(fam().uniform()), t())) + 1e-6)
    add(kind, "kl_fit", "num_steps 0", lambda: S.tuning.kl_fit(fam(), t(), num_steps=0),
        "num_steps")
    add(kind, "kl_fit", "family a string", lambda: S.tuning.kl_fit("full", t()), "family")
    add(kind, "audit", "num_samples 0",
        lambda: S.audit(k(), specjax.auditing.rules.speculative_rule, p1(), q1(),
                        num_samples=0), "num_samples")
    add(kind, "audit", "drafting 'foo'",
        lambda: S.audit(k(), specjax.auditing.rules.speculative_rule, p1(), q1(),
                        drafting="foo"), "drafting")
    add(kind, "audit_exact", "grid 1",
        lambda: S.audit_exact(specjax.auditing.rules.speculative_rule_u, p1(), q1(), grid=1),
        "grid")
    add(kind, "audit_exact", "drafting a function",
        lambda: S.audit_exact(specjax.auditing.rules.speculative_rule_u, p1(), q1(),
                              drafting=lambda kk, p: jnp.argmax(p)), "drafting")
    x1, q2 = (lambda: np.array([1])), (lambda: jnp.stack([q1(), q1()]))
    add(kind, "verify_drafts", "num_drafts 2 with K = 1",
        lambda: S.verify_drafts(k(), S.Speculative(), x1(), p1()[None], q2(),
                                num_drafts=np.int32(2)), "num_drafts")
    add(kind, "verify_drafts", "uniforms of the wrong shape",
        lambda: S.verify_drafts(None, S.Speculative(), x1(), p1()[None], q2(),
                                uniforms=(np.zeros(2), np.zeros(2))), "uniforms")
    add(kind, "verify_drafts_law", "target_probs with K rows",
        lambda: S.verify_drafts_law(S.Speculative(), x1(), p1()[None], q1()[None]),
        "target_probs")
    add(kind, "verify_drafts_law", "stop_tokens out of range",
        lambda: S.verify_drafts_law(S.Speculative(), x1(), p1()[None], q2(), stop_tokens=[V]),
        "stop_tokens")
    tree_rows = lambda: np.full((3, V), 1.0 / V)  # noqa: E731
    add(kind, "verify_tree", "num_nodes 0",
        lambda: S.verify_tree(k(), S.TokenTree((2,)), np.array([[0, 1, 2]]), tree_rows()[None],
                              tree_rows()[None], num_nodes=np.array([0])), "num_nodes")
    add(kind, "verify_tree", "a decoder without a tree",
        lambda: S.verify_tree(k(), S.Speculative(), np.array([0, 1, 2]), tree_rows(),
                              tree_rows()), "decoder")
    add(kind, "verify_tree_law", "draft_probs missing for i.i.d. children",
        lambda: S.verify_tree_law(S.TokenTree((2,)), np.array([0, 1, 2]), None, tree_rows()),
        "draft_probs")
    add(kind, "compare_outputs", "alpha 1.5",
        lambda: S.compare_outputs(S.Speculative(), x1(), p1()[None], q2(),
                                  np.array([[1, 0]]), alpha=1.5), "alpha")
    add(kind, "compare_outputs", "tokens of the wrong shape",
        lambda: S.compare_outputs(S.Speculative(), x1(), p1()[None], q2(), np.array([1])),
        "tokens")
    add(kind, "process_logits", "top_p 0", lambda: S.process_logits(jnp.zeros(V), top_p=0.0),
        "top_p")
    add(kind, "process_chain", "chain a string", lambda: S.models.process_chain("bigram"), "chain")
    add(kind, "process_model", "model a string", lambda: S.models.process_model("bigram"), "model")
    add(kind, "with_prompt", "model a string", lambda: S.models.with_prompt("bigram", [1]), "model")
    add(kind, "with_prompt", "prompt id V", lambda: S.models.with_prompt(t(), [0, V]), "prompt")
    add(kind, "with_prompt", "empty prompt", lambda: S.models.with_prompt(t(), []), "prompt")
    for name, make, arg in (("TypicalAcceptance", lambda: S.TypicalAcceptance(1.5), "threshold"),
                            ("LenientSpeculative", lambda: S.LenientSpeculative(0.0),
                             "lenience"),
                            ("TopKAcceptance", lambda: S.TopKAcceptance(-1), "k"),
                            ("ThresholdVerification", lambda: S.ThresholdVerification(0.0),
                             "threshold_single")):
        add(kind, name, f"{arg} out of range", lambda make=make: S.exact(make(), d(), t()), arg)
    add(kind, "chain_sharding", "devices []", lambda: S.chain_sharding(devices=[]), "devices")
    add(kind, "greedy_draft", "model a string", lambda: S.models.greedy_draft("bigram"), "model")
    add(kind, "GreedyModel", "model a MarkovChain... as a string",
        lambda: S.models.GreedyModel("x"), "model")
    add(kind, "NGramModel", "order 0",
        lambda: S.NGramModel(jnp.full((1, V), 1 / V), 0), "order")
    add(kind, "NGramModel.fit", "order 0",
        lambda: S.NGramModel.fit([np.arange(V)], order=0, num_states=V), "order")
    add(kind, "FiniteStateModel", "start -1",
        lambda: S.FiniteStateModel(-1, np.zeros((2, V), np.int32), np.full((2, V), 1 / V)),
        "start")

    # ----------------------------------------------------------------- numeric settings
    kind = "numeric settings"
    for what, eps in (("NaN", math.nan), ("-0.1", -0.1), ("inf", math.inf),
                      ("shape (2,)", "vector"), ("'0.1'", "0.1")):
        e = (lambda: jnp.asarray([0.1, 0.2])) if eps == "vector" else (lambda eps=eps: eps)
        add(kind, "exact", f"BiasedSpeculative epsilon {what}",
            lambda e=e: S.exact(S.BiasedSpeculative(e()), d(), t()), "epsilon",
            # epsilon = inf accepts every draft: refused, or no rejection and the draft's law
            check=(lambda r: close(r.expected_rejections, 0.0) and close(
                r.marginals, np_marginals(np_pair()[0], np_pair()[1]), atol=1e-4))
            if eps == math.inf else None)
    add(kind, "biased_speculative_decoding", "epsilon NaN",
        lambda: S.biased_speculative_decoding(k(), d(), t(), C, epsilon=math.nan), "epsilon")
    add(kind, "biased_speculative_decoding", "epsilon 0.1 (valid)",
        lambda: S.biased_speculative_decoding(k(), d(), t(), C, epsilon=0.1),
        check=lambda r: hist_close(r.tokens, np_marginals(
            np_pair()[0], np_biased_output(np_pair()[1], np_pair()[2], 0.1))))
    add(kind, "compat.exact_biased_speculative_decoding", "epsilon -1",
        lambda: S.compat.exact_biased_speculative_decoding(d(), t(), epsilon=-1.0), "epsilon")
    add(kind, "compat.exact_biased_speculative_decoding", "epsilon 0.1 (valid)",
        lambda: S.compat.exact_biased_speculative_decoding(d(), t(), epsilon=0.1),
        check=exact_right("biased", marg=np_marginals(
            np_pair()[0], np_biased_output(np_pair()[1], np_pair()[2], 0.1))))
    add(kind, "biased_output_chain", "epsilon NaN",
        lambda: S.theory.biased_output_chain(d(), t(), epsilon=math.nan), "epsilon")
    add(kind, "acceptance_probability", "epsilon NaN",
        lambda: S.acceptance_probability(p1(), q1(), epsilon=math.nan), "epsilon")
    add(kind, "acceptance_probability", "epsilon -0.5",
        lambda: S.acceptance_probability(p1(), q1(), epsilon=-0.5), "epsilon")
    for what, value in (("0", 0.0), ("-1", -1.0), ("NaN", math.nan), ("inf", math.inf)):
        add(kind, "random_markov_chain", f"concentration {what}",
            lambda v=value: S.random_markov_chain(k(), V, T, concentration=v), "concentration")
    add(kind, "random_markov_chain", "concentration 1e-3 (valid, peaked rows)",
        lambda: S.random_markov_chain(k(), V, T, concentration=1e-3),
        check=lambda c: is_law(c.trans))
    for what, eps in (("[NaN]", [math.nan]), ("[-0.1]", [-0.1]), ("2-D", [[0.1]])):
        add(kind, "pareto_front", f"epsilons {what}",
            lambda e=eps: S.theory.pareto_front(p1(), q1(), jnp.asarray(e)), "epsilons")
    for what, w in (("NaN", math.nan), ("-1", -1.0)):
        add(kind, "objective", f"weight {what}",
            lambda w=w: S.objective(S.BiasedSpeculative(0.1), "tradeoff", weight=w), "weight")
    add(kind, "biased_tradeoff", "epsilon NaN", lambda: S.tuning.biased_tradeoff(math.nan),
        "epsilon")
    add(kind, "make_objective", "biased, epsilon NaN",
        lambda: S.tuning.make_objective("biased", epsilon=math.nan), "epsilon")
    add(kind, "kl_divergence", "valid (a uniform draft)",
        lambda: S.tuning.kl_divergence()(fam().chain(fam().uniform()), t()),
        check=lambda r: float(r) >= 0)
    for what, a in (("0", 0.0), ("1.5", 1.5), ("NaN", math.nan)):
        add(kind, "audit", f"alpha {what}",
            lambda a=a: S.audit(k(), specjax.auditing.rules.speculative_rule, p1(), q1(),
                                num_samples=1000, alpha=a), "alpha")
    for what, tol in (("-1", -1.0), ("NaN", math.nan)):
        add(kind, "audit_exact", f"tol {what}",
            lambda tol=tol: S.audit_exact(specjax.auditing.rules.speculative_rule_u, p1(),
                                          q1(), grid=64, tol=tol), "tol")
    for what, s in (("-1", -1.0), ("NaN", math.nan)):
        add(kind, "NGramModel.fit", f"smoothing {what}",
            lambda s=s: S.NGramModel.fit([np.arange(V)], order=2, num_states=V, smoothing=s),
            "smoothing")
    add(kind, "NGramModel.fit", "backoff 0",
        lambda: S.NGramModel.fit([np.arange(V)], order=2, num_states=V, backoff=0.0),
        "backoff")
    add(kind, "FullDraft.init", "scale NaN", lambda: S.tuning.FullDraft(V, T).init(k(), math.nan),
        "scale")
    add(kind, "tune_draft", "params with a NaN",
        lambda: S.tune_draft(fam(), jax.tree_util.tree_map(
            lambda x: x.at[(0,) * x.ndim].set(jnp.nan), fam().uniform()), t(),
            sd(), num_steps=2), "params")
    add(kind, "tune_draft", "an objective that is NaN at the start",
        lambda: S.tune_draft(fam(), fam().uniform(), t(), _nan_objective, num_steps=2),
        "objective")

    # ----------------------------------------------------------------- user rules
    kind = "user rules"
    rule_entries = {
        "rejection_decoding": lambda a, r: S.rejection_decoding(
            k(), d(), t(), C, accept_prob=a, residual=r),
        "compat.exact_rejection_decoding": lambda a, r: S.compat.exact_rejection_decoding(
            d(), t(), accept_prob=a, residual=r),
        "decode": lambda a, r: S.decode(k(), S.RejectionRule(a, r), d(), t(), C),
        "exact": lambda a, r: S.exact(S.RejectionRule(a, r), d(), t()),
        "output_chain": lambda a, r: S.output_chain(S.RejectionRule(a, r), d(), t()),
    }
    valid_checks = {
        "rejection_decoding": trace_right(),
        "decode": trace_right(),
        "compat.exact_rejection_decoding": exact_right("sd", marg=target_marginals(), rtol=1e-4),
        "exact": exact_right("sd", marg=target_marginals(), rtol=1e-4),
        "output_chain": lambda c: close(c.trans, np_pair()[2], atol=1e-5),
    }
    for rule, (a, r, names) in USER_RULES.items():
        for entry, fn in rule_entries.items():
            if names is None:
                add(kind, entry, rule, lambda fn=fn, a=a, r=r: fn(a, r),
                    check=valid_checks[entry])
            elif entry in ("rejection_decoding", "exact", "output_chain"):
                add(kind, entry, rule, lambda fn=fn, a=a, r=r: fn(a, r), names)
    add(kind, "RejectionRule", "accept_prob not callable",
        lambda: S.RejectionRule(0.5, sd_residual), "accept_prob")
    add(kind, "RejectionRule", "residual None", lambda: S.RejectionRule(sd_accept, None),
        "residual")
    add(kind, "decoding_statistics", "accept_prob 2 (above one)",
        lambda: S.decoding_statistics(k(), S.RejectionRule(accept_above_one, sd_residual), d(),
                                      t(), C), "accept_prob")
    add(kind, "accepted_length", "NaN residual",
        lambda: S.accepted_length(S.RejectionRule(sd_accept, residual_nan, lookahead=2), d(),
                                  t()), "residual")
    rules = specjax.auditing.rules
    add(kind, "audit", "verify not callable",
        lambda: S.audit(k(), "sd", p1(), q1(), num_samples=1000), "verify")
    add(kind, "audit", "verify returns three values",
        lambda: S.audit(k(), lambda kk, p, q, x: (True, x, 0), p1(), q1(), num_samples=1000),
        "verify")
    add(kind, "audit", "verify raises inside",
        lambda: S.audit(k(), _verify_raises, p1(), q1(), num_samples=1000), "verify")
    add(kind, "audit", "accept_all is flagged (valid)",
        lambda: S.audit(k(), rules.accept_all, p1(), q1(), num_samples=20_000),
        check=lambda r: r.any_biased)
    add(kind, "audit_exact", "verify_u returns one value",
        lambda: S.audit_exact(lambda u, p, q, x: x, p1(), q1(), grid=64), "verify_u")
    add(kind, "audit_exact", "SD rule is unbiased (valid)",
        lambda: S.audit_exact(rules.speculative_rule_u, p1(), q1(), grid=1024),
        check=lambda r: not r.any_biased)
    add(kind, "audit_exact", "accepts_at_zero_uniform_u is flagged (valid)",
        lambda: S.audit_exact(rules.accepts_at_zero_uniform_u, jnp.asarray([0.5, 0.5, 0, 0]),
                              jnp.asarray([0.0, 0.0, 0.5, 0.5]), grid=1024),
        check=lambda r: r.any_biased)

    # ----------------------------------------------------------------- protocol models
    kind = "protocol models"
    tm = table_model
    proto_entries = {
        "decode": lambda a, b: S.decode(k(), S.Speculative(), a, b, C, horizon=T),
        "decode (Autoregressive)": lambda a, b: S.decode(k(), S.Autoregressive(), None, b, C,
                                                         horizon=T),
        "decoding_statistics": lambda a, b: S.decoding_statistics(
            k(), S.Speculative(), a, b, C, horizon=T),
        "speculative_decoding": lambda a, b: S.speculative_decoding(k(), a, b, C, horizon=T),
        "batch_speculative_decoding": lambda a, b: S.batch_speculative_decoding(
            k(), a, b, C, num_drafts=2, horizon=T),
    }
    proto_checks = {
        "decoding_statistics": lambda r: hist_close(
            np.repeat(np.arange(V), np.asarray(r.final_token_counts))[:, None],
            table_model_marginals()[-1:]),
    }
    for entry, fn in proto_entries.items():
        check = proto_checks.get(entry, lambda r: hist_close(r.tokens, table_model_marginals()))
        if entry in ("decode", "decode (Autoregressive)", "decoding_statistics"):
            add(kind, entry, "valid user model", lambda fn=fn: fn(tm("draft"), tm("target")),
                check=check)
        faults = ("later negative", "later sum 2", "later nan", "later zero")
        for fault in faults if entry in ("decode", "speculative_decoding") else faults[::2]:
            add(kind, entry, f"target row {fault}",
                lambda fn=fn, fault=fault: fn(tm("draft"), tm("target", fault)), "target")
        if entry != "decode (Autoregressive)":
            add(kind, entry, "draft row later negative",
                lambda fn=fn: fn(tm("draft", "later negative"), tm("target")), "draft")
    add(kind, "decode", "target not a pytree",
        lambda: S.decode(k(), S.Speculative(), tm("draft"), tm("target", cls=PlainModel), C,
                         horizon=T), "target")
    add(kind, "decode", "target num_states a float",
        lambda: S.decode(k(), S.Speculative(), tm("draft"), tm("target", cls=FloatStatesModel),
                         C, horizon=T), ("target", "num_states"))
    add(kind, "decode", "target probs of shape (V+1,)",
        lambda: S.decode(k(), S.Speculative(), tm("draft"), tm("target", cls=WideRowModel), C,
                         horizon=T), "target")
    add(kind, "decode", "horizon missing",
        lambda: S.decode(k(), S.Speculative(), tm("draft"), tm("target"), C), "horizon")
    add(kind, "decode", "horizon 0",
        lambda: S.decode(k(), S.Speculative(), tm("draft"), tm("target"), C, horizon=0),
        "horizon")
    add(kind, "decode", "draft a protocol model, target a MarkovChain",
        lambda: S.decode(k(), S.Speculative(), tm("draft"), t(), C), ("draft", "target"))
    add(kind, "decode", "BlockVerification on protocol models",
        lambda: S.decode(k(), S.BlockVerification(2), tm("draft"), tm("target"), C, horizon=T),
        ("decoder", "draft", "target"))
    add(kind, "exact", "a user protocol model (not finite-state)",
        lambda: S.exact(S.Speculative(), tm("draft"), tm("target"), horizon=T),
        ("draft", "target"))
    fsm = lambda c: S.FiniteStateModel.from_markov_chain(c)
    add(kind, "exact", "FiniteStateModels lifted from the chains (valid)",
        lambda: S.exact(S.Speculative(), fsm(d()), fsm(t()), horizon=T),
        check=exact_right("sd"))
    add(kind, "exact", "FiniteStateModels on different state spaces",
        lambda: S.exact(S.Speculative(), fsm(d()), S.FiniteStateModel.from_markov_chain(
            _uniform_pair(V, T + 1)[0]), horizon=T), ("draft", "target"))
    add(kind, "exact", "unvalidated FiniteStateModel with a negative row",
        lambda: S.exact(S.Speculative(), fsm(d()), _bad_fsm(), horizon=T), "target")
    add(kind, "FiniteStateModel", "next_state out of range",
        lambda: S.FiniteStateModel(0, np.full((2, V), 5, np.int32), np.full((2, V), 1 / V)),
        "next_state")
    add(kind, "FiniteStateModel", "table rows sum to 2",
        lambda: S.FiniteStateModel(0, np.zeros((2, V), np.int32), np.full((2, V), 2 / V)),
        "table")
    add(kind, "NGramModel", "table negative",
        lambda: S.NGramModel(jnp.asarray(np.tile([[0.7, -0.2, 0.3, 0.2]], (V, 1))), 2),
        "table")
    add(kind, "NGramModel", "table shape (V+1, V) for order 2",
        lambda: S.NGramModel(jnp.full((V + 1, V), 1 / V), 2), "table")
    add(kind, "NGramModel.fit", "token V in a sequence",
        lambda: S.NGramModel.fit([np.array([0, 1, V])], order=2, num_states=V), "sequences")
    add(kind, "NGramModel.fit", "float sequences",
        lambda: S.NGramModel.fit([np.array([0.0, 1.0])], order=2, num_states=V), "sequences")
    add(kind, "greedy_draft", "an n-gram (valid)",
        lambda: S.models.greedy_draft(S.NGramModel.fit([np.arange(V)], order=2, num_states=V)),
        check=lambda g: is_law(g.table))
    add(kind, "accepted_length", "protocol models",
        lambda: S.accepted_length(S.Speculative(2), tm("draft"), tm("target")),
        ("draft", "target"))

    # ----------------------------------------------------------------- sizes
    kind = "sizes"
    add(kind, "decode", "num_chains 2**31, Speculative",
        lambda: S.decode(k(), S.Speculative(), d(), t(), 2**31), "num_chains", isolate=True)
    add(kind, "decode", "num_chains 2**32 + 1",
        lambda: S.decode(k(), S.Speculative(), d(), t(), 2**32 + 1), "num_chains",
        isolate=True)
    add(kind, "decode", "num_chains 2**30, Autoregressive",
        lambda: S.decode(k(), S.Autoregressive(), None, t(), 2**30), "num_chains",
        isolate=True)
    add(kind, "speculative_decoding", "num_chains 2**31",
        lambda: S.speculative_decoding(k(), d(), t(), 2**31), "num_chains", isolate=True)
    add(kind, "compat.block_verification_decoding", "num_chains 2**29",
        lambda: S.compat.block_verification_decoding(k(), d(), t(), 2**29, lookahead=2),
        "num_chains", isolate=True)
    add(kind, "decode", "protocol models, horizon 2**28",
        lambda: S.decode(k(), S.Speculative(), tm("draft"), tm("target"), 64, horizon=2**28),
        ("horizon", "num_chains"), isolate=True)
    add(kind, "random_markov_chain", "V = 50_000",
        lambda: S.random_markov_chain(k(), 50_000, T), "num_states", isolate=True)
    add(kind, "random_markov_chain", "T = 2**30",
        lambda: S.random_markov_chain(k(), V, 2**30), "horizon", isolate=True)
    add(kind, "decode", "V = 8192, T = 2 (right, or refused)",
        lambda: S.decode(k(), S.Speculative(), *_uniform_pair(8192, 2), 1000),
        ("num_states", "draft", "target", "num_chains"),
        check=lambda r: r.tokens.shape == (1000, 3), isolate=True)
    add(kind, "FullDraft.init", "V = 50_000",
        lambda: S.tuning.FullDraft(50_000, T).init(k()), "num_states", isolate=True)
    add(kind, "tune_draft", "num_steps 2**31",
        lambda: S.tune_draft(fam(), fam().uniform(), t(), sd(), num_steps=2**31),
        "num_steps", isolate=True)
    add(kind, "audit", "num_samples 2**31",
        lambda: S.audit(k(), specjax.auditing.rules.speculative_rule, p1(), q1(),
                        num_samples=2**31), "num_samples", isolate=True)
    add(kind, "exact_joint_accepted_length", "V**K = 4**14 blocks",
        lambda: S.theory.exact_joint_accepted_length(*_uniform_pair(4, 14), lookahead=14),
        "lookahead", isolate=True)
    add(kind, "NGramModel.fit", "order 14, V = 4",
        lambda: S.NGramModel.fit([np.arange(V)], order=14, num_states=V), "order",
        isolate=True)
    add(kind, "batch_expected_rejections", "num_drafts 2**40",
        lambda: S.batch_expected_rejections(d(), t(), num_drafts=2**40), "num_drafts",
        check=lambda r: reference64("batch_inf") - 1e-3 <= float(r) <= reference64("batch4"),
        isolate=True)
    add(kind, "exact", "BatchSpeculative(2**40)",
        lambda: S.exact(S.BatchSpeculative(2**40), d(), t()), "num_drafts",
        check=exact_right("batch_inf", rtol=1e-3), isolate=True)
    add(kind, "decode", "BatchSpeculative(2**40)",
        lambda: S.decode(k(), S.BatchSpeculative(2**40), d(), t(), C), "num_drafts",
        check=trace_right(), isolate=True)
    add(kind, "exact", "OptimalMultiDraft(10**6, replacement=False), V = 4",
        lambda: S.exact(S.OptimalMultiDraft(10**6, replacement=False), d(), t()),
        "num_drafts", check=exact_right("batch_inf", rtol=1e-3))
    for name in ("ImportanceWeighted", "GumbelList"):
        if hasattr(S, name):
            add(kind, "exact", f"{name}(40), V = 4",
                lambda name=name: S.exact(getattr(S, name)(40), d(), t()), "num_drafts")
    add(kind, "decode", "BatchSpeculative(64, replacement=False), V = 4",
        lambda: S.decode(k(), S.BatchSpeculative(64, replacement=False), d(), t(), C),
        "num_drafts", check=trace_right(), isolate=True)
    add(kind, "CLI", "simulate --num-chains 10**10",
        cli("simulate", "--num-chains", 10**10, "--states", 4, "--horizon", 3),
        "--num-chains", isolate=True)
    add(kind, "CLI", "simulate --states 100000",
        cli("simulate", "--num-chains", 100, "--states", 100_000, "--horizon", 3),
        "--states", isolate=True)

    # ----------------------------------------------------------------- transformations
    kind = "transformations"
    add(kind, "batch_expected_rejections", "jax.jit(f)(d, t, num_drafts=4)",
        lambda: jax.jit(S.batch_expected_rejections)(d(), t(), num_drafts=4), "num_drafts")
    add(kind, "expected_rejections", "jax.jit(f)(d, t, lookahead=2)",
        lambda: jax.jit(S.expected_rejections)(d(), t(), lookahead=2), "lookahead")
    add(kind, "expected_rejections", "jax.jit(f)(d, t) (valid)",
        lambda: jax.jit(S.expected_rejections)(d(), t()), check=exact_right("sd"))
    add(kind, "batch_improvement", "jax.jit(f)(p, q, num_drafts=3)",
        lambda: jax.jit(S.batch_improvement)(p1(), q1(), num_drafts=3), "num_drafts")
    add(kind, "optimal_acceptance", "jax.jit(f)(p, q, num_drafts=3)",
        lambda: jax.jit(S.optimal_acceptance)(p1(), q1(), num_drafts=3), "num_drafts")
    add(kind, "decode", "jax.jit(decode)(key, Speculative(), d, t, C)",
        lambda: jax.jit(S.decode)(k(), S.Speculative(), d(), t(), C), "num_chains")
    add(kind, "speculative_decoding", "jax.jit(f)(key, d, t, C)",
        lambda: jax.jit(S.speculative_decoding)(k(), d(), t(), C), "num_chains")
    add(kind, "speculative_decoding", "jax.jit over the key (valid)",
        lambda: jax.jit(lambda kk: S.speculative_decoding(kk, d(), t(), C))(k()),
        check=trace_right())
    add(kind, "decode", "jax.vmap over 2 keys (valid)",
        lambda: jax.vmap(lambda kk: S.decode(kk, S.Speculative(), d(), t(), C // 2))(
            jax.random.split(k())),
        check=lambda r: hist_close(np.asarray(r.tokens).reshape(C, T + 1),
                                   target_marginals()))
    add(kind, "biased_speculative_decoding", "jax.jit over epsilon (valid)",
        lambda: jax.jit(lambda e: S.biased_speculative_decoding(k(), d(), t(), C, epsilon=e))(
            0.0), check=trace_right())
    add(kind, "expected_rejections", "jax.vmap over a batch of drafts (valid)",
        lambda: jax.vmap(S.expected_rejections, in_axes=(0, None))(
            jax.tree_util.tree_map(lambda x: jnp.stack([x, x]), d()), t()),
        check=lambda r: close(r, [reference64("sd")] * 2))
    add(kind, "expected_rejections", "jax.grad in the draft (valid)",
        lambda: jax.grad(S.expected_rejections)(d(), t()),
        check=lambda g: g.trans.shape == (T, V, V))
    add(kind, "exact", "jax.grad in BiasedSpeculative's epsilon (valid)",
        lambda: jax.grad(lambda e: S.exact(S.BiasedSpeculative(e), d(), t())
                         .expected_rejections)(0.1), check=lambda g: float(g) <= 0)
    add(kind, "exact", "jax.jit(exact)(Speculative(), d, t) (valid)",
        lambda: jax.jit(S.exact)(S.Speculative(), d(), t()), check=exact_right("sd"))
    add(kind, "accepted_length", "jax.jit(f)(Speculative(2), d, t, position=1)",
        lambda: jax.jit(S.accepted_length)(S.Speculative(2), d(), t(), position=1),
        "position")
    add(kind, "random_markov_chain", "jax.jit(f)(key, 4, 3)",
        lambda: jax.jit(S.random_markov_chain)(k(), V, T), "num_states")
    add(kind, "random_markov_chain", "jax.jit over the key (valid)",
        lambda: jax.jit(lambda kk: S.random_markov_chain(kk, V, T))(k()),
        check=lambda c: is_law(c.trans))
    add(kind, "BatchSpeculative", "jax.jit(lambda m: BatchSpeculative(m))(4)",
        lambda: jax.jit(lambda m: S.exact(S.BatchSpeculative(m), d(), t()))(4), "num_drafts")
    add(kind, "MarkovChain.from_logits", "jax.jit (valid)",
        lambda: jax.jit(S.MarkovChain.from_logits)(jnp.zeros(V), jnp.zeros((T, V, V))),
        check=lambda c: close(c.trans, np.full((T, V, V), 1 / V)))
    add(kind, "tv_distance", "jax.vmap (valid)",
        lambda: jax.vmap(S.tv_distance)(jnp.stack([p1(), q1()]), jnp.stack([q1(), q1()])),
        check=lambda r: close(r, [0.5 * np.abs(P() - Q()).sum(), 0.0]))
    add(kind, "speculative_residual", "jax.grad at p = q (valid, finite)",
        lambda: jax.grad(lambda p: S.speculative_residual(p, q1())[0])(q1()),
        check=returned)
    add(kind, "decoding_statistics", "inside jax.jit",
        lambda: jax.jit(lambda kk: S.decoding_statistics(kk, S.Speculative(), d(), t(), C)
                        .num_rejections)(k()), ("jit", "key"))
    add(kind, "pareto_front", "jax.jit (valid)",
        lambda: jax.jit(S.theory.pareto_front)(p1(), q1(), jnp.asarray([0.0, 0.1])),
        check=lambda r: close(r.loss_star[0], 0.0))
    add(kind, "acceptance_probability", "jax.jit with epsilon keyword (valid)",
        lambda: jax.jit(S.acceptance_probability)(p1(), q1(), epsilon=0.1),
        check=lambda r: close(r, np.minimum(1, (Q() + 0.1) / P())))
    add(kind, "objective", "jax.grad of objective(BatchSpeculative(3)) in the draft (valid)",
        lambda: jax.grad(S.objective(S.BatchSpeculative(3)))(d(), t()),
        check=lambda g: g.trans.shape == (T, V, V))

    # ----------------------------------------------------------------- CLI
    kind = "CLI"
    add(kind, "python -m specjax", "simulate --num-chains 0",
        cli("simulate", "--num-chains", 0), "--num-chains")
    add(kind, "python -m specjax", "simulate --states 0",
        cli("simulate", "--num-chains", 100, "--states", 0, "--horizon", 3), "--states")
    add(kind, "python -m specjax", "simulate --states -3",
        cli("simulate", "--num-chains", 100, "--states", -3, "--horizon", 3), "--states")
    add(kind, "python -m specjax", "simulate --horizon 0",
        cli("simulate", "--num-chains", 100, "--states", 4, "--horizon", 0), "--horizon")
    add(kind, "python -m specjax", "simulate --num-chains abc",
        cli("simulate", "--num-chains", "abc"), "--num-chains")
    add(kind, "python -m specjax", "reproduce --num-runs 1",
        cli("reproduce", "--num-runs", 1), "--num-runs")
    add(kind, "python -m specjax", "reproduce --out an existing file",
        cli("reproduce", "--quick", "--out", __file__), "--out")
    add(kind, "python -m specjax", "reproduce --out under /proc",
        cli("reproduce", "--quick", "--no-progress", "--out", "/proc/specjax-battery/x"),
        ("--out", "/proc/specjax-battery/x"))
    add(kind, "python -m specjax", "command 'simulat'", cli("simulat"), "simulat")
    add(kind, "python -m specjax", "simulate --horizon -2",
        cli("simulate", "--num-chains", 100, "--states", 4, "--horizon", -2), "--horizon")

    # ----------------------------------------------------------------- the frontier names
    kind = "static settings"
    if hasattr(S, "optimal_acceptance"):
        add(kind, "optimal_acceptance", "num_drafts 0",
            lambda: S.optimal_acceptance(p1(), q1(), num_drafts=0), "num_drafts")
        add(kind, "optimal_acceptance", "p NaN",
            lambda: S.optimal_acceptance(nan_row(), q1(), num_drafts=2), "p")
    if hasattr(S, "OptimalMultiDraft"):
        add(kind, "OptimalMultiDraft", "num_drafts 0", lambda: S.OptimalMultiDraft(0),
            "num_drafts")
    if hasattr(S, "KSequential"):
        add(kind, "KSequential", "num_drafts 0", lambda: S.KSequential(0), "num_drafts")
        add(kind, "KSequential", "num_drafts math.inf", lambda: S.KSequential(math.inf),
            "num_drafts")
        add(kind, "KSequential", "lookahead 0", lambda: S.KSequential(2, lookahead=0),
            "lookahead")
    for name in ("ImportanceWeighted", "GumbelList"):
        if hasattr(S, name):
            cls = getattr(S, name)
            add(kind, name, "num_drafts 0", lambda cls=cls: cls(0), "num_drafts")
            add(kind, name, "num_drafts math.inf", lambda cls=cls: cls(math.inf), "num_drafts")
            add(kind, name, "lookahead 0", lambda cls=cls: cls(2, lookahead=0), "lookahead")
    if hasattr(S, "SpecHub"):
        add(kind, "SpecHub", "lookahead 0", lambda: S.SpecHub(lookahead=0), "lookahead")
        add(kind, "SpecHub", "lookahead 1.5", lambda: S.SpecHub(lookahead=1.5), "lookahead")
    add(kind, "TokenTree", "branching (0,)", lambda: S.TokenTree((0,)), "branching")
    add(kind, "TokenTree", "children 'foo'", lambda: S.TokenTree((2,), children="foo"),
        "children")
    add(kind, "TokenTree", "branching as a jnp array",
        lambda: S.TokenTree(jnp.asarray([2, 2])), "branching")
    add(kind, "TokenTree", "parents[0] = 0",
        lambda: S.TokenTree.from_parents((0, 0, 1)), "parents")
    add(kind, "TokenTree", "parents[2] = 2",
        lambda: S.TokenTree.from_parents((-1, 0, 2)), "parents")
    add(kind, "exact", "TokenTree((2, 1)) (valid)",
        lambda: S.exact(S.TokenTree((2, 1)), d(), t()), check=returned)
    add(kind, "decode", "TokenTree((2,), children='top_k') (valid)",
        lambda: S.decode(k(), S.TokenTree((2,), children="top_k"), d(), t(), C),
        check=trace_right())
    add(kind, "DynamicTree", "budget 1", lambda: S.DynamicTree(1, max_depth=2), "budget")
    add(kind, "DynamicTree", "max_depth 0", lambda: S.DynamicTree(4, max_depth=0),
        "max_depth")
    add(kind, "DynamicTree", "rank 'oracle'",
        lambda: S.DynamicTree(4, max_depth=2, rank="oracle"), "rank")
    add(kind, "decode", "DynamicTree(4, max_depth=2) (valid)",
        lambda: S.decode(k(), S.DynamicTree(4, max_depth=2), d(), t(), C),
        check=trace_right())
    add(kind, "positional_acceptance", "num_children 0",
        lambda: S.theory.positional_acceptance(d(), t(), num_children=0), "num_children")
    add(kind, "positional_acceptance", "children 'foo'",
        lambda: S.theory.positional_acceptance(d(), t(), num_children=2, children="foo"),
        "children")
    add(kind, "best_token_tree", "budget 11",
        lambda: S.theory.best_token_tree(d(), t(), budget=11, max_depth=2), "budget")
    add(kind, "best_token_tree", "max_depth beyond the horizon",
        lambda: S.theory.best_token_tree(d(), t(), budget=3, max_depth=T + 1), "max_depth")
    add(kind, "sequoia_tree", "budget 0",
        lambda: S.sequoia_tree(jnp.asarray([0.5, 0.3]), budget=0, max_depth=2), "budget")
    add(kind, "sequoia_tree", "acceptance summing to 1.5",
        lambda: S.sequoia_tree(jnp.asarray([0.9, 0.6]), budget=3, max_depth=2),
        "acceptance")
    add(kind, "sequoia_hardware_tree", "target_cost table too short",
        lambda: S.theory.sequoia_hardware_tree(jnp.asarray([0.5, 0.3]), draft_cost=0.1,
                                        target_cost=jnp.ones(3), max_budget=8,
                                        max_depth=3), "target_cost")
    add(kind, "sequoia_hardware_tree", "draft_cost None",
        lambda: S.theory.sequoia_hardware_tree(jnp.asarray([0.5, 0.3]), draft_cost=None,
                                        target_cost=jnp.ones(9), max_budget=8,
                                        max_depth=3), "draft_cost")
    add(kind, "CostModel", "target_cost -1", lambda: S.CostModel(0.1, -1.0), "target_cost")
    add(kind, "ServingCost", "target_time with a NaN",
        lambda: S.ServingCost([0.0, 0.1, 0.1], [0.0, math.nan, 1.0]), "target_time")
    add(kind, "ServingCost", "overhead -1",
        lambda: S.ServingCost([0.0, 0.1], [0.0, 1.0], overhead=-1.0), "overhead")
    add(kind, "serving_rate", "batch_size 0",
        lambda: S.serving_rate(S.Speculative(lookahead=2), d(), t(),
                               S.ServingCost([0.1] * 8, [1.0] * 32), batch_size=0), "batch_size")
    add(kind, "serving_rate", "cost a tuple",
        lambda: S.serving_rate(S.Speculative(lookahead=2), d(), t(), (0.1, 1.0), batch_size=2),
        "cost")
    add(kind, "serving_rate", "draft_time table too short for the batch",
        lambda: S.serving_rate(S.Speculative(lookahead=2), d(), t(),
                               S.ServingCost([0.1] * 3, [1.0] * 32), batch_size=4), "draft_time")
    add(kind, "TraversalVerification", "branching (0,)",
        lambda: S.TraversalVerification((0,)), "branching")
    add(kind, "TraversalVerification", "children 'top_k'",
        lambda: S.TraversalVerification((2,), children="top_k"), "children")
    add(kind, "TraversalVerification", "parents[0] = 0",
        lambda: S.TraversalVerification.from_parents((0, 0)), "parents")
    add(kind, "CostModel", "draft_cost None", lambda: S.CostModel(None, 1.0), "draft_cost")
    add(kind, "CostModel", "target_cost table of NaN",
        lambda: S.CostModel(0.1, [0.0, math.nan]), "target_cost")
    add(kind, "expected_time", "cost a tuple",
        lambda: S.expected_time(S.Speculative(lookahead=2), d(), t(), (0.1, 1.0)), "cost")
    add(kind, "expected_time", "target_cost table too short for K = 3",
        lambda: S.expected_time(S.Speculative(lookahead=3), d(), t(),
                                S.CostModel(0.1, [0.0, 1.0, 1.0])), "target_cost")
    add(kind, "decoding_time", "TokenTree((2, 1)) (valid)",
        lambda: S.theory.decoding_time(S.TokenTree((2, 1)), d(), t(), S.CostModel(0.1, 1.0)),
        check=returned)
    add(kind, "engine_metrics", "target a dict",
        lambda: S.theory.engine_metrics(S.Speculative(lookahead=2), d(),
                                        {"trans": 1}), "MarkovChain")
    add(kind, "engine_metrics", "TokenTree((2, 1)) (valid)",
        lambda: S.theory.engine_metrics(S.TokenTree((2, 1)), d(), t()), check=returned)
    add(kind, "best_tree_budget", "max_budget 1",
        lambda: S.theory.best_tree_budget(d(), t(), S.CostModel(0.1, 1.0), max_budget=1,
                                          max_depth=2),
        "max_budget")
    add(kind, "best_tree_budget", "children 'foo'",
        lambda: S.theory.best_tree_budget(d(), t(), S.CostModel(0.1, 1.0), max_budget=3,
                                          max_depth=2, children="foo"), "children")
    add(kind, "best_lookahead", "max_lookahead 0",
        lambda: S.theory.best_lookahead(d(), t(), S.CostModel(0.1, 1.0), max_lookahead=0),
        "max_lookahead")
    add(kind, "best_lookahead", "max_lookahead 2.5",
        lambda: S.theory.best_lookahead(d(), t(), S.CostModel(0.1, 1.0), max_lookahead=2.5),
        "max_lookahead")

    # Real model pairs: recordings of target rollouts and the estimates from them.
    pair_tokens = lambda: np.zeros((2, T + 1), np.int32)  # noqa: E731
    pair_rows = lambda: np.full((2, T, V), 1.0 / V)  # noqa: E731
    from_arrays = S.Recording.from_arrays
    add(kind, "Recording.from_arrays", "target_probs of another shape",
        lambda: S.Recording.from_arrays(pair_tokens(), pair_rows(), pair_rows()[:, :-1]),
        "target_probs")
    add(kind, "Recording.from_arrays", "negative weights",
        lambda: from_arrays(pair_tokens(), pair_rows(), pair_rows(), weights=np.array([1.0, -1.0])),
        "weights")
    add(kind, "Recording.from_arrays", "draft rows summing to 2",
        lambda: from_arrays(pair_tokens(), 2 * pair_rows(), pair_rows()), "draft_probs")
    add(kind, "Recording.from_arrays", "a token out of range",
        lambda: S.Recording.from_arrays(pair_tokens() + V, pair_rows(), pair_rows()), "tokens")
    add(kind, "record", "num_sequences 0",
        lambda: S.record(k(), d(), t(), 0), "num_sequences")
    add(kind, "record", "chunk_size 0",
        lambda: S.record(k(), d(), t(), 4, chunk_size=0), "chunk_size")
    add(kind, "estimate", "a lossy decoder",
        lambda: S.estimate(S.BiasedSpeculative(0.5),
                           from_arrays(pair_tokens(), pair_rows(), pair_rows())), "decoder")
    add(kind, "estimate", "cost a tuple",
        lambda: S.estimate(S.Speculative(lookahead=2),
                           from_arrays(pair_tokens(), pair_rows(), pair_rows()),
                           cost=(0.1, 1.0)),
        "cost")
    add(kind, "estimate", "recording a string",
        lambda: S.estimate(S.Speculative(lookahead=2), "recording"), "recording")

    # Adaptive draft lengths: stopping policies and the optimal one.
    adaptive = S.AdaptiveSpeculative
    add(kind, "AdaptiveSpeculative", "policy a lambda",
        lambda: adaptive(lambda s: s.depth > 1, max_lookahead=2), "policy")
    add(kind, "AdaptiveSpeculative", "max_lookahead 0",
        lambda: adaptive(S.decoders.FixedLength(2), max_lookahead=0), "max_lookahead")
    add(kind, "FixedLength", "length 2.5", lambda: S.decoders.FixedLength(2.5), "length")
    add(kind, "RejectionThreshold", "threshold 1.5",
        lambda: S.exact(adaptive(S.decoders.RejectionThreshold(1.5), max_lookahead=2), d(), t()),
        "threshold")
    add(kind, "EntropyThreshold", "threshold -1",
        lambda: S.decode(k(), adaptive(S.decoders.EntropyThreshold(-1.0), max_lookahead=2), d(),
                         t(), C),
        "threshold")
    add(kind, "ConfidenceThreshold", "threshold NaN",
        lambda: S.exact(adaptive(S.decoders.ConfidenceThreshold(math.nan), max_lookahead=2), d(),
                        t()),
        "threshold")
    add(kind, "StoppingRule", "fn 3", lambda: S.decoders.StoppingRule(3), "fn")
    add(kind, "StoppingRule", "fn returning floats",
        lambda: S.exact(adaptive(S.decoders.StoppingRule(lambda s: 0.5 + 0 * s.depth),
                                 max_lookahead=2),
                        d(), t()), "fn")
    add(kind, "ThresholdTable", "table for another horizon",
        lambda: S.exact(adaptive(S.decoders.ThresholdTable(jnp.zeros((T + 1, 3, V))),
                                 max_lookahead=2),
                        d(), t()), "thresholds")
    add(kind, "decode", "AdaptiveSpeculative(RejectionThreshold(0.3)) (valid)",
        lambda: S.decode(k(), adaptive(S.decoders.RejectionThreshold(0.3), max_lookahead=2), d(),
                         t(), C),
        check=trace_right())
    add(kind, "optimal_stopping", "max_lookahead 0",
        lambda: S.theory.optimal_stopping(d(), t(), S.CostModel(0.1, 1.0), max_lookahead=0),
        "max_lookahead")
    add(kind, "optimal_stopping", "cost a tuple",
        lambda: S.theory.optimal_stopping(d(), t(), (0.1, 1.0), max_lookahead=2), "cost")
    add(kind, "optimal_stopping", "(valid)",
        lambda: S.theory.optimal_stopping(d(), t(), S.CostModel(0.1, 1.0), max_lookahead=2),
        check=returned)
    add(kind, "HeuristicSchedule", "initial above max_lookahead",
        lambda: S.HeuristicSchedule(5, max_lookahead=3), "initial")
    add(kind, "HeuristicSchedule", "increase -1",
        lambda: S.HeuristicSchedule(1, max_lookahead=3, increase=-1), "increase")
    add(kind, "HeuristicSchedule", "max_lookahead a traced array",
        lambda: S.HeuristicSchedule(1, max_lookahead=jnp.asarray(3)), "max_lookahead")
    add(kind, "decode", "HeuristicSchedule(1, max_lookahead=3) (valid)",
        lambda: S.decode(k(), S.HeuristicSchedule(1, max_lookahead=3), d(), t(), C),
        check=trace_right())
    add(kind, "exact", "HeuristicSchedule(2, max_lookahead=3) (valid)",
        lambda: S.exact(S.HeuristicSchedule(2, max_lookahead=3), d(), t()), check=returned)
    add(kind, "accepted_length", "HeuristicSchedule (state across calls)",
        lambda: S.accepted_length(S.HeuristicSchedule(1, max_lookahead=3), d(), t()),
        "decoder")
    add(kind, "optimal_rate", "a non-stationary draft",
        lambda: S.optimal_rate(d(), t(), S.CostModel(0.1, 1.0), max_lookahead=2), "draft")
    add(kind, "optimal_rate", "max_iterations 0",
        lambda: S.optimal_rate(*_stationary(), S.CostModel(0.1, 1.0), max_lookahead=2,
                               max_iterations=0), "max_iterations")
    add(kind, "optimal_rate", "(valid)",
        lambda: S.optimal_rate(*_stationary(), S.CostModel(0.1, 1.0), max_lookahead=2),
        check=returned)
    add(kind, "stationary_rate", "a token-wise decoder",
        lambda: S.theory.stationary_rate(S.Speculative(lookahead=2), *_stationary(),
                                  S.CostModel(0.1, 1.0)), "decoder")
    add(kind, "stationary_rate", "TokenTree((2, 1)) (valid)",
        lambda: S.theory.stationary_rate(S.TokenTree((2, 1)), *_stationary(),
                                         S.CostModel(0.1, 1.0)),
        check=returned)

    # Issue 52: the entry points of the last round (recordings and their files, profiles,
    # serving sizes; the command line's outputs; auditing, distillation and model faults).
    for module in RECENT_CASE_MODULES:
        importlib.import_module(module).add_cases(add, S)

    ids = [c.id for c in cases]
    duplicates = {i for i in ids if ids.count(i) > 1}
    assert not duplicates, duplicates
    return cases


# helpers used by the cases above

def _stationary():
    """A stationary pair: the first position's rows of the battery's chains at every position."""
    draft, target = (specjax.MarkovChain(m.init, jnp.broadcast_to(m.trans[0], m.trans.shape))
                     for m in pair())
    return draft, target


def _half_sd(dtype_name):
    _, (init, p, q) = half_pair(dtype_name)
    return np_sd_rejections(init, p, q)


def _as32(chain):
    return specjax.MarkovChain(chain.init.astype(jnp.float32), chain.trans.astype(jnp.float32))


@built_once
def _int_pair():
    perm_p = np.stack([np.eye(V, dtype=np.int32)[np.roll(np.arange(V), n)] for n in range(T)])
    perm_q = np.stack([np.eye(V, dtype=np.int32)[np.roll(np.arange(V), n + 1)]
                       for n in range(T)])
    init = np.eye(V, dtype=np.int32)[0]
    return specjax.MarkovChain(init, perm_p), specjax.MarkovChain(init, perm_q)


@built_once
def _f16_dirichlet():
    init, p, q = np_pair()
    def chain(trans):
        t16 = jnp.asarray(trans, jnp.float16)
        t16 = t16 / t16.sum(-1, keepdims=True)
        return specjax.MarkovChain(jnp.asarray(init, jnp.float16), t16)
    return chain(p), chain(q)


def _f16_dirichlet_marginals():
    t = _f16_dirichlet()[1]
    return np_marginals(np.asarray(t.init, np.float64), np.asarray(t.trans, np.float64))


def _int_marginals():
    perm_q = np.stack([np.eye(V)[np.roll(np.arange(V), n + 1)] for n in range(T)])
    return np_marginals(np.eye(V)[0], perm_q)


def _uniform_pair(num_states, horizon):
    trans = jnp.full((horizon, num_states, num_states), 1 / num_states, jnp.float32)
    init = jnp.full((num_states,), 1 / num_states, jnp.float32)
    chain = specjax.MarkovChain(init, trans)
    return chain, chain


def _bad_fsm():
    good = specjax.FiniteStateModel.from_markov_chain(target())
    return _fsm_with(good, good.table.at[2].set(jnp.asarray([0.7, -0.2, 0.3, 0.2])))


def _fsm_with(model, table):
    leaves, treedef = jax.tree_util.tree_flatten(model)
    swapped = [table if leaf is model.table else leaf for leaf in leaves]
    return jax.tree_util.tree_unflatten(treedef, swapped)


def _nan_objective(draft_chain, target_chain):
    return jnp.sum(draft_chain.trans) * jnp.nan


def _verify_raises(key_, p, q, x):
    raise RuntimeError("a bug in the user's rule")


@functools.cache
def cases() -> tuple[Case, ...]:
    return tuple(_cases())


def case_by_id(case_id: str) -> Case:
    for case in cases():
        if case.id == case_id:
            return case
    raise KeyError(case_id)


# ---------------------------------------------------------------------------------------------
# The classifier.

_OOM = re.compile(r"RESOURCE_EXHAUSTED|[Oo]ut of memory|std::bad_alloc|Cannot allocate memory")


def _names(message: str, names) -> bool:
    return any(re.search(rf"(?<![A-Za-z0-9_]){re.escape(n)}(?![A-Za-z0-9_])", message)
               for n in names)


def _short(text, limit=300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + " ..."


def _summary(result) -> str:
    try:
        leaves = jax.tree_util.tree_leaves(result)
        arrays = [x for x in leaves if isinstance(x, (jax.Array, np.ndarray))]
        if arrays and arrays[0].size <= 8:
            return f"{type(result).__name__} {np.asarray(arrays[0]).round(4).tolist()}"
        if arrays:
            return f"{type(result).__name__} with arrays {[tuple(a.shape) for a in arrays[:4]]}"
    except Exception:  # noqa: BLE001
        pass
    return _short(repr(result), 120)


def classify_here(case: Case) -> Outcome:
    """Runs ``case`` in this process (see ``classify`` for isolated cases)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = case.run()
            result = jax.block_until_ready(result)
        except ValueError as error:
            message = str(error)
            if case.error and _names(message, case.error):
                return Outcome("clear error", _short(message))
            if _OOM.search(message):
                return Outcome("crash", _short(message))
            if case.error:
                return Outcome("cryptic", f"ValueError not naming {'/'.join(case.error)}: "
                                          f"{_short(message)}")
            return Outcome("cryptic", f"a valid input refused: ValueError: {_short(message)}")
        except MemoryError as error:
            return Outcome("crash", f"MemoryError: {_short(error)}")
        except Exception as error:  # noqa: BLE001 - classified, not hidden
            message = f"{type(error).__name__}: {_short(error)}"
            if _OOM.search(str(error)):
                return Outcome("crash", message)
            return Outcome("cryptic", message)
    noted = [f"{w.category.__name__}" for w in caught
             if not issubclass(w.category, DeprecationWarning)]
    extra = f" (warnings: {', '.join(sorted(set(noted)))})" if noted else ""
    if case.check is None:
        return Outcome("silent", f"returned {_summary(result)} instead of raising" + extra)
    finite, why = finite_leaves(result)
    if not finite:
        return Outcome("silent", why + extra)
    try:
        ok = bool(case.check(result))
    except Exception as error:  # noqa: BLE001
        return Outcome("silent", f"check raised {type(error).__name__}: {_short(error)}")
    if ok:
        return Outcome("right", extra.strip())
    return Outcome("silent", f"wrong result: {_summary(result)}" + extra)


def classify(case: Case) -> Outcome:
    """Runs one case and says how it went (isolated cases in a child process)."""
    if case.isolate:
        return run_isolated([case])[case.id]
    return classify_here(case)


# ---------------------------------------------------------------------------------------------
# The child process of the size cases.

_MARK = "@@reliability@@ "


def _patch_memory() -> None:
    try:
        from specjax import _memory
    except ImportError:
        return
    _memory.available_bytes = lambda *args, **kwargs: PATCHED_AVAILABLE


def _child_main(ids) -> None:
    jax.config.update("jax_numpy_rank_promotion", "raise")
    _patch_memory()
    for case_id in ids:
        print(_MARK + json.dumps({"start": case_id}), flush=True)
        start = time.perf_counter()
        outcome = classify_here(case_by_id(case_id))
        print(_MARK + json.dumps({"id": case_id, "outcome": outcome.outcome,
                                  "detail": outcome.detail,
                                  "seconds": time.perf_counter() - start}), flush=True)


def _child_path():
    """The child imports the same specjax and cases as this process (first on its path)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(specjax.__file__)))
    return [root, os.path.dirname(os.path.abspath(__file__))]


def _child_env():
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(specjax.__file__)))
    here = os.path.dirname(os.path.abspath(__file__))
    env["PYTHONPATH"] = os.pathsep.join([root, here] + [p for p in env.get("PYTHONPATH", "")
                                                        .split(os.pathsep) if p])
    env.setdefault("JAX_PLATFORMS", "cpu")
    env["PYTHONWARNINGS"] = "ignore"
    # XLA's own optimisation level, not the suite's level 0 (tests/conftest.py): the size cases
    # compile a few programs and run them on large tables, which level 0's code runs about ten
    # times slower (V = 8192: 12 s against 1.1 s at level 1).
    env["XLA_FLAGS"] = without_fast_compile(env.get("XLA_FLAGS", ""))
    return env


def run_isolated(batch, timeout: float = CASE_TIMEOUT) -> dict[str, Outcome]:
    """Runs the cases in child processes (one child for the whole batch; a new one after a
    crash), each case under ``timeout`` seconds (plus the child's start-up)."""
    pending = [c.id for c in batch]
    results: dict[str, Outcome] = {}
    while pending:
        # The child limits its own address space before importing JAX (no preexec_fn: the
        # parent must not fork a multithreaded JAX process).
        boot = (f"import resource; resource.setrlimit(resource.RLIMIT_AS, "
                f"({CHILD_ADDRESS_SPACE}, {CHILD_ADDRESS_SPACE})); "
                f"resource.setrlimit(resource.RLIMIT_CORE, (0, 0)); import sys; "
                f"sys.path[:0] = {_child_path()!r}; "
                f"import reliability_cases; reliability_cases._child_main(sys.argv[1:])")
        proc = subprocess.Popen([sys.executable, "-c", boot, *pending],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=_child_env(), text=True)
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        current, deadline = None, time.monotonic() + timeout + 30
        stderr_tail = ""
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    proc.kill()
                    proc.wait()
                    victim = current or pending[0]
                    results[victim] = Outcome("crash", f"no answer within {timeout:.0f} s "
                                                       f"(killed)")
                    pending.remove(victim)
                    break
                if not sel.select(timeout=min(left, 1.0)):
                    continue
                line = proc.stdout.readline()
                if not line:  # the child ended
                    proc.wait()
                    stderr_tail = proc.stderr.read()[-600:]
                    if current is not None:
                        how = (f"killed by signal {-proc.returncode}" if proc.returncode < 0
                               else f"exit status {proc.returncode}")
                        results[current] = Outcome("crash", f"child {how}: "
                                                            f"{_short(stderr_tail, 300)}")
                        pending.remove(current)
                    elif pending and proc.returncode != 0:
                        for case_id in pending:
                            results[case_id] = Outcome("crash", "child failed to start: "
                                                       f"{_short(stderr_tail, 300)}")
                        pending = []
                    break
                if not line.startswith(_MARK):
                    continue
                message = json.loads(line[len(_MARK):])
                if "start" in message:
                    current = message["start"]
                    deadline = time.monotonic() + timeout
                else:
                    results[message["id"]] = Outcome(message["outcome"], message["detail"],
                                                     message["seconds"])
                    pending.remove(message["id"])
                    current = None
        finally:
            sel.close()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
            proc.stderr.close()
    return results


def run_all(selected=None, progress=None) -> dict[str, Outcome]:
    """Classifies every case (isolated ones in one child batch): ``{case id: Outcome}``."""
    chosen = list(cases() if selected is None else selected)
    results: dict[str, Outcome] = {}
    isolated = [c for c in chosen if c.isolate]
    for case in chosen:
        if not case.isolate:
            start = time.perf_counter()
            outcome = classify_here(case)
            results[case.id] = dataclasses.replace(outcome,
                                                   seconds=time.perf_counter() - start)
            if progress:
                progress(case, results[case.id])
    if isolated:
        iso = run_isolated(isolated)
        for case in isolated:
            results[case.id] = iso[case.id]
            if progress:
                progress(case, results[case.id])
    return results
