"""Public API: models, validation errors, determinism, jit/vmap safety, dtypes, trace fields,
and the tiers of names (moved names, specjax.compat, renamed result fields)."""

import importlib
import inspect
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
import specjax.compat
from conftest import float64
from conftest import uniform_chain
from sampler_cases import instance
from sampler_cases import sd_accept
from sampler_cases import sd_residual

KEY = jax.random.key(0)


def small_pair(v=4, t=5, seed=0):
    kd, kt = jax.random.split(jax.random.key(seed))
    return specjax.random_markov_chain(kd, v, t), specjax.random_markov_chain(kt, v, t)




def _residual(p, q, b):
    return specjax.speculative_residual(p, q)


#: The samplers with the settings of sampler_cases' cases (sd, sd K=3, batch M=3, biased eps=0.1
#: UNO K=4, rejection, autoregressive): on its ``instance()`` with test_scale's
#: ``SCALE_CHAINS`` chains, they run test_scale's compiled programs.
SAMPLERS = [
    lambda k, d, t, c: specjax.speculative_decoding(k, d, t, c),
    lambda k, d, t, c: specjax.speculative_decoding(k, d, t, c, lookahead=3),
    lambda k, d, t, c: specjax.batch_speculative_decoding(k, d, t, c, num_drafts=3),
    lambda k, d, t, c: specjax.biased_speculative_decoding(k, d, t, c, epsilon=0.1,
                                                           residual="target", lookahead=4),
    lambda k, d, t, c: specjax.rejection_decoding(k, d, t, c, accept_prob=sd_accept,
                                                  residual=sd_residual),
    lambda k, d, t, c: specjax.autoregressive_decoding(k, t, c),
]
IDS = ["sd", "sd_k3", "batch", "biased", "rejection", "autoregressive"]
SCALE_CHAINS = 3000


# ----------------------------------------------------------------------------- models
def test_markov_chain_fields_and_pytree():
    d, _ = small_pair()
    assert d.init.shape == (4,) and d.trans.shape == (5, 4, 4)
    assert (d.num_states, d.horizon) == (4, 5)
    np.testing.assert_allclose(d.init, 0.25)
    np.testing.assert_allclose(d.trans.sum(-1), 1.0, atol=1e-6)
    leaves = jax.tree_util.tree_leaves(d)
    assert len(leaves) == 2
    doubled = jax.jit(lambda m: jax.tree_util.tree_map(lambda x: 2 * x, m))(d)
    assert isinstance(doubled, specjax.MarkovChain)


def test_from_logits_is_softmax_and_differentiable():
    logits = jnp.zeros((1, 3, 3)).at[0, 0].set(jnp.array([0.0, -jnp.inf, 1.0]))
    chain = specjax.MarkovChain.from_logits(jnp.zeros(3), logits)
    np.testing.assert_allclose(chain.init, 1 / 3, rtol=1e-6)
    assert chain.trans[0, 0, 1] == 0.0
    g = jax.jit(jax.grad(lambda l: specjax.MarkovChain.from_logits(jnp.zeros(3),
                                                                   l).trans[0, 0, 0]))(
        jnp.zeros((1, 3, 3)))  # one compiled program (op by op, the gradient compiled 30)
    assert jnp.isfinite(g).all()


def test_random_markov_chain_is_deterministic_and_concentration_matters():
    # (V, T) = (4, 5), small_pair's: one compiled Dirichlet draw for the whole module
    a = specjax.random_markov_chain(KEY, 4, 5)
    b = specjax.random_markov_chain(KEY, 4, 5)
    np.testing.assert_array_equal(a.trans, b.trans)
    peaked = specjax.random_markov_chain(KEY, 4, 5, concentration=0.05)
    flat = specjax.random_markov_chain(KEY, 4, 5, concentration=50.0)
    assert peaked.trans.max(-1).mean() > flat.trans.max(-1).mean()


def test_paper_instance_shape():
    d, t = specjax.paper_instance()
    assert (d.num_states, d.horizon) == (7, 50)
    np.testing.assert_allclose(t.init, 1 / 7, rtol=1e-6)
    assert not np.allclose(d.trans, t.trans)


@pytest.mark.parametrize("init, trans, match", [
    (jnp.ones((2, 2)) / 2, jnp.ones((3, 2, 2)) / 2, "init must have shape"),
    (jnp.ones(2) / 2, jnp.ones((3, 2, 3)) / 2, "trans must have shape"),
    (jnp.ones(3) / 3, jnp.ones((3, 2, 2)) / 2, "init has V = 3"),
    (jnp.array([0.5, jnp.nan]), jnp.ones((3, 2, 2)) / 2, "init contains NaN"),
    (jnp.array([1.5, -0.5]), jnp.ones((3, 2, 2)) / 2, "init contains negative"),
    (jnp.ones(2) / 2, jnp.ones((3, 2, 2)), "trans rows must sum to one"),
    (jnp.ones(2) / 2, jnp.ones((0, 2, 2)), "horizon T >= 1"),
])
def test_markov_chain_validation(init, trans, match):
    with pytest.raises(ValueError, match=match):
        specjax.MarkovChain(init, trans)


def test_markov_chain_inside_jit_skips_value_checks():
    """Documented behaviour: under jit, values cannot be checked; shapes still are."""
    bad = jnp.ones((2, 2, 2))  # rows sum to 2
    out = jax.jit(lambda t: specjax.MarkovChain(jnp.ones(2) / 2, t).trans.sum())(bad)
    assert out == 8.0
    with pytest.raises(ValueError, match="trans must have shape"):
        jax.jit(lambda t: specjax.MarkovChain(jnp.ones(2) / 2, t))(jnp.ones((2, 2, 3)))


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_states=0, horizon=3), "num_states must be a positive integer"),
    (dict(num_states=3, horizon=-1), "horizon must be a positive integer"),
    (dict(num_states=3, horizon=2.5), "horizon must be a positive integer"),
    (dict(num_states=3, horizon=2, concentration=0.0), "concentration must be positive"),
])
def test_random_markov_chain_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        specjax.random_markov_chain(KEY, **kwargs)


# ----------------------------------------------------------------------------- sampler validation
def test_sampler_validation_errors():
    d, t = small_pair()
    other_v, other_t = uniform_chain(3, 5), uniform_chain(4, 6)
    with pytest.raises(ValueError, match="same number of states V"):
        specjax.speculative_decoding(KEY, other_v, t, 10)
    with pytest.raises(ValueError, match="same horizon T"):
        specjax.batch_speculative_decoding(KEY, d, other_t, 10, num_drafts=2)
    with pytest.raises(ValueError, match="num_chains must be a positive integer"):
        specjax.speculative_decoding(KEY, d, t, 0)
    with pytest.raises(ValueError, match="num_chains must be a positive integer"):
        specjax.autoregressive_decoding(KEY, t, 2.0)
    with pytest.raises(ValueError, match="lookahead must be a positive integer"):
        specjax.speculative_decoding(KEY, d, t, 10, lookahead=0)
    with pytest.raises(ValueError, match="num_drafts must be a positive integer"):
        specjax.batch_speculative_decoding(KEY, d, t, 10, num_drafts=0)
    with pytest.raises(ValueError, match="epsilon must be non-negative"):
        specjax.biased_speculative_decoding(KEY, d, t, 10, epsilon=-0.1)
    with pytest.raises(ValueError, match="epsilon must be non-negative"):
        specjax.biased_speculative_decoding(KEY, d, t, 10, epsilon=float("nan"))
    with pytest.raises(ValueError, match="residual must be one of"):
        specjax.biased_speculative_decoding(KEY, d, t, 10, epsilon=0.1, residual="best")
    with pytest.raises(ValueError, match="key must be a JAX PRNG key"):
        specjax.speculative_decoding(0, d, t, 10)
    with pytest.raises(ValueError, match="draft must be a specjax.MarkovChain"):
        specjax.speculative_decoding(KEY, (d.init, d.trans), t, 10)
    with pytest.raises(ValueError, match="accept_prob must be a function"):
        specjax.rejection_decoding(KEY, d, t, 10, accept_prob=0.5, residual=_residual)


# ----------------------------------------------------------------------------- behaviour
@pytest.mark.parametrize("sampler", SAMPLERS, ids=IDS)
def test_trace_fields_and_determinism(sampler):
    d, t = instance()  # V = 5, T = 12
    a = sampler(KEY, d, t, SCALE_CHAINS)
    b = sampler(KEY, d, t, SCALE_CHAINS)
    c = sampler(jax.random.key(1), d, t, SCALE_CHAINS)
    assert a.tokens.shape == (SCALE_CHAINS, 13) and a.tokens.dtype == jnp.int32
    assert a.rejected.shape == (SCALE_CHAINS, 12) and a.rejected.dtype == jnp.bool_
    assert a.num_rejections.shape == (SCALE_CHAINS,) and a.num_rejections.dtype == jnp.int32
    assert a.num_calls.shape == (SCALE_CHAINS,) and a.num_calls.dtype == jnp.int32
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a.tokens, c.tokens)
    np.testing.assert_array_equal(a.num_rejections, a.rejected.sum(-1))
    np.testing.assert_array_equal(a.num_calls, a.new_call.sum(-1))
    assert (a.tokens >= 0).all() and (a.tokens < 5).all()
    assert a.new_call[:, 0].all()


def test_calls_structure():
    # The sd runs on the module's pair are the programs of test_prefix_of_chains_is_stable and
    # test_identical_draft_and_target_never_rejects; the autoregressive and K = 3 runs on
    # sampler_cases' instance (T = 12) test_trace_fields_and_determinism's.
    d, t = small_pair()
    sd = specjax.speculative_decoding(KEY, d, t, 1000)
    # K = T: a call at n = 1 and after every rejection before T.
    np.testing.assert_array_equal(sd.num_calls, 1 + sd.rejected[:, :-1].sum(-1))
    ar = specjax.autoregressive_decoding(KEY, instance()[1], SCALE_CHAINS)
    assert (ar.num_calls == 12).all() and (ar.num_rejections == 0).all()
    # (test_trace_fields_and_determinism[sd_k3]'s program)
    k3 = specjax.speculative_decoding(KEY, *instance(), SCALE_CHAINS, lookahead=3)
    # No block is longer than K + 1 tokens: at most 3 drafts and a bonus per call.
    starts = np.asarray(k3.new_call)
    for row in starts:
        gaps = np.diff(np.append(np.nonzero(row)[0], 12))
        assert (gaps <= 4).all()
    big = specjax.speculative_decoding(KEY, d, t, 1000, lookahead=100)
    np.testing.assert_array_equal(big.tokens, sd.tokens)  # K >= T is K = T


def test_identical_draft_and_target_never_rejects():
    _, t = small_pair()
    trace = specjax.speculative_decoding(KEY, t, t, 1000)
    assert (trace.num_rejections == 0).all() and (trace.num_calls == 1).all()
    batch = specjax.batch_speculative_decoding(KEY, t, t, 1000, num_drafts=4)
    assert (batch.num_rejections == 0).all()


def test_disjoint_supports_always_reject():
    # small_pair's V and T and 1,000 chains: the programs of
    # test_identical_draft_and_target_never_rejects
    v, horizon = 4, 5
    p_row = jnp.array([0.5, 0.5, 0.0, 0.0])
    q_row = jnp.array([0.0, 0.0, 0.5, 0.5])
    d = specjax.MarkovChain(jnp.ones(v) / v, jnp.broadcast_to(p_row, (horizon, v, v)))
    t = specjax.MarkovChain(jnp.ones(v) / v, jnp.broadcast_to(q_row, (horizon, v, v)))
    for trace in (specjax.speculative_decoding(KEY, d, t, 1000),
                  specjax.batch_speculative_decoding(KEY, d, t, 1000, num_drafts=4)):
        assert (trace.num_rejections == horizon).all()
        assert (trace.tokens[:, 1:] >= 2).all()


def test_values_of_different_classes_never_share_a_structure():
    """Decoders, policies and models of different classes with the same field layout have
    different PyTreeDefs and compare unequal, so jit's caches never hand one's compiled program
    to the other. (jaxlib 0.10.2's register_dataclass nodes compare equal across classes; a
    threshold sweep of ConfidenceThreshold once ran RejectionThreshold's program.)"""
    same_layout = [
        (specjax.AdaptiveSpeculative(specjax.decoders.RejectionThreshold(0.3),
                                     max_lookahead=3),
         specjax.AdaptiveSpeculative(specjax.decoders.ConfidenceThreshold(0.3),
                                     max_lookahead=3),
         specjax.AdaptiveSpeculative(specjax.decoders.EntropyThreshold(0.3),
                                     max_lookahead=3)),
        (specjax.KSequential(2), specjax.ImportanceWeighted(2), specjax.GumbelList(2)),
        (specjax.decoders.RejectionThreshold(0.3), specjax.decoders.ConfidenceThreshold(0.3)),
    ]
    for group in same_layout:
        for i, a in enumerate(group):
            for b in group[i + 1:]:
                assert jax.tree_util.tree_structure(a) != jax.tree_util.tree_structure(b), (a, b)
                assert a != b, (a, b)
    # Every public dataclass value still round-trips through flatten / unflatten.
    for value in [group[0] for group in same_layout] + [specjax.Speculative(lookahead=2),
                                                        specjax.paper_instance()[0]]:
        leaves, treedef = jax.tree_util.tree_flatten(value)
        assert jax.tree_util.tree_unflatten(treedef, leaves) == value


def test_no_recompilation_for_new_values():
    d, t = small_pair()
    d2, t2 = small_pair(seed=5)
    compiled = specjax.sampling.decoding._simulate_markov
    specjax.speculative_decoding(KEY, d, t, 32)
    before = compiled._cache_size()
    specjax.speculative_decoding(jax.random.key(3), d2, t2, 32)
    specjax.biased_speculative_decoding(KEY, d, t, 32, epsilon=0.1)
    after_first_biased = compiled._cache_size()
    specjax.biased_speculative_decoding(KEY, d2, t2, 32, epsilon=0.3)
    assert compiled._cache_size() == after_first_biased == before + 1


def test_decoders_inside_a_users_jit_trace_once():
    """A decoder's numeric settings are pytree leaves: new values (and new models) under the
    user's own ``jit`` reuse one trace; its static settings are part of the cache key."""
    d, t = small_pair()
    d2, t2 = small_pair(seed=5)

    @jax.jit
    @chex.assert_max_traces(n=1)
    def rejections(key, draft, target, epsilon):
        decoder = specjax.BiasedSpeculative(epsilon, lookahead=2)
        trace = specjax.decode(key, decoder, draft, target, 16)
        return trace.num_rejections.mean() + specjax.exact(decoder, draft, target).expected_calls

    for key, draft, target, eps in [(KEY, d, t, 0.1), (jax.random.key(1), d2, t2, 0.3)]:
        assert np.isfinite(float(rejections(key, draft, target, eps)))
    assert specjax.Speculative(3) == specjax.Speculative(3)
    assert hash(specjax.BatchSpeculative(2)) == hash(specjax.BatchSpeculative(2))
    assert specjax.Speculative(3) != specjax.Speculative(4)


def test_user_jit_and_vmap_over_keys():
    d, t = small_pair()
    # 32 chains: the direct run is test_no_recompilation_for_new_values' program
    run = jax.jit(lambda k, d, t: specjax.speculative_decoding(k, d, t, 32).num_rejections)
    keys = jax.random.split(KEY, 3)
    out = jax.vmap(run, in_axes=(0, None, None))(keys, d, t)
    assert out.shape == (3, 32)
    direct = specjax.speculative_decoding(keys[1], d, t, 32).num_rejections
    np.testing.assert_array_equal(out[1], direct)


def test_raw_uint32_key_accepted():
    d, t = small_pair()
    trace = specjax.speculative_decoding(jax.random.PRNGKey(0), d, t, 8)
    assert trace.tokens.shape == (8, 6)


def test_prefix_of_chains_is_stable():
    """Chain c's randomness does not depend on num_chains (partitionable Threefry)."""
    d, t = small_pair()
    # the programs of test_no_recompilation_for_new_values and test_calls_structure
    small = specjax.speculative_decoding(KEY, d, t, 32)
    large = specjax.speculative_decoding(KEY, d, t, 1000)
    np.testing.assert_array_equal(small.tokens, large.tokens[:32])


def test_float64_under_x64(x64):
    d, t = small_pair()
    assert d.trans.dtype == jnp.float64
    trace = specjax.speculative_decoding(KEY, d, t, 8)
    assert trace.tokens.dtype == jnp.int32


def test_tiny_probabilities_and_zero_tokens_in_float32():
    """A token of probability 1e-30 is legal; one of probability 0 is never drawn."""
    v, horizon = 3, 4
    q_row = jnp.array([1.0 - 1e-30, 1e-30, 0.0])
    p_row = jnp.array([0.0, 0.5, 0.5])
    d = specjax.MarkovChain(jnp.array([1.0, 0, 0]), jnp.broadcast_to(p_row, (horizon, v, v)))
    t = specjax.MarkovChain(jnp.array([1.0, 0, 0]), jnp.broadcast_to(q_row, (horizon, v, v)))
    trace = specjax.speculative_decoding(KEY, d, t, 20000)
    assert (trace.tokens != 2).all()


# ----------------------------------------------------------------------------- tiers of names
@pytest.mark.parametrize("name", sorted(specjax._MOVED))
def test_a_moved_name_still_resolves_with_a_warning_naming_its_home(name):
    """``specjax.<name>`` of a name that left the top level is the object of its new home, with
    a ``DeprecationWarning`` that names the home; it is in neither ``__all__`` nor ``dir``."""
    home = importlib.import_module(specjax._MOVED[name])
    with pytest.warns(DeprecationWarning, match=rf"specjax\.{name} moved to "
                                                rf"{re.escape(home.__name__)}\.{name}"):
        old = getattr(specjax, name)
    assert old is getattr(home, name)
    assert name in home.__all__
    assert name not in specjax.__all__ and name not in dir(specjax)


def test_an_unknown_name_is_still_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'speculative'"):
        specjax.speculative  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        specjax.theory.nothing  # noqa: B018


@pytest.mark.parametrize("package, name", [
    ("theory", "exact_speculative_decoding"), ("theory", "exact_block_expected_calls"),
    ("sampling", "block_verification_decoding"), ("tuning", "sd_rejections")])
def test_a_subpackage_wrapper_resolves_to_compat_with_a_warning(package, name):
    module = importlib.import_module(f"specjax.{package}")
    with pytest.warns(DeprecationWarning, match=f"specjax.compat.{name}"):
        assert getattr(module, name) is getattr(specjax.compat, name)
    assert name not in module.__all__


def test_compat_functions_warn_what_to_call_and_return_the_same():
    # sampler_cases' instance and cases, the exact values in float64: the programs of
    # test_decoders' golden test (its exact values, the block case's accepted length at position
    # 11) and test_scale's (the block case's decode of 3,000 chains)
    d32, t32 = instance()
    with jax.enable_x64(True):
        d, t = float64(d32, t32)
    compat = specjax.compat
    x64 = [
        (lambda: compat.exact_speculative_decoding(d, t, lookahead=3),
         lambda: specjax.exact(specjax.Speculative(3), d, t), r"specjax\.exact\(specjax\.Spec"),
        (lambda: compat.exact_batch_speculative_decoding(d, t, num_drafts=2, replacement=False),
         lambda: specjax.exact(specjax.BatchSpeculative(2, replacement=False), d, t),
         r"BatchSpeculative"),
        (lambda: compat.exact_biased_speculative_decoding(d, t, epsilon=0.1, residual="target",
                                                          lookahead=4),
         lambda: specjax.exact(specjax.BiasedSpeculative(0.1, residual="target", lookahead=4),
                               d, t),
         r"BiasedSpeculative"),
        (lambda: compat.exact_rejection_decoding(d, t, accept_prob=sd_accept,
                                                 residual=sd_residual),
         lambda: specjax.exact(specjax.RejectionRule(sd_accept, sd_residual), d, t),
         r"RejectionRule"),
        (lambda: compat.exact_block_expected_calls(d, t, lookahead=3),
         lambda: specjax.exact(specjax.BlockVerification(3), d, t).expected_calls,
         r"specjax\.exact\(specjax\.BlockVerification\(lookahead\).*\)\.expected_calls"),
        (lambda: compat.exact_block_accepted_length(d, t, lookahead=3, position=11),
         lambda: specjax.accepted_length(specjax.BlockVerification(3), d, t, position=11),
         r"specjax\.accepted_length"),
        (lambda: compat.sd_rejections(lookahead=3)(d, t),
         lambda: specjax.objective(specjax.Speculative(3), "rejections")(d, t),
         r"specjax\.objective"),
        (lambda: compat.batch_rejections(3)(d, t),
         lambda: specjax.objective(specjax.BatchSpeculative(3))(d, t), r"BatchSpeculative"),
        (lambda: compat.target_calls(lookahead=3)(d, t),
         lambda: specjax.objective(specjax.Speculative(3), "calls")(d, t), r'"calls"'),
    ]
    float32 = [
        (lambda: compat.block_verification_decoding(KEY, d32, t32, 3000, lookahead=3),
         lambda: specjax.decode(KEY, specjax.BlockVerification(3), d32, t32, 3000),
         r"specjax\.decode"),
    ]
    assert len(x64) + len(float32) == len(compat.__all__)
    for enable, cases in ((True, x64), (False, float32)):
        with jax.enable_x64(enable):
            for old, new, advice in cases:
                with pytest.warns(DeprecationWarning, match=advice):
                    got = old()
                for a, b in zip(jax.tree_util.tree_leaves(got),
                                jax.tree_util.tree_leaves(new())):
                    np.testing.assert_array_equal(a, b)


def test_decoding_statistics_old_field_names_warn_and_read_the_same_counts():
    # test_scale's programs (its sd K=3 case, in one chunk)
    d, t = instance()
    counts = specjax.decoding_statistics(KEY, specjax.Speculative(3), d, t, SCALE_CHAINS)
    trace = specjax.decode(KEY, specjax.Speculative(3), d, t, SCALE_CHAINS)
    np.testing.assert_array_equal(counts.rejected, np.asarray(trace.rejected).sum(0))
    np.testing.assert_array_equal(counts.new_call, np.asarray(trace.new_call).sum(0))
    for old, new in (("rejections_at", "rejected"), ("verified_at", "verified"),
                     ("calls_at", "new_call"), ("emitted_at", "emitted")):
        with pytest.warns(DeprecationWarning, match=rf"\.{old} is deprecated: read \.{new}"):
            value = getattr(counts, old)
        assert value is getattr(counts, new)
        assert old not in counts._fields
    with pytest.raises(AttributeError):
        counts.rejections_at = None  # read-only


def test_the_result_types_share_field_names():
    """The same quantity has the same name in the trace, the exact values and the counts."""
    shared = {"rejected", "new_call"}
    assert shared <= set(specjax.DecodingTrace._fields)
    assert shared | {"verified", "emitted"} <= set(specjax.ExactDecoding._fields)
    assert shared | {"verified", "emitted"} <= set(specjax.DecodingStatistics._fields)


def test_audit_rules_are_served_from_auditing():
    """Issue 31: ``specjax.auditing.speculative_rule``, ``accept_all``, ... resolve again."""
    from specjax.auditing import rules
    public = [n for n, v in vars(rules).items() if not n.startswith("_")
              and not inspect.ismodule(v)
              and getattr(v, "__module__", rules.__name__) == rules.__name__]
    assert {"speculative_rule", "accept_all", "greedy_rule_u", "from_uniform"} <= set(public)
    for name in public:
        assert getattr(specjax.auditing, name) is getattr(rules, name), name
        assert name in specjax.auditing.__all__
