"""Serving from a recording (issue 47, item 4): ``estimate(..., cost=ServingCost, batch_size=B)``.

* exactness: every sequence of a V = 3, T = 4 pair enumerated and weighted by its target
  probability, the goodput and speed-up equal ``specjax.serving_rate`` on the models to 1e-10 in
  float64 (SD at two lookaheads, batch SD, autoregressive), and a recording whose ``lengths``
  are all ``T`` gives the same as one without;
* Monte Carlo: over 100 recordings of 100 rollouts the 95% intervals cover ``serving_rate``'s
  value at a rate within three standard errors of 95% (the coverage's own standard error is
  2.2 points);
* validation.
"""

from __future__ import annotations


import jax
import numpy as np
import pytest

import specjax
from conftest import every_sequence
from specjax.pairs import Recording

V, T = 3, 4
COST = specjax.ServingCost(0.05, specjax.theory.roofline(1.0, knee=4, size=256), overhead=0.1)


def _enumerated():
    rng = np.random.default_rng(1)
    init = rng.dirichlet(np.ones(V))
    p = rng.dirichlet(np.ones(V), size=(T, V))
    q = rng.dirichlet(np.ones(V), size=(T, V))
    q[1, 2] = [0.0, 0.3, 0.7]
    p[1, 2] = [1.0, 0.0, 0.0]  # disjoint supports
    seqs, weights, p_rows, q_rows = every_sequence(init, p, q)
    models = specjax.MarkovChain(init, p), specjax.MarkovChain(init, q)
    return models, seqs, weights, p_rows, q_rows


@pytest.mark.parametrize("batch_size", [1, 8])
def test_serving_from_an_enumerated_recording_equals_serving_rate(x64, batch_size):
    (draft, target), seqs, weights, p_rows, q_rows = _enumerated()
    rec = Recording.from_arrays(seqs, p_rows, q_rows, weights=weights)
    ragged = Recording.from_arrays(seqs, p_rows, q_rows, weights=weights,
                                   lengths=np.full(len(seqs), T))
    for decoder in (specjax.Speculative(lookahead=2), specjax.Speculative(lookahead=3),
                    specjax.BatchSpeculative(2, lookahead=2), specjax.Autoregressive()):
        models = (None if decoder == specjax.Autoregressive() else draft, target)
        want = specjax.serving_rate(decoder, *models, COST, batch_size=batch_size)
        for recording in (rec, ragged):
            got = specjax.estimate(decoder, recording, cost=COST, batch_size=batch_size)
            assert abs(float(got.tokens_per_time - want.tokens_per_time)) < 1e-10, decoder
            assert abs(float(got.speedup - want.speedup)) < 1e-10, decoder
            assert np.isfinite(float(got.tokens_per_time_se))
            assert got.expected_time is None


@pytest.mark.slow
def test_serving_intervals_cover_at_95_percent():
    draft, target = specjax.paper_instance(seed=2, num_states=6, horizon=20)
    sd = specjax.Speculative(lookahead=3)
    want = float(specjax.serving_rate(sd, draft, target, COST, batch_size=4).tokens_per_time)
    rec = specjax.record(jax.random.key(11), draft, target, 100 * 100)
    covered = 0
    for i in range(100):
        part = slice(100 * i, 100 * (i + 1))
        sub = Recording.from_statistics(rec.tokens[part], rec.draft_prob[part],
                                        rec.target_prob[part])
        est = specjax.estimate(sd, sub, cost=COST, batch_size=4)
        covered += abs(float(est.tokens_per_time) - want) <= 1.959964 * float(
            est.tokens_per_time_se)
    assert abs(covered - 95) <= 3 * np.sqrt(100 * 0.95 * 0.05), covered


def test_serving_estimate_validation():
    _, seqs, weights, p_rows, q_rows = _enumerated()
    rec = Recording.from_arrays(seqs, p_rows, q_rows, weights=weights)
    sd = specjax.Speculative(lookahead=2)
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        specjax.estimate(sd, rec, cost=COST)
    with pytest.raises(ValueError, match="batch_size applies to a ServingCost"):
        specjax.estimate(sd, rec, cost=specjax.CostModel(0.1, 1.0), batch_size=4)
    with pytest.raises(ValueError, match="batch_size = 1,000,000"):
        specjax.estimate(sd, rec, cost=specjax.ServingCost(0.05, lambda n: 1.0 + 0.01 * n),
                         batch_size=10**6)
    with pytest.raises(ValueError, match="cost must be None, a specjax.CostModel or"):
        specjax.estimate(sd, rec, cost=(0.1, 1.0))


def test_batch_lookahead_from_an_enumerated_recording_equals_the_exact_one(x64):
    (draft, target), seqs, weights, p_rows, q_rows = _enumerated()
    rec = Recording.from_arrays(seqs, p_rows, q_rows, weights=weights)
    got = specjax.pairs.batch_lookahead(rec, COST, batch_size=(1, 8), max_lookahead=6)
    want = specjax.theory.batch_lookahead(draft, target, COST, batch_size=(1, 8),
                                          max_lookahead=T)
    for g, w in zip(got, want):
        assert g.lookahead == w.lookahead
        np.testing.assert_allclose(g.rates, w.fixed_rates, rtol=0, atol=1e-10)
        assert g.difference == pytest.approx(g.rates[g.lookahead] - g.rates[g.runner_up])
        assert np.isfinite(g.difference_se) and (g.rates_se[1:] > 0).all()
    alone = specjax.pairs.batch_lookahead(rec, COST, batch_size=4, max_lookahead=0)
    assert alone.lookahead == 0 and alone.runner_up == -1
    with pytest.raises(ValueError, match="cost must be a specjax.ServingCost"):
        specjax.pairs.batch_lookahead(rec, specjax.CostModel(0.1, 1.0), batch_size=4,
                                      max_lookahead=2)
