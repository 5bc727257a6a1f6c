"""Draft families, objectives and the optax tuner (issue 4)."""

import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import specjax
from conftest import chain
from conftest import edge_pair
from conftest import float64
from conftest import full_suite_only
from conftest import programs_compiled
from conftest import random_pair

V, T = 5, 12


def families(num_states=V, horizon=T):
    return [specjax.tuning.FullDraft(num_states, horizon),
            specjax.tuning.StationaryDraft(num_states, horizon),
            specjax.tuning.LowRankDraft(num_states, horizon, 2),
            specjax.tuning.ContextFreeDraft(num_states, horizon)]


def objectives():
    named = specjax.tuning.make_objective
    return [named("sd"), named("sd", lookahead=3), named("batch", num_drafts=3),
            named("batch", num_drafts=math.inf), named("calls", lookahead=3),
            specjax.tuning.biased_tradeoff(0.05, weight=2.0), specjax.tuning.kl_divergence()]


def target_chain(seed, num_states=V, horizon=T, zero_fraction=0.0):
    _, target = random_pair(seed, num_states, horizon, zero_fraction)
    return chain(target)


# --- families ------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", families(), ids=lambda f: f.name)
def test_family_chain_is_valid_and_has_its_structure(family):
    params = family.init(jax.random.key(0))
    draft = family.chain(params)
    specjax.MarkovChain(draft.init, draft.trans)  # validates rows (concrete arrays)
    assert draft.trans.shape == (T, V, V)
    trans = np.asarray(draft.trans)
    if family.name in ("stationary", "lowrank"):
        np.testing.assert_array_equal(trans, np.broadcast_to(trans[0], trans.shape))
    if family.name == "contextfree":
        np.testing.assert_array_equal(trans, np.broadcast_to(trans[:, :1], trans.shape))
    if family.name == "lowrank":
        logits = np.log(trans[0])
        centred = logits - logits.mean(axis=0, keepdims=True)
        centred -= centred.mean(axis=1, keepdims=True)
        assert np.linalg.matrix_rank(centred, tol=1e-4) <= family.rank
    uniform = family.chain(family.uniform())
    np.testing.assert_allclose(np.asarray(uniform.trans), 1.0 / V, rtol=1e-6)


def test_family_maps_compile_one_program_each(x64):
    """``init``, ``chain`` and ``spectral_start`` are one compiled program per family and
    shapes (called eagerly, each of their operations compiled a program of its own per shape),
    under ``jit`` and ``grad`` too, with the values of their formulas."""
    family = specjax.tuning.LowRankDraft(9, 5, rank=2)  # shapes no other test uses
    key = jax.random.key(3)
    out = {}
    assert programs_compiled(lambda: out.update(params=family.init(key, 0.5))) == 1
    assert programs_compiled(lambda: out.update(draft=family.chain(out["params"]))) == 1
    moved = {name: np.asarray(x) + 1.0 for name, x in out["params"].items()}
    assert programs_compiled(lambda: family.chain(moved)) == 0  # new values, same program
    u, w, bias = (np.asarray(out["params"][name]) for name in ("u", "w", "bias"))
    logits = u @ w + bias
    rows = np.exp(logits - logits.max(-1, keepdims=True))
    np.testing.assert_allclose(np.asarray(out["draft"].trans),
                               np.broadcast_to(rows / rows.sum(-1, keepdims=True), (5, 9, 9)),
                               rtol=1e-12)
    target = target_chain(4, num_states=9, horizon=5)
    assert programs_compiled(lambda: out.update(start=family.spectral_start(target))) == 1
    start = {name: np.asarray(x) for name, x in out["start"].items()}
    # The stationary forward-KL fit: each context's target rows averaged over the positions,
    # weighted by the target's law of the context (every context is reached here).
    init, trans = np.asarray(target.init), np.asarray(target.trans)
    laws = [init]
    for n in range(4):
        laws.append(laws[-1] @ trans[n])
    laws = np.stack(laws)  # (T, V): the law of x_{n-1}
    fit = np.einsum("na,nab->ab", laws, trans) / laws.sum(0)[:, None]
    fitted = np.log(fit + 1e-6)
    fitted -= fitted.mean(-1, keepdims=True)
    bias = fitted.mean(0)
    left, singular, right = np.linalg.svd(fitted - bias, full_matrices=False)
    np.testing.assert_allclose(start["bias"], bias, atol=1e-10)
    np.testing.assert_allclose(start["u"] @ start["w"],
                               (left[:, :2] * singular[:2]) @ right[:2], atol=1e-10)
    loss = lambda params: jnp.sum(family.chain(params).trans[0, 0] ** 2)  # noqa: E731
    np.testing.assert_allclose(jax.jit(jax.grad(loss))(out["params"])["bias"],
                               jax.grad(loss)(out["params"])["bias"], rtol=1e-12)


def test_family_validation():
    with pytest.raises(ValueError, match="family must be one of"):
        specjax.tuning.draft_family("nope", V, T)
    with pytest.raises(ValueError, match="rank"):
        specjax.tuning.LowRankDraft(V, T, 0)
    with pytest.raises(ValueError, match="rank must be at most num_states = 20"):
        specjax.tuning.LowRankDraft(20, 64, rank=50)
    with pytest.raises(ValueError, match="rank"):
        specjax.tuning.draft_family("lowrank", V, T, rank=V + 1)
    assert specjax.tuning.LowRankDraft(V, T, V).rank == V  # full rank: the stationary family
    with pytest.raises(ValueError, match="num_states"):
        specjax.tuning.StationaryDraft(0, T)
    family = specjax.tuning.StationaryDraft(V, T)
    with pytest.raises(ValueError, match="V = 4, T = 12"):
        specjax.tuning.kl_fit(family, target_chain(0, num_states=4))
    with pytest.raises(ValueError, match="target must be a specjax.MarkovChain"):
        specjax.tuning.kl_fit(family, np.eye(V))
    target = target_chain(0)
    with pytest.raises(ValueError, match=r"params must have shapes \(5, 5\)"):
        specjax.tune_draft(family, jnp.zeros((T, V, V)), target,
                           specjax.objective(specjax.Speculative()))
    with pytest.raises(ValueError, match="NaN or infinite"):
        specjax.tune_draft(family, jnp.full((V, V), jnp.nan), target,
                           specjax.objective(specjax.Speculative()))
    with pytest.raises(ValueError, match="num_steps"):
        specjax.tune_draft(family, family.uniform(), target,
                           specjax.objective(specjax.Speculative()), num_steps=0)
    with pytest.raises(ValueError, match="objective must be callable"):
        specjax.tune_draft(family, family.uniform(), target, "sd")
    with pytest.raises(ValueError, match="optimizer must be an optax"):
        specjax.tune_draft(family, family.uniform(), target,
                           specjax.objective(specjax.Speculative()),
                           optimizer=0.1)
    with pytest.raises(ValueError, match="num_drafts"):
        specjax.objective(specjax.BatchSpeculative(0))
    with pytest.raises(ValueError, match="epsilon"):
        specjax.tuning.biased_tradeoff(-0.1)
    with pytest.raises(ValueError, match="weight"):
        specjax.tuning.biased_tradeoff(0.1, weight=float("nan"))
    with pytest.raises(ValueError, match="lookahead"):
        specjax.objective(specjax.Speculative(0), "calls")
    with pytest.raises(ValueError, match="objective must be one of"):
        specjax.tuning.make_objective("tv")
    with pytest.raises(ValueError, match="scale"):
        family.init(jax.random.key(0), scale=float("nan"))
    with pytest.raises(ValueError, match="params must be a pytree of arrays"):
        specjax.tune_draft(family, [[0.0] * V] * V, target,
                           specjax.objective(specjax.Speculative()))
    with pytest.raises(ValueError, match="callback must be callable"):
        specjax.tune_draft(family, family.uniform(), target,
                           specjax.objective(specjax.Speculative()),
                           callback=3)
    # NumPy numbers and 0-d arrays are numbers too.
    assert specjax.tuning.biased_tradeoff(np.float32(0.25), weight=jnp.array(2.0)).epsilon == 0.25
    sd = specjax.tuning.make_objective("sd", lookahead=3)
    assert (sd.decoder, sd.quantity) == (specjax.Speculative(3), "rejections")


def test_objective_labels_and_names():
    assert [o.label for o in objectives()] == [
        "sd", "sd(K=3)", "batch(M=3)", "batch(M=inf)", "calls(K=3)",
        "biased(eps=0.05, lambda=2)", "kl"]
    for name in specjax.tuning.objectives.OBJECTIVES:
        assert specjax.tuning.make_objective(name).kind == name


# --- the KL-fit baseline -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["full", "stationary", "contextfree"])
def test_kl_fit_closed_form_is_stationary_point(x64, name):
    """The closed form is the forward-KL optimum: the KL gradient in the logits vanishes there,
    zeros of the target included (their logits are log(tiny))."""
    target = target_chain(1, zero_fraction=0.3)
    family = specjax.tuning.draft_family(name, V, T)
    fit = specjax.tuning.kl_fit(family, target)
    objective = specjax.tuning.kl_divergence()
    grad = jax.grad(lambda prm: objective(family.chain(prm), target))(fit)
    assert np.isfinite(np.asarray(grad)).all()
    np.testing.assert_allclose(np.asarray(grad), 0.0, atol=1e-12)
    # ... and no random draft of the family does better (drawn in float32 and cast: the
    # sampler programs of test_tuning_never_increases_its_objective, same family shapes).
    value = float(objective(family.chain(fit), target))
    for i in range(5):
        with jax.enable_x64(False):
            other = family.init(jax.random.key(i))
        other, = float64(other)
        assert value <= float(objective(family.chain(other), target))
    if name == "full":
        assert value == pytest.approx(0.0, abs=1e-12)
        assert float(specjax.expected_rejections(family.chain(fit), target)) < 1e-12


def test_stationary_kl_fit_formula(x64):
    """Target rows averaged with the target's marginals as weights, written out with NumPy."""
    target = target_chain(2)
    mu = np.asarray(specjax.marginals(target))[:-1]
    q = np.asarray(target.trans)
    want = np.einsum("na,nab->ab", mu, q) / mu.sum(0)[:, None]
    family = specjax.tuning.StationaryDraft(V, T)
    fit = family.chain(specjax.tuning.kl_fit(family, target))
    np.testing.assert_allclose(np.asarray(fit.trans[0]), want, rtol=1e-12)


def test_lowrank_kl_fit_of_full_rank_matches_stationary_closed_form(x64):
    """Cross-check of the numerical fit: with rank V the low-rank family is the stationary one."""
    target = target_chain(3)
    kl = specjax.tuning.kl_divergence()
    stationary = specjax.tuning.StationaryDraft(V, T)
    best = float(kl(stationary.chain(specjax.tuning.kl_fit(stationary, target)), target))
    lowrank = specjax.tuning.LowRankDraft(V, T, V)
    got = float(kl(lowrank.chain(specjax.tuning.kl_fit(lowrank, target, num_steps=1500)), target))
    assert best - 1e-12 <= got <= best * (1 + 1e-4)
    small = specjax.tuning.LowRankDraft(V, T, 1)
    assert float(kl(small.chain(specjax.tuning.kl_fit(small, target)), target)) >= best


# --- the tuner -----------------------------------------------------------------------------------


@pytest.mark.parametrize("objective", objectives(), ids=lambda o: o.label)
@pytest.mark.parametrize("family", families(), ids=lambda f: f.name)
def test_tuning_never_increases_its_objective(family, objective):
    target = target_chain(4)
    start = family.init(jax.random.key(1))
    result = specjax.tune_draft(family, start, target, objective, num_steps=60)
    history = np.asarray(result.history)
    assert history.shape == (61,) and np.isfinite(history).all()
    initial = float(objective(family.chain(start), target))
    assert history[0] == pytest.approx(initial, rel=1e-5)
    value = float(result.value)
    # The result is the best iterate, its value is the objective of the returned draft ...
    assert value == history.min() == history[int(result.best_step)]
    assert float(objective(result.draft, target)) == pytest.approx(value, rel=1e-5)
    assert value <= initial
    # ... and the optimiser really descends: 60 Adam steps remove a good part of the excess.
    assert value < initial - 0.05 * abs(initial)
    assert int(result.skipped) == 0
    for leaf in jax.tree_util.tree_leaves((result.params, result.final_params)):
        assert np.isfinite(np.asarray(leaf)).all()


def test_bad_step_size_still_never_increases_and_stays_finite():
    """SGD with a huge step overshoots: the best iterate is kept. With an infinite step the new
    parameters are not finite: every update is skipped, with a warning, and nothing moves."""
    family = specjax.tuning.StationaryDraft(V, T)
    target = target_chain(5)
    start = family.init(jax.random.key(2))
    result = specjax.tune_draft(family, start, target, specjax.objective(specjax.Speculative()),
                                num_steps=30,
                                optimizer=optax.sgd(1e4))
    assert float(result.value) <= float(result.history[0])
    assert np.isfinite(np.asarray(result.final_params)).all()
    with pytest.warns(RuntimeWarning, match="skipped 30 of 30 updates"):
        result = specjax.tune_draft(family, start, target, specjax.objective(specjax.Speculative()),
                                    num_steps=30, optimizer=optax.sgd(float("inf")))
    assert int(result.skipped) == 30
    np.testing.assert_array_equal(np.asarray(result.final_params), np.asarray(start))
    np.testing.assert_array_equal(np.asarray(result.params), np.asarray(start))


def _nan_gradient_objective(draft, target):
    p = draft.trans[0, 0, 0]
    return specjax.expected_rejections(draft, target) + 0.0 * jnp.sqrt(p - p)


def _nan_value_objective(draft, target):
    return specjax.expected_rejections(draft, target) * jnp.nan


def _infinite_once_moved(draft, target):
    """SD rejections at the uniform draft, +inf (with a finite gradient) anywhere else."""
    moved = jnp.abs(draft.trans[0, 0, 0] - 1.0 / V) > 1e-6
    return specjax.expected_rejections(draft, target) + jnp.where(moved, jnp.inf, 0.0)


def test_non_finite_gradient_updates_are_skipped():
    family = specjax.tuning.ContextFreeDraft(V, T)
    start = family.init(jax.random.key(3))
    with pytest.warns(RuntimeWarning, match="skipped 5 of 5"):
        result = specjax.tune_draft(family, start, target_chain(6), _nan_gradient_objective,
                                    num_steps=5)
    assert int(result.skipped) == 5
    np.testing.assert_array_equal(np.asarray(result.final_params), np.asarray(start))
    np.testing.assert_array_equal(np.asarray(result.params), np.asarray(start))


def test_non_finite_value_after_a_step_is_skipped_and_never_best():
    family = specjax.tuning.ContextFreeDraft(V, T)
    start = family.uniform()
    with pytest.warns(RuntimeWarning, match="skipped 4 of 5"):
        result = specjax.tune_draft(family, start, target_chain(6), _infinite_once_moved,
                                    num_steps=5)
    history = np.asarray(result.history)
    assert np.isfinite(history[0]) and np.isinf(history[1:]).all()
    assert int(result.best_step) == 0 and float(result.value) == history[0]
    np.testing.assert_array_equal(np.asarray(result.params), np.asarray(start))
    assert np.isfinite(np.asarray(result.final_params)).all()


def test_non_finite_start_is_refused():
    family = specjax.tuning.ContextFreeDraft(V, T)
    target = target_chain(6)
    with pytest.raises(ValueError, match="objective at the starting params is nan"):
        specjax.tune_draft(family, family.uniform(), target, _nan_value_objective)
    wild = family.init(jax.random.key(0), scale=60.0)  # the softmax underflows to exact zeros
    with pytest.raises(ValueError, match="objective at the starting params is inf"):
        # 60 steps (refused before any): the program of
        # test_tuning_never_increases_its_objective[contextfree-kl], not one of 500 steps.
        specjax.tune_draft(family, wild, target, specjax.tuning.kl_divergence(), num_steps=60)


def test_lowrank_uniform_is_a_saddle_and_init_is_not():
    """At ``uniform()`` both factors are zero, so their gradients are exactly zero (only the
    bias learns, and tuning from there stays context-free); at ``init(key)`` they are not."""
    family = specjax.tuning.LowRankDraft(V, T, 2)
    target = target_chain(3)
    objective = specjax.objective(specjax.Speculative())

    def grads(params):
        return jax.grad(lambda prm: objective(family.chain(prm), target))(params)

    at_uniform = grads(family.uniform())
    assert not np.asarray(at_uniform["u"]).any() and not np.asarray(at_uniform["w"]).any()
    assert np.abs(np.asarray(at_uniform["bias"])).max() > 1e-4  # only the bias learns
    at_init = grads(family.init(jax.random.key(0), scale=0.1))
    for name in ("u", "w"):
        assert np.abs(np.asarray(at_init[name])).max() > 1e-4, name


def test_result_does_not_depend_on_log_every():
    """Chunks of 1, 25 (25, 25, 10) and 60 steps give the result of one chunk. The family,
    objective, optimiser (the default) and step count are those of
    ``test_tuning_never_increases_its_objective[lowrank-batch(M=3)]``, so the one-chunk program
    is shared with it; only the chunks of 1 and 25 steps compile here (the remainder of 10
    steps runs in the program of 25)."""
    family = specjax.tuning.LowRankDraft(V, T, 2)
    target = target_chain(7)
    start = family.init(jax.random.key(4))
    runs = [specjax.tune_draft(family, start, target,
                               specjax.tuning.make_objective("batch", num_drafts=3),
                               num_steps=60, log_every=k)
            for k in (None, 1, 25, 60)]
    for other in runs[1:]:
        np.testing.assert_array_equal(np.asarray(other.history), np.asarray(runs[0].history))
        for a, b in zip(jax.tree_util.tree_leaves((other.params, other.final_params)),
                        jax.tree_util.tree_leaves((runs[0].params, runs[0].final_params))):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# One optimiser object (a static argument of the compiled steps) and one instance size for every
# seed of the test below, so that its 1,500-step program compiles once, not once per seed.
COSINE_ADAM = optax.adam(optax.cosine_decay_schedule(0.05, 1500))


@pytest.mark.parametrize("seed", range(4))
def test_tuned_stationary_draft_beats_kl_fit_on_sd(x64, seed):
    """From a random start (not from the KL fit), the SD-tuned stationary draft has fewer
    expected rejections than the maximum-likelihood draft, on random targets, and reaches the
    global optimum: for a stationary draft Theorem 1's sum is convex in the probabilities, a
    linear program per row, solved here independently with scipy's HiGHS. Four random targets
    of the module's size (V = 5, T = 12), so the seeds share one compiled program."""
    from scipy.optimize import linprog
    num_states, horizon = V, T
    target = target_chain(10 + seed, num_states, horizon)
    family = specjax.tuning.StationaryDraft(num_states, horizon)
    kl_value = float(specjax.expected_rejections(
        family.chain(specjax.tuning.kl_fit(family, target)), target))
    result = specjax.tune_draft(family, family.init(jax.random.key(seed)), target,
                                specjax.objective(specjax.Speculative()), num_steps=1500,
                                optimizer=COSINE_ADAM)
    tuned = float(result.value)
    assert tuned < kl_value - 1e-3

    mu = np.asarray(specjax.marginals(target))[:-1]
    q = np.asarray(target.trans)
    optimum = 0.0
    n_vars = num_states + horizon * num_states
    for a in range(num_states):
        # variables (p, t): minimise sum_n mu_n(a) / 2 sum_b t_nb, t_nb >= |p_b - q_n(a, b)|
        cost = np.concatenate([np.zeros(num_states), np.repeat(mu[:, a] / 2, num_states)])
        eye = np.eye(num_states)
        lift = -np.eye(horizon * num_states)
        tile = np.tile(eye, (horizon, 1))
        a_ub = np.block([[tile, lift], [-tile, lift]])
        b_ub = np.concatenate([q[:, a].ravel(), -q[:, a].ravel()])
        a_eq = np.concatenate([np.ones(num_states), np.zeros(horizon * num_states)])[None]
        lp = linprog(cost, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=[1.0],
                     bounds=[(0, None)] * n_vars, method="highs")
        assert lp.status == 0
        optimum += lp.fun
    assert optimum <= tuned + 1e-9
    assert tuned == pytest.approx(optimum, rel=1e-5)


def test_biased_tradeoff_with_unit_weight_is_tv_under_biased_contexts(x64):
    """Theorem 5 per context: P(reject) + Loss*_TV = TV(p, q), so with lambda = 1 the objective is
    the TV summed over the biased decoder's own context law."""
    draft, target = (chain(x) for x in random_pair(7, V, T, zero_fraction=0.2))
    eps = 0.07
    value = float(specjax.tuning.biased_tradeoff(eps, weight=1.0)(draft, target))
    context = specjax.exact(specjax.BiasedSpeculative(eps), draft, target).marginals[:-1]
    tv = specjax.tv_distance(draft.trans, target.trans)
    assert value == pytest.approx(float(jnp.sum(context * tv)), rel=1e-12)
    # eps = 0 is unbiased SD: Loss* = 0 and the contexts follow the target.
    assert float(specjax.tuning.biased_tradeoff(0.0, weight=3.0)(draft, target)) == pytest.approx(
        float(specjax.expected_rejections(draft, target)), rel=1e-12)


@functools.partial(jax.jit, static_argnums=0)
def _objective_value_and_grad(objective, draft, target):
    """``objective(draft, target)`` and its gradient in the draft chain."""
    return jax.value_and_grad(objective)(draft, target)


@pytest.mark.parametrize("dtype", ["float32", full_suite_only("float64")])
def test_gradients_finite_through_every_objective_at_edge_cases(dtype):
    """p = q, disjoint supports, one-hot rows, exhausted residuals, p = 0 < q (``edge_pair``),
    drafts at the KL fit of that target (zeros as log(tiny) logits) and extreme logits."""
    t, v = edge_pair()[1][1].shape[:2]  # trans is (T, V, V)
    # The extreme logits are drawn in float32 for both dtypes (cast below): a float64 draw
    # compiled a normal sampler per family shape for logits that are as extreme either way.
    wild = [family.init(jax.random.key(0), scale=50.0) for family in families(v, t)]
    with jax.enable_x64(dtype == "float64"):
        _, target = edge_pair()
        target = chain(target)
        target = specjax.MarkovChain(target.init.astype(dtype), target.trans.astype(dtype))
        assert (target.num_states, target.horizon) == (v, t)
        for family, extreme in zip(families(v, t), wild):
            starts = [specjax.tuning.kl_fit(family, target),
                      jax.tree_util.tree_map(lambda x: x.astype(dtype), extreme),
                      family.uniform()]
            for params in starts:
                # The chain rule split at the draft chain: the objectives' gradients in the chain
                # are compiled once per objective and dtype (_objective_value_and_grad), shared
                # by the families; the family's pullback runs op by op, shared by objectives.
                draft, pullback = jax.vjp(family.chain, params)
                for objective in objectives():
                    value, in_chain = _objective_value_and_grad(objective, draft, target)
                    (grad,) = pullback(in_chain)
                    if objective.kind == "kl" and params is starts[1]:
                        # Logits of scale 50 underflow some draft probabilities to exactly 0
                        # where the target has mass: the KL is then +inf (never NaN).
                        assert not np.isnan(float(value))
                    else:
                        assert np.isfinite(float(value)), (family.name, objective.label)
                    for leaf in jax.tree_util.tree_leaves(grad):
                        assert leaf.dtype == jnp.dtype(dtype)
                        assert np.isfinite(np.asarray(leaf)).all(), (family.name, objective.label)


def test_new_target_does_not_recompile_and_callbacks_report(capsys):
    family = specjax.tuning.StationaryDraft(V, T)
    objective = specjax.objective(specjax.Speculative())
    # The optimiser (a static argument) is traced once per compiled program: 10 steps logged
    # every 4 run chunks of 4, 4 and 2 steps, all in one program (the step count is traced),
    # reused by the second target.
    chex.clear_trace_counter()
    adam = optax.adam(0.05)
    optimizer = optax.GradientTransformation(adam.init, chex.assert_max_traces(adam.update, n=1))
    seen = []
    specjax.tune_draft(family, family.uniform(), target_chain(8), objective, num_steps=10,
                       optimizer=optimizer, log_every=4,
                       callback=lambda step, value, best: seen.append((step, value, best)))
    assert [s for s, _, _ in seen] == [4, 8, 10]
    assert all(best <= value + 1e-6 for _, value, best in seen)
    specjax.tune_draft(family, family.uniform(), target_chain(9), objective, num_steps=10,
                       optimizer=optimizer, log_every=4, progress=True)
    err = capsys.readouterr().err
    assert "tune_draft: step      4/10" in err and "step     10/10" in err
