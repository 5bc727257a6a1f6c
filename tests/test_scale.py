"""Scale: chains by counter, sharded == unsharded, chunked == one-shot, bounded memory, and the
per-position acceptance rate (Monte Carlo and exact)."""

import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import reference as ref
import specjax
import stats
from conftest import edge_pair
from conftest import random_pair
from conftest import theorem1_terms
from conftest import uniform_chain
from sampler_cases import CASES
from sampler_cases import EARLY_BONUS
from sampler_cases import MAX_DIFFERING
from sampler_cases import REPRODUCIBLE
from sampler_cases import differing_chains
from sampler_cases import instance
from specjax.sampling import engine as _engine
from specjax.sampling import counts as statistics

HERE = pathlib.Path(__file__).parent


# ----------------------------------------------------------------------------- random numbers
def test_chain_bits_are_jax_partitionable_bits_by_counter():
    # Jitted with the offset traced, as the engines call it: one program per key kind and size
    # (op by op, about 30 small ones).
    chain_bits = jax.jit(_engine.chain_bits, static_argnums=2)
    for key in (jax.random.key(3), jax.random.PRNGKey(5)):
        full = np.asarray(jax.random.bits(key, (1000,), jnp.uint32))
        assert np.array_equal(chain_bits(key, np.uint32(0), 1000), full)
        assert np.array_equal(chain_bits(key, np.uint32(300), 200), full[300:500])
    key = jax.random.key(1)
    top = 2**32 - 10  # the last counters: no overflow into a wrong chain
    assert np.array_equal(np.asarray(chain_bits(key, np.uint32(top), 10))[3:],
                          chain_bits(key, np.uint32(top + 3), 7))


def test_any_key_implementation_works_and_is_deterministic():
    draft, target = instance()
    key = jax.random.key(0, impl="rbg")
    a = specjax.speculative_decoding(key, draft, target, 300)
    b = specjax.speculative_decoding(key, draft, target, 300)
    assert np.array_equal(a.tokens, b.tokens)
    assert np.array_equal(a.num_rejections,
                          specjax.decoding_statistics(key, specjax.Speculative(), draft,
                                                      target, 300, chunk_size=128).num_rejections)


# ----------------------------------------------------------------------------- statistics path
def expected_counts(trace, num_states, lookahead):
    """Counts from a full trace; verified positions re-derived from the call structure (a
    position is the bonus token when it is the ``K + 1``-th of its call)."""
    new_call = np.asarray(trace.new_call)
    depth = np.zeros(new_call.shape, np.int64)
    for n in range(new_call.shape[1]):
        depth[:, n] = np.where(new_call[:, n], 0, depth[:, n - 1] + 1 if n else 0)
    return dict(
        num_rejections=np.asarray(trace.num_rejections),
        num_calls=np.asarray(trace.num_calls),
        rejected=np.asarray(trace.rejected).sum(0),
        verified=(depth != lookahead).sum(0),
        new_call=new_call.sum(0),
        final_token_counts=np.bincount(np.asarray(trace.tokens[:, -1]), minlength=num_states),
    )


@pytest.mark.parametrize("name", list(CASES))
def test_statistics_equal_trace_counts_in_padded_chunks(name):
    """Every case: the counts equal the trace's, chain for chain and position for position (for
    a case outside ``REPRODUCIBLE``: all chains but ``MAX_DIFFERING`` of them, and the counts
    consistent with their own chains).

    Every case runs in chunks with a padded last one (1,100 of 3,000 chains: the path that
    pads, masks and sums chunks); one case also in one shot and in exact chunks, the other
    sizes of the same code (each size is a compilation of its own, about 1.5 s of the suite's
    CPU per case); a case whose bonus positions the chunks count (``EARLY_BONUS``) also in one
    shot, whose verified counts are the reference. The 4-device check (``sharded_check.py``)
    runs every case's ``decode`` sharded, and the statistics of one case per counting path in
    padded chunks on the devices' shards."""
    decoder = CASES[name]
    draft, target = instance()
    key = jax.random.key(11)
    num_chains = 3000
    trace = specjax.decode(key, decoder, draft, target, num_chains)
    if name not in REPRODUCIBLE:
        for chunk_size in (1100,):
            got = specjax.decoding_statistics(key, decoder, draft, target, num_chains,
                                              chunk_size=chunk_size)
            assert differing_chains(got, trace) <= MAX_DIFFERING, chunk_size
            assert got.rejected.sum() == np.asarray(got.num_rejections).sum(dtype=np.int64)
            assert got.new_call.sum() == np.asarray(got.num_calls).sum(dtype=np.int64)
            assert got.num_chains == num_chains
        return
    expected = expected_counts(trace, target.num_states,
                               decoder.resolve_lookahead(target.horizon))
    if name in EARLY_BONUS:  # then the chunks' verified counts are compared with one shot's
        del expected["verified"]
    if name == "sd K=3":
        sizes = (None, 1000, 1100)  # one shot, exact chunks, a padded last chunk
    else:
        sizes = (None, 1100) if name in EARLY_BONUS else (1100,)
    for chunk_size in sizes:
        got = specjax.decoding_statistics(key, decoder, draft, target, num_chains,
                                          chunk_size=chunk_size)
        if name in EARLY_BONUS:
            expected.setdefault("verified", np.asarray(got.verified))
        for field, value in expected.items():
            assert np.array_equal(np.asarray(getattr(got, field)), value), (chunk_size, field)
        assert got.num_rejections.dtype == jnp.int32
        assert got.rejected.dtype == np.int64
        assert got.num_chains == num_chains


# The tests below run 3,000 chains of the module's instance in chunks of 1,100 (or one chunk
# of 1,100) as test_statistics_equal_trace_counts_in_padded_chunks[sd] (and [autoregressive],
# [batch M=2 K=2]) does, so that their programs are that test's, not compilations of their own.
def test_statistics_first_chains_of_a_larger_run():
    """The statistics of 1,100 chains (one chunk) are those of the first 1,100 chains of a
    3,000-chain run (here its trace; its chunked statistics equal its trace in the test
    above)."""
    draft, target = instance()
    key = jax.random.key(2)
    small = specjax.decoding_statistics(key, specjax.Speculative(), draft, target, 1100)
    large = specjax.decode(key, specjax.Speculative(), draft, target, 3000)
    assert np.array_equal(small.num_rejections, large.num_rejections[:1100])


def test_statistics_progress_bar(capsys):
    draft, target = instance()
    specjax.decoding_statistics(jax.random.key(0), specjax.Speculative(), draft, target,
                                3000, chunk_size=1100, progress=True)
    err = capsys.readouterr().err
    assert "3/3" in err and "3,000/3,000" in err


def test_statistics_derived_rates():
    counts = statistics.DecodingStatistics(
        num_rejections=jnp.zeros(4, jnp.int32), num_calls=jnp.zeros(4, jnp.int32),
        rejected=np.array([1, 0, 0]), verified=np.array([4, 2, 0]),
        new_call=np.array([4, 1, 0]), final_token_counts=np.array([3, 1]))
    assert counts.num_chains == 4
    np.testing.assert_allclose(counts.rejection_rate, [0.25, 0, 0])
    np.testing.assert_allclose(counts.acceptance_rate, [0.75, 1, 1])  # 1 where none verified
    np.testing.assert_allclose(counts.acceptance_rate_se, [np.sqrt(0.75 * 0.25 / 4), 0, 0])
    np.testing.assert_allclose(counts.final_token_law, [0.75, 0.25])


def test_statistics_memory_is_bounded_for_a_million_chains_and_t_1000():
    """The compiled statistics-only run of 10^6 chains x T = 1,000 needs tens of MB (its trace
    would need 6 GB of output alone), and its memory does not grow with T."""
    key = jax.random.key(0)
    sizes = {}
    for horizon in (1000, 2000):
        # The paper instance's sizes and dtype (7 states, float32): the compiled memory depends on
        # nothing else (random_markov_chain would compile its Dirichlet draw for each T).
        draft = target = uniform_chain(7, horizon)
        compiled = statistics._markov_counts.lower(
            key, specjax.Speculative(), draft, target, np.uint32(0), np.int32(10**6),
            num_chains=10**6, lookahead=horizon, sharding=None).compile()
        memory = compiled.memory_analysis()
        if memory is None:
            pytest.skip("this backend does not report compiled memory")
        sizes[horizon] = (memory.temp_size_in_bytes + memory.output_size_in_bytes
                          - memory.alias_size_in_bytes)
    assert sizes[1000] < 128 * 2**20, sizes
    # Only the (T, 3) counts grow with T; the per-chain state does not.
    assert sizes[2000] - sizes[1000] < 8 * 2**20, sizes


# ----------------------------------------------------------------------------- validation
def test_statistics_validation():
    draft, target = instance()
    key = jax.random.key(0)
    run = specjax.decoding_statistics
    sd = specjax.Speculative()
    with pytest.raises(ValueError, match="decoder must be a specjax decoder"):
        run(key, lambda *a: None, draft, target, 10)
    with pytest.raises(ValueError, match="samplers first"):
        run(specjax.expected_rejections, key, draft, target, 10)
    with pytest.raises(ValueError, match="chunk_size must be a positive integer"):
        run(key, sd, draft, target, 10, chunk_size=0)
    with pytest.raises(ValueError, match="num_chains must be a positive integer"):
        run(key, sd, draft, target, 0)
    with pytest.raises(ValueError, match="num_drafts"):
        run(key, specjax.BatchSpeculative(0), draft, target, 10)
    with pytest.raises(ValueError, match="at most 2"):
        specjax.speculative_decoding(key, draft, target, 2**32 + 1)
    with pytest.raises(ValueError, match="too large"):
        run(key, sd, draft, target, 2**32 - 1, chunk_size=2**20 - 1)
    with pytest.raises(ValueError, match="too large"):  # 7 uniforms per call and chain
        run(key, specjax.BlockVerification(3), draft, target, 2**32 // 7 - 5, chunk_size=2**20)


def test_statistics_deprecated_sampler_first_form_still_counts_the_same():
    draft, target = instance()
    key = jax.random.key(4)
    new = specjax.decoding_statistics(key, specjax.BatchSpeculative(2, lookahead=2), draft,
                                      target, 3000, chunk_size=1100)
    with pytest.warns(DeprecationWarning, match="decoding_statistics"):
        old = specjax.decoding_statistics(specjax.batch_speculative_decoding, key, draft, target,
                                          3000, num_drafts=2, lookahead=2, chunk_size=1100)
    for field in ("num_rejections", "rejected", "verified", "new_call", "final_token_counts"):
        assert np.array_equal(np.asarray(getattr(new, field)), np.asarray(getattr(old, field)))
    with pytest.warns(DeprecationWarning):
        auto = specjax.decoding_statistics(specjax.autoregressive_decoding, key, target, 3000,
                                           chunk_size=1100)
    assert int(auto.new_call.sum()) == 3000 * target.horizon


def test_sharding_validation_on_one_device():
    draft, target = instance()
    key = jax.random.key(0)
    one = specjax.chain_sharding()
    assert len(one.device_set) == len(jax.devices())
    with pytest.raises(ValueError, match="sharding must be None, a jax.sharding.Mesh"):
        specjax.speculative_decoding(key, draft, target, 8, sharding="chains")
    mesh = Mesh(np.asarray(jax.devices()[:1]).reshape(1, 1), ("a", "b"))
    with pytest.raises(ValueError, match="1-D array of chains"):
        specjax.speculative_decoding(key, draft, target, 8, sharding=NamedSharding(mesh, P("a", "b")))
    with pytest.raises(ValueError, match="devices must name at least one"):
        specjax.chain_sharding([])
    # A one-device mesh is a valid layout and changes nothing (3,000 chains: the unsharded
    # program is test_statistics_equal_trace_counts_in_padded_chunks[sd]'s trace).
    plain = specjax.speculative_decoding(key, draft, target, 3000)
    for layout in (mesh, one, NamedSharding(mesh, P("a"))):
        sharded = specjax.speculative_decoding(key, draft, target, 3000, sharding=layout)
        assert np.array_equal(plain.tokens, sharded.tokens)


def test_sharding_validation_counts_shards():
    from specjax.sampling import sharding as _sharding
    devices = np.asarray([jax.devices()[0]] * 1)
    mesh = Mesh(devices, ("chains",))
    sharding = NamedSharding(mesh, P("chains"))
    assert _sharding.num_shards(sharding) == 1
    assert _sharding.num_shards(NamedSharding(mesh, P())) == 1
    assert _sharding.num_shards(None) == 1


def unsharded_reference(path):
    """Writes what ``sharded_check.py`` compares its sharded runs with: the models, the key's
    seed and every case's unsharded trace of 3,000 chains, whose programs
    test_statistics_equal_trace_counts_in_padded_chunks compiled in this process (in the
    subprocess each would be a compilation of its own: JAX's persistent cache key includes the
    device count)."""
    draft, target = instance()
    seed = 7
    arrays = {"seed": np.int64(seed)}
    for which, chain in (("draft", draft), ("target", target)):
        arrays[f"{which} init"], arrays[f"{which} trans"] = (np.asarray(chain.init),
                                                             np.asarray(chain.trans))
    for name, decoder in CASES.items():
        trace = specjax.decode(jax.random.key(seed), decoder, draft, target, 3000)
        arrays.update({f"{name}|{field}": np.asarray(value)
                       for field, value in zip(trace._fields, trace)})
    np.savez(path, **arrays)


@pytest.mark.slow  # a subprocess with 4 forced devices compiles every decoder on 4 layouts
@pytest.mark.skipif(sys.platform == "win32", reason="XLA host-device flag")
def test_sharded_equals_unsharded_on_four_host_devices(tmp_path):
    """In a subprocess with 4 forced CPU devices (the flag must not leak into this process):
    every case of ``sampler_cases.CASES``, sharded over 4 devices (one case also over 2 devices,
    a 2x2 mesh and one axis of it), returns exactly the unsharded trace (a case outside
    ``REPRODUCIBLE``: the same for all chains but ``MAX_DIFFERING`` of them), and the chunked
    statistics path on the same layouts exactly the trace's counts for one case per counting
    path (token-wise on Markov chains, call-level); n-grams (protocol models), batched scoring
    and stop tokens run sharded as unsharded, their statistics too; and the compiled trace path
    has no cross-device communication."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(HERE), str(HERE.parent)] + env.get("PYTHONPATH", "").split(os.pathsep))
    env["JAX_PLATFORMS"] = "cpu"
    unsharded_reference(tmp_path / "unsharded.npz")
    result = subprocess.run([sys.executable, str(HERE / "sharded_check.py"),
                             str(tmp_path / "unsharded.npz")], env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    # one line per sampler, then n-grams, stop tokens, batched scoring and the collectives check
    lines = [line for line in result.stdout.splitlines() if line.startswith("ok ")]
    assert len(lines) == len(CASES) + 4, result.stdout


# ----------------------------------------------------------------------------- acceptance rate
def enumerated_per_position(law, horizon, lookahead):
    """``P(R_n)`` and ``P(a draft is verified at n)`` from an enumerated literal law: in a call
    starting at ``s`` the positions ``s .. s + K - 1`` verify drafts and ``s + K`` is the bonus."""
    rejected = np.zeros(horizon)
    verified = np.zeros(horizon)
    k = horizon if lookahead is None else lookahead
    for (_, flags, _), prob in law.items():
        start = 0
        for n, flag in enumerate(flags):
            depth = n - start
            rejected[n] += prob * flag
            verified[n] += prob * (depth < k)
            if flag or depth == k:
                start = n + 1
    return rejected, verified


@pytest.mark.parametrize("lookahead", [None, 1, 2])
def test_exact_acceptance_rate_against_enumeration(x64, lookahead):
    draft, target = random_pair(4, 3, 4, zero_fraction=0.3)
    law = ref.enumerate_law(lambda ch: ref.sd_literal(ch, draft, target, lookahead))
    rejected, verified = enumerated_per_position(law, 4, lookahead)
    d, t = (specjax.MarkovChain(jnp.asarray(a), jnp.asarray(b)) for a, b in (draft, target))
    exact = specjax.exact(specjax.Speculative(lookahead), d, t)
    np.testing.assert_allclose(exact.rejection_rate, rejected, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(exact.verified, verified, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(exact.acceptance_rate, 1 - rejected / verified, rtol=1e-9)


def test_exact_acceptance_rate_biased_against_enumeration(x64):
    draft, target = random_pair(5, 3, 4, zero_fraction=0.3)
    eps = 0.1
    law = ref.enumerate_law(lambda ch: ref.general_literal(
        ch, draft, target, lambda p, q: ref.biased_accept(p, q, eps), ref.optimal_residual,
        lookahead=2))
    rejected, verified = enumerated_per_position(law, 4, 2)
    d, t = (specjax.MarkovChain(jnp.asarray(a), jnp.asarray(b)) for a, b in (draft, target))
    exact = specjax.exact(specjax.BiasedSpeculative(eps, lookahead=2), d, t)
    np.testing.assert_allclose(exact.rejection_rate, rejected, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(exact.verified, verified, rtol=1e-9, atol=1e-12)


def test_exact_acceptance_rate_theorem_1_form(x64):
    """For ``K = T``: ``1 - E_{x_{n-1} ~ q}[TV(p_n, q_n)]`` at every position."""
    draft, target = specjax.paper_instance()
    expected = 1 - theorem1_terms(draft, target)
    exact = specjax.exact(specjax.Speculative(), draft, target)
    np.testing.assert_allclose(exact.acceptance_rate, expected, rtol=1e-12)
    np.testing.assert_array_equal(exact.verified, 1)


def test_exact_acceptance_rate_is_finite_where_no_draft_is_verified():
    """``p = q`` with ``K = 2``: every third position is a certain bonus token (verified = 0);
    the rate is 1 there by convention, and gradients are finite everywhere (edge rows too)."""
    _, target = instance()  # T = 12 (a new horizon would compile a Dirichlet draw of its own)
    exact = specjax.exact(specjax.Speculative(2), target, target)
    np.testing.assert_allclose(exact.verified, [1, 1, 0] * 4, atol=1e-6)
    np.testing.assert_array_equal(exact.acceptance_rate, 1)
    draft_pair, target_pair = edge_pair()
    for lookahead in (None, 2):
        def total(logits, lookahead=lookahead):
            d = specjax.MarkovChain.from_logits(jnp.zeros(4), logits)
            t = specjax.MarkovChain(jnp.asarray(target_pair[0], jnp.float32),
                                    jnp.asarray(target_pair[1], jnp.float32))
            return jnp.sum(specjax.exact(specjax.Speculative(lookahead), d, t)
                           .acceptance_rate)
        logits = jnp.log(jnp.asarray(draft_pair[1], jnp.float32))
        # One compiled program per lookahead (the gradient op by op compiled about 25 each).
        value, grad = jax.jit(jax.value_and_grad(total))(logits)
        assert np.isfinite(value) and np.isfinite(grad).all()


# Cases of sampler_cases.CASES, run in chunks of 1,100 chains: their statistics programs are then
# test_statistics_equal_trace_counts_in_padded_chunks's, not compilations of their own (a chain's
# tokens do not depend on the chunk it runs in, so the counts are those of any chunk size). The
# biased case's residual is the target's (Decoding-UNO); the biased rule's per-position exact
# values with the optimal residual are checked against enumeration in
# test_exact_acceptance_rate_biased_against_enumeration.
ACCEPTANCE_CASES = {name: CASES[name] for name in
                    ("sd", "sd K=3", "batch M=2 K=2", "biased eps=0.1 UNO K=4", "block K=3")}


@pytest.mark.slow  # a Monte Carlo run of 100,000 chains or more
@pytest.mark.parametrize("name", list(ACCEPTANCE_CASES))
def test_simulated_acceptance_rate_matches_exact(name):
    """Per position, the simulated acceptance rate given a verified draft is within
    ``stats.Z`` binomial standard errors of the exact one, and the fraction of chains verifying
    a draft within ``stats.Z`` standard errors of ``verified`` (two-sided 6.8e-6 each; 120 such
    comparisons in this test family). Block verification's per-position values come from the
    call-level recursion (``specjax.theory.calls``)."""
    decoder = ACCEPTANCE_CASES[name]
    draft, target = instance()
    num_chains = 100_000
    got = specjax.decoding_statistics(jax.random.key(5), decoder, draft, target, num_chains,
                                      chunk_size=1100)
    exact = specjax.exact(decoder, draft, target)
    rate = np.asarray(exact.acceptance_rate, np.float64)
    se = np.sqrt(rate * (1 - rate) / np.maximum(got.verified, 1))
    z = np.abs(got.acceptance_rate - rate) / np.maximum(se, 1e-12)
    assert (z < stats.Z).all(), (name, z.max(), int(z.argmax()) + 1)
    verified = np.asarray(exact.verified, np.float64)
    se_v = np.sqrt(verified * (1 - verified) / num_chains)
    z_v = np.abs(got.verified / num_chains - verified) / np.maximum(se_v, 1e-12)
    assert (z_v < stats.Z).all(), (name, z_v.max())


def test_default_chunk_size_per_device():
    if jax.devices()[0].platform != "cpu":
        pytest.skip("CPU default")
    assert statistics.default_chunk_size() == statistics.DEFAULT_CHUNK_SIZE
    assert statistics.default_chunk_size(specjax.chain_sharding()) == (
        statistics.DEFAULT_CHUNK_SIZE * len(jax.devices()))
