"""Parallel drafters (``specjax.decoders.ParallelDraft``) three ways, on one small problem.

* ``parallel_call_literal`` transcribes one call in plain NumPy: all ``K`` drafts drawn first,
  each from the law of its depth given the last accepted token (the draft's ``i``-step marginal,
  a product of its rows, or a user's head), then verified in order against the target's row of
  the previous kept token, the first rejection drawing from the residual. Enumerated exactly
  (``reference.enumerate_law``) and chained over calls on V = 3, T = 3, it gives the law of
  ``(tokens, rejected, calls)``: the tokens' law is the target's, and ``exact`` equals its mean
  calls and rejections;
* an independent brute force sums the call's outcomes over the ``V**K`` draft blocks in closed
  form (``prod_j min(m_j, q_j)``) and runs a backward recursion over call starts: the decoder's
  call law and ``exact`` agree with it;
* the sampler fits the literal joint law (chi-square) and the exact mean calls.

With ``K = 1`` it is SD; zero probabilities, ``p = q`` and disjoint supports give finite values
and gradients.
"""

import functools
import itertools
from collections import defaultdict

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax.decoders import ParallelDraft
from specjax.decoders.parallel_draft import marginal_heads
import reference as ref
import stats
from conftest import edge_pair
from conftest import random_pair

V, T = 3, 3
NUM_CHAINS = 20_000


def pair():
    return random_pair(41, V, T, zero_fraction=0.3)


def to_chain(model, dtype=np.float64):
    init, trans = model
    return specjax.MarkovChain(jnp.asarray(init, dtype), jnp.asarray(trans, dtype))


def literal_heads(p_trans, lookahead):
    """``[i, r, a]``: the law of ``x_{r+i+1}`` given ``x_r = a`` under the draft, a product of
    its rows (rows past the horizon are never read: the last one stands in)."""
    horizon = p_trans.shape[0]
    heads = np.zeros((lookahead,) + p_trans.shape)
    for i in range(lookahead):
        for r in range(horizon):
            heads[i, r] = functools.reduce(
                np.matmul, [p_trans[min(r + j, horizon - 1)] for j in range(i + 1)])
    return heads


def random_heads(seed, lookahead):
    rng = np.random.default_rng(seed)
    heads = rng.dirichlet(np.ones(V), size=(lookahead, T, V))
    heads[0, 0, 0] = [1.0, 0.0, 0.0]  # a one-hot head
    return heads


# ----------------------------------------------------------------------------- literal algorithm
def parallel_call_literal(chooser, heads, target, n, prev, lookahead, accept=ref.sd_accept,
                          residual=ref.sd_residual):
    """One call at position ``n`` after the accepted token ``prev``, as described: the block is
    drafted first (depth ``i`` from ``heads[i - 1, n - 1, prev]``, not from the drafts before
    it), then each draft verified against the law it was drawn from and the target's row of the
    previous kept token. Returns ``(emitted tokens, their rejected flags, kept drafts)``."""
    _, q_trans = target
    horizon = q_trans.shape[0]
    gamma = min(lookahead, horizon - n + 1)
    drafts = [chooser.categorical(heads[i, n - 1, prev]) for i in range(gamma)]
    emitted, context = [], prev
    for i, x in enumerate(drafts):
        m, q = heads[i, n - 1, prev], q_trans[n - 1 + i, context]
        b = accept(m, q)
        if chooser.bernoulli(b[x]):
            emitted.append(x)
            context = x
        else:
            y = chooser.categorical(residual(m, q, b))
            return tuple(emitted + [y]), (False,) * i + (True,), i
    if n + gamma <= horizon:  # every draft kept: the target's bonus token
        emitted.append(chooser.categorical(q_trans[n - 1 + gamma, context]))
    return tuple(emitted), (False,) * len(emitted), gamma


def literal_law(heads, target, lookahead, **rule):
    """Exact law of ``(tokens, rejected, calls)``: each call enumerated once per ``(n, prev)``."""
    horizon = target[1].shape[0]
    calls = functools.lru_cache(maxsize=None)(lambda n, a: ref.enumerate_law(
        lambda chooser: parallel_call_literal(chooser, heads, target, n, a, lookahead, **rule)))
    return ref.chain_calls(target[0], horizon, calls)


def biased_target(eps):
    """BiasedSpeculative(eps, residual="target"): accept ``min(1, (q + eps) / p)``, resample
    ``q``."""
    return dict(accept=lambda p, q: ref.biased_accept(p, q, eps), residual=lambda p, q, b: q)


CASES = {  # name: (lookahead, heads kind, decoder rule, literal rule)
    "K=1": (1, "marginal", None, {}),
    "K=2": (2, "marginal", None, {}),
    "K=3": (3, "marginal", None, {}),
    "heads K=2": (2, "heads", None, {}),
    "biased UNO K=2": (2, "marginal", specjax.BiasedSpeculative(0.1, residual="target"),
                       biased_target(0.1)),
}


def case(name):
    lookahead, kind, rule, literal_rule = CASES[name]
    draft, target = pair()
    given = random_heads(7, lookahead) if kind == "heads" else None
    heads = literal_heads(draft[1], lookahead) if given is None else given
    extra = {} if rule is None else {"rule": rule}
    decoder = ParallelDraft(lookahead, heads=None if given is None else jnp.asarray(given),
                            **extra)
    return decoder, heads, draft, target, literal_rule


@functools.lru_cache(maxsize=None)
def cached_literal_law(name):
    _, heads, _, target, rule = case(name)
    return literal_law(heads, target, CASES[name][0], **rule)


@pytest.mark.parametrize("name", ["K=1", "K=2", "K=3", "heads K=2"])
def test_literal_parallel_drafting_is_lossless(name):
    """The whole-sequence law of the literal algorithm is the target's, exactly."""
    tokens = ref.marginalise_tokens(cached_literal_law(name))
    assert ref.max_difference(tokens, ref.target_sequence_law(pair()[1])) < 1e-10


@pytest.mark.parametrize("name", list(CASES))
def test_exact_values_match_the_literal_algorithm(name, x64):
    decoder, _, draft, target, _ = case(name)
    law = cached_literal_law(name)
    rejections, calls = ref.expected_counts_from_law(law)
    exact = specjax.exact(decoder, to_chain(draft), to_chain(target))
    assert abs(float(exact.expected_calls) - calls) < 1e-10
    assert abs(float(exact.expected_rejections) - rejections) < 1e-10
    marginals = np.zeros((T + 1, V))
    for (tokens, _, _), pr in law.items():
        marginals[np.arange(T + 1), tokens] += pr
    np.testing.assert_allclose(np.asarray(exact.marginals), marginals, atol=1e-10)


# ----------------------------------------------------------------------------- brute force
def brute_call(heads, q_trans, n, a, lookahead):
    """``{(kept, last token, rejected): probability}`` of a call, summed over the draft blocks:
    a block ``x_1..x_K'`` is kept to depth ``i`` with probability ``prod_{j <= i} min(m_j(x_j),
    q(x_j | x_{j-1}))`` (drafts beyond ``i`` summed out), then rejected into
    ``[q(. | x_i) - m_{i+1}]_+`` or, at ``i = K'``, followed by the bonus row."""
    horizon = q_trans.shape[0]
    gamma = min(lookahead, horizon - n + 1)
    out = defaultdict(float)
    for i in range(gamma + 1):
        for block in itertools.product(range(V), repeat=i):
            path = (a,) + block
            weight = np.prod([min(heads[j, n - 1, a, path[j + 1]],
                                  q_trans[n - 1 + j, path[j], path[j + 1]]) for j in range(i)])
            if i < gamma:
                rest = np.maximum(q_trans[n - 1 + i, path[-1]] - heads[i, n - 1, a], 0)
                last, rejected = rest, True
            elif n + gamma <= horizon:
                last, rejected = q_trans[n - 1 + gamma, path[-1]], False
            else:
                out[(i, None, False)] += weight
                continue
            for y in range(V):
                out[(i, y, rejected)] += weight * last[y]
    return out


def brute_counts(heads, target, lookahead):
    """``(E[rejections], E[calls])`` by a backward recursion over call starts ``(n, a)``."""
    init, q_trans = target

    @functools.lru_cache(maxsize=None)
    def rest(n, a):  # (rejections, calls) from a call starting at n after a
        if n > T:
            return 0.0, 0.0
        rej, calls = 0.0, 1.0
        for (i, y, rejected), pr in brute_call(heads, q_trans, n, a, lookahead).items():
            later = (0.0, 0.0) if y is None else rest(n + i + 1, y)
            rej += pr * (rejected + later[0])
            calls += pr * later[1]
        return rej, calls

    values = np.array([rest(1, a) for a in range(V)])
    return tuple(init @ values)


@pytest.mark.parametrize("name", ["K=2", "K=3", "heads K=2"])
def test_exact_values_match_a_brute_force(name, x64):
    decoder, heads, draft, target, _ = case(name)
    d, t = to_chain(draft), to_chain(target)
    lookahead = decoder.lookahead
    for n in range(1, T + 1):  # the call law itself, position by position
        k = min(lookahead, T - n + 1)
        with_bonus = n + k <= T
        law = decoder.call_law(d.trans[n - 1:n - 1 + k], t.trans[n - 1:n - 1 + k],
                               t.trans[n - 1 + k] if with_bonus else None,
                               with_bonus=with_bonus, position=n)
        for a in range(V):
            brute = brute_call(heads, target[1], n, a, lookahead)
            for (i, y, rejected), pr in brute.items():
                if y is None:
                    continue
                got = (law.rejected if rejected else law.bonus)[i, a, y]
                assert abs(float(got) - pr) < 1e-12, (n, a, i, y, rejected)
            kept = sum(pr * i for (i, _, _), pr in brute.items())
            assert abs(float(jnp.sum(law.kept[:, a])) - kept) < 1e-12
    rejections, calls = brute_counts(heads, target, lookahead)
    exact = specjax.exact(decoder, d, t)
    assert abs(float(exact.expected_calls) - calls) < 1e-10
    assert abs(float(exact.expected_rejections) - rejections) < 1e-10
    length = specjax.accepted_length(decoder, d, t, position=1)
    expected = [sum(pr * i for (i, _, _), pr in brute_call(heads, target[1], 1, a,
                                                            lookahead).items()) for a in range(V)]
    np.testing.assert_allclose(np.asarray(length), expected, atol=1e-12)


def test_marginal_heads_are_the_draft_marginals(x64):
    draft, _ = pair()
    np.testing.assert_allclose(np.asarray(marginal_heads(jnp.asarray(draft[1]), 3)),
                               literal_heads(draft[1], 3), atol=1e-14)


def test_k1_is_sd_and_given_marginals_are_the_default(x64):
    draft, target = pair()
    d, t = to_chain(draft), to_chain(target)
    parallel = specjax.exact(ParallelDraft(1), d, t)
    sd = specjax.exact(specjax.Speculative(lookahead=1), d, t)
    for field in ("expected_calls", "expected_rejections", "marginals", "acceptance_rate"):
        np.testing.assert_allclose(np.asarray(getattr(parallel, field)),
                                   np.asarray(getattr(sd, field)), atol=1e-12, err_msg=field)
    given = ParallelDraft(2, heads=marginal_heads(d.trans, 2))
    np.testing.assert_allclose(float(specjax.exact(given, d, t).expected_calls),
                               cached_counts("K=2")[1], atol=1e-12)


@functools.lru_cache(maxsize=None)
def cached_counts(name):
    return ref.expected_counts_from_law(cached_literal_law(name))


# ----------------------------------------------------------------------------- the sampler
@pytest.mark.parametrize("name", ["K=2", "heads K=2"])
def test_sampler_matches_the_literal_joint_law(name):
    """(tokens, rejected, calls) jointly, and the mean calls against the exact value."""
    decoder, _, draft, target, _ = case(name)
    trace = jax.tree_util.tree_map(np.asarray, specjax.decode(
        jax.random.key(35), decoder, to_chain(draft, np.float32), to_chain(target, np.float32),
        NUM_CHAINS))
    observed = defaultdict(int)
    for tokens, rejected, calls in zip(trace.tokens, trace.rejected, trace.num_calls):
        observed[(tuple(int(v) for v in tokens), tuple(bool(v) for v in rejected),
                  int(calls))] += 1
    law = cached_literal_law(name)
    stats.assert_law(dict(observed), law, NUM_CHAINS, f"parallel draft {name}, joint law")
    stats.assert_mean(trace.num_calls, cached_counts(name)[1], f"calls {name}")


# ----------------------------------------------------------------------------- edge cases
def test_finite_values_and_gradients_at_edge_cases(x64):
    """p = q, disjoint supports, one-hot rows and zeros: finite values and gradients, in the
    draft, the target and the heads."""
    draft, target = edge_pair(4, 4)
    d, t = to_chain(draft), to_chain(target)
    heads = marginal_heads(d.trans, 2)

    def calls(dd, tt, hh):
        return specjax.exact(ParallelDraft(2, heads=hh), dd, tt).expected_calls

    value, grads = jax.value_and_grad(calls, argnums=(0, 1, 2))(d, t, heads)
    assert np.isfinite(float(value))
    assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree_util.tree_leaves(grads))
    # p = q everywhere: the depth-1 draft is always kept, later depths are not in general.
    same = specjax.exact(ParallelDraft(2), t, t)
    sd_same = specjax.exact(specjax.Speculative(lookahead=2), t, t)
    assert float(sd_same.expected_rejections) < 1e-12
    assert float(same.expected_calls) >= float(sd_same.expected_calls) - 1e-12


def test_validation_errors():
    draft, target = pair()
    d, t = to_chain(draft, np.float32), to_chain(target, np.float32)
    with pytest.raises(ValueError, match="lookahead"):
        ParallelDraft(0)
    with pytest.raises(ValueError, match="rule"):
        ParallelDraft(2, rule=lambda p, q: q)
    bad = {
        "rule": ParallelDraft(2, rule=specjax.Speculative(lookahead=2)),
        "num_drafts": ParallelDraft(2, rule=specjax.BatchSpeculative(2)),
        r"heads must be None or an array \(K, T, V, V\)": ParallelDraft(
            2, heads=jnp.full((3, T, V, V), 1 / V)),
        "heads rows must sum to one": ParallelDraft(2, heads=jnp.full((2, T, V, V), 0.5)),
        r"heads must have shape \(K, T, V, V\) = \(2, 3, 3, 3\)": ParallelDraft(
            2, heads=jnp.full((2, T + 1, V, V), 1 / V)),
    }
    for match, decoder in bad.items():
        with pytest.raises(ValueError, match=match):
            specjax.exact(decoder, d, t)


# ----------------------------------------------------------------------------- the study script
@pytest.mark.slow
def test_study_script_on_the_small_problem(x64):
    """``scripts/study_parallel_draft.py``'s table on the tests' pair: at ``K = 1`` the three
    numbers agree (SD; the i.i.d. formula is exact there), the Monte Carlo calls fit."""
    from test_scripts import import_script
    study = import_script("study_parallel_draft")
    draft, target = pair()
    args = study.parse(["--max-k", "2", "--num-chains", "400"])
    rows = study.study(to_chain(draft), to_chain(target), args, jax.random.key(3))
    first = rows[0]
    assert abs(first["seq tpc"] - first["par tpc"]) < 1e-12
    assert abs(first["iid"] - first["seq tpc"]) < 1e-12
    assert abs(rows[1]["par calls"] - cached_counts("K=2")[1]) < 1e-10
    assert all(abs(r["z"]) < stats.Z for r in rows)
    assert len(study.format_rows(rows).splitlines()) == 3 + len(rows)
