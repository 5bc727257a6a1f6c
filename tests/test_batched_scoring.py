"""Batched target scoring (``decode(..., batched_scoring=True)``, ``specjax.sampling.blocks``).

Checked three ways:

* a literal NumPy transcription of a serving engine's loop (draft ``K`` tokens by inverse CDF,
  score them, accept iff ``u p(x) < q(x)``, the residual's or the bonus row's inverse CDF),
  fed the engine's documented random numbers, gives the same tokens, calls and rejections;
* Monte Carlo of several decoders against the exact values of the finite-state recursion (an
  independent implementation: it never forms a call), per position and for the law of ``x_T``;
* a model's own ``probs_block`` gives the same tokens as the scan of ``probs`` and ``update``,
  and edge cases (``p = q``, disjoint supports) give their known counts.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax import models
from specjax._pytree import array_field
from specjax._pytree import pytree_dataclass
from specjax.sampling import blocks
from specjax.sampling import engine
from stats import assert_law
from stats import assert_mean

V, T, K = 4, 6, 3


def _markov_pair(seed):
    """Two random ``MarkovChain``s of size ``(V, T)``, drawn in float32 even under x64 (one
    compiled Dirichlet sampler for the module)."""
    with jax.enable_x64(False):
        keys = jax.random.split(jax.random.key(seed))
        return [specjax.random_markov_chain(k, V, T) for k in keys]


def _lifted_pair(seed):
    chains = _markov_pair(seed)
    return tuple(models.FiniteStateModel.from_markov_chain(c) for c in chains)


def _float64(model):
    """The model with its table in float64, rows renormalized (call under x64)."""
    table = np.asarray(model.table, np.float64)
    return models.FiniteStateModel(start=model.start, next_state=model.next_state,
                                   table=jnp.asarray(table / table.sum(-1, keepdims=True)))


MC_DECODERS = (
    specjax.Speculative(K),
    specjax.Speculative(),  # K = T: one call drafts the whole horizon
    specjax.BiasedSpeculative(0.2, lookahead=K),
    specjax.TypicalAcceptance(lookahead=K),  # a test that ignores the draft's probabilities
    specjax.ThresholdVerification(lookahead=K),  # a residual given the rejected draft
)


@functools.lru_cache(maxsize=None)
def mc_exact_values():
    """``exact`` of every decoder of ``MC_DECODERS`` on ``_lifted_pair(1)`` in float64 (NumPy):
    one program for the five (half the compilation of five)."""
    draft, target = _lifted_pair(1)
    with jax.enable_x64(True):
        d64, t64 = _float64(draft), _float64(target)
        values = jax.jit(lambda d, t: [specjax.exact(decoder, d, t, horizon=T)
                                       for decoder in MC_DECODERS])(d64, t64)
        return [jax.tree.map(np.asarray, got) for got in values]


@pytest.mark.parametrize("decoder", MC_DECODERS, ids=lambda d: repr(d))
def test_monte_carlo_fits_the_exact_values_per_position(decoder):
    draft, target = _lifted_pair(1)
    exact = mc_exact_values()[next(i for i, d in enumerate(MC_DECODERS) if d is decoder)]
    calls, rejections = float(exact.expected_calls), float(exact.expected_rejections)
    n = 40_000
    # Chunks of 1,000 chains: for Speculative(K), the program of
    # test_chunks_and_stop_tokens_keep_the_tokens (the counts do not depend on chunk_size).
    stats = specjax.decoding_statistics(jax.random.key(2), decoder, draft, target, n, horizon=T,
                                        chunk_size=1000, batched_scoring=True)
    assert_mean(stats.num_calls, calls, "calls")
    assert_mean(stats.num_rejections, rejections, "rejections")
    for name, counts, probs in (
            ("rejections at", stats.rejected, np.asarray(exact.rejected).sum(-1)),
            ("calls at", stats.new_call, np.asarray(exact.new_call)),
            ("verified at", stats.verified, np.asarray(exact.verified))):
        for pos in range(T):  # a Bernoulli mean per position
            flags = np.zeros(n)
            flags[:counts[pos]] = 1
            assert_mean(flags, float(probs[pos]), f"{name} {pos + 1}")
    law = {x: float(p) for x, p in enumerate(np.asarray(exact.marginals[-1])) if p > 0}
    observed = {x: int(c) for x, c in enumerate(stats.final_token_counts) if c}
    assert_law(observed, law, n, "x_T")


def _inverse_cdf(u, w):
    """The smallest ``y`` with ``u sum(w) < cumsum(w)[y]`` (the kernel's convention)."""
    return int(np.sum(u * np.sum(w) >= np.cumsum(w)))


# The model calls and random bits of the literal loop below, each one jitted program (eagerly,
# every operation of every call compiles a program of its own).
_probs = jax.jit(lambda model, state: model.probs(state))
_update = jax.jit(lambda model, state, token: model.update(state, token))
_first_token = jax.jit(lambda key, model, chain: engine.first_tokens(
    key, model.probs(model.init_state()), chain, 1)[0])
_call_bits = jax.jit(lambda key, m, first, count: engine.chain_bits(
    jax.random.fold_in(key, m), first, count), static_argnums=3)


def _literal_run(draft, target, key, chain, horizon, lookahead):
    """One chain of speculative decoding written as a serving engine's loop, in NumPy float64,
    with the uniforms ``specjax.sampling.blocks`` documents."""
    key_init, key_calls = jax.random.split(key)
    per_call = blocks.uniforms_per_call(lookahead)
    # x_0 is the engines' first token (engine.first_tokens), not part of a call
    x0 = int(_first_token(key_init, target, chain))
    tokens, calls, rejections, m = [x0], 0, 0, 0
    d_state = _update(draft, draft.init_state(), x0)
    t_state = _update(target, target.init_state(), x0)
    while len(tokens) <= horizon:
        bits = np.asarray(_call_bits(key_calls, m, chain * per_call, per_call))
        u = bits.astype(np.float64) * 2.0**-32
        m += 1
        calls += 1
        drafts, p_rows, s = [], [], d_state
        for j in range(lookahead):
            p = np.asarray(_probs(draft, s), np.float64)
            x = _inverse_cdf(u[j], p)
            drafts.append(x)
            p_rows.append(p)
            s = _update(draft, s, x)
        emitted, s = [], t_state
        for j in range(lookahead + 1):
            q = np.asarray(_probs(target, s), np.float64)
            if j == lookahead:  # all accepted: the bonus token
                emitted.append(_inverse_cdf(u[2 * lookahead + j], q))
                break
            x, p = drafts[j], p_rows[j]
            if u[lookahead + j] * p[x] < q[x]:
                emitted.append(x)
                s = _update(target, s, x)
                continue
            residual = np.maximum(q - p, 0)
            emitted.append(_inverse_cdf(u[2 * lookahead + j], residual))
            if len(tokens) + len(emitted) - 1 <= horizon:
                rejections += 1
            break
        for x in emitted:
            d_state, t_state = _update(draft, d_state, x), _update(target, t_state, x)
        tokens.extend(emitted)
    return tokens[:horizon + 1], calls, rejections


def test_tokens_equal_a_literal_engine_loop_fed_the_same_uniforms(x64):
    draft, target = (_float64(m) for m in _lifted_pair(3))
    key = jax.random.key(11)
    num = 12
    trace = specjax.decode(key, specjax.Speculative(2), draft, target, num, horizon=T,
                           batched_scoring=True)
    assert int(np.asarray(trace.num_rejections).sum()) > 0  # the residual path is exercised
    for chain in range(num):
        tokens, calls, rejections = _literal_run(draft, target, key, chain, T, 2)
        assert np.asarray(trace.tokens[chain]).tolist() == tokens, chain
        assert int(trace.num_calls[chain]) == calls, chain
        assert int(trace.num_rejections[chain]) == rejections, chain


class _OwnBlock:
    """A finite-state model that scores a block itself (gathering rows along the drafts), and
    counts nothing else: its ``probs_block`` must be what the engine uses."""

    def __init__(self, model):
        self.model = model

    num_states = property(lambda self: self.model.num_states)

    def init_state(self):
        return self.model.init_state()

    def probs(self, state):
        return self.model.probs(state)

    def update(self, state, token):
        return self.model.update(state, token)

    def probs_block(self, state, tokens):
        states = [state]
        for j in range(tokens.shape[0]):
            states.append(self.model.next_state[states[-1], tokens[j]])
        return self.model.table[jnp.stack(states)]


jax.tree_util.register_pytree_node(_OwnBlock, lambda m: ((m.model,), None),
                                   lambda _, children: _OwnBlock(children[0]))


# models.autoregressive.probs_block (a model's own probs_block, or the scan of probs and update)
# and the models' methods, each one jitted program (eagerly, an operation each).
_scored_block = jax.jit(models.autoregressive.probs_block)
_method_block = jax.jit(lambda model, state, tokens: model.probs_block(state, tokens))


def test_a_models_own_probs_block_gives_the_scans_tokens():
    draft, target = _lifted_pair(4)
    own = _OwnBlock(target)
    state = _update(target, target.init_state(), 2)
    drafts = jnp.array([1, 3, 0], jnp.int32)
    np.testing.assert_allclose(_scored_block(own, state, drafts),
                               _scored_block(target, state, drafts))
    key = jax.random.key(5)
    # 3,000 chains: the program of test_chunks_and_stop_tokens_keep_the_tokens's first run
    a = specjax.decode(key, specjax.Speculative(K), draft, target, 3000, horizon=T,
                       batched_scoring=True)
    b = specjax.decode(key, specjax.Speculative(K), draft, own, 3000, horizon=T,
                       batched_scoring=True)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.num_calls, b.num_calls)


class _LogitsOnly:
    """A model that gives logits and a block of logits, no probabilities."""

    def __init__(self, model):
        self.model = model

    num_states = property(lambda self: self.model.num_states)

    def init_state(self):
        return self.model.init_state()

    def logits(self, state):
        return jnp.log(self.model.probs(state))

    def logits_block(self, state, tokens):
        return jnp.log(models.autoregressive.probs_block(self.model, state, tokens))

    def update(self, state, token):
        return self.model.update(state, token)


jax.tree_util.register_pytree_node(_LogitsOnly, lambda m: ((m.model,), None),
                                   lambda _, children: _LogitsOnly(children[0]))


def test_a_logits_model_scores_its_block_through_its_softmax():
    draft, target = _lifted_pair(6)
    wrapped = specjax.models.ProcessedModel(model=_LogitsOnly(target))
    state = _update(target, target.init_state(), 1)
    drafts = jnp.array([0, 2, 2], jnp.int32)
    np.testing.assert_allclose(_method_block(wrapped, state, drafts),
                               _scored_block(target, state, drafts), atol=1e-6)
    # temperature: the block's rows are the processed rows, position by position
    hot = specjax.models.ProcessedModel(model=_LogitsOnly(target), temperature=0.5)
    rows = _method_block(hot, state, drafts)
    s = state
    for j in range(3):
        np.testing.assert_allclose(rows[j], _probs(hot, s), atol=1e-6)
        s = _update(target, s, drafts[j])
    trace = specjax.decode(jax.random.key(0), specjax.Speculative(2), draft, _LogitsOnly(target),
                           200, horizon=T, batched_scoring=True)
    assert trace.tokens.shape == (200, T + 1)


def test_chunks_and_stop_tokens_keep_the_tokens():
    draft, target = _lifted_pair(7)
    key = jax.random.key(9)
    decoder = specjax.Speculative(K)
    trace = specjax.decode(key, decoder, draft, target, 3000, horizon=T, batched_scoring=True)
    stats = specjax.decoding_statistics(key, decoder, draft, target, 3000, horizon=T,
                                        chunk_size=1000, batched_scoring=True)
    np.testing.assert_array_equal(stats.num_calls, trace.num_calls)
    np.testing.assert_array_equal(stats.num_rejections, trace.num_rejections)
    np.testing.assert_array_equal(stats.new_call, np.asarray(trace.new_call).sum(0))
    cut = specjax.decode(key, decoder, draft, target, 3000, horizon=T, batched_scoring=True,
                         stop_tokens=1)
    tokens = np.asarray(trace.tokens)
    is_stop = tokens[:, 1:] == 1
    length = np.where(is_stop.any(1), is_stop.argmax(1) + 1, T)
    live = np.arange(1, T + 1) <= length[:, None]
    np.testing.assert_array_equal(cut.num_emitted, length)
    np.testing.assert_array_equal(cut.new_call, np.asarray(trace.new_call) & live)


def test_equal_and_disjoint_models_give_their_known_counts():
    same = models.NGramModel.fit([np.array([0, 1, 2, 1, 0, 2, 2, 1])], order=2, num_states=3)
    trace = specjax.decode(jax.random.key(0), specjax.Speculative(2), same, same, 400, horizon=7,
                           batched_scoring=True)
    np.testing.assert_array_equal(trace.num_rejections, 0)
    np.testing.assert_array_equal(trace.num_calls, 3)  # calls of 3, 3 and 1 tokens
    # the same row after every context (order 2, V = 3, T = 7: the program of the run above)
    left = models.NGramModel(table=jnp.array([[0.5, 0.5, 0.0]] * 3), order=2)
    right = models.NGramModel(table=jnp.array([[0.0, 0.0, 1.0]] * 3), order=2)
    trace = specjax.decode(jax.random.key(1), specjax.Speculative(2), left, right, 400,
                           horizon=7, batched_scoring=True)
    np.testing.assert_array_equal(trace.num_rejections, 7)  # every draft rejected
    np.testing.assert_array_equal(trace.num_calls, 7)
    np.testing.assert_array_equal(np.asarray(trace.tokens)[:, 1:], 2)


def test_runs_it_cannot_serve_are_refused_by_name_before_any_work():
    draft, target = _lifted_pair(8)
    key = jax.random.key(0)
    chains = _markov_pair(8)
    with pytest.raises(ValueError, match="MarkovChain's engine"):
        specjax.decode(key, specjax.Speculative(2), *chains, 10, batched_scoring=True)
    with pytest.raises(ValueError, match="batched_scoring=True: decoder must verify one given"):
        specjax.decode(key, specjax.BatchSpeculative(2, lookahead=2), draft, target, 10,
                       horizon=T, batched_scoring=True)
    with pytest.raises(ValueError, match="batched_scoring=True"):
        specjax.decode(key, specjax.Autoregressive(), None, target, 10, horizon=T,
                       batched_scoring=True)
    with pytest.raises(ValueError, match="batched_scoring is a static setting"):
        specjax.decode(key, specjax.Speculative(2), draft, target, 10, horizon=T,
                       batched_scoring=jnp.array(True))
    with pytest.raises(ValueError, match="batched_scoring is a static setting"):
        specjax.decoding_statistics(key, specjax.Speculative(2), draft, target, 10, horizon=T,
                                    batched_scoring=1)


@pytree_dataclass
class _Walk:
    """Row ``s`` of a table at step ``s`` (the last row after): a bad row deep in the run."""

    table: jax.Array = array_field()

    num_states = property(lambda self: self.table.shape[-1])

    def init_state(self):
        return jnp.int32(0)

    def probs(self, state):
        return self.table[state]

    def update(self, state, token):
        del token
        return jnp.minimum(state + 1, self.table.shape[0] - 1)


@pytest.mark.parametrize("who", ["draft", "target"])
def test_a_row_that_is_not_a_law_is_reported_after_the_run(who):
    # the table shape, decoder and chains of the next test's batched run: one program for both
    good = jnp.full((T + 4, 4), 0.25)
    walks = {"draft": _Walk(good), "target": _Walk(good)}
    walks[who] = _Walk(good.at[5].set(jnp.array([0.5, 0.5, 0.5, -0.5])))
    with pytest.raises(ValueError, match=f"^{who} returned a row that is not a law"):
        specjax.decode(jax.random.key(0), specjax.Speculative(3), walks["draft"],
                       walks["target"], 64, horizon=T, batched_scoring=True)


def test_rows_beyond_the_horizon_are_not_read_and_memory_counts_the_calls():
    """A call drafts and scores past ``T``; those rows are dropped with their tokens, so they
    need not be laws (the token-wise engine never computes them). The memory estimate counts a
    call's ``2K + 1`` rows."""
    good = jnp.full((T + 4, 4), 0.25)
    bad = _Walk(good.at[T + 1:].set(0.0))  # row s serves x_s: rows past T are all zeros
    for batched in (False, True):
        trace = specjax.decode(jax.random.key(0), specjax.Speculative(3), _Walk(good), bad, 64,
                               horizon=T, batched_scoring=batched)
        assert trace.tokens.shape == (64, T + 1)
    draft, target = _lifted_pair(10)
    key = jax.random.key(0)
    sizes = [specjax.sampling.decoding.run_bytes(specjax.sampling.decoding.plan(
        key, specjax.Speculative(K), draft, target, 1000, horizon=T, batched_scoring=batched),
        1000).total for batched in (False, True)]
    assert sizes[1] >= sizes[0] + 1000 * 3 * (2 * K + 1) * V * 4
