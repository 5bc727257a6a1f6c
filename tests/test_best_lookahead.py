"""``specjax.pairs.best_lookahead`` (issues 47 and 51): every ``K`` in one compiled program, each
time with its standard error, and the paired difference to the runner-up.

* exactness: each ``K``'s time equals ``estimate``'s at that ``K`` (float64, 1e-12), also on a
  ragged recording; on an enumerated weighted recording the choice and the times equal
  ``specjax.theory.best_lookahead``'s exact ones;
* Monte Carlo: the paired difference between the best and the runner-up is within 4.5 of its
  standard errors of the exact difference (``theory.decoding_time``);
* ``programs_compiled``: ``K = 1..16`` is one program.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

import specjax
from conftest import programs_compiled
from conftest import every_sequence
from specjax.pairs import Recording

V, T = 3, 4
COST = specjax.CostModel(0.1, [0.0] + [1.0 + 0.1 * n for n in range(16)], call_overhead=0.05)


def _enumerated():
    rng = np.random.default_rng(3)
    init = rng.dirichlet(np.ones(V))
    p = rng.dirichlet(np.ones(V), size=(T, V))
    q = rng.dirichlet(np.ones(V), size=(T, V))
    p[2, 1] = q[2, 1]
    seqs, weights, p_rows, q_rows = every_sequence(init, p, q)
    return (specjax.MarkovChain(init, p), specjax.MarkovChain(init, q)), seqs, weights, \
        p_rows, q_rows


@pytest.mark.parametrize("decoder", [None, specjax.BatchSpeculative(2)])
def test_every_time_is_estimates_and_the_choice_is_exact(x64, decoder):
    (draft, target), seqs, weights, p_rows, q_rows = _enumerated()
    rec = Recording.from_arrays(seqs, p_rows, q_rows, weights=weights)
    ragged = Recording.from_arrays(seqs, p_rows, q_rows, weights=weights,
                                   lengths=np.arange(len(seqs)) % T + 1)
    base = specjax.Speculative() if decoder is None else decoder
    for recording in (rec, ragged):
        choice = specjax.pairs.best_lookahead(recording, COST, max_lookahead=6, decoder=decoder)
        assert choice.times.shape == (T + 1,)  # K past the horizon changes nothing
        for k in range(1, T + 1):
            est = specjax.estimate(dataclasses.replace(base, lookahead=k), recording, cost=COST)
            assert abs(float(est.expected_time) - choice.times[k]) < 1e-12
            assert abs(float(est.expected_time_se) - choice.times_se[k]) < 1e-12
    want = specjax.theory.best_lookahead(draft, target, COST, max_lookahead=6, decoder=decoder)
    choice = specjax.pairs.best_lookahead(rec, COST, max_lookahead=6, decoder=decoder)
    assert choice.lookahead == want.lookahead
    np.testing.assert_allclose(choice.times, want.times, rtol=0, atol=1e-10)
    assert choice.difference == pytest.approx(
        choice.times[choice.runner_up] - choice.times[choice.lookahead], abs=1e-12)


def test_the_paired_difference_is_within_its_standard_error():
    draft, target = specjax.paper_instance()
    rec = specjax.record(jax.random.key(5), draft, target, 2000)
    choice = specjax.pairs.best_lookahead(rec, specjax.CostModel(0.1, 1.0), max_lookahead=6)
    exact = specjax.theory.best_lookahead(draft, target, specjax.CostModel(0.1, 1.0),
                                          max_lookahead=6).times
    want = exact[choice.runner_up] - exact[choice.lookahead]
    assert abs(choice.difference - want) < 4.5 * choice.difference_se
    # Paired: far below either time's own standard error.
    assert choice.difference_se < 0.5 * choice.times_se[choice.lookahead]


def test_sixteen_lookaheads_are_one_program():
    draft, target = specjax.paper_instance()
    rec = specjax.record(jax.random.key(0), draft, target, 64)
    cost = specjax.CostModel(0.1, 1.0)
    specjax.pairs.best_lookahead(rec, cost, max_lookahead=2)  # the eager set-up, warmed
    assert programs_compiled(
        lambda: specjax.pairs.best_lookahead(rec, cost, max_lookahead=16)) == 1
