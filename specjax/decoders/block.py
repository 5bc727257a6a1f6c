"""Block verification (Sun et al. 2024): verify a drafted block jointly instead of token by token.

One target call drafts ``K`` tokens ``X_1..X_K`` from the draft ``p`` (fewer at the end of the
horizon) and keeps a prefix ``X_1..X_tau`` plus one more token ``Y``. Algorithm 2 of Sun,
Mendlovic, Leviathan, Aharoni, Beirami, Ro and Suresh, *Block verification accelerates speculative
decoding* (arXiv 2403.10444, ICLR 2025), on a Markov chain whose call starts at position ``n``
from the previous token ``X_0 = x_{n-1}`` (``p_i``, ``q_i`` the rows at position ``n + i - 1``):

* weights ``w_0 = 1``, ``w_i = min(w_{i-1} q_i(X_i | X_{i-1}) / p_i(X_i | X_{i-1}), 1)``;
* residual masses ``r_i(y) = [w_i q_{i+1}(y | X_i) - p_{i+1}(y | X_i)]_+`` with total ``R_i``;
* acceptance probabilities ``h_i = R_i / (R_i + 1 - w_i)`` for ``i < K`` and ``h_K = w_K``;
* backward pass: for ``i = K, K - 1, ..., 1``, stop at the first ``i`` whose fresh uniform is
  ``<= h_i`` (``tau = i``), ``tau = 0`` if none; the paper draws ``eta_1..eta_K`` up front and
  keeps the largest accepted ``i``, the same law;
* ``Y ~ q_{K+1}(. | X_K)`` if ``tau = K`` (the bonus token), else ``Y ~ r_tau / R_tau``.

``h_i`` is computed as ``R_i / (R_i + (1 - w_i))``: with ``w_i = 1`` it is then exactly 1 (as
``(R_i + 1) - w_i`` would not be after rounding, and a residual of no mass could be reached).
``h_i`` is ``0/0`` only when ``w_i = 1`` and ``R_i = 0``; it is then 1. So a level whose residual
has no mass is never stopped at, and a draft of target probability 0 (``w_i = 0``) never kept. With
``K = 1`` this is speculative decoding. The output law is the target's (the tests enumerate it).

How much it accepts. With ``m_i(x_{1:i}) = w_i p(x_{1:i})`` (joint probabilities of the prefix
given ``x_0``), the recursion reads ``m_i = min(m_{i-1} q_i(x_i | x_{i-1}), p(x_{1:i}))`` and
``E[tau] = sum_{i <= K} sum_{x_{1:i}} m_i(x_{1:i})``. This lies between token-wise SD,
``sum_i sum_{x_{1:i}} prod_{j <= i} min(p_j, q_j)``, and the joint-coupling bound
``sum_i sum_{x_{1:i}} min(p(x_{1:i}), q(x_{1:i}))`` that a verifier knowing the whole joint laws
could reach (the paper's motivating example: 10/9, 11/9 and 12/9 tokens). The bound is *not*
block verification's value in general. The paper proves block verification optimal within its
class of verifiers; that claim is not checked here (the tests check unbiasedness, the formula
above against the enumerated literal algorithm, and token-wise <= block <= bound).

Sampler: the call-level engine (``specjax.sampling.calls``) scans over at most ``T`` calls (each
emits at least one token), vmapped over chains; chain ``c`` draws call ``m``'s ``2K + 1`` uniforms
from the Threefry hash of the counters ``c (2K + 1) + j`` under a key folded with ``m``, so its
numbers depend on its index alone. Exact values: the call-level forward recursion
(``specjax.theory.calls``) over the law of each call's outcome, enumerated here over the ``V**K'``
draft blocks (refused beyond ``MAX_BLOCKS``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax import _checks
from specjax.decoders.base import CallDecoder
from specjax.decoders.base import CallLaw
from specjax.decoders.base import pytree_dataclass
from specjax.decoders.draws import bernoulli
from specjax.decoders.draws import categorical_thresholds
from specjax.decoders.draws import draw
from specjax.decoders.verification import safe_normalize
from specjax.numerics import safe_ratio

__all__ = ["BlockVerification", "MAX_BLOCKS", "block_levels", "check_enumerable", "lift"]

MAX_BLOCKS = 2**20  # largest number of draft blocks V**K the exact law enumerates


def lift(row: jax.Array, depth: int) -> jax.Array:
    """A ``(V, V)`` transition row ``(x_{i-1}, x_i)`` as an array of rank ``depth + 1`` that
    broadcasts against prefixes ``(x_0, .., x_{i-1}, x_i)``."""
    return row.reshape((1,) * (depth - 1) + row.shape)


def check_enumerable(num_states: int, num_drafts: int) -> None:
    if num_states**num_drafts > MAX_BLOCKS:
        raise ValueError(f"lookahead: enumerating V**K = {num_states}**{num_drafts} draft blocks "
                         f"exceeds the bound {MAX_BLOCKS} (2**20); use a smaller lookahead")


def block_levels(p_rows, q_rows, drafts, num_drafts):
    """The backward pass's acceptance probabilities and residuals of one block (the rule,
    written once for the sampler and for given drafts, ``specjax.verify_drafts``).

    Args:
      p_rows, q_rows: ``(K, V)`` the draft's and the target's rows at the drafted positions
        (row ``i`` given ``X_i``'s context).
      drafts: ``(K,)`` int32 ``X_1..X_K``.
      num_drafts: ``K' <= K`` (traced): the drafts in play; levels beyond it are never kept.

    Returns:
      ``(h (K,), residual (K, V))``: ``h[i - 1]`` the probability of stopping at level ``i``
      (``h_{K'} = w_{K'}``, 0 beyond ``K'``), ``residual[i]`` the masses ``r_i`` the last token is
      drawn from when ``tau = i < K'``. A draft of draft probability 0 gets weight 0 (it is never
      kept, as ``verify_drafts`` rejects it); drafts drawn from ``p`` never meet it.
    """
    k = drafts.shape[0]
    steps = jnp.arange(k, dtype=jnp.int32)
    ratio = safe_ratio(q_rows[steps, drafts], p_rows[steps, drafts], 0)
    weights = [jnp.ones((), p_rows.dtype)]
    for i in range(k):
        weights.append(jnp.minimum(weights[-1] * ratio[i], 1))
    weights = jnp.stack(weights)  # (K + 1,): w_0 .. w_K
    residual = jnp.maximum(weights[:k, None] * q_rows - p_rows, 0)  # level i = 0 .. K-1
    mass = jnp.sum(residual, axis=-1)
    inner = safe_ratio(mass[1:], mass[1:] + (1 - weights[1:k]), 1)  # h_1 .. h_{K-1}
    inner = jnp.concatenate([inner, jnp.zeros((1,), inner.dtype)])
    levels = steps + 1
    h = jnp.where(levels == num_drafts, weights[1:], jnp.where(levels < num_drafts, inner, 0))
    return h, residual


@pytree_dataclass
class BlockVerification(CallDecoder):
    """Speculative decoding with block verification (Sun et al. 2024): each call drafts ``K``
    tokens from ``p`` and verifies them jointly.

    Each target call drafts ``K`` tokens (fewer when fewer positions remain), keeps the prefix the
    backward pass accepts and appends one token: the target's bonus token when all ``K`` are kept,
    else a draw from the block residual ``[w_tau q - p]_+``. A truncated block at the end of the
    horizon that is kept whole ends the sequence. ``K = 1`` is SD with lookahead 1.

    Attributes:
      lookahead: ``K >= 1`` drafts per call (values above ``T`` act as ``T``). The exact values
        enumerate the ``V**K`` draft blocks of a call and refuse more than ``2**20``.

    References:
      Sun et al. 2024, "Block verification accelerates speculative decoding", Algorithm 2
      (arXiv 2403.10444).
    """

    varies_lookahead = True
    #: Given drafts are verified jointly (``block_levels``' backward pass).
    verifies_jointly = True

    lookahead: int

    @classmethod
    def example_cases(cls) -> dict:
        return {"block K=3": cls(3)}

    def __post_init__(self):
        _checks.check_static_int("lookahead", self.lookahead)

    def check(self, num_states: int, num_rows: int) -> None:
        del num_rows

    def check_exact(self, num_states: int, horizon: int) -> None:
        """The exact law enumerates ``V**min(K, T)`` draft blocks."""
        check_enumerable(num_states, min(self.lookahead, horizon))

    @property
    def num_uniforms(self) -> int:
        return 2 * self.lookahead + 1

    @property
    def label(self) -> str:
        return f"block verification, K = {self.lookahead}"

    def prepare(self, draft, target):
        return categorical_thresholds(draft.trans), draft.trans, target.trans

    def sample_call(self, tables, n, prev, u):
        """One call of one chain from position ``n`` after ``prev``: ``u`` holds ``2K + 1``
        uniforms (drafts, acceptances, the last token)."""
        draft_thr, p_trans, q_trans = tables
        horizon = p_trans.shape[0]
        k = self.lookahead
        steps = jnp.arange(k, dtype=jnp.int32)
        rows = jnp.clip(n - 1 + steps, 0, horizon - 1)  # draft i + 1 sits at position n + i

        def draw_step(x, inputs):  # X_i ~ p(. | X_{i-1}) at position n + i - 1
            row, u_i = inputs
            x = draw(draft_thr[row, x], u_i)
            return x, x

        _, drafts = jax.lax.scan(draw_step, prev, (rows, u[:k]))
        parents = jnp.concatenate([prev[None], drafts[:-1]])
        p_rows, q_rows = p_trans[rows, parents], q_trans[rows, parents]  # (K, V)
        num_drafts = jnp.clip(horizon - n + 1, 0, k)  # K' (fewer drafts at the end)
        h, residual = block_levels(p_rows, q_rows, drafts, num_drafts)
        levels = steps + 1
        accepted = bernoulli(h, u[k:2 * k])
        tau = jnp.max(jnp.where(accepted, levels, 0))  # the backward pass's first acceptance

        bonus = q_trans[jnp.clip(n - 1 + k, 0, horizon - 1), drafts[k - 1]]
        last = jnp.where(tau == k, bonus, residual[jnp.minimum(tau, k - 1)])
        y = draw(categorical_thresholds(last), u[2 * k])
        emitted = jnp.concatenate([drafts, y[None]]).at[tau].set(y)
        return emitted, tau, tau < k

    def call_law(self, p_rows, q_rows, bonus_row, *, with_bonus: bool) -> CallLaw:
        """The law of one call by enumeration of the draft blocks and the backward pass.

        Args:
          p_rows: ``(K', V, V)`` draft rows of the call's positions.
          q_rows: ``(K', V, V)`` target rows of the same positions.
          bonus_row: ``(V, V)`` target row of the position after the block (unused without
            bonus).
          with_bonus: whether that position exists (static).
        """
        k, num_states, _ = p_rows.shape
        ratio = safe_ratio(q_rows, p_rows, 1)
        weight = jnp.ones((num_states,), p_rows.dtype)
        joint = jnp.ones((num_states,), p_rows.dtype)
        joints, residuals, stop = [joint], [], []
        for i in range(k + 1):
            if i < k:  # residual at level i, over (x_0..x_i, y)
                residuals.append(jnp.maximum(weight[..., None] * lift(q_rows[i], i + 1)
                                             - lift(p_rows[i], i + 1), 0))
                mass = jnp.sum(residuals[-1], axis=-1)
                stop.append(safe_ratio(mass, mass + (1 - weight), 1) if i > 0 else joint)
                weight = jnp.minimum(weight[..., None] * lift(ratio[i], i + 1), 1)
                joint = joint[..., None] * lift(p_rows[i], i + 1)
                joints.append(joint)
            else:
                stop.append(weight)  # h_K' = w_K'
        # Backward: survive_i(x_{0:i}) = P(levels i+1..K' all reject | x_{0:i});
        # at_least_i(x_{0:i}) = P(tau >= i, x_{1:i} | x_0).
        survive = jnp.ones_like(joint)
        zeros = jnp.zeros((num_states, num_states), p_rows.dtype)
        rejected, bonus, kept = [zeros] * (k + 1), [zeros] * (k + 1), [zeros] * k
        at_least = None
        for i in range(k, -1, -1):
            stopped = joints[i] * stop[i] * survive  # P(tau = i, x_{1:i} | x_0); h_0 = 1
            at_least = stopped if at_least is None else stopped + jnp.sum(at_least, axis=-1)
            if i > 0:
                kept[i - 1] = jnp.sum(at_least.reshape(num_states, -1, num_states), axis=1)
            if i < k:
                out = stopped[..., None] * safe_normalize(residuals[i])
                rejected[i] = jnp.sum(out.reshape(num_states, -1, num_states), axis=1)
            elif with_bonus:
                out = stopped[..., None] * lift(bonus_row, i + 1)
                bonus[i] = jnp.sum(out.reshape(num_states, -1, num_states), axis=1)
            if i > 0:
                survive = jnp.sum(lift(p_rows[i - 1], i) * (1 - stop[i]) * survive, axis=-1)
        return CallLaw(kept=jnp.stack(kept), rejected=jnp.stack(rejected),
                       bonus=jnp.stack(bonus))
