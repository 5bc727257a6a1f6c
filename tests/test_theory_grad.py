"""Exact theory: gradients (finite at edge cases, equal to finite differences), jit/vmap, dtypes,
validation and compilation caching."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax.theory import values as theory
from conftest import chain
from conftest import edge_pair
from conftest import float64
from conftest import random_pair


OBJECTIVES = {
    "sd": lambda d, t: specjax.expected_rejections(d, t),
    "sd K=2": lambda d, t: specjax.expected_rejections(d, t, lookahead=2),
    "calls K=2": lambda d, t: specjax.expected_calls(d, t, lookahead=2),
    "calls": lambda d, t: specjax.expected_calls(d, t),
    "batch M=1": lambda d, t: specjax.batch_expected_rejections(d, t, num_drafts=1),
    "batch M=3": lambda d, t: specjax.batch_expected_rejections(d, t, num_drafts=3),
    "batch M=40": lambda d, t: specjax.batch_expected_rejections(d, t, num_drafts=40),
    "batch M=inf": lambda d, t: specjax.batch_expected_rejections(d, t, num_drafts=math.inf),
    "batch M=3 K=2": lambda d, t: specjax.batch_expected_rejections(d, t, num_drafts=3,
                                                                    lookahead=2),
    "biased opt": lambda d, t: specjax.exact(specjax.BiasedSpeculative(0.1), d,
                                             t).expected_rejections,
    "biased uno K=2": lambda d, t: specjax.exact(
        specjax.BiasedSpeculative(0.1, residual="target", lookahead=2), d, t).expected_rejections,
    "biased standard": lambda d, t: specjax.exact(
        specjax.BiasedSpeculative(0.1, residual="standard"), d, t).expected_rejections,
    "opt marginals": lambda d, t: jnp.sum(jnp.sin(
        specjax.exact(specjax.BiasedSpeculative(0.2), d, t).marginals)),
    "kl opt": lambda d, t: specjax.theory.sequence_kl(
        specjax.theory.biased_output_chain(d, t, epsilon=0.2), t),
}


@functools.partial(jax.jit, static_argnums=0)
def value_and_grad(name, draft, target):
    """``OBJECTIVES[name](draft, target)`` and its gradients in both chains: one compiled
    program per objective, size and dtype, shared by the tests below."""
    return jax.value_and_grad(OBJECTIVES[name], argnums=(0, 1))(draft, target)


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
@pytest.mark.parametrize("use_x64", [False, True])
def test_gradients_finite_at_edge_cases(name, use_x64):
    with jax.enable_x64(use_x64):
        draft, target = edge_pair()
        dtype = jnp.float64 if use_x64 else jnp.float32
        d = specjax.MarkovChain(jnp.asarray(draft[0], dtype), jnp.asarray(draft[1], dtype))
        t = specjax.MarkovChain(jnp.asarray(target[0], dtype), jnp.asarray(target[1], dtype))
        if name == "kl opt":  # KL(output || target) is infinite here (disjoint rows): use p = q
            t = d
        # The value from the gradient's own program (a separate call of the objective compiled another).
        value, (g_d, g_t) = value_and_grad(name, d, t)
        assert value.dtype == dtype
        assert bool(jnp.isfinite(value))
        for leaf in jax.tree_util.tree_leaves((g_d, g_t)):
            assert leaf.dtype == dtype
            assert bool(jnp.all(jnp.isfinite(leaf))), name


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_gradients_through_logits_finite_with_minus_inf(name):
    draft, target = edge_pair()
    with np.errstate(divide="ignore"):
        d_logits = (jnp.log(jnp.asarray(draft[0], jnp.float32)),
                    jnp.log(jnp.asarray(draft[1], jnp.float32)))
        t_logits = (jnp.log(jnp.asarray(target[0], jnp.float32)),
                    jnp.log(jnp.asarray(target[1], jnp.float32)))

    def chains(dl, tl):
        d = specjax.MarkovChain.from_logits(*dl)
        return d, d if name == "kl opt" else specjax.MarkovChain.from_logits(*tl)

    # The chain rule split at the chains: the objective's gradient in them is the program of
    # test_gradients_finite_at_edge_cases[False-name]; the softmax's pullback runs op by op.
    (d, t), pullback = jax.vjp(chains, d_logits, t_logits)
    grads = pullback(value_and_grad(name, d, t)[1])
    for leaf in jax.tree_util.tree_leaves(grads):
        assert bool(jnp.all(jnp.isfinite(leaf))), name


SINGLE_TOKEN = {
    "tv": lambda p, q: specjax.tv_distance(p, q),
    "residual": lambda p, q: jnp.sum(jnp.sin(specjax.speculative_residual(p, q))),
    "batch improvement M=4": lambda p, q: specjax.batch_improvement(p, q, num_drafts=4),
    "batch residual M=30": lambda p, q: jnp.sum(jnp.cos(
        specjax.decoders.batch_residual_mass(p, q, num_drafts=30))),
    "loss star": lambda p, q: specjax.tv_loss_star(
        p, q, specjax.acceptance_probability(p, q, epsilon=0.1)),
    "rejection probability": lambda p, q: specjax.rejection_probability(
        p, specjax.acceptance_probability(p, q, epsilon=0.1)),
    "optimal residual": lambda p, q: jnp.sum(jnp.sin(specjax.optimal_residual(
        p, q, specjax.acceptance_probability(p, q, epsilon=0.1)))),
    "pareto": lambda p, q: jnp.sum(specjax.theory.pareto_front(p, q, jnp.array([0.0, 0.1, 0.5]))
                                   .loss_star),
}


@pytest.mark.parametrize("name", sorted(SINGLE_TOKEN))
def test_single_token_gradients_finite_at_edge_cases(name):
    draft, target = edge_pair()
    p = jnp.asarray(draft[1][:2].reshape(-1, 4), jnp.float32)
    q = jnp.asarray(target[1][:2].reshape(-1, 4), jnp.float32)
    fn = SINGLE_TOKEN[name]
    grads = jax.grad(lambda p, q: jnp.sum(fn(p, q)), argnums=(0, 1))(p, q)
    for g in grads:
        assert bool(jnp.all(jnp.isfinite(g))), name


@pytest.mark.parametrize("name", sorted(SINGLE_TOKEN))
def test_single_token_gradients_finite_at_tiny_probabilities(name):
    """Probabilities far below float32's 1e-19 (where the default derivative of a division,
    ``den ** -2``, overflows), as a softmax of very negative logits produces: both rows tiny at
    the same token, the draft tiny where the target is not, and the reverse. The three row pairs
    are repeated to the 8 rows of ``test_single_token_gradients_finite_at_edge_cases`` (each
    row's gradient is its own), so that the two tests share their op-by-op programs."""
    tiny = np.float32(1e-30)
    p = np.array([[0.5, 0.5 - tiny, tiny, 0.0], [tiny, 1.0, 0.0, tiny],
                  [0.25, 0.25, 0.5 - 2e-30, 2e-30]], np.float32)
    q = np.array([[0.5, 0.5 - 2e-30, 2e-30, 0.0], [0.5, 0.5, 0.0, 0.0],
                  [0.25, 0.25, 0.5, 0.0]], np.float32)
    p, q = (jnp.asarray(np.concatenate([x, x, x[:2]])) for x in (p, q))
    fn = SINGLE_TOKEN[name]
    grads = jax.grad(lambda p, q: jnp.sum(fn(p, q)), argnums=(0, 1))(p, q)
    for g in grads:
        assert bool(jnp.all(jnp.isfinite(g))), name


def tangent(rng, shape):
    """A random direction that keeps every row on the simplex (rows sum to zero)."""
    v = rng.standard_normal(shape)
    return v - v.mean(-1, keepdims=True)


FD_CASES = ["sd", "sd K=2", "calls K=2", "batch M=3", "batch M=40", "batch M=3 K=2",
            "biased opt", "biased uno K=2", "opt marginals", "kl opt"]


@pytest.mark.parametrize("name", FD_CASES)
def test_gradients_match_central_differences(x64, name):
    """Interior random point, random tangent directions in draft and target, float64 (V = T = 4,
    the size of ``edge_pair``: the float64 programs are those of the edge-case tests)."""
    rng = np.random.default_rng(1)
    draft, target = random_pair(2, 4, 4)
    d, t = chain(draft), chain(target)
    # The values at the shifted points come from the same programs as the gradient (those of
    # test_gradients_finite_at_edge_cases[True-...]: same size, float64), not from a forward
    # program compiled for them alone.
    g_d, g_t = value_and_grad(name, d, t)[1]
    h = 1e-7  # small: log terms (KL) have large third derivatives near small probabilities
    for _ in range(3):
        dirs = [tangent(rng, x.shape) for x in (d.init, d.trans, t.init, t.trans)]

        def shifted(s):
            return value_and_grad(
                name, specjax.MarkovChain(d.init + s * dirs[0], d.trans + s * dirs[1]),
                specjax.MarkovChain(t.init + s * dirs[2], t.trans + s * dirs[3]))[0]

        fd = (float(shifted(h)) - float(shifted(-h))) / (2 * h)
        analytic = sum(float(jnp.sum(g * v)) for g, v in zip(
            (g_d.init, g_d.trans, g_t.init, g_t.trans), dirs))
        assert abs(fd - analytic) < 1e-6 * max(1.0, abs(fd)), (name, fd, analytic)


def test_gradient_through_logits_matches_central_differences(x64):
    rng = np.random.default_rng(3)
    shapes = [(4,), (4, 4, 4)]  # V = T = 4, as everywhere in this module
    d_logits = [jnp.asarray(rng.standard_normal(s)) for s in shapes]
    t_logits = [jnp.asarray(rng.standard_normal(s)) for s in shapes]

    def objective(dl, tl):
        """The value and gradient of batch_expected_rejections (M = 3) of the chains' logits:
        the chain rule split at the chains, their part the program of
        test_gradients_match_central_differences[batch M=3]; the softmax's pullback op by op.
        The values at the shifted points come from the same programs."""
        chains, pullback = jax.vjp(lambda dl, tl: (specjax.MarkovChain.from_logits(*dl),
                                                   specjax.MarkovChain.from_logits(*tl)), dl, tl)
        value, in_chains = value_and_grad("batch M=3", *chains)
        return value, pullback(in_chains)

    g_d, g_t = objective(d_logits, t_logits)[1]
    dirs_d = [jnp.asarray(rng.standard_normal(s)) for s in shapes]
    dirs_t = [jnp.asarray(rng.standard_normal(s)) for s in shapes]
    h = 1e-6

    def shifted(s):
        return float(objective([a + s * b for a, b in zip(d_logits, dirs_d)],
                               [a + s * b for a, b in zip(t_logits, dirs_t)])[0])

    fd = (shifted(h) - shifted(-h)) / (2 * h)
    analytic = sum(float(jnp.sum(g * v)) for g, v in zip(g_d + g_t, dirs_d + dirs_t))
    assert abs(fd - analytic) < 1e-6 * max(1.0, abs(fd))


def test_epsilon_gradient_matches_central_differences(x64):
    d, t = chain(random_pair(4, 4, 4)[0]), chain(random_pair(4, 4, 4)[1])

    def fn(eps):
        return specjax.exact(specjax.BiasedSpeculative(eps), d, t).expected_rejections

    # The values at both points from the gradient's programs (no forward program of their own).
    value_and_grad = jax.value_and_grad(fn)
    h = 1e-6
    fd = (float(value_and_grad(0.1 + h)[0]) - float(value_and_grad(0.1 - h)[0])) / (2 * h)
    grad = float(value_and_grad(0.1)[1])
    assert abs(grad - fd) < 1e-6
    assert grad < 0  # over-accepting more rejects less


# --- jit, vmap, dtypes -------------------------------------------------------------------------

def stacked_instances(num, num_states=4, horizon=4, dtype=jnp.float32):
    """``num`` random pairs stacked on a leading axis (V = T = 4, the size of ``edge_pair``, so
    that one instance's programs are those of the edge-case tests). Drawn with NumPy
    (``random_pair``, seeds ``0..num-1``): each ``num`` of a vmapped ``random_markov_chain``
    compiled a Dirichlet sampler of its own, for data these tests do not need from JAX."""
    pairs = [random_pair(seed, num_states, horizon) for seed in range(num)]

    def stack(which):
        init, trans = (np.stack([pair[which][k] for pair in pairs]).astype(dtype)
                       for k in (0, 1))
        return specjax.MarkovChain.tree_unflatten(None, (jnp.asarray(init), jnp.asarray(trans)))

    return stack(0), stack(1)


def test_vmap_over_instances_equals_loop():
    drafts, targets = stacked_instances(6)
    for fn in (OBJECTIVES["sd"], OBJECTIVES["batch M=3"], OBJECTIVES["sd K=2"],
               OBJECTIVES["biased opt"]):
        batched = jax.jit(jax.vmap(fn))(drafts, targets)
        looped = [fn(jax.tree_util.tree_map(lambda x: x[i], drafts),
                     jax.tree_util.tree_map(lambda x: x[i], targets)) for i in range(6)]
        np.testing.assert_allclose(np.asarray(batched), np.asarray(looped), rtol=1e-5)
    grads = jax.vmap(jax.grad(OBJECTIVES["batch M=3"]))(drafts, targets)
    assert grads.trans.shape == drafts.trans.shape
    assert bool(jnp.all(jnp.isfinite(grads.trans)))
    exact = jax.vmap(lambda d, t: specjax.exact(specjax.BatchSpeculative(2), d, t))(
        drafts, targets)
    assert exact.expected_rejections.shape == (6,) and exact.rejection_rate.shape == (6, 4)


def test_default_float32_and_float64_under_x64():
    d, t = stacked_instances(1)
    d, t = jax.tree_util.tree_map(lambda x: x[0], (d, t))
    assert specjax.expected_rejections(d, t).dtype == jnp.float32
    with jax.enable_x64(True):
        d64, t64 = float64(d, t)
        value64 = specjax.batch_expected_rejections(d64, t64, num_drafts=3)
        assert value64.dtype == jnp.float64
        value32 = specjax.batch_expected_rejections(d, t, num_drafts=3)
        assert abs(float(value64) - float(value32)) < 1e-5


def test_new_values_do_not_recompile():
    d, t = stacked_instances(3)
    pick = lambda i: jax.tree_util.tree_map(lambda x: x[i], (d, t))  # noqa: E731
    specjax.batch_expected_rejections(*pick(0), num_drafts=3)  # the edge-case tests' program
    before = theory._forward._cache_size()
    for i in (1, 2):
        specjax.batch_expected_rejections(*pick(i), num_drafts=3)
    assert theory._forward._cache_size() == before
    specjax.exact(specjax.BiasedSpeculative(0.1), *pick(0))
    after_first = theory._forward._cache_size()
    specjax.exact(specjax.BiasedSpeculative(0.3), *pick(1))
    assert theory._forward._cache_size() == after_first


# --- validation --------------------------------------------------------------------------------

def test_validation_messages():
    d, t = chain(random_pair(0, 3, 4)[0]), chain(random_pair(0, 3, 4)[1])
    other_t = chain(random_pair(0, 3, 5)[1])
    other_v = chain(random_pair(0, 4, 4)[1])
    with pytest.raises(ValueError, match="horizon T"):
        specjax.expected_rejections(d, other_t)
    with pytest.raises(ValueError, match="number of states V"):
        specjax.batch_expected_rejections(d, other_v, num_drafts=2)
    with pytest.raises(ValueError, match="num_drafts"):
        specjax.batch_expected_rejections(d, t, num_drafts=0)
    with pytest.raises(ValueError, match="num_drafts"):
        specjax.batch_expected_rejections(d, t, num_drafts=2.5)
    with pytest.raises(ValueError, match="lookahead"):
        specjax.expected_calls(d, t, lookahead=0)
    with pytest.raises(ValueError, match="epsilon"):
        specjax.exact(specjax.BiasedSpeculative(-0.1), d, t)
    with pytest.raises(ValueError, match="residual"):
        specjax.exact(specjax.BiasedSpeculative(0.1, residual="best"), d, t)
    with pytest.raises(ValueError, match="accept_prob"):
        specjax.exact(specjax.RejectionRule(None, lambda p, q, b: q), d, t)
    with pytest.raises(ValueError, match="target must be a specjax.MarkovChain"):
        specjax.expected_rejections(d, t.trans)
    drafts, targets = stacked_instances(2)
    with pytest.raises(ValueError, match="single chain"):
        specjax.expected_rejections(drafts, targets)
    with pytest.raises(ValueError, match="same shape"):
        specjax.theory.pareto_front(jnp.ones(3) / 3, jnp.ones(4) / 4, [0.1])
    with pytest.raises(ValueError, match="non-negative"):
        specjax.theory.pareto_front(jnp.ones(3) / 3, jnp.ones(3) / 3, [-0.1])
    with pytest.raises(ValueError, match="rows must sum to one"):
        specjax.theory.pareto_front(jnp.array([0.5, 0.6]), jnp.array([0.5, 0.5]), [0.1])
    with pytest.raises(ValueError, match="residual"):  # a residual with no mass where needed
        specjax.output_chain(specjax.RejectionRule(lambda p, q: 0.5 * jnp.ones_like(p),
                                                   lambda p, q, b: jnp.zeros_like(q)), d, t)


def test_sequence_kl_infinite_not_nan():
    """Decoding-UNO drafts tokens the target forbids: the KL is +inf, never NaN."""
    init = jnp.array([0.5, 0.5])
    t = specjax.MarkovChain(init, jnp.array([[[1.0, 0.0], [0.5, 0.5]]]))
    d = specjax.MarkovChain(init, jnp.array([[[0.5, 0.5], [0.5, 0.5]]]))
    out = specjax.theory.biased_output_chain(d, t, epsilon=0.2, residual="target")
    assert float(specjax.theory.sequence_kl(out, t)) == math.inf
    assert float(specjax.theory.sequence_kl(t, t)) == 0.0
    # An unreachable row with an infinite row-KL does not count (0 * inf is not NaN).
    a = specjax.MarkovChain(jnp.array([1.0, 0.0]), jnp.array([[[1.0, 0.0], [0.5, 0.5]]]))
    b = specjax.MarkovChain(jnp.array([1.0, 0.0]), jnp.array([[[1.0, 0.0], [1.0, 0.0]]]))
    assert float(specjax.theory.sequence_kl(a, b)) == 0.0
