"""Stop tokens in ``decode``, ``decoding_statistics`` and ``exact``: a chain ends at its first
end-of-sequence token among ``x_1..x_T``.

Checked three ways:

* exact values (float64) against the literal algorithms of ``tests/reference.py`` with
  HuggingFace's ending (after each call, the output is cut after the first stop token it
  emitted and the generation ends), enumerated over every execution path;
* the finite-state recursion against the Markov recursion on the lifted chain, and every
  lossless decoder's output law against the target's sequence law cut at the stop;
* Monte Carlo of every engine (Markov, protocol models, call-level) against the exact values,
  and the stopped run against the same run without stop tokens, token for token.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax import models
from conftest import float64
from conftest import full_suite_only
from reference import batch_literal
from reference import biased_accept
from reference import enumerate_law
from reference import expected_counts_from_law
from reference import general_literal
from reference import rejected_measure
from reference import sd_accept
from reference import sd_residual
from reference import target_sequence_law
from stats import assert_law
from stats import assert_mean

V, T = 3, 4


def _pair(seed=0, num_states=V):
    keys = jax.random.split(jax.random.key(seed))
    return tuple(specjax.random_markov_chain(k, num_states, T) for k in keys)


def _numpy(chain):
    return np.asarray(chain.init, np.float64), np.asarray(chain.trans, np.float64)


def _literal(name, draft, target, stop):
    """The enumerated law of ``(tokens, rejected, calls)`` of the literal algorithm."""
    d, t = _numpy(draft), _numpy(target)
    eps = 0.15

    def accept_biased(p, q):
        return biased_accept(p, q, eps)

    runs = {
        "sd": lambda c: general_literal(c, d, t, sd_accept, sd_residual, None, stop),
        "sd2": lambda c: general_literal(c, d, t, sd_accept, sd_residual, 2, stop),
        "autoregressive": lambda c: general_literal(c, t, t, sd_accept, sd_residual, 0, stop),
        "biased2": lambda c: general_literal(c, d, t, accept_biased, sd_residual, 2, stop),
        "batch2": lambda c: batch_literal(c, d, t, 2, stop=stop),
    }
    return enumerate_law(runs[name])


DECODERS = {
    "sd": specjax.Speculative(),
    "sd2": specjax.Speculative(2),
    "autoregressive": specjax.Autoregressive(),
    "biased2": specjax.BiasedSpeculative(0.15, residual="standard", lookahead=2),
    "batch2": specjax.BatchSpeculative(2),
}


def _marginals(law, num_states):
    out = np.zeros((T + 1, num_states))
    for (tokens, _, _), pr in law.items():
        out[np.arange(T + 1), tokens] += pr
    return out


# Batch SD drafts M whole sequences up front, and SD with K = T one whole sequence: their
# enumerations are kept to V = 2 (SD's at V = 3 took 10 s of Python over 453 outcomes; the
# residual at V = 3 is checked by sd2 and biased2, the stop by every case).
@pytest.mark.parametrize("name,stop,num_states", [
    ("sd", (1,), 2), ("sd2", (2,), V), ("autoregressive", (1,), V), ("biased2", (0, 2), V),
    full_suite_only("batch2", (1,), 2)])
def test_exact_values_equal_the_literal_algorithm_stopped_like_huggingface(x64, name, stop,
                                                                            num_states):
    draft, target = _pair(0, num_states)
    decoder = DECODERS[name]
    law = _literal(name, draft, target, stop)
    assert abs(sum(law.values()) - 1) < 1e-12
    got = specjax.exact(decoder, None if name == "autoregressive" else draft, target,
                        stop_tokens=list(stop))
    rejections, calls = expected_counts_from_law(law)
    length = sum(pr * next((n for n in range(1, T + 1) if tokens[n] in stop), T)
                 for (tokens, _, _), pr in law.items())
    np.testing.assert_allclose(float(got.expected_rejections), rejections, atol=1e-12)
    np.testing.assert_allclose(float(got.expected_calls), calls, atol=1e-12)
    np.testing.assert_allclose(float(got.expected_length), length, atol=1e-12)
    np.testing.assert_allclose(np.asarray(got.rejected), rejected_measure(law, num_states, T),
                               atol=1e-12)
    np.testing.assert_allclose(np.asarray(got.marginals), _marginals(law, num_states),
                               atol=1e-12)
    # The stop changed something: without it the chain makes more calls.
    unstopped = specjax.exact(decoder, None if name == "autoregressive" else draft, target)
    assert float(unstopped.expected_calls) > calls + 0.1


def _stopped_target_marginals(target, stop):
    out = np.zeros((T + 1, V))
    for seq, pr in target_sequence_law(_numpy(target)).items():
        n = next((n for n in range(1, T + 1) if seq[n] in stop), T)
        seq = seq[:n + 1] + (seq[n],) * (T - n)
        out[np.arange(T + 1), seq] += pr
    return out


def test_lossless_decoders_output_the_target_law_cut_at_the_stop(x64):
    draft, target = _pair(1)
    want = _stopped_target_marginals(target, {0})
    decoders = (specjax.Speculative(3), specjax.BatchSpeculative(2, lookahead=2),
                specjax.OptimalMultiDraft(2), specjax.ThresholdVerification())
    values = jax.jit(lambda d, t: [specjax.exact(decoder, d, t, stop_tokens=0)
                                   for decoder in decoders])(draft, target)  # one program
    for decoder, got in zip(decoders, values):
        np.testing.assert_allclose(np.asarray(got.marginals), want, atol=1e-12,
                                   err_msg=type(decoder).__name__)


def test_finite_state_recursion_equals_the_markov_recursion_on_the_lift(x64):
    draft, target = _pair(2)
    lift = models.FiniteStateModel.from_markov_chain
    decoders = (specjax.Speculative(2), specjax.Speculative(), specjax.Autoregressive())

    @jax.jit  # one program (six exact programs otherwise)
    def values(draft, target, lifted_draft, lifted_target):
        out = []
        for decoder in decoders:
            ar = isinstance(decoder, specjax.Autoregressive)
            out.append((specjax.exact(decoder, None if ar else draft, target, stop_tokens=[1]),
                        specjax.exact(decoder, None if ar else lifted_draft, lifted_target,
                                      horizon=T, stop_tokens=[1])))
        return out

    for decoder, (want, got) in zip(decoders, values(draft, target, lift(draft), lift(target))):
        for field in want._fields:
            np.testing.assert_allclose(np.asarray(getattr(got, field)),
                                       np.asarray(getattr(want, field)), atol=1e-13,
                                       err_msg=f"{type(decoder).__name__}.{field}")


def _check_monte_carlo(trace, exact, what):
    """``exact``: ``(calls, rejections, length, law of x_T)``, floats and a NumPy array."""
    calls, rejections, length, final = exact
    for samples, value, name in ((trace.num_calls, calls, "calls"),
                                 (trace.num_rejections, rejections, "rejections"),
                                 (trace.num_emitted, length, "length")):
        assert_mean(np.asarray(samples, np.float64), value, f"{what}: {name}")
    n = trace.tokens.shape[0]
    last = dict(zip(*np.unique(np.asarray(trace.tokens[:, -1]), return_counts=True)))
    law = {int(x): float(p) for x, p in enumerate(final) if p > 0}
    assert_law({int(k): int(v) for k, v in last.items()}, law, n, f"{what}: x_T")


@pytest.mark.slow  # a Monte Carlo run of 100,000 chains or more
def test_monte_carlo_of_each_engine_fits_the_exact_values():
    """Markov engine, protocol engine (the lifted chain) and decoding_statistics."""
    draft, target = _pair(3)
    decoder = specjax.Speculative(2)
    with jax.enable_x64(True):
        d64, t64 = float64(draft, target)
        got = specjax.exact(decoder, d64, t64, stop_tokens=[2])
        exact = (float(got.expected_calls), float(got.expected_rejections),
                 float(got.expected_length), np.asarray(got.marginals[-1]))
    key = jax.random.key(7)
    trace = specjax.decode(key, decoder, draft, target, 100_000, stop_tokens=[2])
    _check_monte_carlo(trace, exact, "Markov engine")
    lift = models.FiniteStateModel.from_markov_chain
    protocol = specjax.decode(jax.random.key(8), decoder, lift(draft), lift(target), 50_000,
                              horizon=T, stop_tokens=[2])
    _check_monte_carlo(protocol, exact, "protocol engine")
    stats = specjax.decoding_statistics(key, decoder, draft, target, 100_000, stop_tokens=[2],
                                        chunk_size=30_000)
    np.testing.assert_array_equal(stats.num_calls, trace.num_calls)
    np.testing.assert_array_equal(stats.new_call, np.asarray(trace.new_call).sum(0))
    np.testing.assert_array_equal(stats.rejected, np.asarray(trace.rejected).sum(0))
    emitted = np.arange(1, T + 1) <= np.asarray(trace.num_emitted)[:, None]
    np.testing.assert_array_equal(stats.emitted, emitted.sum(0))


# The chain counts, decoder and stop token of
# test_monte_carlo_of_each_engine_fits_the_exact_values: the stopped Markov and protocol runs are
# then its programs, not compilations of their own.
@pytest.mark.parametrize("kind,num_chains", [("markov", 100_000), ("protocol", 50_000),
                                             ("calls", 2000)])
def test_a_stopped_run_is_the_unstopped_run_cut_at_the_stop(kind, num_chains):
    draft, target = _pair(4)
    decoder = specjax.BlockVerification(2) if kind == "calls" else specjax.Speculative(2)
    kw = {}
    if kind == "protocol":
        lift = models.FiniteStateModel.from_markov_chain
        draft, target, kw = lift(draft), lift(target), {"horizon": T}
    key = jax.random.key(5)
    full = specjax.decode(key, decoder, draft, target, num_chains, **kw)
    cut = specjax.decode(key, decoder, draft, target, num_chains, stop_tokens=[2], **kw)
    tokens = np.asarray(full.tokens)
    is_stop = tokens[:, 1:] == 2
    length = np.where(is_stop.any(1), is_stop.argmax(1) + 1, T)
    assert 0 < (length < T).mean() < 1
    live = np.arange(1, T + 1) <= length[:, None]
    np.testing.assert_array_equal(cut.num_emitted, length)
    np.testing.assert_array_equal(np.asarray(cut.tokens)[:, 1:],
                                  np.where(live, tokens[:, 1:],
                                           tokens[np.arange(num_chains), length, None]))
    np.testing.assert_array_equal(cut.rejected, np.asarray(full.rejected) & live)
    np.testing.assert_array_equal(cut.new_call, np.asarray(full.new_call) & live)
    np.testing.assert_array_equal(cut.num_calls, (np.asarray(full.new_call) & live).sum(1))
    np.testing.assert_array_equal(full.num_emitted, np.full(num_chains, T))


def test_edge_cases_stay_finite_with_gradients(x64):
    draft, target = _pair(5)
    every = specjax.exact(specjax.Speculative(2), draft, target, stop_tokens=range(V))
    assert float(every.expected_length) == 1 and float(every.expected_calls) == 1
    # A stop token the target never emits changes nothing.
    trans = target.trans.at[..., 0].set(0.0)
    trans = trans / trans.sum(-1, keepdims=True)
    never = specjax.MarkovChain(init=target.init, trans=trans)
    for decoder in (specjax.Speculative(2), specjax.Speculative()):
        with_stop = specjax.exact(decoder, draft, never, stop_tokens=0)
        without = specjax.exact(decoder, draft, never)
        for field in without._fields:
            np.testing.assert_allclose(np.asarray(getattr(with_stop, field)),
                                       np.asarray(getattr(without, field)), atol=1e-14)

    def calls(logits, target):  # p = q and disjoint supports are ordinary inputs
        draft = specjax.MarkovChain.from_logits(jnp.zeros(V), logits)
        return specjax.exact(specjax.Speculative(2), draft, target, stop_tokens=[2]
                             ).expected_calls

    same = jnp.log(target.trans)
    disjoint = jnp.broadcast_to(jnp.where(jnp.arange(V) == 0, 0.0, -jnp.inf),
                                target.trans.shape).astype(same.dtype)  # same's program
    one_hot = specjax.MarkovChain(init=target.init,
                                  trans=jax.nn.one_hot(jnp.ones((T, V), int), V))
    value_and_grad = jax.jit(jax.value_and_grad(calls))  # one program for both (eagerly, dozens)
    for logits, tgt in ((same, target), (disjoint, one_hot)):
        value, grad = value_and_grad(logits, tgt)
        assert np.isfinite(float(value)) and np.all(np.isfinite(np.asarray(grad)))


def test_bad_stop_tokens_are_refused_by_name_before_any_work():
    draft, target = _pair()
    key = jax.random.key(0)
    for bad in (-1, V, [0, V], 1.5, [[1]], True, "a"):
        for call in (lambda: specjax.decode(key, specjax.Speculative(), draft, target, 4,
                                            stop_tokens=bad),
                     lambda: specjax.exact(specjax.Speculative(), draft, target,
                                           stop_tokens=bad),
                     lambda: specjax.decoding_statistics(key, specjax.Speculative(), draft,
                                                         target, 4, stop_tokens=bad)):
            with pytest.raises(ValueError, match="stop_tokens"):
                call()
    with pytest.raises(ValueError, match="stop_tokens.*static"):
        jax.jit(lambda s: specjax.exact(specjax.Speculative(), draft, target,
                                        stop_tokens=s).expected_calls)(jnp.array([1]))
    with pytest.raises(ValueError, match="stop_tokens: BlockVerification has no exact"):
        specjax.exact(specjax.BlockVerification(2), draft, target, stop_tokens=1)


def test_stop_tokens_as_a_set_traced_or_through_the_deprecated_form():
    draft, target = _pair()
    key = jax.random.key(0)
    as_set = specjax.exact(specjax.Speculative(2), draft, target, stop_tokens={2, 0})
    as_list = specjax.exact(specjax.Speculative(2), draft, target, stop_tokens=[0, 2])
    np.testing.assert_array_equal(as_set.new_call, as_list.new_call)
    with pytest.raises(ValueError, match="stop_tokens is a static setting"):
        jax.jit(lambda s: specjax.exact(specjax.Speculative(), draft, target,
                                        stop_tokens=s).expected_calls)([1, 2])
    # test_monte_carlo_of_each_engine_fits_the_exact_values's statistics (decoder, stop token,
    # chains and chunks), so that its programs serve here too.
    new = specjax.decoding_statistics(key, specjax.Speculative(2), draft, target, 100_000,
                                      stop_tokens=[2], chunk_size=30_000)
    with pytest.warns(DeprecationWarning):
        old = specjax.decoding_statistics(specjax.speculative_decoding, key, draft, target,
                                          100_000, lookahead=2, stop_tokens=[2],
                                          chunk_size=30_000)
    np.testing.assert_array_equal(old.num_calls, new.num_calls)
    np.testing.assert_array_equal(old.emitted, new.emitted)
