"""Battery cases of issue 52 for recordings, their files, profiles and serving sizes (the
entry points of the last round): added to ``reliability_cases.cases()`` by ``add_cases``."""

from __future__ import annotations

import functools
import os
import shutil
import tempfile

import numpy as np

V, T, B = 3, 4, 6


@functools.cache
def _dump():
    """tokens ``(B, T + 1)`` drawn from target rows ``q`` in which token 0 has probability 0."""
    rng = np.random.default_rng(52)
    q = rng.dirichlet(np.ones(V), size=(B, T))
    q[..., 0] = 0.0
    q /= q.sum(-1, keepdims=True)
    p = rng.dirichlet(np.ones(V), size=(B, T))
    tokens = np.zeros((B, T + 1), np.int64)
    for t in range(T):
        tokens[:, t + 1] = [rng.choice(V, p=q[b, t]) for b in range(B)]
    return tokens, p, q


def _stats():
    tokens, p, q = _dump()
    at = lambda rows: np.take_along_axis(rows, tokens[:, 1:, None], -1)[..., 0]  # noqa: E731
    return tokens, at(p), at(q)


def _misaligned():
    tokens, p, q = _dump()
    shifted = np.concatenate([tokens[:, :1], np.roll(tokens[:, 1:], -1, axis=1)], axis=1)
    shifted[:, -1] = 0
    return shifted, p, q


def _in_folder(body):
    """Runs ``body(folder)`` in a new temporary folder, removed afterwards."""
    folder = tempfile.mkdtemp(prefix="specjax-battery-")
    try:
        return body(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def add_cases(add, S) -> None:
    from reliability_cases import returned  # noqa: PLC0415

    R = S.Recording
    sd = S.Speculative(lookahead=2)
    bsd = S.BatchSpeculative(2, lookahead=2)
    kind = "recordings and files"

    def from_stats(*args, **kw):
        tokens, p_x, q_x = _stats()
        return R.from_statistics(tokens, p_x, q_x, **kw)

    add(kind, "Recording.from_arrays", "a dump misaligned by one position (q_t(x_t) = 0)",
        lambda: R.from_arrays(*_misaligned()), "target_probs")
    add(kind, "Recording.from_statistics", "a recorded token of target probability 0",
        lambda: R.from_statistics(
            _misaligned()[0], np.full((B, T), 0.5),
            np.take_along_axis(_dump()[2], _misaligned()[0][:, 1:, None], -1)[..., 0]),
        "target_prob")
    add(kind, "Recording.from_statistics", "no sequences (B = 0)",
        lambda: R.from_statistics(np.zeros((0, 3), np.int32), np.zeros((0, 2)),
                                  np.zeros((0, 2))), ("draft_prob", "target_prob"))
    add(kind, "Recording.from_arrays", "no positions (T = 0)",
        lambda: R.from_arrays(np.zeros((2, 1), np.int32), np.zeros((2, 0, 3)),
                              np.zeros((2, 0, 3))), ("draft_probs", "target_probs"))
    add(kind, "Recording.from_statistics", "token id 2**32",
        lambda: R.from_statistics(np.full((1, 3), 2**32, np.int64), np.full((1, 2), 0.5),
                                  np.full((1, 2), 0.5)), "tokens")
    add(kind, "Recording.from_arrays", "logits='no'",
        lambda: R.from_arrays(*_dump(), logits="no"), "logits")
    add(kind, "Recording.from_arrays", "keep_rows='no'",
        lambda: R.from_arrays(*_dump(), keep_rows="no"), "keep_rows")
    plain = lambda: float(S.estimate(sd, from_stats()).expected_calls)  # noqa: E731
    for scale in (1e37, 1e-44):
        add(kind, "estimate", f"float32 weights of {scale:g} (sum overflows or underflows)",
            lambda scale=scale: S.estimate(sd, from_stats(
                weights=np.full((B,), scale, np.float32))),
            check=lambda e: abs(float(e.expected_calls) - plain()) < 1e-4 * plain())

    def save_load(spelling):
        def body(folder):
            path = os.path.join(folder, spelling)
            from_stats().save(path)
            return R.load(path)
        return _in_folder(body)

    for spelling in ("rec", "rec.npz"):
        add(kind, "Recording.save/load", f"save({spelling!r}) then load({spelling!r})",
            lambda s=spelling: save_load(s),
            check=lambda rec: np.array_equal(np.asarray(rec.tokens), _stats()[0]))
    add(kind, "Recording.save", "an existing folder",
        lambda: _in_folder(lambda folder: from_stats().save(folder)), "path")
    add(kind, "Recording.save", "a name ending in a separator",
        lambda: _in_folder(lambda folder: from_stats().save(os.path.join(folder, "d") + os.sep)),
        "path")

    def bad_rates(value):
        def body(folder):
            path = os.path.join(folder, "rates.npz")
            tokens, p_x, q_x = _stats()
            label = repr(S.BatchSpeculative(2))
            np.savez(path, tokens=tokens, draft_prob=p_x, target_prob=q_x,
                     **{f"root_rejection/{label}": np.full((B, T), value),
                        f"rejection/{label}": np.full((B, T), value)})
            return S.estimate(bsd, R.load(path, decoders=(bsd,)))
        return _in_folder(body)

    for value in (-1.0, 1.5, np.nan):
        add(kind, "Recording.load", f"stored rates of {value}", lambda v=value: bad_rates(v),
            "path")

    def unreadable(name, write):
        def body(folder):
            path = os.path.join(folder, name)
            write(path)
            return R.load(path)
        return _in_folder(body)

    add(kind, "Recording.load", "a .npy file",
        lambda: unreadable("x.npy", lambda path: np.save(path, np.zeros(3))), "path")
    add(kind, "Recording.load", "an empty file",
        lambda: unreadable("e.npz", lambda path: open(path, "wb").close()), "path")
    add(kind, "Recording.load", "a truncated file",
        lambda: unreadable("t.npz", lambda path: (from_stats().save(path), _truncate(path))),
        "path")
    add(kind, "Recording.load", "a missing file",
        lambda: _in_folder(lambda folder: R.load(os.path.join(folder, "none.npz"))), "path")

    def rule_round_trip():
        rule = S.RejectionRule(_accept, _residual, lookahead=2)
        tokens, p, q = _dump()

        def body(folder):
            path = os.path.join(folder, "rule.npz")
            R.from_arrays(tokens, p, q, decoders=(rule,)).save(path)
            # Another process builds its own rule object from the same functions.
            again = S.RejectionRule(_accept, _residual, lookahead=3)
            return S.estimate(again, R.load(path, decoders=(again,)))
        return _in_folder(body)

    add(kind, "Recording.load", "a RejectionRule's saved rates (valid)", rule_round_trip,
        check=returned)

    kind = "profiles and sizes"
    cost = S.CostModel(0.1, 1.0)
    add(kind, "profile_lookahead", "an increasing profile",
        lambda: S.pairs.profile_lookahead([0.1, 0.9, 0.9], cost), "profile")
    add(kind, "profile_lookahead", "a non-increasing profile (valid)",
        lambda: S.pairs.profile_lookahead([0.8, 0.6, 0.45, 0.3, 0.2], cost),
        check=lambda c: c.lookahead == 4 and abs(c.speedup - 2.25) < 1e-12)
    add(kind, "profile_tree", "max_budget 10**6",
        lambda: S.pairs.profile_tree([0.6, 0.2], S.CostModel(0.05, 1.0), max_budget=10**6,
                                     max_depth=4), "max_budget", isolate=True)
    add(kind, "serving_rate", "batch_size 10**6",
        lambda: S.serving_rate(sd, *S.paper_instance(4, 8),
                               S.ServingCost(0.05, lambda n: 1.0 + 0.01 * n),
                               batch_size=10**6), "batch_size", isolate=True)


def _truncate(path):
    data = open(path, "rb").read()
    with open(path, "wb") as file:
        file.write(data[: len(data) // 2])


def _accept(p, q):
    import jax.numpy as jnp  # noqa: PLC0415
    return jnp.minimum(1, q / jnp.where(p > 0, p, 1))


def _residual(p, q, b):
    import jax.numpy as jnp  # noqa: PLC0415
    return jnp.maximum(q - b * p, 0)
