"""Distillation for decoding cost (specjax.pairs.distill): the objective over a recording equals
the exact value when the recording enumerates every sequence, its gradient is the exact gradient
and a central difference, values and gradients stay finite at the edge cases, a recording of
target rollouts estimates the exact value within its standard error, and bad arguments are
refused by name."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import stats

import specjax
from specjax.pairs.distill import decoding_objective
from specjax.pairs.distill import divergence_objective
from specjax.pairs.distill import token_probs

# One small problem for every test: V = 3 states, T = 4 positions, all V^(T + 1) = 243 sequences.
V, T = 3, 4
LOOKAHEADS = (1, 2, 4, None)
COST = specjax.CostModel(0.1, [0.0, 1.0, 1.1, 1.3, 1.4, 1.6])  # a table: verification not free


def family():
    return specjax.tuning.StationaryDraft(V, T)


def apply(params, tokens):
    """The stationary draft's rows along the tokens: ``(B, T, V)`` probabilities."""
    trans = family().chain(params).trans
    return trans[jnp.arange(T)[None], tokens[:, :-1]]


def logits_apply(params, tokens):
    return jnp.broadcast_to(params, (T, V, V))[jnp.arange(T)[None], tokens[:, :-1]]


def enumerate_target(target):
    """Every sequence ``x_0..x_T``, its target probability and the target's rows along it."""
    seqs = np.array(list(itertools.product(range(V), repeat=T + 1)))
    init, trans = np.asarray(target.init), np.asarray(target.trans)
    weights = init[seqs[:, 0]] * np.prod(
        [trans[t, seqs[:, t], seqs[:, t + 1]] for t in range(T)], axis=0)
    rows = trans[np.arange(T)[None], seqs[:, :-1]]
    return jnp.asarray(seqs), jnp.asarray(rows), jnp.asarray(weights)


@pytest.fixture(scope="module")
def problem64():
    with jax.enable_x64(True):
        target = specjax.random_markov_chain(jax.random.key(1), V, T)
        params = family().init(jax.random.key(2))
        return (target, params) + enumerate_target(target)


@pytest.mark.parametrize("lookahead", LOOKAHEADS)
def test_enumerated_recording_is_exact(x64, problem64, lookahead):
    target, params, seqs, rows, weights = problem64
    sd = specjax.Speculative(lookahead)
    draft = family().chain(params)
    loss = decoding_objective(sd, apply, "time", cost=COST)
    exact = specjax.exact(sd, draft, target)
    time = specjax.theory.decoding_time(sd, draft, target, COST).expected_time
    for target_probs in (rows, token_probs(rows, seqs)):  # full rows or the recorded token's
        out = loss(params, seqs, target_probs, weights)
        assert out.expected_rejections.dtype == jnp.float64
        np.testing.assert_allclose(out.expected_rejections, exact.expected_rejections,
                                   rtol=0, atol=1e-10)
        np.testing.assert_allclose(out.expected_calls, exact.expected_calls, rtol=0, atol=1e-10)
        np.testing.assert_allclose(out.expected_time, time, rtol=0, atol=1e-10)
        assert out.value is out.expected_time


def test_enumerated_gradient_is_exact_and_a_central_difference(x64, problem64):
    target, params, seqs, rows, weights = problem64
    direction = jax.random.normal(jax.random.key(3), params.shape, params.dtype)
    for lookahead in (1, None):
        sd = specjax.Speculative(lookahead)
        loss = decoding_objective(sd, apply)

        def value(p, loss=loss):
            return loss(p, seqs, rows, weights).value

        def exact(p, sd=sd):
            return specjax.exact(sd, family().chain(p), target).expected_rejections

        grad = jax.grad(value)(params)
        np.testing.assert_allclose(grad, jax.grad(exact)(params), rtol=0, atol=1e-10)
        h = 1e-6
        difference = (value(params + h * direction) - value(params - h * direction)) / (2 * h)
        np.testing.assert_allclose(jnp.sum(grad * direction), difference, rtol=1e-6)


def test_divergences_are_the_exact_sums(x64, problem64):
    """TV over the enumeration is Theorem 1's rejections (K = T); KL is the sequence KL (both
    prompt laws uniform). The logits form of the draft gives the same values."""
    target, params, seqs, rows, weights = problem64
    draft = family().chain(params)
    tv = divergence_objective(apply, "tv")(params, seqs, rows, weights)
    np.testing.assert_allclose(tv, specjax.exact(specjax.Speculative(), draft, target)
                               .expected_rejections, rtol=0, atol=1e-10)
    kl = divergence_objective(apply, "kl")(params, seqs, rows, weights)
    np.testing.assert_allclose(kl, specjax.theory.sequence_kl(target, draft), rtol=0, atol=1e-10)
    for name, value in (("tv", tv), ("kl", kl)):
        np.testing.assert_allclose(
            divergence_objective(logits_apply, name, logits=True)(params, seqs, rows, weights),
            value, rtol=0, atol=1e-10)


@pytest.fixture(scope="module")
def rollouts():
    """2,000 target rollouts (float32) and the target's rows along them."""
    target = specjax.random_markov_chain(jax.random.key(1), V, T)
    tokens = specjax.decode(jax.random.key(4), specjax.Autoregressive(), None, target,
                            2000).tokens
    rows = target.trans[jnp.arange(T)[None], tokens[:, :-1]]
    return target, tokens, rows


def test_recorded_rollouts_estimate_the_exact_value(rollouts):
    """Unweighted over target rollouts, the per-sequence values average to the exact value within
    stats.Z standard errors."""
    target, tokens, rows = rollouts
    params = family().init(jax.random.key(2))
    draft = family().chain(params)
    for lookahead in (1, None):
        sd = specjax.Speculative(lookahead)
        loss = decoding_objective(sd, apply)
        per_sequence = jax.vmap(lambda t, r, loss=loss: loss(params, t[None], r[None]).value)(
            tokens, rows)
        np.testing.assert_allclose(jnp.mean(per_sequence), loss(params, tokens, rows).value,
                                   rtol=1e-5)
        stats.assert_mean(per_sequence, float(specjax.exact(sd, draft, target)
                                              .expected_rejections), f"SD({lookahead})")


def test_edge_cases_finite(rollouts):
    """p = q (the target's own rows), a draft giving the recorded tokens probability 0 (as
    probabilities and as -inf logits), and target probabilities 0: finite values and gradients.
    """
    _, tokens, rows = rollouts
    tokens, rows = tokens[:64], rows[:64]
    recorded = jax.nn.one_hot(tokens[:, 1:], V, dtype=rows.dtype)
    cases = {
        "p = q": (lambda params, _: params, rows, rows, False),
        "p(x_t) = 0": (lambda params, _: params, (1 - recorded) / (V - 1), rows, False),
        "-inf logits": (lambda params, _: params, jnp.where(recorded > 0, -jnp.inf, 0.0), rows,
                        True),
        "q(x_t) = 0": (lambda params, _: params, rows, rows * (1 - recorded), False),
    }
    for name, (draft_apply, params, target_rows, logits) in cases.items():
        for lookahead in (2, None):
            loss = decoding_objective(specjax.Speculative(lookahead), draft_apply, "time",
                                      cost=COST, logits=logits)
            value, grad = jax.value_and_grad(
                lambda p, loss=loss, q=target_rows: loss(p, tokens, q).value)(params)
            assert np.isfinite(value) and np.all(np.isfinite(grad)), (name, lookahead)
        if name == "p = q":
            assert float(loss(params, tokens, target_rows).expected_rejections) == 0.0
        for divergence in ("tv", "kl") if name != "p(x_t) = 0" else ("tv",):
            grad = jax.grad(divergence_objective(draft_apply, divergence, logits=logits))(
                params, tokens, target_rows)
            assert np.all(np.isfinite(grad)), (name, divergence)


def test_jit_and_no_recompilation(rollouts):
    """The objective is a pure function of arrays: jit compiles it once for new parameters."""
    _, tokens, rows = rollouts
    loss = jax.jit(decoding_objective(specjax.Speculative(2), apply))
    loss(family().init(jax.random.key(5)), tokens, rows)
    size = loss._cache_size()
    loss(family().init(jax.random.key(6)), tokens, rows)
    assert loss._cache_size() == size


def test_bad_arguments_are_named(rollouts):
    _, tokens, rows = rollouts
    params = family().uniform()
    sd = specjax.Speculative(2)
    with pytest.raises(ValueError, match="decoder"):
        decoding_objective(specjax.BatchSpeculative(2), apply)
    with pytest.raises(ValueError, match="apply"):
        decoding_objective(sd, "draft")
    with pytest.raises(ValueError, match="measure"):
        decoding_objective(sd, apply, "tokens")
    with pytest.raises(ValueError, match="cost"):
        decoding_objective(sd, apply, "time")
    with pytest.raises(ValueError, match="cost"):
        decoding_objective(sd, apply, cost=1.0)
    with pytest.raises(ValueError, match="logits"):
        decoding_objective(sd, apply, logits="yes")
    with pytest.raises(ValueError, match="divergence"):
        divergence_objective(apply, "js")
    loss = decoding_objective(sd, apply)
    with pytest.raises(ValueError, match="tokens"):
        loss(params, tokens[:, 0], rows)
    with pytest.raises(ValueError, match="tokens"):
        loss(params, tokens.astype(jnp.float32), rows)
    with pytest.raises(ValueError, match="target_probs"):
        loss(params, tokens, rows[:, :-1])
    with pytest.raises(ValueError, match="target_probs"):
        loss(params, tokens, -rows)
    with pytest.raises(ValueError, match="weights"):
        loss(params, tokens, rows, jnp.ones(3))
    with pytest.raises(ValueError, match="weights"):
        loss(params, tokens, rows, -jnp.ones(tokens.shape[0]))
    with pytest.raises(ValueError, match="apply"):
        decoding_objective(sd, lambda p, t: p)(params, tokens, rows)
    with pytest.raises(ValueError, match="target_probs"):
        divergence_objective(apply, "kl")(params, tokens, token_probs(rows, tokens))


@pytest.mark.slow
def test_distill_study_quick(capsys):
    """The study end to end at toy size: every draft's held-out estimate agrees with its exact
    value (independent rollouts: Z standard errors each), and the table is printed."""
    import test_scripts
    result = test_scripts.import_script("distill_study").main(["--quick"])
    drafts = [row["draft"] for row in result["rows"]]
    assert drafts == ["forward KL", "TV (DistillSpec)", "rejections, K = 1", "rejections, K = 4",
                      "rejections, K = inf", "exact optimum, K = 1", "exact optimum, K = 4",
                      "exact optimum, K = inf"]
    for row in result["rows"]:
        for k in ("1", "4", "inf"):
            se = row[f"held_out_se_{k}"]
            assert abs(row[f"held_out_{k}"] - row[f"exact_{k}"]) <= stats.Z * se, (row, k)
    out = capsys.readouterr().out
    assert all(f"| {name} |" in out for name in drafts)
