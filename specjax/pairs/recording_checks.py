"""The checks of what a recording is built from (``specjax.pairs.recording``): sizes, token ids,
weights, ragged lengths and the recorded tokens' target probabilities.

**What every constructor checks.** At least one sequence and one position; tokens in ``[0, V)``
(int32 ids); probabilities in ``[0, 1]``; a *positive* target probability of every recorded token
of a sequence of positive weight (target rollouts emit only tokens the target can emit: a zero is
the mark of a dump misaligned by a position, or of the wrong model's rows); weights finite,
non-negative, not all zero, stored divided by their largest (the estimates are weighted means,
which do not depend on the weights' scale; this keeps float32 sums from overflowing or
underflowing).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks

__all__ = ["check_lengths", "check_recorded_tokens", "check_sizes", "check_tokens",
           "check_weights", "stop_lengths"]


def check_lengths(tokens, lengths, eos, num: int, horizon: int):
    """``(tokens, lengths, live)``: ``lengths`` ``(B,)`` int32 (read off ``eos`` when given) and
    ``live`` ``(B, T)`` bool (``t < lengths[b]``), with the tokens' padding set to 0; or the
    tokens as given and ``(None, None)`` when neither is given."""
    if lengths is None and eos is None:
        return tokens, None, None
    if lengths is not None and eos is not None:
        raise ValueError("lengths and eos: give one of them (eos reads the lengths off the "
                         "tokens)")
    tokens = np.array(tokens)  # a copy: its padding is overwritten
    if not np.issubdtype(tokens.dtype, np.integer) or tokens.shape != (num, horizon + 1):
        raise ValueError(f"tokens must be integers of shape (B, T + 1) = ({num}, "
                         f"{horizon + 1}), got {tokens.shape} {tokens.dtype}")
    if eos is not None:
        _checks.check_static_non_negative_int("eos", eos)
        lengths = stop_lengths(tokens, (eos,))
    else:
        if isinstance(lengths, jax.core.Tracer):
            raise ValueError("lengths must be concrete (it sets which entries are read)")
        lengths = np.asarray(lengths)
        if lengths.shape != (num,) or not np.issubdtype(lengths.dtype, np.integer):
            raise ValueError(f"lengths must be ints of shape (B,) = ({num},), got "
                             f"{lengths.shape} {lengths.dtype}")
        if (lengths < 1).any() or (lengths > horizon).any():
            raise ValueError(f"lengths must lie in [1, T] = [1, {horizon}] (emitted tokens per "
                             f"sequence), got {int(lengths.min())} .. {int(lengths.max())}")
    live = np.arange(horizon)[None] < lengths[:, None]
    tokens[:, 1:] = np.where(live, tokens[:, 1:], 0)
    return tokens, jnp.asarray(lengths, jnp.int32), live


def check_sizes(names: str, num: int, horizon: int) -> None:
    """Refuse a recording without sequences or positions (its estimates would be NaN)."""
    if num == 0:
        raise ValueError(f"{names} hold no sequences (B = 0): a recording needs at least one")
    if horizon == 0:
        raise ValueError(f"{names} hold no positions (T = 0): a recording needs at least one "
                         f"emitted token per sequence")


def check_recorded_tokens(name: str, target_prob, weights) -> None:
    """Refuse a target probability 0 of a recorded token (in a sequence of positive weight)."""
    if not _checks.is_concrete(target_prob):
        return
    if isinstance(target_prob, jax.Array) and not target_prob.is_fully_addressable:
        # Under jax.distributed (record's global arrays, no weights): each process checks the
        # sequences it holds.
        zero = np.concatenate([np.asarray(shard.data).reshape(-1, target_prob.shape[1]) <= 0
                               for shard in target_prob.addressable_shards])
    else:
        zero = np.asarray(target_prob) <= 0
    if weights is not None:
        zero &= np.asarray(weights)[:, None] > 0
    if zero.any():
        b, t = (int(i) for i in np.argwhere(zero)[0])
        raise ValueError(
            f"{name}: the target gives the recorded token of sequence {b} at position t = "
            f"{t + 1} probability 0 ({int(zero.sum())} such tokens in all), but target rollouts "
            f"emit only tokens the target can emit: is the dump misaligned by one position (the "
            f"row at index t - 1 must be the law of x_t given x_0..x_(t-1)), or the rows "
            f"another model's?")


def check_tokens(tokens, num: int, horizon: int, num_states: int | None):
    tokens = np.asarray(tokens)
    if not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"tokens must be integers, got dtype {tokens.dtype}")
    if tokens.shape != (num, horizon + 1):
        raise ValueError(f"tokens must have shape (B, T + 1) = ({num}, {horizon + 1}) (x_0..x_T "
                         f"of each sequence), got {tokens.shape}")
    if (tokens < 0).any() or (num_states is not None and (tokens >= num_states).any()):
        raise ValueError("tokens must lie in [0, V)"
                         + ("" if num_states is None else f" = [0, {num_states})"))
    if tokens.size and tokens.max() > np.iinfo(np.int32).max:
        raise ValueError(f"tokens must be int32 ids, below 2**31, got {int(tokens.max())}")
    return jnp.asarray(tokens, jnp.int32)


def check_weights(weights, num: int):
    if weights is None:
        return None
    w = np.asarray(weights)  # on the host: a float64 1e300 stays finite here
    if w.shape != (num,) or not np.issubdtype(w.dtype, np.floating):
        raise ValueError(f"weights must be a float array of shape (B,) = ({num},), got "
                         f"{w.shape} {w.dtype}")
    values = w.astype(np.float64)
    if not np.isfinite(values).all() or (values < 0).any():
        raise ValueError("weights must be finite and non-negative")
    if values.max() <= 0:
        raise ValueError("weights must not all be zero")
    # Divided by the largest (module docstring): the estimates do not depend on the scale, and
    # the float32 sums of weights of 1e37 or 1e-44 neither overflow nor underflow.
    return _checks.device_array(values / values.max()).astype(
        jax.dtypes.canonicalize_dtype(w.dtype))


def stop_lengths(tokens: np.ndarray, stop_tokens) -> np.ndarray:
    """``(B,)``: the position of each sequence's first stop token among ``x_1..x_T`` (``T``
    where there is none)."""
    hit = np.isin(tokens[:, 1:], np.asarray(stop_tokens))
    return np.where(hit.any(axis=1), np.argmax(hit, axis=1) + 1, tokens.shape[1] - 1)
