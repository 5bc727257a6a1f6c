"""Static settings read before any work: end-of-sequence ids (``check_stop_tokens``,
``stop_mask``) and flags (``check_bool``); served from ``specjax._checks`` too."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["check_bool", "check_stop_tokens", "stop_mask"]


def check_stop_tokens(stop_tokens, num_states: int) -> tuple:
    """``stop_tokens`` of a run (``decode``, ``exact``): ``None``, an id or a sequence of ids in
    ``[0, V)``, as a sorted tuple of Python ints (empty for none). They are static: they select
    the compiled program. A traced array is refused with a message that says so; a concrete
    array is read."""
    if stop_tokens is None:
        return ()
    if isinstance(stop_tokens, (set, frozenset)):
        stop_tokens = sorted(stop_tokens)
    if any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(stop_tokens)):
        raise ValueError(
            "stop_tokens is a static setting (token ids fixed when the run is compiled), got a "
            "traced value; pass Python ints, a list or a concrete array")
    ids = np.asarray(stop_tokens)
    if ids.ndim > 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)) \
            or isinstance(stop_tokens, (bool, np.bool_)):
        raise ValueError(f"stop_tokens must be token ids (an int or a sequence of ints), got "
                         f"{stop_tokens!r}")
    ids = ids.reshape(-1)
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= num_states):
        raise ValueError(f"stop_tokens must be ids in [0, V) = [0, {num_states}), got "
                         f"{ids.tolist()}")
    return tuple(sorted({int(i) for i in ids}))


def stop_mask(stop_tokens: tuple, num_states: int, dtype=bool):
    """``(V,)`` mask of ``dtype`` (bool, or 0/1 floats for the exact recursions) at the stop
    tokens of ``check_stop_tokens``, or ``None`` without any (static: no stop, no work)."""
    if not stop_tokens:
        return None
    mask = jnp.zeros((num_states,), dtype)
    return mask.at[jnp.asarray(stop_tokens, jnp.int32)].set(jnp.ones((), dtype))


def check_bool(name: str, value) -> None:
    """Raise ``ValueError`` unless ``value`` is ``True`` or ``False`` (a Python or NumPy bool): a
    string such as ``"no"`` is truthy, and reading it as true would be silent."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r}"[:300])
