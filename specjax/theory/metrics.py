"""The acceptance metrics serving engines report, exactly.

Engines count, over a run, the speculation rounds (target calls), the drafted tokens and, per
draft position ``i``, the rounds whose ``i``-th draft was accepted. Their metrics are ratios of
those counts; over many chains they converge to ratios of expectations, which
``engine_metrics`` computes exactly:

* ``acceptance_per_position[i - 1] = E[# calls whose i-th draft is accepted] / E[# calls]``:
  vLLM's per-position acceptance rate (``num_accepted_tokens_per_pos[i] / num_drafts``), which
  is unconditional;
* ``conditional_acceptance[i - 1]``: the same count over the calls whose ``(i - 1)``-th draft was
  accepted, the rate a per-token acceptance model (Leviathan's ``a``) describes;
* ``mean_acceptance_length = 1 + E[accepted drafts] / E[# calls]``: vLLM's "mean acceptance
  length", the bonus or correction token counted;
* ``draft_acceptance_rate = E[accepted drafts] / E[drafted tokens]``: vLLM's "draft acceptance
  rate" and llama.cpp's ``n_accept / n_draft``; a call drafts the tokens its target call scores
  but the root (``call_work``), so ``M K`` for ``M`` draft sequences and the nodes of a tree.

For a tree, the ``i``-th draft of a call is the node at depth ``i`` on the accepted path. Calls
near the end of the horizon draft fewer tokens and are counted like the others (engines count
rounds, whatever they drafted).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax.decoders.base import CallDecoder
from specjax.decoders.base import check_decoder
from specjax.decoders.planning import plan_run
from specjax.models.markov import MarkovChain
from specjax.numerics import safe_ratio
from specjax.theory import calls
from specjax.theory import recursion
from specjax.theory.cost import call_works
from specjax.theory.cost import depth_works
from specjax.theory.values import exact

__all__ = ["EngineMetrics", "engine_metrics"]


class EngineMetrics(NamedTuple):
    """Engines' acceptance metrics as exact ratios of expectations (see the module docstring).

    Attributes:
      expected_calls: ``E[# calls]`` (speculation rounds).
      expected_drafted: ``E[# drafted tokens]``.
      accepted_at: ``(K,)``, ``E[# calls whose i-th draft is accepted]``, ``i = 1..K``.
      acceptance_per_position: ``(K,)``, ``accepted_at / expected_calls``.
      conditional_acceptance: ``(K,)``, ``accepted_at[i] / accepted_at[i - 1]`` (the first over
        ``expected_calls``; 0 where nothing reaches draft ``i - 1``).
      mean_acceptance_length: ``1 + sum(accepted_at) / expected_calls``.
      draft_acceptance_rate: ``sum(accepted_at) / expected_drafted`` (0 without drafts).
    """

    expected_calls: jax.Array
    expected_drafted: jax.Array
    accepted_at: jax.Array
    acceptance_per_position: jax.Array
    conditional_acceptance: jax.Array
    mean_acceptance_length: jax.Array
    draft_acceptance_rate: jax.Array


def engine_metrics(decoder, draft, target) -> EngineMetrics:
    """The acceptance metrics serving engines report (vLLM, llama.cpp), exactly, for any decoder on
    ``MarkovChain``s.

    Args:
      decoder: any decoder value.
      draft: the draft ``MarkovChain`` (``None`` for ``Autoregressive()``).
      target: the target ``MarkovChain``.

    Returns:
      ``EngineMetrics``; its arrays have ``K = min(lookahead, T)`` entries per draft position (a
      tree's depth; none for autoregressive decoding). Differentiable in the models.

    Raises:
      ValueError: what ``exact`` raises, or models that are not ``MarkovChain``s.

    Example:
      >>> import specjax
      >>> draft, target = specjax.paper_instance()
      >>> m = specjax.theory.engine_metrics(specjax.Speculative(lookahead=3), draft, target)
      >>> print(*[round(float(x), 3) for x in m.acceptance_per_position])
      0.546 0.292 0.156
      >>> round(float(m.mean_acceptance_length), 3)
      1.994
    """
    check_decoder(decoder)
    if not isinstance(target, MarkovChain) or not isinstance(draft, (MarkovChain, type(None))):
        raise ValueError(f"engine_metrics needs MarkovChain models, got {type(draft).__name__} "
                         f"and {type(target).__name__}")
    decoder, draft, target, _, horizon, lookahead = plan_run(
        decoder, draft, target, engine="exact")
    _, scored = call_works(decoder, horizon, lookahead)
    drafted = []  # for a random draft length (adaptive): [(T, K + 1)], the number drafted
    if isinstance(decoder, CallDecoder):
        result, depths, *drafted = calls.forward_calls(
            decoder, draft, target, lookahead=lookahead, with_depths=True,
            with_drafted=decoder.has_drafted_call_law)
        new_call = result.new_call
    else:
        new_call = exact(decoder, draft, target).new_call
        depths = recursion.accepted_by_depth(target.init, draft.trans, target.trans, decoder,
                                             lookahead=lookahead)
    dtype = new_call.dtype
    # The drafts per call on the host, in the models' dtype: jnp.asarray would compile a
    # conversion per shape.
    if drafted:
        drafts = depth_works(decoder, lookahead)[1] - 1  # tokens scored but the root
        return _summary(new_call, depths, drafted[0], np.asarray(drafts, dtype))
    return _summary(new_call, depths, None, np.asarray(scored - 1, dtype))


@jax.jit  # one program, not one per operation
def _summary(new_call, depths, drafted, drafts):
    """``engine_metrics`` from the call law: ``drafts`` the tokens drafted by a call of each
    depth (``drafted`` ``(T, K + 1)``, a random draft length's law) or at each position
    (``drafted`` ``None``)."""
    accepted_at = jnp.sum(depths, axis=0).astype(new_call.dtype)
    expected_calls = jnp.sum(new_call)
    if drafted is not None:
        expected_drafted = jnp.sum(drafted @ drafts)
    else:
        expected_drafted = jnp.sum(new_call * drafts)
    accepted = jnp.sum(accepted_at)
    reached = jnp.concatenate([expected_calls[None], accepted_at[:-1]])
    return EngineMetrics(
        expected_calls=expected_calls,
        expected_drafted=expected_drafted,
        accepted_at=accepted_at,
        acceptance_per_position=accepted_at / expected_calls,
        conditional_acceptance=safe_ratio(accepted_at, reached, 0),
        mean_acceptance_length=1 + accepted / expected_calls,
        draft_acceptance_rate=safe_ratio(accepted, expected_drafted, 0))
