"""``theory.goodput_grid`` (issue 51, item 2): every (slot work, batch size) in one program.

* The grid equals ``goodput`` per setting to 1e-12 in float64, every field, for works of
  different supports and lengths (``K = 0..4``, a token tree, an adaptive decoder), a callable
  draft time and an overhead.
* ``programs_compiled``: ``K = 0..8`` at one batch size is one program, and new values of the
  same shapes compile none; repeated ``pairs`` goodput gradients (``goodput_influence``,
  ``pairs.batch_lookahead``) compile nothing after the first call.
* ``goodput_influences`` (every ``K`` at every size, one program) equals ``goodput_influence``
  per setting.
* Bad input names its argument.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import specjax
from conftest import programs_compiled
from specjax.pairs import serving as pairs_serving
from specjax.pairs.estimate import filtered
from specjax.pairs.serving import goodput_influence
from specjax.pairs.serving import goodput_influences
from specjax.pairs.serving import slot_means
from specjax.theory import serving

COST = specjax.ServingCost(lambda n: 0.04 + 0.01 * n, serving.roofline(1.0, knee=6, size=200),
                           overhead=0.1)


def _works(draft, target, decoders):
    return [serving.slot_work(d, None if isinstance(d, specjax.Autoregressive) else draft,
                              target) for d in decoders]


def test_grid_is_goodput_per_setting(x64):
    draft, target = specjax.paper_instance(num_states=5, horizon=12)
    decoders = ([specjax.Autoregressive()] + [specjax.Speculative(lookahead=k) for k in (1, 2, 4)]
                + [specjax.TokenTree((2, 1)), specjax.AdaptiveSpeculative(
                    specjax.decoders.RejectionThreshold(0.3), max_lookahead=3)])
    works = _works(draft, target, decoders)
    sizes = (1, 3, 8)
    grid = serving.goodput_grid(works, COST, batch_size=sizes)
    assert grid.tokens_per_time.shape == (3, len(works))
    for i, size in enumerate(sizes):
        for j, work in enumerate(works):
            one = serving.goodput(work, COST, batch_size=size)
            for field in one._fields:
                want, got = np.asarray(getattr(one, field)), np.asarray(getattr(grid, field)[i, j])
                if field == "scored_law":  # zero past the work's own law
                    assert (got[want.shape[0]:] == 0).all()
                    got = got[:want.shape[0]]
                np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15,
                                           err_msg=f"{field}, B = {size}, {decoders[j].label}")
    alone = serving.goodput_grid(works, COST, batch_size=3)  # an int: no size axis
    np.testing.assert_allclose(alone.tokens_per_time, grid.tokens_per_time[1], rtol=1e-14)


def test_nine_lookaheads_are_one_program():
    draft, target = specjax.paper_instance(num_states=5, horizon=12)
    decoders = [specjax.Autoregressive()] + [specjax.Speculative(lookahead=k) for k in range(1, 9)]
    works = jax.block_until_ready(_works(draft, target, decoders))
    assert programs_compiled(lambda: serving.goodput_grid(works, COST, batch_size=8)) == 1
    other = jax.block_until_ready(_works(*specjax.paper_instance(seed=4, num_states=5,
                                                                 horizon=12), decoders))
    assert programs_compiled(lambda: serving.goodput_grid(other, COST, batch_size=8)) == 0
    assert programs_compiled(lambda: serving.goodput(works[3], COST, batch_size=5)) == 1
    batch = serving.batch_lookahead(draft, target, COST, batch_size=8, max_lookahead=8)
    got = np.asarray(serving.goodput_grid(works, COST, batch_size=8).tokens_per_time)
    np.testing.assert_allclose(batch.fixed_rates, got, rtol=1e-6)


def test_pairs_goodput_is_compiled_once(x64):
    draft, target = specjax.paper_instance(num_states=5, horizon=10)
    sd = specjax.Speculative(lookahead=3)
    recordings = [specjax.record(jax.random.key(i), draft, target, 50) for i in range(2)]
    per_sequence, weights, passes, scored = slot_means(sd, recordings[0], filtered)
    goodput_influence(per_sequence, weights, passes, scored, COST, 4)
    traced = pairs_serving._influences._cache_size()  # value and gradient: one jitted program
    moved = per_sequence * 0.9
    assert programs_compiled(
        lambda: goodput_influence(moved, weights, passes, scored, COST, 4)) == 0
    assert pairs_serving._influences._cache_size() == traced  # not traced again
    specjax.pairs.batch_lookahead(recordings[0], COST, batch_size=(1, 4), max_lookahead=4)
    assert programs_compiled(lambda: specjax.pairs.batch_lookahead(
        recordings[1], COST, batch_size=(1, 4), max_lookahead=4)) == 0
    # Every K at every size in one program equals one setting at a time.
    decoders = [specjax.Autoregressive()] + [specjax.Speculative(lookahead=k) for k in (1, 3)]
    means = [slot_means(d, recordings[1], filtered) for d in decoders]
    values, baselines, influences = goodput_influences(
        [m[0] for m in means], means[0][1], [m[2:] for m in means], COST, (1, 4))
    for i, size in enumerate((1, 4)):
        for j, (per_sequence, weights, passes, scored) in enumerate(means):
            value, baseline, influence = goodput_influence(per_sequence, weights, passes,
                                                           scored, COST, size)
            np.testing.assert_allclose(values[i, j], value, rtol=1e-12)
            np.testing.assert_allclose(baselines[i], baseline, rtol=1e-12)
            np.testing.assert_allclose(influences[i, j], influence, rtol=1e-10, atol=1e-12)


def test_grid_bad_input():
    draft, target = specjax.paper_instance(num_states=5, horizon=6)
    work = serving.slot_work(specjax.Speculative(lookahead=2), draft, target)
    with pytest.raises(ValueError, match="works must be a non-empty sequence.*empty"):
        serving.goodput_grid([], COST, batch_size=4)
    with pytest.raises(ValueError, match=r"works\[1\] must be a SlotWork"):
        serving.goodput_grid([work, (1.0, 2.0)], COST, batch_size=4)
    with pytest.raises(ValueError, match=r"works must be .* one SlotWork: pass \[work\]"):
        serving.goodput_grid(work, COST, batch_size=4)
    with pytest.raises(ValueError, match="batch_size must be a positive int or a non-empty"):
        serving.goodput_grid([work], COST, batch_size=())
    with pytest.raises(ValueError, match="batch_size"):
        serving.goodput_grid([work], COST, batch_size=(4, 0))
    with pytest.raises(ValueError, match="cost must be a specjax.ServingCost"):
        serving.goodput_grid([work], specjax.CostModel(0.1, 1.0), batch_size=4)
    with pytest.raises(ValueError, match="target_time is a table of length"):
        serving.goodput_grid([work], specjax.ServingCost(0.1, [0.0, 1.0, 1.0]), batch_size=4)
