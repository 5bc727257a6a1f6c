"""Strict JAX numerics for the whole suite (equinox-style): no silent rank promotion."""

import atexit
import gc
import itertools
import os
import pathlib
import subprocess
import sys

# Compile for correctness, not speed. The suite is bound by XLA:CPU's compilation of thousands of
# programs (about 7,000 in a fresh run, two thirds of the workers' CPU time at XLA's level 1), and
# of that almost all is LLVM's optimisation and code generation of the kernels (XLA's own HLO
# passes take about a tenth). At optimisation level 0 LLVM does neither much, with the older
# emitters (the new fusion emitters took twice the CPU at level 0 on test_block + test_adaptive:
# 66 s against 31 s) and one LLVM module per program (XLA:CPU otherwise splits it into up to 32
# parts to generate their code in parallel threads, which find no idle core: the suite keeps every
# core busy with its workers and subprocesses). Measured on the 2-core machine, fresh cache, the
# whole suite: 6 min 2 s and 636 s of user CPU at level 0 against 8 min 45 s and 942 s at level 1
# (same flags otherwise); the programs run slower, which these tests do not notice. The values
# differ from XLA's defaults in the last bit of some float32 transcendental functions: the
# Dirichlet draws of jax.random differ by an ulp in about a quarter of the entries, which every
# test's tolerance absorbs; the one test that needs the bits XLA's defaults draw (the archive of
# test_decoders) reads its models from tests/data/golden_0925acd_instance.npz. (An earlier trial at
# level 0 also failed a float64 finite-difference check; with jax 0.10.2 the whole suite passes at
# level 0.) Set SPECJAX_TEST_XLA_DEFAULTS=1 to run the suite with XLA's defaults, as users run
# specjax. The flags go into the environment before JAX starts its backend, so the xdist workers
# and the subprocesses (docs pages, scripts, notebooks) inherit them. An XLA that no longer knows a
# flag aborts the process at start-up, so they are tried once in a subprocess first and left out if
# that fails.
from compile_flags import FAST_COMPILE  # noqa: E402  (tests/compile_flags.py)


def _use_fast_compile():
    flags = os.environ.get("XLA_FLAGS", "")
    if os.environ.get("SPECJAX_TEST_XLA_DEFAULTS") == "1" or FAST_COMPILE in flags:
        return
    env = dict(os.environ, XLA_FLAGS=f"{flags} {FAST_COMPILE}".strip(), JAX_PLATFORMS="cpu")
    probe = subprocess.run([sys.executable, "-c", "import jax.numpy as jnp; jnp.ones(2).sum()"],
                           env=env, capture_output=True, timeout=300)
    if probe.returncode == 0:
        os.environ["XLA_FLAGS"] = env["XLA_FLAGS"]


_use_fast_compile()
# On a GPU each xdist worker would take 75% of the device's memory at its first array (JAX's
# default), and the second worker's programs then fail with CUDA_ERROR_OUT_OF_MEMORY (126 of 163
# tests on an H200 with 12 workers): the workers allocate as they go instead. No effect on CPU.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402  (after the flags above)
import numpy as np  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")

# Python's cyclic garbage collector, less often: tracing and lowering thousands of programs
# allocate millions of short-lived objects, and at the default thresholds (700, 10, 10) the
# collector ran about 3,400 times and took 8% of the CPU of test_decoders + test_token_tree +
# test_theory_grad in one process (3.6 s of 46 s); at (50,000, 20, 100) it runs 34 times (0.5 s),
# with the same peak memory (3.2 GB). The teardown below still collects in full when it frees the
# compiled programs. run_batch's subprocesses (the docs pages, the notebooks) use them too.
GC_THRESHOLDS = (50_000, 20, 100)
gc.set_threshold(*GC_THRESHOLDS)


def pytest_configure(config):
    """A persistent compilation cache for the suite: a program is compiled again after the
    process freed its compiled programs (see below), in another xdist worker or in a subprocess
    (the docs pages), and XLA:CPU then loads it from disk instead (measured 6x faster than
    compiling). The cache lives in pytest's cache folder (``.pytest_cache``), so a second local
    run reuses it; JAX keys entries by the program, the JAX version and the backend. The xdist
    workers share it, and JAX does not write an entry atomically: a worker can read one that
    another is still writing (or that a killed run left half-written). JAX then warns and
    compiles the program itself, so ``pyproject.toml`` ignores that warning (the suite's other
    warnings are errors)."""
    cache = getattr(config, "cache", None)
    folder = cache.mkdir("jax-compilation-cache") if cache is not None else None
    if folder is not None:
        jax.config.update("jax_compilation_cache_dir", str(folder))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        # The subprocesses (scripts, notebooks, the reproduction) share it too: JAX reads these
        # settings from the environment when it starts. Not across device layouts: JAX's cache
        # key includes the CPU client's topology, so an entry written by a one-device process
        # never serves the 4-device check (measured: 1 hit in 116; test_scale passes it its
        # unsharded runs instead), and probably not the two-process check either (not measured).
        os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(folder))
        os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
        os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


def _file(item):
    """The test file's name (``test_x.py``) of a collected item."""
    return item.nodeid.split("::")[0].rsplit("/", 1)[-1]


# Scheduling over the xdist workers (``-n``, with xdist's default ``--dist load``): each test
# module runs on one worker, so that its module fixtures and the programs its tests share are
# built once, not once per worker; the modules that take longest start first, and the many short,
# independent tests of SPREAD (each a unit of its own) go last, to whichever worker is free: they
# even out the end of the run. The scripts are units of their own too (each runs alone, most in
# a subprocess), and so is each of test_docs' page runs and test_notebooks' groups (SHARED_RUNS:
# the tests whose id starts with the same "runN:" or "groupN:", one subprocess each), started in
# their module's place.
# LONGEST_FIRST: the modules (or their units) that took longest in a run of the slow tests in
# one process (docs 824 s in all, notebooks 280 s, the benchmark and study scripts 50-100 s each),
# then the largest in-process modules.
LONGEST_FIRST = ["test_docs.py", "test_notebooks.py", "test_scale.py", "test_reproduce.py",
                 "test_scripts.py", "test_benchmark_adaptive.py", "test_benchmark_token_tree.py",
                 "test_optimal_scripts.py", "test_adaptive_study.py", "test_lossy_study.py",
                 "test_packaging.py", "test_flax_pair.py", "test_bench.py",
                 "test_distributed.py", "test_decoders.py", "test_token_tree.py", "test_models.py"]
SPREAD = ("tests/test_reliability.py::",)
UNITS = SPREAD + ("tests/test_scripts.py::",)
SHARED_RUNS = ("tests/test_docs.py::test_page_code_runs[",
               "tests/test_notebooks.py::test_notebooks_run_at_toy_sizes[")


def _scope(nodeid):
    """The unit of work a test belongs to: its module, but for UNITS and SHARED_RUNS."""
    if nodeid.startswith(UNITS):
        return nodeid
    for prefix in SHARED_RUNS:
        if nodeid.startswith(prefix):
            return nodeid[:nodeid.index(":", len(prefix))]  # "...test_page_code_runs[run0"
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config, items):
    first = {name: rank for rank, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: (item.nodeid.startswith(SPREAD),
                                 first.get(_file(item), len(first))))


@pytest.hookimpl(optionalhook=True)  # an xdist hook
def pytest_xdist_make_scheduler(config, log):
    """xdist's ``loadscope`` scheduling with a module as the scope (but for ``UNITS`` and
    ``SHARED_RUNS``), in the order of the collection (sorted above). Other ``--dist`` modes are
    xdist's own."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return _scope(nodeid)

    config.option.loadscopereorder = False  # the order above, not the largest scope first
    return ModuleScheduling(config, log)


def _mapped_regions():
    """The number of memory mappings of this process (``None`` where ``/proc`` is missing)."""
    try:
        with open("/proc/self/maps", "rb") as maps:
            return maps.read().count(b"\n")
    except OSError:
        return None


def _map_budget():
    """Half the kernel's limit on a process's memory mappings (``vm.max_map_count``)."""
    try:
        with open("/proc/sys/vm/max_map_count") as limit:
            return int(limit.read()) // 2
    except (OSError, ValueError):
        return 65530 // 2


MAP_BUDGET = _map_budget()

# Reading /proc/self/maps costs about 1 ms per thousand mappings (15 ms at 15,000, mostly system
# time), and a worker holds 10,000-30,000: read after every test, it took about 6% of a warm run
# (-m "not slow": 176 s -> 166 s, system time 49 s -> 33 s). So the count is read only when it
# could have reached the budget: the programs compiled or loaded since the last reading (counted
# from JAX's compile events) each add at most MAPS_PER_PROGRAM mappings (measured: about 1.5 for a
# one-operation program, 44 for the sampler's and exact's programs of Speculative(K)), and at least
# every READ_EVERY tests for the mappings that are not programs'.
MAPS_PER_PROGRAM = 64
READ_EVERY = 50
# Every program this process compiled or loaded from the cache; the mappings at the last
# reading, the program count then, and the tests since.
_PROGRAMS = {"total": 0}
_MAPS = {"known": _mapped_regions(), "programs": 0, "tests": 0}


def _count_program(event, duration, **kwargs):
    if event == "/jax/core/compile/backend_compile_duration":  # a compilation or a cache load
        _PROGRAMS["total"] += 1


def programs_compiled(run) -> int:
    """How many programs ``run()`` compiled or loaded from the compilation cache (JAX's compile
    events; a program already in the process's in-memory caches counts none)."""
    before = _PROGRAMS["total"]
    run()
    return _PROGRAMS["total"] - before


jax.monitoring.register_event_duration_secs_listener(_count_program)


@pytest.hookimpl(trylast=True)  # after the test's fixtures (and its module's, if the last) end
def pytest_runtest_teardown(item, nextitem):
    """Frees every compiled program once the process holds many of them.

    Each XLA:CPU executable holds memory mappings of its own (one per compiled kernel, a few to
    tens per program), and the suite compiles thousands of programs: in one process they exceed
    the kernel's ``vm.max_map_count`` (65,530 by default) and compilation then crashes (abort or
    segfault); one module alone (``test_decoders.py``) maps 26,000 in 54 of its tests. Clearing
    JAX's caches releases them. It is done after a test that leaves more than half the limit
    mapped (a worker then holds about 2 GB), not after every module, so that the next tests and
    modules of the same process reuse the programs they share with earlier ones (the sampler
    cases, the same models and shapes) instead of compiling them again. Where ``/proc`` is
    missing, it is done after every module.
    """
    _MAPS["tests"] += 1
    known = _MAPS["known"]
    if (known is not None and _MAPS["tests"] < READ_EVERY
            and known + MAPS_PER_PROGRAM * (_PROGRAMS["total"] - _MAPS["programs"])
            <= MAP_BUDGET):
        return  # cannot have reached the budget since the last reading
    regions = _mapped_regions()
    _MAPS.update(known=regions, programs=_PROGRAMS["total"], tests=0)
    last_of_module = nextitem is None or _file(nextitem) != _file(item)
    if (regions is None and last_of_module) or (regions is not None and regions > MAP_BUDGET):
        jax.clear_caches()
        gc.collect()
        _MAPS["known"] = _mapped_regions()


def _coverage_running() -> bool:
    coverage = sys.modules.get("coverage")
    return coverage is not None and coverage.Coverage.current() is not None


def _exit_at_once():
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    """An xdist worker leaves without Python's teardown once its session is over.

    A worker ends holding thousands of compiled programs and gigabytes of arrays, and freeing them
    one by one at exit (JAX's own exit handler, then Python's) took about 8 s of a warm
    ``-m "not slow"`` run on the 2-core machine: the run ended 8.3-9.6 s after its last test, and
    1.2-1.3 s after it when the workers leave at once (two runs each). By then a worker has sent
    its results to the controller, which decides the exit status; the operating system frees what
    the worker held. The last exit handler registered runs first, so this one skips the others
    (pytest's temporary folders belong to the controller, not to the workers). Not under
    coverage, which may write its data from an exit handler, and not in a single process
    (``-n 0``), whose exit status is the run's.
    """
    if os.environ.get("PYTEST_XDIST_WORKER") and not _coverage_running():
        atexit.register(_exit_at_once)


def full_suite_only(*values, id=None):
    """A case of ``pytest.mark.parametrize`` that runs in the full suite only (marked ``slow``):
    the larger enumeration, the second dtype or the second children rule of a test whose other
    cases already run in the inner loop (``-m "not slow"``), so that the inner loop runs every
    test function at least once within its time (test_coverage checks that each list keeps a
    case without it)."""
    return pytest.param(*values, marks=pytest.mark.slow, id=id)


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


@jax.jit  # one program (op by op, about ten)
def theorem1_terms(draft, target):
    """``(T,)``: ``E_{x_{n-1} ~ q}[TV(p_n, q_n)]`` at every position, with specjax's
    ``marginals`` and ``tv_distance`` (Theorem 1 sums them; for ``K = T`` one minus them is
    the acceptance rate)."""
    import jax.numpy as jnp
    import specjax

    tv = specjax.tv_distance(draft.trans, target.trans)  # (T, V)
    return jnp.einsum("nv,nv->n", specjax.marginals(target)[:-1], tv)


# The runners' last lines: with their results written, they leave as the xdist workers do (see
# pytest_sessionfinish).
EXIT_AT_ONCE = "\nimport os\nsys.stdout.flush()\nsys.stderr.flush()\nos._exit(0)\n"


def run_batch(what: str, runner: str, payload, names, tmp, *, cwd, env) -> dict:
    """Runs ``runner`` (the source of a script ``runner.py payload.json results.json`` that
    writes ``{name: None or the failure}``) in one subprocess on the JSON ``payload``, in the
    folder ``cwd`` with the environment ``env``; its results, or, when the subprocess crashed,
    the crash (``what``: "the documentation runner") as every one of ``names``' failure. The
    docs pages and the notebooks run this way (several in one process, sharing their compiled
    programs), with the suite's ``GC_THRESHOLDS``."""
    import json

    (tmp / "payload.json").write_text(json.dumps(payload))
    (tmp / "runner.py").write_text(f"import gc\ngc.set_threshold(*{GC_THRESHOLDS!r})\n{runner}"
                                   f"{EXIT_AT_ONCE}")
    out = subprocess.run([sys.executable, str(tmp / "runner.py"), str(tmp / "payload.json"),
                          str(tmp / "results.json")], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=900)
    if out.returncode != 0 or not (tmp / "results.json").exists():  # every one fails with it
        return dict.fromkeys(names, f"{what} crashed:\n{out.stderr[-4000:]}")
    return json.loads((tmp / "results.json").read_text())


# The suite's stored data (golden outputs and their inputs; tests/data/README.md).
DATA = pathlib.Path(__file__).parent / "data"


def read_archive(path) -> dict:
    """The arrays of an ``.npz`` file as a dict, the file closed on return (an ``NpzFile`` left
    open raises a ``ResourceWarning``, an error in this suite, in whichever test is running when
    the collector frees it)."""
    with np.load(path) as arrays:
        return dict(arrays)


def uniform_chain(num_states: int, horizon: int):
    """A float32 ``MarkovChain`` of uniform rows, built from NumPy: for checks that read only the
    models' sizes or kinds (no compiled program, where ``random_markov_chain`` compiles its
    Dirichlet draw for every new shape)."""
    import specjax

    rows = np.full((horizon, num_states, num_states), 1 / num_states, np.float32)
    return specjax.MarkovChain(np.full(num_states, 1 / num_states, np.float32), rows)


def float64(*models):
    """The models (``MarkovChain``s or any pytrees of arrays) with float64 arrays, as a tuple
    (call under ``x64``)."""
    import jax.numpy as jnp

    return jax.tree_util.tree_map(lambda x: x.astype(jnp.float64), models)


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
    import specjax
    init, trans = pair
    return specjax.MarkovChain(init, trans)  # NumPy arrays go to the device as they are


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

    xp = jnp if isinstance(rows, jax.Array) else np  # built on the host: no program compiled
    rows = xp.asarray(rows)
    num_states = rows.shape[-1]
    return specjax.MarkovChain(xp.full((num_states,), 1 / num_states, rows.dtype),
                               xp.broadcast_to(rows, (horizon,) + rows.shape))


def stationary_pair(seed, num_states, horizon=40, concentration=1.0):
    """``(p rows, q rows, draft, target)``: Dirichlet rows (NumPy) and their stationary chains."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(num_states, concentration), size=num_states)
    q = rng.dirichlet(np.full(num_states, concentration), size=num_states)
    return p, q, lift(p, horizon), lift(q, horizon)


def every_sequence(init, p, q):
    """``(seqs, weights, p_rows, q_rows)``: every sequence ``x_0..x_T`` of a draft/target pair of
    Markov chains (``init (V,)``, rows ``p``, ``q`` ``(T, V, V)``, NumPy), its target
    probability, and both chains' rows along it ``(V**(T+1), T, V)``: a recording whose weighted
    estimates are exact."""
    horizon, num_states = p.shape[0], p.shape[-1]
    seqs = np.array(list(itertools.product(range(num_states), repeat=horizon + 1)))
    weights = np.asarray(init)[seqs[:, 0]].astype(np.float64)
    p_rows = np.zeros((len(seqs), horizon, num_states))
    q_rows = np.zeros((len(seqs), horizon, num_states))
    for n in range(horizon):
        weights *= q[n, seqs[:, n], seqs[:, n + 1]]
        p_rows[:, n], q_rows[:, n] = p[n, seqs[:, n]], q[n, seqs[:, n]]
    return seqs, weights, p_rows, q_rows


def every_ragged_sequence(init, p, q, stop: int, *, skip_zero: bool = False):
    """``(seqs, lengths, weights, p_rows, q_rows)``: every sequence of a Markov pair (``init``
    ``(V,)``, rows ``p``, ``q`` ``(T, V, V)``, NumPy) up to its first ``stop`` token, with its
    target probability; tokens padded with -1, rows along it padded with NaN (never read).
    ``skip_zero``: leave out the sequences of target probability 0."""
    horizon, num_states = p.shape[0], p.shape[-1]
    seqs, lengths, weights = [], [], []

    def walk(prefix, weight):
        n = len(prefix) - 1
        if n == horizon or (n > 0 and prefix[-1] == stop):
            seqs.append(prefix + [-1] * (horizon - n))
            lengths.append(n)
            weights.append(weight)
            return
        for x in range(num_states):
            if not skip_zero or q[n, prefix[-1], x] > 0:
                walk(prefix + [x], weight * q[n, prefix[-1], x])

    for x0 in range(num_states):
        walk([x0], init[x0])
    seqs, lengths, weights = np.array(seqs), np.array(lengths), np.array(weights)
    p_rows = np.full((len(seqs), horizon, num_states), np.nan)
    q_rows = np.full((len(seqs), horizon, num_states), np.nan)
    for b, seq in enumerate(seqs):
        for t in range(lengths[b]):
            p_rows[b, t], q_rows[b, t] = p[t, seq[t]], q[t, seq[t]]
    return seqs, lengths, weights, p_rows, q_rows
