"""``random_markov_chain``'s fast draw (``method="fast"``, the default above
``FAST_DRAW_ENTRIES``): the Dirichlet law, the same numbers whatever the blocks, and the
threshold that keeps every smaller table (the paper's, the docs') on ``jax.random.dirichlet``."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as scipy_stats

import specjax
import stats
from specjax.models import markov

# V = 4 and T = 4,096: 16,384 independent rows, 65,536 entries in one block.
STATES, HORIZON = 4, 4096


@pytest.mark.parametrize("concentration", [1.0, 0.3, 2.5])
def test_fast_draw_has_the_dirichlet_law(concentration):
    """Entry 0 of independent rows is ``Beta(a, (V - 1) a)`` (Kolmogorov-Smirnov), and the mean
    of ``x_0 x_1`` is ``a^2 / (V a (V a + 1))``: exponentials at ``a = 1``, Marsaglia-Tsang
    with its redraws (about 4 % of the entries at ``a = 0.3``) and without the boost (2.5)."""
    chain = specjax.random_markov_chain(jax.random.key(3), STATES, HORIZON, concentration,
                                        method="fast")
    rows = np.asarray(chain.trans, np.float64).reshape(-1, STATES)
    first = rows[:, 0]  # every row is drawn independently
    law = scipy_stats.beta(concentration, (STATES - 1) * concentration)
    pvalue = scipy_stats.kstest(first, law.cdf).pvalue
    assert pvalue > stats.ALPHA, f"entry 0 is not Beta: KS p-value {pvalue:.2g}"
    total = STATES * concentration
    stats.assert_mean(rows[:, 0] * rows[:, 1], concentration**2 / (total * (total + 1)),
                      "E[x_0 x_1]")


def test_fast_draw_agrees_with_jax_for_peaked_rows():
    """At ``a = 1e-3`` most entries underflow to 0 in float32 (a one-sample test against the
    continuous Beta cannot pass for either sampler): two-sample KS against
    ``jax.random.dirichlet``'s draws, and every row a law."""
    fast = specjax.random_markov_chain(jax.random.key(4), STATES, HORIZON, 1e-3, method="fast")
    # Shaped (T, V) as a chain's rows, alpha not weakly typed (the same numbers as (T V,) rows
    # of a weak alpha, and the program test_auto_draws_fast_above_the_threshold_only's draws
    # compile).
    ref = jax.random.dirichlet(jax.random.key(5), jnp.full((STATES,), 1e-3, jnp.float32),
                               (HORIZON, STATES))
    x = np.asarray(fast.trans, np.float64).reshape(-1, STATES)[:, 0]
    y = np.asarray(ref, np.float64).reshape(-1, STATES)[:, 0]
    assert scipy_stats.ks_2samp(x, y).pvalue > stats.ALPHA
    np.testing.assert_allclose(np.asarray(fast.trans).sum(-1), 1, atol=1e-6)


@pytest.mark.parametrize("concentration", [1.0, 0.3])
def test_fast_draw_gives_the_same_numbers_whatever_the_blocks(monkeypatch, concentration):
    """Row ``r`` from its own key and each redraw of an entry from its own: blocks of 3 rows
    (the last one overlapping; at most 6 redraws at a time, so several rounds) give the table of
    one block bit for bit, and a caller's ``jit`` (a ``fori_loop``) within float32 rounding."""
    key = jax.random.key(5)
    whole = specjax.random_markov_chain(key, 16, 8, concentration, method="fast").trans
    monkeypatch.setattr(markov, "FAST_BLOCK_ENTRIES", 3 * 16)
    blocks = specjax.random_markov_chain(key, 16, 8, concentration, method="fast").trans
    np.testing.assert_array_equal(blocks, whole)
    jitted = jax.jit(lambda k: specjax.random_markov_chain(k, 16, 8, concentration,
                                                           method="fast").trans)(key)
    np.testing.assert_allclose(jitted, whole, rtol=1e-5, atol=1e-7)


def test_auto_draws_fast_above_the_threshold_only(monkeypatch):
    # The module's shape: the direct draw is the peaked test's program, the fast one the
    # law test's at concentration 1.
    key = jax.random.key(6)
    direct = jax.random.dirichlet(key, jnp.ones((STATES,)), shape=(HORIZON, STATES))
    assert markov._resolve_method("auto", 2048 * 2048) == "fast"  # V = 2,048 from T = 1
    assert markov._resolve_method("auto", 1024 * 1024 * 2) == "jax"  # the paper's, the docs'
    np.testing.assert_array_equal(specjax.random_markov_chain(key, STATES, HORIZON).trans,
                                  direct)
    monkeypatch.setattr(markov, "FAST_DRAW_ENTRIES", STATES * STATES * HORIZON - 1)
    np.testing.assert_array_equal(
        specjax.random_markov_chain(key, STATES, HORIZON).trans,
        specjax.random_markov_chain(key, STATES, HORIZON, method="fast").trans)
    np.testing.assert_array_equal(
        specjax.random_markov_chain(key, STATES, HORIZON, method="jax").trans, direct)


def test_fast_draw_in_float64(x64):
    chain = specjax.random_markov_chain(jax.random.key(7), 16, 2, 0.3, method="fast")
    assert chain.trans.dtype == jnp.float64
    np.testing.assert_allclose(np.asarray(chain.trans).sum(-1), 1, atol=1e-12)


def test_method_is_checked():
    with pytest.raises(ValueError, match="method must be one of 'auto', 'jax', 'fast', got "
                                         "'gamma'"):
        specjax.random_markov_chain(jax.random.key(0), 4, 2, method="gamma")


def test_fast_draw_memory_estimate():
    """One block's temporaries (XLA's ``memory_analysis``, the general path) stay below the
    estimate's ``_FAST_BYTES_PER_ENTRY`` per entry; the 2.1 GB table of ``V = 16,384``,
    ``T = 2`` is estimated at less than 1.5 times its size (float32), the validation's booleans
    included."""
    num_rows = markov.FAST_BLOCK_ENTRIES // 256
    compiled = markov._draw_block.lower(
        jax.ShapeDtypeStruct((2 * num_rows, 256), jnp.float32), jax.random.key(0),
        jnp.float32(0.5), np.int32(0), draw=markov._fast_rows, num_rows=num_rows,
        options=("any", 256, jnp.dtype(jnp.float32))).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    assert temp <= markov._FAST_BYTES_PER_ENTRY * markov.FAST_BLOCK_ENTRIES
    table = 2 * 16384**2 * 4
    assert table < markov.markov_chain_bytes(16384, 2, jnp.float32) < 1.5 * table
