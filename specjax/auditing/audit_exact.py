"""The exact audit of a single-step verification rule: ``audit_exact``.

The rule is written as a function of one uniform ``u`` in ``[0, 1)``; the audit integrates its
outcomes over ``u`` exactly (the rule evaluated on a grid, every change of outcome bisected to
the float) and evaluates ``u = 0.0`` itself. The Monte Carlo audit, ``AuditReport`` and the
checks both audits share are in ``specjax.auditing.audit``.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax.auditing.audit import AuditReport
from specjax.auditing.audit import HOST_CHECK
from specjax.auditing.audit import check_drafting
from specjax.auditing.audit import check_rows
from specjax.auditing.audit import check_rule
from specjax.auditing.audit import draft_law_of
from specjax.auditing.audit import drafting_name
from specjax.auditing.audit import first_row
from specjax.auditing.audit import normalised

__all__ = ["audit_exact"]

_BISECTION_STEPS = 64  # halves a grid cell (>= 2^-32 wide) far below any float's resolution


def _code(accepted, token):
    """One integer per outcome ``(token, accepted)``."""
    return jnp.asarray(token, jnp.int32) * 2 + jnp.asarray(accepted, jnp.int32)


@functools.partial(jax.jit, static_argnames=("verify_u",))
def _codes_on_grid(us, p, q, xs, *, verify_u):
    """``(K, len(us))`` outcome codes of ``verify_u(u, p, q, x)`` for each draft ``x``."""
    def per_draft(x):
        return jax.vmap(lambda u: _code(*verify_u(u, p, q, x)))(us)
    return jax.lax.map(per_draft, xs)


@functools.partial(jax.jit, static_argnames=("verify_u",))
def _bisect(lo, hi, code_lo, code_hi, xs, p, q, *, verify_u):
    """Each change of outcome in ``[lo, hi]`` located to the float: the first ``u`` (the final
    ``hi``) whose outcome differs from ``code_lo``, and whether a third outcome was met."""
    def one(lo, hi, code_lo, code_hi, x):
        def step(_, state):
            lo, hi, third = state
            mid = lo + (hi - lo) / 2
            code = _code(*verify_u(mid, p, q, x))
            same = code == code_lo
            third = third | (~same & (code != code_hi))
            return jnp.where(same, mid, lo), jnp.where(same, hi, mid), third
        _, hi, third = jax.lax.fori_loop(0, _BISECTION_STEPS, step, (lo, hi, False))
        return hi, third
    return jax.vmap(one)(lo, hi, code_lo, code_hi, xs)


def _exact_row(verify_u, p, q, draft_law, grid, dtype):
    """Exact output law, acceptance, invalid mass, isolated tokens and unresolved cells of one
    row (float64), integrating each draft's outcome over ``u`` in ``[0, 1)``."""
    num_tokens = p.shape[-1]
    xs = np.flatnonzero(draft_law > 0).astype(np.int32)
    finfo = np.finfo(dtype)
    # u = 0, the smallest normal float (the rule's value just above 0), the grid k / grid, and
    # the largest float below 1 (the last cell's right end).
    us = np.concatenate([[0.0, finfo.tiny], np.arange(1, grid) / grid,
                         [np.nextafter(dtype.type(1), dtype.type(0))]]).astype(dtype)
    # The drafts padded to V with the last one (their codes dropped): one program per rule, V
    # and dtype, not one per number of drafts of positive mass (the documented cost, V drafts).
    padded = np.pad(xs, (0, num_tokens - xs.size), mode="edge")
    codes = np.asarray(_codes_on_grid(us, p, q, padded, verify_u=verify_u))[:xs.size]
    at_zero, codes, us = codes[:, 0], codes[:, 1:], us[1:]
    isolated = np.zeros(num_tokens, bool)
    for k in np.flatnonzero(at_zero != codes[:, 0]):
        token = at_zero[k] >> 1
        if 0 <= token < num_tokens:
            isolated[token] = True
    draft_idx, cell = np.nonzero(codes[:, :-1] != codes[:, 1:])
    if draft_idx.size:
        size = max(8, 1 << int(draft_idx.size - 1).bit_length())  # pad: few recompilations
        pad = size - draft_idx.size
        take = lambda a: np.pad(a, (0, pad), mode="edge")  # noqa: E731
        bounds, third = _bisect(take(us[cell]), take(us[cell + 1]),
                                take(codes[draft_idx, cell]), take(codes[draft_idx, cell + 1]),
                                take(xs[draft_idx]), p, q, verify_u=verify_u)
        bounds = np.asarray(bounds, np.float64)[:draft_idx.size]
        unresolved = int(np.asarray(third)[:draft_idx.size].sum())
    else:
        bounds, unresolved = np.zeros(0), 0
    law = np.zeros(num_tokens)
    accepted = invalid = 0.0
    for k, x in enumerate(xs):
        mine = draft_idx == k
        ends = np.concatenate([bounds[mine], [1.0]])
        starts = np.concatenate([[0.0], bounds[mine]])
        outcome = codes[k, np.concatenate([[0], cell[mine] + 1])]
        weight = draft_law[x] * (ends - starts)
        tokens, acc = outcome >> 1, outcome & 1
        inside = (tokens >= 0) & (tokens < num_tokens)
        np.add.at(law, tokens[inside], weight[inside])
        invalid += weight[~inside].sum()
        accepted += weight[acc == 1].sum()
    return law, accepted, invalid, isolated, unresolved


def audit_exact(verify_u: Callable, p, q, *, drafting="sample", grid: int = 2**16,
                tol: float | None = None) -> AuditReport:
    """Exact audit of a rule written as a function of one uniform ``u`` in ``[0, 1)``.

    The output law is ``sum_x d(x) integral_0^1 1[verify_u(u, p, q, x) emits y] du`` over the
    drafts ``x`` of positive draft mass ``d(x)``. For each ``x`` the rule is evaluated on the grid
    ``u = k / grid``; wherever two neighbouring grid points disagree, the change point is bisected
    to the float (64 halvings), and each outcome's probability is the total length of its
    ``u``-intervals. This is exact up to float resolution for rules that are piecewise constant
    in ``u`` with pieces wider than ``1 / grid`` (SD-style rules are: one acceptance threshold
    and one inverse-CDF piece per token, so ``V`` pieces of widths the residual's probabilities);
    a piece narrower than the grid spacing that starts and ends inside one cell is missed, one
    that meets a change point is counted in ``unresolved``. Cost: ``O(V grid)`` rule
    evaluations per row (each ``O(V)``): for small ``V``.

    Isolated points: the rule is also evaluated at ``u = 0.0`` exactly and compared with the
    smallest normal float. An outcome reached at ``u = 0.0`` only has measure zero but a float
    uniform produces it (probability ``2^-23`` for ``jax.random.uniform`` in float32): such
    tokens are reported in ``isolated_tokens``, and one with ``q = 0`` makes the rule biased. This
    catches ``accepts_at_zero_uniform_u``, which Monte Carlo almost never sees.

    Args:
      verify_u: ``(u, p, q, x) -> (accepted, token)``, jax-traceable; ``u`` a scalar of the
        rows' dtype, ``x`` an int32 scalar. Pass the same function object to reuse compilation.
      p: ``(V,)`` draft row or ``(B, V)`` rows.
      q: target row(s), same shape as ``p``.
      drafting: ``"sample"`` (``x ~ p``) or ``"greedy"`` (``x = argmax p``).
      grid: number of grid cells over ``[0, 1)`` (at least 2).
      tol: bias below which differences are attributed to rounding; default
        ``8 V eps(dtype)`` (about ``1e-6 V`` in float32).

    Returns:
      ``AuditReport`` with exact numbers: ``chi2_pvalue`` NaN, ``acceptance_rate_se`` 0,
      ``impossible_tokens`` as probabilities, ``tv_bias_bound = tol``.

    Raises:
      ValueError: bad shapes or probabilities, a drafting function (exact mode needs a known
        draft law), ``grid`` or ``tol``, or a ``verify_u`` that does not return two scalars.

    A host-side check, as ``audit``: call it outside ``jax.jit``, ``vmap`` and ``grad`` (a
    traced ``p`` or ``q`` raises ``ValueError``; ``jax.jit(audit_exact)`` is refused by JAX
    itself, as ``verify_u`` is a function).
    """
    _checks.refuse_traced("audit_exact", HOST_CHECK, p=p, q=q)
    p, q, batched = check_rows(p, q)
    check_drafting(drafting, exact=True)
    _checks.check_positive_int("grid", grid)
    if grid < 2:
        raise ValueError(f"grid must be at least 2, got {grid}")
    dtype = np.dtype(p.dtype)
    num_rows, num_tokens = p.shape
    if tol is None:
        tol = 8 * num_tokens * float(np.finfo(dtype).eps)
    tol = _checks.check_finite_non_negative("tol", tol)
    check_rule("verify_u", verify_u, jax.ShapeDtypeStruct((), dtype), p[0], q[0])

    target = normalised(q)
    draft_law = draft_law_of(normalised(p), p, drafting)
    results = [_exact_row(verify_u, p[b], q[b], draft_law[b], grid, dtype)
               for b in range(num_rows)]
    law = np.stack([r[0] for r in results])
    rate = np.array([r[1] for r in results])
    invalid = np.array([r[2] for r in results])
    isolated = np.stack([r[3] for r in results])
    unresolved = np.array([r[4] for r in results], np.int64)
    impossible = np.where(target == 0, law, 0.0)
    optimum = np.minimum(draft_law, target).sum(-1)
    tv = 0.5 * np.abs(law - target).sum(-1)
    more = rate - optimum > tol
    biased = (tv > tol) | (impossible.sum(-1) > tol) | (invalid > 0) | more \
        | (isolated & (target == 0)).any(-1)
    report = AuditReport(
        output_law=law, target=target, tv_bias=tv, tv_bias_bound=np.full(num_rows, tol),
        chi2_pvalue=np.full(num_rows, np.nan), impossible_tokens=impossible,
        invalid_tokens=invalid, isolated_tokens=isolated, acceptance_rate=rate,
        acceptance_rate_se=np.zeros(num_rows), optimal_acceptance=optimum,
        acceptance_gap=optimum - rate, biased=biased, accepts_more_than_possible=more,
        num_samples=0, alpha=math.nan, drafting=drafting_name(drafting), exact=True,
        unresolved=unresolved)
    return report if batched else first_row(report)
