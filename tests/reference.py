"""Independent reference implementations used only by the tests.

Nothing here imports specjax: these are the paper's pseudo-code, transcribed literally in plain
Python/NumPy float64, so that the fast samplers can be checked against them.

* ``sd_literal``, ``batch_literal``, ``general_literal``: Algorithms 1, 2 and 4 as written:
  whole draft sequences are drafted up front (up to the lookahead), verified in order, and the
  round restarts after a rejection (or after a bonus token).
* Every random choice goes through a *chooser*. ``RandomChooser`` samples; ``enumerate_law`` runs
  the algorithm once per execution path (depth-first over the choice points, by replay), so the
  exact law of the outcome ``(tokens, rejected, calls)`` is obtained by brute force.
* ``exact_counts``: expected rejections and calls by a forward recursion over the (token, phase)
  state, written from the pseudo-code's semantics.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np


# ----------------------------------------------------------------------------- choosers
class RandomChooser:
    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def categorical(self, probs) -> int:
        probs = np.asarray(probs, np.float64)
        return int(self.rng.choice(len(probs), p=probs / probs.sum()))

    def bernoulli(self, prob) -> bool:
        return bool(self.rng.random() < prob)


class _ReplayChooser:
    """Follows a fixed prefix of choices, then takes the first positive option, recording it."""

    def __init__(self, prefix):
        self.prefix = prefix
        self.taken = []  # (option index, options with positive probability)
        self.prob = 1.0

    def categorical(self, probs) -> int:
        # Over Python floats: the enumerations call this millions of times on a few entries,
        # where NumPy's per-call overhead dominated. The same numbers bit for bit: NumPy adds
        # fewer than 8 entries one after the other (longer rows are added by NumPy).
        array = np.asarray(probs, np.float64)
        values = array.tolist()
        if len(values) < 8:
            total = 0.0
            for value in values:
                total += value
        else:
            total = float(array.sum())
        options = [i for i, value in enumerate(values) if value > 0]
        depth = len(self.taken)
        choice = self.prefix[depth] if depth < len(self.prefix) else options[0]
        self.taken.append((choice, options))
        self.prob *= values[choice] / total
        return choice

    def bernoulli(self, prob) -> bool:
        prob = float(prob)
        return bool(self.categorical((1.0 - prob, prob)))


def enumerate_law(run) -> dict:
    """Exact law of ``run(chooser)`` (a hashable outcome) over every execution path."""
    law = defaultdict(float)
    stack = [()]
    while stack:
        prefix = stack.pop()
        chooser = _ReplayChooser(prefix)
        outcome = run(chooser)
        law[outcome] += chooser.prob
        for depth in range(len(prefix), len(chooser.taken)):
            taken, options = chooser.taken[depth]
            head = tuple(c for c, _ in chooser.taken[:depth])
            for option in options:
                if option != taken:
                    stack.append(head + (option,))
    return dict(law)


# ----------------------------------------------------------------------------- rules
def biased_accept(p, q, eps):
    """``min(1, (q + eps) / p)``, 1 where ``p = 0``; ``eps = 0`` is SD."""
    return np.where(p > 0, np.minimum(1.0, (q + eps) / np.where(p > 0, p, 1.0)), 1.0)


def sd_accept(p, q):
    return biased_accept(p, q, 0.0)


def sd_accept_entry(p: float, q: float) -> float:
    """``sd_accept`` of one entry, over Python floats (the same number, without NumPy's
    per-call overhead in the enumerations)."""
    p, q = float(p), float(q)
    return min(1.0, q / p) if p > 0 else 1.0


def optimal_residual(p, q, b):
    """Theorem 4's P*: normalised ``[q - b p]_+``."""
    return positive_part(q - b * p)


def positive_part(w):
    w = np.maximum(w, 0.0)
    s = w.sum()
    return w / s if s > 0 else w


def sd_residual(p, q, b):
    return positive_part(q - p)


# ----------------------------------------------------------------------------- algorithms
def _stop_after_call(x, rejected, start, stop, horizon):
    """HuggingFace's and keras-hub's ending, after a call that emitted ``x[start:]``: if one of
    those tokens is in ``stop``, the output is cut after the first one and the generation ends.
    Returns ``None`` (go on), or the outcome padded to ``T`` positions with the stop token (not
    rejected)."""
    for i in range(start, len(x)):
        if x[i] in stop:
            x, rejected = list(x[:i + 1]), list(rejected[:i])
            pad = horizon + 1 - len(x)
            return tuple(x + [x[-1]] * pad), tuple(rejected + [False] * pad)
    return None


def general_literal(chooser, draft, target, accept, residual, lookahead=None, stop=()):
    """Algorithm 2 with lookahead ``K`` (``None``: ``K = T``), bonus token after ``K`` accepts.

    ``draft`` and ``target`` are ``(init (V,), trans (T, V, V))`` NumPy pairs. ``stop``: token
    ids that end the generation after the call that emits one (``_stop_after_call``).
    Returns ``(tokens x_0..x_T, rejected R_1..R_T, calls)``.
    """
    p_init, p_trans = draft
    q_init, q_trans = target
    horizon = q_trans.shape[0]
    k = horizon if lookahead is None else lookahead
    x = [chooser.categorical(q_init)]
    rejected = []
    calls = 0
    n = 1  # next position to fill
    while n <= horizon:
        calls += 1
        # Draft the whole block first (positions n .. n + K - 1, clipped to T).
        last = min(n + k - 1, horizon)
        drafts = []
        prev = x[-1]
        for t in range(n, last + 1):
            tok = chooser.categorical(p_trans[t - 1, prev])
            drafts.append(tok)
            prev = tok
        # Verify in order.
        prev = x[-1]
        all_accepted = True
        for t, tok in zip(range(n, last + 1), drafts):
            p_row, q_row = p_trans[t - 1, prev], q_trans[t - 1, prev]
            b = accept(p_row, q_row)
            if chooser.bernoulli(b[tok]):
                x.append(tok)
                rejected.append(False)
                prev = tok
            else:
                x.append(chooser.categorical(positive_part(residual(p_row, q_row, b))))
                rejected.append(True)
                all_accepted = False
                break
        if all_accepted and last - n + 1 == k and last < horizon:
            # All K drafts accepted and positions remain: the target's bonus token.
            x.append(chooser.categorical(q_trans[last, x[-1]]))
            rejected.append(False)
        ended = _stop_after_call(x, rejected, n, stop, horizon)
        if ended is not None:
            return ended + (calls,)
        n = len(x)
    return tuple(x), tuple(rejected), calls


def sd_literal(chooser, draft, target, lookahead=None, stop=()):
    """Algorithm 1 (``lookahead=None``) or practical SD with lookahead ``K``."""
    return general_literal(chooser, draft, target, sd_accept, sd_residual, lookahead, stop)


def sd_rounds_literal(chooser, draft, target, lookahead):
    """SD with lookahead ``K`` (Leviathan et al.), recording its rounds: each call drafts
    ``K' = min(K, T - n + 1)`` tokens one by one, then verifies them in order. Returns
    ``((drafted, kept), ...)``, one pair per call: ``adaptive_literal`` with a policy that never
    stops early (the same draws in the same order)."""
    return adaptive_literal(chooser, draft, target, lookahead, lambda *state: False)[3]


def adaptive_literal(chooser, draft, target, max_lookahead, stop, schedule=None):
    """SD whose draft length a stopping policy chooses, literally: before each draft of a call
    from position ``n``, ``stop(position, depth, token, token_prob, all_accepted, next_row)``
    (plain floats and the draft's next row) decides whether to call the target; at ``K`` drafts
    or the horizon the call stops. The drafts are verified in order; a rejection draws from
    ``[q - p]_+``; all kept, the target's bonus token follows (if a position is left). Returns
    ``(tokens, rejected flags, calls, rounds)``, ``rounds`` the ``(drafted, kept)`` of each call.

    ``schedule = (initial, update)``: a draft length carried from call to call, updated after
    each call as HuggingFace's assisted generation updates ``num_assistant_tokens``: the first
    call drafts at most ``initial`` tokens, and after a call that drafted at most ``k`` and kept
    ``kept`` the next drafts at most ``update(k, kept)``. (Near the horizon HuggingFace drafts one
    token fewer than here, to leave room for the target's token; see ``HeuristicSchedule``.)"""
    _, p_trans = draft
    q_init, q_trans = target
    horizon = q_trans.shape[0]
    x = [chooser.categorical(q_init)]
    flags, rounds = [], []
    k = max_lookahead if schedule is None else schedule[0]
    while len(x) <= horizon:
        n = len(x)
        drafts, prev, prob, all_accepted = [], x[-1], 1.0, 1.0
        while len(drafts) < min(k, horizon - n + 1):
            t = n + len(drafts)  # the position of the next draft
            row = p_trans[t - 1, prev]
            if stop(t, len(drafts), prev, prob, all_accepted, row):
                break
            tok = chooser.categorical(row)
            prob = row[tok]
            all_accepted *= min(1.0, q_trans[t - 1, prev][tok] / row[tok])
            drafts.append(tok)
            prev = tok
        prev, kept = x[-1], 0
        for t, tok in zip(range(n, n + len(drafts)), drafts):
            p_row, q_row = p_trans[t - 1, prev], q_trans[t - 1, prev]
            if chooser.bernoulli(min(1.0, q_row[tok] / p_row[tok])):
                x.append(tok)
                flags.append(False)
                prev = tok
                kept += 1
            else:
                x.append(chooser.categorical(np.maximum(q_row - p_row, 0)))
                flags.append(True)
                break
        last = n + len(drafts) - 1
        if kept == len(drafts) and last < horizon:
            x.append(chooser.categorical(q_trans[last, x[-1]]))  # the bonus token
            flags.append(False)
        rounds.append((len(drafts), kept))
        if schedule is not None:
            k = schedule[1](k, kept)
    return tuple(x), tuple(flags), len(rounds), tuple(rounds)


def adaptive_summary(pair, stop, cost, max_lookahead, schedule=None):
    """``adaptive_literal`` enumerated over every execution path: ``(token law, law of (tokens,
    rejected flags, calls), means)``, the means of the calls, rejections, time under ``cost``,
    drafted and kept tokens."""
    draft, target = pair
    law = enumerate_law(lambda c: adaptive_literal(c, draft, target, max_lookahead, stop,
                                                   schedule=schedule))
    tokens, joint, means = defaultdict(float), defaultdict(float), defaultdict(float)
    for (x, flags, calls, rounds), prob in law.items():
        tokens[x] += prob
        joint[(x, flags, calls)] += prob
        means["calls"] += prob * calls
        means["rejections"] += prob * sum(flags)
        means["time"] += prob * literal_clock(rounds, cost)
        means["drafted"] += prob * sum(d for d, _ in rounds)
        means["kept"] += prob * sum(k for _, k in rounds)
    return dict(tokens), dict(joint), dict(means)


def literal_clock(rounds, cost):
    """The time of a literal run's rounds ``(drafted, kept)`` under a ``CostModel``."""
    return sum(d * cost.draft_cost + cost.target_time(d + 1) + cost.call_overhead
               for d, _ in rounds)


def draw_drafts(chooser, p_trans, root, start, num_drafts, replacement=True):
    """The ``M`` whole draft sequences of a multi-draft call from position ``start`` to ``T``
    after token ``root``, and the law each first token was drawn from: ``p`` for i.i.d. drafts;
    without replacement ``p`` with the earlier first tokens removed (renormalised), and fewer
    drafts when no token is left. Returns ``(drafts, first_laws)``."""
    horizon = p_trans.shape[0]
    drafts, first_laws = [], []
    first_law = p_trans[start - 1, root].copy()
    for _ in range(num_drafts):
        if first_law.sum() <= 0:
            break  # without replacement: no token left to propose
        seq, prev = [], root
        for t in range(start, horizon + 1):
            row = first_law if t == start else p_trans[t - 1, prev]
            tok = chooser.categorical(row)
            seq.append(tok)
            prev = tok
        drafts.append(seq)
        first_laws.append(first_law)
        if not replacement:
            first_law = first_law.copy()
            first_law[seq[0]] = 0.0
            first_law = positive_part(first_law)
    return drafts, first_laws


def verify_rest(chooser, p_trans, q_trans, x, rejected, seq):
    """SD on the later tokens ``seq[1:]`` of a followed draft whose first token is ``x[-1]``:
    each appended to ``x`` if accepted, else a token from ``[q - p]_+`` ends the call (appended
    to ``x`` and ``rejected`` in place)."""
    start = len(x)
    for t, tok in zip(range(start, q_trans.shape[0] + 1), seq[1:]):
        p_row, q_row = p_trans[t - 1, x[-1]], q_trans[t - 1, x[-1]]
        if chooser.bernoulli(sd_accept_entry(p_row[tok], q_row[tok])):
            x.append(tok)
            rejected.append(False)
        else:
            x.append(chooser.categorical(positive_part(q_row - p_row)))
            rejected.append(True)
            break


def batch_literal(chooser, draft, target, num_drafts, literal_reading=False, replacement=True,
                  stop=()):
    """Algorithm 4 with ``K = T``.

    ``literal_reading=False`` follows the appendix proof: after all ``M`` first tokens are
    rejected, the token is drawn from ``q^{M+1}``. ``literal_reading=True`` reads line 28 of the
    pseudo-code literally: ``[q_n - p_n]_+`` with ``q_n`` already replaced by ``q^{M+1}``, i.e.
    from ``q^{M+2}``.

    ``replacement=False`` (multi-candidate SD, Yang et al. 2024): the first tokens of the ``M``
    drafts are drawn without replacement (draft ``m``'s first token from ``p`` with the earlier
    first tokens removed, renormalised; fewer drafts when no token is left), and draft ``m`` is
    verified against the residual with the law it was drawn from, ``d_m``:
    ``r <- [r - d_m]_+`` after a rejection.
    """
    p_init, p_trans = draft
    q_init, q_trans = target
    horizon = q_trans.shape[0]
    x = [chooser.categorical(q_init)]
    rejected = []
    calls = 0
    n = 1
    while n <= horizon:
        calls += 1
        n0 = n
        root = x[-1]
        drafts, first_laws = draw_drafts(chooser, p_trans, root, n0, num_drafts, replacement)
        q_n = q_trans[n0 - 1, root].copy()  # the root's target row, replaced by residuals
        sampled = False
        for seq, p_n in zip(drafts, first_laws):
            for t, tok in zip(range(n0, horizon + 1), seq):
                prev = x[-1]
                if t == n0:
                    q_row, p_row = q_n, p_n
                else:
                    q_row, p_row = q_trans[t - 1, prev], p_trans[t - 1, prev]
                if chooser.bernoulli(sd_accept_entry(p_row[tok], q_row[tok])):
                    x.append(tok)
                    rejected.append(False)
                    sampled = True
                elif t == n0:
                    q_n = positive_part(q_n - p_n)  # next draft is verified against q^{m+1}
                    break
                else:
                    x.append(chooser.categorical(positive_part(q_row - p_row)))
                    rejected.append(True)
                    break
            if sampled:
                break
        if not sampled:
            final = positive_part(q_n - p_trans[n0 - 1, root]) if literal_reading else q_n
            x.append(chooser.categorical(final))
            rejected.append(True)
        ended = _stop_after_call(x, rejected, n0, stop, horizon)
        if ended is not None:
            return ended + (calls,)
        n = len(x)
    return tuple(x), tuple(rejected), calls


# ----------------------------------------------------------------------------- exact helpers
def chain_calls(init, horizon: int, call_law) -> dict:
    """The exact law of whole decodes, ``{(tokens, rejected, calls): probability}``, from the law
    of one call: ``call_law(n, prev)`` is ``{(emitted, flags, _): probability}`` for a call that
    starts at position ``n`` after token ``prev`` (``flags``: the rejected flag of each emitted
    token). Calls are chained from ``x_0 ~ init`` until ``horizon + 1`` tokens."""
    states = {((a,), (), 0): float(pr) for a, pr in enumerate(init) if pr > 0}
    done = defaultdict(float)
    while states:
        new = defaultdict(float)
        for (tokens, rejected, num_calls), pr in states.items():
            for (emitted, flags, _), pc in call_law(len(tokens), tokens[-1]).items():
                state = (tokens + emitted, rejected + flags, num_calls + 1)
                (done if len(state[0]) == horizon + 1 else new)[state] += pr * pc
        states = new
    return dict(done)


def max_difference(a: dict, b: dict) -> float:
    """The largest difference between two laws given as ``{outcome: probability}``."""
    return max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


def target_sequence_law(target) -> dict:
    """``{x_0..x_T: q(x_0..x_T)}`` by enumeration."""
    q_init, q_trans = target
    law = {(a,): q_init[a] for a in range(len(q_init)) if q_init[a] > 0}
    for n in range(q_trans.shape[0]):
        new = {}
        for seq, pr in law.items():
            row = q_trans[n, seq[-1]]
            for b in np.nonzero(row > 0)[0]:
                new[seq + (int(b),)] = pr * row[b]
        law = new
    return law


def marginalise_tokens(law: dict) -> dict:
    out = defaultdict(float)
    for (tokens, _, _), pr in law.items():
        out[tokens] += pr
    return dict(out)


def forward_marginals(init, trans):
    """``(T + 1, V)`` marginals of ``x_0..x_T`` of a Markov chain."""
    out = [np.asarray(init, np.float64)]
    for n in range(trans.shape[0]):
        out.append(out[-1] @ trans[n])
    return np.stack(out)


def tv(p, q):
    return 0.5 * np.abs(p - q).sum(-1)


def theorem1_rejections(draft, target) -> float:
    """Theorem 1: ``sum_n E_{x_{n-1} ~ q} TV(p_n, q_n)``."""
    _, p_trans = draft
    q_init, q_trans = target
    marg = forward_marginals(q_init, q_trans)
    return float(sum(marg[n] @ tv(p_trans[n], q_trans[n]) for n in range(q_trans.shape[0])))


def exact_counts(draft, target, *, kind="sd", lookahead=None, num_drafts=1):
    """Exact ``(E[N_rej], E[calls])`` by a forward recursion over ``(token, phase)``.

    ``kind="sd"``: SD with lookahead ``K``: phase ``j`` = drafts accepted since the last call,
    ``j == K`` emits the bonus token. ``kind="batch"``: phase 0 = root of a draft tree (the ``M``
    drafts are verified against ``q^1..q^M``), phase 1 = inside an accepted draft.
    """
    _, p_trans = draft
    q_init, q_trans = target
    horizon, num_states, _ = q_trans.shape
    k = horizon if lookahead is None else min(lookahead, horizon)
    phases = k + 1 if kind == "sd" else 2
    dist = np.zeros((num_states, phases))
    dist[:, 0] = q_init
    rejections = calls = 0.0
    for n in range(horizon):
        new = np.zeros_like(dist)
        calls += dist[:, 0].sum()
        for a in range(num_states):
            p, q = p_trans[n, a], q_trans[n, a]
            for j in range(phases):
                mass = dist[a, j]
                if mass == 0:
                    continue
                if kind == "sd" and j == k:  # bonus token from q
                    new[:, 0] += mass * q
                    continue
                if kind == "batch" and j == 0:
                    acc, rej = batch_root_masses(p, q, num_drafts)
                else:
                    acc, rej = np.minimum(p, q), np.maximum(q - p, 0.0)
                nxt = j + 1 if kind == "sd" else 1
                new[:, nxt] += mass * acc
                new[:, 0] += mass * rej
                rejections += mass * rej.sum()
        dist = new
    return rejections, calls


def batch_root_masses(p, q, num_drafts):
    """Root of batch SD: accepted masses and the final residual mass ``w^{M+1}``."""
    acc = np.zeros_like(q)
    reach, q_m = 1.0, q.copy()
    for _ in range(num_drafts):
        acc += reach * np.minimum(p, q_m)
        r = np.maximum(q_m - p, 0.0).sum()
        q_m = positive_part(q_m - p)
        reach *= r
    return acc, reach * q_m


def theorem3_rejections(draft, target, num_drafts) -> float:
    """Theorem 3 exactly as printed: ``sum_n E_q[TV(q, p)] - sum_n E_f[TV(q, p) - prod_m TV(q^m, p)]``.

    The residual chain is normalised at every step, ``q^{m+1} = [q^m - p]_+ / r_m`` (an exhausted
    residual ends the product at 0), and the pseudo-measure ``f`` follows equation (ff),
    marginalised to the last token, starting from ``f_0 = q(x_0)`` (the first position is always
    the root of a tree).
    """
    _, p_trans = draft
    q_init, q_trans = target
    horizon, num_states, _ = q_trans.shape
    mu = forward_marginals(q_init, q_trans)
    f = np.asarray(q_init, np.float64)
    total = 0.0
    for n in range(horizon):
        new_f = np.zeros(num_states)
        for a in range(num_states):
            p, q = p_trans[n, a], q_trans[n, a]
            h = np.maximum(q - p, 0.0)
            q_m, prod = q.copy(), 1.0
            for _ in range(num_drafts):
                r = np.maximum(q_m - p, 0.0).sum()
                prod *= r
                q_m = np.maximum(q_m - p, 0.0) / r if r > 0 else np.zeros_like(q_m)
            tv_a = h.sum()
            total += mu[n, a] * tv_a - f[a] * (tv_a - prod)
            new_f += h * mu[n, a] - (h - prod * q_m) * f[a]
        f = new_f
    return float(total)


def sequence_kl(law_a: dict, law_b: dict) -> float:
    """``KL(A || B)`` between two laws over whole sequences given as ``{sequence: prob}``."""
    total = 0.0
    for seq, pa in law_a.items():
        if pa <= 0:
            continue
        pb = law_b.get(seq, 0.0)
        if pb <= 0:
            return float("inf")
        total += pa * np.log(pa / pb)
    return total


def rejected_measure(law: dict, num_states: int, horizon: int) -> np.ndarray:
    """``(T, V)``: ``P(x_n = x, rejected at n)`` from an enumerated law of ``(tokens, rejected,
    calls)`` (Theorem 3's ``f``, marginalised to the last token)."""
    f = np.zeros((horizon, num_states))
    for (tokens, rejected, _), pr in law.items():
        for n, flag in enumerate(rejected):
            if flag:
                f[n, tokens[n + 1]] += pr
    return f


def expected_counts_from_law(law: dict):
    """``(E[N_rej], E[calls])`` from an enumerated law of ``(tokens, rejected, calls)``."""
    rej = sum(pr * sum(r) for (_, r, _), pr in law.items())
    calls = sum(pr * c for (_, _, c), pr in law.items())
    return rej, calls
