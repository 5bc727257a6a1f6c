"""Block verification (Sun et al. 2024, Algorithm 2) against a literal transcription; its theory.

* ``block_call_literal`` transcribes one call of the paper's pseudo-code in plain NumPy (forward
  form: ``eta_1..eta_K`` all drawn, ``tau`` the last accepted level), independent of specjax's
  backward pass. Enumerated exactly over every draft block and every acceptance outcome
  (``reference.enumerate_law``) and chained over calls, it gives the exact law of
  ``(tokens, rejected, calls)`` on tiny instances: its token law is the target's (to 1e-10 in
  float64), its mean calls and accepted lengths are ``exact_block_expected_calls`` and
  ``exact_block_accepted_length``;
* the jitted sampler fits that law and the target's (chi-square), and its mean accepted length
  per call fits the exact value (4.5 standard errors);
* token-wise <= block <= joint-coupling bound, with the paper's motivating example exactly.
"""

import functools
from collections import defaultdict

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from test_scripts import import_script
from specjax.theory import block  # the exact block functions' own module
import reference as ref
import stats
from conftest import edge_pair
from conftest import random_pair



def to_chain(pair, dtype=None):
    init, trans = pair
    return specjax.MarkovChain(jnp.asarray(init, dtype), jnp.asarray(trans, dtype))


# ----------------------------------------------------------------------------- literal algorithm
def block_call_literal(chooser, draft, target, n, prev, lookahead):
    """One call of Algorithm 2, as written, starting at position ``n`` after token ``prev``.

    Drafts ``gamma = min(K, T - n + 1)`` tokens, computes ``p_i`` and ``h_i`` (``h_gamma =
    p_gamma``), draws every ``eta_i``, keeps the largest accepted ``i`` as ``tau``, then ``Y``
    from the target (``tau = gamma``, if position ``n + gamma`` exists) or from the block
    residual at ``tau``. Returns ``(emitted tokens, their rejected flags, tau)``.
    """
    _, p_trans = draft
    _, q_trans = target
    horizon = q_trans.shape[0]
    gamma = min(lookahead, horizon - n + 1)
    x = [prev]
    for i in range(1, gamma + 1):  # X_i at position n + i - 1
        x.append(chooser.categorical(p_trans[n + i - 2, x[-1]]))

    def rows(i):  # the rows of position n + i, conditioned on X_i
        return p_trans[n + i - 1, x[i]], q_trans[n + i - 1, x[i]]

    weight = [1.0]
    for i in range(1, gamma + 1):
        p_row, q_row = rows(i - 1)
        weight.append(min(weight[-1] * q_row[x[i]] / p_row[x[i]], 1.0))
    tau = 0
    for i in range(1, gamma + 1):
        if i == gamma:
            h = weight[i]
        else:
            p_row, q_row = rows(i)
            r = np.maximum(weight[i] * q_row - p_row, 0.0).sum()
            h = r / (r + (1.0 - weight[i])) if r + (1.0 - weight[i]) > 0 else 1.0
        if chooser.bernoulli(h):
            tau = i
    emitted = list(x[1:tau + 1])
    flags = [False] * tau
    if tau < gamma:
        p_row, q_row = rows(tau)
        emitted.append(chooser.categorical(ref.positive_part(weight[tau] * q_row - p_row)))
        flags.append(True)
    elif n + gamma <= horizon:  # every draft accepted: the target's bonus token
        emitted.append(chooser.categorical(q_trans[n + gamma - 1, x[gamma]]))
        flags.append(False)
    return tuple(emitted), tuple(flags), tau


def literal_law(draft, target, lookahead):
    """Exact law of ``(tokens, rejected, calls)``: each call enumerated once per ``(n, prev)``."""
    horizon = target[1].shape[0]
    calls = functools.lru_cache(maxsize=None)(lambda n, a: ref.enumerate_law(
        lambda chooser: block_call_literal(chooser, draft, target, n, a, lookahead)))
    return ref.chain_calls(target[0], horizon, calls)


def completed_call_law(draft, target, n, prev, lookahead):
    """One call's emitted tokens, continued from the target up to position ``T``."""
    _, q_trans = target
    horizon = q_trans.shape[0]
    law = defaultdict(float)
    for (emitted, _, _), pr in ref.enumerate_law(
            lambda c: block_call_literal(c, draft, target, n, prev, lookahead)).items():
        partial = {emitted: pr}
        for m in range(n + len(emitted), horizon + 1):
            partial = {seq + (b,): w * q_trans[m - 1, (seq or (prev,))[-1], b]
                       for seq, w in partial.items() for b in range(q_trans.shape[1])}
        for seq, w in partial.items():
            law[seq] += w
    return law


def target_block_law(target, n, prev):
    _, q_trans = target
    law = {(): 1.0}
    for m in range(n, q_trans.shape[0] + 1):
        law = {seq + (b,): w * q_trans[m - 1, (seq or (prev,))[-1], b]
               for seq, w in law.items() for b in range(q_trans.shape[1])}
    return law


INSTANCES = {
    "random": lambda: random_pair(21, 3, 4, zero_fraction=0.3),
    "dense": lambda: random_pair(22, 3, 4),
    "edge": lambda: edge_pair(4, 4),
}
LITERAL_CASES = [("random", 1), ("random", 2), ("random", 3), ("dense", 3), ("edge", 2)]


@functools.lru_cache(maxsize=None)
def cached_literal_law(name, lookahead):
    draft, target = INSTANCES[name]()
    return literal_law(draft, target, lookahead)


@pytest.mark.parametrize("name, lookahead", LITERAL_CASES)
def test_literal_block_verification_is_unbiased(name, lookahead):
    """The whole-sequence law of the literal algorithm is the target's, exactly."""
    draft, target = INSTANCES[name]()
    tokens = ref.marginalise_tokens(cached_literal_law(name, lookahead))
    assert ref.max_difference(tokens, ref.target_sequence_law(target)) < 1e-10


@pytest.mark.parametrize("lookahead", [2, 3])
def test_literal_single_call_is_unbiased(lookahead):
    """One call's emitted tokens (a prefix and Y), continued from q, have the target's law."""
    draft, target = INSTANCES["random"]()
    for n in (1, 2):
        for prev in range(3):
            law = completed_call_law(draft, target, n, prev, lookahead)
            assert ref.max_difference(law, target_block_law(target, n, prev)) < 1e-10


@functools.partial(jax.jit, static_argnames=("lookahead",))
def _block_values(d, t, *, lookahead):
    """``exact_block_expected_calls`` and ``exact_block_accepted_length`` at every position,
    compiled as one program per instance and lookahead (eagerly, each call compiles dozens)."""
    lengths = [block.exact_block_accepted_length(d, t, lookahead=lookahead, position=n)
               for n in range(1, t.horizon + 1)]
    return block.exact_block_expected_calls(d, t, lookahead=lookahead), jnp.stack(lengths)


@functools.lru_cache(maxsize=None)
def exact_block_values(name, lookahead):
    """``(expected calls, accepted length (T, V))`` in float64, shared by the tests below."""
    draft, target = INSTANCES[name]()
    with jax.enable_x64(True):
        calls, lengths = _block_values(to_chain(draft), to_chain(target), lookahead=lookahead)
        return float(calls), np.asarray(lengths)


@pytest.mark.parametrize("name, lookahead", LITERAL_CASES)
def test_exact_values_match_the_literal_algorithm(name, lookahead, x64):
    draft, target = INSTANCES[name]()
    num_states, horizon = target[1].shape[1], target[1].shape[0]
    law = cached_literal_law(name, lookahead)
    _, calls = ref.expected_counts_from_law(law)
    exact_calls, lengths = exact_block_values(name, lookahead)
    assert abs(exact_calls - calls) < 1e-10
    for n in range(1, horizon + 1):
        exact = lengths[n - 1]
        for a in range(num_states):
            call = ref.enumerate_law(
                lambda c: block_call_literal(c, draft, target, n, a, lookahead))
            accepted = sum(pr * tau for (_, _, tau), pr in call.items())
            assert abs(accepted - exact[a]) < 1e-10, (n, a)


# ----------------------------------------------------------------------------- the sampler's law
SAMPLER_CASES = [("random", 2), ("random", 3), ("edge", 2), ("dense", 5)]
NUM_CHAINS = 40_000


@functools.lru_cache(maxsize=None)
def sampled(name, lookahead):
    draft, target = INSTANCES[name]()
    trace = block_decoding(jax.random.key(2024), to_chain(draft), to_chain(target), NUM_CHAINS,
                           lookahead=lookahead)
    return jax.tree_util.tree_map(np.asarray, trace)


@pytest.mark.parametrize("name, lookahead", SAMPLER_CASES)
def test_sampler_output_law_is_target(name, lookahead):
    draft, target = INSTANCES[name]()
    trace = sampled(name, lookahead)
    observed = stats.count_rows(trace.tokens)
    stats.assert_law(observed, ref.target_sequence_law(target), NUM_CHAINS,
                     f"block verification {name}, K = {lookahead}")


@pytest.mark.parametrize("name, lookahead", [("random", 2), ("edge", 2)])
def test_sampler_matches_the_literal_joint_law(name, lookahead):
    """(tokens, rejected, calls) jointly: the sampler's flags mean what the pseudo-code does."""
    trace = sampled(name, lookahead)
    observed = defaultdict(int)
    for tokens, rejected, calls in zip(trace.tokens, trace.rejected, trace.num_calls):
        observed[(tuple(int(v) for v in tokens), tuple(bool(v) for v in rejected),
                  int(calls))] += 1
    stats.assert_law(dict(observed), cached_literal_law(name, lookahead), NUM_CHAINS,
                     f"block verification {name}, K = {lookahead}, joint law")
    assert (trace.num_calls == trace.new_call.sum(-1)).all()
    assert (trace.num_rejections == trace.rejected.sum(-1)).all()
    assert trace.new_call[:, 0].all()
    # After a rejection a new call starts at the next position.
    assert (trace.new_call[:, 1:] | ~trace.rejected[:, :-1]).all()


@pytest.mark.parametrize("name, lookahead", SAMPLER_CASES)
def test_sampler_mean_calls(name, lookahead, x64):
    exact, _ = exact_block_values(name, lookahead)
    stats.assert_mean(sampled(name, lookahead).num_calls, exact, f"calls {name} K={lookahead}")


@functools.partial(jax.jit, static_argnames=("lookahead",))
def _first_call_lengths(d, t, *, lookahead):
    """Block's and token-wise accepted lengths at position 1: one program."""
    return (block.exact_block_accepted_length(d, t, lookahead=lookahead),
            block.exact_tokenwise_accepted_length(d, t, lookahead=lookahead))


def first_call_accepted(trace, lookahead):
    """Drafts accepted by the first call of a run with ``T = K``: up to the first rejection."""
    rejected = np.asarray(trace.rejected)
    return np.where(rejected.any(-1), rejected.argmax(-1), lookahead)


@pytest.mark.parametrize("lookahead, seed, zero_fraction", [(2, 31, 0.0), (4, 32, 0.3)])
def test_mean_accepted_length_per_call(lookahead, seed, zero_fraction):
    """A single call (T = K): block's and SD's mean accepted drafts against the exact values."""
    draft, target = random_pair(seed, 4, lookahead, zero_fraction)
    with jax.enable_x64(True):
        lengths = _first_call_lengths(to_chain(draft), to_chain(target), lookahead=lookahead)
        exact_block, exact_token = (float(target[0] @ np.asarray(x)) for x in lengths)
    d, t = to_chain(draft, np.float32), to_chain(target, np.float32)
    key = jax.random.key(11)
    trace = block_decoding(key, d, t, NUM_CHAINS, lookahead=lookahead)
    stats.assert_mean(first_call_accepted(trace, lookahead), exact_block, "block accepted")
    sd = specjax.speculative_decoding(key, d, t, NUM_CHAINS, lookahead=lookahead)
    stats.assert_mean(first_call_accepted(sd, lookahead), exact_token, "token-wise accepted")
    assert exact_block >= exact_token


def block_decoding(key, draft, target, num_chains, *, lookahead):
    """``decode`` with ``BlockVerification(lookahead)``: the old ``block_verification_decoding``."""
    return specjax.decode(key, specjax.BlockVerification(lookahead), draft, target, num_chains)


# ----------------------------------------------------------------------------- exact theory
@functools.partial(jax.jit, static_argnums=2)
def _three_lengths(d, t, settings):
    """Token-wise, block, joint and block at ``prev_token`` for every ``(lookahead, position,
    prev_token)`` of ``settings``: one program per instance (eagerly, hundreds)."""
    out = []
    for lookahead, position, a in settings:
        args = dict(lookahead=lookahead, position=position)
        out.append((block.exact_tokenwise_accepted_length(d, t, **args),
                    block.exact_block_accepted_length(d, t, **args),
                    block.exact_joint_accepted_length(d, t, **args),
                    block.exact_block_accepted_length(d, t, prev_token=a, **args)))
    return out


def test_block_between_tokenwise_and_joint_bound(x64):
    rng = np.random.default_rng(0)
    for trial in range(6):
        num_states = int(rng.integers(2, 6))
        pair = random_pair(100 + trial, num_states, 5, zero_fraction=0.2 * (trial % 3))
        d, t = to_chain(pair[0]), to_chain(pair[1])
        settings = []
        for lookahead in (1, 2, 3, 4):  # the draws in the order of the loop below
            position = int(rng.integers(1, 6))
            settings.append((lookahead, position, int(rng.integers(num_states))))
        settings = tuple(settings)
        for (lookahead, position, a), values in zip(settings, _three_lengths(d, t, settings)):
            token, blk, bound, one = (np.asarray(x) for x in values)
            assert (token <= blk + 1e-12).all() and (blk <= bound + 1e-12).all()
            if lookahead == 1 or position == 5:  # a single draft: all three are SD
                np.testing.assert_allclose(blk, token, atol=1e-12)
                np.testing.assert_allclose(bound, token, atol=1e-12)
            assert one.shape == () and abs(float(one) - blk[a]) < 1e-12


def test_motivating_example(x64):
    """Sun et al.'s Section 2 example: p = (2/3, 1/3), q = (1/3, 2/3), K = 2, context-free."""
    p, q = np.array([2 / 3, 1 / 3]), np.array([1 / 3, 2 / 3])
    d = specjax.MarkovChain(np.array([1.0, 0.0]), np.tile(p, (2, 2, 1)))
    t = specjax.MarkovChain(np.array([1.0, 0.0]), np.tile(q, (2, 2, 1)))
    values = [9 * float(v) for v in jax.jit(lambda d, t: [f(d, t, lookahead=2, prev_token=0)
                                                        for f in (
        block.exact_tokenwise_accepted_length, block.exact_block_accepted_length,
        block.exact_joint_accepted_length)])(d, t)]  # one program, not 60 eager ones
    np.testing.assert_allclose(values, [10, 11, 12], atol=1e-12)


def test_tokenwise_matches_literal_sd(x64):
    """Token-wise: the first call of the literal SD pseudo-code (``T = K``), enumerated."""
    pair = random_pair(5, 3, 3, zero_fraction=0.3)
    d, t = to_chain(pair[0]), to_chain(pair[1])
    law = ref.enumerate_law(lambda c: ref.sd_literal(c, pair[0], pair[1], lookahead=3))
    accepted = sum(pr * (rejected.index(True) if True in rejected else 3)
                   for (_, rejected, _), pr in law.items())
    exact = float(pair[1][0] @ np.asarray(block.exact_tokenwise_accepted_length(
        d, t, lookahead=3)))
    assert abs(accepted - exact) < 1e-10


@jax.jit
def _edge_values(d, t):
    """The three accepted lengths at positions 1 and 2, E[calls] of (d, t) and of (t, t)."""
    lengths = [f(d, t, lookahead=3, position=position)
               for f in (block.exact_tokenwise_accepted_length, block.exact_block_accepted_length,
                         block.exact_joint_accepted_length) for position in (1, 2)]
    return (lengths, block.exact_block_expected_calls(d, t, lookahead=2),
            block.exact_block_expected_calls(t, t, lookahead=2))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_finite_at_edge_cases(dtype, x64):
    pair = edge_pair(4, 4)
    d, t = to_chain(pair[0], dtype), to_chain(pair[1], dtype)
    lengths, calls, same_calls = _edge_values(d, t)
    for values in lengths:
        assert np.asarray(values).dtype == dtype and np.isfinite(np.asarray(values)).all()
    assert np.isfinite(float(calls))
    # p = q: every draft is accepted; K = 2 drafts and a bonus, then one draft: 2 calls.
    assert abs(float(same_calls) - 2) < 1e-5


def test_finite_gradients_at_edge_cases(x64):
    pair = edge_pair(4, 4)
    d, t = to_chain(pair[0]), to_chain(pair[1])
    grads = jax.jit(jax.grad(
        lambda dd, tt: jnp.sum(block.exact_block_accepted_length(dd, tt, lookahead=3))
        + block.exact_block_expected_calls(dd, tt, lookahead=2), argnums=(0, 1)))(d, t)
    assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree_util.tree_leaves(grads))


# ----------------------------------------------------------------------------- API
def test_validation_errors():
    pair = random_pair(1, 7, 4)
    draft, target = to_chain(pair[0], np.float32), to_chain(pair[1], np.float32)
    key = jax.random.key(0)
    run = block_decoding
    with pytest.raises(ValueError, match="num_chains"):
        run(key, draft, target, 0, lookahead=2)
    with pytest.raises(ValueError, match="lookahead"):
        run(key, draft, target, 10, lookahead=0)
    with pytest.raises(ValueError, match="lookahead"):
        run(key, draft, target, 10, lookahead=1.5)
    with pytest.raises(ValueError, match="key"):
        run(3, draft, target, 10, lookahead=2)
    other = to_chain(random_pair(2, 5, 4)[1], np.float32)
    with pytest.raises(ValueError, match="same number of states"):
        run(key, draft, other, 10, lookahead=2)
    with pytest.raises(ValueError, match="target"):
        run(key, draft, "q", 10, lookahead=2)
    for f in (block.exact_block_accepted_length, block.exact_tokenwise_accepted_length,
              block.exact_joint_accepted_length):
        with pytest.raises(ValueError, match="position"):
            f(draft, target, lookahead=2, position=0)
        with pytest.raises(ValueError, match="position"):
            f(draft, target, lookahead=2, position=5)
        with pytest.raises(ValueError, match="prev_token"):
            f(draft, target, lookahead=2, prev_token=7)
        with pytest.raises(ValueError, match="lookahead"):
            f(draft, target, lookahead=True)
    big_d, big_t = (to_chain(m, np.float32) for m in random_pair(3, 16, 8))
    with pytest.raises(ValueError, match="lookahead"):
        block.exact_block_accepted_length(big_d, big_t, lookahead=6)  # 16**6 = 2**24 blocks
    with pytest.raises(ValueError, match="lookahead"):
        block.exact_block_expected_calls(big_d, big_t, lookahead=6)
    # Token-wise needs no enumeration.
    assert block.exact_tokenwise_accepted_length(big_d, big_t, lookahead=6).shape == (16,)


def test_deterministic_and_no_recompilation():
    # V = 7, T = 6, K = 2 and 2,000 chains: the program of the script's run below (shared).
    draft, target = (to_chain(m, np.float32) for m in random_pair(4, 7, 6))
    run = functools.partial(block_decoding, num_chains=2000, lookahead=2)
    a = run(jax.random.key(3), draft, target)
    b = run(jax.random.key(3), draft, target)
    c = run(jax.random.key(4), draft, target)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a.tokens, c.tokens)
    assert a.tokens.dtype == jnp.int32 and a.tokens.shape == (2000, 7)
    assert a.rejected.shape == a.new_call.shape == (2000, 6)
    size = specjax.sampling.calls.simulate_calls._cache_size()
    draft2, target2 = (to_chain(m, np.float32) for m in random_pair(5, 7, 6))
    run(jax.random.key(3), draft2, target2)
    assert specjax.sampling.calls.simulate_calls._cache_size() == size
    # The first chains of a larger run are a smaller run with the same key.
    fewer = block_decoding(jax.random.key(3), draft, target, 64, lookahead=2)
    np.testing.assert_array_equal(a.tokens[:64], fewer.tokens)


# ----------------------------------------------------------------------------- the script
@pytest.mark.slow  # a script end to end, as tests/test_scripts.py
def test_block_verification_script_tiny():
    script = import_script("block_verification")
    rows = script.main(["--max-lookahead", "2", "--num-chains", "2000", "--horizon", "6",
                        "--random-instances", "0", "--quiet"])
    assert len(rows["per_call"]) == 2 and len(rows["sequence"]) == 2
    for row in rows["per_call"]:
        assert row["block"] >= row["tokenwise"] - 1e-9
        assert abs(row["block_sim"] - row["block"]) <= 4.5 * row["block_se"] + 1e-9
        assert abs(row["tokenwise_sim"] - row["tokenwise"]) <= 4.5 * row["tokenwise_se"] + 1e-9
    for row in rows["sequence"]:
        assert abs(row["block_calls_sim"] - row["block_calls"]) <= 4.5 * row["block_se"] + 1e-9
        assert abs(row["sd_calls_sim"] - row["sd_calls"]) <= 4.5 * row["sd_se"] + 1e-9
