"""Ragged requests (issue 47, item 1): recordings whose sequences end at an end-of-sequence token.

* exactness: on a V = 3, T = 4 pair with zeros, disjoint supports and p = q rows and a stop
  token, every sequence enumerated up to its first stop token (weights = its target
  probability, padding NaN or -1), the weighted estimate equals ``specjax.exact(...,
  stop_tokens=...)`` to 1e-10 in float64, given ``lengths=`` or ``eos=``, through full rows,
  log-probability rows and the emitted tokens' probabilities, and after ``save``/``load``;
* Monte Carlo: ``record(..., stop_tokens=...)``'s estimate is within 4.5 standard errors of the
  exact value (a false-failure rate of 7e-6 per comparison);
* validation of ``lengths`` and ``eos``.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import specjax
from conftest import every_ragged_sequence
from specjax.pairs import Recording

V, T, STOP = 3, 4, 2


def _pair():
    rng = np.random.default_rng(5)
    init = rng.dirichlet(np.ones(V))
    p = rng.dirichlet(np.ones(V), size=(T, V))
    q = rng.dirichlet(np.ones(V), size=(T, V))
    q[0, 1] = [0.0, 0.5, 0.5]  # zeros and disjoint supports
    p[0, 1] = [1.0, 0.0, 0.0]
    p[1, 0] = q[1, 0]  # p = q
    return init, p, q


def _enumerated():
    """Every sequence up to its first stop token: tokens (padding -1), lengths, weights, and the
    rows along it (padding NaN)."""
    return every_ragged_sequence(*_pair(), STOP)


DECODERS = {
    "sd1": specjax.Speculative(lookahead=1),
    "sd2": specjax.Speculative(lookahead=2),
    "sd3": specjax.Speculative(lookahead=3),
    "sd4": specjax.Speculative(lookahead=4),
    "batch": specjax.BatchSpeculative(2, lookahead=2),
    "optimal": specjax.OptimalMultiDraft(2, lookahead=3),
}


def test_the_weighted_estimate_of_every_ragged_sequence_equals_exact(x64, tmp_path):
    init, p, q = _pair()
    draft, target = specjax.MarkovChain(init, p), specjax.MarkovChain(init, q)
    seqs, lengths, weights, p_rows, q_rows = _enumerated()
    assert weights.sum() == pytest.approx(1.0, abs=1e-12)
    at = lambda rows: np.take_along_axis(  # noqa: E731
        np.nan_to_num(rows), np.maximum(seqs[:, 1:], 0)[..., None], -1)[..., 0]
    with np.errstate(divide="ignore"):
        log_p, log_q = np.log(p_rows), np.log(q_rows)
    recordings = {
        "lengths": Recording.from_arrays(seqs, p_rows, q_rows, weights=weights, lengths=lengths),
        "eos": Recording.from_arrays(np.where(seqs < 0, STOP, seqs), p_rows, q_rows,
                                     weights=weights, eos=STOP),
        "log-probabilities": Recording.from_arrays(seqs, log_p, log_q, weights=weights,
                                                   lengths=lengths, logits=True),
    }
    recordings["saved"] = Recording.load(recordings["lengths"].save(tmp_path / "ragged"))
    stats = Recording.from_statistics(seqs, at(p_rows), at(q_rows), weights=weights,
                                      lengths=lengths)
    for name, decoder in DECODERS.items():
        exact = specjax.exact(decoder, draft, target, stop_tokens=STOP)
        cases = dict(recordings, statistics=stats) if name.startswith("sd") else recordings
        for how, rec in cases.items():
            est = specjax.estimate(decoder, rec)
            assert abs(float(est.expected_calls - exact.expected_calls)) < 1e-10, (name, how)
            assert abs(float(est.expected_rejections - exact.expected_rejections)) < 1e-10, \
                (name, how)
    np.testing.assert_array_equal(recordings["saved"].lengths, lengths)


def test_padding_is_never_read():
    seqs, lengths, weights, p_rows, q_rows = _enumerated()
    sd = specjax.Speculative(lookahead=2)
    base = specjax.estimate(sd, Recording.from_arrays(seqs, p_rows, q_rows, weights=weights,
                                                      lengths=lengths))
    # p = q = 1 padding was counted as free accepted tokens without lengths; any padding now
    # gives the same numbers.
    pad = np.arange(T)[None] >= lengths[:, None]
    ones = np.where(pad[..., None], np.eye(V)[0], np.nan_to_num(p_rows))
    other = Recording.from_arrays(np.where(seqs < 0, 0, seqs), ones,
                                  np.where(pad[..., None], np.eye(V)[0], np.nan_to_num(q_rows)),
                                  weights=weights, lengths=lengths)
    est = specjax.estimate(sd, other)
    assert float(est.expected_calls) == pytest.approx(float(base.expected_calls), abs=1e-6)
    assert np.isfinite(float(est.expected_calls_se))


def test_record_with_a_stop_token_estimates_within_the_standard_error():
    draft, target = specjax.paper_instance()
    sd = specjax.Speculative(lookahead=3)
    rec = specjax.record(jax.random.key(7), draft, target, 2000, stop_tokens=3)
    assert rec.lengths is not None and int(rec.lengths.min()) >= 1
    ended = np.asarray(rec.lengths) < rec.horizon
    last = np.asarray(rec.tokens)[np.arange(rec.num_sequences), np.asarray(rec.lengths)]
    assert (last[ended] == 3).all()
    est = specjax.estimate(sd, rec, cost=specjax.CostModel(0.1, 1.0))
    exact = specjax.exact(sd, draft, target, stop_tokens=3)
    for field in ("expected_calls", "expected_rejections"):
        z = (float(getattr(est, field)) - float(getattr(exact, field))) / \
            float(getattr(est, field + "_se"))
        assert abs(z) < 4.5, (field, z)


def test_lengths_and_eos_are_checked():
    seqs, lengths, weights, p_rows, q_rows = _enumerated()
    with pytest.raises(ValueError, match=r"lengths must lie in \[1, T\]"):
        Recording.from_arrays(seqs, p_rows, q_rows, lengths=lengths + 1)
    with pytest.raises(ValueError, match=r"lengths must be ints of shape \(B,\)"):
        Recording.from_arrays(seqs, p_rows, q_rows, lengths=lengths[:3])
    with pytest.raises(ValueError, match="lengths and eos: give one"):
        Recording.from_arrays(seqs, p_rows, q_rows, lengths=lengths, eos=STOP)
    with pytest.raises(ValueError, match="eos must be a non-negative integer"):
        Recording.from_arrays(seqs, p_rows, q_rows, eos=-1)
    with pytest.raises(ValueError, match="draft_probs contains NaN"):
        Recording.from_arrays(np.maximum(seqs, 0), p_rows, q_rows)  # NaN padding, no lengths


def test_log_probabilities_of_the_emitted_tokens(x64):
    seqs, lengths, weights, p_rows, q_rows = _enumerated()
    at = lambda rows: np.take_along_axis(  # noqa: E731
        np.nan_to_num(rows), np.maximum(seqs[:, 1:], 0)[..., None], -1)[..., 0]
    with np.errstate(divide="ignore"):
        logs = Recording.from_statistics(seqs, np.log(at(p_rows)), np.log(at(q_rows)),
                                         weights=weights, lengths=lengths, log=True)
    plain = Recording.from_statistics(seqs, at(p_rows), at(q_rows), weights=weights,
                                      lengths=lengths)
    sd = specjax.Speculative(lookahead=2)
    assert abs(float(specjax.estimate(sd, logs).expected_calls)
               - float(specjax.estimate(sd, plain).expected_calls)) < 1e-12
    with pytest.raises(ValueError, match="log must be True or False"):
        Recording.from_statistics(seqs, at(p_rows), at(q_rows), log="yes")
