"""``specjax.pairs.best_decoder``: which tree (which budget, which decoder) from a recording.

* Exact: on every sequence of a small pair weighted by its target probability, each candidate's
  time equals ``decoding_time`` to 1e-10 in float64 and the choice is the exact argmin.
* Paired: the difference's standard error is that of the per-sequence differences (computed here
  from ``estimate``'s own per-sequence values) and is below either time's on alike candidates.
* Monte Carlo: over 200 recordings the interval of the paired difference between two tree
  budgets holds the exact difference at a rate within three standard errors of 95%.
* Refusals name the candidate's position, before any work.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import specjax
from conftest import chain
from conftest import every_sequence
from conftest import random_pair
from specjax.pairs import Recording
from specjax.pairs.estimate import per_sequence

V, T = 3, 4
COST = specjax.CostModel(0.1, [0.0] + [1.0 + 0.1 * n for n in range(40)], call_overhead=0.05)
CANDIDATES = (specjax.TokenTree((2, 2)), specjax.TokenTree((2, 1, 1), children="top_k"),
              specjax.TokenTree((3, 1), children="without_replacement"),
              specjax.Speculative(lookahead=2), specjax.HeuristicSchedule(1, max_lookahead=3),
              specjax.BatchSpeculative(2, lookahead=2))


def _enumerated():
    rng = np.random.default_rng(47)
    init = rng.dirichlet(np.ones(V))
    p = rng.dirichlet(np.ones(V), size=(T, V))
    q = rng.dirichlet(np.ones(V), size=(T, V))
    seqs, weights, p_rows, q_rows = every_sequence(init, p, q)
    models = specjax.MarkovChain(init, p), specjax.MarkovChain(init, q)
    return models, Recording.from_arrays(seqs, p_rows, q_rows, weights=weights)


def test_every_time_is_exact_and_the_choice_is_the_argmin(x64):
    (draft, target), rec = _enumerated()
    choice = specjax.pairs.best_decoder(rec, COST, list(CANDIDATES))
    want = np.asarray([float(specjax.theory.decoding_time(d, draft, target, COST).expected_time)
                       for d in CANDIDATES])
    np.testing.assert_allclose(choice.times, want, rtol=0, atol=1e-10)
    order = np.argsort(want, kind="stable")
    assert choice.index == order[0] and choice.decoder == CANDIDATES[order[0]]
    assert choice.runner_up == order[1]
    assert abs(choice.difference - (want[order[1]] - want[order[0]])) < 1e-10
    assert choice.expected_time == choice.times[choice.index]


def test_the_difference_is_paired():
    draft, target = specjax.paper_instance()
    rec = specjax.record(jax.random.key(1), draft, target, 400, keep_rows=True)
    trees = [specjax.TokenTree((2, 2)), specjax.TokenTree((2, 1, 1)), specjax.TokenTree((1,))]
    choice = specjax.pairs.best_decoder(rec, COST, trees)
    for i, tree in enumerate(trees):  # each time is estimate's
        est = specjax.estimate(tree, rec, cost=COST)
        assert choice.times[i] == pytest.approx(float(est.expected_time), rel=1e-6)
        assert choice.times_se[i] == pytest.approx(float(est.expected_time_se), rel=1e-4)
    times = [np.asarray(per_sequence(t, rec, COST)[1][:, 2], np.float64) for t in trees]
    diff = times[choice.runner_up] - times[choice.index]
    assert choice.difference_se == pytest.approx(np.std(diff, ddof=1) / np.sqrt(len(diff)),
                                                 rel=1e-6)
    alike = specjax.pairs.best_decoder(rec, COST, trees[:2])  # two budgets of one shape
    assert alike.difference_se < 0.5 * min(alike.times_se)
    one = specjax.pairs.best_decoder(rec, COST, trees[:1])
    assert one.index == 0 and one.runner_up == -1 and one.difference == 0.0


def test_paired_difference_covers_over_200_recordings():
    num, size = 200, 100
    draft, target = (chain(x) for x in random_pair(31, 4, 8))
    trees = [specjax.TokenTree((2, 1)), specjax.TokenTree((2, 2), children="top_k")]
    want = [float(specjax.expected_time(t, draft, target, COST)) for t in trees]
    rec = specjax.record(jax.random.key(6), draft, target, num * size, keep_rows=True)
    covered = 0
    for i in range(num):
        part = jax.tree.map(lambda x, i=i: x[i * size:(i + 1) * size], rec)
        choice = specjax.pairs.best_decoder(part, COST, trees)
        sign = 1.0 if choice.index == 0 else -1.0  # the difference as tree 1 minus tree 0
        covered += abs(sign * choice.difference - (want[1] - want[0])) <= \
            1.959964 * choice.difference_se
    assert abs(covered - 0.95 * num) <= 3 * np.sqrt(num * 0.95 * 0.05), covered


def test_refusals_name_the_candidate():
    _, rec = _enumerated()
    stats = Recording.from_statistics(rec.tokens, rec.draft_prob, rec.target_prob)
    cases = [
        (dict(candidates=[]), "candidates must be a non-empty"),
        (dict(candidates=specjax.TokenTree((2,))), "candidates must be a non-empty"),
        (dict(candidates=[specjax.Speculative(), specjax.TopKAcceptance(2)]),
         r"candidates\[1\]: decoder: TopKAcceptance is a lossy rule"),
        (dict(candidates=[specjax.Speculative(), "sd"]), r"candidates\[1\]"),
        (dict(candidates=[specjax.AdaptiveSpeculative(specjax.decoders.EntropyThreshold(1.0),
                                                      max_lookahead=2)]),
         r"candidates\[0\]: cost"),
        (dict(candidates=[specjax.Speculative()], cost=specjax.ServingCost(0.1, 1.0)),
         "cost must be a specjax.CostModel"),
        (dict(candidates=[specjax.TokenTree((2, 1))], recording=stats), r"candidates\[0\]"),
    ]
    for kwargs, match in cases:
        args = dict(recording=rec, cost=COST) | kwargs
        with pytest.raises(ValueError, match=match):
            specjax.pairs.best_decoder(args.pop("recording"), args.pop("cost"), **args)
