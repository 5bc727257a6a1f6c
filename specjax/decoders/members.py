"""How the decoder protocol's members are declared (``specjax.decoders.base`` serves these names).

* ``FieldDefault``: a member's default that a decoder may also declare as a dataclass field
  (``lookahead``, ``num_drafts``);
* ``flag_defined_hooks``: a capability flag set on a class that defines the hook giving it (a
  decoder that writes ``acceptance`` has ``has_acceptance``);
* ``check_lookahead``: the check of the ``lookahead`` member's value (a static int or ``None``);
* ``CallLaw`` and ``DepthPlan``: what the call-level hooks ``call_law`` and ``depth_plan`` return.
"""

from __future__ import annotations

from typing import Any
from typing import NamedTuple

import jax

from specjax import _checks

__all__ = ["CallLaw", "DepthPlan", "FieldDefault", "check_lookahead", "flag_defined_hooks"]


class FieldDefault:
    """A protocol member's default that a decoder may also declare as a dataclass field.

    Read on an instance, it is ``value``; read on the class it raises ``AttributeError``, which
    is how ``dataclasses`` learns that the member gives no default to a subclass's field of the
    same name (``BatchSpeculative``'s ``num_drafts: int`` stays a required argument,
    ``Speculative``'s ``lookahead: int | None = None`` keeps its own default).
    """

    def __init__(self, value):
        self.value = value
        self.name = ""

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, obj, owner=None):
        if obj is None:
            raise AttributeError(f"{self.name} (a protocol default, read on instances)")
        return self.value


def flag_defined_hooks(cls, hooks: dict) -> None:
    """Sets ``cls``'s capability flag of every hook ``cls`` defines itself, unless ``cls`` sets
    the flag: a user's decoder that writes ``acceptance`` has acceptance probabilities."""
    for hook, flag in hooks.items():
        if hook in cls.__dict__ and flag not in cls.__dict__:
            setattr(cls, flag, True)


def check_lookahead(lookahead, *, allow_none: bool = True) -> None:
    """``lookahead`` is a static positive int (or ``None``): refuse a traced or array value with
    a hint, as for every static setting."""
    _checks.check_static_int("lookahead", lookahead, allow_none=allow_none)


class CallLaw(NamedTuple):
    """The exact law of one call of a call-level decoder, for every previous token ``a``.

    A call from position ``n`` keeps ``i`` drafts (``x_n .. x_{n+i-1}``) and emits one last token
    at ``n + i``, drawn after a rejection or as the target's bonus token.

    Attributes:
      kept: ``[i, a, x]`` = P(the call keeps at least ``i + 1`` drafts and draft ``i + 1`` is x).
      rejected: ``[i, a, y]`` = P(the call keeps exactly ``i`` drafts, then ``y`` after a
        rejection).
      bonus: ``[i, a, y]`` = P(the call keeps exactly ``i`` drafts, then ``y`` as a bonus token).
        The rows of ``bonus`` at ``i = K'`` may sum to less than ``P(keep all)`` when the call
        reaches the end of the horizon: the sequence then ends.
    """

    kept: jax.Array  # shape=(K', V, V)
    rejected: jax.Array  # shape=(K' + 1, V, V)
    bonus: jax.Array  # shape=(K' + 1, V, V)


class DepthPlan(NamedTuple):
    """How a call-level decoder whose every choice is read on the emitted path goes through a
    sequence (``CallDecoder.depth_plan``): the static facts of the call-depth filter that
    estimates it from target rollouts (``specjax.pairs.adaptive``), and its stopping policy.

    Attributes:
      lookahead: ``K' = min(K, T)``, the deepest a call goes.
      caps: per call state, the depth at which a call stops for sure.
      up, down: per call state, the state after a call that kept every draft, after a rejection.
      initial: the first call's state.
      drafts: ``(T, S)`` nested tuples, the tokens a call at position ``n`` in state ``s``
        drafts when that is set at the call's start; ``None`` when a policy decides it.
      first_only: ``K' = 1`` with a policy: a call drafts one token unless it stops at depth 0.
      policy: the stopping policy asked before each draft (a ``StoppingPolicy`` value, a pytree
        with its leaves), or ``None`` (the depth is the call state's cap).
    """

    lookahead: int
    caps: tuple
    up: tuple
    down: tuple
    initial: int
    drafts: tuple | None
    first_only: bool
    policy: Any = None

    @property
    def static(self) -> "DepthPlan":
        """The plan without its policy: hashable, a compilation's key."""
        return self._replace(policy=None)

    @property
    def drafts_known(self) -> bool:
        """Whether a call's drafted tokens are set when it starts (or by its first decision)."""
        return self.drafts is not None or self.first_only
