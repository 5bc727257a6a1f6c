"""End to end: scripts/hf_pair.py's quick run (a transformers GPT-2 draft/target pair, randomly
initialised) in this process; its dump, estimates and HF's assisted generation checked against
independent computations. Needs torch and transformers (the test and hf extras)."""

import contextlib
import importlib
import importlib.util
import io
import math
import pathlib
import re
import sys

import numpy as np
import pytest

# find_spec, not importorskip: collection (in every xdist worker) does not import torch.
if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
    pytest.skip("needs torch and transformers (pip install -e '.[hf]')", allow_module_level=True)

import specjax  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        hf_pair = importlib.import_module("hf_pair")
    finally:
        sys.path.pop(0)
    folder = tmp_path_factory.mktemp("hf")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        result = hf_pair.main(["--quick", "--out", str(folder), "--figure",
                               str(folder / "speedup.png")])
    result["printed"] = printed.getvalue()
    result["folder"] = folder
    return result


def numpy_filter(draft_prob, target_prob, lengths, lookahead):
    """SD's ``E[rejections | x]`` and ``E[calls | x]`` per sequence, in plain NumPy: the phase
    of the call (drafts accepted so far, ``K`` the bonus) carried along each sequence's emitted
    tokens, a token at a drafted phase coming from a rejection with probability
    ``[q - p]_+ / q``; a rejection or the bonus opens the next call."""
    batch, horizon = target_prob.shape
    rate = np.maximum(target_prob - draft_prob, 0) / target_prob
    rejections, calls = np.zeros(batch), np.zeros(batch)
    for b in range(batch):
        phase = np.zeros(lookahead + 1)
        phase[0] = 1.0
        for t in range(lengths[b]):
            calls[b] += phase[0]
            rejected = phase[:lookahead] * rate[b, t]
            rejections[b] += rejected.sum()
            nxt = np.zeros_like(phase)
            nxt[0] = rejected.sum() + phase[lookahead]
            nxt[1:] = phase[:lookahead] - rejected
            phase = nxt
    return rejections, calls


def test_dump_has_specjax_layout(run):
    s = run["settings"]
    arrays = dict(np.load(run["folder"] / "hf_pair.npz"))
    assert sorted(arrays) == ["draft_prob", "lengths", "target_prob", "tokens"]
    assert arrays["tokens"].shape == (s.rollouts, s.horizon + 1)
    assert arrays["draft_prob"].shape == arrays["target_prob"].shape == (s.rollouts, s.horizon)
    lengths = arrays["lengths"]
    assert ((lengths >= 1) & (lengths <= s.horizon)).all() and (lengths < s.horizon).any()
    eos = s.vocab - 1
    for tokens, length in zip(arrays["tokens"], lengths):  # x_length is the first EOS, or T
        assert eos not in tokens[1:length] and (length == s.horizon or tokens[length] == eos)
    # scores (processed) = logits (raw) at top_k=0, temperature=1; generate's scores = a
    # teacher-forced forward pass; the .npz statistics = the log-prob rows.
    dump = run["dump"]
    assert dump["processed_vs_raw"] == 0
    assert dump["generate_vs_forward"] < 1e-4
    for a, b in zip(run["rows"], run["from_rows"]):
        for name in ("expected_rejections", "expected_calls", "expected_time"):
            assert a[name][0] == pytest.approx(b[name][0], rel=1e-5)


def test_estimates_match_a_numpy_filter(run):
    """specjax.estimate on the loaded .npz equals a direct NumPy computation of SD's expected
    rejections and calls given the recorded tokens, at every K (ragged sequences included)."""
    arrays = dict(np.load(run["folder"] / "hf_pair.npz"))
    p, q = arrays["draft_prob"].astype(np.float64), arrays["target_prob"].astype(np.float64)
    for row in run["rows"]:
        rejections, calls = numpy_filter(p, q, arrays["lengths"], row["k"])
        assert row["expected_rejections"][0] == pytest.approx(rejections.mean(), rel=1e-4)
        assert row["expected_calls"][0] == pytest.approx(calls.mean(), rel=1e-4)
        se = calls.std(ddof=1) / math.sqrt(len(calls))
        assert row["expected_calls"][1] == pytest.approx(se, rel=1e-3)
    # call_structure on the sequences that ran to the horizon (it reads no lengths)
    full = arrays["lengths"] == run["settings"].horizon
    rate = specjax.pairs.rejection_rate(p[full], q[full])
    structure = specjax.pairs.call_structure(rate, 2)
    rejections, calls = numpy_filter(p[full], q[full], arrays["lengths"][full], 2)
    np.testing.assert_allclose(np.asarray(structure.rejections), rejections, rtol=1e-4)
    np.testing.assert_allclose(np.asarray(structure.calls), calls, rtol=1e-4)


def test_table_and_best_lookahead(run):
    s, choice = run["settings"], run["choice"]
    assert [r["k"] for r in run["rows"]] == list(range(1, s.max_lookahead + 1))
    for r in run["rows"]:
        for name in ("expected_calls", "expected_time", "speedup"):
            value, se = r[name]
            assert math.isfinite(value) and 0 < se < 0.5 * value, (name, r)
        # best_lookahead's times are estimate's, K by K
        assert choice.times[r["k"]] == pytest.approx(r["expected_time"][0], rel=1e-5)
    assert choice.lookahead == int(np.argmin(choice.times)) and choice.runner_up >= 0
    lines = [line for line in run["printed"].splitlines() if re.match(r"\| \d+ \|", line)]
    assert len(lines) == s.max_lookahead
    assert (run["folder"] / "speedup.png").stat().st_size > 1000


def test_assisted_generation_has_the_target_law(run):
    """HF's assisted generation with sampling passes the sequence-level fit to the target's
    exact law; the test has power (the draft's own law and HF's lossy ensemble verification are
    flagged); its mean number of target calls agrees with SD's exact expected calls."""
    fit = run["fit"]
    assert fit["assisted"].tested and not fit["assisted"].flagged, fit["assisted"]
    assert fit["assisted"].impossible == 0
    assert not fit["target"].flagged, fit["target"]
    assert fit["draft"].flagged, fit["draft"]
    if fit["lossy"] is not None:
        assert fit["lossy"].flagged, fit["lossy"]
    mean, se = fit["calls"]
    assert abs(mean - fit["exact_calls"]) < 4 * se, fit
