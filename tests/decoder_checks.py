"""Checks shared by the tests of the multi-draft root verifiers (``OptimalMultiDraft``,
``KSequential``, ``ImportanceWeighted``, ``GumbelList``, ``SpecHub``): each decoder's exact values
and per-position laws, the Monte Carlo of ``decode`` against them, and finite values and gradients
at edge rows; and of the adaptive draft lengths (``AdaptiveSpeculative``, ``HeuristicSchedule``):
exact values against their literal enumeration; and the conformance checks of one decoder
(``assert_conforms``), which every case of ``sampler_cases.CASES`` passes through the case-driven
tests. Not a test module itself.
"""

from collections import defaultdict

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import reference as ref
import specjax
import stats
from conftest import chain
from conftest import edge_pair
from specjax.decoders import verification as _verify
from test_literal_equivalence import kernel_law
from test_literal_equivalence import outcome_counts


@jax.jit
def exact_and_laws(decoder, draft, target):
    """``exact``'s values and the decoder's per-position ``(root, verify)`` laws, as a dict."""
    e = specjax.exact(decoder, draft, target)
    root, verify = decoder.laws(draft.trans, target.trans)
    return dict(rejections=e.expected_rejections, calls=e.expected_calls, rejected=e.rejected,
                marginals=e.marginals, root=root, verify=verify)


def exact_outcome_law(decoder, pair):
    """In float64, for a NumPy ``(draft, target)`` pair of ``(init, trans)``: the exact law of
    (tokens, rejected, calls) from the decoder's per-position laws, and ``exact``'s expected
    rejections and calls."""
    draft, target = pair
    with jax.enable_x64(True):
        result = exact_and_laws(decoder, chain(draft), chain(target))
        bonus = _verify.bonus_law(jnp.asarray(target[1]))
        lookahead = decoder.resolve_lookahead(target[1].shape[0])
        law = kernel_law(target[0], result["root"], result["verify"], bonus, lookahead)
        return law, float(result["rejections"]), float(result["calls"])


def assert_decode_fits(key, decoder, pair, law, rejections, calls, num_chains=200_000):
    """``num_chains`` chains of ``decode`` on the float32 copy of ``pair`` against the exact
    law of (tokens, rejected, calls) and the tokens alone against the target's law (chi-square,
    each failing falsely with probability ``stats.ALPHA``), and the mean rejections and calls
    within ``stats.Z`` standard errors of ``rejections`` and ``calls``."""
    draft, target = pair

    def to32(model):
        return model[0].astype(np.float32), model[1].astype(np.float32)

    trace = specjax.decode(key, decoder, chain(to32(draft)), chain(to32(target)), num_chains)
    observed = outcome_counts(trace)
    stats.assert_law(observed, law, num_chains, f"{decoder.label}: (tokens, rejected, calls)")
    tokens = defaultdict(int)
    for (seq, _, _), count in observed.items():
        tokens[seq] += count
    stats.assert_law(tokens, ref.target_sequence_law(target), num_chains,
                     f"{decoder.label}: tokens")
    stats.assert_mean(trace.num_rejections, rejections, f"{decoder.label}: rejections")
    stats.assert_mean(trace.num_calls, calls, f"{decoder.label}: calls")


def exact_rejections_and_gradients(logits, target, decoders):
    """For each decoder, the exact ``E[N_rej]`` against ``target`` of the draft with transition
    ``logits`` (uniform first token) and its gradient in the logits (traceable under ``jit``)."""
    out = []
    for decoder in decoders:
        def rejections(logits, decoder=decoder):
            draft = specjax.MarkovChain.from_logits(jnp.zeros(logits.shape[-1], logits.dtype),
                                                    logits)
            return specjax.exact(decoder, draft, target).expected_rejections
        out.append(jax.value_and_grad(rejections)(logits))
    return out


def _edge_values_and_gradients(p, q, logits, target, root_law, drafts, decoders):
    out = []
    for m in drafts:
        def total(p, q, m=m):
            return jnp.sum(root_law(p, q, m).accepted)
        out.append(jax.value_and_grad(total, argnums=(0, 1))(p, q))
    return out + exact_rejections_and_gradients(logits, target, decoders)


_edge_program = jax.jit(_edge_values_and_gradients, static_argnums=(4, 5, 6))


def assert_finite_at_edge_rows(dtype, root_law, drafts, decoders, extra_rows=None):
    """On the rows of ``edge_pair`` (p = q, disjoint supports, one-hot rows, zeros, p = 0 where
    q > 0), with ``extra_rows = (p, q)`` appended: the total accepted mass of ``root_law(p, q,
    M)`` for each ``M`` in ``drafts`` has the dtype, lies in ``[0, rows]`` and has finite
    gradients in p and q; the exact ``E[N_rej]`` of each of ``decoders`` on the edge pair and
    its gradient in the draft's logits are finite. ``root_law``, ``drafts`` and ``decoders``
    are static (hashable)."""
    with jax.enable_x64(dtype == "float64"):
        draft, target = edge_pair()
        p, q = draft[1].reshape(-1, 4), target[1].reshape(-1, 4)
        if extra_rows is not None:
            p, q = np.concatenate([p, extra_rows[0]]), np.concatenate([q, extra_rows[1]])
        p, q = jnp.asarray(p, dtype), jnp.asarray(q, dtype)
        logits = jnp.log(jnp.asarray(draft[1], dtype))
        t = specjax.MarkovChain(jnp.asarray(target[0], dtype), jnp.asarray(target[1], dtype))
        out = _edge_program(p, q, logits, t, root_law, tuple(drafts), tuple(decoders))
        for m, (value, grads) in zip(drafts, out):
            what = f"{dtype}, M = {m}"
            assert value.dtype == jnp.dtype(dtype), what
            assert np.isfinite(value) and -1e-5 <= value <= p.shape[0] + 1e-5, what
            assert all(np.isfinite(g).all() for g in grads), what
        for decoder, (value, grad) in zip(decoders, out[len(drafts):]):
            assert value.dtype == jnp.dtype(dtype), f"{dtype}, {decoder.label}"
            assert np.isfinite(value) and np.isfinite(grad).all(), f"{dtype}, {decoder.label}"


def assert_exact_matches_adaptive_literal(decoder, pair, summary, cost, tol=1e-12):
    """``decoder``'s exact values on ``pair`` (float64) against ``reference.adaptive_summary``'s
    enumeration ``summary``: the token law is the target's, and the expected calls, rejections,
    per-position rejected masses, time under ``cost``, drafts and kept drafts agree to ``tol``."""
    tokens, joint, means = summary
    draft, target = (chain(x) for x in pair)
    target_law = ref.target_sequence_law(pair[1])
    assert set(tokens) <= set(target_law)
    assert max(abs(tokens[k] - target_law.get(k, 0.0)) for k in tokens) < tol  # lossless
    exact = specjax.exact(decoder, draft, target)
    assert abs(float(exact.expected_calls) - means["calls"]) < tol
    assert abs(float(exact.expected_rejections) - means["rejections"]) < tol
    num_states, horizon = pair[1][1].shape[-1], pair[1][1].shape[0]
    rejected = ref.rejected_measure(joint, num_states, horizon)
    assert np.abs(np.asarray(exact.rejected) - rejected).max() < tol
    timed = specjax.theory.decoding_time(decoder, draft, target, cost)
    assert abs(float(timed.expected_time) - means["time"]) < tol
    assert abs(float(timed.expected_draft_passes) - means["drafted"]) < tol
    metrics = specjax.theory.engine_metrics(decoder, draft, target)
    assert abs(float(metrics.expected_drafted) - means["drafted"]) < tol
    assert abs(float(jnp.sum(metrics.accepted_at)) - means["kept"]) < tol
    return exact


# ------------------------------------------------------------------- one decoder's conformance
#: The entry points of the support table of docs/guides/decoders.md.
ENTRIES = ("decode", "decoding_statistics", "exact", "accepted_length", "objective")


def supported(decoder, kind: str, entry: str) -> bool:
    """Whether ``entry`` runs ``decoder`` on models of ``kind`` (``"markov"``,
    ``"finite_state"``, ``"protocol"``), from what the decoder declares: every decoder runs on
    Markov chains (but ``accepted_length`` of a decoder with call states); other kinds only where
    ``model_kinds`` names them, for the engines (not ``accepted_length`` or the objectives, which
    take Markov chains), and exact values on finite-state models only."""
    if entry == "accepted_length" and isinstance(decoder, specjax.CallDecoder) \
            and decoder.num_call_states > 1:
        return False  # a call depends on the earlier calls
    if kind == "markov":
        return True
    if entry in ("accepted_length", "objective") or kind not in decoder.model_kinds:
        return False
    return entry != "exact" or kind == "finite_state"


def assert_conforms(decoder, key=jax.random.key(0), num_chains=4000):
    """One decoder through the checks every case of ``CASES`` passes (``test_decoders``' support
    table, ``test_scale``'s statistics test), for a decoder outside ``CASES``:

    * every entry point on every model kind works (finite values), or refuses with one
      ``ValueError`` naming the models, as ``supported`` reads from its declarations;
    * on ``sampler_cases.instance()``, ``decoding_statistics`` in padded chunks counts what the
      trace of ``decode`` holds, chain for chain;
    * ``decode``'s mean rejections and calls fit ``exact``'s; a lossless decoder's final token
      fits the exact marginal (chi-square), which is the target's."""
    from sampler_cases import instance  # noqa: PLC0415
    from test_decoders import _models  # noqa: PLC0415 - the support table's models

    for kind in ("markov", "finite_state", "protocol"):
        draft, target, kw = _models(kind)
        calls = {
            "decode": lambda: specjax.decode(key, decoder, draft, target, 4, **kw).tokens,
            "decoding_statistics": lambda: specjax.decoding_statistics(
                key, decoder, draft, target, 8, chunk_size=4, **kw).rejected,
            "exact": lambda: specjax.exact(decoder, draft, target, **kw).expected_calls,
            "accepted_length": lambda: specjax.accepted_length(decoder, draft, target),
            "objective": lambda: specjax.objective(decoder, "calls")(draft, target),
        }
        for entry in ENTRIES:
            if supported(decoder, kind, entry):
                assert np.isfinite(np.asarray(calls[entry]())).all(), (kind, entry)
            else:
                with pytest.raises(ValueError, match="MarkovChain|FiniteStateModel|earlier"):
                    calls[entry]()
    draft, target = instance()
    trace = specjax.decode(key, decoder, draft, target, num_chains)
    counts = specjax.decoding_statistics(key, decoder, draft, target, num_chains,
                                         chunk_size=num_chains // 3 + 1)  # a padded last chunk
    np.testing.assert_array_equal(counts.num_rejections, trace.num_rejections)
    np.testing.assert_array_equal(counts.num_calls, trace.num_calls)
    np.testing.assert_array_equal(counts.rejected, np.asarray(trace.rejected).sum(0))
    np.testing.assert_array_equal(counts.new_call, np.asarray(trace.new_call).sum(0))
    exact = specjax.exact(decoder, draft, target)
    stats.assert_mean(trace.num_rejections, float(exact.expected_rejections),
                      f"{decoder.label}: rejections")
    stats.assert_mean(trace.num_calls, float(exact.expected_calls), f"{decoder.label}: calls")
    if decoder.lossless:
        law = specjax.exact(specjax.Autoregressive(), None, target).marginals
        np.testing.assert_allclose(exact.marginals, law, atol=1e-5)
        final = np.bincount(np.asarray(trace.tokens[:, -1]), minlength=target.num_states)
        stats.assert_law(dict(enumerate(final)), dict(enumerate(np.asarray(law[-1]))),
                         num_chains, f"{decoder.label}: x_T")
