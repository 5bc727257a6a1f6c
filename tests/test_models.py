"""Autoregressive models beyond Markov chains: the protocol, n-grams, finite-state lifts, and the
generic engines (``simulate_models``, ``exact_models``) pinned to the Markov ones."""

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax.models.autoregressive import AutoregressiveModel
from specjax.models.autoregressive import FiniteStateModel
from specjax.models.autoregressive import NGramModel
from specjax.models.autoregressive import is_autoregressive_model
from specjax.models.autoregressive import ngram_counts

from conftest import chain
from conftest import edge_pair
from conftest import programs_compiled
from conftest import uniform_chain
from conftest import random_pair
from conftest import random_rows
from sampler_cases import CASES
from sampler_cases import instance
from stats import assert_law
from stats import assert_mean
from stats import count_rows
from test_scripts import import_script

KEY = jax.random.key(3)
SD = ("sd",)


def make(rule, lookahead=None):
    """The decoder of a ``(name, setting)`` case with ``lookahead``."""
    if rule[0] == "sd":
        return specjax.Speculative(lookahead)
    if rule[0] == "autoregressive":
        return specjax.Autoregressive()
    if rule[0] == "batch":
        return specjax.BatchSpeculative(rule[1], lookahead=lookahead)
    if rule[0] == "batch_wor":
        return specjax.BatchSpeculative(rule[1], replacement=False, lookahead=lookahead)
    return specjax.BiasedSpeculative(rule[1], lookahead=lookahead)


def markov_pair(seed=0, v=4, t=5):
    """Two random chains."""
    kd, kt = jax.random.split(jax.random.key(seed))
    return specjax.random_markov_chain(kd, v, t), specjax.random_markov_chain(kt, v, t)


def random_ngram(seed, order, v, zero_fraction=0.3):
    """An n-gram with Dirichlet rows and about ``zero_fraction`` zeros per row (built from
    float64 rows: float64 under ``jax_enable_x64``, float32 otherwise)."""
    rows = random_rows(np.random.default_rng(seed), (v ** (order - 1), v), zero_fraction)
    return NGramModel(jnp.asarray(rows, jnp.result_type(float)), order)


# ----------------------------------------------------------------------------- protocol


def test_protocol_membership():
    ngram = random_ngram(0, 2, 3)
    for model in (ngram, ngram.as_finite_state(), ngram.as_finite_state(2)):
        assert isinstance(model, AutoregressiveModel) and is_autoregressive_model(model)
    draft, _ = markov_pair()
    assert not is_autoregressive_model(draft)  # MarkovChain keeps its own fast path
    assert not is_autoregressive_model(NGramModel)
    leaves, treedef = jax.tree_util.tree_flatten(ngram)
    assert len(leaves) == 1
    doubled = jax.tree_util.tree_unflatten(treedef, [2 * leaves[0]])
    assert isinstance(doubled, NGramModel) and doubled.order == 2


def all_model_kinds():
    """One model of each kind: Markov chain, n-gram, finite-state, greedy wrapper."""
    ngram = random_ngram(0, 2, 3)
    return [markov_pair()[0], ngram, ngram.as_finite_state(2), specjax.models.GreedyModel(ngram)]


@pytest.mark.parametrize("model", all_model_kinds(), ids=lambda m: type(m).__name__)
def test_models_are_frozen_pytree_dataclasses(model):
    """Every model is a ``pytree_dataclass``: frozen, equal by value, array fields as leaves
    (named by attribute), static settings in the tree structure."""
    assert dataclasses.is_dataclass(model)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(model, dataclasses.fields(model)[0].name, None)
    leaves, treedef = jax.tree_util.tree_flatten(model)
    rebuilt = jax.tree_util.tree_unflatten(treedef, leaves)
    assert type(rebuilt) is type(model) and rebuilt == model and hash(rebuilt) == hash(model)
    paths = [jax.tree_util.keystr(path) for path, _ in
             jax.tree_util.tree_flatten_with_path(model)[0]]
    assert all(path.startswith(".") for path in paths), paths
    assert jax.tree_util.tree_map(lambda x: x + 0 if x.dtype.kind == "f" else x, model) == model
    assert repr(model).startswith(type(model).__name__ + "(")


@pytest.mark.parametrize("model", all_model_kinds(), ids=lambda m: type(m).__name__)
def test_unflattening_does_not_validate(model):
    """JAX rebuilds models from gradients, placeholders and abstract values: the constructor's
    validation (rows summing to one, shapes) runs on a call of the class only."""
    leaves, treedef = jax.tree_util.tree_flatten(model)
    for placeholder in (None, object()):
        rebuilt = jax.tree_util.tree_unflatten(treedef, [placeholder] * len(leaves))
        assert type(rebuilt) is type(model)
    doubled = jax.tree_util.tree_map(lambda x: 2 * x if x.dtype.kind == "f" else x, model)
    assert type(doubled) is type(model)  # rows summing to 2, not validated
    shapes = jax.eval_shape(lambda m: m, model)
    assert type(shapes) is type(model)
    assert jax.tree_util.tree_structure(shapes) == treedef


def test_gradients_jit_and_vmap_over_every_model_kind():
    """A gradient with respect to a model is a model of gradients (rows summing to anything);
    models pass through jit and vmap (a batch: leading axes on the leaves)."""
    draft, target = markov_pair()
    grad = jax.grad(lambda d: specjax.expected_rejections(d, target))(draft)
    assert isinstance(grad, specjax.MarkovChain) and grad.trans.shape == draft.trans.shape
    assert np.abs(np.asarray(grad.trans)).sum() > 0
    ngram = random_ngram(0, 2, 3)
    grad = jax.grad(lambda m: m.probs(m.update(m.init_state(), 1))[2])(ngram)
    assert isinstance(grad, NGramModel) and grad.order == 2
    np.testing.assert_array_equal(np.asarray(grad.table)[1], [0, 0, 1])
    fs = ngram.as_finite_state(2)
    grad = jax.grad(lambda m: m.probs(m.init_state())[0], allow_int=True)(fs)
    assert isinstance(grad, FiniteStateModel) and grad.start == fs.start
    greedy = jax.jit(lambda m: m)(specjax.models.GreedyModel(ngram))
    assert isinstance(greedy, specjax.models.GreedyModel) and greedy.model == ngram
    tables = jnp.stack([ngram.table, random_ngram(1, 2, 3).table])
    batch = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(ngram), [tables])
    rows = jax.vmap(lambda m: m.probs(m.init_state()))(batch)
    np.testing.assert_array_equal(np.asarray(rows), np.asarray(tables[:, 0]))
    chains = jax.vmap(lambda k: specjax.random_markov_chain(k, 3, 2))(
        jax.random.split(jax.random.key(0), 4))
    assert isinstance(chains, specjax.MarkovChain) and chains.trans.shape == (4, 2, 3, 3)


def test_markov_chain_tree_unflatten_builds_without_validation():
    """``MarkovChain.tree_unflatten(None, (init, trans))`` (kept from the hand-registered
    pytree) builds a chain as given: no validation, no conversion; the constructor validates."""
    init, trans = jnp.ones(3), jnp.ones((2, 3, 3))  # rows summing to 3
    chain = specjax.MarkovChain.tree_unflatten(None, (init, trans))
    assert isinstance(chain, specjax.MarkovChain)
    assert chain.init is init and chain.trans is trans
    assert (chain.num_states, chain.horizon) == (3, 2)
    assert chain.tree_flatten() == ((init, trans), None)
    with pytest.raises(ValueError, match="init rows must sum to one"):
        specjax.MarkovChain(init, trans / 3)
    with pytest.raises(ValueError, match="trans rows must sum to one"):
        specjax.MarkovChain(init / 3, trans)
    with pytest.raises(ValueError, match="init must have shape"):
        specjax.MarkovChain(trans, init)


def test_models_built_from_numpy_compile_nothing():
    """NumPy fields go to the device with ``jax.device_put`` in JAX's canonical dtype, as
    ``jnp.asarray`` would give them, and without the compiled identity program ``jnp.asarray``
    runs per new shape and dtype; the fields are copies."""
    rng = np.random.default_rng(5)
    init, trans = rng.dirichlet(np.ones(7)), rng.dirichlet(np.ones(7), size=(11, 7))  # float64
    table = rng.dirichlet(np.ones(7), size=13)
    next_state = rng.integers(0, 13, size=(13, 7))  # int64
    models = []
    assert programs_compiled(lambda: models.extend([
        specjax.MarkovChain(init, trans),
        specjax.models.FiniteStateModel(np.int64(2), next_state, table)])) == 0
    markov, finite = models
    assert markov.trans.dtype == jnp.asarray(trans).dtype == jnp.float32
    assert finite.next_state.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(markov.trans), trans.astype(np.float32))
    np.testing.assert_array_equal(np.asarray(finite.next_state), next_state)
    trans[0, 0, 0] = 0.0  # the chain holds a copy
    assert float(markov.trans[0, 0, 0]) != 0.0
    with jax.enable_x64(True):
        assert specjax.MarkovChain(init, trans / trans.sum(-1, keepdims=True)).trans.dtype \
            == jnp.float64
    with pytest.raises(ValueError, match="init must be an array of probabilities"):
        specjax.MarkovChain(np.array(["a", "b"], dtype=object), trans)


def test_probability_messages_name_the_argument_and_its_shape():
    """A law that does not sum to one is named with its shape; a single row is not "row ()"."""
    with pytest.raises(ValueError, match=r"init is one row of shape \(20,\)") as error:
        specjax.MarkovChain(jnp.ones(20), jnp.ones((2, 20, 20)) / 20)
    assert "row ()" not in str(error.value) and "sums to 20" in str(error.value)
    with pytest.raises(ValueError, match=r"trans has shape \(2, 4, 4\) .* row \(1, 2\) sums to"):
        specjax.MarkovChain(jnp.ones(4) / 4, (jnp.ones((2, 4, 4)) / 4).at[1, 2, 0].set(1.0))
    with pytest.raises(ValueError, match=r"table has shape \(3, 3\)"):
        NGramModel(jnp.full((3, 3), 0.5), 2)


# ----------------------------------------------------------------------------- n-grams


TOY = [np.array([1, 2, 1, 2, 1, 0, 2]), np.array([2, 2, 1])]


def test_counts_on_toy_corpus():
    counts = ngram_counts(TOY, order=2, num_states=3)
    # Contexts padded with token 0: events (0->1, 1->2, 2->1, 1->2, 2->1, 1->0, 0->2),
    # (0->2, 2->2, 2->1).
    expected = np.zeros((3, 3), int)
    for a, b in [(0, 1), (1, 2), (2, 1), (1, 2), (2, 1), (1, 0), (0, 2), (0, 2), (2, 2), (2, 1)]:
        expected[a, b] += 1
    np.testing.assert_array_equal(counts, expected)
    trigram = ngram_counts(TOY, order=3, num_states=3)
    assert trigram.shape == (9, 3) and trigram.sum() == 10
    assert trigram[1 * 3 + 2, 1] == 2  # context (1, 2) -> 1, twice
    np.testing.assert_array_equal(trigram.reshape(3, 3, 3).sum(0), counts)  # lower order


def test_fit_without_smoothing_recovers_counts():
    model = NGramModel.fit(TOY, order=3, num_states=3, smoothing=0.0)
    counts = ngram_counts(TOY, order=3, num_states=3).astype(np.float64)
    totals = counts.sum(-1, keepdims=True)
    seen = totals[:, 0] > 0
    np.testing.assert_allclose(model.table[seen], (counts / np.maximum(totals, 1))[seen],
                               rtol=1e-6)
    np.testing.assert_allclose(model.table[~seen], 1 / 3, rtol=1e-6)  # uniform convention


@pytest.mark.parametrize("order", [1, 2, 4])
@pytest.mark.parametrize("backoff", [None, 2.0])
def test_fit_rows_are_laws_and_smoothing_makes_every_token_possible(order, backoff):
    corpus = [np.random.default_rng(1).integers(0, 3, size=40), np.array([4, 4, 4])]
    model = NGramModel.fit(corpus, order=order, num_states=5, smoothing=0.5, backoff=backoff)
    assert model.table.shape == (5 ** (order - 1), 5)
    np.testing.assert_allclose(model.table.sum(-1), 1.0, atol=1e-6)
    assert bool(jnp.all(model.table > 0))


def test_fit_backoff_interpolates_lower_orders():
    with jax.enable_x64(True):
        model = NGramModel.fit(TOY, order=3, num_states=3, smoothing=1.0, backoff=2.0)
        bigram = NGramModel.fit(TOY, order=2, num_states=3, smoothing=1.0, backoff=2.0)
        unigram = (ngram_counts(TOY, order=1, num_states=3)[0] + 1.0) / (10 + 3.0)
        np.testing.assert_allclose(bigram.table[1], (np.array([1, 0, 2]) + 2 * unigram) / 5)
        counts = ngram_counts(TOY, order=3, num_states=3)
        unseen = int(np.flatnonzero(counts.sum(-1) == 0)[0])
        # An unseen context backs off to the order below exactly: context c -> c mod V.
        np.testing.assert_allclose(model.table[unseen], bigram.table[unseen % 3])
        # Without smoothing a token never seen anywhere keeps probability zero.
        sparse = NGramModel.fit([np.array([1, 2, 1])], order=2, num_states=3, smoothing=0.0,
                                backoff=1.0)
        assert bool(jnp.all(sparse.table[:, 0] == 0))
        np.testing.assert_allclose(sparse.table.sum(-1), 1.0)


def test_ngram_state_is_the_last_tokens_and_lift_agrees():
    model = random_ngram(0, 3, 4)
    lifted = model.as_finite_state()
    wider = model.as_finite_state(4)
    assert (lifted.num_contexts, wider.num_contexts) == (16, 256)
    sequences = np.random.default_rng(2).integers(0, 4, size=(50, 7)).astype(np.int32)

    def run(m, seq):
        def step(state, token):
            return m.update(state, token), m.probs(state)
        return jax.lax.scan(step, m.init_state(), seq)

    final, rows = jax.jit(jax.vmap(lambda s: run(model, s)))(sequences)
    padded = np.concatenate([np.zeros((50, 2), np.int32), sequences], axis=1)
    np.testing.assert_array_equal(final, padded[:, -2] * 4 + padded[:, -1])
    for other in (lifted, wider):
        _, other_rows = jax.jit(jax.vmap(lambda s, m=other: run(m, s)))(sequences)
        np.testing.assert_array_equal(other_rows, rows)  # same rows, gathered from one table


def test_unigram_and_bigram_lift():
    unigram = random_ngram(1, 1, 3)
    assert unigram.as_finite_state().num_contexts == 1
    assert int(unigram.update(unigram.init_state(), 2)) == 0
    bigram = random_ngram(1, 2, 3).as_finite_state()
    np.testing.assert_array_equal(bigram.next_state, np.tile(np.arange(3), (3, 1)))


def test_from_markov_chain_reproduces_the_chain():
    draft, _ = markov_pair()  # T = 5
    lifted = FiniteStateModel.from_markov_chain(draft)
    assert lifted.num_contexts == 1 + 5 * 4
    state = lifted.init_state()
    np.testing.assert_array_equal(lifted.probs(state), draft.init)
    for n, token in enumerate([2, 0, 3, 1, 0, 2]):  # the last one past the horizon
        state = lifted.update(state, token)
        expected = draft.trans[min(n, 4), token]
        np.testing.assert_array_equal(lifted.probs(state), expected)
    with pytest.raises(ValueError, match="stationary"):
        FiniteStateModel.from_markov_chain(draft, stationary=True)


# ----------------------------------------------------------------------------- validation


def test_validation_errors_name_the_argument():
    with pytest.raises(ValueError, match="order"):
        NGramModel.fit(TOY, order=0, num_states=3)
    with pytest.raises(ValueError, match="sequences"):
        NGramModel.fit([np.array([0, 3])], order=2, num_states=3)
    with pytest.raises(ValueError, match="sequences"):
        NGramModel.fit([np.array([0.5, 1.0])], order=2, num_states=3)
    with pytest.raises(ValueError, match="smoothing"):
        NGramModel.fit(TOY, order=2, num_states=3, smoothing=-1)
    with pytest.raises(ValueError, match="backoff"):
        NGramModel.fit(TOY, order=2, num_states=3, backoff=0.0)
    with pytest.raises(ValueError, match="order"):
        NGramModel.fit(TOY, order=7, num_states=32)  # 32**7 entries
    with pytest.raises(ValueError, match="table"):
        NGramModel(jnp.full((4, 3), 1 / 3), 2)  # needs 3 rows
    with pytest.raises(ValueError, match="table"):
        NGramModel(jnp.full((3, 3), 0.5), 2)  # rows do not sum to one
    model = random_ngram(0, 3, 4)
    with pytest.raises(ValueError, match="context_length"):
        model.as_finite_state(1)
    with pytest.raises(ValueError, match="context_length"):
        random_ngram(0, 2, 32).as_finite_state(5)  # 32**6 > 2**26
    with pytest.raises(ValueError, match="next_state"):
        FiniteStateModel(0, jnp.full((2, 3), 2), jnp.full((2, 3), 1 / 3))
    with pytest.raises(ValueError, match="start"):
        FiniteStateModel(2, jnp.zeros((2, 3), jnp.int32), jnp.full((2, 3), 1 / 3))

    draft, target = random_ngram(0, 2, 3), random_ngram(1, 2, 4)
    with pytest.raises(ValueError, match="same number of states V"):
        specjax.decode(KEY, make(SD, None), draft, target, 10, horizon=3)
    draft, target = random_ngram(0, 2, 3), random_ngram(1, 3, 3)
    for horizon in (0, -1, 2.0):
        with pytest.raises(ValueError, match="horizon"):
            specjax.decode(KEY, make(SD, None), draft, target, 10, horizon=horizon)
        with pytest.raises(ValueError, match="horizon"):
            specjax.exact(make(SD, None), draft.as_finite_state(2), target.as_finite_state(), horizon=horizon)
    with pytest.raises(ValueError, match="num_chains"):
        specjax.decode(KEY, make(SD, None), draft, target, 0, horizon=3)
    with pytest.raises(ValueError, match="lookahead"):
        specjax.decode(KEY, make(SD, 0), draft, target, 10, horizon=3)
    with pytest.raises(ValueError, match="both be MarkovChains or both other"):
        specjax.decode(KEY, make(SD, None), draft, uniform_chain(3, 5), 10, horizon=3)
    with pytest.raises(ValueError, match="FiniteStateModel"):
        specjax.exact(make(SD, None), draft, target, horizon=3)
    with pytest.raises(ValueError, match="share"):  # S = 3 and S = 9
        specjax.exact(make(SD, None), draft.as_finite_state(), target.as_finite_state(), horizon=3)
    other = FiniteStateModel(0, jnp.zeros((9, 3), jnp.int32), target.as_finite_state().table)
    with pytest.raises(ValueError, match="next_state"):
        specjax.exact(make(SD, None), draft.as_finite_state(2), other, horizon=3)


# ----------------------------------------------------------------- the engines pinned together


MARKOV_CASES = {  # name: (the decoder's keyword arguments, lookahead)
    "sd": (dict(), None),
    "sd_k2": (dict(), 2),
    "batch3": (dict(num_drafts=3), None),
    "batch2_k2": (dict(num_drafts=2), 2),
    "biased": (dict(epsilon=0.1), None),
    "biased_k1": (dict(epsilon=0.1), 1),
}


def _markov_case(name, draft, target):
    """(rule, lookahead, extra, Markov exact theory) of one case."""
    kwargs, lookahead = MARKOV_CASES[name]
    if "num_drafts" in kwargs:
        rule, extra, exact = ("batch", kwargs["num_drafts"]), (), specjax.BatchSpeculative
    elif "epsilon" in kwargs:
        rule, extra, exact = ("biased", kwargs["epsilon"]), (), specjax.BiasedSpeculative
    else:
        rule, extra, exact = SD, (), specjax.Speculative
    return (rule, lookahead, extra,
            lambda: specjax.exact(exact(lookahead=lookahead, **kwargs), draft, target))


@pytest.mark.parametrize("name", ["sd", "sd K=3", "batch M=3", "biased eps=0.1"])
def test_simulate_models_equals_the_markov_samplers_token_for_token(name):
    """The engines agree token for token on the same rows and key (position-indexed lift of a
    non-stationary chain; the stationary lift is pinned by the exact tests). The Markov side is
    sampler_cases' ``instance()`` at 3,000 chains with its cases' decoders: test_scale's and
    test_decoders' programs (cache hits across the suite)."""
    draft, target = instance()
    d_fs = FiniteStateModel.from_markov_chain(draft)
    t_fs = FiniteStateModel.from_markov_chain(target)
    decoder = CASES[name] if name in CASES else specjax.BiasedSpeculative(0.1)
    expected = specjax.decode(KEY, decoder, draft, target, 3000)
    trace = specjax.decode(KEY, decoder, d_fs, t_fs, 3000, horizon=draft.horizon)
    for field, got, want in zip(trace._fields, trace, expected):
        np.testing.assert_array_equal(got, want, err_msg=f"{name}: {field}")


def float64_pair(seed, stationary=False):
    """``conftest.random_pair`` of ``markov_pair``'s shapes (V = 4, T = 5) as float64 chains,
    every position's rows the first's if ``stationary`` (a float64 ``jax.random.dirichlet`` draw
    would compile a sampler of its own, about 1 s of CPU)."""
    pair = random_pair(seed, 4, 5)
    if stationary:
        pair = [(init, np.repeat(trans[:1], 5, axis=0)) for init, trans in pair]
    return tuple(chain(x) for x in pair)


EXACT_CASES = [(name, False) for name in MARKOV_CASES] + [("batch2_k2", True)]


@pytest.mark.parametrize("name, stationary", EXACT_CASES,
                         ids=[f"{n}{'_stationary' if s else ''}" for n, s in EXACT_CASES])
def test_exact_models_equals_the_markov_theory(x64, name, stationary):
    draft, target = float64_pair(seed=2, stationary=stationary)
    d_fs = FiniteStateModel.from_markov_chain(draft, stationary=stationary)
    t_fs = FiniteStateModel.from_markov_chain(target, stationary=stationary)
    rule, lookahead, extra, exact = _markov_case(name, draft, target)
    got = specjax.exact(make(rule, lookahead), d_fs, t_fs, horizon=5)
    assert got.rejected.dtype == jnp.float64
    for field, a, b in zip(got._fields, got, exact()):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-10, err_msg=f"{name}: {field}")


def test_exact_models_edge_cases_are_finite_with_gradients(x64):
    (init, p), (_, q) = edge_pair()
    draft = FiniteStateModel.from_markov_chain(specjax.MarkovChain(init, p))
    target = FiniteStateModel.from_markov_chain(specjax.MarkovChain(init, q))
    markov = specjax.exact(specjax.BatchSpeculative(3, lookahead=2), specjax.MarkovChain(init, p),
                           specjax.MarkovChain(init, q))
    for rule, lookahead in [(SD, None), (("batch", 3), 2)]:
        def cost(table_p, table_q, rule=rule, lookahead=lookahead):
            d = FiniteStateModel(int(draft.start), draft.next_state, table_p)
            t = FiniteStateModel(int(target.start), target.next_state, table_q)
            out = specjax.exact(make(rule, lookahead), d, t, horizon=4)
            return out.expected_rejections + out.expected_calls + jnp.sum(out.acceptance_rate)
        # One compiled program per case (the gradient op by op compiled about 20 each).
        value, grads = jax.jit(jax.value_and_grad(cost, argnums=(0, 1)))(draft.table,
                                                                          target.table)
        assert np.isfinite(value) and all(np.isfinite(g).all() for g in grads), (rule, lookahead)
    got = specjax.exact(make(("batch", 3), 2), draft, target, horizon=4)
    np.testing.assert_allclose(got.expected_rejections, markov.expected_rejections, atol=1e-12)


def test_exact_gradient_matches_finite_differences(x64):
    draft, target = random_ngram(0, 2, 3, 0.0), random_ngram(1, 3, 3, 0.0)

    def cost(logits):
        d = NGramModel(jax.nn.softmax(logits, -1), 2).as_finite_state(2)
        out = specjax.exact(make(("batch", 2), 2), d, target.as_finite_state(), horizon=4)
        return out.expected_calls

    logits = jnp.log(draft.table)
    direction = jnp.asarray(np.random.default_rng(0).normal(size=logits.shape))
    # One program for the gradient and both evaluations (its values at logits +- h direction).
    value_and_grad = jax.jit(jax.value_and_grad(cost))
    _, grad = value_and_grad(logits)
    h = 1e-6
    numeric = (value_and_grad(logits + h * direction)[0]
               - value_and_grad(logits - h * direction)[0]) / (2 * h)
    np.testing.assert_allclose(jnp.sum(grad * direction), numeric, rtol=1e-6)


# ----------------------------------------------------------------- n-grams: Monte Carlo vs exact


def target_law(model: NGramModel, length: int) -> dict:
    """The target's exact law of ``(x_0, .., x_{length-1})``, by enumeration."""
    table = np.asarray(model.table, np.float64)
    law = {}
    for seq in itertools.product(range(model.num_states), repeat=length):
        state, prob = 0, 1.0
        for token in seq:
            prob *= table[state, token]
            state = int(model.update(state, token))
        if prob > 0:
            law[seq] = prob
    return law


NGRAM_CASES = [  # (rule, lookahead, unbiased)
    (SD, None, True),
    (SD, 2, True),
    (("batch", 3), None, True),
    ("biased", 2, False),
]


@pytest.mark.parametrize("rule, lookahead, unbiased", NGRAM_CASES,
                         ids=["sd", "sd_k2", "batch3", "biased_k2"])
def test_ngram_sampler_matches_exact_and_target_law(rule, lookahead, unbiased):
    v, horizon, chains = 4, 6, 20_000
    draft, target = random_ngram(10, 2, v), random_ngram(11, 3, v)
    if rule == "biased":
        rule = ("biased", 0.1)
    with jax.enable_x64(True):
        d64, t64 = random_ngram(10, 2, v), random_ngram(11, 3, v)  # the same rows in float64
        exact = specjax.exact(make(rule, lookahead), d64.as_finite_state(2),
                              t64.as_finite_state(), horizon=horizon)
        exact = jax.tree_util.tree_map(np.asarray, exact)
        if unbiased:  # the output's marginals are the target's
            np.testing.assert_allclose(exact.marginals, target_marginals(t64, horizon),
                                       atol=1e-12)
    trace = specjax.decode(jax.random.key(7), make(rule, lookahead), draft, target, chains,
                           horizon=horizon)
    what = f"{rule[0]} K={lookahead}"
    assert_mean(trace.num_rejections, float(exact.expected_rejections), f"{what}: rejections")
    assert_mean(trace.num_calls, float(exact.expected_calls), f"{what}: calls")
    final = np.bincount(np.asarray(trace.tokens[:, -1]), minlength=v)
    assert_law(dict(enumerate(final)), dict(enumerate(exact.marginals[-1])), chains,
               f"{what}: x_T against the exact marginal")
    if unbiased:
        assert_law(count_rows(np.asarray(trace.tokens[:, :4])), target_law(target, 4), chains,
                   f"{what}: (x_0..x_3) against the target")


def target_marginals(model, horizon):
    """The laws of ``x_0..x_T`` under the target alone (autoregressive decoding)."""
    fs = model.as_finite_state()
    out = specjax.exact(make(("autoregressive",), 0), fs, fs, horizon=horizon)
    assert float(out.expected_rejections) == 0 and float(out.expected_calls) == horizon
    assert float(jnp.sum(out.verified)) == 0
    return out.marginals


def test_ngram_protocol_equals_its_lift_and_is_deterministic():
    draft, target = random_ngram(3, 2, 4), random_ngram(4, 3, 4)
    # Batch SD, 20,000 chains, horizon 6 on these shapes: the n-gram program of
    # test_ngram_sampler_matches_exact_and_target_law[batch3] (compiled once, there).
    batch = specjax.BatchSpeculative(3)
    direct = specjax.decode(KEY, batch, draft, target, 20_000, horizon=6)
    lifted = specjax.decode(KEY, batch, draft.as_finite_state(2), target.as_finite_state(),
                            20_000, horizon=6)
    again = specjax.decode(KEY, batch, draft, target, 20_000, horizon=6)
    fewer = specjax.decode(KEY, batch, draft, target, 100, horizon=6)
    for a, b, c, d in zip(direct, lifted, again, fewer):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)
        np.testing.assert_array_equal(a[:100], d)  # chain c depends on its index alone
    assert direct.tokens.dtype == jnp.int32 and direct.tokens.shape == (20_000, 7)
    np.testing.assert_array_equal(direct.num_rejections, direct.rejected.sum(-1))
    np.testing.assert_array_equal(direct.num_calls, direct.new_call.sum(-1))


def test_new_values_do_not_recompile():
    draft, target = random_ngram(5, 2, 3), random_ngram(6, 3, 3)
    sd = specjax.Speculative()
    simulate = specjax.sampling.models._simulate_models
    forward = specjax.theory.finite_state.forward_finite_state
    # 300 chains, horizon 6, K = 3: the program of test_public_samplers_take_protocol_models[sd]
    # and test_public_entry_points_validate_models_and_horizon (compiled once, here).
    specjax.decode(KEY, specjax.Speculative(3), draft, target, 300, horizon=6)
    specjax.exact(sd, draft.as_finite_state(2), target.as_finite_state(), horizon=4)
    sim_before, exact_before = simulate._cache_size(), forward._cache_size()
    draft2, target2 = random_ngram(7, 2, 3), random_ngram(8, 3, 3)
    specjax.decode(jax.random.key(1), specjax.Speculative(3), draft2, target2, 300, horizon=6)
    specjax.exact(sd, draft2.as_finite_state(2), target2.as_finite_state(), horizon=4)
    assert simulate._cache_size() == sim_before
    assert forward._cache_size() == exact_before


# ----------------------------------------------------------------------------- the demo


@pytest.mark.slow  # a script end to end, as tests/test_scripts.py
def test_ngram_demo_tiny(capsys):
    """The script end to end with SD and the greedy draft (its two code paths). Batch SD on
    n-grams, simulated against exact, is test_ngram_sampler_matches_exact_and_target_law[batch3]
    (20,000 chains, and the law of x_T and of (x_0..x_3) too)."""
    demo = import_script("ngram_demo")
    rows = demo.main(["--max-bytes", "60000", "--states", "6", "--horizon", "6",
                      "--num-chains", "2000", "--decoders", "k2,g4"])
    assert [r["decoder"] for r in rows] == ["SD, K = 2", "greedy draft, K = 4"]
    for row in rows:
        for what in ("rejections", "calls"):
            se = row[f"{what}_se"]
            assert abs(row[f"simulated_{what}"] - row[f"exact_{what}"]) <= 4.5 * se + 1e-9, row
        assert 1 <= row["acceleration"] <= 6
    assert rows[0]["acceleration"] <= 3 + 1e-9  # a call with K = 2 emits at most 3 tokens
    assert "T/E[calls]" in capsys.readouterr().out



# ----------------------------------------------------------------------------- public entry points


def _sampler_cases(draft, target):
    return {
        "sd": (specjax.speculative_decoding, (draft, target), dict(lookahead=3), SD, ()),
        "batch wor": (specjax.batch_speculative_decoding, (draft, target),
                      dict(num_drafts=2, replacement=False), ("batch_wor", 2), ()),
        "biased": (specjax.biased_speculative_decoding, (draft, target), dict(epsilon=0.1),
                   ("biased", 0.1), ()),
        "autoregressive": (specjax.autoregressive_decoding, (target,), {},
                           ("autoregressive",), ()),
    }


@pytest.mark.parametrize("name", ["sd", "batch wor", "biased", "autoregressive"])
def test_public_samplers_take_protocol_models(name):
    """``specjax.<sampler>(..., horizon=T)`` on n-grams is ``simulate_models`` with the sampler's
    rule, token for token."""
    draft, target = random_ngram(1, 2, 3), random_ngram(2, 3, 3)
    sampler, models, kw, rule, extra = _sampler_cases(draft, target)[name]
    got = sampler(KEY, *models, 300, horizon=6, **kw)
    lookahead = kw.get("lookahead")
    want = specjax.decode(KEY, make(rule, lookahead), models[0], models[-1], 300, horizon=6)
    for field in got._fields:
        np.testing.assert_array_equal(getattr(got, field), getattr(want, field), err_msg=field)


def test_public_exact_functions_take_finite_state_models(x64):
    draft = random_ngram(1, 2, 3).as_finite_state(2)
    target = random_ngram(2, 3, 3).as_finite_state(2)
    exact = specjax.exact(specjax.BatchSpeculative(2, replacement=False, lookahead=3), draft,
                          target, horizon=6)
    want = specjax.exact(make(("batch_wor", 2), 3), draft, target, horizon=6)
    for field in exact._fields:
        np.testing.assert_allclose(getattr(exact, field), getattr(want, field), atol=1e-14)
    want_sd = specjax.exact(make(SD, None), draft, target, horizon=6)
    np.testing.assert_allclose(specjax.expected_rejections(draft, target, horizon=6),
                               want_sd.expected_rejections, atol=1e-14)
    np.testing.assert_allclose(specjax.expected_calls(draft, target, horizon=6),
                               want_sd.expected_calls, atol=1e-14)


def test_public_entry_points_validate_models_and_horizon():
    draft, target = random_ngram(1, 2, 3), random_ngram(2, 3, 3)
    with pytest.raises(ValueError, match="horizon must be given"):
        specjax.speculative_decoding(KEY, draft, target, 10)
    with pytest.raises(ValueError, match="horizon must be a positive integer"):
        specjax.speculative_decoding(KEY, draft, target, 10, horizon=0)
    # Protocol models run sharded and through the counts-only path, like Markov chains (300
    # chains, horizon 6, K = 3: the unsharded program is test_new_values_do_not_recompile's).
    plain = specjax.speculative_decoding(KEY, draft, target, 300, horizon=6, lookahead=3)
    sharded = specjax.speculative_decoding(KEY, draft, target, 300, horizon=6, lookahead=3,
                                           sharding=specjax.chain_sharding())
    np.testing.assert_array_equal(plain.tokens, sharded.tokens)
    counts = specjax.decoding_statistics(KEY, specjax.Speculative(3), draft, target, 300,
                                         horizon=6, chunk_size=128)
    np.testing.assert_array_equal(counts.num_rejections, plain.num_rejections)
    np.testing.assert_array_equal(counts.rejected, np.asarray(plain.rejected).sum(0))
    with pytest.raises(ValueError, match="BlockVerification does not support Monte Carlo"):
        specjax.decode(KEY, specjax.BlockVerification(2), draft, target, 10, horizon=3)
    with pytest.raises(ValueError, match="BlockVerification has no exact values"):
        specjax.exact(specjax.BlockVerification(2), draft.as_finite_state(2),
                      target.as_finite_state(2), horizon=3)
    with pytest.raises(ValueError, match="draft must be a specjax.MarkovChain or an "
                                         "autoregressive model"):
        specjax.speculative_decoding(KEY, "draft", target, 10, horizon=3)
    with pytest.raises(ValueError, match="both be MarkovChains or both other"):
        specjax.speculative_decoding(KEY, uniform_chain(3, 5), target, 10, horizon=3)
    with pytest.raises(ValueError, match="horizon must be given"):
        specjax.expected_rejections(draft.as_finite_state(2), target.as_finite_state(2))
    with pytest.raises(ValueError, match="share their state space"):
        specjax.expected_rejections(draft.as_finite_state(1), target.as_finite_state(2),
                                    horizon=3)
    chain_d, chain_t = instance()  # T = 12
    with pytest.raises(ValueError, match="horizon is the chains' own T"):
        specjax.speculative_decoding(KEY, chain_d, chain_t, 10, horizon=3)
    with pytest.raises(ValueError, match="horizon is the chains' own T"):
        specjax.expected_rejections(chain_d, chain_t, horizon=3)
    # 3,000 chains: the program of test_simulate_models_equals_the_markov_samplers_token_for_
    # token[sd] (and test_scale's).
    plain = specjax.speculative_decoding(KEY, chain_d, chain_t, 3000)
    same = specjax.speculative_decoding(KEY, chain_d, chain_t, 3000, horizon=chain_t.horizon)
    np.testing.assert_array_equal(plain.tokens, same.tokens)


# ----------------------------------------------------------------------------- greedy drafts


def test_greedy_draft_of_every_model_kind():
    ngram = random_ngram(4, 3, 3)
    greedy = specjax.models.greedy_draft(ngram)
    assert isinstance(greedy, NGramModel) and greedy.order == 3
    np.testing.assert_array_equal(greedy.table, np.eye(3)[np.argmax(ngram.table, -1)])
    lifted = specjax.models.greedy_draft(ngram.as_finite_state())
    assert isinstance(lifted, FiniteStateModel)
    np.testing.assert_array_equal(lifted.table, greedy.as_finite_state().table)
    wrapped = specjax.models.greedy_draft(Wrapped(ngram))
    assert isinstance(wrapped, specjax.models.GreedyModel)
    state = wrapped.update(wrapped.init_state(), 2)
    np.testing.assert_array_equal(wrapped.probs(state), greedy.probs(greedy.update(
        greedy.init_state(), 2)))
    with pytest.raises(ValueError, match="model must be a specjax.MarkovChain or an"):
        specjax.models.greedy_draft("ngram")


@jax.tree_util.register_pytree_node_class
class Wrapped:
    """A user's own model of the protocol (delegating to an n-gram)."""

    def __init__(self, inner):
        self.inner = inner

    def tree_flatten(self):
        return (self.inner,), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)

    num_states = property(lambda self: self.inner.num_states)

    def init_state(self):
        return self.inner.init_state()

    def probs(self, state):
        return self.inner.probs(state)

    def update(self, state, token):
        return self.inner.update(state, token)


def test_greedy_ngram_draft_sampler_matches_exact():
    """n-gram lookup drafting: a greedy bigram draft for a trigram target, exact E[N_rej] and
    E[calls] (lifted to the trigram's contexts) against the public sampler (4.5 SE)."""
    draft, target = random_ngram(5, 2, 4, zero_fraction=0.0), random_ngram(6, 3, 4)
    greedy = specjax.models.greedy_draft(draft)
    exact = specjax.exact(specjax.Speculative(3), greedy.as_finite_state(2),
                          target.as_finite_state(2), horizon=12)
    trace = specjax.speculative_decoding(jax.random.key(8), greedy, target, 40_000, horizon=12,
                                         lookahead=3)
    assert_mean(trace.num_rejections, float(exact.expected_rejections), "greedy rejections")
    assert_mean(trace.num_calls, float(exact.expected_calls), "greedy calls")


class _Unregistered:
    """A protocol model that is not a JAX pytree."""

    num_states = 3

    def init_state(self):
        return jnp.zeros((), jnp.int32)

    def probs(self, state):
        return jnp.full(3, 1 / 3)

    def update(self, state, token):
        return state


def test_protocol_models_are_validated_before_any_work():
    ngram = random_ngram(1, 2, 3)
    with pytest.raises(ValueError, match="draft must be a JAX pytree"):
        specjax.speculative_decoding(KEY, _Unregistered(), ngram, 10, horizon=3)
    with pytest.raises(ValueError, match=r"target.probs\(state\) must return a float array "
                                         r"of shape \(num_states,\) = \(3,\)"):
        specjax.speculative_decoding(KEY, ngram, _ClaimsThreeStates(random_ngram(1, 2, 4)), 10,
                                     horizon=3)
    # Unflattening does not validate: a model with rows summing to 1.5, as a transformation
    # (or a careless tree_map) could make one.
    valid = FiniteStateModel(0, jnp.zeros((1, 3), jnp.int32), jnp.ones((1, 3)) / 3)
    unnormalised = jax.tree_util.tree_map(lambda x: 1.5 * x if x.dtype.kind == "f" else x, valid)
    with pytest.raises(ValueError, match=r"draft.probs\(init_state\(\)\)"):
        specjax.speculative_decoding(KEY, unnormalised, ngram.as_finite_state(1), 10, horizon=3)
    with pytest.raises(ValueError, match="draft must be a specjax.MarkovChain or an "
                                         "autoregressive model"):
        specjax.exact(specjax.BiasedSpeculative(0.1), None, None)
    with pytest.raises(ValueError, match="both be MarkovChains, or both FiniteStateModels"):
        specjax.expected_rejections(ngram, ngram, horizon=3)


@jax.tree_util.register_pytree_node_class
class _ClaimsThreeStates(Wrapped):
    """Returns rows of its inner model's width while claiming ``V = 3``."""

    num_states = 3
