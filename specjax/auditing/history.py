"""Penalties and grammar masks under SD as engines keep them: the correct bookkeeping and the bug
classes engines shipped, with the exact law of the output and a sequence-level test.

A processed model (``specjax.models.penalize``, ``specjax.models.constrain``) is a finite-state
model whose state holds the processor's state (the penalty counts, the grammar's state), advanced
by every emitted token: SD on it is lossless. Engines keep the processor's state apart from the
model (its KV cache) and update it themselves; the bugs are in that bookkeeping, so they cannot be
a model of the protocol (whose state moves on emitted tokens only) nor a verification rule
(verification of the rows handed to it is right; the rows are wrong). They are options of an
engine loop, ``sample_history`` (Monte Carlo) and ``history_law`` (its exact law over sequences,
enumerated), which holds the model states and the processor's *committed* state ``c`` apart:

* ``rows``: the processor state of the target's row at draft position ``j`` of a call:
  ``"per_position"`` (correct: ``c`` advanced over the drafts ``d_1..d_{j-1}``, as vLLM combines
  the output with the speculative tokens, vllm-project/vllm#19482, and as lmdeploy forks the
  grammar matcher across the positions) or ``"call_start"`` (``c`` at every position of the call:
  SGLang's "relaxed" speculative penalties, which apply the accumulated penalties to all verify
  positions, sgl-project/sglang#22049 and #28242, and the grammar bitmask of a window prepared
  with the step's starting state, vllm-project/vllm#44297).
* ``record``: which tokens advance ``c`` after a call: ``"accepted"`` (correct: every emitted
  token), ``"last"`` (only the call's last emitted token: SGLang's
  ``cumulate_penalty_output_tokens`` fed ``req.output_ids[-1]``, one token per step,
  sgl-project/sglang#33643) or ``"drafted"`` (every drafted token, rejected or never verified
  included, then the last emitted token: the draft loop of vmlx-swift recorded every proposed
  token into the shared penalty counts, osaurus-ai/vmlx-swift#357; that loop also recorded the
  verify positions' samples and the accepted drafts again, which this option leaves out to
  isolate the class).
* ``draft_processing``: the draft's rows, processed (a ``Penalties`` or ``Grammar`` on the same
  processor automaton: ``c`` advanced over its own drafts) or not (``None``). An unmasked draft
  under a masked target (ollama/ollama#18105 keeps drafts unconstrained and masks every verify
  position) is **lossless**: a draft outside the grammar has target mass zero and is rejected
  with probability one, so the output law stays the masked target's and only acceptance is lost
  (``specjax.exact`` gives the loss on ``constrain``'ed models).

The engine is SD (``specjax.Speculative(lookahead=K)``): draft ``K`` tokens (fewer near the horizon:
``min(K, T - n - 1)`` after ``n`` emitted tokens), accept ``d_j`` with probability
``min(1, q_j / p_j)``, on the first rejection emit a token of the residual ``[q_j - p_j]_+``, else
the bonus token from ``q``. ``x_0`` comes from the target's first processed row. Both models'
own states advance on the emitted tokens only (their KV caches are right).
"""

from __future__ import annotations

import functools
import itertools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax.auditing.audit import check_alpha
from specjax.auditing.compare import check_min_variance
from specjax.auditing.compare import generalised_chi2_test
from specjax.auditing.compare import is_tested
from specjax.models import processing
from specjax.models.autoregressive import check_table_size
from specjax.models.finite_state import FiniteStateModel

__all__ = ["ROWS", "RECORDS", "SequenceFit", "SequenceLaw", "history_law", "sample_history",
           "sequence_fit", "sequence_law"]

#: The ``rows`` options: correct first.
ROWS = ("per_position", "call_start")
#: The ``record`` options: correct first.
RECORDS = ("accepted", "last", "drafted")
#: Largest number of sequences ``V^(T + 1)`` the exact laws enumerate.
MAX_SEQUENCES = 2**20


class SequenceLaw(NamedTuple):
    """A law over the sequences ``x_0..x_T``.

    Attributes:
      sequences: ``(V^(T + 1), T + 1)`` every sequence, in lexicographic order (row ``i`` is
        ``i`` written in base ``V``).
      probs: ``(V^(T + 1),)`` float64 probabilities.
    """

    sequences: np.ndarray
    probs: np.ndarray

    def total_variation(self, other: "SequenceLaw") -> float:
        """``sum |P - Q| / 2`` over sequences."""
        return float(0.5 * np.abs(self.probs - other.probs).sum())

    def chi_square_divergence(self, reference: "SequenceLaw") -> float:
        """``sum (P - Q)^2 / Q`` against ``reference`` ``Q`` (infinite where ``P`` puts mass
        outside ``Q``'s support): the noncentrality per sample of Pearson's statistic."""
        q, p = reference.probs, self.probs
        if np.any((q <= 0) & (p > 0)):
            return float("inf")
        keep = q > 0
        return float(((p[keep] - q[keep]) ** 2 / q[keep]).sum())


class SequenceFit(NamedTuple):
    """What ``sequence_fit`` found.

    Attributes:
      flagged: an impossible sequence, or ``pvalue < alpha``.
      pvalue: Pearson's chi-square p-value of the sequence counts (categories of small variance
        pooled as ``compare_outputs`` pools them).
      impossible: sequences observed whose probability is zero.
      num_sequences: sequences tested.
      alpha: the false-alarm rate (asymptotic).
      tested: whether the verdict rests on a test. False when ``min_variance`` pooled every
        sequence away although the law is random (too few samples for it) and no sequence is
        impossible: then ``flagged`` is False without any evidence (``pvalue`` 1 with zero
        degrees of freedom).
    """

    flagged: bool
    pvalue: float
    impossible: int
    num_sequences: int
    alpha: float
    tested: bool = True


def _check_sizes(num_states: int, horizon: int) -> None:
    _checks.check_positive_int("horizon", horizon)
    if num_states ** (horizon + 1) > MAX_SEQUENCES:
        raise ValueError(f"V^(T + 1) = {num_states}^{horizon + 1} sequences is above "
                         f"MAX_SEQUENCES = 2**20; use a smaller horizon")


def _all_sequences(num_states: int, horizon: int) -> np.ndarray:
    return np.array(list(itertools.product(range(num_states), repeat=horizon + 1)), np.int64) \
        .reshape(-1, horizon + 1)


def _codes(tokens: np.ndarray, num_states: int) -> np.ndarray:
    return (tokens.astype(np.int64) * num_states ** np.arange(tokens.shape[-1])[::-1]).sum(-1)


def sequence_law(model, horizon: int) -> SequenceLaw:
    """The exact law of ``x_0..x_T`` under a ``FiniteStateModel`` (a processed model's law: the
    correct output of any lossless decoder), enumerated.

    Example:
      >>> import jax.numpy as jnp, specjax
      >>> from specjax.auditing.history import sequence_law
      >>> m = specjax.FiniteStateModel(0, jnp.zeros((1, 2), int), jnp.array([[0.25, 0.75]]))
      >>> sequence_law(m, 1).probs.tolist()
      [0.0625, 0.1875, 0.1875, 0.5625]
    """
    if not isinstance(model, FiniteStateModel):
        raise ValueError(f"model must be a FiniteStateModel, got {type(model).__name__}")
    v = model.num_states
    _check_sizes(v, horizon)
    table = np.asarray(model.table, np.float64)
    nxt = np.asarray(model.next_state, np.int64)
    probs = table[model.start].copy()
    states = nxt[model.start].copy()
    for _ in range(horizon):
        probs = (probs[:, None] * table[states]).reshape(-1)
        states = nxt[states].reshape(-1)
    return SequenceLaw(_all_sequences(v, horizon), probs)


def sequence_fit(tokens, law: SequenceLaw, *, alpha: float = 1e-3,
                 min_variance: float = 5.0) -> SequenceFit:
    """Goodness of fit of sampled sequences ``tokens (N, T + 1)`` to ``law``.

    Flags an impossible sequence (proof of a bug) or a chi-square p-value below ``alpha`` (a
    correct sampler is flagged with probability about ``alpha``). Its power at ``N`` samples of
    a law ``P`` against ``Q`` is that of a noncentral chi-square with noncentrality ``N
    chi2(P || Q)`` (``SequenceLaw.chi_square_divergence``; at least ``4 N TV^2``).

    ``min_variance`` (a positive finite number): sequences whose count has a smaller variance
    are pooled, as ``compare_outputs`` pools categories; when it pools every sequence away (too
    few samples for it) the result's ``tested`` is False: no verdict, not a pass.

    Raises:
      ValueError: ``tokens`` not ``(N, T + 1)`` ids of the law's ``V`` and ``T``, ``alpha``
        outside ``(0, 1)``, ``min_variance`` not a positive finite number (an infinite one
        would pool every sequence away); before any work.
    """
    alpha = check_alpha(alpha)
    min_variance = check_min_variance(min_variance)
    if not isinstance(law, SequenceLaw):
        raise ValueError(f"law must be a SequenceLaw (specjax.auditing.sequence_law), got "
                         f"{type(law).__name__}")
    out = np.asarray(tokens)
    length = law.sequences.shape[1]
    num_states = int(law.sequences.max()) + 1
    if out.ndim != 2 or out.shape[1] != length or out.shape[0] < 1 \
            or not np.issubdtype(out.dtype, np.integer) or out.min() < 0 \
            or out.max() >= num_states:
        raise ValueError(f"tokens must be (N, T + 1 = {length}) ids in [0, {num_states}), got "
                         f"{out.dtype} {out.shape}")
    counts = np.bincount(_codes(out, num_states), minlength=law.probs.size)
    impossible = int(counts[law.probs <= 0].sum())
    laws = np.clip(law.probs, 0, None)[None] / law.probs.sum()
    _, dof, pvalue = generalised_chi2_test(laws, counts, out.shape[0], min_variance)
    return SequenceFit(bool(impossible > 0 or pvalue < alpha), float(pvalue), impossible,
                       int(out.shape[0]), alpha, impossible > 0 or is_tested([dof], [laws]))


class _Engine(NamedTuple):
    draft_rows: jax.Array   # (S_d P, V)
    target_rows: jax.Array  # (S_t P, V)
    draft_next: np.ndarray  # (S_d, V)
    target_next: np.ndarray  # (S_t, V)
    processor_next: np.ndarray  # (P, V)
    num_processor: int
    starts: tuple  # (s_d, s_t, c)


def _processed_rows(model, spec, processor_num, seen_counts):
    """``(S, P, V)`` rows of ``model`` under ``spec`` (``None``: unprocessed, tiled)."""
    if spec is None:
        return jnp.broadcast_to(model.table[:, None, :], (model.table.shape[0], processor_num,
                                                          model.table.shape[1]))
    if isinstance(spec, processing.Penalties):
        return processing.penalized_rows(processing.safe_log(model.table), spec, *seen_counts)
    return processing.masked_rows(model.table, spec.allowed)


def _engine(draft, target, target_processing, draft_processing, horizon, lookahead, rows,
            record) -> _Engine:
    draft = processing.check_model("draft", draft)
    target = processing.check_model("target", target)
    v = target.num_states
    if draft.num_states != v:
        raise ValueError(f"draft and target must have the same V, got {draft.num_states} and {v}")
    _check_sizes(v, horizon)
    _checks.check_positive_int("lookahead", lookahead)
    if rows not in ROWS:
        raise ValueError(f"rows must be one of {ROWS}, got {rows!r}")
    if record not in RECORDS:
        raise ValueError(f"record must be one of {RECORDS}, got {record!r}")
    seen_counts = None
    if isinstance(target_processing, processing.Penalties):
        spec = processing.check_penalties(target_processing, v)
        proc, *seen_counts = processing.penalty_processor(v, spec.cap)
        if draft_processing is not None:
            draft_processing = processing.check_penalties(draft_processing, v)
            if draft_processing.cap != spec.cap:
                raise ValueError(f"draft_processing.cap must be target_processing's "
                                 f"{spec.cap}, got {draft_processing.cap}")
    elif isinstance(target_processing, processing.Grammar):
        spec = processing.check_grammar(target_processing, v)
        proc = processing.Processor(spec.allowed.shape[0], spec.start, spec.transitions)
        if draft_processing is not None:
            draft_processing = processing.check_grammar(draft_processing, v)
            if draft_processing.start != spec.start or not np.array_equal(
                    draft_processing.transitions, spec.transitions):
                raise ValueError("draft_processing must be a Grammar with target_processing's "
                                 "transitions and start")
    else:
        raise ValueError(f"target_processing must be a specjax.models.Penalties or Grammar, got "
                         f"{type(target_processing).__name__}")
    num = proc.num
    for name, model in (("draft", draft), ("target", target)):
        check_table_size(f"the processed {name}", model.table.shape[0] * num, v)
    draft_rows = _processed_rows(draft, draft_processing, num, seen_counts)
    target_rows = _processed_rows(target, spec, num, seen_counts)
    return _Engine(draft_rows.reshape(-1, v), target_rows.reshape(-1, v),
                   np.asarray(draft.next_state, np.int32), np.asarray(target.next_state, np.int32),
                   np.asarray(proc.next, np.int32), num, (draft.start, target.start, proc.start))


def history_law(draft, target, target_processing, *, horizon: int, lookahead: int,
                draft_processing=None, rows: str = "per_position",
                record: str = "accepted") -> SequenceLaw:
    """The exact law of ``x_0..x_T`` emitted by the SD engine loop with processing (module
    docstring), enumerated over every draft and outcome in float64.

    With ``rows="per_position"`` and ``record="accepted"`` it is the processed target's law
    (``sequence_law(penalize(target, ...), T)``) whatever the draft; the other options give the
    bug classes' laws, whose total variation from it is ``law.total_variation(correct)``.

    Args:
      draft, target: ``FiniteStateModel``s (or ``MarkovChain``s): the unprocessed models.
      target_processing: ``specjax.models.Penalties`` or ``specjax.models.Grammar``.
      horizon: ``T``; ``V^(T + 1)`` at most ``2**20``.
      lookahead: ``K``.
      draft_processing: ``None`` (the draft's rows unprocessed) or the same kind of processing
        on the same automaton (a ``Penalties`` with the same ``cap``; a ``Grammar`` with the same
        ``transitions``).
      rows, record: the bookkeeping (``ROWS``, ``RECORDS``; module docstring).

    Returns:
      ``SequenceLaw``.

    Raises:
      ValueError: a bad argument; before any work.

    Example:
      >>> import jax, specjax
      >>> from specjax.models import Penalties, penalize
      >>> from specjax.auditing.history import history_law, sequence_law
      >>> draft, target = (specjax.random_markov_chain(k, 3, 3) for k in jax.random.split(
      ...     jax.random.key(0)))
      >>> pen = Penalties(repetition=2.0, frequency=0.5, cap=2)
      >>> correct = sequence_law(penalize(target, pen), 3)
      >>> law = history_law(draft, target, pen, horizon=3, lookahead=2)
      >>> bool(law.total_variation(correct) < 1e-6)
      True
      >>> bug = history_law(draft, target, pen, horizon=3, lookahead=2, record="last")
      >>> bool(bug.total_variation(correct) > 0.01)
      True
    """
    engine = _engine(draft, target, target_processing, draft_processing, horizon, lookahead,
                     rows, record)
    return _enumerate(engine, horizon, lookahead, rows, record)


def _enumerate(engine: _Engine, horizon: int, lookahead: int, rows: str,
               record: str) -> SequenceLaw:
    dt = np.asarray(engine.draft_rows, np.float64)
    tt = np.asarray(engine.target_rows, np.float64)
    dnext, tnext, pnext = engine.draft_next, engine.target_next, engine.processor_next
    num, v = engine.num_processor, tt.shape[1]
    probs = np.zeros(v ** (horizon + 1))

    def advance(state, table, tokens):
        for x in tokens:
            state = table[state, x]
        return state

    def finish(seq, sd, st, c, drafted, accepted, y, prob):
        emitted = accepted + (y,)
        new_c = {"accepted": lambda: advance(c, pnext, emitted),
                 "last": lambda: pnext[c, y],
                 "drafted": lambda: advance(c, pnext, drafted + (y,))}[record]()
        call(seq + emitted, advance(sd, dnext, emitted), advance(st, tnext, emitted), new_c,
             prob)

    def drafts_after(sd, cd, k, drafted, prob):
        """Every continuation of the drafts to ``k`` tokens: ``(drafted, prob)``."""
        if len(drafted) == k:
            yield drafted, prob
            return
        p = dt[sd * num + cd]
        for d in np.flatnonzero(p > 0):
            yield from drafts_after(dnext[sd, d], pnext[cd, d], k, drafted + (d,), prob * p[d])

    def call(seq, sd, st, c, prob):
        n = len(seq) - 1
        if n == horizon:
            probs[int(_codes(np.array(seq), v))] += prob
            return
        k = min(lookahead, horizon - n - 1)

        def walk(sd_j, st_j, cd_j, drafted, pr):
            q = tt[st_j * num + (cd_j if rows == "per_position" else c)]
            if len(drafted) == k:
                for y in np.flatnonzero(q > 0):
                    finish(seq, sd, st, c, drafted, drafted, y, pr * q[y])
                return
            p = dt[sd_j * num + cd_j]
            for d in np.flatnonzero(p > 0):
                accept = min(1.0, q[d] / p[d])
                if accept > 0:
                    walk(dnext[sd_j, d], tnext[st_j, d], pnext[cd_j, d], drafted + (d,),
                         pr * p[d] * accept)
                if accept < 1:
                    residual = np.maximum(q - p, 0)
                    residual /= residual.sum()
                    tails = drafts_after(dnext[sd_j, d], pnext[cd_j, d], k, drafted + (d,),
                                         1.0) if record == "drafted" else [(drafted + (d,), 1.0)]
                    for full, tail_prob in tails:
                        for y in np.flatnonzero(residual > 0):
                            finish(seq, sd, st, c, full, drafted, y,
                                   pr * p[d] * (1 - accept) * tail_prob * residual[y])

        walk(sd, st, c, (), prob)

    sd0, st0, c0 = engine.starts
    first = tt[st0 * num + c0]
    for x in np.flatnonzero(first > 0):
        call((int(x),), dnext[sd0, x], tnext[st0, x], pnext[c0, x], first[x])
    return SequenceLaw(_all_sequences(v, horizon), probs)


def sample_history(key, draft, target, target_processing, num_chains: int, *, horizon: int,
                   lookahead: int, draft_processing=None, rows: str = "per_position",
                   record: str = "accepted") -> jax.Array:
    """``num_chains`` runs of the SD engine loop with processing (``history_law`` is their exact
    law; same arguments).

    One compiled program serves every ``rows`` and ``record`` (they are traced flags).

    Returns:
      ``(num_chains, T + 1)`` int32 tokens ``x_0..x_T``.

    Raises:
      ValueError: a bad argument; before any work.

    Example:
      >>> import jax, specjax
      >>> from specjax.models import Penalties
      >>> from specjax.auditing.history import sample_history
      >>> draft, target = (specjax.random_markov_chain(k, 3, 3) for k in jax.random.split(
      ...     jax.random.key(0)))
      >>> sample_history(jax.random.key(1), draft, target, Penalties(frequency=1.0, cap=2), 5,
      ...                horizon=3, lookahead=2).shape
      (5, 4)
    """
    _checks.check_key(key)
    _checks.check_positive_int("num_chains", num_chains)
    engine = _engine(draft, target, target_processing, draft_processing, horizon, lookahead,
                     rows, record)
    flags = jnp.array([ROWS.index(rows), RECORDS.index(record)], jnp.int32)
    keys = jax.random.split(key, num_chains)
    return _sample(keys, engine.draft_rows, engine.target_rows, jnp.asarray(engine.draft_next),
                   jnp.asarray(engine.target_next), jnp.asarray(engine.processor_next),
                   jnp.asarray(engine.starts, jnp.int32), flags, num=engine.num_processor,
                   horizon=horizon, lookahead=lookahead)


@functools.partial(jax.jit, static_argnames=("num", "horizon", "lookahead"))
def _sample(keys, dt, tt, dnext, tnext, pnext, starts, flags, *, num, horizon, lookahead):
    per_position = flags[0] == 0
    record = flags[1]

    def draw(k, row):
        return jax.random.categorical(k, jnp.where(row > 0, jnp.log(jnp.where(row > 0, row, 1)),
                                                   -jnp.inf)).astype(jnp.int32)

    def chain(key):
        sd, st, c = starts[0], starts[1], starts[2]
        k0, key = jax.random.split(key)
        x0 = draw(k0, tt[st * num + c])
        seq = jnp.zeros((horizon + 1,), jnp.int32).at[0].set(x0)
        carry = (seq, jnp.int32(0), dnext[sd, x0], tnext[st, x0], pnext[c, x0], jnp.int32(0))

        def one_call(carry):
            seq, n, sd, st, c, calls = carry
            kc = jax.random.fold_in(key, calls)
            kd, ku, ky = jax.random.split(kc, 3)
            k = jnp.minimum(lookahead, horizon - n - 1)

            def draft_step(state, j):
                sd_j, st_j, cd_j = state
                p = dt[sd_j * num + cd_j]
                q = tt[st_j * num + jnp.where(per_position, cd_j, c)]
                d = draw(jax.random.fold_in(kd, j), p)
                return (dnext[sd_j, d], tnext[st_j, d], pnext[cd_j, d]), (d, p, q)

            (sd_k, st_k, cd_k), (d, p, q) = jax.lax.scan(draft_step, (sd, st, c),
                                                         jnp.arange(lookahead))
            del sd_k
            # the target's row after all K drafts (the bonus position when k = K)
            q_end = tt[st_k * num + jnp.where(per_position, cd_k, c)]
            q_all = jnp.concatenate([q, q_end[None]])  # (K + 1, V)
            j = jnp.arange(lookahead)
            pd = jnp.take_along_axis(p, d[:, None], 1)[:, 0]
            qd = jnp.take_along_axis(q, d[:, None], 1)[:, 0]
            u = jax.random.uniform(ku, (lookahead,), p.dtype)
            ok = (u * pd < qd) | (j >= k)
            m = jnp.minimum(jnp.argmin(jnp.append(ok, False)), k).astype(jnp.int32)
            rejected = m < k
            q_m = q_all[m]
            p_m = jnp.where(rejected, p[jnp.minimum(m, lookahead - 1)], 0)
            residual = jnp.maximum(q_m - p_m, 0)
            residual = jnp.where(residual.sum() > 0, residual, q_m)
            y = draw(ky, residual)
            pos = jnp.arange(lookahead + 1)
            d_ext = jnp.append(d, 0)
            emitted = jnp.where(pos < m, d_ext, y)
            active = pos <= m
            seq = seq.at[jnp.where(active, n + 1 + pos, horizon + 1)].set(emitted, mode="drop")

            def advance(state, table, tokens, mask):
                def step(s, xm):
                    x, on = xm
                    return jnp.where(on, table[s, x], s), None
                return jax.lax.scan(step, state, (tokens, mask))[0]

            sd = advance(sd, dnext, emitted, active)
            st = advance(st, tnext, emitted, active)
            c_accepted = advance(c, pnext, emitted, active)
            c_last = pnext[c, y]
            drafted = jnp.where(pos < k, d_ext, y)
            c_drafted = advance(c, pnext, drafted, pos <= k)
            c = jnp.select([record == 0, record == 1], [c_accepted, c_last], c_drafted)
            return seq, n + m + 1, sd, st, c, calls + 1

        return jax.lax.while_loop(lambda s: s[1] < horizon, one_call, carry)[0]

    return jax.vmap(chain)(keys)
