"""Importance-weighted selection of one draft, then single-draft SD: the canonical two-step
architecture of Khisti et al. (2025) with the plain self-normalised importance weights.

At the root of a call the first tokens ``X_1 .. X_M`` of ``M`` drafts are i.i.d. from ``p``.
Step 1 (selection): draft ``J = i`` is selected with probability ``w(X_i) / sum_j w(X_j)``, with
``w(y) = q(y) / p(y)`` (uniformly among the ``M`` when every draft has ``w = 0``). Step 2
(verification): the selected token ``Y = X_J`` is verified by SD against ``q`` with the law of
``Y`` as its proposal, ``r``: accepted with ``min(1, q(Y) / r(Y))``, otherwise the token is drawn
from ``[q - r]_+`` (normalised) and the call ends. ``Y ~ r`` exactly, so the step is lossless,
and its joint law of (token, accepted) is

    accepted = min(q, r),    rejected = q - min(q, r) = [q - r]_+.

The selection law is, with ``W`` the sum of ``M - 1`` i.i.d. ``w(X)``, ``X ~ p``,

    r(y) = M p(y) E[w(y) / (w(y) + W)]

(the ratio read as ``1 / M`` when ``w(y) + W = 0``), so for ``q(y) = 0``
``r(y) = p(y) P(w(X) = 0)^(M - 1)``. It sums to one (``M E[f(w(X_1), W)] = 1`` by symmetry);
``M = 1`` gives ``r = p`` (SD). ``importance_selection_law`` computes it by enumerating the
``V^(M - 1)`` ordered tuples of the other drafts' first tokens, all rows at once: ``O(V^M)`` work
and memory per row, refused beyond ``MAX_IMPORTANCE_ELEMENTS`` (as without-replacement batch SD).

Khisti et al. show that the best acceptance of this architecture equals the optimum of any
lossless verifier of ``M`` drafts when the selection weights are chosen by a linear program;
the plain weights ``q / p`` are one member of their class and do **not** reach
``specjax.optimal_acceptance`` in general (the tests check ``<=`` on random rows).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from specjax import _checks

from specjax.decoders import multi_draft
from specjax.decoders.base import pytree_dataclass
from specjax.decoders.iid_multi_draft import IidMultiDraft
from specjax.decoders.verification import VerificationLaw
from specjax.numerics import divide

__all__ = [
    "ImportanceWeighted",
    "MAX_IMPORTANCE_ELEMENTS",
    "check_importance_size",
    "importance_selection_law",
    "importance_weighted_root_law",
]

#: Largest ``V^M x rows`` (the size of the biggest array of the enumeration of the selection
#: law) that ``importance_selection_law`` builds: 256 MB in float32, as
#: ``multi_draft.MAX_WITHOUT_REPLACEMENT_ELEMENTS``.
MAX_IMPORTANCE_ELEMENTS = 2**26


def _check_num_drafts(num_drafts) -> None:
    multi_draft.check_finite_num_drafts(
        num_drafts, "importance-weighted selection",
        "its selection law enumerates the V^(M - 1) tuples of the other drafts",
        verb="is not supported by")


def _elements(num_states: int, num_drafts: int, num_rows: int) -> int:
    """``V^M x rows``, stopping (with a value above the limit) once it exceeds the limit, so
    that a huge ``M`` costs nothing."""
    elements = max(int(num_rows), 1)
    for _ in range(num_drafts):
        elements *= num_states
        if elements > MAX_IMPORTANCE_ELEMENTS:
            break
    return elements


def check_importance_size(num_drafts, num_states: int, num_rows: int) -> None:
    """Raises ``ValueError`` (naming ``num_drafts``) when the selection law of ``num_rows`` rows
    would need more than ``MAX_IMPORTANCE_ELEMENTS`` elements per array (``V^M x rows``).
    ``M = 1`` (``r = p``) and ``V = 1`` need no enumeration and are never refused."""
    _check_num_drafts(num_drafts)
    if num_drafts == 1 or num_states <= 1:
        return
    elements = _elements(num_states, int(num_drafts), num_rows)
    if elements > MAX_IMPORTANCE_ELEMENTS:
        shown = f"{elements:,}" if elements <= MAX_IMPORTANCE_ELEMENTS * num_states else \
            f"more than {MAX_IMPORTANCE_ELEMENTS:,}"
        raise ValueError(
            f"num_drafts = {num_drafts} with importance-weighted selection enumerates V^M x rows "
            f"= {num_states}^{num_drafts} x {num_rows:,} = {shown} elements, more than "
            f"{MAX_IMPORTANCE_ELEMENTS:,}; use fewer drafts (or fewer rows or chains)")


def _positive(x):
    """``x > 0`` read as ``x >= tiny`` (the smallest normal float), as ``safe_normalize``: below
    it a division and its gradient could overflow."""
    return x >= jnp.finfo(x.dtype).tiny


def _weights(p, q):
    """``w = q / p`` where ``p > 0``; ``0`` where ``p = 0`` (such tokens are never drafted; the
    value is never used with a positive probability). Double ``where``: finite values and
    gradients everywhere."""
    drafted = _positive(p)
    safe_p = jnp.where(drafted, p, jnp.ones_like(p))
    return jnp.where(drafted, q / safe_p, jnp.zeros_like(q))


def _selection_law(p, q, num_drafts: int):
    """``r`` for broadcast ``(..., V)`` rows of one dtype (no checks)."""
    num_states = q.shape[-1]
    if num_drafts == 1 or num_states == 1:
        return p
    w = _weights(p, q)
    # The other M - 1 drafts: every ordered tuple t (last axis, V^(M-1) entries), with its
    # probability prod p(x_i) and its total weight W(t) = sum w(x_i).
    prob, total = p, w
    for _ in range(num_drafts - 2):
        prob = (prob[..., :, None] * p[..., None, :]).reshape(prob.shape[:-1] + (-1,))
        total = (total[..., :, None] + w[..., None, :]).reshape(total.shape[:-1] + (-1,))
    den = w[..., :, None] + total[..., None, :]  # (..., V, V^(M-1)): w(y) + W(t)
    positive = _positive(den)
    safe_den = jnp.where(positive, den, jnp.ones_like(den))
    # P(J = 1 | X_1 = y, the others t); divide: no den^-2 in the derivative (no overflow).
    own = jnp.broadcast_to(w[..., :, None], den.shape)
    share = jnp.where(positive, divide(own, safe_den), jnp.full_like(den, 1 / num_drafts))
    expected = jnp.sum(prob[..., None, :] * share, axis=-1)  # E[share] over t, (..., V)
    return num_drafts * p * expected


def importance_selection_law(p: jax.Array, q: jax.Array, num_drafts) -> jax.Array:
    """The law ``r`` of the token selected from ``M`` i.i.d. drafts by self-normalised
    importance weights ``w = q / p``.

    ``r(y) = M p(y) E[w(y) / (w(y) + W)]``, ``W`` the total weight of the other ``M - 1``
    drafts, the ratio read as ``1 / M`` when ``w(y) + W = 0`` (every draft has ``q = 0``: the
    selection is uniform). Computed by enumerating the ``V^(M - 1)`` ordered tuples of the other
    drafts, vectorised over the rows; ``M = 1`` (and ``V = 1``) returns ``p`` without
    enumerating. Tokens with ``p = 0`` are never drafted (``r = 0``); their ``q / p`` is never
    formed (double ``where``), so values and gradients are finite there. A weight sum below the
    smallest normal float counts as 0.

    Args:
      p: ``(..., V)`` draft probabilities.
      q: ``(..., V)`` target probabilities.
      num_drafts: ``M >= 1`` (static, finite; ``math.inf`` is refused).

    Returns:
      ``(..., V)`` probability rows (the broadcast shape of ``p`` and ``q``).

    Raises:
      ValueError: ``num_drafts`` is invalid, or ``V^M`` times the number of rows exceeds
        ``MAX_IMPORTANCE_ELEMENTS``.

    References:
      Khisti et al. 2025, "Multi-draft speculative sampling: canonical architectures and
      theoretical limits" (importance-weighted selection, then single-draft SD).
    """
    _check_num_drafts(num_drafts)
    _checks.check_rows(probabilities={"p": p, "q": q})
    p, q = multi_draft.broadcast_rows(p, q)
    check_importance_size(num_drafts, q.shape[-1], math.prod(q.shape[:-1]))
    return _selection_law_program(p, q, int(num_drafts))


def importance_weighted_root_law(p: jax.Array, q: jax.Array, num_drafts) -> VerificationLaw:
    """The first token after a target call under importance-weighted selection of one of ``M``
    i.i.d. drafts, then SD of the selected token against ``q`` with proposal ``r``.

    ``accepted = min(q, r)`` and ``rejected = q - accepted = [q - r]_+`` with ``r =
    importance_selection_law(p, q, M)``, so the step is unbiased by construction; ``sum accepted
    = 1 - TV(q, r)``. ``M = 1`` is SD (``r = p``). The acceptance is at most
    ``optimal_acceptance`` (tested on random rows); it does **not** reach it in general, since
    the weights ``q / p`` are not the linear-programming weights of Khisti et al. with which this
    architecture is optimal.

    Args:
      p: ``(..., V)`` draft probabilities.
      q: ``(..., V)`` target probabilities.
      num_drafts: ``M >= 1`` (static, finite; ``math.inf`` is refused).

    References:
      Khisti et al. 2025, "Multi-draft speculative sampling: canonical architectures and
      theoretical limits".
    """
    _check_num_drafts(num_drafts)
    _checks.check_rows(probabilities={"p": p, "q": q})
    p, q = multi_draft.broadcast_rows(p, q)
    check_importance_size(num_drafts, q.shape[-1], math.prod(q.shape[:-1]))
    return _root_law_program(p, q, int(num_drafts))


# The public functions above run one compiled program each (op by op, the enumeration compiled
# 10 to 20 small programs per call); the decoder's laws call ``_selection_law`` inside its own.
@functools.partial(jax.jit, static_argnums=(2,))
def _selection_law_program(p, q, num_drafts: int):
    return _selection_law(p, q, num_drafts)


@functools.partial(jax.jit, static_argnums=(2,))
def _root_law_program(p, q, num_drafts: int) -> VerificationLaw:
    r = _selection_law(p, q, num_drafts)
    accepted = jnp.minimum(q, r)
    return VerificationLaw(accepted, q - accepted)


@pytree_dataclass
class ImportanceWeighted(IidMultiDraft):
    """Importance-weighted selection of one of ``M`` i.i.d. draft sequences per target call,
    then SD (Khisti et al.'s canonical two-step architecture with weights ``q / p``).

    At the root of a call the drafts' first tokens ``X_1 .. X_M ~ p`` are drawn; draft ``i`` is
    selected with probability ``w(X_i) / sum_j w(X_j)``, ``w = q / p`` (uniformly when every
    ``w`` is 0). The selected token ``Y ~ r`` (``importance_selection_law``) is accepted with
    ``min(1, q(Y) / r(Y))``; then the selected draft is followed and its later tokens verified by
    SD until a rejection (as batch SD). Otherwise the token is drawn from ``[q - r]_+``
    (normalised) and the call ends. The output law is exactly the target's.

    The root acceptance is ``sum min(q, r)``, at most ``optimal_acceptance``; it is not optimal
    in general: Khisti et al. reach the optimum with selection weights found by a linear
    program, of which ``q / p`` is one (generally suboptimal) choice.

    What is verified (``tests/test_importance_weighted.py``): a literal NumPy transcription of
    the selection and SD, enumerated over every draft tuple, has the root law to 1e-12 in
    float64 (random rows with zeros, ``V = 2..5``, ``M = 1, 2, 3``, and edge rows); the literal
    algorithm on whole sequences, enumerated over every execution path, has the target's output
    law and ``exact``'s expected rejections and calls; ``decode`` fits both by Monte Carlo;
    values and gradients are finite at edge rows (float32 and float64) and the gradient of the
    acceptance matches finite differences at interior rows (``min(q, r)`` has a kink where
    ``q = r``: a one-sided derivative there). Not verified: anything against Khisti et al.'s
    own numbers.

    Attributes:
      num_drafts: ``M >= 1`` (``M = 1`` is SD). ``O(V^M)`` per row, refused beyond
        ``V^M x rows > MAX_IMPORTANCE_ELEMENTS``; ``math.inf`` is refused.
      lookahead: ``None`` (``K = T``) or ``K`` (a bonus token after ``K`` accepted drafts).

    References:
      Khisti et al. 2025, "Multi-draft speculative sampling: canonical architectures and
      theoretical limits" (ICLR 2025).
    """

    scheme = "importance-weighted"
    check_num_drafts = staticmethod(_check_num_drafts)

    @classmethod
    def example_cases(cls) -> dict:
        return {"importance-weighted M=2 K=3": cls(2, lookahead=3)}

    def root_law(self, p, q) -> VerificationLaw:
        return importance_weighted_root_law(p, q, self.num_drafts)

    def check(self, num_states: int, num_rows: int) -> None:
        check_importance_size(self.num_drafts, num_states, num_rows)
