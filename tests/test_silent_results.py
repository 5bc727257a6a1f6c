"""Issue 52, "No silent number, no lost file": inputs that gave a plausible number (or no answer)
instead of a clear error.

* a ``min_variance`` that pools every category away (``compare_outputs``, ``check_provenance``,
  ``sequence_fit``): the test has no power, and it passed;
* ``decoding_objective`` with ``logits=False`` trusted the draft rows (rows summing to 2 scored
  fewer rejections than any law; rows of the wrong ``V`` gave NaN);
* ``random_markov_chain`` with a concentration the dtype cannot hold (``1e39`` in float32: no
  answer; ``1e-50``: "trans contains NaN"), and a traced concentration of ``-1`` or NaN (no
  answer);
* ``penalize`` of a ``MarkovChain`` under ``jax.jit`` with a traced penalty
  (``TracerArrayConversionError``).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax.auditing import check_provenance
from specjax.auditing.history import sequence_fit
from specjax.auditing.history import sequence_law
from specjax.models import Penalties
from specjax.models import penalize
from specjax.pairs.distill import decoding_objective

# ------------------------------------------------------------------ min_variance (item 3)

_P = np.array([[0.5, 0.5, 0.0]], np.float32)
_Q = np.array([[0.4, 0.4, 0.2], [0.3, 0.3, 0.4]], np.float32)
_X = np.array([1])
_ALWAYS_1_2 = np.tile(np.array([1, 2]), (2000, 1))  # an engine that always emits [1, 2]


def test_compare_outputs_flags_a_constant_engine_at_the_default():
    result = specjax.compare_outputs(specjax.Speculative(), _X, _P, _Q, _ALWAYS_1_2)
    assert result.flagged and result.impossible == 0


@pytest.mark.parametrize("bad", [math.inf, math.nan, -1.0, 0.0, "5", True])
def test_compare_outputs_refuses_a_bad_min_variance(bad):
    with pytest.raises(ValueError, match="min_variance"):
        specjax.compare_outputs(specjax.Speculative(), _X, _P, _Q, _ALWAYS_1_2,
                                min_variance=bad)


def test_compare_outputs_a_min_variance_that_leaves_nothing_to_test_is_not_a_pass():
    result = specjax.compare_outputs(specjax.Speculative(), _X, _P, _Q, _ALWAYS_1_2,
                                     min_variance=1e12)
    assert not result.tested and not result.flagged
    assert "NOT TESTED" in result.summary() and " ok " not in result.summary()


def test_compare_outputs_too_few_runs_is_not_a_pass():
    result = specjax.compare_outputs(specjax.Speculative(), _X, _P, _Q, _ALWAYS_1_2[:3])
    assert not result.tested and "NOT TESTED" in str(result)
    assert specjax.compare_outputs(specjax.Speculative(), _X, _P, _Q, _ALWAYS_1_2).tested


def test_compare_outputs_an_impossible_output_still_flags_when_nothing_else_is_testable():
    wrong = np.tile(np.array([0, 2]), (3, 1))  # an accepted token that is not the draft
    result = specjax.compare_outputs(specjax.Speculative(), _X, _P, _Q, wrong)
    assert result.flagged and result.impossible == 3 and result.tested


def test_compare_outputs_a_deterministic_law_is_fully_tested():
    p = np.array([[0.0, 1.0, 0.0]], np.float32)
    q = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]], np.float32)
    result = specjax.compare_outputs(specjax.Speculative(), _X, p, q, _ALWAYS_1_2[:5])
    assert not result.flagged and result.impossible == 0 and result.tested


def _provenance_inputs():
    rows = np.full((400, 1, 4), 0.25, np.float32)
    return np.zeros((400, 1), np.int32), rows  # every draft 0 of a uniform declared row


def test_check_provenance_flags_biased_drafts_at_the_default():
    assert check_provenance(*_provenance_inputs()).flagged


@pytest.mark.parametrize("bad", [math.inf, math.nan, -1.0])
def test_check_provenance_refuses_a_bad_min_variance(bad):
    with pytest.raises(ValueError, match="min_variance"):
        check_provenance(*_provenance_inputs(), min_variance=bad)


def test_check_provenance_a_min_variance_that_leaves_nothing_to_test_is_not_a_pass():
    check = check_provenance(*_provenance_inputs(), min_variance=1e12)
    assert not check.tested and not check.flagged and "NOT TESTED" in str(check)
    assert not check_provenance(np.zeros((2, 1), np.int32), np.full((2, 1, 4), 0.25)).tested
    assert check_provenance(np.zeros((2, 1), np.int32), np.eye(4)[None, :1].repeat(2, 0)).tested


def _fit_inputs():
    base = specjax.FiniteStateModel(0, jnp.zeros((1, 2), int), jnp.array([[0.25, 0.75]]))
    return np.zeros((500, 2), np.int32), sequence_law(base, 1)  # always (0, 0): p = 1/16


def test_sequence_fit_flags_a_constant_sampler_at_the_default():
    assert sequence_fit(*_fit_inputs()).flagged


@pytest.mark.parametrize("bad", [math.inf, math.nan, -1.0, 0.0, "5"])
def test_sequence_fit_refuses_a_bad_min_variance(bad):
    with pytest.raises(ValueError, match="min_variance"):
        sequence_fit(*_fit_inputs(), min_variance=bad)


def test_sequence_fit_a_min_variance_that_leaves_nothing_to_test_is_not_a_pass():
    fit = sequence_fit(*_fit_inputs(), min_variance=1e12)
    assert not fit.tested and not fit.flagged
    assert sequence_fit(*_fit_inputs()).tested


# ------------------------------------------------------------------ decoding_objective (item 4)

def _recording():
    return specjax.Recording.from_statistics(
        jnp.array([[0, 1, 1], [0, 0, 1]]), jnp.full((2, 2), 0.5),
        jnp.array([[0.5, 0.8], [0.5, 0.2]]))


def _rows_apply(params, tokens):
    return jnp.broadcast_to(params, (2, 2, params.shape[-1]))


_LAW = jnp.array([0.3, 0.7])


def test_decoding_objective_on_laws():
    loss = decoding_objective(specjax.Speculative(), _rows_apply)
    value = float(loss(_LAW, _recording()).value)
    # rates [q - p]_+ / q: 0 and 0.1 / 0.8 along sequence 0, 0.2 / 0.5 and 0 along sequence 1
    assert value == pytest.approx(0.5 * (0.125 + 0.4), rel=1e-5)
    recording = _recording()
    under_jit = jax.jit(lambda params: loss(params, recording).value)(_LAW)
    assert float(under_jit) == pytest.approx(value, rel=1e-6)


@pytest.mark.parametrize("rows, why", [(2 * _LAW, "sum"), (jnp.array([-0.2, 1.2]), "negative"),
                                       (jnp.array([0.3, math.nan]), "NaN")])
def test_decoding_objective_refuses_rows_that_are_not_laws(rows, why):
    loss = decoding_objective(specjax.Speculative(), _rows_apply)
    with pytest.raises(ValueError, match=f"apply.*(?i:{why})"):
        loss(rows, _recording())


def test_decoding_objective_refuses_rows_of_too_few_tokens():
    loss = decoding_objective(specjax.Speculative(), _rows_apply)
    with pytest.raises(ValueError, match="apply.*V"):
        loss(jnp.array([1.0]), _recording())  # token 1 is recorded: V >= 2


def test_decoding_objective_rows_that_are_not_laws_give_nan_under_jit_and_refused_under_grad():
    loss, recording = decoding_objective(specjax.Speculative(), _rows_apply), _recording()
    value = jax.jit(lambda params: loss(params, recording).value)(2 * _LAW)
    assert math.isnan(float(value))
    grad = jax.jit(jax.grad(lambda params: loss(params, recording).value))(2 * _LAW)
    assert not np.all(np.isfinite(np.asarray(grad)))
    with pytest.raises(ValueError, match="apply.*sum"):  # values known under grad alone
        jax.grad(lambda params: loss(params, recording).value)(2 * _LAW)


@pytest.mark.parametrize("bad", ["no", 0, 1, None])
def test_decoding_objective_logits_must_be_a_bool(bad):
    with pytest.raises(ValueError, match="logits"):
        decoding_objective(specjax.Speculative(), _rows_apply, logits=bad)


# ------------------------------------------------------------------ concentration (item 5)

@pytest.mark.parametrize("method", ["fast", "jax"])
@pytest.mark.parametrize("bad", [1e39, 1e-50, math.inf, math.nan, -1.0, 0.0])
def test_random_markov_chain_refuses_a_concentration_the_dtype_cannot_hold(method, bad):
    dtype = jnp.result_type(float)
    if jnp.dtype(dtype) == jnp.float64 and bad in (1e39, 1e-50):
        pytest.skip("representable in float64")
    with pytest.raises(ValueError, match="concentration"):
        specjax.random_markov_chain(jax.random.key(0), 4, 3, bad, method=method)


@pytest.mark.parametrize("method", ["fast", "jax"])
def test_random_markov_chain_at_the_ends_of_the_range(method):
    info = jnp.finfo(jnp.result_type(float))
    smallest = float(-np.log(info.tiny) / info.max) * 1.01
    for concentration in (smallest, float(info.max)):
        chain = specjax.random_markov_chain(jax.random.key(0), 4, 3, concentration,
                                            method=method)
        trans = np.asarray(chain.trans, np.float64)
        assert np.all(np.isfinite(trans)) and np.allclose(trans.sum(-1), 1, atol=1e-5)
    # tiny: near one-hot rows
    assert np.all(np.asarray(specjax.random_markov_chain(
        jax.random.key(0), 4, 3, smallest, method=method).trans).max(-1) > 0.999)


@pytest.mark.parametrize("method", ["fast", "jax"])
@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, 0.0])
def test_random_markov_chain_traced_bad_concentration_gives_nan_and_returns(method, bad):
    draw = jax.jit(lambda c: specjax.random_markov_chain(jax.random.key(0), 4, 3, c,
                                                         method=method).trans)
    assert np.all(np.isnan(np.asarray(draw(bad))))


@pytest.mark.parametrize("method", ["fast", "jax"])
def test_random_markov_chain_traced_concentration_is_the_concrete_draw(method):
    draw = jax.jit(lambda c: specjax.random_markov_chain(jax.random.key(0), 4, 3, c,
                                                         method=method).trans)
    traced = np.asarray(draw(0.5))
    concrete = np.asarray(specjax.random_markov_chain(jax.random.key(0), 4, 3, 0.5,
                                                      method=method).trans)
    np.testing.assert_allclose(traced, concrete, rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------------ traced penalties (item 16)

def _small_chain():
    return specjax.random_markov_chain(jax.random.key(3), 3, 2)


@pytest.mark.parametrize("name", ["repetition", "frequency", "presence"])
def test_penalize_a_markov_chain_with_a_traced_penalty(name):
    chain = _small_chain()
    traced = jax.jit(lambda r: penalize(chain, Penalties(**{name: r})).table)(2.0)
    concrete = penalize(chain, Penalties(**{name: 2.0})).table
    np.testing.assert_allclose(np.asarray(traced), np.asarray(concrete), rtol=1e-5, atol=1e-7)


def test_penalize_the_issue_reproduction():
    _, target = specjax.paper_instance(4, 8)
    table = jax.jit(lambda r: penalize(target, Penalties(repetition=r)).table)(2.0)
    assert table.shape[-1] == 8 and np.allclose(np.asarray(table).sum(-1), 1, atol=1e-4)


def test_penalize_gradient_in_a_traced_penalty():
    chain = _small_chain()
    grad = jax.grad(lambda r: penalize(chain, Penalties(repetition=r)).table[5, 0])(2.0)
    assert np.isfinite(float(grad))


def test_penalize_a_traced_cap_is_refused_as_static():
    with pytest.raises(ValueError, match="cap.*static"):
        jax.jit(lambda c: penalize(_small_chain(), Penalties(cap=c)).table)(2)
