"""What both audits share (``audit`` and ``audit_exact``; served from ``specjax.auditing.audit``
too): the argument checks (``check_rows``, ``check_drafting``, ``check_rule``, ``check_alpha``),
the chi-square tail ``chi2_sf`` and the host-side helpers (``normalised``, ``draft_law_of``,
``drafting_name``).
"""

from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks

__all__ = ["check_rows", "check_drafting", "check_rule", "HOST_CHECK", "chi2_sf", "draft_law_of",
           "normalised", "check_alpha", "drafting_name"]


# ---------------------------------------------------------------------------------------------
# Validation.


def check_rows(p, q):
    """Validated ``(p, q)`` as ``(B, V)`` arrays of one floating dtype, and whether batched."""
    arrays = []
    for name, x in (("p", p), ("q", q)):
        x = _checks.host_or_device(x)  # NumPy input: checked on the host, no compilation
        if x.ndim not in (1, 2) or x.shape[-1] < 1:
            raise ValueError(f"{name} must be a (V,) row or a (B, V) batch of rows, "
                             f"got shape {x.shape}")
        _checks.check_probabilities(name, x)
        arrays.append(x)
    p, q = arrays
    if p.shape[-1] != q.shape[-1]:
        raise ValueError(f"p and q must have the same number of tokens V, got {p.shape[-1]} (p) "
                         f"and {q.shape[-1]} (q)")
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape, got {p.shape} (p) and {q.shape} (q)")
    dtype = jnp.result_type(p.dtype, q.dtype)
    batched = p.ndim == 2
    xp = _checks.array_module(p, q)
    return xp.atleast_2d(p.astype(dtype)), xp.atleast_2d(q.astype(dtype)), batched


def check_drafting(drafting, *, exact: bool):
    if isinstance(drafting, str) and drafting in ("sample", "greedy"):
        return
    if callable(drafting) and not isinstance(drafting, str):
        if exact:
            raise ValueError("audit_exact needs a known draft law: drafting must be 'sample' or "
                             f"'greedy', got the function {drafting!r}")
        return
    raise ValueError(f"drafting must be 'sample', 'greedy' or a function (key, p) -> x, "
                     f"got {drafting!r}")


def check_rule(name, rule, first, p_row, q_row):
    """Raise ``ValueError`` unless ``rule(first, p, q, x)`` traces and returns two scalars."""
    signature = f"{name}({'u' if name.endswith('_u') else 'key'}, p, q, x)"
    if not callable(rule):
        raise ValueError(f"{name} must be a function {signature} -> (accepted, token), "
                         f"got {rule!r}")
    x = jax.ShapeDtypeStruct((), jnp.int32)
    try:
        out = jax.eval_shape(rule, first, p_row, q_row, x)
        accepted, token = out
    except Exception as err:  # a user's function: name it, keep its error as the cause
        raise ValueError(f"{name} must be a jax-traceable {signature} -> (accepted, token); "
                         f"tracing it failed: {err}") from err
    if accepted.shape != () or token.shape != () \
            or not jnp.issubdtype(token.dtype, jnp.integer) \
            or not (accepted.dtype == jnp.bool_ or jnp.issubdtype(accepted.dtype, jnp.integer)):
        raise ValueError(f"{name} must return a bool scalar and an integer scalar token, got "
                         f"{accepted.dtype}{accepted.shape} and {token.dtype}{token.shape}")


# Why the audits refuse traced arguments (the message of _checks.refuse_traced).
HOST_CHECK = "its tests run on the host and its report holds Python numbers"


def _typed_key(key):
    _checks.check_key(key)
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return key
    return jax.random.wrap_key_data(jnp.asarray(key))


# ---------------------------------------------------------------------------------------------
# Statistics on the host (float64; no scipy dependency: the chi-square tail is JAX's gammaincc).


def _cpu():
    """The CPU device, or ``None`` (the default device) where JAX runs without one."""
    try:
        return jax.devices("cpu")[0]
    except RuntimeError:
        return None


def chi2_sf(stat, df):
    """``P(chi2_df > stat)``, elementwise: the regularised upper incomplete gamma
    ``Q(df/2, stat/2)`` (``jax.scipy.special.gammaincc``), in float64 on the host CPU whatever
    the ``jax_enable_x64`` setting and the default device (relative error about 1e-15 against
    scipy, tails down to 1e-300 included). A float for scalar arguments."""
    stat = np.maximum(np.asarray(stat, np.float64), 0.0)
    df = np.asarray(df, np.float64)
    shape = np.broadcast_shapes(stat.shape, df.shape)
    count = math.prod(shape)
    # Flattened and padded (df 1, stat 0: Q(1/2, 0) = 1) to a power of two, at least 8 values:
    # one compiled program for every call of up to 8 values, not one per shape.
    size = max(8, 1 << max(count - 1, 0).bit_length())
    flat = lambda x, fill: np.pad(np.broadcast_to(x, shape).reshape(-1),  # noqa: E731
                                  (0, size - count), constant_values=fill)
    with jax.enable_x64(True), jax.default_device(_cpu()):
        sf = np.asarray(_gammaincc(0.5 * flat(df, 1.0), 0.5 * flat(stat, 0.0)), np.float64)
    sf = sf[:count].reshape(shape)
    return float(sf) if sf.ndim == 0 else sf


_gammaincc = jax.jit(jax.scipy.special.gammaincc)


def _chi2_statistic(counts: np.ndarray, law: np.ndarray, n: int, min_expected: float = 5.0):
    """``(statistic, degrees of freedom)`` of Pearson's test of ``counts`` against ``n * law``
    on the bins with ``law > 0``, bins of expected count below ``min_expected`` pooled (as
    ``tests/stats.py`` does); ``(0, 0)`` when fewer than two bins remain (no test: p-value 1)."""
    support = law > 0
    exp = law[support] * n
    obs = counts[support].astype(np.float64)
    small = exp < min_expected
    if small.any():
        exp = np.append(exp[~small], exp[small].sum())
        obs = np.append(obs[~small], obs[small].sum())
        if exp[-1] < min_expected and len(exp) > 1:  # fold the pooled bin into the smallest
            i = int(np.argmin(exp[:-1]))
            exp[i] += exp[-1]
            obs[i] += obs[-1]
            exp, obs = exp[:-1], obs[:-1]
    if len(exp) < 2:
        return 0.0, 0
    return float(((obs - exp) ** 2 / exp).sum()), len(exp) - 1


def _chi2_pvalues(counts: np.ndarray, laws: np.ndarray, n: int) -> np.ndarray:
    """``(B,)`` p-values of Pearson's test, row ``b`` of ``counts`` against ``n * laws[b]``."""
    stat, df = np.array([_chi2_statistic(c, law, n) for c, law in zip(counts, laws)],
                        np.float64).reshape(-1, 2).T
    return np.where(df > 0, chi2_sf(stat, np.maximum(df, 1.0)), 1.0)


def draft_law_of(p64: np.ndarray, p, drafting) -> np.ndarray:
    if drafting == "greedy":
        return np.eye(p64.shape[-1])[np.argmax(np.asarray(p), axis=-1)]
    return p64


def normalised(x) -> np.ndarray:
    x = np.asarray(x, np.float64)
    return x / x.sum(-1, keepdims=True)


# ---------------------------------------------------------------------------------------------
# Small helpers.


def check_alpha(alpha) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) \
            or not 0 < float(alpha) < 1:
        raise ValueError(f"alpha must be a number in (0, 1), got {alpha!r}")
    return float(alpha)


def drafting_name(drafting) -> str:
    return drafting if isinstance(drafting, str) else getattr(drafting, "__name__", "custom")
