"""Memory: size estimates and refusals before any work (``specjax._memory``), the Markov engine's
tables built per position with the same tokens, and ``random_markov_chain`` drawn in blocks with
the same numbers."""

import json
import math
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from conftest import DATA
from conftest import read_archive
from conftest import uniform_chain
from sampler_cases import CASES
from sampler_cases import instance
from specjax import _memory
from specjax.models import markov
from specjax.sampling import counts
from specjax.sampling import decoding
from specjax.sampling import engine
from specjax.sampling import tables
from specjax.theory import recursion

KEY = jax.random.key(0)


@pytest.fixture
def available(monkeypatch):
    """``available(n)`` makes ``specjax._memory.available_bytes`` report ``n`` bytes."""
    def patch(nbytes):
        monkeypatch.setattr(_memory, "available_bytes", lambda *args, **kwargs: nbytes)
    return patch


# ----------------------------------------------------------------------------- specjax._memory
def test_available_bytes_on_this_machine_and_on_accelerators():
    host = _memory.available_bytes()
    assert host is None or host > 0

    class Device:
        platform = "gpu"

        def __init__(self, stats):
            self.stats = stats

        def memory_stats(self):
            if isinstance(self.stats, Exception):
                raise self.stats
            return self.stats

    assert _memory.available_bytes(Device({"bytes_limit": 80e9, "bytes_in_use": 30e9})) == 50e9
    assert _memory.available_bytes(Device({"bytes_limit": 10, "bytes_in_use": 30})) == 0
    assert _memory.available_bytes(Device(None)) is None
    assert _memory.available_bytes(Device(RuntimeError("no statistics"))) is None


def test_check_fits_message_names_argument_size_availability_and_remedy(available):
    available(21 * 10**9)
    _memory.check_fits(20 * 10**9, argument="num_chains = 10", remedy="r")  # fits
    with pytest.raises(ValueError) as error:
        _memory.check_fits(612 * 10**9, argument="num_chains = 3,000,000,000",
                           what="tokens and flags of every chain",
                           remedy="use specjax.decoding_statistics (counts only, chunked) or "
                                  "fewer chains")
    assert str(error.value) == (
        "num_chains = 3,000,000,000 needs about 612 GB (tokens and flags of every chain), more "
        "than the 21 GB this machine has available; use specjax.decoding_statistics (counts "
        "only, chunked) or fewer chains")
    available(None)  # unknown: nothing is refused on a guess
    _memory.check_fits(10**15, argument="x", remedy="y")
    assert [_memory.format_bytes(n) for n in (3, 48e6, 1.34e9, 612e9, 2.2e12)] == \
        ["3 B", "48 MB", "1.3 GB", "612 GB", "2.2 TB"]


# ----------------------------------------------------------------------------- refusals
def test_decode_refuses_a_trace_that_cannot_fit_and_points_to_decoding_statistics():
    draft, target = specjax.paper_instance()
    with pytest.raises(ValueError, match=r"num_chains = 3,000,000,000 needs about .* TB "
                                         r"\(tokens and flags of every chain.*"
                                         r"specjax\.decoding_statistics"):
        specjax.decode(KEY, specjax.Speculative(), draft, target, 3_000_000_000)
    with pytest.raises(ValueError, match="num_chains = 1,000,000,000 .*decoding_statistics"):
        specjax.speculative_decoding(KEY, draft, target, 10**9)


def test_decode_refusals_name_chains_or_states_whichever_is_larger(available):
    draft, target = instance()
    available(10**5)
    with pytest.raises(ValueError, match=r"num_chains = 10,000 needs about .*more than the "
                                         r"100 kB this machine has available; use "
                                         r"specjax.decoding_statistics"):
        specjax.decode(KEY, specjax.Speculative(), draft, target, 10_000)
    big = specjax.MarkovChain(jnp.full((300,), 1 / 300), jnp.full((2, 300, 300), 1 / 300))
    available(10**6)
    with pytest.raises(ValueError, match=r"num_states = 300 \(draft and target, T = 2\) needs "
                                         r"about .*law table.*use models with fewer tokens"):
        specjax.decode(KEY, specjax.BatchSpeculative(2), big, big, 8)
    available(10**12)
    # 3,000 chains of instance(): test_scale's SD program (a cache hit across the suite)
    assert specjax.decode(KEY, specjax.Speculative(), draft, target, 3000).tokens.shape == \
        (3000, 13)


def test_other_engines_are_checked_too(available):
    draft, target = instance()
    available(10**5)
    with pytest.raises(ValueError, match="num_chains = 100,000 needs about"):
        specjax.decode(KEY, specjax.BlockVerification(3), draft, target, 100_000)
    lm = specjax.NGramModel.fit([np.arange(5), np.arange(5)[::-1]], order=2, num_states=5)
    with pytest.raises(ValueError, match="num_chains = 100,000 needs about"):
        specjax.decode(KEY, specjax.Speculative(), lm, lm, 100_000, horizon=12)


@pytest.mark.parametrize("decoder", [specjax.BlockVerification(2), specjax.TokenTree((2,))],
                         ids=repr)
def test_call_level_decoders_with_laws_larger_than_the_chains(available, decoder):
    # V = 300, T = 20, 4 chains: the laws outweigh the chains, and a token-wise law table of
    # all positions would be over PRECOMPUTED_TABLE_BYTES. The memory check used to ask the
    # token-wise table planner about the call-level decoder and crash (AttributeError).
    big = specjax.MarkovChain(jnp.full((300,), 1 / 300), jnp.full((20, 300, 300), 1 / 300))
    assert 20 * 300 * 3 * engine.table_width(300) * 4 > engine.PRECOMPUTED_TABLE_BYTES
    stats = specjax.decoding_statistics(KEY, decoder, big, big, 4)
    assert stats.num_chains == 4 and np.all(stats.num_calls <= 20)
    assert specjax.decode(KEY, decoder, big, big, 4).tokens.shape == (4, 21)
    available(10**5)
    with pytest.raises(ValueError, match=r"num_states = 300 \(draft and target, T = 20\) needs "
                                         r"about .*per-position laws of the calls"):
        specjax.decode(KEY, decoder, big, big, 4)


def test_decoding_statistics_refuses_per_chain_results_or_a_chunk_that_cannot_fit(available):
    draft, target = instance()
    with pytest.raises(ValueError, match=r"num_chains = 3,000,000,000 needs about 48 GB \(the "
                                         r"rejections and calls of every chain.*fewer chains"):
        available(21 * 10**9)
        specjax.decoding_statistics(KEY, specjax.Speculative(), draft, target, 3_000_000_000)
    available(10**6)
    with pytest.raises(ValueError, match=r"chunk_size = 20,000 needs about .*use a smaller "
                                         r"chunk_size"):
        specjax.decoding_statistics(KEY, specjax.Speculative(), draft, target, 40_000,
                                    chunk_size=20_000)
    # chunks of 1,100 of 3,000 chains: test_scale's counting program (a cache hit across the
    # suite)
    stats = specjax.decoding_statistics(KEY, specjax.Speculative(), draft, target, 3_000,
                                        chunk_size=1_100)
    assert stats.num_chains == 3_000


def test_exact_refuses_tables_that_cannot_fit(available):
    draft = target = uniform_chain(11, 13)
    available(10**3)
    with pytest.raises(ValueError, match=r"num_states = 11 \(draft and target, T = 13\) needs "
                                         r"about .*exact recursion"):
        recursion.forward(target.init, draft.trans, target.trans, specjax.Speculative(), 13)
    with pytest.raises(ValueError, match="num_states = 11"):
        specjax.exact(specjax.BatchSpeculative(3, lookahead=2), draft, target)
    assert recursion.forward_bytes(7, 50, 50) < 10**5


def test_random_markov_chain_refuses_what_cannot_fit(available):
    available(2 * 10**9)
    with pytest.raises(ValueError, match=r"num_states = 50,000 and horizon = 3 needs about "
                                         r"\d+ GB \(the \(3, 50,000, 50,000\) float32 transition "
                                         r"table: 30 GB\), more than the 2 GB .*fewer states"):
        specjax.random_markov_chain(KEY, 50_000, 3)
    with pytest.raises(ValueError, match=r"num_states = 4 and horizon = 134,217,728 needs"):
        specjax.random_markov_chain(KEY, 4, 2**27)
    with pytest.raises(ValueError, match=r"below 2\*\*31 rows.*horizon = 1,073,741,824"):
        specjax.random_markov_chain(KEY, 2, 2**30)


# ----------------------------------------------------------------------------- same results
GOLDEN = read_archive(DATA / "golden_0925acd.npz")


@pytest.mark.parametrize("constants", [
    dict(PRECOMPUTED_TABLE_BYTES=0, BLOCK_ELEMENTS=100, GROUP_BELOW=1),  # 2-3 rows: overlapping
    dict(PRECOMPUTED_TABLE_BYTES=0, GROUP_ROWS=40),  # groups of 8 positions: the last overlaps
])
def test_tables_built_inside_the_scan_give_the_same_tokens(monkeypatch, constants):
    """Per-position tables (blocks of rows, groups of positions), one decoder per set of row
    kinds: the tokens of the table of all positions (``tests/data``'s golden tokens)."""
    for name, value in constants.items():
        monkeypatch.setattr(tables, name, value)
    draft, target = instance()
    key = jax.random.key(2024)
    for name in ("autoregressive", "sd K=3", "batch M=2 K=2", "biased eps=0.1 UNO K=4"):
        trace = specjax.decode(key, CASES[name], draft, target, 64)
        for field in ("tokens", "rejected", "new_call"):
            np.testing.assert_array_equal(getattr(trace, field), GOLDEN[f"{name}|{field}"],
                                          err_msg=f"{name} {field}")
    stats = specjax.decoding_statistics(key, specjax.Speculative(3), draft, target, 1000,
                                        chunk_size=300)
    np.testing.assert_array_equal(stats.rejected, GOLDEN["statistics sd K=3|rejections_at"])


def test_tables_by_position_equal_the_whole_table_for_larger_models():
    """Thresholds built per position in blocks of rows (a ``fori_loop``, the last block
    overlapping) equal the table of all positions bit for bit, for a decoder whose laws sum
    rows (batch SD's root)."""
    # Random rows drawn by NumPy (jax.random.dirichlet would compile a sampler for this size).
    rng = np.random.default_rng(4)
    draft, target = (specjax.MarkovChain(np.full((150,), 1 / 150, np.float32),
                                         rng.dirichlet(np.ones(150), (2, 150)).astype(np.float32))
                     for _ in range(2))
    for decoder in (specjax.BatchSpeculative(3),):
        lookahead = decoder.resolve_lookahead(2)
        plan = engine.TablePlan(engine.row_kinds(decoder, lookahead, 2), 64)
        full = np.asarray(jax.jit(engine.decoder_table)(decoder, draft.trans, target.trans))
        for n in range(2):
            part = jax.jit(engine.block_thresholds, static_argnums=4)(
                decoder, draft.trans, target.trans, n, plan)
            np.testing.assert_array_equal(part[0], full[n][:, list(plan.kinds)])


def test_table_plan_and_row_kinds():
    sd, batch = specjax.Speculative(), specjax.BatchSpeculative(2)
    assert engine.row_kinds(sd, 2, 2) == (engine.ROOT,)  # K = T: no bonus, root = in-call law
    assert engine.row_kinds(sd, 1, 2) == (engine.ROOT, engine.BONUS)
    assert engine.row_kinds(batch, 2, 2) == (engine.ROOT, engine.VERIFY)
    assert engine.row_kinds(specjax.Autoregressive(), 0, 2) == (engine.BONUS,)
    assert engine.table_plan(sd, 7, 50, 50) == engine.TablePlan(engine.ALL_KINDS, None)
    assert engine.table_plan(sd, 4096, 2, 2) == engine.TablePlan((engine.ROOT,), 128)
    assert engine.table_plan(sd, 7, 10**5, 10**5) == engine.TablePlan((engine.ROOT,), 7, 1171)
    # one position's table, not the (T, V, 3, W') table: 128 MiB at V = 4096 instead of 768
    plan = engine.table_plan(sd, 4096, 2, 2)
    assert engine.table_bytes(plan, 4096, 2) < 170 * 2**20


def test_random_markov_chain_in_blocks_equals_the_direct_draw(monkeypatch):
    """Drawn in blocks of rows (the last one overlapping), the table equals
    ``jax.random.dirichlet``'s bit for bit, for concentrations above and below 1."""
    monkeypatch.setattr(markov, "DIRECT_DRAW_ENTRIES", 0)
    monkeypatch.setattr(markov, "DRAW_BLOCK_ENTRIES", 48 * 128)
    for concentration in (1.0, 0.3):
        key = jax.random.key(11)
        chain = specjax.random_markov_chain(key, 128, 2, concentration)
        direct = jax.random.dirichlet(key, jnp.full((128,), concentration), shape=(2, 128))
        np.testing.assert_array_equal(chain.trans, direct)


def test_random_markov_chain_is_unchanged_for_the_papers_instance():
    draft, target = specjax.paper_instance()
    key_draft, _ = jax.random.split(jax.random.key(10))
    direct = jax.random.dirichlet(key_draft, jnp.ones((7,)), shape=(50, 7))
    np.testing.assert_array_equal(draft.trans, direct)
    assert math.isclose(float(specjax.exact(specjax.Speculative(), draft, target)
                              .expected_rejections), 22.719, abs_tol=5e-4)


def test_wide_counters_of_the_blocked_draw():
    """Entry ``e = row V + column`` of a table of more than 2**32 entries: the 64-bit counter's
    two words, as ``jax.random.split`` numbers keys."""
    rng = np.random.default_rng(0)
    rows = rng.integers(0, 2**31, 1000, dtype=np.uint64)
    for v in (7, 50_000, 2**31 - 1):
        hi, lo = markov._mul_wide(jnp.asarray(rows, jnp.uint32), v)
        product = rows * np.uint64(v)
        np.testing.assert_array_equal(np.asarray(hi), (product >> np.uint64(32)).astype(np.uint32))
        np.testing.assert_array_equal(np.asarray(lo), (product & np.uint64(2**32 - 1))
                                      .astype(np.uint32))


# ----------------------------------------------------------------------------- honest estimates
@pytest.mark.parametrize("num_states, horizon, num_chains, decoder", [
    (7, 50, 20_000, specjax.Speculative()),  # the table of all positions
    (300, 30, 2_000, specjax.BatchSpeculative(2, lookahead=2)),  # one position's table
])
def test_estimates_are_within_a_factor_of_two_of_xla(num_states, horizon, num_chains, decoder):
    """``run_bytes`` against XLA's compiled memory: at or above it, and within 2x."""
    uniform = jnp.full((horizon, num_states, num_states), 1 / num_states)
    draft = target = specjax.MarkovChain(uniform[0, 0], uniform)
    run = decoding.plan(KEY, decoder, draft, target, num_chains)
    for keep_tokens, fn, args in (
            (True, decoding._simulate_markov, (KEY, run.decoder, draft, target, 0)),
            (False, counts._markov_counts, (KEY, run.decoder, draft, target, np.uint32(0),
                                            np.int32(num_chains)))):
        compiled = fn.lower(*args, num_chains=num_chains, lookahead=run.lookahead,
                            sharding=None, tables=decoding.table_plan(run)).compile()
        memory = compiled.memory_analysis()
        if memory is None:
            pytest.skip("this backend does not report compiled memory")
        xla = memory.temp_size_in_bytes + memory.output_size_in_bytes
        estimate = decoding.run_bytes(run, num_chains, keep_tokens=keep_tokens).total
        assert xla <= estimate <= 2 * xla, (keep_tokens, xla, estimate)


def test_peak_resident_bytes_is_the_childs_own_not_its_parents():
    """A child started by ``subprocess`` from a parent that holds 512 MiB reports its own peak
    (tens of MB); ``ru_maxrss`` there reports the parent's, which failed a memory test in CI
    where the pytest worker had grown to 1.7 GB."""
    held = np.ones(2**26)  # 512 MiB, touched
    script = textwrap.dedent(f"""
        import importlib.util, json, resource
        spec = importlib.util.spec_from_file_location("m", {_memory.__file__!r})
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)  # _memory alone: no jax, a small process
        print(json.dumps([module.peak_resident_bytes(),
                          resource.getrusage(resource.RUSAGE_SELF).ru_maxrss]))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True)
    own, maxrss = json.loads(out.stdout)
    assert held.sum() == 2**26 and _memory.peak_resident_bytes() >= held.nbytes
    assert 0 < own < 128 * 2**20, own
    if sys.platform.startswith("linux"):  # the inheritance this helper avoids
        assert maxrss * 1024 >= held.nbytes


@pytest.mark.slow  # a fresh process: its peak RSS is the sampler's
def test_sampler_peak_memory_stays_near_the_models_and_one_table(tmp_path):
    """``decode`` at V = 2048, T = 2 in a fresh process peaks near JAX + models + one position's
    table (about 0.5 GB), where the table of all positions and its temporaries took 1.3 GB."""
    script = textwrap.dedent("""
        import json, jax, jax.numpy as jnp, specjax
        from specjax._memory import peak_resident_bytes
        v, t = 2048, 2
        logits = jax.random.normal(jax.random.key(1), (2, t, v, v))
        draft = specjax.MarkovChain.from_logits(jnp.zeros(v), logits[0])
        target = specjax.MarkovChain.from_logits(jnp.zeros(v), logits[1])
        del logits
        trace = specjax.decode(jax.random.key(0), specjax.Speculative(), draft, target, 1000)
        jax.block_until_ready(trace.tokens)
        print(json.dumps(peak_resident_bytes()))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    peak = json.loads(out.stdout.strip().splitlines()[-1])
    assert peak < 0.9 * 2**30, peak / 2**30


@pytest.mark.slow  # a script end to end, as tests/test_scripts.py
def test_benchmark_memory_script_measures_one_row_in_process():
    """``scripts/benchmark_memory.py``'s row (here in this process, at a tiny size) and table."""
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent.parent / "scripts"))
    import benchmark_memory

    row = benchmark_memory.measure(64, 2, 100, "batch", models="logits")
    assert row["plan"] == "all" and row["estimate"] >= row["xla"] > 0
    assert row["rss_peak"] >= row["rss_models"] > 0
    assert "batch SD, M = 2" in benchmark_memory.table([row])
