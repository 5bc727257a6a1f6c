"""Decoder capabilities as protocol members (issue 48, item 2): consumers read ``lossless``,
``varies_lookahead``/``with_lookahead`` and ``recording_reads``, not class names or fields.

A user's decoder, written as a subclass that only changes a declared capability, is treated by
what it declares: each assertion below failed while the consumers went by name (a lossy
subclass of ``Speculative`` was estimated as SD). A rule declared lossless is still checked: a
subclass that declares it is probed before any work (``specjax.decoders.probe``)."""

from __future__ import annotations

import numpy as np
import pytest

import specjax
from specjax.pairs import Recording


@specjax.decoder_dataclass
class DeclaredLossy(specjax.Speculative):
    """SD declared lossy (as a user would declare an approximate rule)."""

    lossless = False


@specjax.decoder_dataclass
class DeclaredLossless(specjax.BiasedSpeculative):
    """Biased SD declared lossless (right at epsilon = 0 only): the rows' check still runs."""

    lossless = True


def _recording():
    rng = np.random.default_rng(0)
    q = rng.dirichlet(np.ones(3), size=(4, 3))
    p = rng.dirichlet(np.ones(3), size=(4, 3))
    tokens = np.zeros((4, 4), np.int64)
    for t in range(3):
        tokens[:, t + 1] = [rng.choice(3, p=q[b, t]) for b in range(4)]
    return Recording.from_arrays(tokens, p, q)


def test_estimates_read_the_declared_capabilities():
    rec = _recording()
    with pytest.raises(ValueError, match="lossy rule"):
        specjax.estimate(DeclaredLossy(lookahead=2), rec)
    assert specjax.Speculative.recording_reads == "emitted"
    assert specjax.BatchSpeculative.recording_reads == "rows"
    assert not specjax.BiasedSpeculative.lossless and specjax.BatchSpeculative.lossless
    assert specjax.BatchSpeculative(2, lookahead=3).with_lookahead(None) == \
        specjax.BatchSpeculative(2)
    with pytest.raises(ValueError, match="decoder: TokenTree has no lookahead to vary"):
        specjax.TokenTree((2, 1)).with_lookahead(3)
    draft, target = specjax.paper_instance(num_states=3, horizon=4)
    with pytest.raises(ValueError, match="lookahead to vary"):
        specjax.theory.best_lookahead(draft, target, specjax.CostModel(0.1, 1.0),
                                      max_lookahead=2, decoder=specjax.TokenTree((2, 1)))


def test_a_rule_declared_lossless_is_estimated_and_its_laws_still_probed():
    rec = _recording()
    sd = specjax.estimate(specjax.Speculative(lookahead=2), rec)
    exact_rule = specjax.estimate(DeclaredLossless(0.0, lookahead=2), rec)  # biased, eps = 0
    assert float(exact_rule.expected_calls) == pytest.approx(float(sd.expected_calls), abs=1e-6)
    with pytest.raises(ValueError, match="declared lossless .* misses the target's row"):
        specjax.estimate(DeclaredLossless(0.3, lookahead=2), rec)  # probed: new laws
