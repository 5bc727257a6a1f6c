"""Every token-wise decoder checked before it runs: its laws evaluated on concrete rows.

A decoder written from the guide can be silently wrong: an acceptance above one, a residual that
is not a distribution, a rule declared lossless whose output is not the target's. The engines
trust ``laws(p, q)``, so such a decoder ran: ``exact`` gave 0.0 rejections, ``verify_drafts``
accepted every draft. ``probe_laws`` evaluates a token-wise decoder's laws on a fixed set of
probe rows (random rows from a fixed seed and the edge cases: ``p = q``, disjoint supports,
one-hot and zero entries) over the models' ``V`` tokens and raises one ``ValueError`` naming the
decoder and the bad value. ``TokenwiseDecoder.probe`` calls it, so ``exact``, ``decode``,
``serving_rate`` (through ``plan_run``), ``estimate`` and ``verify_drafts`` raise the same error
for the same decoder.

The laws run eagerly on rows of one shape per ``V`` (each operation compiled once and shared by
every decoder), and a decoder's result is cached by its value. Decoders whose laws depend on the
whole models (``binds_models``) and decoders with traced leaves are not probed here.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks

__all__ = ["MAX_PROBE_STATES", "probe_decoder", "probe_laws", "probe_rows", "rows_dtype"]

#: The probe rows' vocabulary: the models' ``V``, at most this (a rule's laws do not depend on
#: ``V``; a multi-draft law's enumeration grows with it).
MAX_PROBE_STATES = 64


@functools.lru_cache(maxsize=64)
def probe_rows(num_states: int, dtype_name: str) -> tuple[np.ndarray, np.ndarray]:
    """``(p, q)`` ``(R, V)`` probe rows: Dirichlet rows of a fixed seed with exact zeros, and
    ``p = q``, disjoint supports and one-hot rows."""
    rng = np.random.default_rng(48)
    v = num_states
    p = rng.dirichlet(np.ones(v), size=6)
    q = rng.dirichlet(np.ones(v), size=6)
    p[1, : v // 2] = 0
    q[2, v // 2:] = 0
    rows_p, rows_q = [p, q[:1]], [q, q[:1]]  # ... and p = q
    if v > 1:
        half = np.zeros((2, v))
        half[0, 0], half[1, -1] = 1.0, 1.0
        rows_p.append(half[:1])  # disjoint one-hot rows
        rows_q.append(half[1:])
    p, q = np.concatenate(rows_p), np.concatenate(rows_q)
    p = p / p.sum(-1, keepdims=True)
    q = q / q.sum(-1, keepdims=True)
    return p.astype(dtype_name), q.astype(dtype_name)


def rows_dtype(model):
    """The float dtype of a model's rows, read off its first floating leaf (float32 when none)."""
    for leaf in jax.tree_util.tree_leaves(model):
        if isinstance(leaf, (jax.Array, np.ndarray)) and jnp.issubdtype(leaf.dtype, jnp.floating):
            return leaf.dtype
    return jnp.float32


def _concrete(decoder) -> bool:
    return all(_checks.is_concrete(leaf) for leaf in jax.tree_util.tree_leaves(decoder))


def probe_laws(decoder, num_states: int, dtype=None) -> None:
    """Raise ``ValueError`` naming the decoder unless its laws on the probe rows are laws of the
    emitted token: finite, non-negative masses summing to one; acceptances (when the decoder
    gives them) in ``[0, 1]`` where the draft has mass; and, for a decoder declared
    ``lossless``, accepted plus rejected mass equal to the target's row."""
    if decoder.binds_models or not _concrete(decoder):
        return
    num_states = min(int(num_states), MAX_PROBE_STATES)
    dtype_name = jnp.dtype(jnp.result_type(float) if dtype is None else dtype).name
    try:
        key = (decoder, int(num_states), dtype_name)
        hash(key)
    except TypeError:  # array leaves: no cache, the laws still run
        _probe(decoder, int(num_states), dtype_name)
        return
    _cached_probe(key)


@functools.lru_cache(maxsize=1024)
def _cached_probe(key) -> None:
    _probe(*key)


def _probe(decoder, num_states: int, dtype_name: str) -> None:
    p, q = probe_rows(num_states, dtype_name)
    tol = 1e-9 if dtype_name == "float64" else 1e-4
    name = f"decoder: {decoder!r}"[:200]
    try:
        root, verify = decoder.laws(jnp.asarray(p), jnp.asarray(q))
        laws = {"root": root, "in-call": verify}
        acceptance = (np.asarray(decoder.acceptance(jnp.asarray(p), jnp.asarray(q)), np.float64)
                      if decoder.has_acceptance else None)
    except Exception as error:  # a user's functions: say whose
        raise ValueError(f"{name}: evaluating its laws on probe rows of V = {num_states} "
                         f"tokens failed: {type(error).__name__}: {error}") from error
    if acceptance is not None:
        bad = (p > 0) & ~((acceptance >= -tol) & (acceptance <= 1 + tol))
        if bad.any():
            row = int(np.argmax(bad.any(axis=-1)))
            raise ValueError(
                f"{name}: its acceptance probabilities must lie in [0, 1] where the draft has "
                f"mass; on probe row {row} they are {acceptance[row][bad[row]][:4].tolist()}")
    for which, law in laws.items():
        accepted = np.asarray(law.accepted, np.float64)
        rejected = np.asarray(law.rejected, np.float64)
        for part, mass in (("accepted", accepted), ("rejected", rejected)):
            bad = ~np.isfinite(mass) | (mass < -tol)
            if bad.any():
                row = int(np.argmax(bad.any(axis=-1)))
                raise ValueError(
                    f"{name}: its {which} law's {part} masses must be finite and non-negative; "
                    f"on probe row {row} they include {mass[row][bad[row]][:4].tolist()}")
        total = (accepted + rejected).sum(-1)
        if (np.abs(total - 1) > tol).any():
            row = int(np.argmax(np.abs(total - 1)))
            raise ValueError(
                f"{name}: its {which} law must give the emitted token a law (accepted plus "
                f"rejected masses summing to one); on probe row {row} they sum to "
                f"{total[row]:.6g}")
        if decoder.lossless is True:  # None: not declared (a RejectionRule's functions)
            miss = np.abs(accepted + rejected - q).max(-1)
            if (miss > tol).any():
                row = int(np.argmax(miss))
                raise ValueError(
                    f"{name}: it is declared lossless (lossless = True) but its {which} law's "
                    f"output misses the target's row by {miss[row]:.3g} on probe row {row}; fix "
                    f"its laws, or declare lossless = False for a lossy rule")


def probe_decoder(decoder, num_states: int, dtype=None) -> None:
    """``probe_laws`` for a token-wise decoder that ``probes_laws`` (entry points without models:
    ``estimate`` from a recording, ``verify_drafts`` on given rows); nothing otherwise."""
    from specjax.decoders.base import TokenwiseDecoder  # noqa: PLC0415

    if isinstance(decoder, TokenwiseDecoder) and decoder.probes_laws:
        probe_laws(decoder, num_states, dtype)
