"""Parallel drafters: the depth-``i`` draft of a call does not see the drafts before it.

DFlash (arXiv 2602.06036) and PARD (arXiv 2504.18583) draft a whole block in one forward pass, and
reused multi-token-prediction (MTP) heads draft depth ``i`` from the hidden state of the last
accepted token: in each, the token at depth ``i`` is drawn from a law that depends on the context
up to the last accepted token, not on the drafted tokens ``X_1..X_{i-1}`` before it. On a Markov
chain whose call starts at position ``n`` after the accepted token ``a = x_{n-1}`` that law is

* the ``i``-step marginal of the draft, ``m_i(. | a) = (p_n p_{n+1} .. p_{n+i-1})[a]`` (the law
  of ``x_{n+i-1}`` given ``a`` under the draft: what a parallel drafter trained to imitate the
  draft model predicts for depth ``i``), or
* a per-depth head given by the user, ``heads[i - 1, n - 1, a]``.

The drafts ``X_1..X_K`` are therefore independent given ``a``. Verification is token-wise, down
the block, each draft against the law it was drawn from: at depth ``i`` (all earlier drafts
kept, so the context is ``X_{i-1}``) one step of the token-wise ``rule`` with draft row
``m_i(. | a)`` and target row ``q_{n+i-1}(. | X_{i-1})``. For SD (the default rule): keep ``X_i``
with probability ``min(1, q(X_i | X_{i-1}) / m_i(X_i | a))``, else emit a draw from
``[q(. | X_{i-1}) - m_i(. | a)]_+`` and end the call; after ``K`` kept drafts the target's bonus
token. Since ``X_i`` is independent of the kept prefix, it has law ``m_i(. | a)`` given that the
prefix was kept, so each step is an exact SD step and the output law is the target's (lossless
for every lossless rule). With ``K = 1`` this is SD with lookahead 1.

What it loses. A sequential drafter verifies ``X_i`` against ``p_{n+i-1}(. | X_{i-1})``, which
matches ``q(. | X_{i-1})`` wherever the draft does; the parallel drafter's row ignores
``X_{i-1}``, so its acceptance at depth ``i`` is ``sum_x min(m_i(x | a), q(x | X_{i-1}))``,
averaged over the kept prefixes. Even a perfect head (the target's own ``i``-step marginal)
accepts less than 1 at depth ``i >= 2`` whenever the target's next token depends on the
previous one. ``scripts/study_parallel_draft.py`` tabulates the loss.

Exact values: a call's law is a forward pass over (previous token ``a``, last kept draft ``y``)
pairs, ``O(K V^3)`` (no enumeration of blocks):
``kept[0, a, x] = accepted(m_1(. | a), q_1(. | a))[x]`` and
``kept[i, a, x] = sum_y kept[i-1, a, y] accepted(m_{i+1}(. | a), q_{i+1}(. | y))[x]``, with the
rejected masses alike and the bonus ``kept[K'-1] @ q_{K'+1}``. Sampler: the call-level engine;
a call draws its ``K`` drafts from the heads' rows of ``a`` (``K`` uniforms), verifies them with
``K`` more, and draws the last token with one (``2K + 1`` in all), each kept draft accepted with
probability ``accepted(x) / m(x)`` and a rejected one followed by a draw from the rule's rejected
masses: for SD, Algorithm 1's test and residual.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any

import jax
import jax.numpy as jnp

from specjax import _checks
from specjax.decoders.base import CallDecoder
from specjax.decoders.base import CallLaw
from specjax.decoders.base import TokenwiseDecoder
from specjax.decoders.base import array_field
from specjax.decoders.base import pytree_dataclass
from specjax.decoders.draws import bernoulli
from specjax.decoders.draws import categorical_thresholds
from specjax.decoders.draws import draw
from specjax.decoders.draws import mass_or_target
from specjax.decoders.speculative import Speculative
from specjax.numerics import HIGHEST
from specjax.numerics import safe_ratio

__all__ = ["ParallelDraft", "marginal_heads"]


def marginal_heads(trans: jax.Array, lookahead: int) -> jax.Array:
    """The ``i``-step marginals of a Markov chain from every call start: ``(K, T, V, V)``,
    ``[i - 1, n - 1, a]`` the law of ``x_{n+i-1}`` given ``x_{n-1} = a`` (rows past the horizon
    repeat the last row; a call never reads them).

    Args:
      trans: ``(T, V, V)`` transition rows (row ``r`` draws ``x_{r+1}`` from ``x_r``).
      lookahead: ``K``.
    """
    horizon = trans.shape[0]
    heads = [trans]
    for i in range(1, lookahead):
        later = trans[jnp.minimum(jnp.arange(horizon) + i, horizon - 1)]  # p_{n+i}
        heads.append(jnp.einsum("rab,rbx->rax", heads[-1], later, precision=HIGHEST))
    return jnp.stack(heads)


def _refuse_rule(rule) -> None:
    raise ValueError(
        "rule must be a token-wise specjax decoder that verifies one draft per step, such as "
        f"specjax.Speculative() or specjax.BiasedSpeculative(0.1), got {rule!r}")


@pytree_dataclass
class ParallelDraft(CallDecoder):
    """Speculative decoding with a parallel drafter: the depth-``i`` draft of a call is drawn
    without seeing the drafts before it (DFlash, PARD, reused MTP heads), and verified token by
    token against the law it was drawn from.

    Each call after the accepted token ``a`` drafts ``X_1..X_K`` independently, ``X_i`` from the
    ``i``-step marginal of the draft from ``a`` (or from the user's depth-``i`` head), and
    verifies them in order with ``rule`` (SD by default), draft row the law ``X_i`` was drawn from,
    target row that of ``X_{i-1}``; the first rejection ends the call with a draw from the rule's
    residual, ``K`` kept drafts with the target's bonus token. Lossless for a lossless rule; with
    ``K = 1`` it is SD with lookahead 1.

    Attributes:
      lookahead: ``K >= 1`` drafts per call (values above ``T`` act as ``T``).
      heads: ``None`` (the draft's ``i``-step marginals) or per-depth heads ``(K, T, V, V)``:
        ``heads[i - 1, n - 1, a]`` the law of the depth-``i`` draft of a call at position ``n``
        after token ``a`` (a leaf: traced and differentiable). The draft model is then not read.
      rule: the token-wise verification rule of each depth (one draft per step, no lookahead of
        its own): ``specjax.Speculative()`` by default; its leaves are traced.

    Example:
      >>> import specjax
      >>> draft, target = specjax.paper_instance()
      >>> parallel = specjax.decoders.ParallelDraft(3)
      >>> sequential = specjax.Speculative(lookahead=3)
      >>> tuple(round(float(specjax.exact(d, draft, target).expected_calls), 1)
      ...       for d in (parallel, sequential))
      (24.2, 25.3)

    References:
      "DFlash: Block Diffusion for Flash Speculative Decoding" (arXiv 2602.06036); An et al.
      2025, "PARD: Accelerating LLM Inference with Low-Cost PARallel Draft Model Adaptation"
      (arXiv 2504.18583); Leviathan et al. 2023.
    """

    varies_lookahead = True

    lookahead: int
    _: dataclasses.KW_ONLY
    heads: Any = array_field(default=None)
    rule: Any = array_field(default=Speculative())  # a subtree: its numeric settings are traced
    uses_position = True  # the heads' rows depend on the call's position

    @classmethod
    def example_cases(cls) -> dict:
        return {"parallel draft K=2": cls(2)}

    def __post_init__(self):
        _checks.check_static_int("lookahead", self.lookahead)
        # Unflattening may pass placeholders for the leaves; refuse only what is plainly wrong
        # here, the rest in validate (before any work).
        if isinstance(self.rule, (numbers.Number, str, bytes)) or (
                callable(self.rule) and not isinstance(self.rule, TokenwiseDecoder)):
            _refuse_rule(self.rule)

    def validate(self) -> None:
        if not isinstance(self.rule, TokenwiseDecoder):
            _refuse_rule(self.rule)
        rule = self.rule
        if rule.num_drafts != 1 or not rule.same_root or rule.binds_models:
            raise ValueError(
                f"rule must verify one draft per step with the same law at every depth; "
                f"{type(rule).__name__} (num_drafts={rule.num_drafts}) does not")
        if rule.lookahead is not None:
            raise ValueError(
                f"rule: give the rule without a lookahead (ParallelDraft's lookahead sets K), "
                f"got {rule!r}")
        rule.validate()
        if self.heads is not None:
            shape = jnp.shape(self.heads)
            if len(shape) != 4 or shape[0] != self.lookahead or shape[-1] != shape[-2]:
                raise ValueError(
                    f"heads must be None or an array (K, T, V, V) with K = lookahead = "
                    f"{self.lookahead}, got shape {shape}")
            _checks.check_probabilities("heads", self.heads)

    def probe(self, draft, target, kind: str) -> None:
        if self.heads is not None and tuple(self.heads.shape[1:]) != tuple(target.trans.shape):
            raise ValueError(
                f"heads must have shape (K, T, V, V) = ({self.lookahead}, "
                f"{', '.join(map(str, target.trans.shape))}) for these models, got "
                f"{tuple(self.heads.shape)}")
        self.rule.probe(draft, target, kind)

    @property
    def label(self) -> str:
        what = "marginals" if self.heads is None else "heads"
        rule = "" if isinstance(self.rule, Speculative) else f", {self.rule.label}"
        return f"parallel draft ({what}{rule}), K = {self.lookahead}"

    @property
    def num_uniforms(self) -> int:
        return 2 * self.lookahead + 1

    def truncate(self, lookahead: int) -> "ParallelDraft":
        if lookahead == self.lookahead:
            return self
        heads = None if self.heads is None else self.heads[:lookahead]
        return dataclasses.replace(self, lookahead=lookahead, heads=heads)

    def call_work(self, depth: int) -> tuple[int, int]:
        """One draft pass drafts the whole block (the point of a parallel drafter); the target
        scores the root and ``depth`` drafts."""
        return 1, depth + 1

    def _steps(self, heads, q):
        """The rule's in-call law of each depth: draft rows ``heads``, target rows ``q``."""
        return self.rule.laws(heads, q)[1]

    def prepare(self, draft, target):
        k = self.lookahead
        heads = marginal_heads(draft.trans, k) if self.heads is None else self.heads
        heads = heads.astype(jnp.result_type(heads.dtype, target.trans.dtype))
        return heads, categorical_thresholds(heads), target.trans

    def sample_call(self, tables, n, prev, u):
        """One call of one chain from position ``n`` after ``prev``: ``u`` holds ``2K + 1``
        uniforms (the drafts, their tests, the last token)."""
        heads, thresholds, q_trans = tables
        horizon = q_trans.shape[0]
        k = self.lookahead
        start = jnp.clip(n - 1, 0, horizon - 1)
        steps = jnp.arange(k, dtype=jnp.int32)
        rows = jnp.clip(n - 1 + steps, 0, horizon - 1)  # draft i + 1 sits at position n + i
        drafts = jax.vmap(draw)(thresholds[steps, start, prev], u[:k])  # independent given prev
        parents = jnp.concatenate([prev[None], drafts[:-1]])
        m_rows = heads[steps, start, prev]  # (K, V): the law each draft was drawn from
        law = self._steps(m_rows, q_trans[rows, parents])
        drafted = m_rows[steps, drafts]
        keep = bernoulli(jnp.clip(safe_ratio(law.accepted[steps, drafts], drafted, 1), 0, 1),
                         u[k:2 * k])
        fits = jnp.clip(horizon - n + 1, 0, k)  # K' drafts before the horizon
        tau = jnp.min(jnp.where(keep & (steps < fits), k, steps))  # the first rejection
        rejected = tau < fits
        tau = jnp.minimum(tau, fits)
        bonus = q_trans[jnp.clip(n - 1 + k, 0, horizon - 1), drafts[k - 1]]
        at = jnp.minimum(tau, k - 1)
        residual = mass_or_target(law.rejected[at], q_trans[rows[at], parents[at]])
        last = jnp.where(rejected, residual, bonus)
        y = draw(categorical_thresholds(last), u[2 * k])
        emitted = jnp.concatenate([drafts, y[None]]).at[tau].set(y)
        return emitted, tau, rejected

    def _call_heads(self, p_rows, position):
        """``(K', V, V)``: the depth laws of a call at ``position`` (1-based)."""
        k = p_rows.shape[0]
        if self.heads is None:
            heads = [p_rows[0]]
            for i in range(1, k):
                heads.append(jnp.matmul(heads[-1], p_rows[i], precision=HIGHEST))
            return jnp.stack(heads)
        rows = jax.lax.dynamic_index_in_dim(self.heads, position - 1, axis=1, keepdims=False)
        return rows[:k]

    def call_law(self, p_rows, q_rows, bonus_row, *, with_bonus: bool, position) -> CallLaw:
        """The law of one call by a forward pass over (previous token, last kept draft).

        Args:
          p_rows: ``(K', V, V)`` draft rows of the call's positions.
          q_rows: ``(K', V, V)`` target rows of the same positions.
          bonus_row: ``(V, V)`` target row of the position after the block (unused without
            bonus).
          with_bonus: whether that position exists (static).
          position: the call's 1-based position ``n`` (traced).
        """
        k, num_states, _ = q_rows.shape
        heads = self._call_heads(p_rows, position)
        dtype = jnp.result_type(heads.dtype, q_rows.dtype)
        prefix = jnp.eye(num_states, dtype=dtype)  # [a, y]: P(all kept so far, last is y | a)
        kept, rejected = [], []
        for i in range(k):
            # law[a, y, x]: draft row m_{i+1}(. | a), target row q_{i+1}(. | y).
            law = self._steps(heads[i][:, None, :], q_rows[i][None, :, :])
            kept.append(jnp.einsum("ay,ayx->ax", prefix, law.accepted, precision=HIGHEST))
            rejected.append(jnp.einsum("ay,ayx->ax", prefix, law.rejected, precision=HIGHEST))
            prefix = kept[-1]
        zeros = jnp.zeros((num_states, num_states), dtype)
        last = jnp.matmul(prefix, bonus_row, precision=HIGHEST) if with_bonus else zeros
        return CallLaw(kept=jnp.stack(kept), rejected=jnp.stack(rejected + [zeros]),
                       bonus=jnp.stack([zeros] * k + [last]))

    def call_law_from(self, start, p_rows, q_rows, bonus_row, *, with_bonus: bool,
                      position) -> CallLaw:
        """``call_law`` contracted with the previous token's law ``start`` (the heads depend
        on it, so the forward pass keeps its axis)."""
        law = self.call_law(p_rows, q_rows, bonus_row, with_bonus=with_bonus, position=position)
        return CallLaw(*(jnp.einsum("a,iay->iy", start, x, precision=HIGHEST) for x in law))
