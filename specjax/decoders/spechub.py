"""SpecHub (Sun, Zhou, Chen & Sun 2024): two drafts whose pair always contains the draft's mode
(the *hub*), verified by a sequential transport of the target's mass.

**The pair law.** Let ``a = argmax p`` (the first index on ties), the hub. The two drafts are not
i.i.d.: ``X_1 ~ p``; if ``X_1 = a`` then ``X_2`` is drawn from ``p`` restricted to the tokens
``!= a`` (renormalised), otherwise ``X_2 = a``. So every pair contains the hub, and for ``i != a``

    Q_ia(i) = P(pair = (i, a)) = p(i),
    Q_ai(i) = P(pair = (a, i)) = p(a) p(i) / (1 - p(a)),

with ``sum_i Q_ia = 1 - p(a)`` and ``sum_i Q_ai = p(a)``.

**Verification** (a transport of the target ``q`` onto the pairs, ``t`` the target mass not yet
matched, starting at ``q``; the masses ``t`` below are those of the whole law, the same on every
path, and the drawn pair only selects the branch):

1. pair ``(i, a)``: accept ``i`` with ``min(1, q(i) / p(i))``; then ``t(i) = [q(i) - p(i)]_+``
   for ``i != a``; the ``(i, a)`` mass left unmatched is ``Q_ia'(i) = [p(i) - q(i)]_+``;
2. pair ``(a, i)``: accept ``i`` with ``min(1, t(i) / Q_ai(i))``; then ``t(i) <- [t(i) -
   Q_ai(i)]_+``; the ``(a, i)`` mass left unmatched is ``Q_ai'(i) = [Q_ai(i) - t(i)]_+`` (``t``
   before this update);
3. pair ``(a, i)`` and ``i`` rejected: accept ``a`` with ``min(1, q(a) / S_ai)``,
   ``S_ai = sum_i Q_ai'(i)``; then ``t(a) <- [q(a) - S_ai]_+``;
4. pair ``(i, a)`` and ``i`` rejected: accept ``a`` with ``min(1, t(a) / S_ia)``,
   ``S_ia = sum_i Q_ia'(i)``; then ``t(a) <- [t(a) - S_ia]_+``;
5. otherwise the token is drawn from the normalised remaining ``t`` (a rejection).

The joint law of (token, accepted) is therefore, in closed form (``O(V)`` per row), for ``i != a``

    accepted(i) = min(q(i), p(i)) + min([q(i) - p(i)]_+, Q_ai(i)),
    rejected(i) = [[q(i) - p(i)]_+ - Q_ai(i)]_+,

and for the hub ``accepted(a) = min(q(a), S_ai) + min([q(a) - S_ai]_+, S_ia)``, ``rejected(a) =
[q(a) - S_ai - S_ia]_+``. ``accepted + rejected = q``: the step is lossless (steps 1-4 never
move more mass to a token than the target gives it, and step 5 hands out exactly the rest).

**Edge case ``p(a) = 1``** (not covered by the paper's rule: the restricted law of ``X_2`` is
empty). Both drafts are then ``a``; the pair ``(a, a)`` has no non-hub token, so step 2 is void
and the whole pair mass ``p(a) = 1`` reaches step 3: ``a`` is accepted with ``min(1, q(a))``, which
is SD on the one-hot draft. In the formulas ``Q_ai = 0`` and ``S_ai = p(a) = 1`` there. The law is
discontinuous at this edge (as ``p(a) -> 1`` the second draft is still a non-hub token, drawn
from the vanishing rest of ``p`` renormalised), which is a property of the pair law itself.

Only ``accepted(a) = min(q(a), S_ai + S_ia)`` matters for the law at the hub, so the order of
steps 3 and 4 changes the branch probabilities but not the joint law of (token, accepted).

**Optimal for its pair law, not bounded by the i.i.d. optimum.** The total acceptance is
``min(1, q(a) + sum_{i != a} min(q(i), p(i) + Q_ai(i)))``: a token ``i != a`` can be served only
by the pairs that contain it (mass ``p(i) + Q_ai(i)``) and the hub by at most ``q(a)``, and the
transport serves every ``i != a`` fully before the hub, so no lossless verifier of this pair law
accepts more (it equals ``1 - max_H [P(pair within H) - q(H)]`` over token sets ``H``; tested by
brute force). Because the pair is not i.i.d. from ``p``, the acceptance is *not* bounded by
``specjax.optimal_acceptance(p, q, num_drafts=2)`` (which assumes i.i.d. drafts): for ``p =
(0.5, 0.5)``, ``q = (1, 0)`` every pair is ``{0, 1}`` and SpecHub accepts with probability 1,
against the i.i.d. optimum 0.75 (it exceeded the i.i.d. optimum on 175 of 276 random and edge
rows with zeros, V = 2..5, in a check made while writing this module). It is at least SD's
``sum min(p, q)``.

The authors' released code also accepts the hub outright when ``q(a) > 1 - 1e-3``; that shortcut
is lossy and is not reproduced: this rule is exactly lossless.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax import _checks

from specjax.decoders import multi_draft
from specjax.decoders import verification
from specjax.decoders.base import TokenwiseDecoder
from specjax.decoders.base import check_lookahead
from specjax.decoders.base import pytree_dataclass
from specjax.decoders.verification import VerificationLaw
from specjax.numerics import divide

__all__ = ["SpecHub", "spechub_pair_masses", "spechub_root_law"]


def spechub_pair_masses(p: jax.Array):
    """``(hub, Q_ia, Q_ai, edge)`` of SpecHub's pair law for draft rows ``p`` ``(..., V)``.

    ``hub`` is the bool one-hot ``(..., V)`` of ``a = argmax p`` (the first index on ties);
    ``Q_ia = P(pair = (i, a)) = p(i)`` and ``Q_ai = P(pair = (a, i)) = p(a) p(i) / (1 - p(a))``
    for ``i != a``, both 0 at ``a`` (``(..., V)``); ``edge`` (``(..., 1)`` bool) marks the rows
    with ``1 - p(a)`` below the smallest normal float, where both drafts are ``a`` (``Q_ai = 0``,
    module docstring). ``1 - p(a)`` is summed from the other tokens (no cancellation), and the
    division is guarded (double ``where``), so values and gradients are finite everywhere.
    """
    index = jax.lax.broadcasted_iota(jnp.int32, jnp.shape(p), jnp.ndim(p) - 1)
    hub = index == jnp.argmax(p, axis=-1, keepdims=True).astype(jnp.int32)
    zero = jnp.zeros_like(p)
    p_hub = jnp.sum(jnp.where(hub, p, zero), axis=-1, keepdims=True)
    q_ia = jnp.where(hub, zero, p)
    rest = jnp.sum(q_ia, axis=-1, keepdims=True)
    edge = rest < jnp.finfo(p.dtype).tiny
    safe_rest = jnp.where(edge, jnp.ones_like(rest), rest)
    q_ai = jnp.where(edge, zero, divide(p_hub * q_ia, safe_rest))
    return hub, q_ia, q_ai, edge


def spechub_root_law(p: jax.Array, q: jax.Array) -> VerificationLaw:
    """The first token after a target call under SpecHub (two drafts through the hub).

    With ``a = argmax p`` and the pair law ``Q_ia``, ``Q_ai`` (module docstring): for ``i != a``
    ``rejected(i) = [[q(i) - p(i)]_+ - Q_ai(i)]_+``, and ``rejected(a) = [q(a) - S_ai -
    S_ia]_+`` with ``S_ai = sum_{i != a} [Q_ai(i) - [q(i) - p(i)]_+]_+`` (``= p(a) = 1`` in the
    edge case ``p(a) = 1``) and ``S_ia = sum_{i != a} [p(i) - q(i)]_+``; ``accepted = q -
    rejected``, so ``accepted + rejected = q`` (lossless) and ``rejected >= 0`` exactly. The
    accepted masses equal ``min(q, p) + min([q - p]_+, Q_ai)`` off the hub and ``min(q(a), S_ai)
    + min([q(a) - S_ai]_+, S_ia)`` at the hub.

    Differentiable in ``p`` and ``q`` (the hub is piecewise constant in ``p``: its choice carries
    no gradient); values and gradients are finite at zeros, ``p = q``, disjoint supports and
    one-hot rows.

    Args:
      p: ``(..., V)`` draft probabilities.
      q: ``(..., V)`` target probabilities.

    Returns:
      ``VerificationLaw(accepted, rejected)``, each ``(..., V)``.

    References:
      Sun, Zhou, Chen & Sun 2024, "SpecHub: Provable Acceleration to Multi-Draft Speculative
      Decoding" (EMNLP 2024); the rule as in the authors' released code
      (github.com/MasterGodzilla/Speculative_decoding_OT, ``EAGLE/eagle/model/cnets.py``
      ``sample`` for the pair, ``EAGLE/eagle/model/utils.py`` for the verification), without its
      lossy shortcut for ``q(a) > 1 - 1e-3``.
    """
    _checks.check_rows(probabilities={"p": p, "q": q})
    p, q = multi_draft.broadcast_rows(p, q)
    hub, q_ia, q_ai, edge = spechub_pair_masses(p)
    zero = jnp.zeros_like(q)
    excess = jnp.where(hub, zero, jnp.maximum(q - p, 0))  # t after step 1, off the hub
    rejected_off = jnp.maximum(excess - q_ai, 0)  # t after step 2
    p_hub = jnp.sum(jnp.where(hub, p, zero), axis=-1, keepdims=True)
    s_ai = jnp.where(edge, p_hub,
                     jnp.sum(jnp.maximum(q_ai - excess, 0), axis=-1, keepdims=True))
    s_ia = jnp.sum(jnp.maximum(q_ia - jnp.where(hub, zero, q), 0), axis=-1, keepdims=True)
    q_hub = jnp.sum(jnp.where(hub, q, zero), axis=-1, keepdims=True)
    rejected_hub = jnp.maximum(q_hub - s_ai - s_ia, 0)
    rejected = jnp.where(hub, rejected_hub, rejected_off)
    return VerificationLaw(q - rejected, rejected)


@pytree_dataclass
class SpecHub(TokenwiseDecoder):
    """SpecHub with ``M = 2`` drafts: a pair of draft sequences per target call, one of which
    always starts with the draft's mode.

    At the root of a call the drafts' first tokens are drawn from the pair law (module
    docstring: ``X_1 ~ p``; ``X_2 = a = argmax p`` unless ``X_1 = a``, then ``X_2 ~ p`` off
    ``a``), verified by the hub transport (``spechub_root_law``); the draft whose first token was
    accepted is followed and its later tokens (drawn from the draft model) are verified by SD
    until a rejection, as in batch SD. If neither first token is accepted the token is drawn
    from the transport's residual. When ``p(a) = 1`` both drafts are ``a`` and the root is SD.

    Because the pair is not i.i.d., the acceptance can exceed
    ``specjax.optimal_acceptance(p, q, num_drafts=2)`` (e.g. ``p = (0.5, 0.5)``, ``q = (1, 0)``:
    1 against 0.75); it equals the optimum for its own pair law (module docstring).

    Verified (``tests/test_spechub.py``): the root law equals a literal NumPy transcription of
    the steps above enumerated exactly (random rows with zeros and edge rows, ``V = 2..5``); it
    is lossless, at least SD's acceptance and equal to the brute-force optimum for its pair law;
    its gradients match finite differences at interior rows; whole sequences of the literal
    algorithm (enumerated) have the target's law and ``exact``'s expected rejections and calls;
    Monte Carlo of ``decode`` fits both; values and gradients are finite at edge rows. Not
    verified: agreement with the authors' released implementation run side by side (the
    transcription follows our reading of it), and the paper's speed-up claims.

    Attributes:
      lookahead: ``None`` (``K = T``) or ``K`` (a bonus token after ``K`` accepted drafts).

    References:
      Sun, Zhou, Chen & Sun 2024, "SpecHub: Provable Acceleration to Multi-Draft Speculative
      Decoding" (EMNLP 2024).
    """

    _: dataclasses.KW_ONLY
    lookahead: int | None = None
    same_root = False

    @classmethod
    def example_cases(cls) -> dict:
        return {"spechub": cls()}

    def __post_init__(self):
        check_lookahead(self.lookahead)

    @property
    def num_drafts(self) -> int:
        """Two draft sequences per call."""
        return 2

    def laws(self, p, q):
        return spechub_root_law(p, q), verification.speculative_law(p, q)

    @property
    def label(self) -> str:
        k = "" if self.lookahead is None else f", K = {self.lookahead}"
        return f"SpecHub, M = 2{k}"
