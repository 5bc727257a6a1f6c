"""A fixed prompt (``with_prompt``) and models that give logits instead of probabilities."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

import specjax
from specjax import models
from stats import assert_law
from stats import assert_mean

V, T = 3, 5


def test_prompted_finite_state_model_equals_the_prompted_markov_chain(x64):
    """A Markov chain's law after the prompt depends on its last token only; its stationary lift
    (states: the last token) reads the whole prompt and must agree. The position-indexed lift
    moves one layer per prompt token, so it agrees for a prompt of one token."""
    keys = jax.random.split(jax.random.key(0))
    draft, target = (specjax.random_markov_chain(k, V, T) for k in keys)
    lift = models.FiniteStateModel.from_markov_chain
    stationary = [specjax.MarkovChain(init=m.init, trans=jnp.broadcast_to(m.trans[:1],
                                                                          m.trans.shape))
                  for m in (draft, target)]
    cases = [(stationary, [1, 0, 2], lambda m: lift(m, stationary=True)),
             ((draft, target), [2], lift)]
    for decoder, ((draft, target), prompt, lifted) in zip(
            (specjax.Speculative(2), specjax.BatchSpeculative(2)), cases):
        want = specjax.exact(decoder, specjax.models.with_prompt(draft, prompt),
                             specjax.models.with_prompt(target, prompt))
        got = specjax.exact(decoder, specjax.models.with_prompt(lifted(draft), prompt),
                            specjax.models.with_prompt(lifted(target), prompt), horizon=T)
        np.testing.assert_array_equal(np.asarray(want.marginals[0]), np.eye(V)[2])
        np.testing.assert_allclose(np.asarray(want.marginals[1]), np.asarray(target.trans[0, 2]),
                                   atol=1e-15)
        for field in want._fields:
            np.testing.assert_allclose(np.asarray(getattr(got, field)),
                                       np.asarray(getattr(want, field)), atol=1e-13)


def _trigrams():
    corpus = [np.array([1, 2, 0, 1, 1, 2, 2, 0, 1, 2, 1, 0, 0, 2, 1])]
    draft = specjax.NGramModel.fit(corpus, order=2, num_states=V, smoothing=0.5)
    target = specjax.NGramModel.fit(corpus, order=3, num_states=V, smoothing=0.5)
    return draft, target


def test_prompted_ngrams_sample_the_exact_values_of_their_finite_state_lift():
    draft, target = _trigrams()
    prompt = [2, 0]
    decoder = specjax.Speculative(2)
    d, t = specjax.models.with_prompt(draft, prompt), specjax.models.with_prompt(target, prompt)
    assert isinstance(t, specjax.models.PromptedModel)
    trace = specjax.decode(jax.random.key(1), decoder, d, t, 40_000, horizon=T)
    assert np.all(np.asarray(trace.tokens[:, 0]) == 0)
    # x_1 follows the trigram's row in the context (2, 0): index 2 V + 0 (newest last).
    row = np.asarray(target.table[2 * V + 0], np.float64)
    counts = np.bincount(np.asarray(trace.tokens[:, 1]), minlength=V)
    assert_law(dict(enumerate(counts.tolist())), dict(enumerate(row / row.sum())),
               trace.tokens.shape[0], "x_1 after the prompt")
    with jax.enable_x64(True):  # the same n-grams fitted in float64
        lifted = [specjax.models.with_prompt(m.as_finite_state(2), prompt) for m in _trigrams()]
        exact = specjax.exact(decoder, *lifted, horizon=T)
        calls, rejections = float(exact.expected_calls), float(exact.expected_rejections)
    assert_mean(np.asarray(trace.num_calls, np.float64), calls, "calls")
    assert_mean(np.asarray(trace.num_rejections, np.float64), rejections, "rejections")


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class _LogitsOnly:
    """An n-gram that gives log-probabilities through ``logits`` and has no ``probs``."""

    model: specjax.NGramModel

    def tree_flatten(self):
        return (self.model,), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)

    @property
    def num_states(self):
        return self.model.num_states

    def init_state(self):
        return self.model.init_state()

    def logits(self, state):
        return jnp.log(self.model.probs(state)) + 3.0  # a shift: logits, not log-probs

    def update(self, state, token):
        return self.model.update(state, token)


def test_a_model_that_gives_logits_decodes_as_its_softmax():
    draft, target = _trigrams()
    key = jax.random.key(2)
    decoder = specjax.Speculative(2)
    want = specjax.decode(key, decoder, draft, target, 2_000, horizon=T)
    got = specjax.decode(key, decoder, _LogitsOnly(draft), _LogitsOnly(target), 2_000, horizon=T)
    assert np.mean(np.asarray(got.tokens) == np.asarray(want.tokens)) > 0.999
    np.testing.assert_allclose(np.mean(got.num_calls), np.mean(want.num_calls), atol=0.01)
    same = _LogitsOnly(target)
    auto = specjax.decode(key, specjax.Autoregressive(), None, same, 100, horizon=T)
    assert auto.tokens.shape == (100, T + 1)


def test_prompts_under_jit_in_batches_and_checked_by_name():
    """The review's cases: a finite-state model traced through with_prompt, a batch of Markov
    chains, a PromptedModel built directly, different prompts, traced prompts."""
    import pytest

    keys = jax.random.split(jax.random.key(3))
    draft, target = (specjax.random_markov_chain(k, V, T) for k in keys)
    lift = models.FiniteStateModel.from_markov_chain

    def calls(d, t):
        return specjax.exact(specjax.Speculative(2), specjax.models.with_prompt(d, [1, 2]),
                             specjax.models.with_prompt(t, [1, 2]), horizon=T).expected_calls

    lifted = (lift(draft), lift(target))
    np.testing.assert_allclose(jax.jit(calls)(*lifted), calls(*lifted), rtol=1e-6)
    batch = jax.tree.map(lambda *x: jnp.stack(x), target, target)
    prompted = specjax.models.with_prompt(batch, [0])
    np.testing.assert_array_equal(prompted.init, np.tile(np.eye(V)[0], (2, 1)))
    for bad, match in (([V], "prompt must hold ids"), ([], "non-empty")):
        with pytest.raises(ValueError, match=match):
            specjax.models.PromptedModel(model=_trigrams()[1], prompt=jnp.asarray(bad, jnp.int32))
    d, t = (specjax.models.with_prompt(m, p) for m, p in zip(_trigrams(), ([0, 1], [0, 2])))
    with pytest.raises(ValueError, match="prompts that end in different tokens"):
        specjax.decode(jax.random.key(0), specjax.Speculative(2), d, t, 10, horizon=T)
    with pytest.raises(ValueError, match="prompt must be concrete"):
        jax.jit(lambda p: specjax.models.with_prompt(target, p).init)([1, 2])
