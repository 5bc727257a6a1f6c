"""``optimal_acceptance`` for i.i.d. drafts without a sort (``iid_optimal_acceptance(...,
method="buckets")``, the CPU's default for float32 rows) against the sort (``method="sort"``)
and a float64 NumPy transcription of ``1 - max_k [P_k^M - Q_k]``: values within float32
rounding on random rows, rows where every ratio is equal, rows with many ties and zeros, and rows
built to overflow the buffer; the same gradients; finite values and gradients at the edge cases.

Batches of 8 rows of ``V = 256`` tokens, a buffer of 64 tokens (``BUCKET_BUFFER`` is 1,024 at
real vocabularies) and ``M`` in 1, 2, 4, 8 throughout, so the compiled programs are shared.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from conftest import random_rows
from specjax.decoders import optimal_acceptance as oa

ROWS, V = 8, 256
BUFFER = 64
DRAFTS = (1, 2, 4, 8)
#: float32 rounding of sums of masses in [0, 1] over 256 tokens, with room for the power.
TOL = 3e-6


@jax.jit
def _both(p, q):
    """For each ``M``: the values by buckets and by the sort, and the search's overflow
    flags."""
    out = []
    for m in DRAFTS:
        out.append((oa.iid_optimal_acceptance(p, q, m, method="buckets", buffer=BUFFER),
                    oa.iid_optimal_acceptance(p, q, m, method="sort"),
                    oa._bucket_search(p, q, m, BUFFER).overflow))
    return out


#: ``M`` for the gradients (their programs compile slowest).
GRAD_DRAFTS = (1, 2, 8)


@jax.jit
def _gradients(p, q):
    out = []
    for method in oa.IID_METHODS:
        for m in GRAD_DRAFTS:
            def total(p, q, m=m, method=method):
                return jnp.sum(oa.iid_optimal_acceptance(p, q, m, method=method,
                                                         buffer=BUFFER))
            out.append(jax.grad(total, argnums=(0, 1))(p, q))
    return out[:len(GRAD_DRAFTS)], out[len(GRAD_DRAFTS):]


def numpy_optimum(p, q, m):
    """``1 - max_k [P_k^M - Q_k]`` over prefixes sorted by ``q / p`` in float64 NumPy."""
    p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
    positive = p > 0
    ratio = np.where(positive, q / np.where(positive, p, 1), np.where(q > 0, np.inf, 0))
    order = np.argsort(ratio, axis=-1, kind="stable")
    zero = np.zeros(p.shape[:-1] + (1,))
    p_cum = np.concatenate([zero, np.cumsum(np.take_along_axis(p, order, -1), -1)], -1)
    q_cum = np.concatenate([zero, np.cumsum(np.take_along_axis(q, order, -1), -1)], -1)
    return 1 - np.max(p_cum ** m - q_cum, axis=-1), p_cum ** m - q_cum


def _rows(rng, count, zeros, concentration):
    p = random_rows(rng, (count, V), zero_fraction=zeros, concentration=concentration)
    q = random_rows(rng, (count, V), zero_fraction=zeros, concentration=concentration)
    return p.astype(np.float32), q.astype(np.float32)


def _tied_rows(rng, count):
    """Masses on a coarse grid (ratios repeat), with zeros in p, in q and in both."""
    p = rng.integers(0, 4, size=(count, V)).astype(np.float64)
    q = rng.integers(0, 4, size=(count, V)).astype(np.float64)
    q[:, ::7] = p[:, ::7]  # ratio 1 runs
    p[:, 0], q[:, 1] = 1.0, 1.0
    p, q = p / p.sum(-1, keepdims=True), q / q.sum(-1, keepdims=True)
    return p.astype(np.float32), q.astype(np.float32)


def _equal_ratio_rows(rng, count):
    """Every ratio equal: p = q (with zeros, one-hot, uniform)."""
    p = random_rows(rng, (count, V), zero_fraction=0.5).astype(np.float32)
    p[0] = 0
    p[0, 3] = 1
    p[1] = 1 / V
    return p, p.copy()


def _overflow_rows(rng, count):
    """Rows whose open buckets hold more than the buffer: q = p up to a ratio spread of 1% (one
    or two buckets hold every token, and one of them holds the optimum); row 0 is a plain random
    row that does not overflow (the batch mixes both)."""
    p = random_rows(rng, (count, V)).astype(np.float64)
    q = p * (1 + 0.01 * rng.random(p.shape))
    q /= q.sum(-1, keepdims=True)
    p0, q0 = _rows(rng, 1, 0.1, 0.3)
    p[0], q[0] = p0[0], q0[0]
    return p.astype(np.float32), q.astype(np.float32)


def _check_values(p, q, what, expect_overflow=None):
    out = _both(jnp.asarray(p), jnp.asarray(q))
    for m, (buckets, by_sort, overflow) in zip(DRAFTS, out):
        want, _ = numpy_optimum(p, q, m)
        where = f"{what}, M = {m}"
        np.testing.assert_allclose(buckets, want, rtol=0, atol=TOL, err_msg=where)
        np.testing.assert_allclose(by_sort, want, rtol=0, atol=TOL, err_msg=where)
        if expect_overflow is not None:
            np.testing.assert_array_equal(overflow, expect_overflow, err_msg=where)
    return out


def test_buckets_equal_the_sort_on_random_rows():
    """Dirichlet(0.3) and Dirichlet(1) rows with 10% zeros: no row overflows the buffer."""
    rng = np.random.default_rng(0)
    for concentration in (0.3, 1.0):
        p, q = _rows(rng, ROWS, 0.1, concentration)
        _check_values(p, q, f"Dirichlet({concentration})", expect_overflow=np.zeros(ROWS, bool))


def test_buckets_equal_the_sort_on_equal_ratios_ties_and_zeros():
    rng = np.random.default_rng(1)
    p, q = _equal_ratio_rows(rng, ROWS)
    out = _check_values(p, q, "p = q")
    for buckets, *_ in out:
        np.testing.assert_allclose(buckets, 1, atol=TOL)  # p = q: every draft is accepted
    p, q = _tied_rows(rng, ROWS)
    _check_values(p, q, "ties and zeros")


def test_rows_that_overflow_the_buffer_take_the_sort():
    rng = np.random.default_rng(2)
    p, q = _overflow_rows(rng, ROWS)
    out = _check_values(p, q, "overflow")
    overflow = np.stack([o[2] for o in out])
    assert overflow[:, 1:].all() and not overflow[:, 0].any(), overflow
    # the same rows one at a time: the plain row alone is computed by buckets
    alone = _by_buckets(p[:1], q[:1], 2, BUFFER)
    np.testing.assert_allclose(alone, numpy_optimum(p[:1], q[:1], 2)[0], atol=TOL)


@functools.partial(jax.jit, static_argnums=(2, 3))
def _by_buckets(p, q, m, buffer):
    """``iid_optimal_acceptance(..., method="buckets")``: one program (eagerly, dozens)."""
    return oa.iid_optimal_acceptance(p, q, m, method="buckets", buffer=buffer)


@jax.jit
def _small_and_whole_buffers(p, q):
    """M = 2 with a buffer of 2 tokens (its overflow flags and values) and of ``V`` tokens."""
    return (oa._bucket_search(p, q, 2, 2).overflow,
            [oa.iid_optimal_acceptance(p, q, 2, method="buckets", buffer=b) for b in (2, V)])


def test_a_small_buffer_overflows_and_stays_exact():
    """A buffer of 2 tokens overflows on random rows (their open range holds more), and the
    result is the sort's; ``buffer = V`` never overflows."""
    rng = np.random.default_rng(3)
    p, q = _rows(rng, 4, 0.1, 0.3)
    overflow, values = _small_and_whole_buffers(jnp.asarray(p), jnp.asarray(q))
    assert np.asarray(overflow).all()
    for got in values:
        np.testing.assert_allclose(got, numpy_optimum(p, q, 2)[0], atol=TOL)


def _separated(p, q, m, gap):
    """Rows whose best prefix beats every prefix of a different value by ``gap`` (float64),
    so that float32 rounding cannot move the maximiser."""
    _, values = numpy_optimum(p, q, m)
    top = values.max(-1, keepdims=True)
    runner = np.where(values >= top - 1e-12, -np.inf, values).max(-1)
    return top[:, 0] - runner > gap


def test_gradients_equal_the_sorts():
    """On random rows with zeros whose maximiser is separated beyond rounding (the sort's own
    subgradient is set by float32 rounding when two prefixes tie within it), and on rows whose
    maximiser is among the ratio-0 tokens with ``p = q = 0`` tokens after it (an exact tie that
    ``jnp.max`` averages over, which ``method="buckets"`` reproduces)."""
    rng = np.random.default_rng(4)
    p, q = _rows(rng, ROWS, 0.3, 1.0)
    # rows 4..7: the optimum is the set {q = 0} (the first 48 tokens), which holds most of p
    # and ends in 16 null tokens
    zero, rest = 48, V - 48
    for row in range(4, ROWS):
        q[row, :zero], q[row, zero:] = 0, rng.random(rest) + 0.1
        p[row, :zero], p[row, zero:] = rng.random(zero) + 0.1, 5e-4 * (rng.random(rest) + 0.1)
        p[row, zero - 16: zero] = 0  # null tokens after the last one with p > 0 and q = 0
        q[row] /= q[row].sum()
        p[row] /= p[row].sum()
    flags = {m: overflow for m, (_, _, overflow) in zip(DRAFTS, _both(jnp.asarray(p),
                                                                       jnp.asarray(q)))}
    for m in GRAD_DRAFTS:  # the buckets compute every row (no row takes the sort)
        assert not np.asarray(flags[m]).any()
    buckets, by_sort = _gradients(jnp.asarray(p), jnp.asarray(q))
    for m, got, want in zip(GRAD_DRAFTS, buckets, by_sort):
        rows = _separated(p, q, m, 2e-5)
        assert rows.sum() >= 5 and rows[4:].all(), (m, rows)
        for g, w, name in zip(got, want, "pq"):
            np.testing.assert_allclose(np.asarray(g)[rows], np.asarray(w)[rows], rtol=1e-5,
                                       atol=1e-6, err_msg=f"M = {m}, d/d{name}")
            assert np.isfinite(g).all()
    # the null tokens after the last token with p > 0 in the ratio-0 run share the tie
    d_p, d_q = (np.asarray(g)[4, zero - 16: zero] for g in buckets[1])  # M = 2
    assert (np.diff(d_q) < 0).all() and 0 < d_q.min() and d_q.max() < 1, d_q  # share 16/17..1/17
    assert (np.diff(d_p) > 0).all() and d_p.max() < 0, d_p  # -2 P share


def test_edge_rows_have_finite_values_and_gradients():
    """p = q, disjoint supports, one-hot rows, zero rows of p where q > 0: values in [0, 1],
    gradients finite, by buckets as by the sort."""
    p = np.zeros((ROWS, V), np.float32)
    q = np.zeros((ROWS, V), np.float32)
    p[0, :2], q[0, :2] = 0.5, 0.5  # p = q on two tokens, zeros elsewhere
    p[1, :2], q[1, 2:4] = 0.5, 0.5  # disjoint supports
    p[2, 0], q[2, 1] = 1, 1  # one-hot, disjoint
    p[3, 0], q[3, 0] = 1, 1  # one-hot, equal
    p[4:], q[4:] = q[:4], p[:4]  # and the same with p and q swapped
    out = _both(jnp.asarray(p), jnp.asarray(q))
    for m, (buckets, by_sort, _) in zip(DRAFTS, out):
        np.testing.assert_allclose(buckets, by_sort, atol=TOL, err_msg=f"M = {m}")
        np.testing.assert_allclose(buckets, [1, 0, 0, 1] * 2, atol=TOL, err_msg=f"M = {m}")
    buckets, by_sort = _gradients(jnp.asarray(p), jnp.asarray(q))
    for grads in buckets:
        assert all(np.isfinite(g).all() for g in grads)


def _lowered_text(num_states, dtype="float32"):
    rows = jax.ShapeDtypeStruct((2, num_states), jnp.dtype(dtype))
    return jax.jit(lambda p, q: specjax.optimal_acceptance(p, q, num_drafts=2)).lower(
        rows, rows).as_text()


def test_the_backend_chooses_buckets_for_long_float32_rows():
    """On this CPU ``optimal_acceptance`` lowers to the buckets (a ``top_k``, no sort outside
    the overflow branch) for float32 rows of ``BUCKET_MIN_STATES`` tokens, and to the sort for
    shorter rows."""
    assert "top_k" in _lowered_text(oa.BUCKET_MIN_STATES)
    short = _lowered_text(V)
    assert "top_k" not in short and "sort" in short


def test_batch_shapes():
    rng = np.random.default_rng(5)
    p, q = _rows(rng, ROWS, 0.1, 0.3)
    p3, q3 = p.reshape(2, 4, V), q[:4]  # broadcast (2, 4, V) against (4, V)
    got = jax.jit(lambda p, q: oa.iid_optimal_acceptance(p, q, 2, method="buckets",
                                                         buffer=BUFFER))(p3, q3)
    assert got.shape == (2, 4)
    np.testing.assert_allclose(got, numpy_optimum(p3, np.broadcast_to(q3, p3.shape), 2)[0],
                               atol=TOL)


def test_invalid_arguments_are_refused_naming_them():
    p = jnp.full((V,), 1 / V)
    with pytest.raises(ValueError, match="method must be one of"):
        oa.iid_optimal_acceptance(p, p, 2, method="radix")
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="buffer must be a positive int"):
            oa.iid_optimal_acceptance(p, p, 2, method="buckets", buffer=bad)
    with pytest.raises(ValueError, match="num_drafts"):
        oa.iid_optimal_acceptance(p, p, 0)
    with pytest.raises(ValueError, match="num_drafts must be a finite int"):
        oa.iid_optimal_acceptance(p, p, math.inf)
    with jax.enable_x64(True):
        with pytest.raises(ValueError, match="method='buckets' needs float32 rows"):
            oa.iid_optimal_acceptance(jnp.asarray(p, jnp.float64), p, 2, method="buckets")
