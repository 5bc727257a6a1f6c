"""Engines' acceptance metrics (``specjax.theory.engine_metrics``), checked three ways.

* against a literal SD that records, per call, how many drafts it drafted and kept
  (``reference.sd_rounds_literal``), enumerated exactly over every execution path;
* against the counts an engine would make from ``decode``'s trace (calls, kept drafts per
  position, drafted tokens), as ratios of sums over chains, within ``stats.Z`` standard errors
  of the ratio (delta method);
* across decoders: a chain-shaped tree has SD's metrics.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
import reference as ref
import stats
from conftest import chain
from conftest import full_suite_only
from conftest import random_pair
from sampler_cases import CASES
from sampler_cases import instance


@pytest.mark.parametrize("lookahead", [1, 2, 3, full_suite_only(None)])
def test_metrics_match_literal_sd(lookahead, x64):
    draft, target = random_pair(9, 3, 4, zero_fraction=0.2)
    law = ref.enumerate_law(lambda c: ref.sd_rounds_literal(c, draft, target, lookahead or 4))
    k = lookahead or 4
    calls = sum(prob * len(rec) for rec, prob in law.items())
    drafted = sum(prob * sum(d for d, _ in rec) for rec, prob in law.items())
    accepted_at = [sum(prob * sum(kept >= i for _, kept in rec) for rec, prob in law.items())
                   for i in range(1, k + 1)]
    got = specjax.theory.engine_metrics(specjax.Speculative(lookahead=lookahead), chain(draft),
                                 chain(target))
    np.testing.assert_allclose(np.asarray(got.accepted_at), accepted_at, rtol=0, atol=1e-12)
    assert abs(float(got.expected_calls) - calls) < 1e-12
    assert abs(float(got.expected_drafted) - drafted) < 1e-12
    np.testing.assert_allclose(np.asarray(got.acceptance_per_position),
                               np.asarray(accepted_at) / calls, atol=1e-12)
    reached = [calls] + accepted_at[:-1]
    np.testing.assert_allclose(np.asarray(got.conditional_acceptance),
                               np.asarray(accepted_at) / np.asarray(reached), atol=1e-12)
    assert abs(float(got.mean_acceptance_length) - (1 + sum(accepted_at) / calls)) < 1e-12
    assert abs(float(got.draft_acceptance_rate) - sum(accepted_at) / drafted) < 1e-12


# ----------------------------------------------------------------------------- engine counts
def trace_counts(trace, lookahead: int, drafted_of):
    """Per chain, what an engine counts: ``(calls, kept (C, K) calls keeping >= i drafts,
    drafted tokens)``, from the call starts and rejection flags. A call from ``n`` that drafts
    ``K' = min(K, T - n + 1)`` levels emits ``L`` tokens; it kept ``L - 1`` drafts if its last
    token was a rejection or the bonus after ``K'`` drafts (``L = K' + 1``), else all ``L`` (the
    horizon ended it). Valid for chains and for trees whose leaves are all at depth ``K``."""
    new_call = np.asarray(trace.new_call)
    rejected = np.asarray(trace.rejected)
    num_chains, horizon = new_call.shape
    calls = new_call.sum(-1)
    kept = np.zeros((num_chains, lookahead))
    drafted = np.zeros(num_chains)
    for c in range(num_chains):
        starts = list(np.flatnonzero(new_call[c]) + 1) + [horizon + 1]
        for n, nxt in zip(starts[:-1], starts[1:]):
            length = nxt - n
            depth = min(lookahead, horizon - n + 1)
            last_rejected = rejected[c, nxt - 2]
            accepted = length - 1 if (last_rejected or length == depth + 1) else length
            kept[c, :accepted] += 1
            drafted[c] += drafted_of(depth)
    return calls, kept, drafted


def assert_ratio(num, den, exact: float, what: str):
    """``sum(num) / sum(den)`` against ``exact``: the centred ``num - exact * den`` has mean 0
    when ``exact = E[num] / E[den]``; tested at ``stats.Z`` standard errors."""
    stats.assert_mean(np.asarray(num, np.float64) - exact * np.asarray(den, np.float64), 0.0,
                      what)


#: Cases of ``sampler_cases.CASES``: with its ``instance()`` and test_scale's 3,000 chains, the
#: traces are test_scale's compiled programs (each a distinct sampler compilation otherwise).
MC_DECODERS = {
    "SD K=3": (CASES["sd K=3"], 3, lambda d: d),
    "block K=3": (CASES["block K=3"], 3, lambda d: d),
    "batch M=2 K=2": (CASES["batch M=2 K=2"], 2, lambda d: 2 * d),
    "tree (2, 2)": (CASES["tree (2, 2)"], 2, lambda d: {1: 2, 2: 6}[d]),
}


@pytest.mark.parametrize("name", sorted(MC_DECODERS))
def test_metrics_match_engine_counts_from_traces(name):
    """Every comparison at ``stats.Z`` standard errors (the false-failure rate of
    ``stats.assert_mean``, whatever the number of chains). With 3,000 chains of ``instance()``
    (V = 5, T = 12) that resolves an error of about 0.1 in the expected calls (about 7, so 1.6%)
    and of about 0.015 in the acceptance at the first position (0.44-0.55)."""
    decoder, k, drafted_of = MC_DECODERS[name]
    draft, target = instance()
    got = specjax.theory.engine_metrics(decoder, draft, target)
    trace = specjax.decode(jax.random.key(5), decoder, draft, target, 3000)
    calls, kept, drafted = trace_counts(trace, k, drafted_of)
    assert (calls == np.asarray(trace.num_calls)).all()
    stats.assert_mean(calls, float(got.expected_calls), f"{name}: calls")
    stats.assert_mean(drafted, float(got.expected_drafted), f"{name}: drafted")
    for i in range(k):
        assert_ratio(kept[:, i], calls, float(got.acceptance_per_position[i]),
                     f"{name}: per-position acceptance {i + 1}")
        reached = calls if i == 0 else kept[:, i - 1]
        assert_ratio(kept[:, i], reached, float(got.conditional_acceptance[i]),
                     f"{name}: conditional acceptance {i + 1}")
    total = kept.sum(-1)
    assert_ratio(total + calls, calls, float(got.mean_acceptance_length),
                 f"{name}: mean acceptance length")
    assert_ratio(total, drafted, float(got.draft_acceptance_rate), f"{name}: draft rate")


# ----------------------------------------------------------------------------- across decoders
def test_chain_tree_has_sds_metrics(x64):
    draft, target = (chain(m) for m in random_pair(3, 4, 7, zero_fraction=0.2))
    sd = specjax.theory.engine_metrics(specjax.Speculative(lookahead=3), draft, target)
    tree = specjax.theory.engine_metrics(specjax.TokenTree((1, 1, 1)), draft, target)
    block_free = specjax.theory.engine_metrics(specjax.BlockVerification(3), draft, target)
    for a, b in zip(sd, tree):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-12)
    # Block verification keeps at least as many drafts per call (Sun et al.'s optimality).
    assert float(block_free.mean_acceptance_length) >= float(sd.mean_acceptance_length) - 1e-12


def test_autoregressive_has_no_draft_positions():
    draft, target = specjax.paper_instance()
    got = specjax.theory.engine_metrics(specjax.Autoregressive(), None, target)
    assert got.accepted_at.shape == (0,) and got.acceptance_per_position.shape == (0,)
    assert float(got.mean_acceptance_length) == 1.0
    assert float(got.draft_acceptance_rate) == 0.0
    assert float(got.expected_calls) == target.horizon


@pytest.mark.parametrize("decoder", [specjax.Speculative(lookahead=2), specjax.TokenTree((2, 1))],
                         ids=["sd", "tree"])
def test_finite_values_and_gradients_at_edge_pairs(decoder, x64):
    """p = q (all accepted), disjoint supports (none accepted) and zero rows."""
    from conftest import edge_pair
    draft, target = (chain(m) for m in edge_pair())

    def f(trans):
        m = specjax.theory.engine_metrics(decoder, specjax.MarkovChain(draft.init, trans), target)
        return m.mean_acceptance_length + jnp.sum(m.conditional_acceptance)

    value, grad = jax.jit(jax.value_and_grad(f))(draft.trans)  # op by op: 11 programs more
    assert bool(jnp.isfinite(value)) and bool(jnp.all(jnp.isfinite(grad)))
    same = specjax.theory.engine_metrics(decoder, target, target)
    assert float(same.conditional_acceptance[0]) == pytest.approx(1.0)


def test_validation():
    from specjax.models import NGramModel
    rng = np.random.default_rng(0)
    model = NGramModel(jnp.asarray(rng.dirichlet(np.ones(3), size=3), jnp.float32),
                       2).as_finite_state(2)
    with pytest.raises(ValueError, match="MarkovChain"):
        specjax.theory.engine_metrics(specjax.Speculative(lookahead=2), model, model)
    with pytest.raises(ValueError, match="decoder"):
        specjax.theory.engine_metrics("sd", *specjax.paper_instance())
