"""Recordings from engines' top-k log-probabilities (issue 47, item 1): ``from_top_k``.

* exactness: on a V = 4, T = 4 pair with zeros, disjoint supports and p = q rows, every sequence
  enumerated and weighted by its target probability, the full rows cut to vLLM-style entries (the
  target's top 2, the draft's top 1, each with the emitted token's entry added where it is not
  among them, in a shuffled order): ``estimate`` of SD (K = 1..4), ``HeuristicSchedule`` and
  SpecDec++'s ``RejectionThreshold`` equals ``specjax.exact`` to 1e-10 in float64, from
  probabilities and from log-probabilities, and the recording is ``from_statistics``'s; the
  outside mass is ``1 - sum`` of the full rows over the given ids;
* ragged requests: every sequence up to its first stop token (``lengths=``, ``eos=``, padding
  garbage), SD equals ``exact(..., stop_tokens=...)`` to 1e-10;
* Monte Carlo: ``record``'s rows of the paper's instance cut to top-3 entries give SD's estimate
  of ``record``'s own statistics, within 4.5 standard errors of ``exact``;
* ``pack_top_k``: engines' per-position dicts (floats or vLLM-like ``Logprob`` objects);
* refusals: the emitted token missing (naming the sequence and the position), multi-draft roots,
  trees and row-reading policies (naming the mass outside the top k), bad shapes, ids, values,
  duplicates and sums over 1.
"""

from __future__ import annotations

import types

import jax
import numpy as np
import pytest

import specjax
from conftest import every_ragged_sequence
from conftest import every_sequence
from specjax.pairs import Recording
from specjax.pairs import from_top_k
from specjax.pairs import pack_top_k

D = specjax.decoders
V, T, STOP = 4, 4, 2
DECODERS = {
    **{f"sd{k}": specjax.Speculative(lookahead=k) for k in range(1, 5)},
    "schedule": D.HeuristicSchedule(1, max_lookahead=3),
    "specdec++": specjax.AdaptiveSpeculative(D.RejectionThreshold(0.5), max_lookahead=3),
}


def _pair():
    rng = np.random.default_rng(11)
    init = rng.dirichlet(np.ones(V))
    p = rng.dirichlet(np.ones(V), size=(T, V))
    q = rng.dirichlet(np.ones(V), size=(T, V))
    q[1, 2] = [0.0, 0.3, 0.7, 0.0]
    p[1, 2] = [0.6, 0.0, 0.0, 0.4]  # disjoint supports
    p[2, 0] = q[2, 0]  # p = q
    return init, p, q


def top_k(rows, emitted, k, seed=0):
    """vLLM-style entries of ``rows`` ``(B, T, V)``: the top ``k`` ids and probabilities, with
    the emitted token's entry added where it is not among them (id -1 and NaN otherwise), the
    slots shuffled."""
    rows = np.nan_to_num(rows)
    ids = np.argsort(-rows, axis=-1, kind="stable")[..., :k]
    extra = np.where((ids == emitted[..., None]).any(-1), -1, emitted)
    ids = np.concatenate([ids, extra[..., None]], axis=-1)
    order = np.random.default_rng(seed).permuted(np.broadcast_to(np.arange(k + 1), ids.shape),
                                                 axis=-1)
    ids = np.take_along_axis(ids, order, -1)
    values = np.where(ids >= 0, np.take_along_axis(rows, np.maximum(ids, 0), -1), np.nan)
    return ids, values


def _log(values):
    with np.errstate(divide="ignore"):
        return np.log(values)


def _dumps(seqs, p_rows, q_rows, **kwargs):
    emitted = np.maximum(seqs[:, 1:], 0)
    draft, target = top_k(p_rows, emitted, 1), top_k(q_rows, emitted, 2, seed=1)
    plain = from_top_k(seqs, *draft, *target, log=False, **kwargs)
    logs = from_top_k(seqs, draft[0], _log(draft[1]), target[0], _log(target[1]), **kwargs)
    return {"probabilities": plain, "log-probabilities": logs}, draft, target


def test_top_k_entries_estimate_sd_and_the_schedule_exactly(x64):
    init, p, q = _pair()
    draft, target = specjax.MarkovChain(init, p), specjax.MarkovChain(init, q)
    seqs, weights, p_rows, q_rows = every_sequence(init, p, q)
    dumps, draft_entries, target_entries = _dumps(seqs, p_rows, q_rows, weights=weights)
    at = lambda rows: np.take_along_axis(rows, seqs[:, 1:, None], -1)[..., 0]  # noqa: E731
    stats = Recording.from_statistics(seqs, at(p_rows), at(q_rows), weights=weights)
    for how, dump in dumps.items():
        np.testing.assert_allclose(dump.recording.draft_prob, stats.draft_prob, rtol=0,
                                   atol=1e-15, err_msg=how)
        np.testing.assert_allclose(dump.recording.target_prob, stats.target_prob, rtol=0,
                                   atol=1e-15, err_msg=how)
        np.testing.assert_array_equal(dump.recording.weights, stats.weights)
        assert dump.recording.draft_probs is None and dump.recording.lengths is None
        for rows, entries, outside in ((p_rows, draft_entries, dump.draft_outside_mass),
                                       (q_rows, target_entries, dump.target_outside_mass)):
            given = np.take_along_axis(rows, np.maximum(entries[0], 0), -1)
            want = 1 - np.sum(np.where(entries[0] >= 0, given, 0), axis=-1)
            np.testing.assert_allclose(outside, np.clip(want, 0, 1), rtol=0, atol=1e-12)
        assert float(np.max(dump.target_outside_mass)) > 0.05  # the top 2 of 4 leave mass out
    for name, decoder in DECODERS.items():
        exact = specjax.exact(decoder, draft, target)
        for how, dump in dumps.items():
            for est in (specjax.estimate(decoder, dump.recording), dump.estimate(decoder)):
                assert abs(float(est.expected_calls - exact.expected_calls)) < 1e-10, (name, how)
                assert abs(float(est.expected_rejections - exact.expected_rejections)) < 1e-10, \
                    (name, how)


def _ragged():
    """Every sequence up to its first stop token: tokens (padding -1), lengths, weights, rows
    along it (padding NaN)."""
    return every_ragged_sequence(*_pair(), STOP, skip_zero=True)


def test_ragged_top_k_entries_estimate_sd_exactly(x64):
    init, p, q = _pair()
    draft, target = specjax.MarkovChain(init, p), specjax.MarkovChain(init, q)
    seqs, lengths, weights, p_rows, q_rows = _ragged()
    assert weights.sum() == pytest.approx(1.0, abs=1e-12) and (lengths < T).any()
    by_lengths, draft_entries, target_entries = _dumps(seqs, p_rows, q_rows, weights=weights,
                                                       lengths=lengths)
    pad = np.arange(T)[None] >= lengths[:, None]
    garbage = [np.where(pad[..., None], -7, x[0]) for x in (draft_entries, target_entries)]
    by_eos = from_top_k(np.where(seqs < 0, STOP, seqs), garbage[0], _log(draft_entries[1]),
                        garbage[1], _log(target_entries[1]), weights=weights, eos=STOP)
    cases = dict(by_lengths, eos=by_eos)
    for how, dump in cases.items():
        np.testing.assert_array_equal(dump.recording.lengths, lengths)
        assert not np.asarray(dump.draft_outside_mass)[pad].any(), how  # 0 at padding
    for k in range(1, 5):
        sd = specjax.Speculative(lookahead=k)
        exact = specjax.exact(sd, draft, target, stop_tokens=STOP)
        for how, dump in cases.items():
            est = dump.estimate(sd)
            assert abs(float(est.expected_calls - exact.expected_calls)) < 1e-10, (k, how)
            assert abs(float(est.expected_rejections - exact.expected_rejections)) < 1e-10, \
                (k, how)


def test_recorded_rows_cut_to_top_k_estimate_within_the_standard_error():
    draft, target = specjax.paper_instance()
    rec = specjax.record(jax.random.key(3), draft, target, 1000, keep_rows=True)
    emitted = np.asarray(rec.tokens)[:, 1:]
    p_ids, p_values = top_k(np.asarray(rec.draft_probs), emitted, 3)
    q_ids, q_values = top_k(np.asarray(rec.target_probs), emitted, 3, seed=2)
    with np.errstate(divide="ignore"):
        dump = from_top_k(rec.tokens, p_ids, np.log(p_values), q_ids, np.log(q_values))
    sd = specjax.Speculative(lookahead=4)
    est, own = dump.estimate(sd), specjax.estimate(sd, rec)
    exact = specjax.exact(sd, draft, target)
    for field in ("expected_calls", "expected_rejections"):
        got = float(getattr(est, field))
        assert got == pytest.approx(float(getattr(own, field)), rel=1e-5), field
        z = (got - float(getattr(exact, field))) / float(getattr(est, field + "_se"))
        assert abs(z) < 4.5, (field, z)
    assert 0 < float(np.mean(dump.target_outside_mass)) < 1


def test_pack_top_k_reads_engines_dicts():
    entry = lambda value: types.SimpleNamespace(logprob=value, rank=1)  # noqa: E731 (vLLM-like)
    steps = [[{2: -0.5, 0: -1.5}, {1: entry(-0.1)}],
             [{3: entry(-2.0), 1: -0.3, 0: -3.0}]]
    ids, values = pack_top_k(steps)
    assert ids.shape == values.shape == (2, 2, 3)
    np.testing.assert_array_equal(ids, [[[2, 0, -1], [1, -1, -1]], [[3, 1, 0], [-1] * 3]])
    np.testing.assert_array_equal(values[0, 0, :2], [-0.5, -1.5])
    np.testing.assert_array_equal(values[1, 0], [-2.0, -0.3, -3.0])
    assert values[0, 1, 0] == -0.1 and np.isneginf(values[1, 1]).all()
    assert pack_top_k(steps, horizon=4)[0].shape == (2, 4, 3)
    dump = from_top_k([[0, 2, 1], [0, 3, 0]], ids, values, ids, values, lengths=[2, 1])
    np.testing.assert_allclose(dump.recording.target_prob, np.exp([[-0.5, -0.1], [-2.0, 0]]),
                               rtol=1e-6)
    for bad, match in (({0: -1.0}, "steps must be a non-empty list"),
                       ([[{0: -1.0}], "x"], "sequence 1 must be a list"),
                       ([[{0: -1.0}, None]], r"sequence 0, position t = 2 must be a dict"),
                       ([[]], "steps hold no positions"),
                       ([[{"a": -1.0}]], "token ids must be ints"),
                       ([[{0: "x"}]], "must be a number")):
        with pytest.raises(ValueError, match=match):
            pack_top_k(bad)
    with pytest.raises(ValueError, match="horizon must be at least the longest sequence, 2"):
        pack_top_k(steps, horizon=1)


def _small():
    """B = 2, T = 3, V = 4: tokens and valid entries (probabilities)."""
    tokens = np.array([[0, 1, 2, 3], [1, 0, 0, 2]])
    ids = np.array([[[1, 0], [2, 3], [3, -1]], [[0, 2], [0, 1], [2, 3]]])
    values = np.array([[[0.5, 0.2], [0.4, 0.4], [0.9, np.nan]],
                       [[0.3, 0.3], [0.6, 0.1], [0.5, 0.5]]])
    return tokens, ids, values


def test_a_missing_emitted_token_is_refused_naming_the_position():
    tokens, ids, values = _small()
    assert from_top_k(tokens, ids, values, ids, values, log=False).recording.horizon == 3
    missing = ids.copy()
    missing[1, 2] = [0, 3]  # x_3 = 2 of sequence 1 is left out
    with pytest.raises(ValueError, match=r"target_ids: the emitted token x_3 = 2 of sequence 1 "
                                         r"\(position t = 3, index 2\) is not among"):
        from_top_k(tokens, ids, values, missing, values, log=False)
    with pytest.raises(ValueError, match="draft_ids: the emitted token"):
        from_top_k(tokens, missing, values, ids, values, log=False)
    # past a sequence's length it is padding, never read
    dump = from_top_k(tokens, missing, values, missing, values, log=False, lengths=[3, 2])
    assert float(dump.recording.target_prob[1, 2]) == 1.0


def test_decoders_that_need_full_rows_are_refused_naming_the_missing_mass():
    tokens, ids, values = _small()
    dump = from_top_k(tokens, ids, values, ids, values, log=False)
    for decoder in (specjax.BatchSpeculative(2), specjax.OptimalMultiDraft(2, lookahead=2),
                    specjax.TokenTree((2, 1)),
                    specjax.AdaptiveSpeculative(D.EntropyThreshold(1.0), max_lookahead=2)):
        with pytest.raises(ValueError, match=f"decoder: {type(decoder).__name__}.*top-k rows "
                                             f"do not give the mass of the tokens outside"):
            dump.estimate(decoder)
    with pytest.raises(ValueError, match="holds no rates of BatchSpeculative.* and no rows"):
        specjax.estimate(specjax.BatchSpeculative(2), dump.recording)
    with pytest.raises(ValueError, match="lossy rule"):  # estimate's own refusals first
        dump.estimate(specjax.decoders.BiasedSpeculative(0.1, lookahead=2))
    for decoder in (specjax.Autoregressive(), specjax.Speculative(lookahead=2),
                    specjax.AdaptiveSpeculative(D.ConfidenceThreshold(0.3), max_lookahead=2)):
        assert np.isfinite(float(dump.estimate(decoder).expected_calls))


def test_bad_entries_are_refused_naming_the_argument():
    tokens, ids, values = _small()
    logs = np.log(np.nan_to_num(values, nan=1.0))

    def refuse(match, *args, **kwargs):
        args = args or (tokens, ids, values, ids, values)
        kwargs.setdefault("log", False)
        with pytest.raises(ValueError, match=match):
            from_top_k(*args, **kwargs)

    refuse(r"draft_ids must be integers of shape \(B, T, k\)", tokens, ids[0], values, ids,
           values)
    refuse("target_ids must be integers", tokens, ids, values, ids.astype(float), values)
    refuse(r"draft_ids hold no entries \(k = 0\)", tokens, ids[..., :0], values[..., :0], ids,
           values)
    refuse("target_logprobs must be float probabilities .log=False. of the shape of target_ids",
           tokens, ids, values, ids, values[..., :1])
    refuse("draft_logprobs must be float log-probabilities", tokens, ids, ids, ids, values,
           log=True)
    refuse(r"draft_ids and target_ids must share \(B, T\)", tokens, ids, values, ids[:1],
           values[:1])
    refuse(r"tokens must have shape \(B, T \+ 1\)", tokens[:, :3], ids, values, ids, values)
    refuse("log must be True or False", log="yes")
    bad = ids.copy()
    bad[0, 1, 1] = -2
    refuse(r"draft_ids must be token ids >= 0, or -1 .*sequence 0, position t = 2", tokens, bad,
           values, ids, values)
    twice = ids.copy()
    twice[1, 0] = [0, 0]
    refuse(r"target_ids: token 0 appears twice at sequence 1, position t = 1", tokens, ids,
           values, twice, values)
    over = values.copy()
    over[0, 1] = [0.7, 0.4]
    refuse(r"target_logprobs: the probabilities given at sequence 0, position t = 2 sum to 1.1",
           tokens, ids, values, ids, over)
    refuse(r"draft_logprobs must hold probabilities in \[0, 1\]", tokens, ids, values * 3, ids,
           values)
    positive = logs.copy()
    positive[1, 1, 0] = 0.1
    refuse(r"draft_logprobs must hold log-probabilities in \[-inf, 0\]; sequence 1, position "
           r"t = 2", tokens, ids, positive, ids, logs, log=True)
    refuse("target_logprobs must hold", tokens, ids, logs, ids, np.where(ids >= 0, np.nan, 0),
           log=True)
    refuse(r"weights must be a float array of shape \(B,\)", weights=np.ones(3))
    refuse(r"lengths must lie in \[1, T\]", lengths=[4, 1])
    refuse("lengths and eos: give one", lengths=[3, 3], eos=2)
    zero = values.copy()
    zero[0, 0, 0] = 0.0  # the target's probability of x_1 = 1 of sequence 0
    refuse("target gives the recorded token of sequence 0 at position t = 1 probability 0",
           tokens, ids, values, ids, zero)
    # float32 engines' rounding is tolerated, and the outside mass clipped at 0
    near = values.copy()
    near[1, 2] = [0.5, 0.5 + 5e-5]
    dump = from_top_k(tokens, ids, values, ids, near, log=False)
    assert float(dump.target_outside_mass[1, 2]) == 0.0
