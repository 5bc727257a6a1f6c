"""Penalties and grammar masks under SD (``specjax.models.processing``, ``specjax.auditing.history``).

Three ways: the processed models' exact sequence laws against brute force (each row penalised from
the history by a literal NumPy loop, as vLLM does); the engine's exact law (``history_law``, every
bookkeeping option) against a literal NumPy transcription of an engine's loop that keeps its
penalty history as a token list; Monte Carlo goodness of fit of ``sample_history`` and of
``decode`` on the processed models. Each engine bug class is flagged by ``sequence_fit`` at
``ALPHA_DETECT`` with a sample size from its exact chi-square divergence (power ``1 - 1e-4``), and
the correct variants pass at ``stats.ALPHA``.

One instance throughout: ``V = 3``, ``T = 3``, ``K = 2``, stationary chains lifted to ``S = 4``
states, ``cap = 2`` (exact for ``T = 3``).
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as sps

import specjax
import stats
from specjax.auditing.history import history_law
from specjax.auditing.history import sample_history
from specjax.auditing.history import sequence_fit
from specjax.auditing.history import sequence_law
from specjax.models import Grammar
from specjax.models import Penalties
from specjax.models import apply_penalties
from specjax.models import constrain
from specjax.models import penalize
from specjax.models.processing import safe_log
from specjax.models.processing import penalized_rows
from specjax.models.processing import penalty_processor

V, T, K, CAP = 3, 3, 2, 2
PEN = Penalties(repetition=2.0, frequency=1.0, presence=0.5, cap=CAP)
GRAMMAR = Grammar(np.array([[True, False, True], [False, True, True], [True, True, False]]),
                  np.array([[1, 1, 2], [0, 2, 0], [0, 1, 1]]))
#: False-alarm rate of the detection tests (each bug's test fails falsely, i.e. misses the bug,
#: with probability at most DETECT_MISS by the choice of its sample size).
ALPHA_DETECT, DETECT_MISS = 1e-3, 1e-4
BUGS = [("per_position", "last"), ("per_position", "drafted"), ("call_start", "accepted")]


def _models():
    """Draft and target: stationary chains (Dirichlet rows) lifted to 4 states; a zero in the
    target's row after token 1."""
    rng = np.random.default_rng(3)
    draft, trans = rng.dirichlet(np.ones(V), (2, 1, V))
    trans[0, 1, 2] = 0.0
    trans[0, 1] /= trans[0, 1].sum()
    init = np.full((V,), 1 / V)
    return tuple(specjax.FiniteStateModel.from_markov_chain(specjax.MarkovChain(init, m),
                                                            stationary=True)
                 for m in (draft, trans))


@pytest.fixture(scope="module")
def models():
    with jax.enable_x64(True):
        yield _models()


# ---- literal NumPy transcriptions ----------------------------------------------------------

def _log(row):
    with np.errstate(divide="ignore"):
        return np.log(row)


def literal_penalised_row(logits, history, pen, cap):
    """vLLM's ``apply_penalties`` on one row, from the token history (``history[0]`` is the
    prompt): repetition on prompt and output tokens, frequency and presence on output counts
    (capped at ``cap``), then the softmax."""
    x = np.array(logits, np.float64)
    for tok in set(history):
        if np.isfinite(x[tok]):
            x[tok] = x[tok] / pen.repetition if x[tok] > 0 else x[tok] * pen.repetition
    counts = np.minimum(np.bincount(np.asarray(history[1:], int), minlength=len(x)), cap)
    x = x - pen.frequency * counts - pen.presence * (counts > 0)
    e = np.exp(x - x[np.isfinite(x)].max())
    return e / e.sum()


def literal_masked_row(row, history, grammar):
    state = grammar.start
    for tok in history:
        state = grammar.transitions[state, tok]
    kept = row * grammar.allowed[state]
    return kept / kept.sum() if kept.sum() > 0 else grammar.allowed[state] / grammar.allowed[
        state].sum()


def base_row(model, history):
    table, nxt = np.asarray(model.table, np.float64), np.asarray(model.next_state)
    state = model.start
    for tok in history:
        state = nxt[state, tok]
    return table[state]


def brute_force_law(model, row_of):
    """``{sequence: probability}`` with each row ``row_of(base_row, history)``."""
    law = {}
    for seq in itertools.product(range(V), repeat=T + 1):
        prob = 1.0
        for n in range(T + 1):
            prob *= row_of(base_row(model, seq[:n]), list(seq[:n]))[seq[n]]
        law[seq] = prob
    return law


def literal_engine_law(draft, target, pen, *, draft_pen, rows, record):
    """An engine's SD loop transcribed: the penalty history is a token list ``hist``; draft
    position ``j`` sees ``hist + drafts[:j]``, the target ``hist + drafts[:j]`` (per position)
    or ``hist`` (call start); after a call ``hist`` grows by the emitted tokens (accepted), the
    last one (last) or every draft and the last (drafted)."""
    law = {}

    def p_row(seq, hist, drafts):
        row = base_row(draft, seq + drafts)
        return row if draft_pen is None else literal_penalised_row(
            _log(row), hist + drafts, draft_pen, CAP)

    def q_row(seq, hist, drafts):
        seen = hist + drafts if rows == "per_position" else hist
        return literal_penalised_row(_log(base_row(target, seq + drafts)), seen, pen, CAP)

    def run(seq, hist, prob):
        n = len(seq) - 1
        if n == T:
            law[tuple(seq)] = law.get(tuple(seq), 0.0) + prob
            return
        k = min(K, T - n - 1)
        for drafts in itertools.product(range(V), repeat=k):
            drafts = list(drafts)
            pr_drafts, ps, qs = 1.0, [], []
            for j in range(k):
                ps.append(p_row(seq, hist, drafts[:j]))
                pr_drafts *= ps[j][drafts[j]]
            if pr_drafts == 0:
                continue
            qs = [q_row(seq, hist, drafts[:j]) for j in range(k + 1)]
            reach = prob * pr_drafts
            for j in range(k + 1):
                if j == k:
                    outcomes = [(y, qs[k][y]) for y in range(V)]
                else:
                    a = min(1.0, qs[j][drafts[j]] / ps[j][drafts[j]])
                    residual = np.maximum(qs[j] - ps[j], 0)
                    outcomes = [(y, (1 - a) * residual[y] / residual.sum())
                                for y in range(V)] if a < 1 else []
                for y, w in outcomes:
                    if w <= 0:
                        continue
                    emitted = drafts[:j] + [y]
                    new = {"accepted": hist + emitted, "last": hist + [y],
                           "drafted": hist + drafts + [y]}[record]
                    run(seq + emitted, new, reach * w)
                if j < k:
                    reach *= min(1.0, qs[j][drafts[j]] / ps[j][drafts[j]])

    first = literal_penalised_row(_log(base_row(target, [])), [], pen, CAP)
    for x in range(V):
        if first[x] > 0:
            run([x], [x], first[x])
    return law


def as_dict(law):
    return {tuple(map(int, s)): float(p) for s, p in zip(law.sequences, law.probs)}


def assert_laws_equal(got, want, tol=1e-12):
    keys = set(got) | set(want)
    worst = max(abs(got.get(k, 0.0) - want.get(k, 0.0)) for k in keys)
    assert worst < tol, worst


# ---- 1. exact laws of the processed models against brute force -----------------------------

def test_penalised_model_law_is_brute_force(models, x64):
    _, target = models
    assert_laws_equal(as_dict(sequence_law(penalize(target, PEN), T)), brute_force_law(
        target, lambda row, hist: literal_penalised_row(_log(row), hist, PEN, CAP)))
    # raw logits, positive ones included: the repetition penalty divides them
    logits = np.array([[1.5, -0.5, 0.2], [0.7, 2.0, -np.inf], [-1.0, 0.3, 1.1], [0.0, 0.9, -2]])
    table = np.exp(logits - logits.max(1, keepdims=True))
    base = specjax.FiniteStateModel(target.start, target.next_state, table / table.sum(1)[:, None])
    pen = PEN._replace(frequency=0.0, presence=0.0)
    assert_laws_equal(as_dict(sequence_law(penalize(base, pen, logits=logits), T)),
                      brute_force_law(base, lambda row, hist: literal_penalised_row(
                          logits[int(np.asarray(base.next_state)[0, hist[-1]]) if hist else 0],
                          hist, pen, CAP)))


def test_masked_model_law_is_brute_force(models, x64):
    _, target = models
    law = as_dict(sequence_law(constrain(target, GRAMMAR), T))
    assert_laws_equal(law, brute_force_law(
        target, lambda row, hist: literal_masked_row(row, hist, GRAMMAR)))
    for seq, prob in law.items():  # every sequence of positive probability obeys the grammar
        if prob > 0:
            state = GRAMMAR.start
            for tok in seq:
                assert GRAMMAR.allowed[state, tok]
                state = GRAMMAR.transitions[state, tok]


def test_single_allowed_token_zero_rows_and_gradients_are_finite(models, x64):
    _, target = models
    # state 2 allows token 0 alone; from the target's state after 1, token 2 has probability 0
    grammar = Grammar(np.array([[True, True, True], [False, False, True], [True, False, False]]),
                      np.array([[1, 2, 0], [0, 0, 2], [0, 0, 0]]))
    model = constrain(target, grammar)
    s = model.update(model.init_state(), 1)   # grammar state 2: token 0 only
    row = np.asarray(model.probs(s))
    assert row[1] == row[2] == 0.0 and abs(row[0] - 1) < 1e-15
    assert np.all(np.isfinite(np.asarray(model.table)))
    np.testing.assert_allclose(np.asarray(model.table).sum(1), 1.0, atol=1e-12)

    proc, seen, counts = penalty_processor(V, CAP)

    @jax.jit
    @jax.grad
    def grads(settings):   # the rows penalize builds, from a table with a zero
        table, rep, freq = settings
        rows = penalized_rows(safe_log(table), Penalties(rep, freq, 0.3, CAP), seen, counts)
        return jnp.where(rows > 0, jnp.log(jnp.where(rows > 0, rows, 1)), 0).sum()

    assert all(np.all(np.isfinite(np.asarray(g)))
               for g in jax.tree.leaves(grads((target.table, 1.5, 0.5))))
    out = apply_penalties(jnp.array([-jnp.inf, 0.0, 1.0]), jnp.array([True] * 3),
                          jnp.array([1, 1, 1]), repetition=2.0, frequency=1.0)
    np.testing.assert_allclose(np.asarray(out), [-np.inf, -1.0, -0.5])


def test_bad_settings_raise(models):
    _, target = models
    with pytest.raises(ValueError, match="cap"):
        penalize(target, PEN._replace(cap=0))
    with pytest.raises(ValueError, match="repetition"):
        penalize(target, PEN._replace(repetition=0.0))
    with pytest.raises(ValueError, match="allowed"):
        constrain(target, GRAMMAR._replace(allowed=np.zeros((3, V), bool)))
    with pytest.raises(ValueError, match="transitions"):
        constrain(target, GRAMMAR._replace(transitions=GRAMMAR.transitions + 3))
    with pytest.raises(ValueError, match="record"):
        history_law(target, target, PEN, horizon=T, lookahead=K, record="rejected")
    with pytest.raises(ValueError, match="cap"):
        history_law(target, target, PEN, horizon=T, lookahead=K,
                    draft_processing=PEN._replace(cap=1))


# ---- 2. the engine's exact law against a literal transcription -----------------------------

@pytest.mark.parametrize("rows,record", [("per_position", "accepted")] + BUGS)
def test_engine_law_is_the_literal_loop(models, x64, rows, record):
    draft, target = models
    draft_pen = PEN._replace(repetition=1.5) if record == "drafted" else None
    got = history_law(draft, target, PEN, horizon=T, lookahead=K, rows=rows, record=record,
                      draft_processing=draft_pen)
    assert_laws_equal(as_dict(got), literal_engine_law(draft, target, PEN, draft_pen=draft_pen,
                                                       rows=rows, record=record))


def test_correct_bookkeeping_is_lossless_and_bugs_are_not(models, x64):
    draft, target = models
    correct = sequence_law(penalize(target, PEN), T)
    for draft_pen in (None, PEN._replace(repetition=1.5)):
        law = history_law(draft, target, PEN, horizon=T, lookahead=K, draft_processing=draft_pen)
        assert law.total_variation(correct) < 1e-12
    for rows, record in BUGS:
        law = history_law(draft, target, PEN, horizon=T, lookahead=K, rows=rows, record=record)
        assert law.total_variation(correct) > 0.02, (rows, record)
    # a grammar: the unmasked draft is lossless (drafts outside the grammar are always
    # rejected), the window masked with the call's starting state is not
    masked = sequence_law(constrain(target, GRAMMAR), T)
    for draft_grammar in (None, GRAMMAR):
        law = history_law(draft, target, GRAMMAR, horizon=T, lookahead=K,
                          draft_processing=draft_grammar)
        assert law.total_variation(masked) < 1e-12
    law = history_law(draft, target, GRAMMAR, horizon=T, lookahead=K, rows="call_start")
    assert law.total_variation(masked) > 0.02


# ---- 3. Monte Carlo ------------------------------------------------------------------------

def pooled(law: np.ndarray, reference: np.ndarray, n: int, min_variance: float = 5.0):
    """``law`` and ``reference`` on the categories ``sequence_fit`` tests at ``n`` samples:
    those whose count has variance ``n Q (1 - Q) >= min_variance`` under the reference, the
    rest pooled, a pool of too small a variance folded into the kept category of least
    variance (``compare._generalised_chi2``'s rule)."""
    variance = n * reference * (1 - reference)
    keep = variance >= min_variance
    p, q = list(law[keep]), list(reference[keep])
    rest_q, rest_p = reference[~keep].sum(), law[~keep].sum()
    if n * rest_q * (1 - rest_q) >= min_variance:
        p.append(rest_p)
        q.append(rest_q)
    elif q:
        i = int(np.argmin(variance[keep]))
        p[i] += rest_p
        q[i] += rest_q
    return np.array(p), np.array(q)


def detection_size(law, reference) -> int:
    """Samples at which ``sequence_fit`` at ``ALPHA_DETECT`` misses ``law`` with probability at
    most ``DETECT_MISS``: Pearson's statistic on the pooled categories is asymptotically
    noncentral chi-square with noncentrality ``n chi2(P || Q)`` (pooled) and one degree of
    freedom fewer than the categories."""
    n = 200
    while True:
        p, q = pooled(law.probs, reference.probs, n)
        df = len(q) - 1
        noncentrality = n * float(((p - q) ** 2 / q).sum())
        if sps.ncx2.cdf(sps.chi2.isf(ALPHA_DETECT, df), df, noncentrality) <= DETECT_MISS:
            return n
        n = int(n * 1.05) + 1


@pytest.fixture(scope="module")
def laws(models):
    with jax.enable_x64(True):
        draft, target = models
        correct = sequence_law(penalize(target, PEN), T)
        bugs = {b: history_law(draft, target, PEN, horizon=T, lookahead=K, rows=b[0],
                               record=b[1]) for b in BUGS}
        yield correct, bugs


def test_each_bug_is_flagged_and_the_correct_engine_passes(models, laws, x64):
    draft, target = models
    correct, bugs = laws
    sizes = {b: detection_size(law, correct) for b, law in bugs.items()}
    n = max(sizes.values())
    assert n <= 20_000, sizes  # the instance keeps the run cheap
    key = jax.random.key(20261127)
    for i, bug in enumerate(BUGS):
        tokens = sample_history(jax.random.fold_in(key, i), draft, target, PEN, n, horizon=T,
                                lookahead=K, rows=bug[0], record=bug[1])
        assert sequence_fit(tokens, correct, alpha=ALPHA_DETECT).flagged, (bug, sizes[bug])
        # and the sampler follows the bug's own exact law
        fit = sequence_fit(tokens, bugs[bug], alpha=stats.ALPHA)
        assert not fit.flagged, (bug, fit)
    tokens = sample_history(jax.random.fold_in(key, 99), draft, target, PEN, n, horizon=T,
                            lookahead=K)
    fit = sequence_fit(tokens, correct, alpha=stats.ALPHA)
    assert not fit.flagged, fit


def test_decode_on_penalised_models_is_lossless(models, x64):
    draft, target = models
    pen_target = penalize(target, PEN)
    pen_draft = penalize(draft, Penalties(cap=CAP))   # unpenalised, on the same state space
    trace = specjax.decode(jax.random.key(7), specjax.Speculative(lookahead=K), pen_draft,
                           pen_target, 4_000, horizon=T)
    fit = sequence_fit(np.asarray(trace.tokens), sequence_law(pen_target, T), alpha=stats.ALPHA)
    assert not fit.flagged, fit
    theory = specjax.exact(specjax.Speculative(lookahead=K), pen_draft, pen_target, horizon=T)
    assert np.isfinite(float(theory.expected_rejections))
    stats.assert_mean(np.asarray(trace.num_rejections), float(theory.expected_rejections),
                      "rejections on penalised models")


def test_compare_outputs_sees_wrong_rows_only_when_handed_the_right_ones(models, x64):
    """``compare_outputs`` tests verification given the rows the engine declares. A call whose
    target rows carry the penalties of the call's start (``rows="call_start"``) verifies them
    correctly: with those rows declared it passes; with the rows of the penalised target (the
    auditor's, from the history and the drafts) it flags the call. The record bugs change the
    state a later call starts from, which the engine's declared rows hide the same way."""
    draft, target = models
    proc, _, _ = penalty_processor(V, CAP)
    pen_target, pen_draft = penalize(target, PEN), penalize(draft, Penalties(cap=CAP))
    x0, drafts = 1, (0, 0)
    nxt = np.asarray(pen_target.next_state)
    states = [nxt[pen_target.start, x0]]
    for d in drafts:
        states.append(nxt[states[-1], d])
    c0 = states[0] % proc.num
    engine_states = [s - s % proc.num + c0 for s in states]   # base state moves, penalties not
    table, draft_table = np.asarray(pen_target.table), np.asarray(pen_draft.table)
    q_right, q_engine = table[states], table[engine_states]
    p = draft_table[states[:K]]
    right = np.asarray(specjax.verify_drafts_law(specjax.Speculative(), np.array(drafts), p,
                                                 q_right).outcome, np.float64).ravel()
    wrong = np.asarray(specjax.verify_drafts_law(specjax.Speculative(), np.array(drafts), p,
                                                 q_engine).outcome, np.float64).ravel()
    num_tests = K + 3   # compare_outputs' Bonferroni split; its outcome test alone gives power
    runs = 200
    while True:
        pp, qq = pooled(wrong, right, runs)
        df, lam = len(qq) - 1, runs * float(((pp - qq) ** 2 / qq).sum())
        if sps.ncx2.cdf(sps.chi2.isf(ALPHA_DETECT / num_tests, df), df, lam) <= DETECT_MISS:
            break
        runs = int(runs * 1.05) + 1
    assert runs <= 20_000
    out = specjax.verify_drafts(jax.random.key(11), specjax.Speculative(),
                                np.tile(drafts, (runs, 1)), np.tile(p, (runs, 1, 1)),
                                np.tile(q_engine, (runs, 1, 1))).tokens
    declared = specjax.compare_outputs(specjax.Speculative(), np.array(drafts), p, q_engine,
                                       np.asarray(out), alpha=stats.ALPHA)
    assert not declared.flagged, declared
    audited = specjax.compare_outputs(specjax.Speculative(), np.array(drafts), p, q_right,
                                      np.asarray(out), alpha=ALPHA_DETECT)
    assert audited.flagged, (runs, audited)
