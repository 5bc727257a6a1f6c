"""Serving a batch: exact goodput, its lockstep simulation, and the draft-length allocation.

* ``B = 1``: ``serving_rate`` equals ``decoding_time``'s rate for several decoders (1e-10).
* A literal lockstep simulation: ``B`` slots refilled with requests sampled by ``decode``, the
  step clock applied to their calls; its goodput within ``stats.Z`` standard errors (batch
  means) of ``serving_rate``.
* ``allocate_drafts`` equals brute force over every allocation, ``B <= 4``, ``K <= 4``, random
  instances (1e-10), and is never beaten by one ``K`` for all.
* ``request_policy`` is never beaten by ``batch_lookahead`` nor by any fixed ``K``.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
import stats
from specjax.experiments.serving_references import numpy_best_allocation
from specjax.theory import serving
from specjax.theory.cost import call_works

V, T = 4, 5
SD = specjax.Speculative(lookahead=2)
TABLE = [0.0] + [1.0 + 0.02 * n + 0.004 * n * n for n in range(1, 40)]


@pytest.fixture(scope="module")
def pair():
    with jax.enable_x64(True):
        key_d, key_t = jax.random.split(jax.random.key(7))
        draft = specjax.random_markov_chain(key_d, V, T, concentration=0.7)
        target = specjax.random_markov_chain(key_t, V, T, concentration=0.7)
    return draft, target


def test_one_slot_is_decoding_time(pair, x64):
    draft, target = pair
    cost = specjax.CostModel(0.05, TABLE, call_overhead=0.2)
    serving_cost = specjax.ServingCost([0.0, 0.05], TABLE, overhead=0.2)
    decoders = [specjax.Autoregressive(), SD, specjax.TokenTree((2, 2)),
                specjax.AdaptiveSpeculative(specjax.decoders.RejectionThreshold(0.3),
                                            max_lookahead=2)]
    for decoder in decoders:
        p = None if isinstance(decoder, specjax.Autoregressive) else draft
        rate = specjax.serving_rate(decoder, p, target, serving_cost, batch_size=1)
        expected = specjax.theory.decoding_time(decoder, p, target, cost)
        assert rate.tokens_per_time.dtype == jnp.float64
        np.testing.assert_allclose(rate.tokens_per_time, expected.tokens_per_time, rtol=1e-10,
                                   err_msg=decoder.label)
        np.testing.assert_allclose(rate.tokens_per_step * expected.expected_calls, T,
                                   rtol=1e-10)


def lockstep_goodput(trace, decoder, cost, batch_size, num_batches=40, burn_in=10):
    """A literal lockstep run: slot ``b`` decodes requests ``b, b + B, ...`` one after the other,
    one call per step; a step costs its draft passes (pass ``j`` over the slots still drafting),
    the target forward over every slot's tokens and the overhead. Returns the goodput and its
    standard error (batch means over the steps, delta method)."""
    new_call = np.asarray(trace.new_call)
    passes, scored = call_works(decoder, T, decoder.lookahead)
    per_slot = []
    for b in range(batch_size):
        rows = new_call[b::batch_size]
        chain, start = np.nonzero(rows)  # row-major: requests in order, calls in order
        nxt = np.where(np.roll(chain, -1) == chain, np.roll(start, -1), T)
        per_slot.append((passes[start], scored[start], nxt - start))
    steps = min(len(s[0]) for s in per_slot)
    pass_counts = np.stack([s[0][:steps] for s in per_slot])
    scored_total = np.stack([s[1][:steps] for s in per_slot]).sum(0)
    tokens = np.stack([s[2][:steps] for s in per_slot]).sum(0)
    draft = cost.draft_times(batch_size)
    target = cost.target_times(int(scored_total.max()))
    draft_part = sum(draft[(pass_counts >= j).sum(0)] for j in range(1, pass_counts.max() + 1))
    times = draft_part + target[scored_total] + cost.overhead
    tokens, times = tokens[burn_in:], times[burn_in:]
    size = len(times) // num_batches
    tok = tokens[:size * num_batches].reshape(num_batches, size).sum(1)
    tim = times[:size * num_batches].reshape(num_batches, size).sum(1)
    rate = tok.sum() / tim.sum()
    residual = (tok - rate * tim) / tim.mean()  # the delta method's linearisation of the ratio
    return rate, residual.std(ddof=1) / np.sqrt(num_batches)


def test_lockstep_simulation(pair, x64):
    draft, target = pair
    batch_size = 3
    cost = specjax.ServingCost(lambda n: 0.1 + 0.03 * n, TABLE, overhead=0.1)
    trace = specjax.decode(jax.random.key(11), SD, draft, target, 6000)
    rate, se = lockstep_goodput(trace, SD, cost, batch_size)
    exact = float(specjax.serving_rate(SD, draft, target, cost,
                                       batch_size=batch_size).tokens_per_time)
    assert abs(rate - exact) <= stats.Z * se, (rate, exact, se)
    ar = specjax.serving_rate(specjax.Autoregressive(), None, target, cost,
                              batch_size=batch_size)
    np.testing.assert_allclose(ar.tokens_per_time, batch_size / (TABLE[batch_size] + 0.1),
                               rtol=1e-12)


def random_instance(rng, batch, depth):
    steps = rng.uniform(0, 1, (batch, depth)) ** rng.uniform(0.2, 2)
    steps[rng.random((batch, depth)) < 0.1] = 0.0
    steps[rng.random((batch, depth)) < 0.1] = 1.0
    survival = np.cumprod(steps, axis=1)
    intercept, slope = rng.uniform(0, 0.2, 2)
    increments = rng.uniform(0, 0.6, batch * (depth + 1)) * (rng.random(batch * (depth + 1)) < 0.5)
    target = np.concatenate([[0.0], 1.0 + np.cumsum(increments)])
    cost = specjax.ServingCost([0.0] + [intercept + slope * n
                                        for n in range(1, batch + 1)],
                               target, overhead=rng.uniform(0, 0.5))
    return survival, cost


def test_allocation_is_brute_force():
    rng = np.random.default_rng(0)
    for batch, depth in itertools.product(range(1, 5), range(1, 5)):
        for _ in range(3):
            survival, cost = random_instance(rng, batch, depth)
            best = specjax.theory.allocate_drafts(survival, cost)
            brute, _ = numpy_best_allocation(survival, cost.draft_times(batch),
                                             cost.target_times(batch * (depth + 1)),
                                             cost.overhead)
            np.testing.assert_allclose(best.tokens_per_time, brute, rtol=1e-10)
            assert np.isclose(best.time, serving.step_time(best.lookaheads, cost), rtol=1e-12)
            for k in range(depth + 1):  # one K for all, SD off (k = 0) included
                fixed = np.full(batch, k)
                tokens = batch + survival[:, :k].sum()
                assert tokens / serving.step_time(fixed, cost) <= best.tokens_per_time * (
                    1 + 1e-12)


def test_request_policy_is_never_beaten(pair, x64):
    draft, target = pair
    cost = specjax.ServingCost(0.1, serving.roofline(1.0, knee=6, size=40))
    batch = specjax.theory.batch_lookahead(draft, target, cost, batch_size=4, max_lookahead=2)
    best = specjax.theory.request_policy(draft, target, cost, batch_size=4, max_lookahead=2,
                                         prices=[0.2, 0.5, 0.8])
    assert best.tokens_per_time >= batch.tokens_per_time >= batch.fixed_rates.max() - 1e-12
    exact = specjax.serving_rate(best.decoder, draft if best.lookahead else None, target, cost,
                                 batch_size=4)
    np.testing.assert_allclose(exact.tokens_per_time, best.tokens_per_time, rtol=1e-12)


def test_edge_cases_are_finite(pair, x64):
    draft, target = pair
    cost = specjax.ServingCost(0.1, TABLE)
    same = specjax.serving_rate(SD, target, target, cost, batch_size=2)
    assert np.isfinite(same.tokens_per_time)
    np.testing.assert_allclose(same.tokens_per_step, 2 * T / 2, rtol=1e-12)  # calls at 1 and 4
    trans = jnp.zeros_like(target.trans).at[..., 0].set(1.0)
    other = jnp.zeros_like(target.trans).at[..., 1].set(1.0)
    disjoint = specjax.serving_rate(SD, specjax.MarkovChain(target.init, trans),
                                    specjax.MarkovChain(target.init, other), cost, batch_size=2)
    np.testing.assert_allclose(disjoint.tokens_per_step, 2.0, rtol=1e-12)  # one token a call

    def rate(trans):
        model = specjax.MarkovChain(target.init, trans)
        return specjax.serving_rate(SD, draft, model, cost, batch_size=2).tokens_per_time

    grad = jax.grad(rate)(target.trans)
    assert np.isfinite(np.asarray(grad)).all()


def test_bad_input(pair):
    with pytest.raises(ValueError, match="target_time"):
        specjax.ServingCost(0.1, [0.0, -1.0])
    with pytest.raises(ValueError, match="draft_time"):
        specjax.ServingCost([[0.1]], 1.0)
    with pytest.raises(ValueError, match="overhead"):
        specjax.ServingCost(0.1, 1.0, overhead=-1)
    draft, target = pair
    with pytest.raises(ValueError, match="target_time is a table"):
        specjax.serving_rate(SD, draft, target, specjax.ServingCost(0.1, [0.0, 1.0, 1.0]),
                             batch_size=2)
    with pytest.raises(ValueError, match="batch_size"):
        specjax.serving_rate(SD, draft, target, specjax.ServingCost(0.1, 1.0), batch_size=0)
    with pytest.raises(ValueError, match="cost"):
        specjax.serving_rate(SD, draft, target, specjax.CostModel(0.1, 1.0), batch_size=2)
    with pytest.raises(ValueError, match="non-increasing"):
        specjax.theory.allocate_drafts([[0.5, 0.6]], specjax.ServingCost(0.1, 1.0))
    with pytest.raises(ValueError, match="affine"):
        specjax.theory.allocate_drafts([[0.5], [0.4], [0.3]],
                                       specjax.ServingCost([0.0, 1.0, 1.0, 2.0], 1.0))


def literal_lockstep(rng, draft, target, thresholds, cost, *, batch_size, systems, steps,
                     burn_in):
    """A literal lockstep run of ``systems`` independent batches of ``B`` slots, each slot
    decoding requests by SD whose drafting stops, before draft ``i + 1``, iff ``A_i <=
    thresholds[n - 1, i, x_i]`` (``AdaptiveSpeculative``'s ``ThresholdTable``), written here
    from the algorithm in NumPy (``decode``'s trace does not say how many tokens a call drafted
    after a rejection, which the clock needs). A finished request (``T`` tokens) is replaced by a
    fresh one at the next step. Returns the goodput over the steps after ``burn_in`` and its
    standard error (the systems are independent; delta method)."""
    p, q = np.asarray(draft.trans), np.asarray(target.trans)
    init = np.asarray(target.init)
    horizon, num_states = q.shape[0], q.shape[-1]
    depth = thresholds.shape[1] - 1
    shape = (systems, batch_size)
    cum_p, cum_q = np.cumsum(p, -1), np.cumsum(q, -1)
    residual = np.maximum(q - p, 0)
    cum_r = np.cumsum(residual, -1)

    def draw(cumulative):
        u = rng.random(cumulative.shape[:-1]) * cumulative[..., -1]
        return np.minimum((u[..., None] >= cumulative).sum(-1), num_states - 1)

    n = np.ones(shape, np.int64)
    prev = draw(np.broadcast_to(np.cumsum(init), shape + (num_states,)))
    draft_table = cost.draft_times(batch_size)
    target_table = cost.target_times(batch_size * (depth + 1))
    tokens = np.zeros(systems)
    times = np.zeros(systems)
    for step in range(steps):
        drafts = np.zeros(shape + (depth,), np.int64)
        accept = np.ones(shape + (depth,))
        x, survival = prev.copy(), np.ones(shape)
        drafted = np.zeros(shape, np.int64)
        live = np.ones(shape, bool)
        for i in range(depth):
            row = np.minimum(n - 1 + i, horizon - 1)
            live &= (i < horizon - n + 1) & ~(survival <= thresholds[n - 1, i, x])
            y = draw(cum_p[row, x])
            pxy, qxy = p[row, x, y], q[row, x, y]
            a = np.minimum(1.0, np.where(pxy > 0, qxy / np.where(pxy > 0, pxy, 1), 1.0))
            drafts[..., i] = np.where(live, y, 0)
            accept[..., i] = np.where(live, a, 1.0)
            survival = np.where(live, survival * a, survival)
            x = np.where(live, y, x)
            drafted += live
        kept_each = rng.random(shape + (depth,)) < accept
        kept_each |= np.arange(depth) >= drafted[..., None]
        kept = np.argmin(np.concatenate([kept_each, np.zeros(shape + (1,), bool)], -1), -1)
        rejected = kept < drafted
        kept = np.minimum(kept, drafted)
        parent = np.where(kept > 0, np.take_along_axis(drafts, np.maximum(kept - 1, 0)[..., None],
                                                       -1)[..., 0], prev)
        row = np.minimum(n - 1 + kept, horizon - 1)
        last = np.where(rejected, draw(cum_r[row, parent]), draw(cum_q[row, parent]))
        emitted = np.minimum(kept + 1, horizon - n + 1)
        counts = [(drafted >= j).sum(1) for j in range(1, depth + 1)]
        time = (sum(draft_table[c] for c in counts) + target_table[(drafted + 1).sum(1)]
                + cost.overhead)
        if step >= burn_in:
            tokens += emitted.sum(1)
            times += time
        n = n + emitted
        prev = last  # a request past its end is replaced below
        done = n > horizon
        n = np.where(done, 1, n)
        prev = np.where(done, draw(np.broadcast_to(np.cumsum(init), shape + (num_states,))),
                        prev)
    rate = tokens.sum() / times.sum()
    residual_rate = (tokens - rate * times) / times.mean()
    return rate, residual_rate.std(ddof=1) / np.sqrt(systems)


def test_literal_lockstep_per_request_and_fixed(pair, x64):
    draft, target = pair
    batch_size = 3
    cost = specjax.ServingCost(lambda n: 0.1 + 0.03 * n, TABLE, overhead=0.1)
    rng = np.random.default_rng(5)
    per_request = serving.threshold_decoder(draft, target, 0.45, max_lookahead=2)
    fixed = np.full((T, 3, V), -1.0)
    fixed[:, 2] = 1.0  # SD with K = 2: go on before depth 2, stop there
    for thresholds, decoder in ((np.asarray(per_request.policy.thresholds), per_request),
                                (fixed, SD)):
        rate, se = literal_lockstep(rng, draft, target, thresholds, cost, batch_size=batch_size,
                                    systems=3000, steps=40, burn_in=8)
        exact = float(specjax.serving_rate(decoder, draft, target, cost,
                                           batch_size=batch_size).tokens_per_time)
        assert abs(rate - exact) <= stats.Z * se, (decoder.label, rate, exact, se)


def test_stationary_one_slot_is_stationary_rate(x64):
    rows = jnp.asarray([[0.6, 0.3, 0.1], [0.2, 0.5, 0.3], [0.0, 0.4, 0.6]])
    q = specjax.MarkovChain(jnp.full(3, 1 / 3), jnp.broadcast_to(rows, (T, 3, 3)))
    p = specjax.MarkovChain(q.init, jnp.full((T, 3, 3), 1 / 3))
    cost = specjax.CostModel(0.05, TABLE, call_overhead=0.2)
    serving_cost = specjax.ServingCost([0.0, 0.05], TABLE, overhead=0.2)
    for policy in (specjax.decoders.FixedLength(2), specjax.decoders.RejectionThreshold(0.3)):
        decoder = specjax.AdaptiveSpeculative(policy, max_lookahead=2)
        expected = specjax.theory.stationary_rate(decoder, p, q, cost)
        rate = specjax.serving_rate(decoder, p, q, serving_cost, batch_size=1, stationary=True)
        np.testing.assert_allclose(rate.tokens_per_time, expected.tokens_per_time, rtol=1e-10)
        np.testing.assert_allclose(rate.tokens_per_step, expected.tokens_per_call, rtol=1e-10)
        wide = specjax.serving_rate(decoder, p, q, specjax.ServingCost(0.05, TABLE),
                                    batch_size=4, stationary=True)
        np.testing.assert_allclose(wide.tokens_per_step, 4 * expected.tokens_per_call,
                                   rtol=1e-10)
