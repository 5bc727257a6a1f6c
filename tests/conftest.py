"""Strict JAX numerics for the whole suite (equinox-style): no silent rank promotion."""

import gc

import jax
import numpy as np
import pytest

jax.config.update("jax_numpy_rank_promotion", "raise")


def pytest_configure(config):
    """A persistent compilation cache for the suite: the programs of one module are compiled
    again by the next ones (every module frees its compiled programs, see below), and XLA:CPU
    then loads them from disk instead (measured 6x faster than compiling). The cache lives in
    pytest's cache folder (``.pytest_cache``), so a second local run reuses it; JAX keys entries
    by the program, the JAX version and the backend. The xdist workers share it, and JAX does not
    write an entry atomically: a worker can read one that another is still writing (or that a
    killed run left half-written). JAX then warns and compiles the program itself, so
    ``pyproject.toml`` ignores that warning (the suite's other warnings are errors)."""
    cache = getattr(config, "cache", None)
    folder = cache.mkdir("jax-compilation-cache") if cache is not None else None
    if folder is not None:
        jax.config.update("jax_compilation_cache_dir", str(folder))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Frees every compiled program after each test module.

    Each XLA:CPU executable holds memory mappings of its own, and the suite compiles thousands of
    programs: in one process they exceed the kernel's ``vm.max_map_count`` (65,530 by default)
    and compilation then crashes (abort or segfault). Clearing JAX's caches between modules
    releases them.
    """
    yield
    jax.clear_caches()
    gc.collect()


@pytest.fixture
def x64():
    """Runs a test with ``jax_enable_x64`` on, restoring the previous setting afterwards."""
    with jax.enable_x64(True):
        yield


def random_rows(rng: np.random.Generator, shape, zero_fraction=0.0, concentration=1.0):
    """Dirichlet rows of shape ``shape + (V,)`` with about ``zero_fraction`` exact zeros per row
    (at least one entry kept positive)."""
    *lead, v = shape
    rows = rng.dirichlet(np.full(v, concentration), size=tuple(lead))
    if zero_fraction > 0:
        mask = rng.random(rows.shape) < zero_fraction
        keep = rng.integers(0, v, size=tuple(lead))
        np.put_along_axis(mask, keep[..., None], False, axis=-1)
        rows = np.where(mask, 0.0, rows)
        rows = rows / rows.sum(-1, keepdims=True)
    return rows


def random_pair(seed: int, num_states: int, horizon: int, zero_fraction=0.0):
    """A random (draft, target) pair of NumPy float64 ``(init, trans)`` tuples.

    With ``zero_fraction > 0`` the rows have zeros in different places, and position 1 also gets
    one row with disjoint supports and one row with ``p = q``, the edge cases of SD.
    """
    rng = np.random.default_rng(seed)
    init = rng.dirichlet(np.ones(num_states))
    p = random_rows(rng, (horizon, num_states, num_states), zero_fraction)
    q = random_rows(rng, (horizon, num_states, num_states), zero_fraction)
    if zero_fraction > 0 and num_states >= 2:
        half = num_states // 2
        q[0, 0] = 0.0
        q[0, 0, :half] = 1.0 / half
        p[0, 0] = 0.0
        p[0, 0, half:] = 1.0 / (num_states - half)
        if num_states >= 2:
            p[0, 1] = q[0, 1]
    return (init, p), (init, q)


def chain(pair):
    """A ``specjax.MarkovChain`` from a NumPy ``(init, trans)`` pair (dtype kept)."""
    import jax.numpy as jnp
    import specjax
    init, trans = pair
    return specjax.MarkovChain(jnp.asarray(init), jnp.asarray(trans))


def edge_pair(num_states=4, horizon=4):
    """Rows covering every edge case: p = q, disjoint supports, one-hot rows, zeros, a residual
    that runs out of mass within two drafts, and p = 0 where q > 0."""
    rng = np.random.default_rng(0)
    p = random_rows(rng, (horizon, num_states, num_states), zero_fraction=0.3)
    q = random_rows(rng, (horizon, num_states, num_states), zero_fraction=0.3)
    p[0, 0], q[0, 0] = q[0, 0], q[0, 0]  # p = q
    p[0, 1] = [0.5, 0.5, 0, 0]
    q[0, 1] = [0, 0, 0.5, 0.5]  # disjoint supports
    p[0, 2] = [1, 0, 0, 0]
    q[0, 2] = [0, 1, 0, 0]  # one-hot, disjoint
    p[0, 3] = [1, 0, 0, 0]
    q[0, 3] = [1, 0, 0, 0]  # one-hot, equal
    p[1, 0] = [0.25, 0.25, 0.25, 0.25]
    q[1, 0] = [0.5, 0.5, 0, 0]  # residual exhausted after the second draft
    p[1, 1] = [0, 0.5, 0.5, 0]
    q[1, 1] = [0.4, 0.2, 0.2, 0.2]  # p = 0 where q > 0
    init = np.array([0.25, 0.25, 0.5, 0.0])
    return (init, p), (init, q)


def lift(rows, horizon):
    """A stationary ``MarkovChain``: the ``(V, V)`` rows at each of ``horizon`` positions, a
    uniform first token."""
    import jax.numpy as jnp
    import specjax

    rows = jnp.asarray(rows)
    num_states = rows.shape[-1]
    return specjax.MarkovChain(jnp.full((num_states,), 1 / num_states, rows.dtype),
                               jnp.broadcast_to(rows, (horizon,) + rows.shape))


def stationary_pair(seed, num_states, horizon=40, concentration=1.0):
    """``(p rows, q rows, draft, target)``: Dirichlet rows (NumPy) and their stationary chains."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(num_states, concentration), size=num_states)
    q = rng.dirichlet(np.full(num_states, concentration), size=num_states)
    return p, q, lift(p, horizon), lift(q, horizon)
