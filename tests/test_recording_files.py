"""No silent number, no lost file (issue 52): recordings, their files, profiles and serving sizes.

Each test reproduces one fault of the issue and failed before its fix:

* a dump misaligned by one position (a recorded token of target probability 0) is refused;
* stored rates outside ``[0, 1]`` or NaN, ``.npy``, empty, truncated and missing files are
  refused with the file's name;
* ``save(p)`` then ``load(p)`` round-trips for every spelling of ``p``; a folder is refused;
* a save that fails midway (a file-size limit, an injected failure) leaves the previous file
  whole and no temporary file;
* a ``RejectionRule``'s rates saved by one process are read by another;
* weights whose float32 sum overflows or underflows estimate as unit weights do; empty
  recordings, token ids past int32 and flags given as strings are refused;
* an increasing acceptance profile, ``profile_tree(max_budget=10**6)`` and
  ``serving_rate(batch_size=10**6)`` are refused before any work.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap
import time

import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax.pairs import Recording
from specjax.pairs import recording_files

V, T, B = 3, 4, 6


def _dump(seed=0, zeros=True):
    """A small dump of target rollouts: tokens ``(B, T + 1)`` drawn from the target's rows, which
    have zeros (so that a misaligned dump meets a token of probability 0)."""
    rng = np.random.default_rng(seed)
    q = rng.dirichlet(np.ones(V), size=(B, T))
    p = rng.dirichlet(np.ones(V), size=(B, T))
    if zeros:
        q[..., 0] = 0.0
        q /= q.sum(-1, keepdims=True)
    tokens = np.zeros((B, T + 1), np.int64)
    for t in range(T):
        tokens[:, t + 1] = [rng.choice(V, p=q[b, t]) for b in range(B)]
    return tokens, p, q


def _recording():
    tokens, p, q = _dump()
    return Recording.from_arrays(tokens, p, q)


# ------------------------------------------------------------------------ silent numbers
def test_a_dump_misaligned_by_one_position_is_refused():
    tokens, p, q = _dump()
    # The likeliest engine mistake: the row at index t scored against x_t instead of x_(t+1).
    shifted = np.concatenate([tokens[:, :1], np.roll(tokens[:, 1:], -1, axis=1)], axis=1)
    shifted[:, -1] = 0  # token 0 has target probability 0 everywhere
    with pytest.raises(ValueError, match="target_probs: .* probability 0.*misaligned"):
        Recording.from_arrays(shifted, p, q)
    q_x = np.take_along_axis(q, shifted[:, 1:, None], -1)[..., 0]
    p_x = np.take_along_axis(p, shifted[:, 1:, None], -1)[..., 0]
    with pytest.raises(ValueError, match="target_prob: .* position t = 4"):
        Recording.from_statistics(shifted, p_x, q_x)
    # A sequence of weight 0 (an enumeration weighted by the target's probability) may hold one.
    weights = np.ones(B)
    weights[:] = 0.0
    weights[0] = 1.0
    shifted[0] = tokens[0]
    rec = Recording.from_arrays(shifted, p, q, weights=weights)
    assert rec.num_sequences == B


def test_stored_rates_outside_zero_one_or_nan_are_refused(tmp_path):
    rec = _recording()
    bsd = specjax.BatchSpeculative(2, lookahead=2)
    label = recording_files.rate_label(specjax.BatchSpeculative(2))
    for name, value in (("negative", -1.0), ("above_one", 1.5), ("nan", np.nan)):
        rates = np.full((B, T), value)
        path = tmp_path / f"{name}.npz"
        np.savez(path, tokens=np.asarray(rec.tokens), draft_prob=np.asarray(rec.draft_prob),
                 target_prob=np.asarray(rec.target_prob),
                 **{f"root_rejection/{label}": rates, f"rejection/{label}": rates})
        with pytest.raises(ValueError, match=rf"path: .*{name}\.npz.*rates in \[0, 1\]"):
            Recording.load(path, decoders=(bsd,))
    path = tmp_path / "shape.npz"
    np.savez(path, tokens=np.asarray(rec.tokens), draft_prob=np.asarray(rec.draft_prob),
             target_prob=np.asarray(rec.target_prob),
             **{f"root_rejection/{label}": np.zeros((B, T + 1)),
                f"rejection/{label}": np.zeros((B, T + 1))})
    with pytest.raises(ValueError, match=r"shape\.npz.*shape \(B, T\)"):
        Recording.load(path, decoders=(bsd,))


def test_weights_whose_float32_sum_overflows_or_underflows_estimate_as_unit_weights():
    tokens, p, q = _dump(zeros=False)
    sd = specjax.Speculative(lookahead=2)
    plain = specjax.estimate(sd, Recording.from_arrays(tokens, p, q))
    for scale in (1e37, 1e-44):
        weights = np.full((B,), scale, np.float32)
        got = specjax.estimate(sd, Recording.from_arrays(tokens, p, q, weights=weights))
        assert np.isfinite(float(got.expected_calls))
        assert float(got.expected_calls) == pytest.approx(float(plain.expected_calls), rel=1e-5)


def test_empty_recordings_ids_past_int32_and_string_flags_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"no sequences \(B = 0\)"):
        Recording.from_statistics(np.zeros((0, 3), np.int32), np.zeros((0, 2)),
                                  np.zeros((0, 2)))
    with pytest.raises(ValueError, match=r"no positions \(T = 0\)"):
        Recording.from_arrays(np.zeros((2, 1), np.int32), np.zeros((2, 0, 3)),
                              np.zeros((2, 0, 3)))
    with pytest.raises(ValueError, match="tokens must be int32 ids"):
        Recording.from_statistics(np.full((1, 3), 2**32, np.int64), np.full((1, 2), 0.5),
                                  np.full((1, 2), 0.5))
    tokens, p, q = _dump()
    for flag in ("logits", "keep_rows"):
        with pytest.raises(ValueError, match=f"{flag} must be True or False, got 'no'"):
            Recording.from_arrays(tokens, p, q, **{flag: "no"})
    path = _recording().save(tmp_path / "r.npz")
    with pytest.raises(ValueError, match="keep_rows must be True or False"):
        Recording.load(path, keep_rows="no")


# ------------------------------------------------------------------------ files
@pytest.mark.parametrize("spelling", ["rec", "rec.npz", "sub/rec", "sub/rec.npz", "abs-path",
                                      "abs-path.npz"])
def test_save_then_load_round_trips_for_every_spelling(tmp_path, monkeypatch, spelling):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    path = tmp_path / ("rec" + spelling[8:]) if spelling.startswith("abs-path") else spelling
    rec = _recording()
    written = rec.save(path)
    assert os.path.isfile(written) and written.endswith(".npz")
    back = Recording.load(path)
    for field in ("tokens", "draft_prob", "target_prob"):
        np.testing.assert_array_equal(getattr(back, field), getattr(rec, field))
    folder = os.path.dirname(os.path.abspath(written))
    assert [f for f in os.listdir(folder) if f != "sub"] == [os.path.basename(written)]


def test_a_folder_is_not_a_file_name(tmp_path):
    rec = _recording()
    (tmp_path / "adir").mkdir()
    for path in (tmp_path / "adir", str(tmp_path / "adir") + os.sep,
                 str(tmp_path / "new") + os.sep):
        with pytest.raises(ValueError, match="path: .* is a folder"):
            rec.save(path)
    (tmp_path / "x.npz").mkdir()
    with pytest.raises(ValueError, match="path: .*x.npz.* is a folder"):
        rec.save(tmp_path / "x")
    with pytest.raises(ValueError, match="path: the folder .* does not exist"):
        rec.save(tmp_path / "missing" / "rec.npz")
    with pytest.raises(ValueError, match="path must be a file name"):
        rec.save(3)
    assert sorted(os.listdir(tmp_path)) == ["adir", "x.npz"]


def test_unreadable_files_are_refused_naming_the_file(tmp_path):
    np.save(tmp_path / "one.npy", np.zeros(3))
    (tmp_path / "empty.npz").write_bytes(b"")
    good = _recording().save(tmp_path / "good.npz")
    data = pathlib.Path(good).read_bytes()
    (tmp_path / "cut.npz").write_bytes(data[: len(data) // 2])
    for name, match in (("one.npy", "a single NumPy array"), ("empty.npz", "not a readable"),
                        ("cut.npz", "(not a readable|damaged)"), ("none.npz", "no file")):
        with pytest.raises(ValueError, match=f"path: .*{match}") as info:
            Recording.load(tmp_path / name)
        assert "path" in str(info.value)


def test_a_failed_save_leaves_the_previous_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "rec.npz"
    rec = _recording()
    rec.save(path)
    before = path.read_bytes()

    def broken(file, **arrays):
        file.write(b"PK\x03\x04 half an archive")
        raise OSError(27, "File too large")

    monkeypatch.setattr(recording_files.np, "savez", broken)
    with pytest.raises(OSError, match="File too large"):
        rec.save(path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["rec.npz"]
    Recording.load(path)


SIZE_LIMITED_SAVE = """
import resource, signal, sys
import numpy as np
from specjax.pairs import Recording
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
path, limit = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(0)
big = Recording.from_statistics(np.zeros((4000, 65), np.int32), rng.uniform(0.5, 1, (4000, 64)),
                                rng.uniform(0.5, 1, (4000, 64)))
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
try:
    big.save(path)
except OSError as error:
    print("failed:", error)
"""


def test_a_save_past_a_file_size_limit_leaves_the_previous_file_whole(tmp_path):
    path = tmp_path / "rec.npz"
    _recording().save(path)
    before = path.read_bytes()
    out = subprocess.run([sys.executable, "-c", SIZE_LIMITED_SAVE, str(path),
                          str(len(before) + 10_000)],
                         capture_output=True, text=True, timeout=120)
    assert "File too large" in out.stdout, out.stdout + out.stderr
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["rec.npz"]


RULE_MODULE = """
import jax.numpy as jnp
import specjax


def accept(p, q):
    return jnp.minimum(1, q / jnp.where(p > 0, p, 1))


def residual(p, q, b):
    return jnp.maximum(q - b * p, 0)


RULE = specjax.RejectionRule(accept, residual, lookahead=2)
"""

SAVE_RULE = """
import sys
import numpy as np
import user_rules
from specjax.pairs import Recording
tokens, p, q = (np.load(sys.argv[1])[k] for k in ("tokens", "p", "q"))
Recording.from_arrays(tokens, p, q, decoders=(user_rules.RULE,)).save(sys.argv[2])
"""


def test_a_rejection_rules_rates_are_read_by_another_process(tmp_path, monkeypatch):
    (tmp_path / "user_rules.py").write_text(textwrap.dedent(RULE_MODULE))
    tokens, p, q = _dump()
    np.savez(tmp_path / "dump.npz", tokens=tokens, p=p, q=q)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path)] + sys.path))
    subprocess.run([sys.executable, "-c", SAVE_RULE, str(tmp_path / "dump.npz"),
                    str(tmp_path / "rated")], check=True, env=env, timeout=120)
    monkeypatch.syspath_prepend(str(tmp_path))
    import user_rules  # noqa: PLC0415

    label = recording_files.rate_label(user_rules.RULE)
    assert "0x" not in label and "user_rules.accept" in label
    back = Recording.load(tmp_path / "rated", decoders=(user_rules.RULE,))
    here = Recording.from_arrays(tokens, p, q, decoders=(user_rules.RULE,))
    np.testing.assert_allclose(back.rates[0].rejection, here.rates[0].rejection)
    assert float(specjax.estimate(user_rules.RULE, back).expected_calls) == pytest.approx(
        float(specjax.estimate(user_rules.RULE, here).expected_calls))


def test_two_rules_of_one_label_are_refused_on_save(tmp_path):
    tokens, p, q = _dump()
    rules = tuple(specjax.RejectionRule(lambda p, q, c=c: jnp.minimum(1, q / jnp.where(
        p > 0, p, 1)) * c, lambda p, q, b: jnp.maximum(q - b * p, 0)) for c in (1.0, 1.0))
    rec = Recording.from_arrays(tokens, p, q, decoders=rules)
    with pytest.raises(ValueError, match="under one label"):
        rec.save(tmp_path / "r.npz")
    assert not os.listdir(tmp_path)


# ------------------------------------------------------------------------ sizes and profiles
def test_an_increasing_profile_is_refused():
    cost = specjax.CostModel(0.1, 1.0)
    with pytest.raises(ValueError, match="profile must not increase"):
        specjax.pairs.profile_lookahead([0.1, 0.9, 0.9], cost)
    with pytest.raises(ValueError, match="profile must not increase"):
        specjax.pairs.profile_accepted_length([0.5, 0.6])
    assert specjax.pairs.profile_lookahead([0.9, 0.9, 0.5], cost).lookahead >= 0


def test_sizes_are_checked_before_the_work(monkeypatch):
    from specjax import _memory  # noqa: PLC0415

    monkeypatch.setattr(_memory, "available_bytes", lambda device=None: 2 * 10**9)
    start = time.perf_counter()
    with pytest.raises(ValueError, match="max_budget = 1,000,000 needs about"):
        specjax.pairs.profile_tree([0.6, 0.2], specjax.CostModel(0.05, 1.0),
                                   max_budget=10**6, max_depth=4)
    with pytest.raises(ValueError, match="budget = 100,000 needs about"):
        specjax.theory.sequoia_tree([0.6, 0.2], budget=100_000, max_depth=4)
    d, t = specjax.paper_instance(4, 8)
    cost = specjax.ServingCost(0.05, lambda n: 1.0 + 0.01 * n)
    with pytest.raises(ValueError, match=r"batch_size = 1,000,000 .* use a smaller batch_size"):
        specjax.serving_rate(specjax.Speculative(lookahead=2), d, t, cost, batch_size=10**6)
    assert time.perf_counter() - start < 30


def test_from_arrays_given_small_rows_serves_every_token_wise_decoder_without_a_flag():
    tokens, p, q = _dump()
    bsd = specjax.BatchSpeculative(2, lookahead=2)
    default = specjax.estimate(bsd, Recording.from_arrays(tokens, p, q))
    kept = specjax.estimate(bsd, Recording.from_arrays(tokens, p, q, keep_rows=True))
    assert float(default.expected_calls) == float(kept.expected_calls)
    with pytest.raises(ValueError, match="no rates"):
        specjax.estimate(bsd, Recording.from_arrays(tokens, p, q, keep_rows=False))
