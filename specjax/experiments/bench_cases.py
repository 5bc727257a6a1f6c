"""The cases of ``python -m specjax bench`` (``specjax.experiments.bench``): each times a public
specjax entry point beside its reference (``specjax.experiments.references``, the NumPy code the
scripts ``scripts/benchmark_*.py`` use) in the same process, the two taken in turn
(``bench_timing.measure``), and compares what the two computed. ``Sizes`` holds every case's
sizes, ``Row`` one line of the table, ``CASES`` the cases in order.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable
from typing import Iterator
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import specjax
from specjax.experiments import references
from specjax.experiments.bench_timing import Samples
from specjax.experiments.bench_timing import floor_samples
from specjax.experiments.bench_timing import measure
from specjax.experiments.bench_timing import verify_samples

__all__ = [
    "CASES",
    "Check",
    "RTOL",
    "Row",
    "Sizes",
    "Z_LIMIT",
    "adaptive",
    "optimal_acceptance",
    "pairs",
    "samplers",
    "sequoia_parents",
    "serving",
    "stop_tokens",
    "theory",
    "token_tree",
    "verify",
    "verify_tree",
]


# ----------------------------------------------------------------------------------- sizes
@dataclasses.dataclass(frozen=True)
class Sizes:
    """The sizes of every case. The default is each script's headline setting, but for:

    * ``theory``: ``V = 256`` (the script's default is 512), on the token-tree benchmark's two
      random chains (built once for both; at ``V = 512`` the chains alone take over a minute
      on a 2-core CPU);
    * ``adaptive``: ``K = 4`` (the script's default ``K = 6`` keeps NumPy busy for minutes);
    * ``pairs``: the script's ``--quick`` sizes (``V = 2,000``, ``T = 64``, ``B = 100``);
    * the repeats: specjax's time is sampled ``repeats`` times after a warm-up call (which
      compiles; its time is kept as the first call's), NumPy's ``numpy_repeats`` times (no
      warm-up: it compiles nothing), the two in turn (``bench_timing.measure``).
    """

    repeats: int = 5
    numpy_repeats: int = 5
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
        """Toy sizes: every case end to end in seconds of run time (plus compilation), three
        repeats. The adaptive case's chains have the theory case's shape (``V = 16``,
        ``T = 6``), so their draw is one compiled program."""
        return cls(repeats=3, numpy_repeats=3, samplers=(7, 8, 2_000), theory=(16, 6, 3),
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
      size: its sizes, named (``{"V": 7, "T": 50, "C": 200000}``), or in words.
      specjax_s: specjax's median seconds (compilation excluded); NaN if failed.
      reference_s: the reference's median seconds, or None where there is none.
      reference: what the reference is (``NumPy``, or specjax without a feature).
      work: the units of work one run does (chain-steps, rows, requests), or None.
      unit: the name of that unit.
      floor: for a sampler, the random-number floor's median seconds over specjax's; else None.
      check: what specjax's and the reference's outputs on this run give, side by side (a
        sampler's means with the difference in standard errors ``z``, an exact value's largest
        difference, the requests on which two verifiers agree), or ``""``.
      agree: whether they agree (``|z| < 5``; an exact value within ``1e-4`` relative, float32
        rounding; a verifier on every request), or None where there is nothing to compare.
      error: why the case failed (its exception, one line), or None.
      timing: specjax's ``Samples`` (every run), or None (then ``specjax_s`` is the one time).
      reference_timing: the reference's ``Samples``, or None.
      reference_kind: ``numpy`` (a NumPy reference) or ``specjax`` (specjax itself without the
        feature timed: the ratio is then the feature's cost, not a speed-up over NumPy).
      check_fields: the numbers of ``check`` (``z``, the means, a difference, counts), or None.
    """

    case: str
    name: str
    size: dict | str
    specjax_s: float
    reference_s: float | None = None
    reference: str = "NumPy"
    work: float | None = None
    unit: str = ""
    floor: float | None = None
    check: str = ""
    agree: bool | None = None
    error: str | None = None
    timing: Samples | None = None
    reference_timing: Samples | None = None
    reference_kind: str = "numpy"
    check_fields: dict | None = None

    @property
    def ratio(self) -> float | None:
        """``reference_s / specjax_s`` (against NumPy, above 1: specjax is faster), or None.

        Example:
            >>> from specjax.experiments.bench import Row
            >>> Row("samplers", "SD", "C = 10", specjax_s=0.5, reference_s=2.0).ratio
            4.0
        """
        if self.reference_s is None or not self.specjax_s > 0:
            return None
        return self.reference_s / self.specjax_s


class Check(NamedTuple):
    """What two computations of one quantity gave: in words, whether they agree, the numbers."""

    text: str
    agree: bool | None
    fields: dict

    def row(self) -> dict:
        """``Row``'s keyword arguments for the check."""
        return {"check": self.text, "agree": self.agree, "check_fields": self.fields}


def _row(case, name, size, ours: Samples, theirs: Samples | None = None,
         check: Check | None = None, **kwargs) -> Row:
    return Row(case, name, size, ours.median, None if theirs is None else theirs.median,
               timing=ours, reference_timing=theirs, **(check.row() if check else {}), **kwargs)


Z_LIMIT = 5.0  # two samplers of one law agree when their means differ by less than 5 se
RTOL = 1e-4  # two exact values agree within float32 rounding of sums over many terms


class _Last:
    """``fn`` that keeps its last result (``value``): a timed call's output, compared after."""

    def __init__(self, fn):
        self.fn, self.value = fn, None

    def __call__(self, *args):
        self.value = self.fn(*args)
        return self.value


def _means(name: str, ours, theirs) -> Check:
    """Two samples' means and ``z``, their difference in standard errors."""
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    se = math.sqrt(ours.var() / ours.size + theirs.var() / theirs.size)
    diff = ours.mean() - theirs.mean()
    z = diff / se if se > 0 else (0.0 if diff == 0 else math.inf)
    return Check(f"mean {name} {ours.mean():.4g} vs {theirs.mean():.4g} (z {z:+.2f})",
                 bool(abs(z) < Z_LIMIT),
                 {"kind": "means", "quantity": name, "specjax_mean": float(ours.mean()),
                  "reference_mean": float(theirs.mean()), "z": float(z), "z_limit": Z_LIMIT})


def _values(name: str, ours, theirs) -> Check:
    """Two computations of exact values: the largest absolute difference."""
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    diff = float(np.max(np.abs(ours - theirs)))
    scale = max(1.0, float(np.max(np.abs(theirs))))
    return Check(f"{name} max abs diff {diff:.1e}", bool(diff <= RTOL * scale),
                 {"kind": "values", "quantity": name, "max_abs_diff": diff,
                  "limit": RTOL * scale})


def _requests(name: str, same, total: int) -> Check:
    same = int(np.sum(same))
    return Check(f"{name} agree on {same:,} of {total:,}", same == total,
                 {"kind": "requests", "quantity": name, "same": same, "total": total})


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


def _reps(sizes: Sizes) -> tuple[list, list]:
    """``measure``'s counts and warm-ups for (specjax, NumPy)."""
    return [sizes.repeats, sizes.numpy_repeats], [True, False]


def samplers(sizes: Sizes, chains: _Chains) -> Iterator[Row]:
    """SD (``K = T``) and batch SD (``M = 4``) on the paper's instance shape against
    ``references.NumpyDecoder`` (``scripts/benchmark_samplers.py``)."""
    v, t, c = sizes.samplers
    draft, target = specjax.paper_instance(num_states=v, horizon=t)
    key = jax.random.key(0)
    floor = floor_samples(c, t, sizes.repeats)
    cases = [("SD, K = T", dict(),
              lambda k: specjax.speculative_decoding(k, draft, target, c)),
             ("batch SD, M = 4", dict(num_drafts=4),
              lambda k: specjax.batch_speculative_decoding(k, draft, target, c, num_drafts=4))]
    for name, np_kwargs, run in cases:
        ours = _Last(lambda i, run=run: run(jax.random.fold_in(key, i)).num_rejections)
        decoder = references.NumpyDecoder(draft, target, **np_kwargs)
        decoder.run(0, min(c, 1000))
        theirs = _Last(lambda i, decoder=decoder: decoder.run(i, c)[1])
        t_jax, t_np = measure([ours, theirs], *_reps(sizes))
        yield _row("samplers", f"sampler: {name}", dict(V=v, T=t, C=c), t_jax, t_np,
                   _means("rejections", ours.value, theirs.value), work=c * t,
                   unit="chain-steps", floor=floor.median / t_jax.median)


def theory(sizes: Sizes, chains: _Chains) -> Iterator[Row]:
    """``batch_expected_rejections`` (Theorem 3) under ``jit``, float32 and float64, against
    ``references.numpy_batch_rejections`` in float64 (``scripts/benchmark_theory.py``): the three
    taken in turn, both rows against the same NumPy samples."""
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
    fns, values = [], {}
    for dtype in ("float32", "float64"):
        with jax.enable_x64(dtype == "float64"):
            d = specjax.MarkovChain(jnp.asarray(draft_init, dtype), jnp.asarray(p_np, dtype))
            tg = specjax.MarkovChain(jnp.asarray(init, dtype), jnp.asarray(q_np, dtype))
            value = jax.jit(lambda d, tg: specjax.batch_expected_rejections(d, tg, num_drafts=m))

        def call(i, value=value, d=d, tg=tg, dtype=dtype):
            with jax.enable_x64(dtype == "float64"):
                values[dtype] = value(d, tg)
                return values[dtype]
        fns.append(call)
    fns.append(lambda i: references.numpy_batch_rejections(init, p_np, q_np, m))
    t32, t64, t_numpy = measure(fns, [sizes.repeats, sizes.repeats, sizes.numpy_repeats],
                                [True, True, False])
    for dtype, t_value in (("float32", t32), ("float64", t64)):
        yield _row("theory", f"batch_expected_rejections, {dtype} (NumPy float64)",
                   dict(V=v, T=t, M=m), t_value, t_numpy,
                   _values("E[rejections]", float(values[dtype]), numpy_value))


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
    floor = floor_samples(c, t, sizes.repeats)
    key = jax.random.key(1)
    for name, tree, tree_parents in trees:
        ours = _Last(lambda i, tree=tree: specjax.decoding_statistics(
            jax.random.fold_in(key, i), tree, draft, target, c).num_calls)
        sampler = references.NumpyTreeSampler(tree_parents, draft, target)
        theirs = _Last(lambda i, sampler=sampler: sampler.run(100 + i, c)[0])
        t_jax, t_np = measure([ours, theirs], *_reps(sizes))
        yield _row("token_tree", f"token-tree sampler: {name}", dict(V=v, T=t, C=c), t_jax,
                   t_np, _means("calls", ours.value, theirs.value), work=c * t,
                   unit="chain-steps", floor=floor.median / t_jax.median)


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
        theirs = _Last(lambda i, m=m: references.numpy_optimal_acceptance(p_np, q_np, m))
        t_jax, t_np = measure([ours, theirs], *_reps(sizes))
        yield _row("optimal_acceptance", f"optimal_acceptance, M = {m}, float32",
                   dict(rows=num_rows, V=v), t_jax, t_np,
                   _values("alpha*", ours.value, theirs.value), work=num_rows, unit="rows")


def verify(sizes: Sizes, chains: _Chains) -> Iterator[Row]:
    """``verify_drafts`` (SD) as a user calls it and under ``jit`` against
    ``references.numpy_verify`` (``scripts/benchmark_verify.py``)."""
    b, k, v = sizes.verify
    x, p, q, counts, u, w = references.verify_instance(0, b, k, v)
    sd = specjax.Speculative()
    theirs = _Last(lambda: references.numpy_verify(x, p, q, counts, u, w))
    t_checked, t_jitted, t_numpy, ours = verify_samples(
        lambda x_, p_, q_, c_, u_, v_: specjax.verify_drafts(
            None, sd, x_, p_, q_, num_drafts=c_, uniforms=(u_, v_)).tokens,
        (x, p, q, counts, u, w), theirs, sizes.repeats, sizes.numpy_repeats)
    # The number accepted always agrees; the last token may not at large V in float32 (the
    # inverse CDF's cumulative sums added in another order).
    check = _requests("accepted", (ours != -1).sum(1) - 1 == theirs.value[1], b)
    size = dict(B=b, K=k, V=v)
    yield _row("verify", "verify_drafts (checked)", size, t_checked, t_numpy, check, work=b,
               unit="requests")
    yield _row("verify", "verify_drafts under jit", size, t_jitted, t_numpy, check, work=b,
               unit="requests")


def verify_tree(sizes: Sizes, chains: _Chains) -> Iterator[Row]:
    """``verify_tree`` (i.i.d. children) as a user calls it and under ``jit`` against
    ``references.numpy_verify_tree`` (``scripts/benchmark_verify_tree.py``)."""
    b, branching, v = sizes.verify_tree
    tree = specjax.TokenTree(tuple(branching))
    parents = tree.shape.parents
    x, p, q, counts, u, w = references.verify_tree_instance(0, b, parents, v)
    theirs = _Last(lambda: references.numpy_verify_tree(parents, x, p, q, counts, u, w))
    t_checked, t_jitted, t_numpy, ours = verify_samples(
        lambda x_, p_, q_, c_, u_, v_: specjax.verify_tree(
            None, tree, x_, p_, q_, num_nodes=c_, uniforms=(u_, v_)).tokens,
        (x, p, q, counts, u, w), theirs, sizes.repeats, sizes.numpy_repeats)
    # The accepted path always agrees (its length and its tokens); the last token may not.
    theirs_tokens, accepted = theirs.value
    prefix = np.arange(ours.shape[1])[None] < accepted[:, None]
    same = ((ours != -1).sum(1) - 1 == accepted) & np.all(
        np.where(prefix, ours == theirs_tokens, True), axis=1)
    check = _requests("accepted path", same, b)
    size = dict(B=b, tree=list(branching), V=v)
    yield _row("verify_tree", "verify_tree (checked)", size, t_checked, t_numpy, check,
               work=b, unit="requests")
    yield _row("verify_tree", "verify_tree under jit", size, t_jitted, t_numpy, check,
               work=b, unit="requests")


def stop_tokens(sizes: Sizes, chains: _Chains) -> Iterator[Row]:
    """``decode`` (SD, ``K = 4``) on the paper's instance with the stop token 6 against the same
    call without stop tokens (``scripts/benchmark_stop_tokens.py``): specjax against itself, not
    against NumPy; its ratio (without / with) is the stop token's cost (below 1: the call with a
    stop token is slower). The instance is the samplers case's (``V = 7``, ``T = 50`` by default;
    in ``quick``, ``T = 8``: one draw of the chains compiled for both)."""
    c = sizes.stop_tokens
    v, t, _ = sizes.samplers
    draft, target = specjax.paper_instance(num_states=v, horizon=t)
    decoder = specjax.Speculative(4)
    key = jax.random.key(0)

    def timing(stop):
        return lambda i: specjax.decode(jax.random.fold_in(key, i), decoder, draft, target, c,
                                        stop_tokens=stop).tokens
    with_stop, without = measure([timing(6), timing(None)], sizes.repeats)
    yield _row("stop_tokens", "decode with a stop token (vs specjax without)",
               dict(V=v, T=t, C=c), with_stop, without,
               reference="specjax without stop tokens", reference_kind="specjax",
               work=c * target.horizon, unit="chain-steps")


def adaptive(sizes: Sizes, chains: _Chains) -> Iterator[Row]:
    """``theory.optimal_stopping`` (the optimal adaptive draft length) against
    ``references.numpy_optimal_stopping`` in float64 (``scripts/benchmark_adaptive.py``)."""
    v, t, k = sizes.adaptive
    draft = specjax.random_markov_chain(jax.random.key(1), v, t)
    target = specjax.random_markov_chain(jax.random.key(2), v, t)
    cost = specjax.CostModel(draft_cost=0.1, target_cost=1.0)
    ours = _Last(lambda i: specjax.theory.optimal_stopping(draft, target, cost,
                                                           max_lookahead=k).expected_time)
    stop_costs = [cost.call_time(draft_passes=0, tokens_scored=d + 1) for d in range(k + 1)]
    theirs = _Last(lambda i: references.numpy_optimal_stopping(
        draft.trans, target.trans, target.init, lookahead=k, draft_cost=cost.draft_cost,
        stop_costs=stop_costs)[0])
    t_jax, t_np = measure([ours, theirs], *_reps(sizes))
    yield _row("adaptive", "optimal_stopping (NumPy float64)", dict(V=v, T=t, K=k), t_jax,
               t_np, _values("E[time]", ours.value, theirs.value))


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
    t_record, = measure([run], sizes.repeats)
    size = dict(V=v, T=t, B=b)
    yield _row("pairs", "record (rollouts + scoring)", size, t_record, reference="",
               reference_kind="", work=b * t, unit="tokens")
    decoder = specjax.Speculative(4)
    cost = specjax.CostModel(0.05, 1.0)
    estimate = _Last(lambda i: specjax.estimate(decoder, recording, cost=cost))
    t_estimate, = measure([estimate], sizes.repeats)
    calls = estimate.value
    mean, se = float(calls.expected_calls), float(calls.expected_calls_se)
    yield _row("pairs", "estimate, SD K = 4", size, t_estimate, reference="",
               reference_kind="", check=Check(f"E[calls] {mean:.4g} (se {se:.2g})", None,
                                              {"kind": "estimate", "quantity": "E[calls]",
                                               "value": mean, "se": se}))


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
    tables = (cost.draft_times(batch), cost.target_times(batch * (k + 1)))
    theirs = _Last(lambda i: serving_references.numpy_goodput(
        np.asarray(work.mass), float(work.calls), float(work.tokens), work.passes, work.scored,
        *tables, batch))
    t_jax, t_np = measure([ours, theirs], *_reps(sizes))
    yield _row("serving", f"goodput, SD K = {k}", dict(V=v, T=t, B=batch), t_jax, t_np,
               _values("goodput", ours.value, theirs.value))
    survival = np.cumprod(np.random.default_rng(0).uniform(0.3, 1.0, (slots, k)), axis=1)
    step_cost = specjax.ServingCost(0.05, _serving.roofline(1.0, knee=2, size=slots * (k + 1)))
    ours = _Last(lambda i: specjax.theory.allocate_drafts(survival, step_cost).tokens_per_time)
    step_tables = (step_cost.draft_times(slots), step_cost.target_times(slots * (k + 1)))
    theirs = _Last(lambda i: serving_references.numpy_best_allocation(survival,
                                                                      *step_tables)[0])
    t_jax, t_np = measure([ours, theirs], *_reps(sizes))
    yield _row("serving", "allocate_drafts (NumPy: every allocation)", dict(B=slots, K=k),
               t_jax, t_np, _values("tokens per time", ours.value, theirs.value))


# Each case is a generator of rows: the rows it finished stay when a later one fails.
CASES: dict[str, Callable[[Sizes, _Chains], Iterator[Row]]] = {
    "samplers": samplers, "theory": theory, "token_tree": token_tree,
    "optimal_acceptance": optimal_acceptance, "verify": verify, "verify_tree": verify_tree,
    "stop_tokens": stop_tokens, "adaptive": adaptive, "pairs": pairs, "serving": serving,
}
