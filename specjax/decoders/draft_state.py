"""What a stopping policy of adaptive drafting sees (``DraftState``), and the draft row's
entropy it may read; served from ``specjax.decoders.adaptive``."""

from __future__ import annotations

from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp

__all__ = ["DraftState", "entropy"]


class DraftState(NamedTuple):
    """What a stopping policy sees before it decides whether to draft the next token.

    Every field broadcasts against the others (the exact law evaluates a policy on every drafted
    path at once, the sampler on one chain's scalars).

    Attributes:
      position: ``n + i``, the position the next draft would fill (1-based) for a call that
        started at ``n``.
      depth: ``i``, the tokens drafted so far in this call (0 before the first).
      token: the last drafted token (the call's previous token at depth 0).
      token_prob: its draft probability ``p(x | previous)`` (1 at depth 0).
      all_accepted: ``A_i``, the probability that every draft so far will be accepted
        (``prod min(1, q / p)``; 1 at depth 0).
      next_entropy: the entropy (nats) of the draft's row for the next token.
      next_max_prob: the largest probability in that row.
    """

    position: Any
    depth: Any
    token: Any
    token_prob: Any
    all_accepted: Any
    next_entropy: Any
    next_max_prob: Any


def entropy(rows: jax.Array) -> jax.Array:
    """Entropy in nats over the last axis; ``0 log 0 = 0`` with finite gradients."""
    positive = rows > 0
    logs = jnp.log(jnp.where(positive, rows, jnp.ones_like(rows)))
    return -jnp.sum(jnp.where(positive, rows * logs, 0), axis=-1)
