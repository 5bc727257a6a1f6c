"""Verification of given drafts (engine-shaped), its exact law, and the comparison of an
engine's outputs with that law.

Checked three ways: (1) the kernel equals a literal NumPy transcription of the published
algorithm token for token on the same random numbers (``engine_reference.literal_verify``), and
its exact law equals that transcription's closed form and, averaged over drafts drawn along a
Markov chain, the target's sequence law, ragged ``K`` including 0; (2) the kernel's law
integrated exactly over its uniforms (``specjax.audit_exact``'s grid and bisection, on the kernel
itself) equals ``verify_drafts_law``; (3) Monte Carlo of the kernel against the exact law.
``compare_outputs`` passes the correct sampler and flags the classic bugs.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from conftest import random_rows
from engine_reference import literal_law
from engine_reference import end_output
from engine_reference import literal_verify
from reference import biased_accept
from reference import enumerate_law
from reference import optimal_residual
from stats import assert_law
from stats import count_rows

SD = specjax.Speculative()
K, V = 3, 5
COUNTS = np.array([3, 1, 0, 2])  # ragged, 0 included


def requests(seed, num_requests=4, lookahead=K, num_tokens=V, zero_fraction=0.3, greedy=False):
    """Drafts drawn from their rows (padded with -1 beyond each K_b), draft rows, target rows."""
    rng = np.random.default_rng(seed)
    p = random_rows(rng, (num_requests, lookahead, num_tokens), zero_fraction)
    q = random_rows(rng, (num_requests, lookahead + 1, num_tokens), zero_fraction)
    x = np.array([[rng.choice(num_tokens, p=row) for row in rows] for rows in p])
    if greedy:
        x = p.argmax(-1)
    counts = COUNTS[:num_requests] if num_requests == len(COUNTS) else \
        rng.integers(0, lookahead + 1, num_requests)
    x = np.where(np.arange(lookahead)[None] < counts[:, None], x, -1)
    return x, p, q, counts


def test_kernel_equals_the_literal_transcription_token_for_token(x64):
    x, p, q, counts = requests(0)
    rng = np.random.default_rng(1)
    for trial in range(30):
        u = rng.random((4, K))
        v = rng.random((4, K + 1))
        if trial % 3 == 0:  # u = 0 and v = 0 exactly: no zero-probability token may pass
            u[:, 0] = 0.0
            v[:, :2] = 0.0
        for greedy in (False, True):
            out = jax.tree.map(np.asarray, specjax.verify_drafts(
                None, SD, x, None if greedy else p, q, num_drafts=counts, uniforms=(u, v)))
            for b in range(4):
                want = literal_verify(x[b], p[b], q[b], counts[b], u[b], v[b], greedy=greedy)
                assert np.asarray(out.tokens[b]).tolist() == want.tolist(), (trial, b, greedy)
                n = int(out.num_accepted[b])
                assert (want[:n + 1] != -1).all() and (want[n + 1:] == -1).all()
                assert bool(out.bonus[b]) == (n == counts[b])


def test_stop_tokens_and_dropped_bonus_token_for_token(x64):
    """The endings (a stop token among the drafts or emitted last, a dropped bonus) against the
    literal ones applied to the literal kernel's outputs, on the same uniforms."""
    x, p, q, counts = requests(8)
    rng = np.random.default_rng(9)
    stop = [int(x[0, 1]), int(x[1, 0])]  # drafts of requests 0 and 1 are stop tokens
    for trial in range(20):
        u = rng.random((4, K))
        v = rng.random((4, K + 1))
        for bonus in (True, False):
            out = specjax.verify_drafts(None, SD, x, p, q, num_drafts=counts, uniforms=(u, v),
                                        stop_tokens=stop, bonus=bonus)
            for b in range(4):
                raw = literal_verify(x[b], p[b], q[b], counts[b], u[b], v[b])
                want = end_output(raw, counts[b], stop, bonus)
                got = np.asarray(out.tokens[b])
                assert got.tolist() == want.tolist(), (trial, b, bonus)
                length = int((want != -1).sum())
                assert int(out.num_emitted[b]) == length
                assert bool(out.stopped[b]) == any(t in stop for t in want[:length])


@pytest.mark.parametrize("decoder", [SD, specjax.BlockVerification(2)], ids=["sd", "block"])
def test_output_law_with_stop_tokens_is_the_target_law_stopped(x64, decoder):
    """With an end-of-sequence token, the emitted tokens continued by the target (which stops
    at the end token too) are distributed as the target's sequence stopped at its first end
    token, for every K_b and with the bonus dropped or not."""
    lookahead, num_tokens, stop = 2, 3, 2
    rng = np.random.default_rng(10)
    p_trans = random_rows(rng, (lookahead + 1, num_tokens, num_tokens), 0.2)
    q_trans = random_rows(rng, (lookahead + 1, num_tokens, num_tokens), 0.2)
    start = 0

    def target_paths(prefix, j):
        """``{continuation: probability}`` of the target from ``prefix`` (position ``j``)."""
        if j == lookahead + 1 or prefix[-1:] == (stop,):
            return {(): 1.0}
        out = {}
        for y in range(num_tokens):
            mass = q_trans[j, ((start,) + prefix)[-1], y]
            if mass == 0:
                continue
            for tail, m in target_paths(prefix + (y,), j + 1).items():
                out[(y,) + tail] = out.get((y,) + tail, 0.0) + mass * m
        return out

    target = target_paths((), 0)
    for count, bonus in itertools.product(range(lookahead + 1), (True, False)):
        completed = {}
        for drawn in itertools.product(range(num_tokens), repeat=count):
            drafts = drawn + (0,) * (lookahead - count)
            prefix = (start,) + drafts
            weight = np.prod([p_trans[j, prefix[j], drafts[j]] for j in range(count)])
            if weight == 0:
                continue
            p = np.stack([p_trans[j, prefix[j]] for j in range(lookahead)])
            q = np.stack([q_trans[j, prefix[j]] for j in range(lookahead + 1)])
            law = np.asarray(specjax.verify_drafts_law(
                decoder, np.array(drafts), p, q, num_drafts=np.int32(count), stop_tokens=stop,
                bonus=bonus).outcome)
            for n, y in itertools.product(range(lookahead + 1), range(num_tokens)):
                if law[n, y] == 0:
                    continue
                head = drafts[:n] + (y,)
                for tail, m in target_paths(head, n + 1).items():
                    key = head + tail
                    completed[key] = completed.get(key, 0.0) + weight * law[n, y] * m
        assert set(completed) <= set(target), (count, bonus)
        for seq, mass in target.items():
            np.testing.assert_allclose(completed.get(seq, 0.0), mass, atol=1e-13,
                                       err_msg=f"K_b={count}, bonus={bonus}, {seq}")


def test_exact_law_equals_the_literal_closed_form_for_every_rule(x64):
    x, p, q, counts = requests(2)
    eps = 0.1
    rules = [
        (SD, None, None),
        (specjax.BiasedSpeculative(eps),
         lambda pr, qr, t: biased_accept(pr, qr, eps)[t],
         lambda pr, qr: optimal_residual(pr, qr, biased_accept(pr, qr, eps))),
        (specjax.BiasedSpeculative(eps, residual="target"),
         lambda pr, qr, t: biased_accept(pr, qr, eps)[t], lambda pr, qr: qr),
        (specjax.RejectionRule(lambda pr, qr: jnp.full_like(pr, 0.5),
                               lambda pr, qr, b: jnp.maximum(qr - 0.5 * pr, 0)),
         lambda pr, qr, t: 0.5 if pr[t] > 0 else 0.0, lambda pr, qr: np.maximum(qr - 0.5 * pr, 0)),
    ]
    for decoder, accept, residual in rules:
        for greedy in (False, True):
            law = jax.tree.map(np.asarray, specjax.verify_drafts_law(
                decoder, x, None if greedy else p, q, num_drafts=counts))
            for b in range(4):
                want = literal_law(x[b], p[b], q[b], counts[b], greedy, accept, residual)
                np.testing.assert_allclose(law.outcome[b], want, atol=1e-13,
                                           err_msg=f"{decoder.label}, request {b}")
                np.testing.assert_allclose(law.num_accepted[b], want.sum(-1), atol=1e-13)


@pytest.mark.parametrize("decoder", [SD, specjax.BlockVerification(2)], ids=["sd", "block"])
def test_output_law_is_the_target_sequence_law_averaged_over_drafts(x64, decoder):
    """Drafts drawn along a Markov chain, target rows following the drafted prefix: the emitted
    tokens continued by the target are distributed as the target's K + 1 tokens, for every
    K_b in 0..K, with sampled and with greedy drafts."""
    lookahead, num_tokens = 2, 3
    rng = np.random.default_rng(3)
    p_trans = random_rows(rng, (lookahead + 1, num_tokens, num_tokens), 0.3)
    q_trans = random_rows(rng, (lookahead + 1, num_tokens, num_tokens), 0.3)
    start = 1
    p_trans[0, start] = q_trans[0, start]  # p = q on the first row
    for greedy, count in itertools.product((False, True), range(lookahead + 1)):
        completed = np.zeros((num_tokens,) * (lookahead + 1))
        for drawn in itertools.product(range(num_tokens), repeat=count):
            drafts = drawn + (0,) * (lookahead - count)  # padding beyond K_b, never read
            prefix = (start,) + drafts
            weight = 1.0
            for j in range(count):
                row = p_trans[j, prefix[j]]
                weight *= float(row.argmax() == drafts[j]) if greedy else row[drafts[j]]
            if weight == 0:
                continue
            p = np.stack([p_trans[j, prefix[j]] for j in range(lookahead)])
            q = np.stack([q_trans[j, prefix[j]] for j in range(lookahead + 1)])
            law = np.asarray(specjax.verify_drafts_law(
                decoder, np.array(drafts), None if greedy else p, q,
                num_drafts=np.int32(count)).outcome)
            for n, y in itertools.product(range(count + 1), range(num_tokens)):
                mass = weight * law[n, y]
                if mass == 0:
                    continue
                head = drafts[:n] + (y,)
                # continue with the target after the emitted tokens
                for tail in itertools.product(range(num_tokens), repeat=lookahead - n):
                    seq = (start,) + head + tail
                    m = mass
                    for j in range(n + 1, lookahead + 1):
                        m *= q_trans[j, seq[j], seq[j + 1]]
                    completed[head + tail] += m
        target = np.zeros_like(completed)
        for seq in itertools.product(range(num_tokens), repeat=lookahead + 1):
            full = (start,) + seq
            target[seq] = np.prod([q_trans[j, full[j], full[j + 1]] for j in range(lookahead + 1)])
        np.testing.assert_allclose(completed, target, atol=1e-13,
                                   err_msg=f"greedy={greedy}, K_b={count}")


def _literal_block(chooser, x, p, q, count, stop=(), bonus=True):
    """Algorithm 2 of Sun et al. (block verification) on given drafts ``x_1..x_count`` with
    rows ``p (K, V)``, ``q (K + 1, V)``, as written: weights, ``h_i``, every ``eta_i`` drawn and
    the largest accepted level kept, then the last token; ``stop`` and ``bonus`` as engines
    end an output. A draft of draft probability 0 gets weight 0 (the given-drafts convention)."""
    weight = [1.0]
    for i in range(count):
        ratio = q[i, x[i]] / p[i, x[i]] if p[i, x[i]] > 0 else 0.0
        weight.append(min(weight[-1] * ratio, 1.0))
    tau = 0
    for i in range(1, count + 1):
        if i == count:
            h = weight[i]
        else:
            r = np.maximum(weight[i] * q[i] - p[i], 0.0).sum()
            h = r / (r + (1.0 - weight[i])) if r + (1.0 - weight[i]) > 0 else 1.0
        if chooser.bernoulli(h):
            tau = i
    out = [int(t) for t in x[:tau]]
    if tau < count:
        w = np.maximum(weight[tau] * q[tau] - p[tau], 0.0)
        out.append(chooser.categorical(w if w.sum() > 0 else q[tau]))
    elif bonus or count == 0:
        out.append(chooser.categorical(q[count]))
    for j, t in enumerate(out):
        if t in stop:
            return tuple(out[:j + 1])
    return tuple(out)


@pytest.mark.parametrize("stop,bonus", [((), True), ((1,), True), ((0, 2), False)])
def test_block_verification_law_equals_the_literal_algorithm_enumerated(x64, stop, bonus):
    decoder = specjax.BlockVerification(K)
    for seed in range(3):
        x, p, q, counts = requests(20 + seed, zero_fraction=0.2)
        law = np.asarray(specjax.verify_drafts_law(decoder, x, p, q, num_drafts=counts,
                                                   stop_tokens=stop or None,
                                                   bonus=bonus).outcome)
        for b in range(len(counts)):
            want = enumerate_law(lambda c, b=b: _literal_block(c, x[b], p[b], q[b], counts[b],
                                                               stop, bonus))
            got = {}
            for n, y in itertools.product(range(K + 1), range(V)):
                if law[b, n, y] > 0:
                    key = tuple(int(t) for t in x[b, :n]) + (y,)
                    got[key] = got.get(key, 0.0) + law[b, n, y]
            assert set(k for k, v in got.items() if v > 1e-14) == set(
                k for k, v in want.items() if v > 1e-14), (seed, b)
            for key, mass in want.items():
                assert abs(got.get(key, 0.0) - mass) < 1e-12, (seed, b, key)


def _position_rule(decoder, x, p_rows, q_rows, part):
    """The kernel at one drafted position as a rule of one uniform, for ``audit_exact``: the
    accept uniform (``part="accept"``, sample uniform 0.5) or the sample uniform after a sure
    rejection (``part="residual"``, accept uniform just below 1). The position is one of the rows
    ``(x, p_rows, q_rows)``: the one whose target row is the audited ``q`` (the audit's draft
    row is the one-hot of ``x``), so one rule, and one compiled program, serves every row."""
    below_one = np.nextafter(np.asarray(1.0, q_rows.dtype), 0)

    def verify_u(u, p_, q_, x_):
        del p_, x_
        row = jnp.argmax(jnp.all(q_rows == q_[None], axis=-1))
        accept_u, sample_u = (u, 0.5) if part == "accept" else (below_one, u)
        out = specjax.verify_drafts(None, decoder, jnp.asarray(x)[row][None],
                                    jnp.asarray(p_rows)[row][None],
                                    jnp.stack([q_, q_]),
                                    uniforms=(jnp.reshape(accept_u, (1,)),
                                              jnp.full((2,), sample_u, q_.dtype)))
        return out.num_accepted == 1, out.tokens[0]

    return verify_u


def test_kernel_integrated_exactly_over_its_uniforms_equals_the_law(x64):
    """audit_exact integrates the kernel itself over each uniform (grid and bisection): the
    acceptance and the residual it finds equal ``verify_drafts_law``'s at every position."""
    x, p, q, counts = requests(4, num_requests=4)
    where = ([0, 0, 0, 3], [0, 1, 2, 1])
    tokens, p_rows, q_rows = x[where], p[where], q[where]
    assert len({tuple(row) for row in q_rows}) == len(q_rows)  # each row found by its q
    points = np.eye(V)[tokens]  # audit_exact's greedy draft = x
    for decoder in (SD, specjax.BiasedSpeculative(0.05)):
        law = jax.tree.map(np.asarray, specjax.verify_drafts_law(decoder, x, p, q,
                                                                 num_drafts=counts))
        acc = specjax.audit_exact(_position_rule(decoder, tokens, p_rows, q_rows, "accept"),
                                  points, q_rows, drafting="greedy", grid=256)
        res = specjax.audit_exact(_position_rule(decoder, tokens, p_rows, q_rows, "residual"),
                                  points, q_rows, drafting="greedy", grid=256)
        for i, (b, j) in enumerate(zip(*where)):
            np.testing.assert_allclose(acc.acceptance_rate[i], law.acceptance[b, j], atol=1e-12)
            if law.acceptance[b, j] < 1:
                reached = law.num_accepted[b, j:].sum()
                want = law.outcome[b, j] / (reached * (1 - law.acceptance[b, j]))
                np.testing.assert_allclose(res.output_law[i], want, atol=1e-12)


@pytest.mark.parametrize("decoder", [SD, specjax.BlockVerification(K)], ids=["sd", "block"])
def test_monte_carlo_fits_the_exact_law(decoder):
    """100,000 runs of four ragged requests (float32): the joint (n, y) counts of each request
    against the exact law, chi-square at the suite's ALPHA, no outcome of zero probability;
    compare_outputs passes them, and flags the other rule's outputs."""
    x, p, q, counts = requests(5)
    runs = 25_000
    tile = lambda a: np.tile(a, (runs,) + (1,) * (a.ndim - 1))  # noqa: E731
    out = specjax.verify_drafts(jax.random.key(11), decoder, tile(x), tile(p).astype(np.float32),
                                tile(q).astype(np.float32), num_drafts=tile(counts))
    law = np.asarray(specjax.verify_drafts_law(decoder, x, p.astype(np.float32),
                                               q.astype(np.float32), num_drafts=counts).outcome,
                     np.float64)
    n = np.asarray(out.num_accepted).reshape(runs, 4)
    last = np.asarray(out.tokens)[np.arange(runs * 4), np.asarray(out.num_accepted)]
    last = last.reshape(runs, 4)
    for b in range(4):
        observed = count_rows(np.stack([n[:, b], last[:, b]], axis=1))
        expected = {(i, y): law[b, i, y] for i in range(K + 1) for y in range(V)
                    if law[b, i, y] > 0}
        assert_law(observed, expected, runs, f"request {b}")
    tokens = np.asarray(out.tokens).reshape(runs, 4, K + 1)
    other = specjax.BlockVerification(K) if decoder is SD else SD
    assert not specjax.compare_outputs(decoder, x, p.astype(np.float32), q.astype(np.float32),
                                       tokens, num_drafts=counts).flagged
    assert specjax.compare_outputs(other, x, p.astype(np.float32), q.astype(np.float32),
                                   tokens, num_drafts=counts).flagged


def test_batch_equals_each_request_alone_and_padding_is_ignored():
    x, p, q, counts = requests(6)
    u = np.random.default_rng(0).random((4, K)).astype(np.float32)
    v = np.random.default_rng(1).random((4, K + 1)).astype(np.float32)
    p32, q32 = p.astype(np.float32), q.astype(np.float32)
    batch = jax.tree.map(np.asarray, specjax.verify_drafts(None, SD, x, p32, q32,
                                                           num_drafts=counts, uniforms=(u, v)))
    garbage_p, garbage_q = p32.copy(), q32.copy()
    for b, c in enumerate(counts):  # rows beyond K_b: zeros, as engines pad
        garbage_p[b, c:] = 0
        garbage_q[b, c + 1:] = 0
    padded = specjax.verify_drafts(None, SD, x, garbage_p, garbage_q, num_drafts=counts,
                                   uniforms=(u, v))
    np.testing.assert_array_equal(batch.tokens, padded.tokens)
    for b, c in enumerate(counts):
        alone = specjax.verify_drafts(None, SD, x[b, :c], p32[b, :c], q32[b, :c + 1],
                                      uniforms=(u[b, :c], v[b, :c + 1]))
        np.testing.assert_array_equal(np.asarray(batch.tokens[b, :c + 1]), alone.tokens)
        assert int(alone.num_accepted) == int(batch.num_accepted[b])
    zero = specjax.verify_drafts(jax.random.key(0), SD, np.zeros((2, 0), np.int32), None,
                                 q32[:2, :1])
    assert zero.tokens.shape == (2, 1) and bool(zero.bonus.all())


def test_edge_rows_give_finite_laws_and_gradients(x64):
    p = np.array([[0.5, 0.5, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25], [0.0, 0.5, 0.5, 0.0]])
    q = np.array([[0.0, 0.0, 0.5, 0.5], [0.25, 0.25, 0.25, 0.25], [0.4, 0.2, 0.2, 0.2],
                  [1.0, 0.0, 0.0, 0.0]])
    x = np.array([0, 1, 3])  # disjoint supports, p = q, p(x) = 0 < q(x)
    for dtype in (np.float32, np.float64):
        law = specjax.verify_drafts_law(SD, x, p.astype(dtype), q.astype(dtype))
        assert law.outcome.dtype == dtype
        np.testing.assert_allclose(law.acceptance, [0, 1, 0])
        np.testing.assert_allclose(law.outcome[0], [0, 0, 0.5, 0.5], atol=1e-7)
        # under jit: one program (eagerly, each operation of the gradient compiles its own)
        grad = jax.jit(jax.grad(lambda pq: jnp.sum(specjax.verify_drafts_law(
            SD, x, pq[0], pq[1]).num_accepted * jnp.arange(4))))((p.astype(dtype),
                                                                   q.astype(dtype)))
        assert all(np.isfinite(g).all() for g in grad)
    out = specjax.verify_drafts(None, SD, x, p, q, uniforms=(np.zeros(3), np.zeros(4)))
    assert out.tokens.tolist() == [2, -1, -1, -1]


def test_bad_arguments_are_refused_by_name():
    x, p, q, counts = requests(7)
    key = jax.random.key(0)
    cases = [
        (dict(decoder=specjax.BatchSpeculative(2)), "decoder"),
        (dict(decoder=specjax.OptimalMultiDraft(2)), "decoder"),
        (dict(draft_tokens=x.astype(float)), "draft_tokens"),
        (dict(draft_tokens=np.where(x == -1, 0, x + V)), "draft_tokens"),
        (dict(draft_probs=p[:, :2]), "draft_probs"),
        (dict(target_probs=q[:, :3]), "target_probs"),
        (dict(target_probs=q * 2), "target_probs"),
        (dict(num_drafts=counts + 1), "num_drafts"),
        (dict(num_drafts=counts[:2]), "num_drafts"),
        (dict(key=None), "key"),
        (dict(uniforms=(np.zeros((4, K)), np.ones((4, K + 1)))), "uniforms"),
        (dict(uniforms=(np.zeros((4, K)),)), "uniforms"),
    ]
    base = dict(key=key, decoder=SD, draft_tokens=x, draft_probs=p, target_probs=q,
                num_drafts=counts)
    for change, name in cases:
        args = {**base, **change}
        if "uniforms" in change:
            args["key"] = None
        with pytest.raises(ValueError, match=name):
            specjax.verify_drafts(args.pop("key"), args.pop("decoder"), args.pop("draft_tokens"),
                                  args.pop("draft_probs"), args.pop("target_probs"), **args)
    with pytest.raises(ValueError, match="uniforms"):  # 1 - 1e-9 is 1.0 in float32
        specjax.verify_drafts(None, SD, x, p.astype(np.float32), q.astype(np.float32),
                              num_drafts=counts, uniforms=(np.full((4, K), 1 - 1e-9),
                                                           np.zeros((4, K + 1))))
    bad = q.copy()
    bad[1, 0] *= 2  # the error names the row by its place
    with pytest.raises(ValueError, match=r"target_probs\[1, 0\]"):
        specjax.verify_drafts(key, SD, x, p, bad, num_drafts=counts)
    with pytest.raises(ValueError, match="key=None"):
        specjax.verify_drafts(key, SD, x, p, q, num_drafts=counts,
                              uniforms=(np.zeros((4, K)), np.zeros((4, K + 1))))


def test_narrow_dtypes_are_computed_in_float32_and_rules_that_ignore_p_ignore_it():
    """bfloat16 rows: the law and the uniforms in float32 (bfloat16 uniforms are multiples of
    2^-8, which emitted a token of probability 0.003 at 0.0086). TypicalAcceptance reads only
    the target's row: a draft row with p(x) = 0 does not change its decision."""
    q = jnp.array([[0.003, 0.002, 0.5, 0.495]], jnp.bfloat16)
    law = specjax.verify_drafts_law(SD, jnp.zeros((0,), jnp.int32), None, q)
    assert law.outcome.dtype == jnp.float32
    out = specjax.verify_drafts(jax.random.key(1), SD, jnp.zeros((40_000, 0), jnp.int32), None,
                                jnp.broadcast_to(q, (40_000, 1, 4)))
    counts = dict(zip(*np.unique(np.asarray(out.tokens[:, 0]), return_counts=True)))
    want = np.asarray(law.outcome[0], np.float64)
    assert_law(counts, {i: want[i] for i in range(4) if want[i] > 0}, 40_000, "bfloat16")
    typical = specjax.TypicalAcceptance()
    q_rows = np.array([[0.9, 0.05, 0.05], [1.0, 0.0, 0.0]])
    with_p = specjax.verify_drafts_law(typical, np.array([0]), np.array([[0.0, 1.0, 0.0]]),
                                       q_rows)
    without = specjax.verify_drafts_law(typical, np.array([0]), None, q_rows)
    np.testing.assert_allclose(with_p.acceptance, [1.0])
    np.testing.assert_allclose(with_p.outcome, without.outcome)
