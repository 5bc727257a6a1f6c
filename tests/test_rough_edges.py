"""Rough edges a newcomer meets (issue 31, item 5), each with the clear error it now gets.

Found by a bad-input battery over the top-level entry points (one bad input of each kind: wrong
shape, traced static setting, vector where a scalar is expected, ``jax.jit`` of a host-side
driver). The wider battery of issue 19 is ``tests/reliability_cases.py``; these are the cases
that gave JAX's own errors instead of a ``ValueError`` from specjax.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import pytest

import specjax
from specjax import tuning

V, T = 3, 4


@pytest.fixture(scope="module")
def target():
    return specjax.paper_instance(num_states=V, horizon=T)[1]


@pytest.fixture(scope="module")
def family():
    return tuning.StationaryDraft(num_states=V, horizon=T)


def test_a_vector_objective_is_refused_before_any_step(family, target):
    calls = []

    def per_position(draft, target):  # forgot to sum over positions
        calls.append(draft)
        return jnp.sum(jnp.abs(draft.trans - target.trans), axis=(1, 2))

    with pytest.raises(ValueError, match=r"objective must return a floating-point scalar") as info:
        tuning.tune_draft(family, family.uniform(), target, per_position, num_steps=3)
    assert f"shape ({T},)" in str(info.value) and "per_position" in str(info.value)
    assert len(calls) == 1  # traced once for the starting value; no step was taken


def test_an_integer_objective_is_refused(family, target):
    with pytest.raises(ValueError, match=r"objective must return a floating-point scalar.*int"):
        tuning.tune_draft(family, family.uniform(), target,
                          lambda draft, target: jnp.argmax(draft.init), num_steps=1)


def test_a_scalar_objective_still_tunes(family, target):
    result = tuning.tune_draft(family, family.uniform(), target,
                               lambda draft, target: jnp.sum((draft.trans - target.trans) ** 2),
                               num_steps=3)
    assert result.history.shape == (4,) and bool(result.value <= result.history[0])


@pytest.mark.parametrize("transform", ["jit", "vmap"])
def test_tune_draft_under_a_transformation_says_it_is_a_host_side_driver(transform, family,
                                                                         target):
    rejections = tuning.objective(specjax.Speculative(), "rejections")
    if transform == "jit":
        call = lambda: jax.jit(tuning.tune_draft)(family, family.uniform(), target, rejections)
    else:
        targets = jax.tree_util.tree_map(lambda x: jnp.stack([x, x]), target)
        call = lambda: jax.vmap(lambda q: tuning.tune_draft(family, family.uniform(), q,
                                                             rejections).value)(targets)
    with pytest.raises(ValueError, match=r"tune_draft is a host-side driver.*outside jax\.jit"):
        call()


def test_kl_fit_under_jit_says_it_is_a_host_side_driver(family, target):
    with pytest.raises(ValueError, match=r"kl_fit is a host-side driver"):
        jax.jit(tuning.kl_fit)(family, target)


def test_decoding_statistics_under_jit_says_it_is_a_host_side_driver(target):
    draft = specjax.paper_instance(num_states=V, horizon=T)[0]
    with pytest.raises(ValueError, match=r"decoding_statistics is a host-side driver"):
        jax.jit(specjax.decoding_statistics)(jax.random.key(0), specjax.Speculative(), draft,
                                             target, 10)


def test_decoding_statistics_refuses_a_progress_that_is_not_a_bool(target):
    draft = specjax.paper_instance(num_states=V, horizon=T)[0]
    with pytest.raises(ValueError, match=r"progress must be True or False"):
        specjax.decoding_statistics(jax.random.key(0), specjax.Speculative(), draft, target, 10,
                                    progress=jnp.ones(2))


P = jnp.array([0.5, 0.3, 0.2])
Q = jnp.array([0.2, 0.3, 0.5])


@pytest.mark.parametrize("transform", ["jit", "vmap"])
def test_the_audits_under_a_transformation_say_they_run_on_the_host(transform):
    from specjax.auditing import rules
    calls = {
        "audit": lambda p: specjax.audit(jax.random.key(0), rules.speculative_rule, p, Q,
                                         num_samples=100).acceptance_rate,
        "audit_exact": lambda p: specjax.audit_exact(rules.speculative_rule_u, p, Q,
                                                     grid=16).acceptance_rate,
    }
    for name, call in calls.items():
        wrapped = jax.jit(call) if transform == "jit" else jax.vmap(call)
        with pytest.raises(ValueError, match=rf"{name} is a host-side driver.*traced (key|p)\b"):
            wrapped(P if transform == "jit" else jnp.stack([P, P]))


def test_from_uniform_refuses_what_is_not_a_rule():
    from specjax.auditing import rules
    with pytest.raises(ValueError, match=r"verify_u must be a function"):
        rules.from_uniform(0.5)


def test_families_and_objectives_are_static_pytrees(family):
    """What lets jax.jit(tune_draft) reach tune_draft's own check: no leaves, the value itself
    as the tree's static data (a user's family subclass included)."""

    @dataclasses.dataclass(frozen=True)
    class MyFamily(tuning.StationaryDraft):
        pass

    objective = tuning.objective(specjax.Speculative(), "calls")
    for value in (family, MyFamily(V, T), objective):
        leaves, tree = jax.tree_util.tree_flatten(value)
        assert leaves == [] and jax.tree_util.tree_unflatten(tree, []) == value


# The audit's example rules moved to specjax.auditing.rules without an alias once; they are
# served from specjax.auditing again (issue 31, item 5).
@pytest.mark.parametrize("name", ["speculative_rule", "speculative_rule_u", "greedy_rule",
                                  "greedy_rule_u", "accept_all", "accept_all_u",
                                  "wrong_residual", "wrong_residual_u",
                                  "greedy_scored_with_softmax", "greedy_scored_with_softmax_u",
                                  "accepts_at_zero_uniform", "accepts_at_zero_uniform_u",
                                  "from_uniform"])
def test_audit_rule_helpers_are_served_from_auditing(name):
    from specjax.auditing import rules
    assert getattr(specjax.auditing, name) is getattr(rules, name)
