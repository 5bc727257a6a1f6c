"""``compare_outputs`` on hand-written engine samplers (correct and with the classic bugs), and
``process_logits`` / ``process_chain`` against independent NumPy processing and brute force.

False failures: each test of a correct sampler runs ``compare_outputs`` at ``alpha = ALPHA``
(1e-5, the suite's rate per goodness-of-fit test). The bug tests first check from the exact laws
that the bug changes the law materially (so that detection is a matter of power, stated per test),
then require the flag.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from conftest import random_rows
from engine_reference import end_output
from engine_reference import literal_law
from engine_reference import literal_process
from engine_reference import literal_verify
from reference import exact_counts
from stats import ALPHA

SD = specjax.Speculative()
K, V = 3, 6


def _softmax(logits, temperature=1.0):
    p = np.asarray(specjax.process_logits(jnp.asarray(logits), temperature=temperature),
                   np.float64)
    return p / p.sum(-1, keepdims=True)  # float32 rows made float64 laws for NumPy


def _instance(seed, num_requests=4, greedy=False, temperature=1.0, scale=1.5, zero_fraction=0.3):
    """Requests whose drafts are drawn from softmax(logits / temperature) (or its argmax);
    logits of standard deviation ``scale``."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, scale, (num_requests, K, V))
    p = _softmax(logits, temperature)
    q = random_rows(rng, (num_requests, K + 1, V), zero_fraction=zero_fraction)
    x = p.argmax(-1) if greedy else np.array([[rng.choice(V, p=r) for r in rows] for rows in p])
    counts = np.array([3, 2, 0, 3, 1, 3, 2, 1])[:num_requests] if num_requests <= 8 else \
        rng.integers(0, K + 1, num_requests)
    return logits, x, p, q, counts


def _run(x, p, q, counts, runs, seed, bug=None, greedy=False, zero_uniforms=False):
    """``runs`` runs of every request through the literal sampler: ``(R, B, K + 1)``."""
    rng = np.random.default_rng(seed)
    out = np.empty((runs, len(x), K + 1), np.int64)
    for r in range(runs):
        u = rng.random((len(x), K))
        v = rng.random((len(x), K + 1))
        if zero_uniforms and r % 4 == 0:  # as engines' own tests inject u = 0.0
            u[:] = 0.0
        for b in range(len(x)):
            out[r, b] = literal_verify(x[b], p[b], q[b], counts[b], u[b], v[b], bug=bug,
                                       greedy=greedy)
    return out


def _mean_accepted(x, p, q, counts, greedy=False):
    laws = [literal_law(x[b], p[b], q[b], counts[b], greedy) for b in range(len(x))]
    return np.mean([(law.sum(-1) * np.arange(K + 1)).sum() for law in laws])


def test_a_correct_sampler_passes():
    _, x, p, q, counts = _instance(0)
    for greedy in (False, True):
        xs = p.argmax(-1) if greedy else x
        runs = _run(xs, p, q, counts, 1500, seed=1, greedy=greedy)
        result = specjax.compare_outputs(SD, xs, None if greedy else p, q, runs,
                                         num_drafts=counts, alpha=ALPHA)
        assert not result.flagged, result.summary()
        assert result.impossible == 0 and result.num_runs == 1500
        assert result.length_counts.sum() == 1500 * 4
        assert abs(result.mean_length - result.mean_length_expected) \
            < 4.5 * result.mean_length_se


def test_many_requests_one_run_each():
    """2,000 different requests, one run each: the tests pool categories across requests."""
    _, x, p, q, counts = _instance(2, num_requests=2000)
    runs = _run(x, p, q, counts, 1, seed=3)
    result = specjax.compare_outputs(SD, x, p, q, runs, num_drafts=counts, alpha=ALPHA)
    assert not result.flagged, result.summary()
    bad = _run(x, p, q, counts, 1, seed=3, bug="accept_all")
    assert specjax.compare_outputs(SD, x, p, q, bad, num_drafts=counts).flagged


def test_accept_all_is_flagged():
    _, x, p, q, counts = _instance(4)
    assert _mean_accepted(x, p, q, counts) < 0.8 * counts.mean()  # the bug changes n's law
    result = specjax.compare_outputs(SD, x, p, q, _run(x, p, q, counts, 500, 5, "accept_all"),
                                     num_drafts=counts)
    assert result.flagged and result.length_pvalue < 1e-10, result.summary()


def test_every_output_impossible_gives_a_nan_mean_length_without_warnings():
    _, x, p, q, counts = _instance(4)
    runs = np.full((3, len(x), K + 1), -1)  # nothing emitted: malformed, impossible
    result = specjax.compare_outputs(SD, x, p, q, runs, num_drafts=counts)
    assert result.flagged and result.impossible == runs.shape[0] * len(x)
    assert np.isnan(result.mean_length)


def test_a_residual_from_the_wrong_law_is_flagged():
    """Resampling from q instead of [q - p]_+ emits tokens the residual cannot produce:
    impossible outcomes, proof of the bug whatever the sample size."""
    _, x, p, q, counts = _instance(6)
    result = specjax.compare_outputs(SD, x, p, q,
                                     _run(x, p, q, counts, 500, 7, "wrong_residual"),
                                     num_drafts=counts)
    assert result.flagged and result.impossible > 0, result.summary()
    assert result.impossible_examples


def test_ratio_at_least_u_is_flagged_when_runs_draw_u_zero():
    """``q / p >= u`` accepts a zero-target-probability draft at ``u = 0.0`` exactly. Runs that
    inject ``u = 0`` are not draws from the uniform law, so only two checks are valid on them:
    token for token against ``verify_drafts`` on the same uniforms, and impossible outcomes."""
    _, x, p, q, counts = _instance(8)
    q = q.copy()
    q[0, 0] = 0.0
    q[0, 0, (x[0, 0] + 1) % V] = 1.0  # the first draft of request 0 has q(x) = 0 < p(x)
    assert p[0, 0, x[0, 0]] > 0
    u = np.random.default_rng(9).random((400, 4, K))
    u[::4] = 0.0
    v = np.random.default_rng(10).random((400, 4, K + 1))
    runs = {bug: np.stack([[literal_verify(x[b], p[b], q[b], counts[b], u[r, b], v[r, b],
                                           bug=bug) for b in range(4)] for r in range(400)])
            for bug in (None, "zero_uniform")}
    ours = specjax.verify_drafts(None, SD, np.tile(x, (400, 1)), np.tile(p, (400, 1, 1)),
                                 np.tile(q, (400, 1, 1)), num_drafts=np.tile(counts, 400),
                                 uniforms=(u.reshape(1600, K), v.reshape(1600, K + 1)))
    ours = np.asarray(ours.tokens).reshape(400, 4, K + 1)
    np.testing.assert_array_equal(runs[None], ours)  # the correct engine agrees everywhere
    differ = np.any(runs["zero_uniform"] != ours, axis=-1)
    assert differ[::4, 0].all() and not differ[1::4].any()  # exactly the u = 0 runs differ
    assert specjax.compare_outputs(SD, x, p, q, runs[None], num_drafts=counts).impossible == 0
    result = specjax.compare_outputs(SD, x, p, q, runs["zero_uniform"], num_drafts=counts)
    assert result.flagged and result.impossible == 100, result.summary()


def _detectable(gap, x, p, q, counts, runs, greedy=False):
    """The bug moves the mean number accepted by more than 6 of its standard errors at this
    number of runs (the number-accepted test then flags it with probability above 0.99)."""
    laws = [literal_law(x[b], p[b], q[b], counts[b], greedy).sum(-1) for b in range(len(x))]
    n = np.arange(K + 1)
    var = sum((law * n ** 2).sum() - (law * n).sum() ** 2 for law in laws) / len(x)
    return abs(gap) > 6 * np.sqrt(var / (runs * len(x)))


def test_greedy_drafts_scored_with_softmax_are_flagged():
    _, _, p, q, counts = _instance(10, greedy=True, scale=0.5)  # flat drafts: max p about 0.3
    x = p.argmax(-1)
    gap = _mean_accepted(x, p, q, counts, greedy=True) - _mean_accepted(x, p, q, counts)
    assert _detectable(gap, x, p, q, counts, 3000, greedy=True)
    runs = _run(x, p, q, counts, 3000, 11, "softmax_greedy", greedy=True)
    result = specjax.compare_outputs(SD, x, None, q, runs, num_drafts=counts)
    assert result.flagged, result.summary()


def test_draft_sampled_at_one_temperature_scored_at_another_is_flagged():
    logits, x, p_cold, q, counts = _instance(12, temperature=0.7)
    p_warm = _softmax(logits)
    gap = _mean_accepted(x, p_warm, q, counts) - _mean_accepted(x, p_cold, q, counts)
    assert _detectable(gap, x, p_cold, q, counts, 8000)
    runs = _run(x, p_warm, q, counts, 8000, 13)  # the engine uses the T = 1.0 rows
    result = specjax.compare_outputs(SD, x, p_cold, q, runs, num_drafts=counts)
    assert result.flagged, result.summary()


def test_stop_tokens_and_a_dropped_bonus():
    """An engine with an end-of-sequence token and without bonus tokens: the correct sampler
    passes; one that keeps verifying past the end token, or emits the bonus anyway, is flagged
    (outputs the exact law gives probability zero)."""
    _, x, p, q, counts = _instance(18, zero_fraction=0.0)  # every draft can be kept
    law = specjax.verify_drafts_law(SD, x, p, q, num_drafts=counts)
    # The end token: the first draft of the request with K_b >= 2 most likely to keep it, so
    # that runs verify past it (at least 100 expected) and the first bug shows.
    ranked = [b for b in np.argsort(-np.asarray(law.acceptance[:, 0])) if counts[b] >= 2]
    stop = [int(x[ranked[0], 0])]
    assert 1500 * float(law.acceptance[ranked[0], 0]) > 100
    # Some runs keep every draft of some request (at least 20 expected): the second bug shows.
    all_kept = np.asarray(law.num_accepted)[np.arange(4), counts]
    assert 1500 * float(all_kept[counts > 0].max()) > 20
    raw = _run(x, p, q, counts, 1500, 19)
    ended = np.stack([[end_output(raw[r, b], counts[b], stop, bonus=False) for b in range(4)]
                      for r in range(1500)])
    result = specjax.compare_outputs(SD, x, p, q, ended, num_drafts=counts, stop_tokens=stop,
                                     bonus=False, alpha=ALPHA)
    assert not result.flagged, result.summary()
    past_stop = np.stack([[end_output(raw[r, b], counts[b], (), bonus=False) for b in range(4)]
                          for r in range(1500)])
    result = specjax.compare_outputs(SD, x, p, q, past_stop, num_drafts=counts,
                                     stop_tokens=stop, bonus=False)
    assert result.flagged and result.impossible > 0
    with_bonus = np.stack([[end_output(raw[r, b], counts[b], stop) for b in range(4)]
                           for r in range(1500)])
    result = specjax.compare_outputs(SD, x, p, q, with_bonus, num_drafts=counts,
                                     stop_tokens=stop, bonus=False)
    assert result.flagged and result.impossible > 0


def test_rare_categories_do_not_raise_false_alarms(x64):
    """A token of probability 5e-5 seen once in 1,000 runs, alone or beside a request that
    surely emits it (expected counts large, variance tiny): no flag (the review's reproducers).
    Under x64 with float64 rows (which once crashed on a read-only array)."""
    q = np.array([[1 - 5e-5, 5e-5]])
    runs = np.zeros((1000, 1), np.int64)
    runs[0] = 1
    result = specjax.compare_outputs(SD, np.zeros((0,), np.int32), None, q, runs)
    assert not result.flagged and result.impossible == 0
    q2 = np.array([[[0.0, 1.0]], [[1 - 5e-5, 5e-5]]])
    runs2 = np.zeros((1000, 2, 1), np.int64)
    runs2[:, 0] = 1
    runs2[0, 1] = 1
    assert not specjax.compare_outputs(SD, np.zeros((2, 0), np.int32), None, q2, runs2).flagged


def test_false_alarm_rate_of_correct_samplers():
    """300 replicates of 200 different ragged requests run once each by ``verify_drafts``
    (correct): flagged at alpha = 0.05 at most 33 times (the 1e-5 upper quantile of
    Binomial(300, 0.05): a false failure has probability below 1e-5 if the stated rate holds;
    a true rate of 0.15 fails with probability 0.97)."""
    rng = np.random.default_rng(21)
    num_requests, reps = 200, 300
    p = random_rows(rng, (num_requests, K, V))
    q = random_rows(rng, (num_requests, K + 1, V), zero_fraction=0.3)
    x = np.array([[rng.choice(V, p=r) for r in rows] for rows in p])
    counts = rng.integers(0, K + 1, num_requests)
    tile = lambda a: np.tile(a, (reps,) + (1,) * (a.ndim - 1))  # noqa: E731
    out = specjax.verify_drafts(jax.random.key(22), SD, tile(x), tile(p).astype(np.float32),
                                tile(q).astype(np.float32), num_drafts=tile(counts))
    runs = np.asarray(out.tokens).reshape(reps, 1, num_requests, K + 1)
    flags = sum(specjax.compare_outputs(SD, x, p, q, runs[r], num_drafts=counts,
                                        alpha=0.05).flagged for r in range(reps))
    assert flags <= 33, flags


def test_compare_refuses_bad_outputs_and_settings():
    _, x, p, q, counts = _instance(14)
    runs = _run(x, p, q, counts, 3, 15)
    with pytest.raises(ValueError, match="tokens"):
        specjax.compare_outputs(SD, x, p, q, runs[..., :K], num_drafts=counts)
    with pytest.raises(ValueError, match="tokens"):
        specjax.compare_outputs(SD, x, p, q, runs.astype(float), num_drafts=counts)
    with pytest.raises(ValueError, match="tokens"):
        specjax.compare_outputs(SD, x, p, q, runs.astype(np.uint32), num_drafts=counts)
    with pytest.raises(ValueError, match="tokens"):
        specjax.compare_outputs(SD, x, p, q, runs[:0], num_drafts=counts)
    with pytest.raises(ValueError, match="alpha"):
        specjax.compare_outputs(SD, x, p, q, runs, num_drafts=counts, alpha=1.5)
    with pytest.raises(ValueError, match="stop_tokens"):
        specjax.compare_outputs(SD, x, p, q, runs, num_drafts=counts, stop_tokens=[V])
    with pytest.raises(ValueError, match="bonus"):
        specjax.compare_outputs(SD, x, p, q, runs, num_drafts=counts, bonus=jnp.array(True))
    malformed = runs.copy()
    malformed[0, 0] = [-1, 2, -1, -1]  # a token after the padding
    result = specjax.compare_outputs(SD, x, p, q, malformed, num_drafts=counts)
    assert result.impossible >= 1 and result.flagged


# ---------------------------------------------------------------------------------------------
# Logits processing.

SETTINGS = [dict(), dict(temperature=0.6), dict(temperature=1.7, top_k=3),
            dict(top_p=0.7), dict(min_p=0.2), dict(temperature=0.8, top_k=4, top_p=0.85),
            dict(top_p=0.6, min_p=0.3), dict(temperature=0.0), dict(top_k=1), dict(top_p=1.0)]


def test_processing_equals_the_literal_semantics(x64):
    rng = np.random.default_rng(16)
    logits = rng.normal(0, 2, (20, 7))
    logits[0, :3] = -np.inf
    for settings, order in itertools.product(SETTINGS, ("vllm", "huggingface")):
        got = np.asarray(specjax.process_logits(jnp.asarray(logits), order=order, **settings))
        want = np.stack([literal_process(row, order=order, **settings) for row in logits])
        np.testing.assert_allclose(got, want, atol=1e-12, err_msg=f"{settings}, {order}")
    a = specjax.process_logits(jnp.asarray(logits), top_p=0.6, min_p=0.3)
    b = specjax.process_logits(jnp.asarray(logits), top_p=0.6, min_p=0.3, order="huggingface")
    assert not np.allclose(a, b)  # the orders differ when top-p and min-p are both set


def test_exact_acceptance_under_processing_equals_brute_force(x64):
    """SD's expected rejections and calls on processed chains (lookahead 2) against the
    brute-force recursion on rows processed by the literal NumPy semantics."""
    rng = np.random.default_rng(17)
    horizon, num_tokens = 3, 5
    draft = specjax.MarkovChain.from_logits(jnp.asarray(rng.normal(0, 1, num_tokens)),
                                            jnp.asarray(rng.normal(0, 1.5, (horizon, 5, 5))))
    target = specjax.MarkovChain.from_logits(jnp.asarray(rng.normal(0, 1, num_tokens)),
                                             jnp.asarray(rng.normal(0, 1.5, (horizon, 5, 5))))

    def literal_chain(chain, settings):
        init = literal_process(np.log(np.asarray(chain.init)), **settings)
        trans = np.apply_along_axis(lambda r: literal_process(np.log(r), **settings), -1,
                                    np.asarray(chain.trans))
        return init, trans

    for d_settings, t_settings in [(dict(temperature=0.7), dict(temperature=0.7)),
                                   (dict(temperature=0.5), dict(temperature=1.0)),
                                   (dict(top_k=2), dict(top_p=0.8)),
                                   (dict(temperature=1.3, min_p=0.1), dict(top_k=3, top_p=0.9)),
                                   (dict(temperature=0.0), dict())]:
        result = specjax.exact(specjax.Speculative(2),
                               specjax.models.process_chain(draft, **d_settings),
                               specjax.models.process_chain(target, **t_settings))
        d, t = literal_chain(draft, d_settings), literal_chain(target, t_settings)
        rejections, calls = exact_counts(d, (t[0], t[1]), lookahead=2)
        np.testing.assert_allclose(result.expected_rejections, rejections, atol=1e-12)
        np.testing.assert_allclose(result.expected_calls, calls, atol=1e-12)


def test_processing_refuses_bad_settings():
    logits = jnp.zeros(4)
    for settings, name in [(dict(temperature=-1.0), "temperature"), (dict(top_k=0), "top_k"),
                           (dict(top_k=2.5), "top_k"), (dict(top_p=0.0), "top_p"),
                           (dict(min_p=1.5), "min_p"), (dict(order="sglang"), "order")]:
        with pytest.raises(ValueError, match=name):
            specjax.process_logits(logits, **settings)
    with pytest.raises(ValueError, match="no finite logit"):
        specjax.process_logits(jnp.full(3, -jnp.inf))
    with pytest.raises(ValueError, match="chain"):
        specjax.models.process_chain(logits)
    with pytest.raises(ValueError, match="temperature"):
        specjax.process_logits(logits, temperature="1")
    tiny = specjax.process_logits(jnp.log(jnp.array([0.5, 0.3, 0.2])), temperature=1e-45)
    np.testing.assert_array_equal(tiny, [1, 0, 0])  # below vLLM's 1e-5: greedy


def test_processing_every_model_kind(x64):
    """``process_model``: a finite-state lift and an n-gram keep their kind with processed tables,
    and their exact values equal those of the processed Markov chain; a model that gives logits
    becomes a protocol model (``ProcessedModel``) that ``decode`` runs; settings work traced.
    V = 5, T = 3 and Speculative(2): the shapes of
    test_exact_acceptance_under_processing_equals_brute_force, whose programs this reuses."""
    rng = np.random.default_rng(20)
    rows = jnp.asarray(rng.dirichlet(np.ones(5), size=5))
    draft, target = (specjax.MarkovChain(jnp.full(5, 0.2), jnp.broadcast_to(r, (3, 5, 5)))
                     for r in (rows, jnp.asarray(rng.dirichlet(np.ones(5), size=5))))
    settings = dict(temperature=0.7, top_k=3, top_p=0.9)
    want = specjax.exact(specjax.Speculative(2), specjax.models.process_chain(draft, **settings),
                         specjax.models.process_chain(target, **settings)).expected_calls
    lifted = [specjax.models.process_model(specjax.FiniteStateModel.from_markov_chain(m),
                                           **settings)
              for m in (draft, target)]
    assert isinstance(lifted[0], specjax.FiniteStateModel)
    got = specjax.exact(specjax.Speculative(2), *lifted, horizon=3).expected_calls
    np.testing.assert_allclose(got, want, atol=1e-12)
    ngram = specjax.models.process_model(specjax.NGramModel(rows, 2), **settings)
    np.testing.assert_allclose(ngram.table, specjax.process_logits(jnp.log(rows), **settings),
                               atol=1e-15)

    @specjax.decoder_dataclass
    class LogitsBigram:  # a user's model that gives logits
        weights: jax.Array = specjax.array_field()

        @property
        def num_states(self):
            return self.weights.shape[-1]

        def init_state(self):
            return jnp.int32(0)

        def logits(self, state):
            return self.weights[state]

        def update(self, state, token):
            del state
            return token.astype(jnp.int32)

    model = LogitsBigram(jnp.asarray(rng.normal(size=(5, 5))))
    wrapped = specjax.models.process_model(model, temperature=0.5, min_p=0.2)
    for state in range(5):
        np.testing.assert_allclose(
            wrapped.probs(jnp.int32(state)),
            literal_process(np.asarray(model.weights[state]), temperature=0.5, min_p=0.2),
            atol=1e-12)
    trace = specjax.decode(jax.random.key(0), specjax.Speculative(2), wrapped,
                           specjax.models.process_model(model), 16, horizon=5)
    assert trace.tokens.shape == (16, 6)
    traced = jax.jit(lambda t, p: specjax.process_logits(model.weights, temperature=t, top_p=p))
    np.testing.assert_allclose(traced(0.5, 0.8), specjax.process_logits(
        model.weights, temperature=0.5, top_p=0.8), atol=1e-12)
    np.testing.assert_allclose(traced(0.0, 0.8), jax.nn.one_hot(model.weights.argmax(-1), 5))
