"""``python -m specjax bench``: every benchmark's headline case in one run, on any device.

Each case times a public specjax entry point beside its NumPy reference
(``specjax.experiments.references``, the same code the scripts ``scripts/benchmark_*.py`` use) in
the same process, best of a few runs with compilation excluded (``best_time``), and gives the
ratio ``reference time / specjax time`` (above 1: specjax is faster). Samplers also give the
fraction of the random-number floor: the time JAX takes just to draw one uniform per chain-step
(accumulated in a ``lax.scan``), over specjax's time. The cases run one after another, each on
its own: one that fails (out of memory on some device, say) ends with a ``failed`` row, after
the rows it finished, and the others still run. JAX runs on whatever device it finds
(``jax.devices()[0]``); NumPy on the host. Beside the times, each row shows what the two
computed on the run (means, exact values, the requests they agree on) and whether they agree.

Two sizes (``Sizes``): the default, the scripts' headline settings where they fit about five
minutes on a 2-core CPU (the exceptions are listed in ``Sizes``' docstring), and ``quick``, toy
sizes that check the command end to end in the test suite (its timings mean little).

The output: ``bench.md`` (one Markdown table, the device, JAX's version, the commit and the date
above it) and ``bench.json`` (the same, with every figure in seconds), written whole into the
output folder, both or neither (``write``; ``check_out_dir`` checks the folder before a run).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import pathlib
import subprocess
import sys
import time
from typing import Callable
from typing import Iterator
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import specjax
from specjax._progress import check_interrupt
from specjax.experiments import references
from specjax.experiments import report


# ----------------------------------------------------------------------------------- timing
def best_time(fn, repeats: int) -> float:
    """Smallest wall time of ``fn(i)`` for ``i = 1..repeats``, after a warm-up call ``fn(0)``
    (which compiles, and is not counted); every result is waited for (``block_until_ready``)."""
    return best_times([fn], repeats)[0]


def best_times(fns, repeats: int) -> list:
    """``best_time`` of each of ``fns``, their calls taken in turn (``fns[0](i)``, ``fns[1](i)``,
    ..., then ``i + 1``) after one warm-up call each: a ratio of two of them is measured side by
    side, not across a change in the machine's load between two series of runs."""
    for fn in fns:
        jax.block_until_ready(fn(0))
    times = [[] for _ in fns]
    for i in range(repeats):
        check_interrupt()  # a Ctrl-C lost inside JAX (specjax._progress) ends the run here
        for fn, seconds in zip(fns, times):
            start = time.perf_counter()
            jax.block_until_ready(fn(i + 1))
            seconds.append(time.perf_counter() - start)
    return [min(seconds) for seconds in times]


def timed(fn) -> float:
    """Wall time of one call of ``fn()``."""
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start


def time_against_numpy(verify, arrays, numpy_fn, repeats: int, numpy_repeats: int | None = None):
    """A verifier timed as a user calls it (``verify(*arrays)``, its checks included) and under
    the caller's ``jit``, beside ``numpy_fn()``: ``(first call under jit, compilation included;
    checked; jitted; NumPy; the jitted output as a NumPy array)``, best of ``repeats`` (the
    checked and jitted calls in turn, ``best_times``; NumPy: of ``numpy_repeats``, default
    ``repeats``, without a warm-up: it compiles nothing)."""
    device = [jnp.asarray(a) for a in arrays]
    jitted = jax.jit(verify)
    start = time.perf_counter()
    jax.block_until_ready(jitted(*device))
    first = time.perf_counter() - start
    t_checked, t_jitted = best_times([lambda i: verify(*device), lambda i: jitted(*device)],
                                     repeats)
    numpy_repeats = repeats if numpy_repeats is None else numpy_repeats
    t_numpy = min(timed(numpy_fn) for _ in range(max(numpy_repeats, 1)))
    return first, t_checked, t_jitted, t_numpy, np.asarray(jitted(*device))


def uniform_floor(num_chains: int, horizon: int, repeats: int) -> float:
    """Seconds JAX takes to draw one uniform per chain-step, ``num_chains`` chains over
    ``horizon`` positions, accumulated inside a ``lax.scan`` (nothing materialised): the floor
    of any sampler that needs one random number per step."""
    def scan(k):
        def step(acc, n):
            return acc + jax.random.uniform(jax.random.fold_in(k, n), (num_chains,)), None
        return jax.lax.scan(step, jnp.zeros(num_chains), jnp.arange(horizon))[0]
    floor = jax.jit(scan)
    key = jax.random.key(0)
    return best_time(lambda i: floor(jax.random.fold_in(key, i)), repeats)


# ----------------------------------------------------------------------------------- sizes
@dataclasses.dataclass(frozen=True)
class Sizes:
    """The sizes of every case. The default is each script's headline setting, but for:

    * ``theory``: ``V = 256`` (the script's default is 512), on the token-tree benchmark's two
      random chains (built once for both; at ``V = 512`` the chains alone take over a minute
      on a 2-core CPU);
    * ``adaptive``: ``K = 4`` (the script's default ``K = 6`` keeps NumPy busy for minutes);
    * ``pairs``: the script's ``--quick`` sizes (``V = 2,000``, ``T = 64``, ``B = 100``);
    * fewer repeats: specjax's time is the best of ``repeats`` after a warm-up call, NumPy's
      the best of ``numpy_repeats`` (no warm-up: it compiles nothing).
    """

    repeats: int = 2
    numpy_repeats: int = 2
    samplers: tuple = (7, 50, 200_000)  # V, T, C
    theory: tuple = (256, 128, 8)  # V, T, M
    token_tree: tuple = (256, 128, 4096, 64, 8, (4, 2, 2, 1, 1, 1))  # V, T, C, budget, depth, b
    optimal_acceptance: tuple = (1000, 32_000, (2, 4, 8))  # rows, V, drafts
    verify: tuple = (256, 8, 32_000)  # B, K, V
    verify_tree: tuple = (256, (4, 2, 1), 32_000)  # B, branching, V
    stop_tokens: int = 200_000  # C
    adaptive: tuple = (16, 64, 4)  # V, T, K
    pairs: tuple = (2_000, 64, 100)  # V, T, B
    serving: tuple = (7, 50, 64, 4, 4)  # V, T, B (goodput), K, B (allocation: all (K + 1)^B)

    @classmethod
    def quick(cls) -> "Sizes":
        """Toy sizes: every case end to end in seconds of run time (plus compilation). The
        adaptive case's chains have the theory case's shape (``V = 16``, ``T = 6``), so their
        draw is one compiled program."""
        return cls(repeats=1, numpy_repeats=1, samplers=(7, 8, 2_000), theory=(16, 6, 3),
                   token_tree=(16, 6, 200, 8, 4, (2, 1, 1)),
                   optimal_acceptance=(20, 300, (2,)), verify=(16, 4, 50),
                   verify_tree=(16, (2, 1), 50), stop_tokens=2_000, adaptive=(16, 6, 2),
                   pairs=(300, 12, 20), serving=(7, 8, 4, 2, 3))


# ----------------------------------------------------------------------------------- rows
class Row(NamedTuple):
    """One line of the table: specjax's time beside its reference's, on the same run.

    Attributes:
      case: the benchmark (the script's name without ``benchmark_``).
      name: what is timed.
      size: its size, in words.
      specjax_s: specjax's seconds (best of the repeats, compilation excluded); NaN if failed.
      reference_s: the reference's seconds, or None where there is none.
      reference: what the reference is (``NumPy``, or the same entry point without a feature).
      work: the units of work one run does (chain-steps, rows, requests), or None.
      unit: the name of that unit.
      floor: for a sampler, the random-number floor's seconds over specjax's; else None.
      check: what specjax's and the reference's outputs on this run give, side by side (a
        sampler's means with the difference in standard errors ``z``, an exact value's largest
        difference, the requests on which two verifiers agree), or ``""``.
      agree: whether they agree (``|z| < 5``; an exact value within ``1e-4`` relative, float32
        rounding; a verifier on every request), or None where there is nothing to compare.
      error: why the case failed (its exception, one line), or None.
    """

    case: str
    name: str
    size: str
    specjax_s: float
    reference_s: float | None = None
    reference: str = "NumPy"
    work: float | None = None
    unit: str = ""
    floor: float | None = None
    check: str = ""
    agree: bool | None = None
    error: str | None = None

    @property
    def ratio(self) -> float | None:
        """``reference_s / specjax_s`` (above 1: specjax is faster), or None.

        Example:
            >>> from specjax.experiments.bench import Row
            >>> Row("samplers", "SD", "C = 10", specjax_s=0.5, reference_s=2.0).ratio
            4.0
        """
        if self.reference_s is None or not self.specjax_s > 0:
            return None
        return self.reference_s / self.specjax_s


class Result(NamedTuple):
    """A whole bench run: where it ran and its rows.

    Attributes:
      device: the device JAX ran on, in words (``jax.devices()[0]``).
      platform: ``cpu``, ``gpu`` or ``tpu``.
      jax_version: JAX's version.
      specjax_version: specjax's version.
      commit: the git commit of specjax's checkout (``+modified`` if it has uncommitted
        changes), or ``unknown``.
      date: when the run started (UTC, ISO 8601).
      mode: ``default`` or ``quick``.
      cpu_count: the host's CPU cores.
      load: the host's load averages (1, 5, 15 minutes) at the start, or None.
      seconds: the run's wall time.
      sizes: the ``Sizes`` of the run, as a dict.
      rows: the ``Row``s of every case, in order (a case has one or more).
    """

    device: str
    platform: str
    jax_version: str
    specjax_version: str
    commit: str
    date: str
    mode: str
    cpu_count: int
    load: tuple | None
    seconds: float
    sizes: dict
    rows: list


def _fmt_size(**values) -> str:
    return ", ".join(f"{k} = {v:,}" if isinstance(v, int) else f"{k} = {v}"
                     for k, v in values.items())


Z_LIMIT = 5.0  # two samplers of one law agree when their means differ by less than 5 se
RTOL = 1e-4  # two exact values agree within float32 rounding of sums over many terms


class _Last:
    """``fn`` that keeps its last result (``value``): a timed call's output, compared after."""

    def __init__(self, fn):
        self.fn, self.value = fn, None

    def __call__(self, *args):
        self.value = self.fn(*args)
        return self.value


def _means(name: str, ours, theirs) -> tuple[str, bool]:
    """Two samples' means and ``z``, their difference in standard errors."""
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    se = math.sqrt(ours.var() / ours.size + theirs.var() / theirs.size)
    diff = ours.mean() - theirs.mean()
    z = diff / se if se > 0 else (0.0 if diff == 0 else math.inf)
    return (f"mean {name} {ours.mean():.4g} vs {theirs.mean():.4g} (z {z:+.2f})",
            bool(abs(z) < Z_LIMIT))


def _values(name: str, ours, theirs) -> tuple[str, bool]:
    """Two computations of exact values: the largest absolute difference."""
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    diff = float(np.max(np.abs(ours - theirs)))
    scale = max(1.0, float(np.max(np.abs(theirs))))
    return f"{name} max abs diff {diff:.1e}", bool(diff <= RTOL * scale)


def _requests(name: str, same, total: int) -> tuple[str, bool]:
    same = int(np.sum(same))
    return f"{name} agree on {same:,} of {total:,}", same == total


# ----------------------------------------------------------------------------------- cases
class _Chains:
    """Random chain pairs built once per run (``random_markov_chain``, the scripts' keys)."""

    def __init__(self):
        self._pairs = {}

    def pair(self, num_states: int, horizon: int):
        if (num_states, horizon) not in self._pairs:
            key_draft, key_target = jax.random.split(jax.random.key(0))
            pair = (specjax.random_markov_chain(key_draft, num_states, horizon),
                    specjax.random_markov_chain(key_target, num_states, horizon))
            self._pairs[(num_states, horizon)] = jax.block_until_ready(pair)
        return self._pairs[(num_states, horizon)]


def samplers(sizes: Sizes, chains: _Chains) -> Iterator[Row]:
    """SD (``K = T``) and batch SD (``M = 4``) on the paper's instance shape against
    ``references.NumpyDecoder`` (``scripts/benchmark_samplers.py``)."""
    v, t, c = sizes.samplers
    draft, target = specjax.paper_instance(num_states=v, horizon=t)
    key = jax.random.key(0)
    floor = uniform_floor(c, t, sizes.repeats)
    cases = [("SD, K = T", dict(),
              lambda k: specjax.speculative_decoding(k, draft, target, c)),
             ("batch SD, M = 4", dict(num_drafts=4),
              lambda k: specjax.batch_speculative_decoding(k, draft, target, c, num_drafts=4))]
    for name, np_kwargs, run in cases:
        ours = _Last(lambda i, run=run: run(jax.random.fold_in(key, i)).num_rejections)
        t_jax = best_time(ours, sizes.repeats)
        decoder = references.NumpyDecoder(draft, target, **np_kwargs)
        decoder.run(0, min(c, 1000))
        theirs = _Last(lambda i, decoder=decoder: decoder.run(i, c)[1])
        t_np = min(timed(lambda i=i: theirs(i)) for i in range(sizes.numpy_repeats))
        check, agree = _means("rejections", ours.value, theirs.value)
        yield Row("samplers", f"sampler: {name}", _fmt_size(V=v, T=t, C=c), t_jax, t_np,
                  work=c * t, unit="chain-steps", floor=floor / t_jax, check=check,
                  agree=agree)


def theory(sizes: Sizes, chains: _Chains) -> Iterator[Row]:
    """``batch_expected_rejections`` (Theorem 3) under ``jit``, float32 and float64, against
    ``references.numpy_batch_rejections`` in float64 (``scripts/benchmark_theory.py``)."""
    v, t, m = sizes.theory
    draft, target = chains.pair(v, t)
    # The chains in float64, their rows renormalised there (float32 rows sum to one only to
    # float32 rounding, and float64 inputs are checked to float64's).
    init, p_np, q_np = (a / a.sum(-1, keepdims=True) for a in (
        np.asarray(target.init, np.float64), np.asarray(draft.trans, np.float64),
        np.asarray(target.trans, np.float64)))
    draft_init = np.asarray(draft.init, np.float64)
    draft_init = draft_init / draft_init.sum()
    numpy_value = references.numpy_batch_rejections(init, p_np, q_np, m)
    t_numpy = min(timed(lambda: references.numpy_batch_rejections(init, p_np, q_np, m))
                  for _ in range(sizes.numpy_repeats))
    for dtype in ("float32", "float64"):
        with jax.enable_x64(dtype == "float64"):
            d = specjax.MarkovChain(jnp.asarray(draft_init, dtype), jnp.asarray(p_np, dtype))
            tg = specjax.MarkovChain(jnp.asarray(init, dtype), jnp.asarray(q_np, dtype))
            value = jax.jit(lambda d, tg: specjax.batch_expected_rejections(d, tg, num_drafts=m))
            t_value = best_time(lambda i: value(d, tg), sizes.repeats)
            got = float(value(d, tg))
        check, agree = _values("E[rejections]", got, numpy_value)
        yield Row("theory", f"batch_expected_rejections, {dtype} (NumPy float64)",
                  _fmt_size(V=v, T=t, M=m), t_value, t_numpy, check=check, agree=agree)


def sequoia_parents(draft, target, budget: int, max_depth: int) -> tuple:
    """The parents of Sequoia's tree (``sequoia_tree``, ``budget`` nodes, depth at most
    ``max_depth``) on the chains' positional acceptance with 8 children."""
    acceptance = specjax.theory.positional_acceptance(draft, target, num_children=8)
    _, parents = specjax.sequoia_tree(acceptance, budget=budget, max_depth=max_depth)
    return tuple(int(x) for x in parents)


def token_tree(sizes: Sizes, chains: _Chains) -> Iterator[Row]:
    """The token-tree sampler (``decoding_statistics`` with a ``TokenTree`` of i.i.d. children)
    on Sequoia's tree and a uniform tree, against ``references.NumpyTreeSampler``
    (``scripts/benchmark_token_tree.py``)."""
    v, t, c, budget, max_depth, branching = sizes.token_tree
    draft, target = chains.pair(v, t)
    parents = sequoia_parents(draft, target, budget, max_depth)
    uniform = specjax.TokenTree(tuple(branching), children="iid")
    trees = [(f"Sequoia tree ({len(parents)} nodes)",
              specjax.TokenTree.from_parents(parents, children="iid"), parents),
             (f"uniform tree {tuple(branching)} ({uniform.num_nodes} nodes)", uniform,
              uniform.shape.parents)]
    floor = uniform_floor(c, t, sizes.repeats)
    key = jax.random.key(1)
    for name, tree, tree_parents in trees:
        ours = _Last(lambda i, tree=tree: specjax.decoding_statistics(
            jax.random.fold_in(key, i), tree, draft, target, c).num_calls)
        t_jax = best_time(ours, sizes.repeats)
        sampler = references.NumpyTreeSampler(tree_parents, draft, target)
        theirs = _Last(lambda i, sampler=sampler: sampler.run(100 + i, c)[0])
        t_np = min(timed(lambda i=i: theirs(i)) for i in range(sizes.numpy_repeats))
        check, agree = _means("calls", ours.value, theirs.value)
        yield Row("token_tree", f"token-tree sampler: {name}", _fmt_size(V=v, T=t, C=c),
                  t_jax, t_np, work=c * t, unit="chain-steps", floor=floor / t_jax,
                  check=check, agree=agree)


def optimal_acceptance(sizes: Sizes, chains: _Chains) -> Iterator[Row]:
    """``optimal_acceptance`` (i.i.d. drafts) under ``jit`` on many rows against
    ``references.numpy_optimal_acceptance`` in float32
    (``scripts/benchmark_optimal_acceptance.py``)."""
    num_rows, v, drafts = sizes.optimal_acceptance
    rng = np.random.default_rng(0)
    p_np = references.dirichlet_rows(rng, num_rows, v, 0.3, 0.1, np.float64).astype(np.float32)
    q_np = references.dirichlet_rows(rng, num_rows, v, 0.3, 0.1, np.float64).astype(np.float32)
    p, q = jnp.asarray(p_np), jnp.asarray(q_np)
    for m in drafts:
        fn = jax.jit(lambda p, q, m=m: specjax.optimal_acceptance(p, q, num_drafts=m))
        ours = _Last(lambda i, fn=fn: fn(p, q))
        t_jax = best_time(ours, sizes.repeats)
        theirs = _Last(lambda m=m: references.numpy_optimal_acceptance(p_np, q_np, m))
        t_np = min(timed(theirs) for _ in range(sizes.numpy_repeats))
        check, agree = _values("alpha*", ours.value, theirs.value)
        yield Row("optimal_acceptance", f"optimal_acceptance, M = {m}, float32",
                  _fmt_size(rows=num_rows, V=v), t_jax, t_np, work=num_rows, unit="rows",
                  check=check, agree=agree)


def verify(sizes: Sizes, chains: _Chains) -> Iterator[Row]:
    """``verify_drafts`` (SD) as a user calls it and under ``jit`` against
    ``references.numpy_verify`` (``scripts/benchmark_verify.py``)."""
    b, k, v = sizes.verify
    x, p, q, counts, u, w = references.verify_instance(0, b, k, v)
    sd = specjax.Speculative()
    theirs = _Last(lambda: references.numpy_verify(x, p, q, counts, u, w))
    _, t_checked, t_jitted, t_numpy, ours = time_against_numpy(
        lambda x_, p_, q_, c_, u_, v_: specjax.verify_drafts(
            None, sd, x_, p_, q_, num_drafts=c_, uniforms=(u_, v_)).tokens,
        (x, p, q, counts, u, w), theirs, sizes.repeats, sizes.numpy_repeats)
    # The number accepted always agrees; the last token may not at large V in float32 (the
    # inverse CDF's cumulative sums added in another order).
    check, agree = _requests("accepted", (ours != -1).sum(1) - 1 == theirs.value[1], b)
    size = _fmt_size(B=b, K=k, V=v)
    yield Row("verify", "verify_drafts (checked)", size, t_checked, t_numpy, work=b,
              unit="requests", check=check, agree=agree)
    yield Row("verify", "verify_drafts under jit", size, t_jitted, t_numpy, work=b,
              unit="requests", check=check, agree=agree)


def verify_tree(sizes: Sizes, chains: _Chains) -> Iterator[Row]:
    """``verify_tree`` (i.i.d. children) as a user calls it and under ``jit`` against
    ``references.numpy_verify_tree`` (``scripts/benchmark_verify_tree.py``)."""
    b, branching, v = sizes.verify_tree
    tree = specjax.TokenTree(tuple(branching))
    parents = tree.shape.parents
    x, p, q, counts, u, w = references.verify_tree_instance(0, b, parents, v)
    theirs = _Last(lambda: references.numpy_verify_tree(parents, x, p, q, counts, u, w))
    _, t_checked, t_jitted, t_numpy, ours = time_against_numpy(
        lambda x_, p_, q_, c_, u_, v_: specjax.verify_tree(
            None, tree, x_, p_, q_, num_nodes=c_, uniforms=(u_, v_)).tokens,
        (x, p, q, counts, u, w), theirs, sizes.repeats, sizes.numpy_repeats)
    # The accepted path always agrees (its length and its tokens); the last token may not.
    theirs_tokens, accepted = theirs.value
    prefix = np.arange(ours.shape[1])[None] < accepted[:, None]
    same = ((ours != -1).sum(1) - 1 == accepted) & np.all(
        np.where(prefix, ours == theirs_tokens, True), axis=1)
    check, agree = _requests("accepted path", same, b)
    size = _fmt_size(B=b, tree=tuple(branching), V=v)
    yield Row("verify_tree", "verify_tree (checked)", size, t_checked, t_numpy, work=b,
              unit="requests", check=check, agree=agree)
    yield Row("verify_tree", "verify_tree under jit", size, t_jitted, t_numpy, work=b,
              unit="requests", check=check, agree=agree)


def stop_tokens(sizes: Sizes, chains: _Chains) -> Iterator[Row]:
    """``decode`` (SD, ``K = 4``) on the paper's instance with the stop token 6 against the same
    call without stop tokens (``scripts/benchmark_stop_tokens.py``; no NumPy reference). The
    instance is the samplers case's (``V = 7``, ``T = 50`` by default; in ``quick``, ``T = 8``:
    one draw of the chains compiled for both)."""
    c = sizes.stop_tokens
    v, t, _ = sizes.samplers
    draft, target = specjax.paper_instance(num_states=v, horizon=t)
    decoder = specjax.Speculative(4)
    key = jax.random.key(0)

    def timing(stop):
        return best_time(lambda i: specjax.decode(jax.random.fold_in(key, i), decoder, draft,
                                                  target, c, stop_tokens=stop).tokens,
                         sizes.repeats)
    without = timing(None)
    with_stop = timing(6)
    yield Row("stop_tokens", "decode with a stop token", _fmt_size(V=v, T=t, C=c), with_stop,
              without, reference="the same call without stop tokens",
              work=c * target.horizon, unit="chain-steps")


def adaptive(sizes: Sizes, chains: _Chains) -> Iterator[Row]:
    """``theory.optimal_stopping`` (the optimal adaptive draft length) against
    ``references.numpy_optimal_stopping`` in float64, timed once
    (``scripts/benchmark_adaptive.py``)."""
    v, t, k = sizes.adaptive
    draft = specjax.random_markov_chain(jax.random.key(1), v, t)
    target = specjax.random_markov_chain(jax.random.key(2), v, t)
    cost = specjax.CostModel(draft_cost=0.1, target_cost=1.0)
    ours = _Last(lambda i: specjax.theory.optimal_stopping(draft, target, cost,
                                                           max_lookahead=k).expected_time)
    t_jax = best_time(ours, sizes.repeats)
    stop_costs = [cost.call_time(draft_passes=0, tokens_scored=d + 1) for d in range(k + 1)]
    theirs = _Last(lambda: references.numpy_optimal_stopping(
        draft.trans, target.trans, target.init, lookahead=k, draft_cost=cost.draft_cost,
        stop_costs=stop_costs)[0])
    t_np = timed(theirs)
    check, agree = _values("E[time]", ours.value, theirs.value)
    yield Row("adaptive", "optimal_stopping (NumPy float64, one run)",
              _fmt_size(V=v, T=t, K=k), t_jax, t_np, check=check, agree=agree)


def pairs(sizes: Sizes, chains: _Chains) -> Iterator[Row]:
    """``record`` (target rollouts and scoring by two low-rank bigram protocol models) and
    ``estimate`` (SD, ``K = 4``) from it (``scripts/benchmark_pairs.py``; no reference)."""
    v, t, b = sizes.pairs
    draft, target = references.low_rank_pair(v, 16)
    key = jax.random.key(1)
    recording = None

    def run(i):
        nonlocal recording
        recording = specjax.record(jax.random.fold_in(key, i), draft, target, b, horizon=t)
        return recording
    t_record = best_time(run, sizes.repeats)
    size = _fmt_size(V=v, T=t, B=b)
    yield Row("pairs", "record (rollouts + scoring)", size, t_record, reference="",
              work=b * t, unit="tokens")
    decoder = specjax.Speculative(4)
    cost = specjax.CostModel(0.05, 1.0)
    estimate = _Last(lambda i: specjax.estimate(decoder, recording, cost=cost))
    t_estimate = best_time(estimate, sizes.repeats)
    calls = estimate.value
    yield Row("pairs", "estimate, SD K = 4", size, t_estimate, reference="",
              check=f"E[calls] {float(calls.expected_calls):.4g} "
                    f"(se {float(calls.expected_calls_se):.2g})")


def serving(sizes: Sizes, chains: _Chains) -> Iterator[Row]:
    """``theory.goodput`` (SD on the paper's instance, a roofline with an H100-class knee) against
    ``serving_references.numpy_goodput``, and ``theory.allocate_drafts`` against every allocation
    (``numpy_best_allocation``) (``scripts/benchmark_serving.py``)."""
    from specjax.experiments import serving_references  # noqa: PLC0415
    from specjax.theory import serving as _serving  # noqa: PLC0415

    v, t, batch, k, slots = sizes.serving
    draft, target = specjax.paper_instance(num_states=v, horizon=t)
    cost = specjax.ServingCost(0.05, _serving.roofline(1.0, knee=_serving.H100_KNEE,
                                                       size=batch * (k + 1)))
    work = _serving.slot_work(specjax.Speculative(lookahead=k), draft, target)
    ours = _Last(lambda i: _serving.goodput(work, cost, batch_size=batch).tokens_per_time)
    t_jax = best_time(ours, sizes.repeats)
    tables = (cost.draft_times(batch), cost.target_times(batch * (k + 1)))
    theirs = _Last(lambda: serving_references.numpy_goodput(
        np.asarray(work.mass), float(work.calls), float(work.tokens), work.passes, work.scored,
        *tables, batch))
    t_np = min(timed(theirs) for _ in range(max(sizes.numpy_repeats, 1)))
    check, agree = _values("goodput", ours.value, theirs.value)
    yield Row("serving", f"goodput, SD K = {k}", _fmt_size(V=v, T=t, B=batch), t_jax, t_np,
              check=check, agree=agree)
    survival = np.cumprod(np.random.default_rng(0).uniform(0.3, 1.0, (slots, k)), axis=1)
    step_cost = specjax.ServingCost(0.05, _serving.roofline(1.0, knee=2, size=slots * (k + 1)))
    ours = _Last(lambda i: specjax.theory.allocate_drafts(survival, step_cost).tokens_per_time)
    t_jax = best_time(ours, sizes.repeats)
    step_tables = (step_cost.draft_times(slots), step_cost.target_times(slots * (k + 1)))
    theirs = _Last(lambda: serving_references.numpy_best_allocation(survival,
                                                                    *step_tables)[0])
    t_np = min(timed(theirs) for _ in range(max(sizes.numpy_repeats, 1)))
    check, agree = _values("tokens per time", ours.value, theirs.value)
    yield Row("serving", "allocate_drafts (NumPy: every allocation)",
              _fmt_size(B=slots, K=k), t_jax, t_np, check=check, agree=agree)


# Each case is a generator of rows: the rows it finished stay when a later one fails.
CASES: dict[str, Callable[[Sizes, _Chains], Iterator[Row]]] = {
    "samplers": samplers, "theory": theory, "token_tree": token_tree,
    "optimal_acceptance": optimal_acceptance, "verify": verify, "verify_tree": verify_tree,
    "stop_tokens": stop_tokens, "adaptive": adaptive, "pairs": pairs, "serving": serving,
}


# ----------------------------------------------------------------------------------- the run
OUTPUTS = ("bench.md", "bench.json")  # the files ``write`` puts in its folder, in this order


def commit() -> str:
    """The git commit of the checkout specjax is imported from (``+modified`` where tracked
    files have uncommitted changes), or ``unknown`` (an installed copy, no git)."""
    root = pathlib.Path(specjax.__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
                              capture_output=True, text=True, timeout=10)
        if head.returncode != 0 or not head.stdout.strip():
            return "unknown"
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True,
                               timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() + ("+modified" if dirty.stdout.strip() else "")


def device_name() -> str:
    """The first device JAX finds, in words, with how many there are."""
    devices = jax.devices()
    kind = devices[0].device_kind
    return f"{kind} ({devices[0].platform}, {len(devices)} device{'s' * (len(devices) > 1)})"


def _error(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:200]}"


def run(sizes: Sizes | None = None, *, cases=None, mode: str = "default",
        progress: bool = True) -> Result:
    """Runs the cases (default: all of ``CASES``, in order) and returns their rows.

    Each case runs on its own: an exception in one (out of memory, a bug) ends that case with a
    failed row (after the rows it had finished) and the next case runs. Progress goes to
    standard output: a line per case, with its time and ratios.

    Args:
      sizes: the sizes of every case (default ``Sizes()``; ``Sizes.quick()`` for toy sizes).
      cases: names of ``CASES`` to run (default all).
      mode: the name of the sizes, as the table shows it.
      progress: print the progress lines.

    Raises:
      ValueError: a name in ``cases`` that is not a case.
    """
    sizes = Sizes() if sizes is None else sizes
    names = list(CASES) if cases is None else list(cases)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise ValueError(f"cases: unknown {unknown}; the cases are {', '.join(CASES)}")
    start = time.perf_counter()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    try:
        load = tuple(round(x, 2) for x in os.getloadavg())
    except OSError:
        load = None
    device = device_name()
    checkout = commit()  # at the start: the code that runs is the code imported now
    out = sys.stdout if progress else None
    if out is not None:
        print(f"specjax bench ({mode}) on {device}, JAX {jax.__version__}", file=out, flush=True)
    chains = _Chains()
    rows = []
    for i, name in enumerate(names):
        # Between cases (and rows, and repeats): a Ctrl-C of ``python -m specjax bench`` whose
        # KeyboardInterrupt a callback lost ends the run here (``specjax._progress``).
        check_interrupt()
        case_start = time.perf_counter()
        if out is not None:
            print(f"[{i + 1}/{len(names)}] {name} ...", end=" ", file=out, flush=True)
        got = []
        try:
            for row in CASES[name](sizes, chains):
                got.append(row)
                check_interrupt()
            status = "ok"
        except Exception as err:  # noqa: BLE001 - one case failing must not stop the others
            got.append(Row(name, name, "", math.nan, error=_error(err)))
            status = f"FAILED ({got[-1].error})"
        rows.extend(got)
        if out is not None:
            ratios = ", ".join(f"{r.ratio:.2f}x" for r in got if r.ratio is not None)
            print(f"{status} in {time.perf_counter() - case_start:.1f} s"
                  + (f" (ratios {ratios})" if ratios else ""), file=out, flush=True)
    return Result(device=device, platform=jax.devices()[0].platform,
                  jax_version=jax.__version__, specjax_version=specjax.__version__,
                  commit=checkout, date=date, mode=mode, cpu_count=os.cpu_count() or 0,
                  load=load, seconds=time.perf_counter() - start,
                  sizes=dataclasses.asdict(sizes), rows=rows)


def _fmt_time(seconds) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} us"


def _fmt_rate(row: Row) -> str:
    if row.work is None or not row.specjax_s > 0:
        return ""
    rate = row.work / row.specjax_s
    for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if rate >= scale:
            return f"{rate / scale:.3g} {prefix} {row.unit}/s"
    return f"{rate:.3g} {row.unit}/s"


def _command(result: Result) -> str:
    """What made the run: the command for its two modes, else ``run`` with the sizes that differ
    from the defaults (a run from Python, ``run(sizes, mode=...)``)."""
    if result.mode in ("default", "quick"):
        return f"`python -m specjax bench{' --quick' if result.mode == 'quick' else ''}`"
    defaults = dataclasses.asdict(Sizes())
    changed = ", ".join(f"{k}={v!r}" for k, v in result.sizes.items() if defaults.get(k) != v)
    return f"`specjax.experiments.bench.run` ({result.mode}: {changed or 'the default sizes'})"


def markdown(result: Result) -> str:
    """The run as Markdown: a header line (device, versions, commit, date, load) and one table."""
    load = "" if result.load is None else f", load average {result.load[0]:.2f}"
    lines = [f"{_command(result)} on {result.device}; JAX {result.jax_version}, "
             f"specjax {result.specjax_version}, commit {result.commit}; {result.date}; "
             f"{result.cpu_count} CPU cores{load}; {result.seconds:.0f} s in all.",
             "",
             "| case | what | size | specjax | reference | ratio | % floor | specjax rate "
             "| outputs |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in result.rows:
        if r.error is not None:
            lines.append(f"| {r.case} | failed: {r.error.replace('|', '/')} | | | | | | | |")
            continue
        ref = "-" if r.reference_s is None else f"{_fmt_time(r.reference_s)} ({r.reference})"
        ratio = "" if r.ratio is None else f"{r.ratio:.2f}x"
        floor = "" if r.floor is None else f"{100 * r.floor:.{0 if r.floor >= 0.01 else 2}f}%"
        check = r.check + {None: "", True: "", False: " **DISAGREE**"}[r.agree]
        lines.append(f"| {r.case} | {r.name} | {r.size} | {_fmt_time(r.specjax_s)} | {ref} | "
                     f"{ratio} | {floor} | {_fmt_rate(r)} | {check} |")
    lines += ["",
              "specjax: best of the repeats, compilation excluded, on the device above; the "
              "reference on the same run (NumPy on the host). ratio: reference time / specjax "
              "time (above 1: specjax is faster). % floor: the time to draw one uniform per "
              "chain-step in a scan over specjax's time. outputs: what the two computed on this "
              f"run, side by side (z: the difference in standard errors; |z| < {Z_LIMIT:g} "
              "agrees)."]
    return "\n".join(lines) + "\n"


def to_json(result: Result) -> dict:
    """The run as a JSON-ready dict (times in seconds; NaN as null)."""
    def clean(x):
        return None if isinstance(x, float) and not math.isfinite(x) else x
    out = result._asdict()
    out["rows"] = [{**{k: clean(v) for k, v in r._asdict().items()}, "ratio": clean(r.ratio)}
                   for r in result.rows]
    return out


def check_out_dir(out_dir) -> pathlib.Path:
    """``out_dir`` as a path, checked before any work (``python -m specjax bench`` checks
    ``--out`` with it): a writable folder, or one that can be created, with no folder where
    ``bench.md`` or ``bench.json`` goes (``reproduce.check_out_dir``).

    Raises:
      ValueError: saying why.
    """
    from specjax.experiments import reproduce  # noqa: PLC0415
    return reproduce.check_out_dir(out_dir, OUTPUTS, "bench")


def write(result: Result, out_dir) -> tuple[pathlib.Path, pathlib.Path]:
    """Writes ``bench.md`` and ``bench.json`` into ``out_dir`` (created if needed), each file
    whole and both or neither (``report.write_texts``); returns their paths.

    Raises:
      ValueError: ``out_dir`` is not a writable folder (``check_out_dir``), or a file could not
        be written (neither is then, as far as the file system allows).
    """
    from specjax.experiments import reproduce  # noqa: PLC0415
    folder = reproduce.make_out_dir(out_dir, OUTPUTS, "bench")
    md, js = folder / OUTPUTS[0], folder / OUTPUTS[1]
    texts = {md: markdown(result), js: json.dumps(to_json(result), indent=2) + "\n"}
    try:
        report.write_texts(texts)
    except OSError as err:
        raise ValueError(f"out_dir {str(folder)!r}: bench.md and bench.json could not be "
                         f"written ({err.strerror or err})") from None
    return md, js
