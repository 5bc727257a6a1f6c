"""Smoke test of scripts/token_tree_study.py on a tiny setting, and the n-gram lift it uses."""

import numpy as np
import pytest
from test_scripts import import_script

import specjax
from specjax.models.autoregressive import NGramModel


@pytest.mark.slow  # a script end to end, as tests/test_scripts.py
def test_token_tree_study_tiny(tmp_path):
    study = import_script("token_tree_study")
    out = tmp_path / "trees.png"
    results = study.main(["--budgets", "1,2,4", "--sim-budgets", "2", "--num-chains", "200",
                          "--dynamic-chains", "50", "--skip-ngram", "--out", str(out)])
    assert out.stat().st_size > 0
    (res,) = results
    rows = {r["budget"]: r for r in res["rows"]}
    assert all(rows[1][s] == 1.0 for s in study.SCHEMES)
    for budget in (2, 4):
        r = rows[budget]
        assert abs(r["chain"] - r["sd"]) < 1e-9  # the chain is SD with lookahead P - 1
        assert r["best"] >= r["Sequoia"] - 1e-9  # the search sees Sequoia's pick
        assert r["speed of light"] >= r["EAGLE-2"] - 1e-9  # best deterministic tree
    # One drafted token: every tree is the same single child, its value 1 + E[acceptance].
    assert abs(rows[2]["chain"] - rows[2]["star wor"]) < 1e-9
    assert abs(rows[2]["Sequoia"] - rows[2]["sequoia_dp"]) < 1e-9
    for s in res["sims"]:
        assert abs(s["mean"] - s["exact"]) < 5 * s["se"] + 1e-9, s


def test_cut_children_keeps_ranks():
    study = import_script("token_tree_study")
    # root with 4 children, the second one with 3 children; cut to 2 children per node
    parents = (-1, 0, 0, 0, 0, 2, 2, 2)
    assert study.cut_children(parents, 2) == (-1, 0, 0, 2, 2)


def test_lifted_ngram_chain_matches_finite_state_models(x64):
    """Trees over the lifted chain are trees over the n-grams: SD's expected calls on the lifted
    MarkovChain equal specjax.exact on the n-grams' finite-state models."""
    study = import_script("token_tree_study")
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, 3, size=200)]
    draft = NGramModel.fit(seqs, order=2, num_states=3, smoothing=0.5, backoff=2.0)
    target = NGramModel.fit(seqs, order=3, num_states=3, smoothing=0.5, backoff=2.0)
    draft_fs, target_fs = draft.as_finite_state(2), target.as_finite_state(2)
    horizon = 6
    draft_chain = study.lift(draft_fs, horizon)
    target_chain = study.lift(target_fs, horizon)
    # each lifted state (a, b) = 3 a + b determines its token b, and follows only (b, y)
    trans = np.asarray(target_chain.trans[0])
    states = np.arange(9)
    follows = (states[None, :] // 3) == (states[:, None] % 3)  # (a, b) -> (b, y)
    assert np.all(trans[~follows] == 0)
    np.testing.assert_allclose(trans[follows].reshape(9, 3), np.asarray(target.table),
                               rtol=1e-12)
    for k in (1, 3):
        lifted = specjax.exact(specjax.Speculative(lookahead=k), draft_chain, target_chain)
        direct = specjax.exact(specjax.Speculative(lookahead=k), draft_fs, target_fs,
                               horizon=horizon)
        np.testing.assert_allclose(float(lifted.expected_calls), float(direct.expected_calls),
                                   rtol=1e-10)
        tree = specjax.exact(specjax.TokenTree((1,) * k), draft_chain, target_chain)
        np.testing.assert_allclose(float(tree.expected_calls), float(direct.expected_calls),
                                   rtol=1e-10)
