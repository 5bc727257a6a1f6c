"""Real model pairs: the phase filter, recordings and estimates from target rollouts.

* exactness: on a V = 3, T = 4 pair with zeros, disjoint supports and p = q rows, every sequence
  enumerated and weighted by its target probability, ``estimate`` equals ``exact``,
  ``decoding_time`` and ``engine_metrics`` to 1e-10 in float64 (rows kept, rates recorded, and
  SD from the emitted tokens' probabilities alone);
* independently: the literal SD (``reference.sd_literal``) enumerated and conditioned on its
  output, and a brute-force enumeration of the phases for random rates;
* Monte Carlo: over 200 independent recordings the 95% intervals cover the exact values at a
  rate within three standard errors of 95%;
* edge cases, gradients, validation, the ``.npz`` layout, ``record`` on protocol models.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
import reference as ref
from conftest import chain
from conftest import random_pair
from specjax.pairs import Recording
from specjax.pairs import call_structure
from specjax.pairs import rejection_rate

V, T = 3, 4
COST = specjax.CostModel(0.1, [0.0] + [1.0 + 0.1 * n for n in range(16)],
                         call_overhead=0.05)


def _sd_accept(p, q):
    return jnp.minimum(1, q / jnp.where(p > 0, p, 1))


def _sd_residual(p, q, b):
    return jnp.maximum(q - b * p, 0)


RULE = specjax.RejectionRule(_sd_accept, _sd_residual, lookahead=2)
DECODERS = {
    "sd1": specjax.Speculative(lookahead=1),
    "sd2": specjax.Speculative(lookahead=2),
    "sd3": specjax.Speculative(lookahead=3),
    "sd4": specjax.Speculative(lookahead=4),
    "sd": specjax.Speculative(),
    "batch": specjax.BatchSpeculative(2, lookahead=2),
    "optimal": specjax.OptimalMultiDraft(2, lookahead=2),
    "optimal_all": specjax.OptimalMultiDraft(3),
    "k_sequential": specjax.KSequential(2, lookahead=2),
    "rule": RULE,
    "autoregressive": specjax.Autoregressive(),
}
RATED = tuple(d for name, d in DECODERS.items()
              if not name.startswith("sd") and name != "autoregressive")


def enumerated(draft, target):
    """Every sequence ``x_0..x_T``, its target probability and the rows along it."""
    (p_init, p_trans), (q_init, q_trans) = draft, target
    seqs = np.array(list(itertools.product(range(V), repeat=T + 1)))
    weights = q_init[seqs[:, 0]]
    p_rows = np.zeros((len(seqs), T, V))
    q_rows = np.zeros((len(seqs), T, V))
    for t in range(T):
        prev, token = seqs[:, t], seqs[:, t + 1]
        weights = weights * q_trans[t, prev, token]
        p_rows[:, t], q_rows[:, t] = p_trans[t, prev], q_trans[t, prev]
    return seqs, weights, p_rows, q_rows


@pytest.fixture(scope="module")
def pair():
    with jax.enable_x64(True):
        draft, target = random_pair(3, V, T, zero_fraction=0.2)
        seqs, weights, p_rows, q_rows = enumerated(draft, target)
        rows = Recording.from_arrays(seqs, p_rows, q_rows, weights=weights, keep_rows=True)
        rated = Recording.from_arrays(seqs, p_rows, q_rows, weights=weights, decoders=RATED)
        yield draft, target, rows, rated


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_estimate_equals_exact_on_every_sequence(pair, name, x64):
    draft, target, rows, rated = pair
    decoder = DECODERS[name]
    models = (None if name == "autoregressive" else chain(draft), chain(target))
    exact = specjax.exact(decoder, *models)
    time = specjax.theory.decoding_time(decoder, *models, COST)
    metrics = specjax.theory.engine_metrics(decoder, *models)
    for recording in (rows, rated):
        est = specjax.estimate(decoder, recording, cost=COST)
        assert abs(float(est.expected_rejections - exact.expected_rejections)) < 1e-10
        assert abs(float(est.expected_calls - exact.expected_calls)) < 1e-10
        assert abs(float(est.expected_time - time.expected_time)) < 1e-10
        assert abs(float(est.speedup - time.speedup)) < 1e-10
        for field in ("expected_drafted", "accepted_at", "acceptance_per_position",
                      "conditional_acceptance", "mean_acceptance_length",
                      "draft_acceptance_rate"):
            np.testing.assert_allclose(getattr(est.metrics, field), getattr(metrics, field),
                                       rtol=0, atol=1e-10, err_msg=field)
        assert est.num_sequences == V ** (T + 1)


def test_sd_from_statistics_and_best_lookahead(pair, x64):
    draft, target, rows, _ = pair
    stats = Recording.from_statistics(rows.tokens, rows.draft_prob, rows.target_prob,
                                      weights=rows.weights)
    for k in (1, 3, None):
        sd = specjax.Speculative(lookahead=k)
        exact = specjax.exact(sd, chain(draft), chain(target))
        # With the cost model, as test_estimate_equals_exact_on_every_sequence estimates: its
        # compiled summaries (one per K) serve these too.
        got = specjax.estimate(sd, stats, cost=COST)
        assert abs(float(got.expected_rejections - exact.expected_rejections)) < 1e-10
        assert abs(float(got.expected_calls - exact.expected_calls)) < 1e-10
    want = specjax.theory.best_lookahead(chain(draft), chain(target), COST, max_lookahead=4)
    got = specjax.pairs.best_lookahead(stats, COST, max_lookahead=4)
    assert got.lookahead == want.lookahead
    np.testing.assert_allclose(got.times, want.times, rtol=0, atol=1e-10)


def test_call_structure_equals_literal_sd_given_the_output(x64):
    """``reference.sd_literal`` enumerated, conditioned on its output: E[rejections | x] and
    E[calls | x] equal the filter on SD's rates along x."""
    horizon = 3
    draft, target = random_pair(7, V, horizon, zero_fraction=0.2)
    for lookahead in (1, 2, None):
        law = ref.enumerate_law(lambda c: ref.sd_literal(c, draft, target, lookahead))
        by_x = {}
        for (tokens, rejected, calls), prob in law.items():
            mass, rej, cal = by_x.get(tokens, (0.0, 0.0, 0.0))
            by_x[tokens] = (mass + prob, rej + prob * sum(rejected), cal + prob * calls)
        seqs = np.array(sorted(by_x))
        t = np.arange(horizon)
        p = draft[1][t[None], seqs[:, :-1], seqs[:, 1:]]
        q = target[1][t[None], seqs[:, :-1], seqs[:, 1:]]
        got = call_structure(rejection_rate(p, q), lookahead)
        for i, tokens in enumerate(map(tuple, seqs)):
            mass, rej, cal = by_x[tokens]
            assert abs(float(got.rejections[i]) - rej / mass) < 1e-12
            assert abs(float(got.calls[i]) - cal / mass) < 1e-12


def brute_force(rates, roots, lookahead):
    """E[rejections], E[calls], E[calls keeping >= i], E[drafted] over every phase path."""
    horizon = len(rates)
    k = horizon if lookahead is None else min(lookahead, horizon)
    totals = np.zeros(3 + k)

    def walk(n, phase, prob, rejections, calls, kept, drafted):
        if n == horizon:
            totals[:3] += prob * np.array([rejections, calls, drafted])
            totals[3:] += prob * np.array([kept.count(i) for i in range(k)]) if k else 0
            return
        if phase == 0:
            calls += 1
            drafted += min(k, horizon - n)
        if phase == k:  # the bonus token: never rejected, the next position opens a call
            walk(n + 1, 0, prob, rejections, calls, kept, drafted)
            return
        rate = roots[n] if phase == 0 else rates[n]
        if rate > 0:
            walk(n + 1, 0, prob * rate, rejections + 1, calls, kept, drafted)
        if rate < 1:
            walk(n + 1, phase + 1, prob * (1 - rate), rejections, calls, kept + [phase],
                 drafted)

    walk(0, 0, 1.0, 0, 0, [], 0)
    return totals


def test_call_structure_equals_brute_force_phases(x64):
    rng = np.random.default_rng(0)
    rates = rng.uniform(size=(4, 6))
    rates[0, :3] = [0.0, 1.0, 0.0]
    roots = rng.uniform(size=(4, 6))
    for lookahead in (0, 1, 3, None):
        got = call_structure(rates, lookahead, root_rejection=roots)
        for b in range(rates.shape[0]):
            want = brute_force(rates[b], roots[b], lookahead)
            np.testing.assert_allclose(
                [got.rejections[b], got.calls[b], got.drafted[b], *got.accepted_at[b]], want,
                rtol=0, atol=1e-12)


def test_confidence_intervals_cover_the_exact_values():
    """200 recordings of 64 rollouts: the 95% intervals of rejections, calls and time of
    SD(K = 2) and batch SD cover the exact values at a rate within 3 SE of 95%."""
    num, size = 200, 64
    draft, target = (chain(x) for x in random_pair(11, 4, 8))
    decoders = (specjax.Speculative(lookahead=2), specjax.BatchSpeculative(2, lookahead=2))
    full = specjax.record(jax.random.key(5), draft, target, num * size, decoders=decoders[1:])
    parts = jax.tree.map(lambda x: x.reshape((num, size) + x.shape[1:]), full)
    band = 3 * np.sqrt(0.95 * 0.05 / num)
    for decoder in decoders:
        exact = specjax.exact(decoder, draft, target)
        time = specjax.expected_time(decoder, draft, target, COST)
        # one vmapped run over the recordings (num_sequences, a Python int, left out)
        est = jax.vmap(lambda part: specjax.estimate(decoder, part, cost=COST)._replace(
            num_sequences=None))(parts)
        covered = [np.mean(np.abs(np.asarray(value) - float(want)) <= 1.96 * np.asarray(se))
                   for value, se, want in (
                       (est.expected_rejections, est.expected_rejections_se,
                        exact.expected_rejections),
                       (est.expected_calls, est.expected_calls_se, exact.expected_calls),
                       (est.expected_time, est.expected_time_se, time))]
        assert np.all(np.abs(np.asarray(covered) - 0.95) <= band), (decoder, covered)


def test_edge_cases_and_gradients():
    """p = q (nothing rejected), disjoint supports (everything rejected), q = 0: finite values
    and gradients, and the counts they must give."""
    horizon = 7
    same = call_structure(jnp.zeros((1, horizon)), 2)
    assert float(same.rejections[0]) == 0 and float(same.calls[0]) == 3  # ceil(7 / 3)
    disjoint = call_structure(rejection_rate(jnp.zeros((1, horizon)), jnp.ones((1, horizon))), 2)
    assert float(disjoint.rejections[0]) == horizon and float(disjoint.calls[0]) == horizon
    p = jnp.array([0.0, 0.3, 0.5, 0.2, 0.0, 0.7, 1.0])
    q = jnp.array([0.4, 0.3, 0.0, 0.6, 0.0, 0.2, 1.0])
    rates = rejection_rate(p, q)
    assert np.all(np.isfinite(rates)) and float(rates[2]) == 0 and float(rates[4]) == 0

    def total(p, q):
        r = rejection_rate(p, q)[None]
        s = call_structure(r, 3)
        time = specjax.pairs.expected_call_time(r, 3, jnp.arange(1.0, horizon + 1))
        return s.rejections.sum() + s.calls.sum() + s.accepted_at.sum() + time.sum()

    grads = jax.jit(jax.grad(total, argnums=(0, 1)))(p, q)
    assert all(np.all(np.isfinite(g)) for g in grads)
    at_rates = jax.jit(jax.grad(lambda r: call_structure(r, None).rejections.sum()
                                + call_structure(r, 2, root_rejection=r).calls.sum()))
    for r in (jnp.zeros((2, horizon)), jnp.ones((2, horizon))):
        assert np.all(np.isfinite(at_rates(r)))


def test_validation_errors():
    tokens = np.zeros((2, 3), np.int32)
    rows = np.full((2, 2, 3), 1 / 3)
    with pytest.raises(ValueError, match="tokens must have shape"):
        Recording.from_arrays(tokens[:, :2], rows, rows)
    with pytest.raises(ValueError, match="draft_probs and target_probs"):
        Recording.from_arrays(tokens, rows, rows[:, :, :2])
    with pytest.raises(ValueError, match="target_probs rows must sum to one"):
        Recording.from_arrays(tokens, rows, rows * 0.9)
    with pytest.raises(ValueError, match="negative"):
        Recording.from_arrays(tokens, rows - 0.5, rows)
    with pytest.raises(ValueError, match="weights must be finite and non-negative"):
        Recording.from_arrays(tokens, rows, rows, weights=np.array([1.0, -1.0]))
    with pytest.raises(ValueError, match=r"tokens must lie in \[0, V\)"):
        Recording.from_arrays(tokens + 3, rows, rows)
    with pytest.raises(ValueError, match="processing"):
        Recording.from_arrays(tokens, rows, rows, processing={"temperature": 0.5})
    rec = Recording.from_arrays(tokens, rows, rows, keep_rows=False)
    for decoder, what in ((specjax.BiasedSpeculative(0.1), "lossy"),
                          (specjax.TopKAcceptance(2), "lossy"),
                          (specjax.BlockVerification(2), "call-level"),
                          (specjax.TokenTree((2, 1)), "full rows along the path"),
                          (specjax.BatchSpeculative(2), "holds no rates"),
                          (specjax.OptimalMultiDraft(2, sequence_optimal=True), "whole models")):
        with pytest.raises(ValueError, match=what):
            specjax.estimate(decoder, rec)
    with pytest.raises(ValueError, match="cost must be"):
        specjax.estimate(specjax.Speculative(), rec, cost=1.0)
    with pytest.raises(ValueError, match="recording must be"):
        specjax.estimate(specjax.Speculative(), rows)
    with pytest.raises(ValueError, match="rejection must have shape"):
        call_structure(jnp.zeros(3), 2)
    with pytest.raises(ValueError, match=r"rates in \[0, 1\]"):
        call_structure(jnp.full((1, 3), 1.5), 2)
    with pytest.raises(ValueError, match="root_rejection must have the shape"):
        call_structure(jnp.zeros((1, 3)), 2, root_rejection=jnp.zeros((1, 4)))
    with pytest.raises(ValueError, match="lookahead"):
        call_structure(jnp.zeros((1, 3)), -1)
    lossy = specjax.RejectionRule(_sd_accept, lambda p, q, b: q)
    with pytest.raises(ValueError, match="not lossless"):
        Recording.from_arrays(tokens, np.eye(3)[[[0, 1], [1, 2]]], rows, decoders=(lossy,))


def test_save_load_and_numpy_layout(tmp_path, pair, x64):
    _, _, rows, rated = pair
    path = tmp_path / "rec.npz"
    rated.save(path)
    back = Recording.load(path, decoders=RATED)
    batch = DECODERS["batch"]
    # Estimates with the cost model, as test_estimate_equals_exact_on_every_sequence[batch]
    # makes them: its compiled summary serves these.
    for a, b in ((rated, back),):
        assert float(specjax.estimate(batch, a, cost=COST).expected_calls) == \
            float(specjax.estimate(batch, b, cost=COST).expected_calls)
    np.savez(tmp_path / "numpy.npz", tokens=np.asarray(rows.tokens),
             draft_probs=np.asarray(rows.draft_probs), target_probs=np.asarray(rows.target_probs),
             weights=np.asarray(rows.weights))
    again = Recording.load(tmp_path / "numpy.npz")
    assert float(specjax.estimate(batch, again, cost=COST).expected_rejections) == pytest.approx(
        float(specjax.estimate(batch, rows, cost=COST).expected_rejections), abs=1e-12)
    np.savez(tmp_path / "bad.npz", tokens=np.asarray(rows.tokens))
    with pytest.raises(ValueError, match="needs 'draft_prob'"):
        Recording.load(tmp_path / "bad.npz")


def test_from_arrays_processes_logits():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(2, 2, 2, 5)).astype(np.float32)
    tokens = np.array([[0, 1, 2], [4, 3, 0]])
    settings = {"temperature": 0.7, "top_k": 4}
    got = Recording.from_arrays(tokens, logits[0], logits[1], logits=True, processing=settings)
    want = Recording.from_arrays(
        tokens, specjax.process_logits(jnp.asarray(logits[0]), **settings),
        specjax.process_logits(jnp.asarray(logits[1]), **settings))
    np.testing.assert_array_equal(got.draft_prob, want.draft_prob)
    np.testing.assert_array_equal(got.target_prob, want.target_prob)


@pytest.mark.parametrize("rollout_bytes", [None, 3 * V * 4 * 12], ids=["one run", "chunks of 3"])
def test_record_scores_protocol_models_along_the_rollouts(rollout_bytes, monkeypatch):
    """``record`` on n-grams (the protocol path): the statistics are the models' rows at the
    recorded tokens, the tokens the target's rollouts (``decode`` of autoregressive decoding),
    also when the rollouts run in chunks of chains (a smaller memory budget: chunks of 3 chains,
    the last one of 1)."""
    from specjax.pairs import recording
    if rollout_bytes is not None:
        monkeypatch.setattr(recording, "CHUNK_BYTES", rollout_bytes)
    rng = np.random.default_rng(2)
    table = rng.dirichlet(np.ones(V), size=V).astype(np.float32)
    draft = specjax.NGramModel(jnp.asarray(rng.dirichlet(np.ones(V), size=V), jnp.float32), 2)
    target = specjax.NGramModel(jnp.asarray(table), 2)
    key = jax.random.key(3)
    rec = specjax.record(key, draft, target, 16, horizon=T, decoders=(RATED[0],), chunk_size=5)
    want = specjax.decode(key, specjax.Autoregressive(), None, target, 16, horizon=T).tokens
    np.testing.assert_array_equal(rec.tokens, want)
    prev, token = np.asarray(rec.tokens[:, :-1]), np.asarray(rec.tokens[:, 1:])
    np.testing.assert_allclose(rec.target_prob, table[prev, token], rtol=1e-6)
    np.testing.assert_allclose(rec.draft_prob, np.asarray(draft.table)[prev, token], rtol=1e-6)
    assert rec.rates_of(specjax.BatchSpeculative(2, lookahead=3)) is not None


def test_acceptance_profiles(pair, x64):
    """A profile read from counters, exported from exact and estimate results (equal on the
    enumerated pair), and what it gives: accepted length, best K, a tree."""
    draft, target, rows, _ = pair
    sd = specjax.Speculative(lookahead=3)
    exact = specjax.pairs.acceptance_profile(
        specjax.theory.engine_metrics(sd, chain(draft), chain(target)))
    est = specjax.pairs.acceptance_profile(specjax.estimate(sd, rows, cost=COST))  # shared
    np.testing.assert_allclose(est, exact, rtol=0, atol=1e-12)
    profile = specjax.pairs.read_profile([800, 500, 300], 1000)
    np.testing.assert_array_equal(profile, [0.8, 0.5, 0.3])
    assert specjax.pairs.profile_accepted_length(profile) == pytest.approx(1.6)
    cost = specjax.CostModel(0.4, 1.0)
    choice = specjax.pairs.profile_lookahead(profile, cost)
    want = [(1 + profile[:k].sum()) / (1 + 0.4 * k) for k in range(4)]
    np.testing.assert_allclose(choice.tokens_per_time, want)
    assert choice.lookahead == int(np.argmax(want))
    tree = specjax.pairs.profile_tree([0.7], specjax.CostModel(0.1, 1.0), max_budget=4,
                                      max_depth=3)
    assert tree.parents == (-1, 0, 1, 2)  # one rank: a chain
    for bad, what in ((([3, 5], 10), "must not increase"), (([5, 3], 4), "num_drafts"),
                      (([[1]], 2), "1-D")):
        with pytest.raises(ValueError, match=what):
            specjax.pairs.read_profile(*bad)
    with pytest.raises(ValueError, match="past the profile"):
        specjax.pairs.profile_accepted_length(profile, 4)


def test_other_multi_draft_roots_and_threshold_rules(pair, x64):
    """The Gumbel list coupling, SpecHub and SGLang's thresholds at 1 (lossless) equal exact;
    thresholds below 1 (lossy: ``lossless`` is False) are refused before any work."""
    draft, target, rows, _ = pair
    for decoder in (specjax.GumbelList(2, lookahead=2), specjax.SpecHub(lookahead=2),
                    specjax.ThresholdVerification(1.0, 1.0, lookahead=2)):
        exact = specjax.exact(decoder, chain(draft), chain(target))
        est = specjax.estimate(decoder, rows, cost=COST)  # the summary of K = 2 compiled above
        assert abs(float(est.expected_rejections - exact.expected_rejections)) < 1e-10
        assert abs(float(est.expected_calls - exact.expected_calls)) < 1e-10
    with pytest.raises(ValueError, match="is a lossy rule"):
        specjax.estimate(specjax.ThresholdVerification(0.5, 0.5, lookahead=2), rows)
