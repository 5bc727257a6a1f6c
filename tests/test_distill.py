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
from conftest import float64
from conftest import random_rows
from specjax.pairs.distill import decoding_objective
from specjax.pairs.distill import divergence_objective
from specjax.pairs.distill import token_probs

# One small problem for every test: V = 3 states, T = 4 positions, all V^(T + 1) = 243 sequences.
V, T = 3, 4
LOOKAHEADS = (1, 2, 4, None)
COST = specjax.CostModel(0.1, [0.0, 1.0, 1.1, 1.3, 1.4, 1.6])  # a table: verification not free


def target_chain(dtype):
    """The module's one target in ``dtype``: a uniform prompt and Dirichlet(1) rows, drawn with
    NumPy (``random_markov_chain`` compiled JAX's Dirichlet sampler once per dtype)."""
    rows = random_rows(np.random.default_rng(1), (T, V, V)).astype(dtype)
    return specjax.MarkovChain(jnp.asarray(np.full(V, 1.0 / V, dtype)), jnp.asarray(rows))


def family():
    return specjax.tuning.StationaryDraft(V, T)


def apply(params, tokens):
    """The stationary draft's rows along the tokens: ``(B, T, V)`` probabilities."""
    trans = family().chain(params).trans
    return trans[jnp.arange(T)[None], tokens[:, :-1]]


def logits_apply(params, tokens):
    return jnp.broadcast_to(params, (T, V, V))[jnp.arange(T)[None], tokens[:, :-1]]


def target_rows(target, tokens):
    """``(B, T, V)``: the target chain's rows along the tokens."""
    return target.trans[jnp.arange(T)[None], tokens[:, :-1]]


def recording(target, tokens, weights=None):
    """A recording of the tokens with the target's rows (the draft columns are the target's:
    the objectives never read them)."""
    rows = target_rows(target, tokens)
    return specjax.Recording.from_arrays(tokens, rows, rows, weights=weights, keep_rows=True)


def enumerated(target):
    """Every sequence ``x_0..x_T`` weighted by its target probability: with the target's rows,
    and with its probabilities of the tokens only."""
    seqs = jnp.asarray(list(itertools.product(range(V), repeat=T + 1)))
    init, trans = np.asarray(target.init), np.asarray(target.trans)
    weights = init[seqs[:, 0]] * np.prod(
        [trans[t, seqs[:, t], seqs[:, t + 1]] for t in range(T)], axis=0)
    rows = recording(target, seqs, weights)
    return rows, specjax.Recording.from_statistics(seqs, rows.target_prob, rows.target_prob,
                                                   weights=weights)


@pytest.fixture(scope="module")
def problem64():
    with jax.enable_x64(True):
        target = target_chain(np.float64)
        params = family().init(jax.random.key(2))
        return (target, params) + enumerated(target)


@pytest.mark.parametrize("decoder", [specjax.Speculative(k) for k in LOOKAHEADS]
                         + [specjax.BatchSpeculative(2, lookahead=2), specjax.OptimalMultiDraft(2, lookahead=2)],
                         ids=repr)
def test_enumerated_recording_is_exact(x64, problem64, decoder):
    """Rejections, calls and time (a cost table) equal exact's to 1e-10; SD reads the tokens'
    probabilities alone (the same value without rows), a multi-draft root the rows."""
    target, params, with_rows, tokens_only = problem64
    draft = family().chain(params)
    loss = decoding_objective(decoder, apply, "time", cost=COST)
    exact = specjax.exact(decoder, draft, target)
    time = specjax.theory.decoding_time(decoder, draft, target, COST).expected_time
    recordings = (with_rows, tokens_only) if isinstance(decoder, specjax.Speculative) else (
        with_rows,)
    for rec in recordings:
        out = loss(params, rec)
        assert out.expected_rejections.dtype == jnp.float64
        np.testing.assert_allclose(out.expected_rejections, exact.expected_rejections,
                                   rtol=0, atol=1e-10)
        np.testing.assert_allclose(out.expected_calls, exact.expected_calls, rtol=0, atol=1e-10)
        np.testing.assert_allclose(out.expected_time, time, rtol=0, atol=1e-10)
        assert out.value is out.expected_time and out.per_sequence.shape == (V ** (T + 1),)


@pytest.mark.parametrize("decoder", [specjax.Speculative(1), specjax.Speculative(),
                                     specjax.BatchSpeculative(2, lookahead=2)], ids=repr)
def test_enumerated_gradient_is_exact_and_a_central_difference(x64, problem64, decoder):
    target, params, rec, _ = problem64
    direction = jax.random.normal(jax.random.key(3), params.shape, params.dtype)
    loss = decoding_objective(decoder, apply)

    def value(p):
        return loss(p, rec).value

    def exact(p):
        return specjax.exact(decoder, family().chain(p), target).expected_rejections

    # Compiled programs, not op by op (the gradients op by op compiled about 30 programs each);
    # the gradient's program gives the values at both points of the difference too.
    value_and_grad = jax.jit(jax.value_and_grad(value))
    grad = value_and_grad(params)[1]
    np.testing.assert_allclose(grad, jax.jit(jax.grad(exact))(params), rtol=0, atol=1e-10)
    h = 1e-6
    difference = (value_and_grad(params + h * direction)[0]
                  - value_and_grad(params - h * direction)[0]) / (2 * h)
    np.testing.assert_allclose(jnp.sum(grad * direction), difference, rtol=1e-6)


def test_divergences_are_the_exact_sums(x64, problem64):
    """TV over the enumeration is Theorem 1's rejections (K = T); KL is the sequence KL (both
    prompt laws uniform). The logits form of the draft gives the same values."""
    target, params, rec, _ = problem64
    draft = family().chain(params)
    tv = divergence_objective(apply, "tv")(params, rec)
    np.testing.assert_allclose(tv, specjax.exact(specjax.Speculative(), draft, target)
                               .expected_rejections, rtol=0, atol=1e-10)
    kl = divergence_objective(apply, "kl")(params, rec)
    np.testing.assert_allclose(kl, specjax.theory.sequence_kl(target, draft), rtol=0, atol=1e-10)
    for name, value in (("tv", tv), ("kl", kl)):
        np.testing.assert_allclose(
            divergence_objective(logits_apply, name, logits=True)(params, rec), value, rtol=0,
            atol=1e-10)


def test_equinox_module_draft(x64, problem64):
    """A draft network as an equinox module (embedding and linear layer: logits of x_t given
    x_{t-1}): its objective on the enumerated recording is exact for the chain it defines, and
    eqx.filter_value_and_grad gives a finite gradient for every leaf."""
    eqx = pytest.importorskip("equinox")
    target, _, rec, _ = problem64

    class Bigram(eqx.Module):
        embed: eqx.nn.Embedding
        out: eqx.nn.Linear

        def __call__(self, token):
            return self.out(jax.nn.tanh(self.embed(token)))

    key_embed, key_out = jax.random.split(jax.random.key(7))
    model = Bigram(eqx.nn.Embedding(V, 4, key=key_embed, dtype=jnp.float64),
                   eqx.nn.Linear(4, V, key=key_out, dtype=jnp.float64))
    sd = specjax.Speculative(2)
    loss = decoding_objective(sd, lambda m, tokens: jax.vmap(jax.vmap(m))(tokens[:, :-1]),
                              logits=True)

    def chain(m):
        rows = jax.nn.softmax(jax.vmap(m)(jnp.arange(V)), axis=-1)
        return specjax.MarkovChain(jnp.full((V,), 1.0 / V), jnp.broadcast_to(rows, (T, V, V)))

    value, grad = eqx.filter_jit(eqx.filter_value_and_grad(lambda m: loss(m, rec).value))(model)
    exact = specjax.exact(sd, chain(model), target).expected_rejections
    np.testing.assert_allclose(value, exact, rtol=0, atol=1e-10)
    leaves = jax.tree_util.tree_leaves(grad)
    assert len(leaves) == 3 and all(np.all(np.isfinite(g)) and np.any(g != 0) for g in leaves)


@pytest.fixture(scope="module")
def rollouts():
    """A recording of 2,000 target rollouts (float32) with the target's rows."""
    target = target_chain(np.float32)
    tokens = specjax.decode(jax.random.key(4), specjax.Autoregressive(), None, target,
                            2000).tokens
    return target, recording(target, tokens)


def test_recorded_rollouts_estimate_the_exact_value(rollouts):
    """Over target rollouts the per-sequence values average to the value, which is
    specjax.estimate's for this draft and within stats.Z standard errors of the exact value."""
    target, rec = rollouts
    params = family().init(jax.random.key(2))
    draft = family().chain(params)
    rows = apply(params, rec.tokens)
    mine = specjax.Recording.from_arrays(rec.tokens, rows, rec.target_probs)
    for decoder in (specjax.Speculative(1), specjax.Speculative(),
                    specjax.BatchSpeculative(2, lookahead=2)):
        out = jax.jit(decoding_objective(decoder, apply))(params, rec)  # one program each
        np.testing.assert_allclose(jnp.mean(out.per_sequence), out.value, rtol=1e-5)
        if isinstance(decoder, specjax.Speculative):
            np.testing.assert_allclose(out.value, specjax.estimate(decoder, mine)
                                       .expected_rejections, rtol=1e-5)
        # The exact value in float64 (the programs of test_enumerated_recording_is_exact: same
        # decoders, V, T and dtype), of this float32 draft and target.
        with jax.enable_x64(True):
            exact = float(specjax.exact(decoder, *float64(draft, target)).expected_rejections)
        stats.assert_mean(out.per_sequence, exact, repr(decoder))


def test_edge_cases_finite(rollouts):
    """p = q (the target's own rows), a draft giving the recorded tokens probability 0 (as
    probabilities and as -inf logits), and target probabilities 0: finite values and gradients.
    """
    _, rec = rollouts
    tokens, rows = rec.tokens[:64], rec.target_probs[:64]
    recorded = jax.nn.one_hot(tokens[:, 1:], V, dtype=rows.dtype)
    zero_q = rows * (1 - recorded)
    cases = {
        "p = q": (rows, rows, False),
        "p(x_t) = 0": ((1 - recorded) / (V - 1), rows, False),
        "-inf logits": (jnp.where(recorded > 0, -jnp.inf, 0.0), rows, True),
        "q(x_t) = 0": (rows, zero_q / jnp.sum(zero_q, -1, keepdims=True).clip(1e-30), False),
    }
    # One compiled program per logits flag, shared by the cases: every decoder's value, its
    # rejections (the p = q check below) and gradient, and the divergences' gradients (op by op
    # the gradients compiled about 140 programs; one program per decoder or divergence, 10).
    decoders = (specjax.Speculative(2), specjax.Speculative(),
                specjax.BatchSpeculative(2, lookahead=2))
    divergences = ("tv", "kl")

    def gradients(params, case, logits):
        """((value, rejections), gradient) per decoder and the gradient per divergence."""
        by_decoder = []
        for decoder in decoders:
            loss = decoding_objective(decoder, lambda p, _: p, "time", cost=COST, logits=logits)
            by_decoder.append(jax.value_and_grad(
                lambda p, loss=loss: (lambda o: (o.value, o.expected_rejections))(loss(p, case)),
                has_aux=True)(params))
        return by_decoder, {divergence: jax.grad(divergence_objective(
            lambda p, _: p, divergence, logits=logits))(params, case)
            for divergence in divergences}

    gradients = jax.jit(gradients, static_argnames="logits")
    for name, (params, q, logits) in cases.items():
        case = specjax.Recording(tokens, token_probs(q, tokens), token_probs(q, tokens),
                                 target_probs=q, draft_probs=q)
        by_decoder, by_divergence = gradients(params, case, logits=logits)
        for decoder, ((value, rejections), grad) in zip(decoders, by_decoder):
            assert np.isfinite(value) and np.all(np.isfinite(grad)), (name, decoder)
            if name == "p = q":
                assert float(rejections) == 0.0
        # The KL is infinite where the draft gives a recorded token probability 0.
        for divergence in divergences if name != "p(x_t) = 0" else ("tv",):
            assert np.all(np.isfinite(by_divergence[divergence])), (name, divergence)


def test_jit_and_no_recompilation(rollouts):
    """The objective is a pure function of arrays: jit compiles it once for new parameters."""
    _, rec = rollouts
    loss = jax.jit(decoding_objective(specjax.Speculative(2), apply))
    loss(family().init(jax.random.key(5)), rec)
    size = loss._cache_size()
    loss(family().init(jax.random.key(6)), rec)
    assert loss._cache_size() == size


def test_bad_arguments_are_named(rollouts):
    _, rec = rollouts
    params = family().uniform()
    sd = specjax.Speculative(2)
    for decoder in (specjax.BiasedSpeculative(0.1), specjax.BlockVerification(2),
                    specjax.Autoregressive(), "SD"):
        with pytest.raises(ValueError, match="decoder"):
            decoding_objective(decoder, apply)
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
    with pytest.raises(ValueError, match="recording"):
        decoding_objective(sd, apply)(params, (rec.tokens, rec.target_probs))
    no_rows = rec._replace(draft_probs=None, target_probs=None)
    with pytest.raises(ValueError, match="recording holds no target rows"):
        decoding_objective(specjax.BatchSpeculative(2), apply)(params, no_rows)
    with pytest.raises(ValueError, match="recording holds no target rows"):
        divergence_objective(apply, "kl")(params, no_rows)
    with pytest.raises(ValueError, match="apply"):
        decoding_objective(sd, lambda p, t: p)(params, rec)
    with pytest.raises(ValueError, match="apply"):
        divergence_objective(lambda p, t: apply(p, t)[..., :2], "tv")(params, rec)


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
