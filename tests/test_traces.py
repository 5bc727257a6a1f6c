"""Engine traces (specjax.auditing.traces): exact per-call laws, Rao-Blackwellised and
counterfactual estimates against exact values by enumeration, the consistency check, the file.

The traces are drawn here as an engine would log them: per call a prompt token ``a`` (uniform),
drafts ``x_1..x_K`` from a non-stationary Markov draft (``x_j ~ P[j, x_{j-1}]``, ``x_0 = a``),
the target's rows ``Q[j, x_{j-1}]`` at the ``K + 1`` positions, and the accepted count of
specjax's own sampler (``specjax.verify_drafts``). On ``V = 3``, ``K = 3`` every rule's exact
mean accepted drafts is an enumeration of the ``V^(K + 1)`` prompts and drafts, with each rule's
acceptance probability written out by hand here (not read from specjax).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax.auditing.traces import EngineTrace
from specjax.auditing.traces import check_trace
from specjax.auditing.traces import counterfactuals
from specjax.auditing.traces import estimate_trace
from specjax.auditing.traces import format_estimates
from specjax.auditing.traces import trace_law
from specjax.decoders import StrictVerification

V, K, N = 3, 3, 3000
_rng = np.random.default_rng(20240947)
DRAFT = _rng.dirichlet(np.ones(V), (K, V))  # DRAFT[j, a]: the law of x_{j+1} after a
TARGET = _rng.dirichlet(np.ones(V), (K + 1, V))


def _entropy(q):
    return -(q * np.log(q + 1e-5)).sum(-1)


def _topk(q, x, k):
    return (q[x] > 0) & (q[x] >= np.sort(q)[::-1][k - 1])


# Each rule: the decoder, and its acceptance probability of draft x by hand, on rows p, q.
RULES = {
    "SD": (specjax.Speculative(), lambda p, q, x: min(1.0, q[x] / p[x])),
    "strict": (StrictVerification(), lambda p, q, x: q[x]),
    "lenient 0.6": (specjax.LenientSpeculative(0.6),
                    lambda p, q, x: min(1.0, q[x] / (0.6 * p[x]))),
    "biased 0.05": (specjax.BiasedSpeculative(0.05),
                    lambda p, q, x: min(1.0, (q[x] + 0.05) / p[x])),
    "top-1": (specjax.TopKAcceptance(1),
              lambda p, q, x: 1.0 if _topk(q, x, 1) else min(1.0, q[x] / p[x])),
    "threshold": (specjax.ThresholdVerification(0.6, 0.5),
                  lambda p, q, x: 1.0 if q[x] >= 0.6 else min(1.0, q[x] / 0.5)),
    "typical": (specjax.TypicalAcceptance(0.3, 0.3),
                lambda p, q, x: float(q[x] > min(0.3, 0.3 * math.exp(-_entropy(q))))),
}


def _rows(a, x):
    """``(p (K, V), q (K + 1, V))`` of a call after prompt ``a`` with drafts ``x``."""
    prev = np.concatenate([[a], x])
    return DRAFT[np.arange(K), prev[:K]], TARGET[np.arange(K + 1), prev]


def _law_by_hand(accept, a, x):
    """``P(n accepted)``, ``n = 0..K``: ``prod_{j < n} b_j (1 - b_n)``, ``b_K = 0``."""
    p, q = _rows(a, x)
    b = [accept(p[j], q[j], x[j]) for j in range(K)] + [0.0]
    reach = np.cumprod([1.0] + b[:K])
    return reach * (1 - np.array(b))


def _exact_mean(accept):
    """``E[accepted]`` over prompts (uniform) and drafts from the draft: every sequence."""
    total = 0.0
    for code in range(V ** (K + 1)):
        a, *x = np.unravel_index(code, (V,) * (K + 1))
        x = np.array(x)
        p, _ = _rows(a, x)
        weight = np.prod(p[np.arange(K), x]) / V
        total += weight * (_law_by_hand(accept, a, x) @ np.arange(K + 1))
    return total


def _draw_calls(seed, num_calls=N):
    """Prompts, drafts and rows of ``num_calls`` calls, drafts from the draft (float32 rows)."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, V, num_calls)
    x = np.zeros((num_calls, K), np.int64)
    prev = a
    for j in range(K):
        cdf = DRAFT[j, prev].cumsum(-1)
        x[:, j] = np.minimum((rng.random(num_calls)[:, None] >= cdf).sum(-1), V - 1)
        prev = x[:, j]
    rows = [_rows(ai, xi) for ai, xi in zip(a, x)]
    p = np.stack([r[0] for r in rows]).astype(np.float32)
    q = np.stack([r[1] for r in rows]).astype(np.float32)
    return a, x, p, q


def _engine(decoder, x, p, q, seed):
    """The accepted counts of specjax's own sampler of ``decoder`` on the calls."""
    out = specjax.verify_drafts(jax.random.key(seed), decoder, jnp.asarray(x, jnp.int32), p, q)
    return np.asarray(out.num_accepted)


@pytest.fixture(scope="module")
def calls():
    a, x, p, q = _draw_calls(0)
    accepted = _engine(specjax.Speculative(), x, p, q, 1)
    return a, x, p, q, EngineTrace(x, p, q, accepted)


def test_law_is_verify_drafts_law_and_by_hand(calls):
    a, x, p, q, trace = calls
    for name in ("SD", "strict", "top-1", "typical"):
        decoder, accept = RULES[name]
        law = trace_law(decoder, trace)
        assert law.shape == (N, K + 1) and law.dtype == np.float64
        reference = np.asarray(specjax.verify_drafts_law(decoder, x.astype(np.int32), p, q)
                               .num_accepted, np.float64)
        np.testing.assert_allclose(law, reference, atol=1e-6)
        for i in range(0, N, 97):
            np.testing.assert_allclose(law[i], _law_by_hand(accept, a[i], x[i]), atol=1e-5,
                                       err_msg=f"{name}, call {i}")


def test_estimates_match_exact_values(calls):
    _, _, _, _, trace = calls
    declared = estimate_trace(specjax.Speculative(), trace, name="SD")
    exact_sd = _exact_mean(RULES["SD"][1])
    # counting and Rao-Blackwellisation both estimate SD's exact mean
    for value, se in ((declared.mean_accepted, declared.mean_accepted_se),
                      (declared.counted_mean_accepted, declared.counted_mean_accepted_se)):
        assert abs(value - exact_sd) < 4.5 * se, (value, exact_sd, se)
    assert abs(declared.acceptance_rate - exact_sd / K) < 4.5 * declared.acceptance_rate_se
    # counterfactuals on the same drafts: every rule's exact mean (drafts from the draft)
    results = counterfactuals(trace, {name: rule for name, (rule, _) in RULES.items()})
    assert list(results) == list(RULES)
    for name, (_, accept) in RULES.items():
        e = results[name]
        exact = _exact_mean(accept)
        assert abs(e.mean_accepted - exact) < 4.5 * e.mean_accepted_se, (name, e, exact)
        assert abs(e.acceptance_rate - exact / K) < 4.5 * e.acceptance_rate_se, name
        assert math.isnan(e.counted_mean_accepted) and math.isnan(e.variance_ratio)
    # the rules differ by much more than the errors: the test can tell them apart
    means = sorted(_exact_mean(accept) for _, accept in RULES.values())
    assert np.diff(means).max() > 20 * declared.mean_accepted_se
    table = format_estimates([declared, *results.values()])
    assert table.count("\n") == len(RULES) + 2 and "| SD |" in table


def test_rao_blackwell_has_smaller_error(calls):
    _, _, _, _, trace = calls
    e = estimate_trace(specjax.Speculative(), trace)
    assert e.mean_accepted_se < e.counted_mean_accepted_se
    assert e.acceptance_rate_se < e.counted_acceptance_rate_se
    # Var(A) = Var(c) + E[Var(A | drafts)]: the measured ratio against the law's own
    law = e.law
    values = np.arange(K + 1)
    within = float((law @ values ** 2 - (law @ values) ** 2).mean())
    between = float(np.var(law @ values))
    expected_ratio = (between + within) / between
    print(f"variance ratio (counting / Rao-Blackwellised): measured {e.variance_ratio:.2f}, "
          f"from the laws {expected_ratio:.2f}")
    assert e.variance_ratio > 1.5
    assert abs(e.variance_ratio / expected_ratio - 1) < 0.25


def test_weights(calls):
    _, x, p, q, trace = calls
    w = np.where(np.arange(N) % 2 == 0, 2.0, 0.0)
    weighted = estimate_trace(specjax.Speculative(), trace._replace(weights=w))
    even = estimate_trace(specjax.Speculative(),
                          EngineTrace(x[::2], p[::2], q[::2], trace.accepted[::2]))
    assert weighted.mean_accepted == pytest.approx(even.mean_accepted, rel=1e-12)
    assert weighted.mean_accepted_se == pytest.approx(even.mean_accepted_se, rel=1e-9)


ALPHA = 1e-3  # the check's false-alarm rate


def test_check_flags_a_wrong_rule(calls):
    _, x, p, q, trace = calls
    assert not check_trace(specjax.Speculative(), trace, alpha=ALPHA).flagged
    squared = specjax.RejectionRule(  # finite at p = 0 (the probe refuses NaN there)
        lambda p, q: jnp.minimum(1.0, q / jnp.where(p > 0, p, 1.0)) ** 2,
        lambda p, q, b: jnp.maximum(q - b * p, 0))
    wrong = trace._replace(accepted=_engine(squared, x, p, q, 2))
    result = check_trace(specjax.Speculative(), wrong, alpha=ALPHA)
    assert result.flagged and result.tested and result.impossible == 0
    assert "FLAGGED" in str(result)
    # declared as what it is, the same trace passes
    assert not check_trace(squared, wrong, alpha=ALPHA).flagged
    # a lenient engine declared as SD is caught too
    lenient = trace._replace(accepted=_engine(specjax.LenientSpeculative(0.6), x, p, q, 3))
    assert check_trace(specjax.Speculative(), lenient, alpha=ALPHA).flagged


def test_check_false_alarms_and_impossible(calls):
    _, _, _, _, trace = calls
    law = trace_law(specjax.Speculative(), trace)[:500]
    small = EngineTrace(*(f[:500] for f in trace[:4]))
    rng = np.random.default_rng(5)
    flagged = 0
    for _ in range(100):  # counts drawn from the exact laws: alarms at rate <= 0.05
        counts = (rng.random((500, 1)) >= law.cumsum(1)).sum(1)
        flagged += check_trace(specjax.Speculative(), small._replace(accepted=counts),
                               alpha=0.05).flagged
    assert flagged <= 15
    # a count of probability zero: drafts of target mass 0 accepted
    q = np.array([[[0.0, 1.0], [1.0, 0.0]]] * 2)
    p = np.array([[[0.5, 0.5]]] * 2)
    bad = EngineTrace(np.array([[0], [1]]), p, q, np.array([1, 1]))
    result = check_trace(specjax.Speculative(), bad)
    assert result.flagged and result.impossible == 1 and result.impossible_calls == [0]
    # too few calls to test anything (but nothing impossible): not tested, not ok
    one = EngineTrace(np.array([[0]]), p[:1], np.array([[[0.4, 0.6], [1.0, 0.0]]]),
                      np.array([0]))
    result = check_trace(specjax.Speculative(), one)
    assert not result.flagged and not result.tested and "NOT TESTED" in str(result)


def _tree_calls(seed, tree, num_calls):
    """Token trees drawn as the tree's "iid" children rule drafts them, Markov rows by depth."""
    rng = np.random.default_rng(seed)
    parents = np.array(tree.shape.parents)
    depth = np.array(tree.shape.depth)
    size = parents.size
    tokens = np.zeros((num_calls, size), np.int64)
    tokens[:, 0] = rng.integers(0, V, num_calls)
    p = np.zeros((num_calls, size, V))
    q = np.zeros((num_calls, size, V))
    for i in range(size):
        if i:
            cdf = p[np.arange(num_calls), parents[i]].cumsum(-1)
            tokens[:, i] = np.minimum((rng.random(num_calls)[:, None] >= cdf).sum(-1), V - 1)
        p[:, i] = DRAFT[min(depth[i], K - 1), tokens[:, i]]
        q[:, i] = TARGET[depth[i], tokens[:, i]]
    return tokens, p.astype(np.float32), q.astype(np.float32)


def test_tree_traces():
    tree = specjax.TokenTree((2, 1))
    tokens, p, q = _tree_calls(7, tree, 2000)
    accepted = np.asarray(specjax.verify_tree(jax.random.key(8), tree, tokens.astype(np.int32),
                                              p, q).num_accepted)
    trace = EngineTrace(tokens, p, q, accepted, parents=np.array(tree.shape.parents))
    assert trace.is_tree and trace.lookahead == 2
    law = trace_law(tree, trace)
    reference = specjax.verify_tree_law(tree, tokens.astype(np.int32), p, q).num_accepted
    np.testing.assert_allclose(law, np.asarray(reference), atol=1e-6)
    e = estimate_trace(tree, trace)
    assert abs(e.mean_accepted - e.counted_mean_accepted) < 4.5 * e.counted_mean_accepted_se
    assert e.mean_accepted_se < e.counted_mean_accepted_se
    assert not check_trace(tree, trace, alpha=ALPHA).flagged
    # counterfactual: top-k verification of the same tree
    top = counterfactuals(trace, {"top_k": specjax.TokenTree((2, 1), children="top_k")})
    assert 0 <= top["top_k"].mean_accepted <= 2
    with pytest.raises(ValueError, match="tree"):
        trace_law(specjax.TokenTree((3,)), trace)
    with pytest.raises(ValueError, match="accepted"):
        EngineTrace(tokens, p, q, np.full(2000, 3), parents=trace.parents).checked()


def test_bad_inputs_name_the_argument(calls):
    _, x, p, q, trace = calls
    good = EngineTrace(x[:4], p[:4], q[:4], trace.accepted[:4])
    cases = {
        "accepted": good._replace(accepted=np.array([0, 1, 2, 4])),
        "accepted ": good._replace(accepted=np.array([0.0, 1.0, 2.0, 3.0])),
        "draft_probs": good._replace(draft_probs=p[:4] * 2),
        "target_probs": good._replace(target_probs=q[:4, :K]),
        "draft_tokens": good._replace(draft_tokens=np.full((4, K), V)),
        "weights": good._replace(weights=np.array([1.0, -1.0, 1.0, 1.0])),
        "num_drafts": good._replace(num_drafts=np.array([0, 1, 2, 4])),
        "parents": good._replace(parents=np.array([-1, 0, 2])),
    }
    for name, bad in cases.items():
        with pytest.raises(ValueError, match=name.strip()):
            bad.checked()
        with pytest.raises(ValueError, match=name.strip()):
            estimate_trace(specjax.Speculative(), bad)
    # ragged calls: accepted up to each call's own K_b
    ragged = good._replace(num_drafts=np.array([0, 1, 3, 3]), accepted=np.array([0, 1, 3, 2]))
    assert ragged.checked().drafted().tolist() == [0, 1, 3, 3]
    with pytest.raises(ValueError, match="accepted"):
        ragged._replace(accepted=np.array([1, 1, 3, 2])).checked()
    with pytest.raises(ValueError, match="alpha"):
        check_trace(specjax.Speculative(), good, alpha=1.5)
    with pytest.raises(ValueError, match="min_variance"):
        check_trace(specjax.Speculative(), good, min_variance=0)
    with pytest.raises(ValueError, match="decoders"):
        counterfactuals(good, {})
    with pytest.raises(ValueError, match="decoder"):
        trace_law(specjax.OptimalMultiDraft(2), good)


def test_file_round_trip(calls, tmp_path):
    _, x, p, q, trace = calls
    ragged = EngineTrace(x[:10], p[:10], q[:10], np.minimum(trace.accepted[:10], 2),
                         num_drafts=np.full(10, 2), weights=np.linspace(0.5, 1.5, 10))
    greedy = EngineTrace(x[:10], None, q[:10], np.zeros(10, np.int64))
    tree = specjax.TokenTree((2,))
    tokens, tp, tq = _tree_calls(3, tree, 5)
    treed = EngineTrace(tokens, tp, tq, np.ones(5, np.int64), parents=np.array([-1, 0, 0]))
    for i, original in enumerate((ragged, greedy, treed)):
        path = tmp_path / f"trace{i}.npz"
        original.save(path)
        loaded = EngineTrace.load(path)
        for name, value in original._asdict().items():
            if value is None:
                assert getattr(loaded, name) is None, name
            else:
                np.testing.assert_array_equal(getattr(loaded, name), value, err_msg=name)
        assert estimate_trace(tree if original.is_tree else specjax.Speculative(),
                              loaded).num_calls == original.num_calls
    # what is read is checked, the path named
    path = tmp_path / "bad.npz"
    np.savez(path, draft_tokens=x[:3], draft_probs=p[:3], target_probs=q[:3],
             accepted=np.array([0, 1, 9]))
    with pytest.raises(ValueError, match=r"bad\.npz.*accepted"):
        EngineTrace.load(path)
    np.savez(path, draft_tokens=x[:3], target_probs=q[:3], accepted=np.zeros(3, int), extra=1)
    with pytest.raises(ValueError, match=r"bad\.npz.*extra"):
        EngineTrace.load(path)
    np.savez(path, draft_tokens=x[:3], target_probs=q[:3])
    with pytest.raises(ValueError, match=r"bad\.npz.*accepted"):
        EngineTrace.load(path)
    np.savez(path, draft_tokens=x[:3], draft_probs=p[:3] + 0.1, target_probs=q[:3],
             accepted=np.zeros(3, int))
    with pytest.raises(ValueError, match=r"bad\.npz.*draft_probs"):
        EngineTrace.load(path)
    (tmp_path / "text.npz").write_text("not a zip")
    with pytest.raises(ValueError, match=r"text\.npz"):
        EngineTrace.load(tmp_path / "text.npz")
    with pytest.raises(ValueError, match="accepted"):  # nothing written for an invalid trace
        ragged._replace(accepted=np.full(10, 5)).save(tmp_path / "never.npz")
    assert not (tmp_path / "never.npz").exists()


def test_intervals_cover_over_200_traces():
    """200 independent traces of 150 calls: the 95% intervals of the Rao-Blackwellised mean
    accepted drafts (SD, the declared rule) and of three counterfactual rules on the same drafts
    hold the enumerated exact means at a rate within three standard errors of 95%."""
    num, size = 200, 150
    a, x, p, q = _draw_calls(7, num * size)
    accepted = _engine(specjax.Speculative(), x, p, q, 8)
    names = ("SD", "strict", "top-1", "typical")
    exact = {name: _exact_mean(RULES[name][1]) for name in names}
    covered = dict.fromkeys(names, 0)
    for i in range(num):
        part = slice(i * size, (i + 1) * size)
        trace = EngineTrace(x[part], p[part], q[part], accepted[part])
        results = counterfactuals(trace, {name: RULES[name][0] for name in names[1:]})
        results["SD"] = estimate_trace(specjax.Speculative(), trace)
        for name, e in results.items():
            covered[name] += abs(e.mean_accepted - exact[name]) <= 1.959964 * e.mean_accepted_se
    band = 3 * np.sqrt(num * 0.95 * 0.05)
    assert all(abs(c - 0.95 * num) <= band for c in covered.values()), covered
