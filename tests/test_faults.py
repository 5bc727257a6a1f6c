"""Faults that used to give silently wrong results (issue 19), each pinned by a test that checks
the right result or the clear error, not just the absence of a crash."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax._pytree import array_field
from specjax._pytree import pytree_dataclass
from specjax.decoders.draws import categorical_thresholds
from tests import reference
from tests.stats import assert_law
from tests.stats import count_rows

KEY = jax.random.key(19)


def _narrow_chain(seed, dtype, num_states=4, horizon=3):
    """A random chain stored in a narrow float type, and the float64 law its rows define
    (each row normalised in float64, as the samplers' thresholds normalise it). ``V = 4, T = 3``:
    the size of the chains of the rule tests below, so that one Dirichlet sampler is compiled."""
    chain = specjax.random_markov_chain(jax.random.key(seed), num_states, horizon)
    init, trans = chain.init.astype(dtype), chain.trans.astype(dtype)
    exact = [np.asarray(x, np.float64) for x in (init, trans)]
    exact = [x / x.sum(-1, keepdims=True) for x in exact]
    return specjax.MarkovChain(init, trans), exact


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_thresholds_of_narrow_floats_are_not_all_the_first_token(dtype):
    masses = jnp.asarray([0.25, 0.25, 0.5], dtype)
    thresholds = np.asarray(categorical_thresholds(masses)).astype(np.int64)
    widths = np.diff(np.concatenate([[-1], thresholds[:3]]))
    np.testing.assert_allclose(widths / 2**31, [0.25, 0.25, 0.5], atol=1e-6)


@pytest.mark.slow  # a Monte Carlo run of 100,000 chains or more
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_narrow_float_samplers_output_the_target_law(dtype):
    """Every sampler of a float16 chain emitted only token 0 (an overflow in the threshold
    cast); now SD's sequences follow the target's law (chi-square, false-failure rate 1e-5)."""
    draft, _ = _narrow_chain(0, dtype)
    target, (init, trans) = _narrow_chain(1, dtype)
    num_chains = 200_000
    trace = specjax.decode(KEY, specjax.Speculative(), draft, target, num_chains)
    law = reference.target_sequence_law((init, trans))
    assert_law(count_rows(np.asarray(trace.tokens)), law, num_chains, f"SD in {dtype.__name__}")


def test_bfloat16_rows_normalised_in_their_own_precision_are_accepted():
    logits = jax.random.normal(jax.random.key(0), (3, 7, 7))
    rows = jax.nn.softmax(logits.astype(jnp.bfloat16), axis=-1)
    init = jax.nn.softmax(logits[0, 0].astype(jnp.bfloat16))
    chain = specjax.MarkovChain(init, rows)  # sums off one by a few units of 2**-8
    assert chain.dtype == jnp.bfloat16
    with pytest.raises(ValueError, match="trans rows must sum to one"):
        specjax.MarkovChain(init, rows * 1.1)


@pytree_dataclass
class _TableModel:
    """A protocol model walking down a table: row ``s`` at step ``s`` (the last row after)."""

    table: jax.Array = array_field()

    @property
    def num_states(self):
        return self.table.shape[-1]

    def init_state(self):
        return jnp.int32(0)

    def probs(self, state):
        return self.table[state]

    def update(self, state, token):
        del token
        return jnp.minimum(state + 1, self.table.shape[0] - 1)


def _walk(bad_step=None, bad_row=(0.5, 0.5, 0.5, -0.5)):
    table = jnp.full((6, 4), 0.25)
    if bad_step is not None:
        table = table.at[bad_step].set(jnp.asarray(bad_row))
    return _TableModel(table)


def test_a_protocol_model_is_probed_beyond_its_initial_state_before_work():
    with pytest.raises(ValueError, match=r"target.probs\(state after tokens \[0\]"):
        specjax.decode(KEY, specjax.Speculative(), _walk(), _walk(bad_step=1), 8, horizon=4)


@pytest.mark.parametrize("bad_row", [(0.5, 0.5, 0.5, -0.5), (0.5, 0.5, 0.5, 0.5),
                                     (0.25, 0.25, 0.25, float("nan"))])
@pytest.mark.parametrize("who", ["draft", "target"])
def test_an_invalid_row_met_during_the_run_raises_after_it(who, bad_row):
    """Step 4 is beyond the probe (2 tokens deep): the run's own check names the model."""
    models = {"draft": _walk(), "target": _walk()}
    models[who] = _walk(bad_step=4, bad_row=bad_row)
    with pytest.raises(ValueError, match=f"^{who} returned a row that is not a law"):
        specjax.decode(KEY, specjax.Speculative(), models["draft"], models["target"], 8,
                       horizon=5)
    with pytest.raises(ValueError, match=f"^{who} returned a row that is not a law"):
        specjax.decoding_statistics(KEY, specjax.Speculative(), models["draft"],
                                    models["target"], 8, horizon=5)
    # A horizon that never reaches the bad row runs.
    trace = specjax.decode(KEY, specjax.Speculative(), models["draft"], models["target"], 8,
                           horizon=3)
    assert trace.tokens.shape == (8, 4)


def _sd_accept(p, q):
    return jnp.minimum(1, q / p)  # 0/0 where p = q = 0: the rule's own NaN, harmless at p = 0


def _sd_residual(p, q, b):
    del b
    return jnp.maximum(q - p, 0)


_BAD_RULES = {
    "all-zero residual": (_sd_accept, lambda p, q, b: jnp.zeros_like(p),
                          "residual must have mass wherever rejection can happen"),
    "acceptance above one": (lambda p, q: jnp.full_like(p, 2.0), _sd_residual,
                             r"accept_prob must return probabilities in \[0, 1\]"),
    "negative acceptance": (lambda p, q: -jnp.ones_like(p), _sd_residual,
                            r"accept_prob must return probabilities in \[0, 1\]"),
    "NaN residual": (_sd_accept, lambda p, q, b: jnp.full_like(p, jnp.nan),
                     "residual must return a distribution"),
    "negative residual": (_sd_accept, lambda p, q, b: q - p,
                          "residual must return a distribution"),
    "scalar acceptance": (lambda p, q: 1.0, _sd_residual, r"must take \(V,\) rows"),
}


@pytest.mark.parametrize("name", list(_BAD_RULES))
@pytest.mark.parametrize("entry", ["exact", "decode", "output_chain"])
def test_a_bad_rule_is_refused_before_work(name, entry):
    accept, residual, message = _BAD_RULES[name]
    draft, target = (specjax.random_markov_chain(jax.random.key(s), 4, 3) for s in (0, 1))
    rule = specjax.RejectionRule(accept, residual)
    run = {"exact": lambda: specjax.exact(rule, draft, target),
           "decode": lambda: specjax.decode(KEY, rule, draft, target, 16),
           "output_chain": lambda: specjax.output_chain(rule, draft, target)}[entry]
    with pytest.raises(ValueError, match=message):
        run()


def test_a_rule_dividing_by_zero_where_the_draft_has_no_mass_is_exact():
    """``min(1, q / p)`` is NaN at ``p = q = 0``; such tokens are never drafted, so the rule
    is SD: its exact values equal Speculative()'s and its marginals sum to one."""
    draft, target = (specjax.random_markov_chain(jax.random.key(s), 4, 3, concentration=0.3)
                     for s in (2, 3))
    trans = np.asarray(draft.trans).copy()
    trans[:, :, 0] = 0.0
    trans /= trans.sum(-1, keepdims=True)
    draft = specjax.MarkovChain(draft.init, jnp.asarray(trans))
    rule = specjax.RejectionRule(_sd_accept, _sd_residual)
    mine, sd = (specjax.exact(d, draft, target) for d in (rule, specjax.Speculative()))
    np.testing.assert_allclose(mine.expected_rejections, sd.expected_rejections, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(mine.marginals).sum(-1), 1.0, atol=1e-5)


_ROW_FUNCTIONS = {
    "tv_distance": lambda p, q: specjax.tv_distance(p, q),
    "speculative_residual": lambda p, q: specjax.speculative_residual(p, q),
    "acceptance_probability": lambda p, q: specjax.acceptance_probability(p, q, epsilon=0.1),
    "optimal_residual": lambda p, q: specjax.optimal_residual(p, q, jnp.ones_like(p) * 0.5),
    "tv_loss_star": lambda p, q: specjax.tv_loss_star(p, q, jnp.ones_like(p) * 0.5),
    "rejection_probability": lambda p, q: specjax.rejection_probability(p, q),
    "batch_improvement": lambda p, q: specjax.batch_improvement(p, q, num_drafts=2),
    "batch_residual_mass": lambda p, q: specjax.decoders.batch_residual_mass(p, q, num_drafts=2),
}


@pytest.mark.parametrize("name", list(_ROW_FUNCTIONS))
def test_row_functions_check_their_rows_and_stay_usable_under_transformations(name):
    function = _ROW_FUNCTIONS[name]
    p, q = jnp.asarray([0.2, 0.3, 0.5]), jnp.asarray([0.5, 0.5, 0.0])
    with pytest.raises(ValueError, match="same number of tokens V"):
        function(p, jnp.full((4,), 0.25))
    with pytest.raises(ValueError, match="^p contains negative probabilities"):
        function(jnp.asarray([1.5, -0.5, 0.0]), q)
    with pytest.raises(ValueError, match="^p contains NaN"):
        function(jnp.asarray([0.5, 0.5, jnp.nan]), q)
    eager = function(p, q)
    np.testing.assert_allclose(jax.jit(function)(p, q), eager, rtol=1e-6)
    gradient = jax.grad(lambda a: jnp.sum(function(a, q)))(p)
    assert np.isfinite(np.asarray(gradient)).all()


@pytest.mark.slow
def test_a_half_written_compilation_cache_entry_does_not_fail_the_next_run(tmp_path):
    """The suite's xdist workers share JAX's persistent compilation cache, which is not written
    atomically: a worker can read an entry another is still writing, or one a killed run left
    half-written. JAX then warns and compiles; the suite's settings (warnings are errors) must
    let that warning through, or a fresh-clone run fails at random in collection."""
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).parent.parent
    test = "tests/test_api.py::test_paper_instance_shape"
    command = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:randomly",
               "-o", f"cache_dir={tmp_path}", test]
    first = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stdout[-2000:]
    entries = [p for p in tmp_path.rglob("*-cache") if p.is_file()]
    assert entries, "the first run wrote no compilation cache entries"
    for entry in entries:
        entry.write_bytes(entry.read_bytes()[:10])  # a torn write
    second = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout[-2000:]
