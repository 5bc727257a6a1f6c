"""Token trees from a recording (issue 47, item 2): the phase filter with the tree's node as its
state (``specjax.pairs.trees``).

* exactness: on a V = 3, T = 4 pair with zeros, disjoint supports and p = q rows, every sequence
  enumerated and weighted by its target probability, ``estimate`` of a ``TokenTree`` (i.i.d.,
  without replacement and top-k children; uniform and irregular shapes) equals ``exact``,
  ``decoding_time`` and ``engine_metrics`` to 1e-10 in float64, and ``estimate(...,
  cost=ServingCost, batch_size=B)`` equals ``serving_rate``; a chain ``(1, 1)`` equals SD with
  ``K = 2`` from the same recording;
* Monte Carlo: from 1,000 recorded rollouts of the paper's pair each tree's estimate is within
  4.5 standard errors of ``exact``; with a stop token (no exact value yet for trees), the ragged
  estimate agrees with ``decode``'s mean calls within 4.5 standard errors of the difference;
* validation: a recording without rows, and a tree among ``decoders=``, are refused.
"""

from __future__ import annotations


import jax
import numpy as np
import pytest

import specjax
from conftest import every_sequence
from specjax.pairs import Recording

V, T = 3, 4
COST = specjax.CostModel(0.1, [0.0] + [1.0 + 0.1 * n for n in range(40)], call_overhead=0.05)
TREES = {
    "iid (2, 1)": specjax.TokenTree((2, 1)),
    "without replacement (2, 2)": specjax.TokenTree((2, 2), children="without_replacement"),
    "top-k (3, 1)": specjax.TokenTree((3, 1), children="top_k"),
    "irregular iid": specjax.TokenTree.from_parents((-1, 0, 0, 1, 1, 2, 3)),
    "irregular top-k": specjax.TokenTree.from_parents((-1, 0, 0, 1, 3), children="top_k"),
}


def _enumerated():
    rng = np.random.default_rng(1)
    init = rng.dirichlet(np.ones(V))
    p = rng.dirichlet(np.ones(V), size=(T, V))
    q = rng.dirichlet(np.ones(V), size=(T, V))
    q[1, 2] = [0.0, 0.3, 0.7]
    p[1, 2] = [1.0, 0.0, 0.0]  # disjoint supports
    p[2, 0] = q[2, 0]  # p = q
    seqs, weights, p_rows, q_rows = every_sequence(init, p, q)
    models = specjax.MarkovChain(init, p), specjax.MarkovChain(init, q)
    return models, Recording.from_arrays(seqs, p_rows, q_rows, weights=weights)


@pytest.mark.parametrize("name", sorted(TREES))
def test_a_trees_estimate_of_every_sequence_equals_exact(x64, name):
    (draft, target), rec = _enumerated()
    tree = TREES[name]
    exact = specjax.exact(tree, draft, target)
    time = specjax.theory.decoding_time(tree, draft, target, COST)
    metrics = specjax.theory.engine_metrics(tree, draft, target)
    est = specjax.estimate(tree, rec, cost=COST)
    assert abs(float(est.expected_calls - exact.expected_calls)) < 1e-10
    assert abs(float(est.expected_rejections - exact.expected_rejections)) < 1e-10
    assert abs(float(est.expected_time - time.expected_time)) < 1e-10
    for field in ("expected_drafted", "accepted_at", "acceptance_per_position",
                  "mean_acceptance_length"):
        np.testing.assert_allclose(getattr(est.metrics, field), getattr(metrics, field),
                                   rtol=0, atol=1e-10, err_msg=field)
    serving = specjax.ServingCost(0.05, specjax.theory.roofline(1.0, knee=4, size=512),
                                  overhead=0.1)
    got = specjax.estimate(tree, rec, cost=serving, batch_size=4)
    want = specjax.serving_rate(tree, draft, target, serving, batch_size=4)
    assert abs(float(got.tokens_per_time - want.tokens_per_time)) < 1e-10


def test_a_chain_is_speculative_decoding(x64):
    _, rec = _enumerated()
    chain = specjax.estimate(specjax.TokenTree((1, 1)), rec, cost=COST)
    sd = specjax.estimate(specjax.Speculative(lookahead=2), rec, cost=COST)
    for field in ("expected_calls", "expected_rejections", "expected_time"):
        assert abs(float(getattr(chain, field) - getattr(sd, field))) < 1e-12, field


def test_trees_from_recorded_rollouts_are_within_the_standard_error():
    draft, target = specjax.paper_instance()
    rec = specjax.record(jax.random.key(3), draft, target, 1000, keep_rows=True)
    for tree in (specjax.TokenTree((2, 1)),
                 specjax.TokenTree((3, 2, 1), children="without_replacement"),
                 specjax.TokenTree((4, 2), children="top_k")):
        est = specjax.estimate(tree, rec)
        exact = specjax.exact(tree, draft, target)
        z = (float(est.expected_calls) - float(exact.expected_calls)) / float(
            est.expected_calls_se)
        assert abs(z) < 4.5, (tree.label, z)


def test_a_ragged_trees_estimate_agrees_with_decode():
    draft, target = specjax.paper_instance()
    tree = specjax.TokenTree((2, 1))
    rec = specjax.record(jax.random.key(4), draft, target, 1000, keep_rows=True, stop_tokens=3)
    est = specjax.estimate(tree, rec)
    trace = specjax.decode(jax.random.key(5), tree, draft, target, 2000, stop_tokens=3)
    calls = np.asarray(trace.num_calls, np.float64)
    se = np.hypot(float(est.expected_calls_se), calls.std(ddof=1) / np.sqrt(calls.size))
    assert abs(float(est.expected_calls) - calls.mean()) < 4.5 * se


def test_a_tree_needs_the_rows():
    _, rec = _enumerated()
    stats = Recording.from_statistics(rec.tokens, rec.draft_prob, rec.target_prob,
                                      weights=rec.weights)
    with pytest.raises(ValueError, match="full rows along the path"):
        specjax.estimate(specjax.TokenTree((2, 1)), stats)
    with pytest.raises(ValueError, match="no per-position rates to record"):
        Recording.from_arrays(rec.tokens, rec.draft_probs, rec.target_probs,
                              decoders=(specjax.TokenTree((2, 1)),))
    with pytest.raises(ValueError, match="off the recorded path"):
        specjax.estimate(specjax.BlockVerification(2), rec)
