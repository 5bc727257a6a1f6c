"""The stopping policies of adaptive drafting (``specjax.AdaptiveSpeculative``), served from
``specjax.decoders.adaptive``: a policy decides, from what the draft knows before each draft
(``DraftState``), whether to call the target now.

Besides ``stop(state)``, a policy declares what an estimate from target rollouts needs of it
(``specjax.pairs.adaptive``): ``reads_draft_rows`` (default ``True``: a user's rule may read the
draft's next row, so the recording must hold the rows; ``False`` for the policies that read only
the drafted tokens' probabilities), ``fixed_length`` (``FixedLength``'s length: the draft length
is then set when a call starts; ``None`` by default) and ``vocabulary_size`` (a table's ``V``,
checked against a recording without rows; ``None`` by default).
"""

from __future__ import annotations

from typing import Any
from typing import Callable
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax.decoders.base import array_field
from specjax.decoders.base import pytree_dataclass
from specjax.decoders.draft_state import DraftState

__all__ = ["ConfidenceThreshold", "EntropyThreshold", "FixedLength", "POLICIES",
           "RejectionThreshold", "StoppingPolicy", "StoppingRule", "ThresholdTable"]


class StoppingPolicy:
    """Base class of stopping policies: ``stop(state) -> bool array`` (``True``: call the target
    now, with the drafts so far)."""

    #: Whether ``stop`` may read the draft's next row (``next_entropy``, ``next_max_prob``): an
    #: estimate from target rollouts then needs the rows, not only the tokens' probabilities.
    reads_draft_rows: ClassVar[bool] = True

    def stop(self, state: DraftState):
        raise NotImplementedError

    @property
    def fixed_length(self) -> int | None:
        """The draft length when the policy sets it before a call starts (``FixedLength``)."""
        return None

    @property
    def vocabulary_size(self) -> int | None:
        """The number of tokens the policy is written for (a table's ``V``), if any."""
        return None

    def validate(self) -> None:
        """Raise ``ValueError`` on bad numeric settings (checked before any work when
        concrete)."""

    def check_shapes(self, horizon: int, lookahead: int, num_states: int) -> None:
        """Raise ``ValueError`` when the policy does not fit ``T`` positions, calls of at most
        ``lookahead`` (``min(K, T)``) drafts and ``V`` tokens (static shapes: checked while
        tracing, before any work)."""
        del horizon, lookahead, num_states

    def stationary_form(self) -> "StoppingPolicy":
        """The policy as a call at position 1 reads it, for the long run on a stationary chain
        (``CallDecoder.stationary_form``): itself, unless it holds a table by position."""
        return self

    @property
    def label(self) -> str:
        return repr(self)


def _check_threshold(name: str, value, low: float, high: float | None) -> None:
    if isinstance(value, (str, bytes, bool)) or value is None:
        raise ValueError(f"{name} must be a number, got {value!r}")
    if isinstance(value, jax.core.Tracer):
        return
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if array.shape != ():
        raise ValueError(f"{name} must be a scalar, got shape {array.shape}")
    number = float(array)
    if not (np.isfinite(number) and number >= low and (high is None or number <= high)):
        bound = f"in [{low:g}, {high:g}]" if high is not None else f">= {low:g}"
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")


def _number_label(value) -> str:
    return f"{float(value):g}" if _checks.is_concrete(value) else "traced"


@pytree_dataclass
class FixedLength(StoppingPolicy):
    """Draft ``length`` tokens (fewer at ``max_lookahead`` or the horizon): SD with lookahead
    ``length``."""

    length: int

    def __post_init__(self):
        _checks.check_static_int("length", self.length)

    reads_draft_rows = False

    @property
    def fixed_length(self) -> int:
        return self.length

    def stop(self, state):
        return state.depth >= self.length

    @property
    def label(self) -> str:
        return f"fixed K = {self.length}"


@pytree_dataclass
class RejectionThreshold(StoppingPolicy):
    """SpecDec++: stop once ``1 - A_i`` (the probability that some draft so far is rejected)
    exceeds ``threshold`` (a leaf in ``[0, 1]``: sweep it under ``jax.vmap`` or reuse one
    compilation for many values)."""

    threshold: Any = array_field()
    reads_draft_rows = False

    def validate(self):
        _check_threshold("threshold", self.threshold, 0.0, 1.0)

    def stop(self, state):
        return (state.depth > 0) & (1 - state.all_accepted > self.threshold)

    @property
    def label(self) -> str:
        return f"SpecDec++ (1 - A > {_number_label(self.threshold)})"


@pytree_dataclass
class EntropyThreshold(StoppingPolicy):
    """Stop when the entropy (nats) of the draft's next row exceeds ``threshold`` (a leaf
    ``>= 0``), after at least one draft."""

    threshold: Any = array_field()

    def validate(self):
        _check_threshold("threshold", self.threshold, 0.0, None)

    def stop(self, state):
        return (state.depth > 0) & (state.next_entropy > self.threshold)

    @property
    def label(self) -> str:
        return f"entropy > {_number_label(self.threshold)}"


@pytree_dataclass
class ConfidenceThreshold(StoppingPolicy):
    """Stop when the last drafted token's draft probability is below ``threshold`` (a leaf in
    ``[0, 1]``), after at least one draft."""

    threshold: Any = array_field()
    reads_draft_rows = False

    def validate(self):
        _check_threshold("threshold", self.threshold, 0.0, 1.0)

    def stop(self, state):
        return (state.depth > 0) & (state.token_prob < self.threshold)

    @property
    def label(self) -> str:
        return f"confidence < {_number_label(self.threshold)}"


@pytree_dataclass
class StoppingRule(StoppingPolicy):
    """A user's policy: ``fn(state: DraftState) -> bool array`` broadcasting against the
    state's fields (``True``: stop). ``fn`` is static (hashed by identity: define it once)."""

    fn: Callable
    name: str = "user rule"

    def __post_init__(self):
        if not callable(self.fn):
            raise ValueError(f"fn must be a function of a DraftState, got {self.fn!r}")

    def stop(self, state):
        flags = jnp.asarray(self.fn(state))
        if flags.dtype != jnp.bool_:  # a dtype is static: refused while tracing
            raise ValueError(f"fn ({self.name}) must return boolean stop flags (True: stop), "
                             f"got dtype {flags.dtype}; compare, e.g. state.token_prob < 0.3")
        return flags

    @property
    def label(self) -> str:
        return self.name


@pytree_dataclass
class ThresholdTable(StoppingPolicy):
    """Stop iff ``A_i <= thresholds[n - 1, i, x]`` for a call started at position ``n`` after
    ``i`` drafts whose last token is ``x``: ``thresholds`` ``(T, K + 1, V)``, a leaf (the optimal
    policy of ``specjax.theory.optimal_stopping`` has this form)."""

    thresholds: Any = array_field()
    reads_draft_rows = False

    @property
    def vocabulary_size(self) -> int:
        return int(np.shape(self.thresholds)[-1])

    def validate(self):
        if np.ndim(self.thresholds) != 3:
            raise ValueError(f"thresholds must have shape (T, K + 1, V), got shape "
                             f"{np.shape(self.thresholds)}")

    def check_shapes(self, horizon, lookahead, num_states):
        expected = (horizon, lookahead + 1, num_states)
        if tuple(np.shape(self.thresholds)) != expected:
            raise ValueError(f"thresholds must have shape (T, K + 1, V) = {expected} for these "
                             f"models (K = min(max_lookahead, T)), got shape "
                             f"{tuple(np.shape(self.thresholds))}")

    def stop(self, state):
        table = jnp.asarray(self.thresholds)
        start = jnp.clip(state.position - state.depth - 1, 0, table.shape[0] - 1)
        depth = jnp.clip(state.depth, 0, table.shape[1] - 1)
        return state.all_accepted <= table[start, depth, state.token]

    def stationary_form(self) -> "ThresholdTable":
        """The first row alone (one program for the chains of every horizon), refused unless
        every row is the same: the long run has no position."""
        table = np.asarray(self.thresholds)
        if not np.array_equal(table, np.broadcast_to(table[:1], table.shape)):
            raise ValueError("decoder: its ThresholdTable's rows differ from position to position, "
                             "and the long run has no position; give the same row at every "
                             "position")
        return ThresholdTable(jax.device_put(table[:1]))

    @property
    def label(self) -> str:
        return "threshold table"


POLICIES = (FixedLength, RejectionThreshold, EntropyThreshold, ConfidenceThreshold,
            StoppingRule, ThresholdTable)
