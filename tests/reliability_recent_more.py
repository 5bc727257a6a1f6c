"""Battery cases for the entry points of the last rounds that the battery covered little: estimates
and lookaheads from recordings, the call-structure filter and profiles, distillation objectives,
serving (costs, goodput, allocation, batch policies), the newer decoders (traversal, parallel
drafters, threshold verification, schedules), provenance and sequence checks, penalties and
grammars, the fast random chains and ``bench``'s flags. In the style of
``tests/reliability_cases.py``: ``add_cases(add, S)`` adds them with ``_cases``' ``add``.

Valid inputs are checked against an independent value where one is practical: a NumPy phase
recursion for ``call_structure``, Theorem 1 for SD's rejections, the enumerated target law for
``estimate``, a brute force over every allocation for ``allocate_drafts``, hand-computed rows for
``penalize`` and ``constrain``, the Dirichlet moments for ``random_markov_chain``.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import pathlib
import tempfile

import numpy as np

# ---------------------------------------------------------------------------------------------
# Independent references (NumPy, float64).


def np_call_structure(r, root, k, times=None):
    """``(rejections, calls, time)`` of one sequence: SD's calls over positions ``1..T`` with
    rejection rate ``r[t - 1]`` at a drafted position that is not a call's first and ``root[t - 1]``
    at a call's first; a call at ``n`` drafts ``min(k, T - n + 1)`` positions; a rejection at ``t``
    ends it (the next call at ``t + 1``), all kept gives a bonus token at ``n + depth`` (the next
    call at ``n + depth + 1``); ``k = 0``: one call per token."""
    horizon = len(r)
    times = np.zeros(horizon) if times is None else np.asarray(times, np.float64)

    @functools.cache
    def f(n):
        if n > horizon:
            return np.zeros(3)
        depth = min(k, horizon - n + 1)
        out = np.array([0.0, 1.0, times[n - 1]])
        if depth == 0:
            return out + f(n + 1)
        alive = 1.0
        for j in range(depth):
            pos = n + j
            rate = root[pos - 1] if j == 0 else r[pos - 1]
            p_rej = alive * rate
            out = out + p_rej * (np.array([1.0, 0.0, 0.0]) + f(pos + 1))
            alive *= 1 - rate
        return out + alive * f(n + depth + 1)

    return f(1)


def np_enumerated():
    """Every sequence ``x_0..x_T`` of positive target probability under the battery's pair, its
    probability, and the draft's and target's rows along it."""
    from reliability_cases import np_pair  # noqa: PLC0415
    init, p, q = np_pair()
    num_states, horizon = p.shape[-1], p.shape[0]
    seqs = np.array(list(itertools.product(range(num_states), repeat=horizon + 1)))
    weights = init[seqs[:, 0]].copy()
    p_rows = np.zeros((len(seqs), horizon, num_states))
    q_rows = np.zeros((len(seqs), horizon, num_states))
    for t in range(horizon):
        prev, token = seqs[:, t], seqs[:, t + 1]
        weights = weights * q[t, prev, token]
        p_rows[:, t], q_rows[:, t] = p[t, prev], q[t, prev]
    keep = weights > 0
    return seqs[keep], weights[keep], p_rows[keep], q_rows[keep]


def np_step_time(lookaheads, draft_table, target_table, overhead=0.0):
    k = np.asarray(lookaheads)
    passes = sum(draft_table[int((k >= j).sum())] for j in range(1, int(k.max(initial=0)) + 1)
                 if (k >= j).sum() > 0)
    return passes + target_table[int(len(k) + k.sum())] + overhead


def np_best_allocation(survival, draft_table, target_table):
    """The most expected tokens per unit time over every allocation (brute force)."""
    survival = np.asarray(survival, np.float64)
    batch, depth = survival.shape
    best = 0.0
    for ks in itertools.product(range(depth + 1), repeat=batch):
        tokens = batch + sum(survival[b, :ks[b]].sum() for b in range(batch))
        best = max(best, tokens / np_step_time(ks, draft_table, target_table))
    return best


def np_softmax(x):
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max())
    return e / e.sum()


def _close(x, ref, rtol=1e-4, atol=1e-5) -> bool:
    return bool(np.allclose(np.asarray(x, np.float64), np.asarray(ref, np.float64), rtol=rtol,
                            atol=atol))


# ---------------------------------------------------------------------------------------------


def add_cases(add, S) -> None:  # noqa: PLR0915 - a flat list of cases
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    from reliability_cases import built_once  # noqa: PLC0415
    from reliability_cases import cli  # noqa: PLC0415
    from reliability_cases import draft as d  # noqa: PLC0415
    from reliability_cases import is_law  # noqa: PLC0415
    from reliability_cases import key as k  # noqa: PLC0415
    from reliability_cases import np_pair  # noqa: PLC0415
    from reliability_cases import np_sd_rejections  # noqa: PLC0415
    from reliability_cases import reference64  # noqa: PLC0415
    from reliability_cases import target as t  # noqa: PLC0415
    from reliability_cases import target_marginals  # noqa: PLC0415

    from specjax.theory import serving  # noqa: PLC0415

    P = S.pairs
    cost = S.CostModel(0.1, 1.0)
    sd2 = S.Speculative(lookahead=2)

    @built_once
    def rec():
        seqs, weights, p_rows, q_rows = np_enumerated()
        return S.Recording.from_arrays(seqs, p_rows, q_rows, weights=weights, keep_rows=True)

    @built_once
    def rec_no_rows():
        seqs, weights, p_rows, q_rows = np_enumerated()
        return S.Recording.from_arrays(seqs, p_rows, q_rows, weights=weights)

    def exact32(decoder, what="expected_calls"):
        return float(getattr(S.exact(decoder, d(), t()), what))

    # ------------------------------------------------------------------ estimate, best_lookahead
    kind = "recent: estimates"
    add(kind, "estimate", "SD K = T on the enumerated target law (= Theorem 1)",
        lambda: S.estimate(S.Speculative(), rec()),
        check=lambda e: _close(e.expected_rejections, np_sd_rejections(*np_pair()))
        and _close(e.expected_calls, reference64("calls")))
    add(kind, "estimate", "SD K = 2 on the enumerated target law (= exact)",
        lambda: S.estimate(sd2, rec()),
        check=lambda e: _close(e.expected_rejections, reference64("sd_k2")))
    add(kind, "estimate", "SD K = 2 with a CostModel on the enumerated law (= decoding_time)",
        lambda: S.estimate(sd2, rec(), cost=cost),
        check=lambda e: _close(e.expected_time, S.theory.decoding_time(sd2, d(), t(), cost)
                               .expected_time))
    add(kind, "estimate", "BatchSpeculative(2, K = 2) on enumerated rows (= exact)",
        lambda: S.estimate(S.BatchSpeculative(2, lookahead=2), rec()),
        error=("decoder", "recording"),
        check=lambda e: _close(e.expected_rejections,
                               exact32(S.BatchSpeculative(2, lookahead=2), "expected_rejections")))
    add(kind, "estimate", "BatchSpeculative(2, K = 2), recorded without keep_rows (= exact)",
        lambda: S.estimate(S.BatchSpeculative(2, lookahead=2), rec_no_rows()),
        error=("decoder", "recording"),
        check=lambda e: _close(e.expected_rejections,
                               exact32(S.BatchSpeculative(2, lookahead=2), "expected_rejections")))
    add(kind, "estimate", "TokenTree((2, 1)) on enumerated rows (= exact)",
        lambda: S.estimate(S.TokenTree((2, 1)), rec()),
        check=lambda e: _close(e.expected_calls, exact32(S.TokenTree((2, 1)), "expected_calls")))
    for what, make in (("TraversalVerification((2,))", lambda: S.TraversalVerification((2,))),
                       ("ParallelDraft(2)", lambda: S.decoders.ParallelDraft(2)),
                       ("ThresholdVerification(0.5, 0.5) (lossy)",
                        lambda: S.ThresholdVerification(0.5, 0.5)),
                       ("the class Speculative", lambda: S.Speculative),
                       ("a string", lambda: "sd")):
        add(kind, "estimate", f"decoder {what}", lambda m=make: S.estimate(m(), rec()), "decoder")
    for what, make in (("HeuristicSchedule(1, max_lookahead=2)",
                        lambda: S.HeuristicSchedule(1, max_lookahead=2)),
                       ("AdaptiveSpeculative(RejectionThreshold(0.3))",
                        lambda: S.AdaptiveSpeculative(S.decoders.RejectionThreshold(0.3),
                                                      max_lookahead=2))):
        add(kind, "estimate", f"{what} on enumerated rows (= exact)",
            lambda m=make: S.estimate(m(), rec()), "decoder",
            check=lambda e, m=make: _close(e.expected_calls, exact32(m(), "expected_calls")))
    add(kind, "estimate", "AdaptiveSpeculative(EntropyThreshold(1.0)) with a cost model "
        "(drafts off the path)",
        lambda: S.estimate(S.AdaptiveSpeculative(S.decoders.EntropyThreshold(1.0),
                                                 max_lookahead=2), rec(), cost=cost), "cost")
    add(kind, "estimate", "ThresholdVerification() (defaults: lossless) K = 2",
        lambda: S.estimate(S.ThresholdVerification(lookahead=2), rec()), "decoder",
        check=lambda e: _close(e.expected_rejections, exact32(
            S.ThresholdVerification(lookahead=2), "expected_rejections")))
    add(kind, "pairs.best_lookahead", "enumerated law, max_lookahead 3 (= theory.best_lookahead)",
        lambda: (P.best_lookahead(rec(), cost, max_lookahead=3),
                 S.theory.best_lookahead(d(), t(), cost, max_lookahead=3)),
        check=lambda r: r[0].lookahead == r[1].lookahead and _close(r[0].times, r[1].times))
    add(kind, "pairs.best_lookahead", "cost None",
        lambda: P.best_lookahead(rec(), None, max_lookahead=2), "cost")
    add(kind, "pairs.best_lookahead", "cost a ServingCost",
        lambda: P.best_lookahead(rec(), S.ServingCost(0.1, 1.0), max_lookahead=2), "cost")
    for what, value in (("-1", -1), ("True", True), ("'3'", "3")):
        add(kind, "pairs.best_lookahead", f"max_lookahead {what}",
            lambda v=value: P.best_lookahead(rec(), cost, max_lookahead=v), "max_lookahead")
    add(kind, "pairs.best_lookahead", "max_lookahead 10**6 (past the horizon T = 3)",
        lambda: P.best_lookahead(rec(), cost, max_lookahead=10**6), "max_lookahead",
        check=lambda c: c.lookahead <= 3, isolate=True)
    for what, make in (("BiasedSpeculative(0.1)", lambda: S.BiasedSpeculative(0.1)),
                       ("TokenTree((2,))", lambda: S.TokenTree((2,)))):
        add(kind, "pairs.best_lookahead", f"decoder {what}",
            lambda m=make: P.best_lookahead(rec(), cost, max_lookahead=2, decoder=m()), "decoder")

    # ------------------------------------------------------------------ call structure, profiles
    kind = "recent: call structure"
    rng = np.random.default_rng(7)
    rates = rng.uniform(0, 1, size=(3, 5))
    roots = rng.uniform(0, 1, size=(3, 5))
    call_times = np.array([1.3, 1.2, 1.1, 1.0, 0.9])

    def np_structure(kk, root=None, times=None):
        root = rates if root is None else root
        return np.stack([np_call_structure(rates[b], root[b], kk, times) for b in range(3)])

    for kk in (0, 2, None):
        add(kind, "pairs.call_structure", f"random rates (3, 5), lookahead {kk} (valid)",
            lambda kk=kk: P.call_structure(jnp.asarray(rates, jnp.float32), kk),
            check=lambda s, kk=kk: _close(s.rejections, np_structure(5 if kk is None else kk)[:, 0])
            and _close(s.calls, np_structure(5 if kk is None else kk)[:, 1]))
    add(kind, "pairs.call_structure", "root_rejection of other rates, lookahead 3 (valid)",
        lambda: P.call_structure(jnp.asarray(rates, jnp.float32), 3,
                                 root_rejection=jnp.asarray(roots, jnp.float32)),
        check=lambda s: _close(s.rejections, np_structure(3, roots)[:, 0])
        and _close(s.calls, np_structure(3, roots)[:, 1]))
    for what, value, name in (("1-D rates", rates[0], "rejection"),
                              ("a rate 1.5", np.where(np.arange(5) == 2, 1.5, rates), "rejection"),
                              ("a NaN rate", np.where(np.arange(5) == 2, np.nan, rates),
                               "rejection")):
        add(kind, "pairs.call_structure", what,
            lambda v=value: P.call_structure(jnp.asarray(v), 2), name)
    for what, value in (("-1", -1), ("2.5", 2.5), ("a jnp int", jnp.asarray(2))):
        add(kind, "pairs.call_structure", f"lookahead {what}",
            lambda v=value: P.call_structure(jnp.asarray(rates), v), "lookahead")
    add(kind, "pairs.call_structure", "root_rejection of another shape",
        lambda: P.call_structure(jnp.asarray(rates), 2, root_rejection=jnp.asarray(roots[:2])),
        "root_rejection")
    add(kind, "pairs.expected_call_time", "call times (5,), lookahead 2 (valid)",
        lambda: P.expected_call_time(jnp.asarray(rates, jnp.float32), 2,
                                     jnp.asarray(call_times, jnp.float32)),
        check=lambda r: _close(r, np_structure(2, times=call_times)[:, 2]))
    add(kind, "pairs.expected_call_time", "call_times of shape (4,)",
        lambda: P.expected_call_time(jnp.asarray(rates), 2, jnp.ones(4)), "call_times")
    add(kind, "pairs.expected_call_time", "call_times with a NaN",
        lambda: P.expected_call_time(jnp.asarray(rates), 2, jnp.asarray(
            [1.0, math.nan, 1.0, 1.0, 1.0])), "call_times")
    add(kind, "pairs.expected_call_time", "call_times with a negative time",
        lambda: P.expected_call_time(jnp.asarray(rates), 2, jnp.asarray(
            [1.0, -5.0, 1.0, 1.0, 1.0])), "call_times")

    p_x = rng.uniform(0.05, 1, size=6)
    q_x = rng.uniform(0.05, 1, size=6)
    add(kind, "pairs.rejection_rate", "random probabilities (valid: [q - p]_+ / q)",
        lambda: P.rejection_rate(p_x, q_x),
        check=lambda r: _close(r, np.maximum(q_x - p_x, 0) / q_x))
    add(kind, "pairs.rejection_rate", "draft_prob -0.5", lambda: P.rejection_rate(
        [-0.5, 0.2], [0.5, 0.5]), ("draft_prob",))
    add(kind, "pairs.rejection_rate", "target_prob 1.5", lambda: P.rejection_rate(
        [0.2, 0.2], [1.5, 0.5]), ("target_prob",))
    add(kind, "pairs.rejection_rate", "target_prob NaN", lambda: P.rejection_rate(
        [0.2, 0.2], [math.nan, 0.5]), ("target_prob",))
    add(kind, "pairs.rejection_rate", "shapes (3,) and (1,) (broadcast)", lambda: P.rejection_rate(
        [0.2, 0.3, 0.4], [0.5]), ("draft_prob", "target_prob"))

    kind = "recent: profiles"
    add(kind, "pairs.read_profile", "[800, 500, 300] of 1000 (valid)",
        lambda: P.read_profile([800, 500, 300], 1000), check=lambda a: _close(a, [0.8, 0.5, 0.3]))
    for what, counts, drafts, name in (
            ("increasing counts", [300, 500], 1000, "num_accepted_tokens_per_pos"),
            ("a NaN count", [800, math.nan], 1000, "num_accepted_tokens_per_pos"),
            ("2-D counts", [[800, 500]], 1000, "num_accepted_tokens_per_pos"),
            ("no counts", [], 1000, "num_accepted_tokens_per_pos"),
            ("num_drafts 0", [0, 0], 0, "num_drafts"),
            ("num_drafts below the first count", [800, 500], 700, "num_drafts"),
            ("num_drafts NaN", [800, 500], math.nan, "num_drafts"),
            ("num_drafts '1000'", [800, 500], "1000", "num_drafts")):
        add(kind, "pairs.read_profile", what,
            lambda c=counts, n=drafts: P.read_profile(c, n), name)
    add(kind, "pairs.acceptance_profile", "result a dict",
        lambda: P.acceptance_profile({"acceptance_per_position": [0.5]}), "result")
    add(kind, "pairs.acceptance_profile", "estimate on the enumerated law = engine_metrics's",
        lambda: (P.acceptance_profile(S.estimate(sd2, rec())),
                 P.acceptance_profile(S.theory.engine_metrics(sd2, d(), t()))),
        check=lambda r: r[0].shape == (2,) and _close(r[0], r[1]))
    add(kind, "pairs.profile_accepted_length", "[0.8, 0.5, 0.3], lookahead 2 (valid)",
        lambda: P.profile_accepted_length([0.8, 0.5, 0.3], 2), check=lambda r: abs(r - 1.3) < 1e-12)
    add(kind, "pairs.profile_accepted_length", "lookahead 0 (valid: nothing kept)",
        lambda: P.profile_accepted_length([0.8, 0.5], 0), check=lambda r: r == 0.0)
    for what, prof, look, name in (("lookahead 4 past 3 positions", [0.8, 0.5, 0.3], 4,
                                    "lookahead"),
                                   ("lookahead -1", [0.8, 0.5], -1, "lookahead"),
                                   ("lookahead 1.0", [0.8, 0.5], 1.0, "lookahead"),
                                   ("a NaN rate", [0.8, math.nan], None, "profile"),
                                   ("a rate 1.2", [1.2, 0.5], None, "profile"),
                                   ("a 2-D profile", [[0.8, 0.5]], None, "profile")):
        add(kind, "pairs.profile_accepted_length", what,
            lambda a=prof, n=look: P.profile_accepted_length(a, n), name)

    # ------------------------------------------------------------------ distillation
    kind = "recent: distillation"

    @built_once
    def small_rec():
        return S.Recording.from_statistics(
            jnp.array([[0, 1, 1], [0, 0, 1]]), jnp.full((2, 2), 0.5),
            jnp.array([[0.5, 0.8], [0.5, 0.2]]))

    def ctx_free(params, tokens):
        return jnp.broadcast_to(params, (2, 2, params.shape[-1]))

    def dobj(params, *args, apply=ctx_free, recording=None, **kw):
        loss = P.decoding_objective(*args if args else (S.Speculative(),), apply, **kw)
        return loss(jnp.asarray(params, jnp.float32),
                    small_rec() if recording is None else recording).value

    # The draft's rows are (0.5, 0.5) at every position: rates [q - p]_+ / q along the tokens.
    small_rates = np.array([[0.0, 0.3 / 0.8], [0.0, 0.0]])
    np_small = np.mean([np_call_structure(r, r, 2)[0] for r in small_rates])
    add(kind, "pairs.decoding_objective", "logits=True, zero logits (valid: phase recursion)",
        lambda: dobj(jnp.zeros(2), logits=True), check=lambda v: _close(v, np_small))
    add(kind, "pairs.decoding_objective", "measure 'calls' (valid: phase recursion)",
        lambda: dobj(jnp.zeros(2), logits=True, measure="calls"),
        check=lambda v: _close(v, np.mean([np_call_structure(r, r, 2)[1] for r in small_rates])))
    add(kind, "pairs.decoding_objective", "measure 'foo'",
        lambda: dobj(jnp.zeros(2), logits=True, measure="foo"), "measure")
    add(kind, "pairs.decoding_objective", "measure 'time' without a cost",
        lambda: dobj(jnp.zeros(2), logits=True, measure="time"), ("measure", "cost"))
    add(kind, "pairs.decoding_objective", "cost a ServingCost",
        lambda: dobj(jnp.zeros(2), logits=True, measure="time",
                     cost=S.ServingCost(0.1, 1.0)), "cost")
    add(kind, "pairs.decoding_objective", "apply 3", lambda: dobj(jnp.zeros(2), apply=3), "apply")
    add(kind, "pairs.decoding_objective", "decoder Autoregressive()",
        lambda: dobj(jnp.zeros(2), S.Autoregressive(), logits=True), "decoder")
    add(kind, "pairs.decoding_objective", "decoder BiasedSpeculative(0.1) (lossy)",
        lambda: dobj(jnp.zeros(2), S.BiasedSpeculative(0.1), logits=True), "decoder")
    add(kind, "pairs.decoding_objective", "apply returning (B, T) rows",
        lambda: dobj(jnp.zeros(2), logits=True, apply=lambda p, x: jnp.zeros((2, 2))), "apply")
    add(kind, "pairs.decoding_objective", "apply returning rows for B = 3",
        lambda: dobj(jnp.zeros(2), logits=True, apply=lambda p, x: jnp.zeros((3, 2, 2))),
        "apply")
    add(kind, "pairs.decoding_objective", "apply returning int rows",
        lambda: dobj(jnp.zeros(2), logits=True,
                     apply=lambda p, x: jnp.zeros((2, 2, 2), jnp.int32)), "apply")
    add(kind, "pairs.decoding_objective", "logits=True, a NaN logit",
        lambda: dobj(jnp.asarray([0.0, math.nan]), logits=True), "apply")
    add(kind, "pairs.decoding_objective", "logits=True, a +inf logit",
        lambda: dobj(jnp.asarray([0.0, math.inf]), logits=True), "apply")
    add(kind, "pairs.decoding_objective", "recording a tuple",
        lambda: dobj(jnp.zeros(2), logits=True, recording=(1, 2)), "recording")
    add(kind, "pairs.decoding_objective", "BatchSpeculative(2) on a recording without rows",
        lambda: dobj(jnp.zeros(2), S.BatchSpeculative(2), logits=True), "recording")

    q_rows = np.array([[[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]]])
    p_rows = np.array([[[0.4, 0.4, 0.2], [0.3, 0.3, 0.4]]])

    @built_once
    def row_rec():
        return S.Recording.from_arrays(jnp.array([[0, 0, 2]]), jnp.asarray(q_rows, jnp.float32),
                                       jnp.asarray(q_rows, jnp.float32), keep_rows=True)

    def div(params, divergence="kl", recording=None, apply=lambda p, x: p, **kw):
        loss = P.divergence_objective(apply, divergence, **kw)
        return loss(jnp.asarray(params, jnp.float32),
                    row_rec() if recording is None else recording)

    add(kind, "pairs.divergence_objective", "'kl' of probability rows (valid)",
        lambda: div(p_rows),
        check=lambda v: _close(v, np.sum(q_rows * np.log(q_rows / p_rows))))
    add(kind, "pairs.divergence_objective", "'tv' of logits (valid)",
        lambda: div(np.log(p_rows), "tv", logits=True),
        check=lambda v: _close(v, 0.5 * np.abs(q_rows - p_rows).sum()))
    add(kind, "pairs.divergence_objective", "divergence 'js'", lambda: div(p_rows, "js"),
        "divergence")
    add(kind, "pairs.divergence_objective", "apply None",
        lambda: div(p_rows, apply=None), "apply")
    add(kind, "pairs.divergence_objective", "logits 'yes'",
        lambda: div(p_rows, logits="yes"), "logits")
    add(kind, "pairs.divergence_objective", "a recording without target rows",
        lambda: div(p_rows, recording=small_rec(),
                    apply=lambda p, x: jnp.full((2, 2, 2), 0.5)), "recording")
    add(kind, "pairs.divergence_objective", "rows over V = 2 < 3",
        lambda: div(p_rows[..., :2] / p_rows[..., :2].sum(-1, keepdims=True)), "apply")
    add(kind, "pairs.divergence_objective", "logits=True, a NaN logit",
        lambda: div(np.where(p_rows == 0.2, np.nan, np.log(p_rows)), logits=True), "apply")
    add(kind, "pairs.divergence_objective", "'kl', rows not summing to one",
        lambda: div(2 * p_rows), "apply")

    # ------------------------------------------------------------------ serving
    kind = "recent: serving"
    for what, args, kw, name in (
            ("draft_time -1", (-1.0, 1.0), {}, "draft_time"),
            ("target_time inf", (0.1, math.inf), {}, "target_time"),
            ("target_time 0", (0.1, 0.0), {}, "target_time"),
            ("target_time table [0.0] (nothing at n = 1)", (0.1, [0.0]), {}, "target_time"),
            ("draft_time a 2-D table", ([[0.0, 0.1]], 1.0), {}, "draft_time"),
            ("draft_time a dict", ({1: 0.1}, 1.0), {}, "draft_time"),
            ("target_time an object()", (0.1, object()), {}, "target_time"),
            ("overhead NaN", (0.1, 1.0), {"overhead": math.nan}, "overhead"),
            ("overhead inf", (0.1, 1.0), {"overhead": math.inf}, "overhead")):
        add(kind, "ServingCost", what, lambda a=args, kw=kw: S.ServingCost(*a, **kw), name)
    for what, fn in (("returning -1", lambda n: -1.0), ("returning NaN", lambda n: math.nan),
                     ("returning a (2,) array", lambda n: np.ones(2))):
        add(kind, "serving_rate", f"target_time a function {what}",
            lambda fn=fn: S.serving_rate(sd2, d(), t(), S.ServingCost(0.1, fn), batch_size=2),
            "target_time")
    for what, decoder in (("SD K = 2", lambda: sd2),
                          ("HeuristicSchedule(1, max_lookahead=3)",
                           lambda: S.HeuristicSchedule(1, max_lookahead=3)),
                          ("AdaptiveSpeculative(RejectionThreshold(0.3))",
                           lambda: S.AdaptiveSpeculative(S.decoders.RejectionThreshold(0.3),
                                                         max_lookahead=2)),
                          ("TraversalVerification((2, 1))",
                           lambda: S.TraversalVerification((2, 1))),
                          ("ParallelDraft(2)", lambda: S.decoders.ParallelDraft(2))):
        add(kind, "serving_rate", f"{what}, batch 1 (valid: = decoding_time's rate)",
            lambda m=decoder: (S.serving_rate(m(), d(), t(), S.ServingCost(0.1, 1.0),
                                              batch_size=1).tokens_per_time,
                               S.theory.decoding_time(m(), d(), t(), cost).tokens_per_time),
            check=lambda r: _close(r[0], r[1]))

    def np_sd_batch3():
        """SD K = 2, B = 3 slots, draft pass 0.1, target forward 0.25 n: the renewal-reward
        rate from the exact call law (independent of the convolution)."""
        new_call = np.asarray(S.exact(sd2, d(), t()).new_call, np.float64)
        horizon = len(new_call)
        passes = np.minimum(2, horizon - np.arange(horizon))  # call at n: min(K, T - n + 1)
        pi = new_call / new_call.sum()
        batch = 3
        draft_part = sum(0.1 * (1 - (1 - pi[passes >= j].sum()) ** batch) for j in (1, 2))
        target_part = 0.25 * batch * (pi * (passes + 1)).sum()
        return batch * horizon / new_call.sum() / (draft_part + target_part)

    add(kind, "serving_rate", "SD K = 2, batch 3, a linear target (valid: renewal reward)",
        lambda: S.serving_rate(sd2, d(), t(), S.ServingCost(0.1, lambda n: 0.25 * n),
                               batch_size=3),
        check=lambda r: _close(r.tokens_per_time, np_sd_batch3()))
    for what, value in (("2.5", 2.5), ("True", True), ("-1", -1)):
        add(kind, "serving_rate", f"batch_size {what}",
            lambda v=value: S.serving_rate(sd2, d(), t(), S.ServingCost(0.1, 1.0), batch_size=v),
            "batch_size")
    add(kind, "theory.threshold_decoder", "price NaN, then serving_rate",
        lambda: S.serving_rate(serving.threshold_decoder(d(), t(), math.nan, max_lookahead=2),
                               d(), t(), S.ServingCost(0.1, 1.0), batch_size=2), "price")
    add(kind, "theory.threshold_decoder", "price NaN, then exact",
        lambda: S.exact(serving.threshold_decoder(d(), t(), math.nan, max_lookahead=2),
                        d(), t()), "price")
    add(kind, "theory.threshold_decoder", "price -0.5 (never stops early: fixed K = 2)",
        lambda: exact32(serving.threshold_decoder(d(), t(), -0.5, max_lookahead=2)), "price",
        check=lambda r: _close(r, exact32(sd2)))
    add(kind, "theory.threshold_decoder", "price 2.0 (always stops: no drafts, T calls)",
        lambda: exact32(serving.threshold_decoder(d(), t(), 2.0, max_lookahead=2)), "price",
        check=lambda r: _close(r, 3.0))
    add(kind, "theory.threshold_decoder", "max_lookahead 0",
        lambda: serving.threshold_decoder(d(), t(), 0.5, max_lookahead=0), "max_lookahead")
    add(kind, "theory.threshold_decoder", "draft of another horizon",
        lambda: serving.threshold_decoder(S.random_markov_chain(k(), 4, 2), t(), 0.5,
                                          max_lookahead=2), ("draft", "target"))
    add(kind, "theory.threshold_decoder", "draft a FiniteStateModel",
        lambda: serving.threshold_decoder(
            S.FiniteStateModel(0, np.zeros((1, 4), np.int32), np.full((1, 4), 0.25)), t(), 0.5,
            max_lookahead=2), "draft")
    add(kind, "theory.goodput", "slot_work then goodput, batch 1 (valid: = serving_rate)",
        lambda: (serving.goodput(serving.slot_work(sd2, d(), t()), S.ServingCost(0.1, 1.0),
                                 batch_size=1).tokens_per_time,
                 S.theory.decoding_time(sd2, d(), t(), cost).tokens_per_time),
        check=lambda r: _close(r[0], r[1]))
    add(kind, "theory.goodput", "work a tuple",
        lambda: serving.goodput((1.0, 2.0), S.ServingCost(0.1, 1.0), batch_size=2), "work")
    add(kind, "theory.goodput", "batch_size 0",
        lambda: serving.goodput(serving.slot_work(sd2, d(), t()), S.ServingCost(0.1, 1.0),
                                batch_size=0), "batch_size")
    add(kind, "theory.slot_work", "decoder 'sd'",
        lambda: serving.slot_work("sd", d(), t()), "decoder")
    add(kind, "theory.slot_work", "SD K = 2 (valid: calls = exact's)",
        lambda: serving.slot_work(sd2, d(), t()).calls, check=lambda c: _close(c, exact32(sd2)))

    doc_cost = lambda: S.ServingCost(0.1, [0.0] + [1.0] * 4 + [1.5] * 4)  # noqa: E731
    add(kind, "theory.serving.step_time", "[2, 0] (valid: 0.1 + 0.1 + target[4] = 1.2)",
        lambda: serving.step_time([2, 0], doc_cost()), check=lambda r: abs(r - 1.2) < 1e-12)
    for what, value in (("[-1, 3]", [-1, 3]), ("2-D [[1, 2], [3, 0]]", [[1, 2], [3, 0]]),
                        ("[1.5, 2]", [1.5, 2]), ("[] (no slots)", [])):
        add(kind, "theory.serving.step_time", f"lookaheads {what}",
            lambda v=value: serving.step_time(v, doc_cost()), "lookaheads")
    add(kind, "theory.serving.step_time", "cost a tuple",
        lambda: serving.step_time([1, 1], (0.1, 1.0)), "cost")
    add(kind, "theory.serving.step_time", "[8, 8]: target table too short",
        lambda: serving.step_time([8, 8], doc_cost()), "target_time")

    neg_draft = [0.0, 0.1, 0.6, 1.1]  # affine over n = 1..3 with a negative intercept -0.4
    neg_target = [0.0] + [1.0] * 12
    survival = [[0.95, 0.9, 0.85], [0.9, 0.8, 0.7], [0.3, 0.1, 0.0]]
    add(kind, "theory.allocate_drafts", "draft_time affine with a negative intercept "
        "(a clear refusal, or = brute force)",
        lambda: S.theory.allocate_drafts(survival, S.ServingCost(neg_draft, neg_target)),
        error=("draft_time",), check=lambda a: _close(a.tokens_per_time,
                               np_best_allocation(survival, neg_draft, neg_target), rtol=1e-9))
    pos_draft = [0.0] + [0.05 + 0.1 * n for n in range(1, 4)]
    add(kind, "theory.allocate_drafts", "draft_time 0.05 + 0.1 n (valid: = brute force)",
        lambda: S.theory.allocate_drafts(survival, S.ServingCost(pos_draft, neg_target)),
        check=lambda a: _close(a.tokens_per_time,
                               np_best_allocation(survival, pos_draft, neg_target), rtol=1e-9))
    add(kind, "theory.allocate_drafts", "survival (2, 0) (valid: SD off)",
        lambda: S.theory.allocate_drafts(np.zeros((2, 0)), doc_cost()),
        check=lambda a: a.lookaheads.tolist() == [0, 0] and a.tokens == 2.0)
    for what, value in (("increasing rows", [[0.5, 0.9]]), ("1-D", [0.9, 0.5]),
                        ("a NaN", [[0.9, math.nan]]), ("1.5", [[1.5, 0.5]])):
        add(kind, "theory.allocate_drafts", f"survival {what}",
            lambda v=value: S.theory.allocate_drafts(v, doc_cost()), "survival")
    add(kind, "theory.allocate_drafts", "draft_time not affine",
        lambda: S.theory.allocate_drafts([[0.9], [0.8], [0.7]],
                                         S.ServingCost([0.0, 0.1, 0.1, 0.5], neg_target)),
        ("draft_time", "cost"))

    serve = lambda: S.ServingCost(0.1, 1.0)  # noqa: E731
    add(kind, "theory.batch_lookahead", "batch 1, max_lookahead 3 (valid: = best_lookahead)",
        lambda: (S.theory.batch_lookahead(d(), t(), serve(), batch_size=1, max_lookahead=3),
                 S.theory.best_lookahead(d(), t(), cost, max_lookahead=3)),
        check=lambda r: r[0].lookahead == r[1].lookahead)
    add(kind, "theory.batch_lookahead", "max_lookahead 0",
        lambda: S.theory.batch_lookahead(d(), t(), serve(), batch_size=2, max_lookahead=0),
        "max_lookahead",
        check=lambda r: r.lookahead == 0 and isinstance(r.decoder, S.Autoregressive))
    add(kind, "theory.batch_lookahead", "max_lookahead -1",
        lambda: S.theory.batch_lookahead(d(), t(), serve(), batch_size=2, max_lookahead=-1),
        "max_lookahead")
    for what, value in (("[]", []), ("[1, 0]", [1, 0]), ("'4'", "4")):
        add(kind, "theory.batch_lookahead", f"batch_size {what}",
            lambda v=value: S.theory.batch_lookahead(d(), t(), serve(), batch_size=v,
                                                     max_lookahead=2), "batch_size")
    add(kind, "theory.request_policy", "batch 4, prices [0.3, 0.6] (valid: its rate is exact)",
        lambda: S.theory.request_policy(d(), t(), serve(), batch_size=4, max_lookahead=2,
                                        prices=[0.3, 0.6]),
        check=lambda r: r.tokens_per_time >= r.fixed_rates.max() - 1e-9 and _close(
            r.tokens_per_time, S.serving_rate(r.decoder, None if r.lookahead == 0 else d(), t(),
                                              serve(), batch_size=4).tokens_per_time))
    for what, value in (("[NaN]", [math.nan]), ("[1.5]", [1.5]), ("2-D", [[0.3]]),
                        ("'0.5'", "0.5")):
        add(kind, "theory.request_policy", f"prices {what}",
            lambda v=value: S.theory.request_policy(d(), t(), serve(), batch_size=2,
                                                    max_lookahead=1, prices=v), "prices")
    add(kind, "theory.request_policy", "cost a CostModel",
        lambda: S.theory.request_policy(d(), t(), cost, batch_size=2, max_lookahead=1,
                                        prices=[0.5]), "cost")

    # ------------------------------------------------------------------ newer decoders
    kind = "recent: decoders"
    for what, make in (("TraversalVerification((1, 1)) (= BlockVerification(2))",
                        lambda: S.TraversalVerification((1, 1))),
                       ("TraversalVerification((2, 1), without_replacement)",
                        lambda: S.TraversalVerification((2, 1), children="without_replacement")),
                       ("ParallelDraft(2)", lambda: S.decoders.ParallelDraft(2)),
                       ("ThresholdVerification(1, 1) (lossless)",
                        lambda: S.ThresholdVerification(1.0, 1.0, lookahead=2)),
                       ("HeuristicSchedule(2, max_lookahead=3)",
                        lambda: S.HeuristicSchedule(2, max_lookahead=3))):
        add(kind, "exact", f"{what}: marginals are the target's (valid)",
            lambda m=make: S.exact(m(), d(), t()).marginals,
            check=lambda m: _close(m, target_marginals(), atol=1e-5))
    add(kind, "exact", "TraversalVerification((1, 1)) calls = BlockVerification(2)'s (valid)",
        lambda: exact32(S.TraversalVerification((1, 1))),
        check=lambda r: _close(r, reference64("block2_calls")))
    add(kind, "exact", "ParallelDraft(1) calls = Speculative(lookahead=1)'s (valid)",
        lambda: exact32(S.decoders.ParallelDraft(1)),
        check=lambda r: _close(r, exact32(S.Speculative(lookahead=1))))
    add(kind, "exact", "ParallelDraft(2, heads = marginal_heads) = heads None (valid)",
        lambda: exact32(S.decoders.ParallelDraft(2, heads=S.decoders.marginal_heads(
            d().trans, 2))),
        check=lambda r: _close(r, exact32(S.decoders.ParallelDraft(2))))
    add(kind, "exact", "HeuristicSchedule(2, max 2, +0/-0) = Speculative(lookahead=2) (valid)",
        lambda: exact32(S.HeuristicSchedule(2, max_lookahead=2, increase=0, decrease=0)),
        check=lambda r: _close(r, exact32(sd2)))
    add(kind, "TraversalVerification", "branching (2.5,)",
        lambda: S.TraversalVerification((2.5,)), "branching")
    add(kind, "TraversalVerification", "branching ()",
        lambda: S.exact(S.TraversalVerification(()), d(), t()), "branching")
    add(kind, "TraversalVerification", "from_parents((-1, 5))",
        lambda: S.TraversalVerification.from_parents((-1, 5)), "parents")
    add(kind, "TraversalVerification", "branching (8, 8, 8, 8) exact (law too big)",
        lambda: S.exact(S.TraversalVerification((8, 8, 8, 8)), d(), t()), "branching",
        isolate=True)
    for what, make, name in (("lookahead 0", lambda: S.decoders.ParallelDraft(0), "lookahead"),
                             ("lookahead 2.0", lambda: S.decoders.ParallelDraft(2.0),
                              "lookahead"),
                             ("rule Speculative(lookahead=2)",
                              lambda: S.exact(S.decoders.ParallelDraft(2, rule=sd2), d(), t()),
                              "rule"),
                             ("rule 'sd'", lambda: S.decoders.ParallelDraft(2, rule="sd"),
                              "rule"),
                             ("heads of shape (2, 3, 4)",
                              lambda: S.exact(S.decoders.ParallelDraft(
                                  2, heads=jnp.full((2, 3, 4), 0.25)), d(), t()), "heads"),
                             ("heads with a NaN",
                              lambda: S.exact(S.decoders.ParallelDraft(
                                  2, heads=jnp.full((2, 3, 4, 4), 0.25).at[0, 0, 0, 0].set(
                                      math.nan)), d(), t()), "heads"),
                             ("heads for another horizon",
                              lambda: S.exact(S.decoders.ParallelDraft(
                                  2, heads=jnp.full((2, 5, 4, 4), 0.25)), d(), t()), "heads")):
        add(kind, "decoders.ParallelDraft", what, make, name)
    for what, args, name in (("(-0.5, 0.7)", (-0.5, 0.7), "threshold_single"),
                             ("(0.5, NaN)", (0.5, math.nan), "threshold_acc"),
                             ("(0.5, 1.5)", (0.5, 1.5), "threshold_acc"),
                             ("('0.5', 0.5)", ("0.5", 0.5), "threshold_single")):
        add(kind, "ThresholdVerification", f"thresholds {what}, exact",
            lambda a=args: S.exact(S.ThresholdVerification(*a), d(), t()), name)
    add(kind, "ThresholdVerification", "thresholds (-0.5, 0.7), serving_rate",
        lambda: S.serving_rate(S.ThresholdVerification(-0.5, 0.7, lookahead=2), d(), t(),
                               serve(), batch_size=2), "threshold_single")
    add(kind, "HeuristicSchedule", "minimum 0",
        lambda: S.HeuristicSchedule(1, max_lookahead=3, minimum=0), "minimum")
    add(kind, "HeuristicSchedule", "decrease True",
        lambda: S.HeuristicSchedule(1, max_lookahead=3, decrease=True), "decrease")

    # ------------------------------------------------------------------ provenance and history
    kind = "recent: auditing"
    from specjax.auditing import check_provenance  # noqa: PLC0415
    from specjax.auditing import sequence_fit  # noqa: PLC0415
    from specjax.auditing import sequence_law  # noqa: PLC0415
    uniform = np.full((400, 1, 4), 0.25, np.float32)

    @built_once
    def fair():
        return np.asarray(jax.random.randint(k(), (400, 1), 0, 4))

    for what, kw, name in (("alpha NaN", {"alpha": math.nan}, "alpha"),
                           ("alpha 0", {"alpha": 0.0}, "alpha"),
                           ("num_bins 0", {"num_bins": 0}, "num_bins"),
                           ("bins ('foo',)", {"bins": ("foo",)}, "bins")):
        add(kind, "check_provenance", what,
            lambda kw=kw: check_provenance(fair(), uniform, **kw), name)
    add(kind, "check_provenance", "num_drafts all 0 (nothing to test: not tested)",
        lambda: check_provenance(fair(), uniform, num_drafts=np.zeros(400, np.int32)),
        "num_drafts", check=lambda r: not r.tested and not r.flagged)
    add(kind, "check_provenance", "draft_probs with a NaN",
        lambda: check_provenance(fair(), np.where(np.arange(4) == 1, np.nan, uniform)),
        "draft_probs")
    add(kind, "check_provenance", "draft_probs rows summing to 2",
        lambda: check_provenance(fair(), 2 * uniform), "draft_probs")
    add(kind, "check_provenance", "draft_probs for 300 runs, 400 tokens",
        lambda: check_provenance(fair(), uniform[:300]), ("draft_probs", "draft_tokens"))
    add(kind, "check_provenance", "draft token 4 with V = 4",
        lambda: check_provenance(np.full((400, 1), 4), uniform), "draft_tokens")

    x = np.array([1])
    p1 = np.array([[0.5, 0.5, 0.0]], np.float32)
    q2 = np.array([[0.4, 0.4, 0.2], [0.3, 0.3, 0.4]], np.float32)
    outs = np.tile(np.array([1, 2]), (50, 1))

    def compare(*args, **kw):
        base = [S.Speculative(), x, p1, q2, outs]
        for i, a in enumerate(args):
            if a is not None:
                base[i] = a
        return S.compare_outputs(*base, **kw)

    for what, args, kw, name in (
            ("alpha NaN", (), {"alpha": math.nan}, "alpha"),
            ("alpha 0", (), {"alpha": 0.0}, "alpha"),
            ("draft_probs with a NaN", (None, None, np.array([[0.5, math.nan, 0.5]],
                                                              np.float32)), {}, "draft_probs"),
            ("target_probs of one row for one draft", (None, None, None, q2[:1]), {},
             "target_probs"),
            ("target_probs rows of V = 2", (None, None, None, q2[:, :2]), {},
             "target_probs"),
            ("draft token 3 with V = 3", (None, np.array([3])), {}, "draft_tokens"),
            ("bonus 'yes'", (), {"bonus": "yes"}, "bonus"),
            ("decoder 'sd'", ("sd",), {}, "decoder")):
        add(kind, "compare_outputs", what, lambda a=args, kw=kw: compare(*a, **kw), name)
    add(kind, "compare_outputs", "emitted token 7 with V = 3 (refused, or flagged impossible)",
        lambda: compare(None, None, None, None, np.tile(np.array([1, 7]), (50, 1))), "tokens",
        check=lambda r: r.flagged and r.impossible == 50 and "nan" not in r.summary().lower())

    @built_once
    def law():
        base = S.FiniteStateModel(0, jnp.zeros((1, 2), int), jnp.array([[0.25, 0.75]]))
        return sequence_law(base, 1)

    def samples():
        lw = law()
        return lw.sequences[np.random.default_rng(3).choice(len(lw.probs), 2000, p=lw.probs)]

    for what, run, name in (
            ("alpha NaN", lambda: sequence_fit(samples(), law(), alpha=math.nan), "alpha"),
            ("alpha 2", lambda: sequence_fit(samples(), law(), alpha=2.0), "alpha"),
            ("tokens of length 3 for a law of length 2",
             lambda: sequence_fit(np.zeros((50, 3), np.int32), law()), "tokens"),
            ("tokens 1-D", lambda: sequence_fit(np.zeros(50, np.int32), law()), "tokens"),
            ("a token 5 with V = 2", lambda: sequence_fit(np.full((50, 2), 5), law()), "tokens"),
            ("law a dict", lambda: sequence_fit(samples(), {"probs": [1.0]}), "law")):
        add(kind, "sequence_fit", what, run, name)

    # ------------------------------------------------------------------ penalties and grammars
    kind = "recent: processing"
    from specjax.models import Grammar  # noqa: PLC0415
    from specjax.models import Penalties  # noqa: PLC0415
    from specjax.models import constrain  # noqa: PLC0415
    from specjax.models import penalize  # noqa: PLC0415
    row = np.array([0.5, 0.3, 0.2])

    def base():
        return S.FiniteStateModel(0, jnp.zeros((1, 3), int), jnp.asarray(row[None], jnp.float32))

    def probs_after(model, tokens):
        state = model.init_state()
        for token in tokens:
            state = model.update(state, token)
        return np.asarray(model.probs(state), np.float64)

    add(kind, "models.penalize", "repetition 2 after x_0 = 0 (valid: rows by hand)",
        lambda: probs_after(penalize(base(), Penalties(repetition=2.0)), [0]),
        check=lambda r: _close(r, np_softmax(np.log(row) * np.array([2.0, 1.0, 1.0]))))
    add(kind, "models.penalize", "frequency 1, cap 2 after 0, 1, 1 (valid: rows by hand)",
        lambda: probs_after(penalize(base(), Penalties(frequency=1.0, cap=2)), [0, 1, 1]),
        check=lambda r: _close(r, np_softmax(np.log(row) - np.array([0.0, 2.0, 0.0]))))
    add(kind, "models.penalize", "presence -0.5 after 0, 2 (valid: a negative presence)",
        lambda: probs_after(penalize(base(), Penalties(presence=-0.5)), [0, 2]),
        check=lambda r: _close(r, np_softmax(np.log(row) + np.array([0.0, 0.0, 0.5]))))
    for what, pen, name in (("repetition -1", lambda: Penalties(repetition=-1.0), "repetition"),
                            ("repetition 0", lambda: Penalties(repetition=0.0), "repetition"),
                            ("frequency NaN", lambda: Penalties(frequency=math.nan),
                             "frequency"),
                            ("presence inf", lambda: Penalties(presence=math.inf), "presence"),
                            ("repetition '2'", lambda: Penalties(repetition="2"), "repetition"),
                            ("repetition [1, 2]", lambda: Penalties(repetition=[1.0, 2.0]),
                             "repetition"),
                            ("cap 0", lambda: Penalties(cap=0), "cap"),
                            ("cap 2.0", lambda: Penalties(cap=2.0), "cap"),
                            ("a dict", lambda: {"repetition": 2.0}, "penalties")):
        add(kind, "models.penalize", f"penalties {what}",
            lambda pen=pen: penalize(base(), pen()), name)
    add(kind, "models.penalize", "model a string",
        lambda: penalize("bigram", Penalties()), "model")
    add(kind, "models.penalize", "logits of shape (2, 3)",
        lambda: penalize(base(), Penalties(repetition=2.0), logits=jnp.zeros((2, 3))), "logits")
    add(kind, "models.penalize", "logits with a NaN",
        lambda: penalize(base(), Penalties(repetition=2.0),
                         logits=jnp.asarray([[0.0, math.nan, 1.0]])), "logits")

    alt_allowed = np.array([[True, False, True], [False, True, True]])
    alt_next = np.array([[1, 1, 1], [0, 0, 0]])
    add(kind, "models.constrain", "alternating grammar after x_0 = 0 (valid: rows by hand)",
        lambda: probs_after(constrain(base(), Grammar(alt_allowed, alt_next)), [0]),
        check=lambda r: _close(r, [0.0, 0.6, 0.4]))
    add(kind, "models.constrain", "SD under a grammar on both models (valid: lossless)",
        lambda: (S.exact(S.Speculative(lookahead=2),
                         constrain(S.random_markov_chain(jax.random.key(5), 3, 3), Grammar(
                             alt_allowed, alt_next)),
                         constrain(S.random_markov_chain(jax.random.key(6), 3, 3), Grammar(
                             alt_allowed, alt_next)), horizon=3).marginals,
                 S.exact(S.Autoregressive(), None,
                         constrain(S.random_markov_chain(jax.random.key(6), 3, 3), Grammar(
                             alt_allowed, alt_next)), horizon=3).marginals),
        check=lambda r: _close(r[0], r[1]))
    for what, grammar, name in (
            ("allowed of ints", lambda: Grammar(alt_allowed.astype(int), alt_next), "allowed"),
            ("a state that allows nothing",
             lambda: Grammar(np.array([[True, False, True], [False] * 3]), alt_next), "allowed"),
            ("allowed over V = 2", lambda: Grammar(alt_allowed[:, :2], alt_next[:, :2]),
             "allowed"),
            ("transitions to state 2 of 2", lambda: Grammar(alt_allowed, alt_next + 1),
             "transitions"),
            ("transitions of floats", lambda: Grammar(alt_allowed, alt_next.astype(float)),
             "transitions"),
            ("start 5", lambda: Grammar(alt_allowed, alt_next, 5), "start"),
            ("start True", lambda: Grammar(alt_allowed, alt_next, True), "start"),
            ("a dict", lambda: {"allowed": alt_allowed}, "grammar")):
        add(kind, "models.constrain", f"grammar {what}",
            lambda g=grammar: constrain(base(), g()), name)

    # ------------------------------------------------------------------ fast random chains
    kind = "recent: random chains"
    fast = functools.partial(S.random_markov_chain, method="fast")
    for what, value in (("0", 0.0), ("-1", -1.0), ("NaN", math.nan), ("inf", math.inf),
                        ("a (2,) array", np.ones(2)), ("'1'", "1")):
        add(kind, "random_markov_chain(method='fast')", f"concentration {what}",
            lambda v=value: fast(k(), 4, 3, v), "concentration")
    for what, args, name in (("num_states 0", (0, 3), "num_states"),
                             ("horizon 0", (4, 0), "horizon"),
                             ("num_states -2", (-2, 3), "num_states"),
                             ("horizon 2.0", (4, 2.0), "horizon")):
        add(kind, "random_markov_chain(method='fast')", what,
            lambda a=args: fast(k(), *a), name)
    add(kind, "random_markov_chain", "method 'slow'",
        lambda: S.random_markov_chain(k(), 4, 3, method="slow"), "method")
    add(kind, "random_markov_chain(method='fast')", "num_states 1 (valid: rows [1])",
        lambda: fast(k(), 1, 3), check=lambda c: _close(c.trans, np.ones((3, 1, 1))))
    for conc in (0.1, 1.0, 100.0):
        var = conc * 3 * conc / ((4 * conc) ** 2 * (4 * conc + 1))  # Dirichlet(conc 1_4)
        add(kind, "random_markov_chain(method='fast')",
            f"concentration {conc:g}, T = 500 (valid: Dirichlet mean and variance)",
            lambda c=conc: np.asarray(fast(jax.random.key(11), 4, 500, c).trans, np.float64),
            check=lambda tr, v=var: is_law(tr) and abs(tr.mean() - 0.25) < 0.02
            and abs(tr.var() / v - 1) < 0.2)
    add(kind, "random_markov_chain(method='fast')", "jax.jit, traced concentration 0 (NaN rows)",
        lambda: bool(jnp.all(jnp.isnan(jax.jit(lambda c: fast(k(), 4, 3, c).trans)(0.0)))),
        check=lambda r: r is True, isolate=True)

    # ------------------------------------------------------------------ bench flags
    kind = "recent: CLI"
    entry = "python -m specjax bench"
    add(kind, entry, "--cases foo", cli("bench", "--quick", "--cases", "foo"), "--cases")
    add(kind, entry, "--cases with no name", cli("bench", "--quick", "--cases"), "--cases")
    add(kind, entry, "--cases Theory (case)", cli("bench", "--quick", "--cases", "Theory"),
        "--cases")
    add(kind, entry, "a stray positional 'quick'", cli("bench", "quick"), ("quick", "bench"))

    def bench_run(*extra):
        def run():
            with tempfile.TemporaryDirectory() as tmp:
                cli("bench", "--quick", "--out", tmp, *extra)()
                folder = pathlib.Path(tmp)
                return json.loads((folder / "bench.json").read_text()), (
                    folder / "bench.md").read_text()
        return run

    add(kind, entry, "--quick --cases theory theory (valid: one run of the case)",
        bench_run("--cases", "theory", "theory"),
        check=lambda r: r[0]["mode"] == "quick" and len(r[0]["rows"]) > 0
        and len({json.dumps(row, sort_keys=True) for row in r[0]["rows"]}) == len(r[0]["rows"])
        and "nan" not in r[1].lower())
