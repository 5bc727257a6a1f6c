"""Neural protocol models: an equinox MLP (whose leaves include its activation function) as draft
and target, with both engines, against the exact values of its finite-state lift.

* Monte Carlo of the token-wise engine and of batched scoring fits the exact calls, rejections
  and law of ``x_T`` of the lift (the networks evaluated on every context: an n-gram table);
* a model with a function among its leaves (``StaticLeaves``) gives the tokens of the same model
  with the function written into its code.
"""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax.models.autoregressive import StaticLeaves
from specjax.models.autoregressive import with_static_leaves
from stats import assert_law
from stats import assert_mean

V, L, T = 3, 2, 5


class Net(eqx.Module):
    """Logits of the next token from the one-hot last ``L`` tokens (an ``eqx.nn.MLP``)."""

    mlp: eqx.nn.MLP
    context: int = eqx.field(static=True)

    def __init__(self, key, context, width=8):
        self.mlp = eqx.nn.MLP(context * V, V, width, depth=1, activation=jnp.tanh, key=key)
        self.context = context

    num_states = property(lambda self: V)

    def init_state(self):
        return jnp.int32(0)

    def update(self, state, token):
        return (state % V ** (self.context - 1)) * V + token

    def contexts_logits(self, contexts):
        powers = V ** jnp.arange(self.context - 1, -1, -1)
        chars = contexts[:, None] // powers[None, :] % V
        return jax.vmap(self.mlp)(jax.nn.one_hot(chars, V).reshape(contexts.shape[0], -1))

    def logits(self, state):
        return self.contexts_logits(state[None])[0]

    def logits_block(self, state, tokens):
        after = jax.lax.scan(lambda s, x: (self.update(s, x),) * 2, state, tokens)[1]
        return self.contexts_logits(jnp.concatenate([state[None], after]))


def _lift(net, context=L):
    with jax.enable_x64(True):
        table = jax.nn.softmax(net.contexts_logits(jnp.arange(V ** net.context)).astype(
            jnp.float64), axis=-1)
        table = np.asarray(table)
        table = jnp.asarray(table / table.sum(-1, keepdims=True))
        return specjax.NGramModel(table=table, order=net.context + 1).as_finite_state(context)


@pytest.mark.parametrize("batched", [False, True])
def test_an_equinox_mlp_decodes_with_the_law_of_its_finite_state_lift(batched):
    draft, target = Net(jax.random.key(0), 1), Net(jax.random.key(1), L)
    decoder = specjax.Speculative(2)
    with jax.enable_x64(True):
        exact = specjax.exact(decoder, _lift(draft), _lift(target), horizon=T)
        calls, rejections = float(exact.expected_calls), float(exact.expected_rejections)
        final = np.asarray(exact.marginals[-1])
    n = 40_000
    trace = specjax.decode(jax.random.key(2), decoder, draft, target, n, horizon=T,
                           batched_scoring=batched)
    assert_mean(trace.num_calls, calls, "calls")
    assert_mean(trace.num_rejections, rejections, "rejections")
    assert 0.05 < rejections / T < 0.95  # the networks differ: both outcomes are exercised
    last = np.bincount(np.asarray(trace.tokens[:, -1]), minlength=V)
    assert_law({x: int(c) for x, c in enumerate(last) if c},
               {x: float(p) for x, p in enumerate(final) if p > 0}, n, "x_T")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _Activated:
    """A bigram from logits ``w[state]`` through ``act``, a function stored as a pytree leaf."""

    w: jax.Array
    act: object  # a leaf that jit cannot take: StaticLeaves makes it static

    num_states = property(lambda self: self.w.shape[-1])

    def init_state(self):
        return jnp.int32(0)

    def probs(self, state):
        return jax.nn.softmax(self.act(self.w[state]))

    def update(self, state, token):
        return jnp.asarray(token, jnp.int32)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _Tanh:
    w: jax.Array

    num_states = property(lambda self: self.w.shape[-1])

    def init_state(self):
        return jnp.int32(0)

    def probs(self, state):
        return jax.nn.softmax(jnp.tanh(self.w[state]))

    def update(self, state, token):
        return jnp.asarray(token, jnp.int32)


def test_a_function_among_the_leaves_is_static_data():
    w = jax.random.normal(jax.random.key(3), (2, V, V)) * 2
    hoisted = with_static_leaves(_Activated(w[1], jnp.tanh))
    assert isinstance(hoisted, StaticLeaves)
    assert jax.tree_util.tree_leaves(hoisted) == [hoisted.model.w]
    assert with_static_leaves(_Tanh(w[1])).__class__ is _Tanh  # arrays only: unchanged
    runs = {}
    for batched in (False, True):
        key = jax.random.key(4)
        a = specjax.decode(key, specjax.Speculative(2), _Activated(w[0], jnp.tanh),
                           _Activated(w[1], jnp.tanh), 300, horizon=T, batched_scoring=batched)
        b = specjax.decode(key, specjax.Speculative(2), _Tanh(w[0]), _Tanh(w[1]), 300,
                           horizon=T, batched_scoring=batched)
        np.testing.assert_array_equal(a.tokens, b.tokens)
        np.testing.assert_array_equal(a.num_calls, b.num_calls)
        runs[batched] = a
    stats = specjax.decoding_statistics(jax.random.key(4), specjax.Speculative(2),
                                        _Activated(w[0], jnp.tanh), _Activated(w[1], jnp.tanh),
                                        300, horizon=T)
    np.testing.assert_array_equal(stats.num_calls, runs[False].num_calls)
