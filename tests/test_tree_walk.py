"""The token trees' walk (one position per engine step) and the draws it is built from.

* ``cumulative_masses`` repeats the previous value exactly at a zero entry and never decreases,
  and ``cdf_search`` never draws a zero-mass outcome and draws the others with their
  probability up to its resolution (checked over an even grid of uniforms, no randomness).
* ``TokenTree.sample_call``, the literal call-by-call rule the engine no longer runs, still has
  the exact law of a call (the number of drafts a call keeps, against ``call_law``).

The walk's own law is checked by the tree tests through ``decode`` (``tests/test_token_tree.py``,
``tests/test_dynamic_tree.py``) and its chunks and shards by ``tests/test_scale.py``.
"""

from __future__ import annotations

from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
import stats
from conftest import full_suite_only
from conftest import random_pair
from specjax.decoders.draws import cdf_search
from specjax.decoders.draws import cumulative_masses

GRID = 4096  # uniforms k 2**31 / GRID: every outcome within 1 / GRID of its probability


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_cumulative_masses_and_cdf_search_never_draw_a_zero_mass_outcome(dtype, x64):
    rng = np.random.default_rng(0)
    w = rng.random((6, 37)) * (rng.random((6, 37)) > 0.4) * 10.0 ** rng.integers(-30, 1, (6, 37))
    w[0] = 0.0  # an empty row: the last outcome
    w[1, :-1] = 0.0  # all the mass on the last entry
    w[2, 0] = 1.0  # mass on the first entry only
    w[2, 1:] = 0.0
    masses = jnp.asarray(w, dtype)
    cdf = np.asarray(cumulative_masses(masses))
    np.testing.assert_allclose(cdf, np.cumsum(w, axis=-1), rtol=1e-5 if dtype == "float32"
                               else 1e-12)
    assert np.all(np.diff(cdf, axis=-1) >= 0)
    np.testing.assert_array_equal(np.diff(cdf, axis=-1)[w[:, 1:] == 0], 0)  # exactly
    u = jnp.asarray(np.arange(GRID) * (2**31 // GRID) + 2**31 // GRID - 1, jnp.int32)
    width = w.shape[-1]
    for r, row in enumerate(jnp.asarray(cdf)):
        drawn = np.asarray(jax.vmap(lambda v: cdf_search(lambda i: row[i], v, width))(u))
        counts = np.bincount(drawn, minlength=width) / GRID
        if r == 0:
            np.testing.assert_array_equal(drawn, width - 1)
            continue
        assert np.all(w[r, drawn] > 0), r
        np.testing.assert_allclose(counts, w[r] / w[r].sum(), atol=1.01 / GRID)


@pytest.mark.parametrize("children", ["iid", full_suite_only("without_replacement"), "top_k"])
def test_the_literal_call_rule_keeps_drafts_as_the_call_law_says(children):
    draft, target = (specjax.MarkovChain(jnp.asarray(i, jnp.float32),
                                         jnp.asarray(t, jnp.float32))
                     for i, t in random_pair(301, 3, 4, zero_fraction=0.3))
    tree = specjax.TokenTree((2, 1), children=children)
    depth, num = tree.lookahead, 40_000
    law = tree.call_law(draft.trans[:depth], target.trans[:depth], target.trans[depth],
                        with_bonus=True)
    bits = jax.random.bits(jax.random.key(3), (num, tree.num_uniforms), jnp.uint32)
    u = jax.lax.shift_right_logical(bits, jnp.uint32(1)).astype(jnp.int32)
    tables = tree.prepare(draft, target)
    for prev in range(3):
        _, kept, _ = jax.vmap(lambda v: tree.sample_call(tables, 1, prev, v))(u)
        reach = [1.0] + [float(jnp.sum(law.kept[d, prev])) for d in range(depth)] + [0.0]
        expected = {k: reach[k] - reach[k + 1] for k in range(depth + 1)}
        stats.assert_law(Counter(np.asarray(kept).tolist()), expected, num,
                         f"{children} drafts kept after {prev}")
