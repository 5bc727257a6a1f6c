"""The screen of probability rows (``specjax._checks.suspect_rows``) that ``verify_drafts``,
``verify_tree`` and ``compare_outputs`` run on large arrays, one compiled program that reads
each row the computation reads once (on a CPU, by blocks of rows): it flags every row the
exact check refuses, and the errors are the exact check's, word for word."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax import _checks

# One shape for every test: B = 4 requests, K = 3 drafts, V = 300 tokens (each row's partial
# sums: 3 chunks of 100 terms, read in place); V + 1 = 301 = 7 x 43 for the fallback (2 chunks of
# 128 and a tail of 45).
B, K, V = 4, 3, 300
SD = specjax.Speculative()


def rows(seed, shape, dtype=np.float32, length=V):
    rng = np.random.default_rng(seed)
    x = rng.dirichlet(np.full(length, 0.5), size=shape)
    return x.astype(dtype)


def screen(x, tol):
    return _checks.suspect_rows([x], [tol])[0]


def exact_bad(x, tol):
    values = np.asarray(x)
    with np.errstate(invalid="ignore"):
        return ~np.isfinite(values).all(-1) | (values < 0).any(-1) \
            | (np.abs(values.sum(-1, dtype=np.float64) - 1) > tol)


@pytest.mark.parametrize("length", [V, V + 1])
def test_the_screen_flags_every_row_that_fails_near_the_tolerance(length):
    """Rows scaled to miss one by ``d`` around the float32 tolerance (1e-4), both sides, with
    mass spread (Dirichlet 0.5) or on one entry, in chunks read in place (``V``) or with a tail
    (``V + 1``): every row the exact check refuses is flagged, and rows well inside pass
    unflagged."""
    tol = _checks.row_sum_tolerance(np.float32)
    base = rows(0, (64,), np.float64, length)
    base[::2, 0] += 50  # half the rows: most of the mass on one entry
    base /= base.sum(-1, keepdims=True)
    misses = np.concatenate([np.linspace(-3 * tol, 3 * tol, 61), [0.0, 1e-6, -1e-6]])
    x = (base[None] * (1 + misses[:, None, None])).astype(np.float32)
    bad = exact_bad(x, tol)
    flagged = screen(x, tol)
    assert bad.any() and (~bad).any()
    assert not (bad & ~flagged).any()  # no failing row passes the screen
    inside = np.abs(x.astype(np.float64).sum(-1) - 1) < tol / 4
    assert not flagged[inside].any()


@pytest.mark.parametrize("entry, what", [
    (np.nan, "NaN"), (np.inf, "infinite"), (-np.inf, "infinite"), (-1e-3, "negative"),
    (-1e-40, "negative"),  # a subnormal: the CPU flushes it to -0.0
])
def test_bad_entries_are_flagged(entry, what):
    x = rows(1, (B, K + 1))
    x[2, 1, 5] = entry
    flagged = screen(x, 1e-4)
    assert flagged[2, 1] and flagged.sum() == 1, what


def test_negative_zero_is_flagged_and_passes_the_exact_check(monkeypatch):
    x = rows(2, (B, K + 1))
    x[0, 0, 3] = -0.0
    x[0, 0] /= x[0, 0].sum()  # -0.0 stays -0.0
    assert np.signbit(x[0, 0, 3])
    assert screen(x, 1e-4)[0, 0]
    monkeypatch.setattr(_checks, "FUSED_CHECK_ENTRIES", 0)
    specjax.verify_drafts(jax.random.key(0), SD, np.zeros((B, K), np.int32) + 3,
                          rows(3, (B, K)), x)


def bad_requests():
    """``(name, changes)``: bad rows at chosen places of the drafts, target rows, both, and
    rows beyond ``num_drafts`` (which are not read: valid)."""
    yield "nan target", dict(q=(1, 2, 7, np.nan))
    yield "negative draft", dict(p=(2, 0, 4, -0.25))
    yield "sum 1.001 target", dict(q_scale=(0, 1, 1.001))
    yield "sum 1.00015 draft", dict(p_scale=(3, 2, 1.00015))
    yield "two bad, the first named", dict(q=(3, 0, 1, np.inf), q_scale=(1, 3, 2.0))
    yield "bad draft and target rows", dict(q=(3, 1, 2, -1.0), p=(0, 0, 0, np.nan))
    yield "beyond num_drafts (valid)", dict(q=(0, 3, 1, np.nan), p=(0, 2, 0, -1.0))


@pytest.mark.parametrize("name, changes", list(bad_requests()))
@pytest.mark.parametrize("function", ["verify_drafts", "verify_tree", "compare_outputs"])
def test_screened_and_exact_checks_raise_the_same_error(monkeypatch, name, changes, function):
    p, q = rows(4, (B, K)), rows(5, (B, K + 1))
    x = np.tile(np.arange(K, dtype=np.int32), (B, 1))
    counts = np.array([2, 3, 3, 3], np.int32)
    for key in ("p", "q"):
        if key in changes:
            b, j, v, value = changes[key]
            (p if key == "p" else q)[b, j, v] = value
        if key + "_scale" in changes:
            b, j, factor = changes[key + "_scale"]
            (p if key == "p" else q)[b, j] *= factor

    def call():
        if function == "verify_drafts":
            return specjax.verify_drafts(jax.random.key(0), SD, x, p, q, num_drafts=counts)
        if function == "verify_tree":  # a chain of K drafts as a tree of K + 1 nodes
            tree = specjax.TokenTree((1,) * K)
            tokens = np.concatenate([np.zeros((B, 1), np.int32), x], axis=1)
            draft = np.concatenate([p, q[:, -1:]], axis=1)  # node i's children from p_i
            return specjax.verify_tree(jax.random.key(0), tree, tokens, draft, q,
                                       num_nodes=counts + 1)
        return specjax.compare_outputs(SD, x, p, q, np.zeros((1, B, K + 1), np.int32) - 1,
                                       num_drafts=counts)

    def outcome():
        try:
            call()
        except ValueError as error:
            return str(error)
        return None

    exact = outcome()
    monkeypatch.setattr(_checks, "FUSED_CHECK_ENTRIES", 0)
    for fraction in (0.0, 1.0):  # the read rows screened in whole arrays, or gathered
        monkeypatch.setattr(_checks, "_GATHER_FRACTION", fraction)
        assert outcome() == exact
    if name.endswith("(valid)"):
        assert exact is None
    else:
        assert exact is not None and "_probs[" in exact, exact


def test_float64_and_bfloat16_rows_are_screened_in_their_precision(monkeypatch, x64):
    """float64 rows (tolerance 1e-9) that miss one by 2e-9 are refused, by 1e-10 accepted;
    bfloat16 rows are screened in float32 with bfloat16's tolerance."""
    monkeypatch.setattr(_checks, "FUSED_CHECK_ENTRIES", 0)
    x = rows(6, (B, K + 1), np.float64)
    x /= x.sum(-1, keepdims=True)
    off = x.copy()
    off[1, 2] *= 1 + 2e-9
    near = x.copy()
    near[1, 2] *= 1 + 1e-10
    assert screen(off, 1e-9)[1, 2]
    assert not screen(near, 1e-9).any()
    low = jnp.asarray(x, jnp.bfloat16)
    tol = _checks.row_sum_tolerance(jnp.bfloat16)
    np.testing.assert_array_equal(screen(low, tol),
                                  exact_bad(np.asarray(low, np.float32), tol))


def test_chunks_divide_the_rows_when_they_can():
    """``_chunk``: a short row whole, else the largest divisor from 64 to 128 terms, else 128
    with a tail."""
    assert [_checks._chunk(n) for n in (1, 100, 128, 300, 1_000, 32_000, 301, 50_257)] \
        == [1, 100, 128, 100, 125, 128, 128, 128]


@pytest.mark.parametrize("blocked", [False, True])
def test_the_screen_reads_the_rows_in_place(monkeypatch, blocked):
    """The compiled screen of rows whose chunks divide them makes no array as large as its
    inputs (the inputs, free ``bitcast`` views and a loop's handles on them aside): its
    reductions read the whole rows where they lie, or (by blocks, as on a CPU) blocks of 3
    rows gathered once, never a copy of the arrays."""
    monkeypatch.setattr(_checks, "_BLOCK_BYTES", 3 * V * 4)
    arrays = (jnp.zeros((B, K + 1, V)), jnp.zeros((B, K, V)))
    picks = [np.arange(B * (K + 1)), np.arange(0, B * K, 2)]
    text = _checks._screen.lower(
        arrays, *_checks._selections(arrays, picks, [blocked] * 2)).compile().as_text()
    large = []
    for line in text.splitlines():
        shape = line.partition("=")[2].split(" ")[1] if " = " in line else ""
        if "[" in shape and "]" in shape:
            dims = shape[shape.index("[") + 1:shape.index("]")].split(",")
            if np.prod([int(n) for n in dims if n]) >= B * K * V:
                large.append(line.partition("=")[2].split(" ")[2].split("(")[0] + " " + shape)
    assert sum(item.startswith("parameter ") for item in large) >= 2, large
    assert all(item.split()[0] in ("parameter", "bitcast", "get-tuple-element")
               for item in large), large
    assert ("while" in text) == blocked


@pytest.mark.parametrize("length", [V, V + 1])
def test_blocks_and_whole_rows_give_the_same_screen(monkeypatch, length):
    """By blocks of 3 rows (16 rows: 5 blocks and a last row; 7 rows picked: 3 blocks, the
    last one short) or whole: the same partial sums, the same minima on rows without NaN (a
    CPU's minimum may skip a NaN: the row's sum flags it); the same flags, exactly the rows
    the exact check refuses among those picked, gathered by blocks of 3 rows or of all of
    them, or whole."""
    x = rows(7, (B, K + 1), length=length)
    x[1, 2, 3], x[2, 0, 0], x[3, 3, 9], x[0, 1, 4] = np.nan, -0.5, np.inf, -1.0
    picked = np.zeros((B, K + 1), bool)
    picked[[0, 1, 1, 2, 2, 3, 3], [0, 1, 2, 0, 3, 2, 3]] = True  # (0, 1) left out
    monkeypatch.setattr(_checks, "_BLOCK_BYTES", 3 * length * 4)
    numbers = ~np.isnan(x).any(-1).reshape(-1)
    for pick in (np.arange(B * (K + 1)), np.flatnonzero(picked)):
        (blocks_min, blocks_sums), = _checks._stats((jnp.asarray(x),), [pick], [True])
        (whole_min, whole_sums), = _checks._stats((jnp.asarray(x),), [pick], [False])
        np.testing.assert_allclose(blocks_sums, whole_sums, rtol=1e-6)
        np.testing.assert_array_equal(blocks_min[numbers[pick]], whole_min[numbers[pick]])
    for block_bytes, fraction in ((3 * length * 4, 1.0), (1 << 30, 1.0), (1 << 30, 0.0)):
        monkeypatch.setattr(_checks, "_BLOCK_BYTES", block_bytes)
        monkeypatch.setattr(_checks, "_GATHER_FRACTION", fraction)
        np.testing.assert_array_equal(_checks.suspect_rows([x], [1e-4], [picked])[0],
                                      exact_bad(x, 1e-4) & picked)


def test_a_new_selection_compiles_nothing(monkeypatch):
    """Selections of 0 to 16 rows (gathered by blocks of 3) run one compiled screen, and flag
    exactly the selected bad rows."""
    monkeypatch.setattr(_checks, "_BLOCK_BYTES", 3 * V * 4)
    monkeypatch.setattr(_checks, "_GATHER_FRACTION", 1.0)
    x = rows(8, (B, K + 1))
    x[1, 1, 0] = -1.0
    order = np.random.default_rng(9).permutation(B * (K + 1))
    _checks.suspect_rows([x], [1e-4], [np.ones((B, K + 1), bool)])
    compiled = _checks._screen._cache_size()
    for count in range(B * (K + 1) + 1):
        picked = np.zeros(B * (K + 1), bool)
        picked[order[:count]] = True
        picked = picked.reshape(B, K + 1)
        flags = _checks.suspect_rows([x], [1e-4], [picked])[0]
        np.testing.assert_array_equal(flags, exact_bad(x, 1e-4) & picked)
    assert _checks._screen._cache_size() == compiled
