"""Decoders as values: every decoder through every entry point, decoders defined outside the
package (token-wise and call-level), the old conveniences equal the new entry points, and the
support table (every decoder x entry point x model kind works or is refused clearly)."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
import specjax.compat
import stats
from conftest import DATA
from conftest import float64
from conftest import read_archive
from sampler_cases import CASES
from sampler_cases import instance
from sampler_cases import sd_accept
from sampler_cases import sd_residual

#: The cases that existed when decoders became values: they have old conveniences and golden
#: outputs to equal (decoders added since, such as the multi-draft schemes, have neither).
LEGACY_TYPES = (specjax.Autoregressive, specjax.Speculative, specjax.BatchSpeculative,
                specjax.BiasedSpeculative, specjax.RejectionRule, specjax.BlockVerification)
LEGACY_CASES = {name: decoder for name, decoder in CASES.items()
                if type(decoder) in LEGACY_TYPES}
from specjax.decoders import verification

KEY = jax.random.key(0)


# ------------------------------------------------------------ decoders defined outside specjax
#: The float64 models' sizes of the tests of decoders defined outside and of accepted lengths:
#: one size, so that their draws, exact values and accepted lengths share programs.
OUTSIDE = dict(num_states=4, horizon=7)

@specjax.decoder_dataclass
class CappedSpeculative(specjax.TokenwiseDecoder):
    """A lossy rule written by a user: SD's acceptance scaled by ``cap`` (a traced leaf), with
    Theorem 4's optimal residual. ``cap = 1`` is SD."""

    cap: float = specjax.array_field(default=0.8)
    lookahead: int | None = None

    def acceptance(self, p, q):
        return self.cap * specjax.acceptance_probability(p, q, epsilon=0.0)

    def laws(self, p, q):
        b = self.acceptance(p, q)
        law = specjax.verification_law(p, b, specjax.optimal_residual(p, q, b))
        return law, law


@specjax.decoder_dataclass
class CallSpeculative(specjax.CallDecoder):
    """SD with lookahead ``K`` written as a call-level decoder (drafts a block, verifies it token
    by token): an independent second route through the call-level engines, which must agree
    with the token-wise ``Speculative(K)`` in law and in every exact value."""

    lookahead: int

    @property
    def num_uniforms(self):
        return 2 * self.lookahead + 1

    def sample_call(self, tables, n, prev, u):
        p_trans, q_trans = tables
        horizon, k = p_trans.shape[0], self.lookahead
        tokens, x, kept, alive = [], prev, jnp.int32(0), jnp.bool_(True)
        last = jnp.zeros((), jnp.int32)
        rejected_flag = jnp.bool_(False)
        for i in range(k):
            row = jnp.clip(n - 1 + i, 0, horizon - 1)
            valid = alive & (n + i <= horizon)
            p, q = p_trans[row, x], q_trans[row, x]
            draft = specjax.decoders.draws.draw(
                specjax.decoders.draws.categorical_thresholds(p), u[i])
            accept = specjax.decoders.draws.bernoulli(
                verification.acceptance_probability(p, q, epsilon=0.0)[draft], u[k + i])
            fix = specjax.decoders.draws.draw(
                specjax.decoders.draws.categorical_thresholds(jnp.maximum(q - p, 0)), u[2 * k])
            token = jnp.where(accept, draft, fix)
            rejected_here = valid & ~accept
            last = jnp.where(rejected_here, fix, last)
            rejected_flag = rejected_flag | rejected_here
            kept = kept + (valid & accept)
            alive = valid & accept
            tokens.append(token)
            x = jnp.where(alive, draft, x)
        row = jnp.clip(n - 1 + k, 0, horizon - 1)
        bonus = specjax.decoders.draws.draw(
            specjax.decoders.draws.categorical_thresholds(q_trans[row, x]), u[2 * k])
        last = jnp.where(rejected_flag, last, bonus)
        emitted = jnp.stack(tokens + [bonus]).at[kept].set(last)
        return emitted, kept, rejected_flag

    def call_law(self, p_rows, q_rows, bonus_row, *, with_bonus):
        reach = jnp.eye(p_rows.shape[-1], dtype=p_rows.dtype)
        kept, rejected = [], []
        for p, q in zip(p_rows, q_rows):
            rejected.append(reach @ jnp.maximum(q - p, 0))
            reach = reach @ jnp.minimum(p, q)
            kept.append(reach)
        zeros = jnp.zeros_like(reach)
        bonus = [zeros] * len(kept) + [reach @ bonus_row if with_bonus else zeros]
        return specjax.decoders.CallLaw(jnp.stack(kept), jnp.stack(rejected + [zeros]),
                                        jnp.stack(bonus))


def test_a_tokenwise_decoder_defined_outside_runs_through_every_entry_point(x64):
    draft, target = float64(*instance(**OUTSIDE))
    decoder = CappedSpeculative(0.8, lookahead=3)
    exact = specjax.exact(decoder, draft, target)
    trace = specjax.decode(KEY, decoder, draft, target, 20_000)
    stats.assert_mean(trace.num_rejections, float(exact.expected_rejections), "rejections")
    stats.assert_mean(trace.num_calls, float(exact.expected_calls), "calls")
    counts = specjax.decoding_statistics(KEY, decoder, draft, target, 20_000, chunk_size=7000)
    np.testing.assert_array_equal(counts.num_rejections, trace.num_rejections)
    assert specjax.accepted_length(decoder, draft, target).shape == (4,)
    # cap = 1 is SD exactly; a cap below 1 rejects more.
    sd = specjax.exact(specjax.Speculative(3), draft, target)
    one = specjax.exact(CappedSpeculative(1.0, lookahead=3), draft, target)
    np.testing.assert_allclose(one.expected_rejections, sd.expected_rejections, atol=1e-12)
    assert exact.expected_rejections > sd.expected_rejections
    # Tuning: a differentiable objective of the outside decoder, in the draft and in its leaf.
    # (each gradient in one compiled program: run op by op they compiled about 60 small ones)
    @jax.jit
    def grads(trans):
        return [jax.grad(lambda trans: specjax.objective(decoder, quantity, weight=2.0)(
            specjax.MarkovChain(draft.init, trans), target))(trans)
            for quantity in ("rejections", "calls", "tradeoff")]

    for grad in grads(draft.trans):
        assert np.isfinite(grad).all()
    grad_cap = jax.jit(jax.grad(lambda c: specjax.exact(CappedSpeculative(c), draft,
                                                        target).expected_rejections))(0.7)
    assert np.isfinite(grad_cap) and grad_cap < 0  # accepting more rejects less
    family = specjax.tuning.StationaryDraft(num_states=4, horizon=7)
    result = specjax.tune_draft(family, family.init(jax.random.key(1), 0.5), target,
                                specjax.objective(decoder), num_steps=20)
    assert result.value <= result.history[0]


def test_a_call_level_decoder_defined_outside_equals_tokenwise_sd(x64):
    """The call-level engines (sampler, exact recursion, accepted length, counts) on SD written
    as a call: every exact value equals the token-wise recursion's, the law of the output is the
    target's and the Monte Carlo means fit."""
    draft, target = float64(*instance(**OUTSIDE))
    for k in (1, 3, 7):
        want = specjax.exact(specjax.Speculative(k), draft, target)
        got = specjax.exact(CallSpeculative(k), draft, target)
        for field in want._fields:
            np.testing.assert_allclose(getattr(got, field), getattr(want, field), atol=1e-12,
                                       err_msg=f"K={k} {field}")
        for position in (1, 5):
            np.testing.assert_allclose(
                specjax.accepted_length(CallSpeculative(k), draft, target, position=position),
                specjax.accepted_length(specjax.Speculative(k), draft, target,
                                        position=position), atol=1e-12)
    decoder = CallSpeculative(3)
    want = specjax.exact(specjax.Speculative(3), draft, target)
    trace = specjax.decode(KEY, decoder, draft, target, 20_000)
    stats.assert_mean(trace.num_rejections, float(want.expected_rejections), "rejections")
    stats.assert_mean(trace.num_calls, float(want.expected_calls), "calls")
    final = np.bincount(np.asarray(trace.tokens[:, -1]), minlength=4)
    stats.assert_law(dict(enumerate(final)), dict(enumerate(np.asarray(want.marginals[-1]))),
                     20_000, "x_T")
    # One chunk: the program of the decode above (test_scale's
    # test_statistics_equal_trace_counts_in_padded_chunks runs every call-level case of CASES in
    # padded chunks through the same engine).
    counts = specjax.decoding_statistics(KEY, decoder, draft, target, 20_000)
    np.testing.assert_array_equal(counts.rejected, np.asarray(trace.rejected).sum(0))
    # Verified drafts per position: binomial, |z| <= 4.5 with the largest possible SE.
    verified = counts.verified / 20_000
    assert np.all(np.abs(verified - np.asarray(want.verified)) < stats.Z * np.sqrt(0.25 / 20_000))


# ------------------------------------------------------- new entry points == old conveniences
def _old_sampler(name, key, draft, target, num_chains):
    decoder = CASES[name]
    if name == "autoregressive":
        return specjax.autoregressive_decoding(key, target, num_chains)
    if isinstance(decoder, specjax.Speculative):
        return specjax.speculative_decoding(key, draft, target, num_chains,
                                            lookahead=decoder.lookahead)
    if isinstance(decoder, specjax.BatchSpeculative):
        return specjax.batch_speculative_decoding(
            key, draft, target, num_chains, num_drafts=decoder.num_drafts,
            replacement=decoder.replacement, lookahead=decoder.lookahead)
    if isinstance(decoder, specjax.BiasedSpeculative):
        return specjax.biased_speculative_decoding(
            key, draft, target, num_chains, epsilon=decoder.epsilon, residual=decoder.residual,
            lookahead=decoder.lookahead)
    if isinstance(decoder, specjax.RejectionRule):
        return specjax.rejection_decoding(key, draft, target, num_chains,
                                          accept_prob=sd_accept, residual=sd_residual)
    with pytest.warns(DeprecationWarning, match="specjax.decode"):
        return specjax.compat.block_verification_decoding(key, draft, target, num_chains,
                                                          lookahead=decoder.lookahead)


def _old_exact(name, draft, target):
    """The deprecated ``specjax.compat`` convenience of the case, which must warn."""
    decoder, compat = CASES[name], specjax.compat
    if isinstance(decoder, specjax.Speculative):
        old = lambda: compat.exact_speculative_decoding(draft, target,
                                                        lookahead=decoder.lookahead)
    elif isinstance(decoder, specjax.BatchSpeculative):
        old = lambda: compat.exact_batch_speculative_decoding(
            draft, target, num_drafts=decoder.num_drafts, replacement=decoder.replacement,
            lookahead=decoder.lookahead)
    elif isinstance(decoder, specjax.BiasedSpeculative):
        old = lambda: compat.exact_biased_speculative_decoding(
            draft, target, epsilon=decoder.epsilon, residual=decoder.residual,
            lookahead=decoder.lookahead)
    elif isinstance(decoder, specjax.RejectionRule):
        old = lambda: compat.exact_rejection_decoding(draft, target, accept_prob=sd_accept,
                                                      residual=sd_residual)
    else:
        return None
    with pytest.warns(DeprecationWarning, match="specjax.exact"):
        return old()


#: The chain count of test_scale's statistics test on ``instance()``: the decode programs of the
#: cases here are that test's (each is a distinct compilation of a sampler, 0.5-1.5 s of CPU).
SCALE_CHAINS = 3000


@pytest.mark.parametrize("name", list(LEGACY_CASES))
def test_new_entry_points_equal_the_old_conveniences(name):
    draft, target = instance()
    # test_scale's programs (SCALE_CHAINS chains of instance()), which
    # test_tokens_and_exact_values_equal_the_previous_implementation runs too
    new = specjax.decode(KEY, CASES[name], draft, target, SCALE_CHAINS)
    old = _old_sampler(name, KEY, draft, target, SCALE_CHAINS)
    for field in new._fields:
        np.testing.assert_array_equal(getattr(new, field), getattr(old, field), err_msg=field)
    # In float64: the exact programs of test_tokens_and_exact_values_equal_the_previous_
    # implementation (the conveniences are the same functions in either dtype).
    with jax.enable_x64(True):
        draft, target = float64(draft, target)
        old_exact = _old_exact(name, draft, target)
        if old_exact is not None:
            new_exact = specjax.exact(CASES[name], draft, target)
            for field in new_exact._fields:
                np.testing.assert_array_equal(getattr(new_exact, field),
                                              getattr(old_exact, field))


# The block conveniences (exact_block_expected_calls, exact_block_accepted_length) warn and equal
# the entry points: test_api's test_compat_functions_warn_what_to_call_and_return_the_same checks
# both, with the advice the warnings give.


# ----------------------------------------------------------------------- the support table
MODEL_KINDS = ("markov", "finite_state", "protocol")


def _models(kind):
    draft, target = instance(num_states=3, horizon=4)
    if kind == "markov":
        return draft, target, {}
    lift = [specjax.FiniteStateModel.from_markov_chain(m) for m in (draft, target)]
    if kind == "finite_state":
        return lift[0], lift[1], dict(horizon=4)
    ngram = [specjax.NGramModel(jnp.asarray(m.trans[0]), 2) for m in (draft, target)]
    return ngram[0], ngram[1], dict(horizon=4)


def _supported(name, kind, entry):
    """The support table of docs/guides/decoders.md."""
    block = isinstance(CASES[name], specjax.CallDecoder)  # block verification, trees
    if entry == "accepted_length" and getattr(CASES[name], "num_call_states", 1) > 1:
        return False  # a call depends on the earlier calls (HeuristicSchedule)
    if kind == "markov":
        return True
    if entry in ("accepted_length", "objective"):
        return False  # one value per previous token; tuning objectives take MarkovChains
    if block:
        return False
    return entry != "exact" or kind == "finite_state"


ENTRIES = ("decode", "decoding_statistics", "exact", "accepted_length", "objective")


@pytest.mark.parametrize("kind", MODEL_KINDS)
@pytest.mark.parametrize("name", list(CASES))
def test_every_decoder_entry_point_and_model_kind_works_or_is_refused(name, kind):
    draft, target, kw = _models(kind)
    decoder = CASES[name]
    calls = {
        # 4 chains: the program of one chunk of decoding_statistics' 8 chains, compiled once
        "decode": lambda: specjax.decode(KEY, decoder, draft, target, 4, **kw).tokens,
        "decoding_statistics": lambda: specjax.decoding_statistics(
            KEY, decoder, draft, target, 8, chunk_size=4, **kw).rejected,
        "exact": lambda: specjax.exact(decoder, draft, target, **kw).expected_calls,
        "accepted_length": lambda: specjax.accepted_length(decoder, draft, target),
        "objective": lambda: specjax.objective(decoder, "calls")(draft, target),
    }
    for entry in ENTRIES:
        if kind == "markov" and entry in ("decode", "decoding_statistics"):
            # test_scale's statistics test runs both for every case on Markov chains, and checks
            # more than finiteness (test_coverage checks that it takes every case): compiling
            # them here again cost about 1.2 s of the suite's CPU per case.
            continue
        if _supported(name, kind, entry):
            assert np.isfinite(np.asarray(calls[entry]())).all(), entry
        else:
            with pytest.raises(ValueError, match="MarkovChain|FiniteStateModel|earlier calls"):
                calls[entry]()


# ----------------------------------------------------------------- accepted length, settings
def test_accepted_length_against_closed_forms(x64):
    # OUTSIDE's models, and the lookaheads and a position of the call-level test's accepted
    # lengths (their programs): K' = min(K, T - 4) = 1, 3, 3 drafts from position 5
    draft, target = float64(*instance(**OUTSIDE))
    for k in (1, 3, 7):
        np.testing.assert_allclose(
            specjax.accepted_length(specjax.Speculative(k), draft, target, position=5),
            specjax.theory.exact_tokenwise_accepted_length(draft, target, lookahead=k, position=5),
            atol=1e-12)
    # One draft per call: the probability that the root accepts, 1 - sum [q - S_M p]_+.
    one = specjax.accepted_length(specjax.BatchSpeculative(3, lookahead=1), draft, target)
    rejected = specjax.decoders.batch_residual_mass(draft.trans[0], target.trans[0],
                                                    num_drafts=3).sum(-1)
    np.testing.assert_allclose(one, 1 - rejected, atol=1e-12)
    np.testing.assert_array_equal(specjax.accepted_length(specjax.Autoregressive(), None,
                                                          target), np.zeros(4))
    # K = T: the call may run to the end of the horizon.
    full = specjax.accepted_length(specjax.Speculative(), draft, target, position=1)
    np.testing.assert_allclose(full, specjax.theory.exact_tokenwise_accepted_length(
        draft, target, lookahead=7), atol=1e-12)
    for position in (0, 8, 1.5, True):
        with pytest.raises(ValueError, match="position must be an integer in"):
            specjax.accepted_length(specjax.Speculative(), draft, target, position=position)


def test_static_settings_passed_as_arrays_say_they_are_static():
    for build in (lambda: specjax.Speculative(jnp.int32(4)),
                  lambda: specjax.BatchSpeculative(jnp.int32(2)),
                  lambda: specjax.BlockVerification(np.int64(2) + jnp.zeros((), jnp.int32))):
        with pytest.raises(ValueError, match="static setting"):
            build()
    draft, target = instance()
    with pytest.raises(ValueError, match="static setting"):
        jax.jit(lambda k: specjax.exact(specjax.Speculative(k), draft, target).expected_calls)(
            3)
    assert specjax.Speculative(np.int64(3)).lookahead == 3  # NumPy integers are static values
    with pytest.raises(ValueError, match="decoder must be a specjax decoder"):
        specjax.exact("sd", draft, target)
    with pytest.raises(ValueError, match="residual must be one of"):
        specjax.BiasedSpeculative(0.1, residual="greedy")
    with pytest.raises(ValueError, match="epsilon must be non-negative"):
        specjax.decode(KEY, specjax.BiasedSpeculative(-0.1), draft, target, 4)
    with pytest.raises(ValueError, match="replacement must be True or False"):
        specjax.BatchSpeculative(2, replacement=1)
    with pytest.raises(TypeError):
        specjax.BatchSpeculative(2, False)  # settings after the first are keyword-only
    assert dataclasses.replace(specjax.BatchSpeculative(2), num_drafts=math.inf).num_drafts \
        == math.inf


def test_output_chain_takes_a_decoder_and_refuses_phase_dependent_ones():
    draft, target = instance()
    chain = specjax.output_chain(specjax.Speculative(), draft, target)
    np.testing.assert_allclose(chain.trans, target.trans, atol=1e-6)
    rule = specjax.RejectionRule(sd_accept, sd_residual)
    with pytest.warns(DeprecationWarning, match="output_chain"):
        old = specjax.output_chain(draft, target, accept_prob=sd_accept, residual=sd_residual)
    np.testing.assert_array_equal(old.trans, specjax.output_chain(rule, draft, target).trans)
    for decoder in (specjax.Speculative(2), specjax.BatchSpeculative(2),
                    specjax.BlockVerification(2)):
        with pytest.raises(ValueError, match="not a Markov chain in the tokens"):
            specjax.output_chain(decoder, draft, target)


def test_residual_distribution_is_deprecated_for_the_draft_first_name():
    p = jnp.array([0.5, 0.5, 0.0])
    q = jnp.array([0.2, 0.3, 0.5])
    with pytest.warns(DeprecationWarning, match="speculative_residual"):
        old = specjax.residual_distribution(q, p)
    np.testing.assert_array_equal(old, specjax.speculative_residual(p, q))
    np.testing.assert_allclose(specjax.speculative_residual(p, q), [0, 0, 1])


# ------------------------------------------- against the previous implementation, stored
GOLDEN = read_archive(DATA / "golden_0925acd.npz")


def golden_instance():
    """The archive's inputs: ``instance()`` as XLA:CPU draws it with its default settings (the
    same bits at level 1), stored, because the suite's level 0 rounds the float32
    transcendental functions of the Dirichlet draws differently in the last bit (an ulp in about
    a quarter of the entries: 149 of 600), and the float64 exact values below see that."""
    stored = read_archive(DATA / "golden_0925acd_instance.npz")
    models = tuple(specjax.MarkovChain(jnp.asarray(stored[f"{name}_init"]),
                                       jnp.asarray(stored[f"{name}_trans"]))
                   for name in ("draft", "target"))
    for model, drawn in zip(models, instance()):  # the same pair, to float32 rounding
        np.testing.assert_allclose(model.trans, drawn.trans, rtol=0, atol=1e-6)
        np.testing.assert_allclose(model.init, drawn.init, rtol=0, atol=1e-6)
    return models


def test_tokens_and_exact_values_equal_the_previous_implementation():
    """``tests/data/golden_0925acd.npz`` holds what the code before decoders were values (commit
    0925acd) printed for these inputs (``tests/data/README.md`` says how it was made): every
    token of every decoder for the same key, every exact field in float64, and the chunked
    statistics. The new entry points reproduce all of them."""
    key = jax.random.key(2024)
    draft, target = golden_instance()
    for name, decoder in LEGACY_CASES.items():
        # The archive's first 64 chains, of test_scale's SCALE_CHAINS (its programs): a chain's
        # draws do not depend on the number of chains (test_api's test_prefix_of_chains_is_stable)
        trace = specjax.decode(key, decoder, draft, target, SCALE_CHAINS)
        for field in ("tokens", "rejected", "new_call"):
            np.testing.assert_array_equal(np.asarray(getattr(trace, field))[:64],
                                          GOLDEN[f"{name}|{field}"], err_msg=f"{name} {field}")
    # One chunk of 1,000 chains: test_scale's program for its sd K=3 case in exact chunks (the
    # counts do not depend on the chunks: test_scale checks padded ones against the trace)
    counts = specjax.decoding_statistics(key, specjax.Speculative(3), draft, target, 1000,
                                         chunk_size=1000)
    archived = {"rejected": "rejections_at", "verified": "verified_at",  # the archive's names
                "new_call": "calls_at"}
    for field in ("num_rejections", "rejected", "verified", "new_call", "final_token_counts"):
        np.testing.assert_array_equal(
            getattr(counts, field), GOLDEN[f"statistics sd K=3|{archived.get(field, field)}"])
    with jax.enable_x64(True):
        d64, t64 = float64(draft, target)
        decoders = dict(LEGACY_CASES, **{"batch M=inf": specjax.BatchSpeculative(math.inf)})
        for name, decoder in decoders.items():
            if name in ("autoregressive", "block K=3"):
                continue
            result = specjax.exact(decoder, d64, t64)
            np.testing.assert_array_equal(result.emitted, 1)  # newer than the archive
            for field in ("rejected", "new_call", "marginals", "verified"):
                np.testing.assert_allclose(getattr(result, field),
                                           GOLDEN[f"exact {name}|{field}"], rtol=0, atol=1e-13,
                                           err_msg=f"{name} {field}")
        block = specjax.BlockVerification(3)
        np.testing.assert_allclose(specjax.exact(block, d64, t64).expected_calls,
                                   GOLDEN["exact block K=3|expected_calls"], rtol=0, atol=1e-12)
        # The old function summed m_i = min(m_{i-1} q, p(x_{1:i})); the call law sums P(tau >= i)
        # from the backward pass. The two are equal on the simplex, and these float32-made rows
        # sum to one only within about 1e-7 in float64, hence the tolerance (test_block.py checks
        # the call law against the literal algorithm, enumerated, to 1e-10).
        for n in (1, 11):
            np.testing.assert_allclose(specjax.accepted_length(block, d64, t64, position=n),
                                       GOLDEN[f"exact block K=3|accepted_length@{n}"], rtol=0,
                                       atol=1e-6)
        paper = float64(*specjax.paper_instance())
        np.testing.assert_allclose(specjax.exact(specjax.Speculative(), *paper)
                                   .expected_rejections, GOLDEN["paper|expected_rejections"],
                                   rtol=1e-14)
        np.testing.assert_allclose(specjax.exact(specjax.BatchSpeculative(4), *paper)
                                   .expected_rejections, GOLDEN["paper|batch4"], rtol=1e-14)
