"""Every decoder checked before it runs (issue 48, items 3 and 4): a token-wise decoder with new
laws is probed on concrete rows (``specjax.decoders.probe``), and one bad decoder gets one error,
the same type and message, from ``decode``, ``exact``, ``estimate``, ``serving_rate`` and
``verify_drafts``.

The guide's own decoder with ``b = min(1, q / p) ** gamma`` at ``gamma = -1`` (acceptances above
one) gave 0.0 rejections from ``exact`` and ``decode``, a rate from ``serving_rate`` and accepted
every draft in ``verify_drafts``; each assertion below failed then. With ``gamma = 1`` (SD) it
runs everywhere as before."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax.pairs import Recording


@specjax.decoder_dataclass
class PoweredSpeculative(specjax.TokenwiseDecoder):
    """SD whose acceptance is raised to a power, as a user would write it from the guide."""

    gamma: float = specjax.array_field()
    _: dataclasses.KW_ONLY
    lookahead: int | None = None

    def acceptance(self, p, q):
        return jnp.minimum(1, q / jnp.where(p > 0, p, 1)) ** self.gamma

    def laws(self, p, q):
        b = self.acceptance(p, q)
        law = specjax.verification_law(p, b, specjax.optimal_residual(p, q, b))
        return law, law


def _every_entry_point(decoder):
    """The message each entry point raises for ``decoder`` (``None`` where it ran)."""
    draft, target = specjax.paper_instance(num_states=4, horizon=5)
    rng = np.random.default_rng(0)
    rows_p = rng.dirichlet(np.ones(4), size=(6, 5))
    rows_q = rng.dirichlet(np.ones(4), size=(6, 5))
    tokens = np.zeros((6, 6), np.int64)
    for t in range(5):
        tokens[:, t + 1] = [rng.choice(4, p=rows_q[b, t]) for b in range(6)]
    rec = Recording.from_arrays(tokens, rows_p, rows_q)
    cost = specjax.ServingCost(0.05, specjax.theory.roofline(1.0, knee=4, size=64))
    drafts = np.array([[1, 2]])
    runs = {
        "decode": lambda: specjax.decode(jax.random.key(0), decoder, draft, target, 64),
        "exact": lambda: specjax.exact(decoder, draft, target),
        "estimate": lambda: specjax.estimate(decoder, rec),
        "serving_rate": lambda: specjax.serving_rate(decoder, draft, target, cost, batch_size=2),
        "verify_drafts": lambda: specjax.verify_drafts(
            jax.random.key(1), decoder, drafts, rows_p[:1, :2], rows_q[:1, :3]),
    }
    out = {}
    for name, run in runs.items():
        try:
            jax.block_until_ready(run())
            out[name] = None
        except ValueError as error:
            out[name] = str(error)
    return out


def test_a_bad_decoder_gets_one_error_everywhere():
    messages = _every_entry_point(PoweredSpeculative(-1.0, lookahead=2))
    assert all(m is not None for m in messages.values()), messages
    assert len(set(messages.values())) == 1, messages
    message = next(iter(messages.values()))
    assert message.startswith("decoder: PoweredSpeculative(gamma=-1.0")
    assert "[0, 1]" in message and "probe rows" in message


def test_a_correct_user_decoder_runs_everywhere():
    messages = _every_entry_point(PoweredSpeculative(1.0, lookahead=2))
    assert all(m is None for m in messages.values()), messages


def test_a_bad_setting_gets_one_error_everywhere():
    messages = _every_entry_point(specjax.ThresholdVerification(-0.5, 0.7, lookahead=2))
    del messages["verify_drafts"]  # given drafts: checked there too, below
    assert len(set(messages.values())) == 1, messages
    assert next(iter(messages.values())).startswith("threshold_single must lie in (0, 1]")


def test_a_decoder_declared_lossless_whose_laws_are_not():
    @specjax.decoder_dataclass
    class Halved(specjax.TokenwiseDecoder):
        """Accepts half of SD's mass and drops the rest: not a law of the token."""

        _: dataclasses.KW_ONLY
        lookahead: int | None = None

        def laws(self, p, q):
            law = specjax.verification_law(p, jnp.minimum(1, q / jnp.where(p > 0, p, 1)),
                                           jnp.maximum(q - p, 0))
            return law, law._replace(accepted=law.accepted * 0.5)

    messages = _every_entry_point(Halved(lookahead=2))
    assert len(set(messages.values())) == 1
    assert "in-call law must give the emitted token a law" in next(iter(messages.values()))
    assert not specjax.Speculative.probes_laws and specjax.RejectionRule.probes_laws
    assert PoweredSpeculative.probes_laws


@specjax.decoder_dataclass
class CountedSpeculative(specjax.Speculative):
    """SD that counts how often an entry point probes it on the models (``plan_run``)."""

    probes = []

    def probe(self, draft, target, kind):
        CountedSpeculative.probes.append(kind)
        super().probe(draft, target, kind)


@pytest.mark.parametrize("entry", ["exact", "serving_rate", "decode"])
def test_each_entry_point_plans_once(entry):
    """One planning path: ``serving_rate`` planned three times (itself, ``slot_work``, then
    ``exact``), probing the decoder's laws each time; now every entry point plans once."""
    draft, target = specjax.paper_instance(num_states=4, horizon=5)
    cost = specjax.ServingCost(0.05, specjax.theory.roofline(1.0, knee=4, size=64))
    decoder = CountedSpeculative(lookahead=2)
    CountedSpeculative.probes.clear()
    {"exact": lambda: specjax.exact(decoder, draft, target),
     "serving_rate": lambda: specjax.serving_rate(decoder, draft, target, cost, batch_size=2),
     "decode": lambda: specjax.decode(jax.random.key(0), decoder, draft, target, 8)}[entry]()
    assert CountedSpeculative.probes == ["markov"], CountedSpeculative.probes
