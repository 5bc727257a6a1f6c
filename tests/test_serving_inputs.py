"""Serving's planning functions under bad input (issue 48's defects found from outside): each
test failed before its fix, with a silent number or an error that did not name the argument."""

from __future__ import annotations

import math

import numpy as np
import pytest

import specjax
from specjax.theory import serving


def test_step_time_refuses_negative_and_two_dimensional_lookaheads():
    cost = specjax.ServingCost(0.05, serving.roofline(1.0, knee=16, size=64))
    with pytest.raises(ValueError, match="lookaheads must be non-negative"):
        serving.step_time([-1, 3], cost)
    with pytest.raises(ValueError, match=r"lookaheads must be a \(B,\) vector"):
        serving.step_time([[1, 3]], cost)
    with pytest.raises(ValueError, match=r"lookaheads must be a \(B,\) vector"):
        serving.step_time([1.5, 2], cost)
    # Two slots drafting 1 and 3: passes over 2, 1, 1 slots; 6 tokens scored.
    want = 3 * 0.05 + 1.0
    assert serving.step_time([1, 3], cost) == pytest.approx(want, abs=1e-12)


def test_allocate_drafts_refuses_a_negative_intercept_where_its_rule_is_not_exact():
    # draft_time[n] = -0.2 + 0.3 n (entries 0.1, 0.4: non-negative): the greedy rule gave [1, 0]
    # at 2.545 tokens per time while [2, 0] gives 2.833.
    survival = [[0.8, 0.6], [0.5, 0.0]]
    cost = specjax.ServingCost([0.0, 0.1, 0.4], 1.0)
    assert serving.step_time([2, 0], cost) == pytest.approx(0.1 + 0.1 + 1.0)
    with pytest.raises(ValueError, match="a >= 0"):
        serving.allocate_drafts(survival, cost)
    # A non-negative intercept: the rule is exact; brute force over every allocation agrees.
    cost = specjax.ServingCost([0.0, 0.1, 0.15], [0.0] + [1.0 + 0.01 * n for n in range(8)])
    best = serving.allocate_drafts(survival, cost)
    rates = {}
    for k0 in range(3):
        for k1 in range(3):
            tokens = 2 + sum(survival[0][:k0]) + sum(survival[1][:k1])
            rates[(k0, k1)] = tokens / serving.step_time([k0, k1], cost)
    assert best.tokens_per_time == pytest.approx(max(rates.values()), rel=1e-12)


def test_batch_lookahead_offers_k_zero_and_threshold_decoder_refuses_a_nan_price():
    draft, target = specjax.paper_instance(seed=3, num_states=4, horizon=6)
    cost = specjax.ServingCost(0.05, serving.roofline(1.0, knee=16, size=64))
    alone = serving.batch_lookahead(draft, target, cost, batch_size=4, max_lookahead=0)
    assert alone.lookahead == 0 and alone.fixed_rates.shape == (1,)
    ar = specjax.serving_rate(specjax.Autoregressive(), None, target, cost, batch_size=4)
    assert alone.tokens_per_time == pytest.approx(float(ar.tokens_per_time), rel=1e-6)
    for price in (math.nan, math.inf, "a", np.array([0.1, 0.2])):
        with pytest.raises(ValueError, match="price must be a finite number"):
            serving.threshold_decoder(draft, target, price, max_lookahead=2)
