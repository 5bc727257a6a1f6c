"""Coverage of the 95% intervals of every estimate from a recording or a trace added for real
deployments (issue 47): over 200 independent recordings (or traces) of the same pair, each
interval ``value +- 1.96 SE`` must hold the exact value at a rate within three standard errors
of 95% (``3 sqrt(0.95 * 0.05 / 200) = 0.046``), for

* SD on ragged requests that end at a stop token (``record(..., stop_tokens=)``) against
  ``exact(..., stop_tokens=)``;
* static token trees (i.i.d. and top-k children) from the rows along the path, against ``exact``
  and ``expected_time``;
* ``pairs.best_lookahead``'s time of every ``K`` and its paired difference between the two best
  ``K`` against ``expected_time``;
* ``pairs.batch_lookahead``'s goodput of every ``K`` against ``serving_rate``;
* adaptive draft lengths (SpecDec++'s policy) and HuggingFace's schedule against ``exact`` and
  ``expected_time``.

(An engine trace's Rao-Blackwellised and counterfactual acceptance: ``test_traces``.)

The recordings are one draw split in 200 parts (fixed seeds; none tuned): the parts are
independent, so each coverage indicator is a Bernoulli draw of the interval's true coverage.
A quantity whose true coverage is 95% fails here with probability about 0.3%.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import specjax
from conftest import chain
from conftest import random_pair
from specjax.pairs import Recording

NUM, SIZE = 200, 100
BAND = 3 * np.sqrt(0.95 * 0.05 / NUM)
COST = specjax.CostModel(0.2, [0.0] + [1.0 + 0.1 * n for n in range(16)])
SERVING = specjax.ServingCost(0.05, specjax.theory.roofline(1.0, knee=4, size=64))


def _rate(values, ses, want) -> float:
    """The fraction of the intervals ``values +- 1.96 ses`` that hold ``want``."""
    values, ses = np.asarray(values, np.float64), np.asarray(ses, np.float64)
    assert values.shape == (NUM,) and np.all(np.isfinite(ses)) and np.all(ses > 0)
    return float(np.mean(np.abs(values - float(want)) <= 1.959964 * ses))


def _check(rates: dict) -> None:
    bad = {k: v for k, v in rates.items() if abs(v - 0.95) > BAND}
    assert not bad, (bad, BAND)


def _parts(rec: Recording):
    """The ``NUM`` recordings of ``SIZE`` sequences each, one after the other."""
    return [jax.tree.map(lambda x: x[i * SIZE:(i + 1) * SIZE], rec) for i in range(NUM)]


@pytest.fixture(scope="module")
def pair():
    return tuple(chain(x) for x in random_pair(31, 4, 8))


def test_ragged_sd_intervals_cover(pair):
    """SD with a stop token: the rollouts end at it; calls and rejections."""
    draft, target = pair
    rec = specjax.record(jax.random.key(2), draft, target, NUM * SIZE, stop_tokens=3)
    lengths = np.asarray(rec.lengths)
    assert lengths.min() < rec.horizon and lengths.max() == rec.horizon  # ragged
    sd = specjax.Speculative(lookahead=2)
    exact = specjax.exact(sd, draft, target, stop_tokens=3)
    parts = jax.tree.map(lambda x: x.reshape((NUM, SIZE) + x.shape[1:]), rec)
    est = jax.vmap(lambda r: specjax.estimate(sd, r)._replace(num_sequences=None))(parts)
    _check({"calls": _rate(est.expected_calls, est.expected_calls_se, exact.expected_calls),
            "rejections": _rate(est.expected_rejections, est.expected_rejections_se,
                                exact.expected_rejections)})


def test_tree_intervals_cover(pair):
    draft, target = pair
    rec = specjax.record(jax.random.key(3), draft, target, NUM * SIZE, keep_rows=True)
    rates = {}
    for tree in (specjax.TokenTree((2, 1)), specjax.TokenTree((2, 2), children="top_k")):
        exact = specjax.exact(tree, draft, target)
        time = specjax.expected_time(tree, draft, target, COST)
        ests = [specjax.estimate(tree, part, cost=COST) for part in _parts(rec)]
        values = {name: ([getattr(e, name) for e in ests], [getattr(e, name + "_se") for e in ests])
                  for name in ("expected_calls", "expected_rejections", "expected_time")}
        for name, want in (("expected_calls", exact.expected_calls),
                           ("expected_rejections", exact.expected_rejections),
                           ("expected_time", time)):
            rates[tree.children, name] = _rate(*values[name], want)
    _check(rates)


def test_lookahead_choices_intervals_cover(pair):
    """``best_lookahead``: every ``K``'s time and the paired difference between the two best
    (the same ``K``s, those of the exact values, in every part); ``batch_lookahead``: every
    ``K``'s goodput."""
    draft, target = pair
    rec = specjax.record(jax.random.key(4), draft, target, NUM * SIZE)
    kmax = 3
    times = np.asarray([specjax.expected_time(specjax.Speculative(lookahead=k) if k else
                                              specjax.Autoregressive(), draft, target, COST)
                        for k in range(kmax + 1)], np.float64)
    best, second = np.argsort(times)[:2]
    rates_exact = np.asarray([specjax.serving_rate(
        specjax.Speculative(lookahead=k) if k else specjax.Autoregressive(), draft, target,
        SERVING, batch_size=4).tokens_per_time for k in range(kmax + 1)], np.float64)
    per_k, per_k_se, diffs, diff_ses, goodputs, goodput_ses = [], [], [], [], [], []
    for part in _parts(rec):
        choice = specjax.pairs.best_lookahead(part, COST, max_lookahead=kmax)
        per_k.append(choice.times)
        per_k_se.append(choice.times_se)
        if {choice.lookahead, choice.runner_up} == {best, second}:
            sign = 1.0 if choice.lookahead == best else -1.0
            diffs.append(sign * choice.difference)
            diff_ses.append(choice.difference_se)
        served = specjax.pairs.batch_lookahead(part, SERVING, batch_size=4, max_lookahead=kmax)
        goodputs.append(served.rates)
        goodput_ses.append(served.rates_se)
    per_k, per_k_se = np.asarray(per_k), np.asarray(per_k_se)
    goodputs, goodput_ses = np.asarray(goodputs), np.asarray(goodput_ses)
    # K = 0 (autoregressive) does the same work on every request of T tokens: no error.
    np.testing.assert_allclose(per_k[:, 0], times[0], rtol=1e-6)
    np.testing.assert_allclose(goodputs[:, 0], rates_exact[0], rtol=1e-6)
    rates = {("time", k): _rate(per_k[:, k], per_k_se[:, k], times[k]) for k in range(1, kmax + 1)}
    rates.update({("goodput", k): _rate(goodputs[:, k], goodput_ses[:, k], rates_exact[k])
                  for k in range(1, kmax + 1)})
    # The paired difference where the two best K are the chosen pair (over 90% of parts).
    assert len(diffs) > 0.9 * NUM, len(diffs)  # the third K is far: no selection effect
    covered = np.mean(np.abs(np.asarray(diffs) - (times[second] - times[best]))
                      <= 1.959964 * np.asarray(diff_ses))
    assert abs(covered - 0.95) <= 3 * np.sqrt(0.95 * 0.05 / len(diffs)), covered
    _check(rates)


def test_adaptive_and_schedule_intervals_cover(pair):
    """SpecDec++'s stopping policy (calls, rejections: read on the path) and HuggingFace's
    schedule (calls and time: its draft length is set when a call starts)."""
    draft, target = pair
    rec = specjax.record(jax.random.key(5), draft, target, NUM * SIZE)
    rates = {}
    for decoder, timed in ((specjax.AdaptiveSpeculative(specjax.decoders.RejectionThreshold(0.4),
                                                        max_lookahead=3), False),
                           (specjax.HeuristicSchedule(1, max_lookahead=3), True)):
        exact = specjax.exact(decoder, draft, target)
        ests = [specjax.estimate(decoder, part, cost=COST if timed else None)
                for part in _parts(rec)]
        wants = {"expected_calls": exact.expected_calls,
                 "expected_rejections": exact.expected_rejections}
        if timed:
            wants["expected_time"] = specjax.expected_time(decoder, draft, target, COST)
        for name, want in wants.items():
            rates[decoder.label, name] = _rate([getattr(e, name) for e in ests],
                                               [getattr(e, name + "_se") for e in ests], want)
    _check(rates)
