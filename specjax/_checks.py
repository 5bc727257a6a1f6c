"""Argument validation shared by every public entry point.

Checks on shapes and Python settings always run. Checks on *values* (negative, NaN, rows not
summing to one) need concrete arrays: they run when the arrays are concrete (the usual case of a
call from Python) and are skipped when the arrays are tracers, i.e. when the caller wraps a
specjax function in their own ``jax.jit``/``vmap``/``grad``. Under such a transformation bad
probabilities are not detected; validate once outside (``MarkovChain(...)`` does) if in doubt."""

from __future__ import annotations

import functools
import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np

from specjax._settings import check_bool
from specjax._settings import check_stop_tokens
from specjax._settings import stop_mask

__all__ = ["FUSED_CHECK_ENTRIES", "acceptance_tolerance", "array_module", "check_bool",
           "check_finite_non_negative", "check_key", "check_logits", "check_position",
           "check_positive_int", "check_probabilities", "check_rows", "check_same_shape",
           "check_scalar_leaf", "check_static_int", "check_static_non_negative_int",
           "check_stop_tokens", "device_array", "dtype_of", "host_array", "host_or_device",
           "is_concrete", "refuse_traced", "row_sum_tolerance", "stop_mask", "suspect_rows"]


def is_concrete(x) -> bool:
    """True when ``x`` holds values (not an abstract tracer)."""
    return not isinstance(x, jax.core.Tracer)


def host_array(x) -> np.ndarray:
    """``x`` as a NumPy array of the dtype ``jnp.asarray(x)`` would give it (JAX's canonical
    dtype: float64 and int64 are float32 and int32 unless ``jax_enable_x64``), without running
    anything on a device: ``jnp.asarray`` of a NumPy array compiles a program of its own for
    each new shape and dtype. For concrete arguments that are checked on the host and then
    passed to a jitted function (which takes NumPy arrays as they are)."""
    x = np.asarray(x)
    return x.astype(jax.dtypes.canonicalize_dtype(x.dtype), copy=False)


def host_or_device(x):
    """A jax array (or tracer) as it is, on its device and with its sharding; anything else
    (NumPy arrays, lists, numbers) as ``host_array(x)``: for input checks that read the
    arguments on the host anyway, where NumPy's reshapes and casts compile nothing and every
    eager ``jnp`` operation compiles a program of its own per shape."""
    return x if isinstance(x, jax.Array) else host_array(x)


def device_array(x):
    """``jnp.asarray(x)`` that compiles nothing for host data: a NumPy array or scalar goes to
    the default device with ``jax.device_put`` as ``host_array(x)`` (a copy, in JAX's canonical
    dtype), where ``jnp.asarray`` lifts it through a compiled identity program of its own for
    each new shape and dtype (in JAX 0.10). Anything else (jax arrays, tracers, Python numbers,
    which stay weakly typed, and lists) is ``jnp.asarray(x)``."""
    if isinstance(x, (np.ndarray, np.generic)) and not isinstance(x, np.ma.MaskedArray):
        return jax.device_put(host_array(x))
    return jnp.asarray(x)


def array_module(*arrays):
    """NumPy when every one of ``arrays`` is a NumPy array (``host_or_device``'s host side),
    else ``jax.numpy``."""
    return np if all(isinstance(x, np.ndarray) for x in arrays) else jnp


def dtype_of(x):
    """The dtype ``jnp.asarray(x)`` would have, without converting ``x``."""
    return x.dtype if isinstance(x, (jax.Array, np.ndarray)) else host_array(x).dtype


def row_sum_tolerance(dtype) -> float:
    """Absolute tolerance for ``sum(row) == 1`` in the given floating dtype: ``1e-9`` in
    float64, ``1e-4`` in float32, and for narrower types a tolerance the dtype can hold (4 units
    of its precision: ``3.9e-3`` in float16, ``3.1e-2`` in bfloat16, whose rows normalised in
    their own precision miss one by up to one unit)."""
    dtype = jnp.dtype(dtype)
    if dtype == jnp.float64:
        return 1e-9
    return max(1e-4, 4 * float(jnp.finfo(dtype).eps))


def check_probabilities(name: str, x, *, axis: int = -1, tolerance: float | None = None) -> None:
    """Raise ``ValueError`` unless ``x`` holds probability vectors along ``axis``.

    Value checks are skipped for tracers (see module docstring). ``tolerance`` on the row sums
    defaults to ``row_sum_tolerance(dtype)``.
    """
    if not jnp.issubdtype(dtype_of(x), jnp.floating):
        raise ValueError(f"{name} must hold floating-point probabilities, got dtype {x.dtype}")
    if not is_concrete(x):
        return
    values = np.asarray(x)
    if np.isnan(values).any():
        raise ValueError(f"{name} contains NaN probabilities")
    if np.isinf(values).any():
        raise ValueError(f"{name} contains infinite probabilities")
    if (values < 0).any():
        worst = values.min()
        raise ValueError(f"{name} contains negative probabilities (minimum {worst:.3g})")
    sums = values.sum(axis=axis, dtype=np.float64)
    err = np.abs(sums - 1.0)
    tol = row_sum_tolerance(values.dtype) if tolerance is None else tolerance
    if (err > tol).any():
        bad = np.unravel_index(np.argmax(err), err.shape)
        if values.ndim == 1:  # one law: "row ()" would say nothing
            where = f"{name} is one row of shape {values.shape} (a law over V = " \
                    f"{values.shape[-1]} tokens) and it sums to {sums[bad]:.8g}"
        else:
            where = f"{name} has shape {values.shape} (laws over its last axis, V = " \
                    f"{values.shape[-1]}) and its row {tuple(int(i) for i in bad)} sums to " \
                    f"{sums[bad]:.8g}"
        raise ValueError(f"{name} rows must sum to one (tolerance {tol:g}): {where}")


#: Probability arrays of at least this many entries are screened by one compiled program over
#: their rows (``suspect_rows``) before the exact check of the rows it flags; smaller ones are
#: checked by NumPy directly (a compiled program per shape would cost more than it saves).
FUSED_CHECK_ENTRIES = 1 << 20
#: The screen's partial sums: at most this many terms each.
_CHUNK = 128
#: On a CPU the screen gathers the rows a check reads in blocks of about this many bytes (at
#: least one row), each read from memory once and reduced twice while it is in the cache
#: (``_screen``), when they are at most ``_GATHER_FRACTION`` of an array's rows; more of them,
#: it reduces the whole array in place (two passes that read every row: at the bench's size,
#: all rows, about as fast as gathering them all, faster in two rounds of three).
_BLOCK_BYTES = 4 << 20
_GATHER_FRACTION = 0.75


def _chunk(length: int) -> int:
    """The terms of each partial sum of the screen over rows of ``length`` terms: the whole row
    up to ``_CHUNK`` terms; else the largest divisor of ``length`` from ``_CHUNK // 2`` to
    ``_CHUNK`` (``32,000 = 250 x 128``), so that the rows reshape into their chunks as they lie
    in memory; else ``_CHUNK``, the last ``length % _CHUNK`` terms summed apart (XLA copies the
    head of each row, a slice, before it reduces it)."""
    if length <= _CHUNK:
        return length
    return next((c for c in range(_CHUNK, _CHUNK // 2 - 1, -1) if length % c == 0), _CHUNK)


def _row_stats(x: jax.Array) -> tuple:
    """``(minima (...,), partial sums (..., C))`` of the rows of ``x`` (last axis): each row's
    minimum and the sums of its consecutive chunks of ``_chunk(V)`` terms, the tail apart."""
    length = x.shape[-1]
    chunk = _chunk(length)
    head = length // chunk * chunk
    parts = (x if head == length else x[..., :head]).reshape(
        *x.shape[:-1], head // chunk, chunk).sum(-1)
    if head < length:
        parts = jnp.concatenate([parts, x[..., head:].sum(-1, keepdims=True)], axis=-1)
    return jnp.min(x, axis=-1), parts


def _gathered_row_stats(rows: jax.Array, index: jax.Array, count: jax.Array, block: int,
                        dtype) -> tuple:
    """``_row_stats`` in ``dtype`` of the rows ``rows[index[:count]]`` of ``rows`` ``(n, V)``,
    by blocks of ``block`` rows gathered in a loop of ``ceil(count / block)`` steps: each block
    is copied out of memory once (and cast) and both reductions read the copy while it is in the
    cache. ``index`` has a fixed length, a multiple of ``block``, and ``count`` is traced (a new
    selection compiles nothing); the stats past the loop's last block are zeros."""
    shapes = jax.eval_shape(_row_stats, jax.ShapeDtypeStruct(index.shape + rows.shape[1:], dtype))

    def step(i, stats):
        picked = jax.lax.dynamic_slice_in_dim(index, i * block, block)
        minima, parts = _row_stats(rows.at[picked].get(mode="promise_in_bounds").astype(dtype))
        return (jax.lax.dynamic_update_slice_in_dim(stats[0], minima, i * block, 0),
                jax.lax.dynamic_update_slice_in_dim(stats[1], parts, i * block, 0))

    return jax.lax.fori_loop(0, (count + block - 1) // block, step,
                             tuple(jnp.zeros(s.shape, s.dtype) for s in shapes))


@functools.partial(jax.jit, static_argnames="blocks")
def _screen(arrays: tuple, selections: tuple | None = None, blocks: tuple | None = None) -> tuple:
    """``_row_stats`` of each array, in float32 at least (the host adds the partial sums), all
    in one program (one dispatch): of all its rows, or where its entry of ``blocks`` is a number
    (on a CPU) of the rows ``index[:count]`` of its rows flattened, ``(index, count)`` its entry
    of ``selections``, gathered by blocks of that many rows (``_gathered_row_stats``), each row
    read from memory once.

    The minima and the partial sums are two reductions of the same rows. XLA's CPU backend
    hands each plain reduction to YNNPACK, which streams the rows at memory speed, but it fuses
    no two of them into one loop: over whole arrays they read every row twice. Their one-loop
    forms run far slower on a CPU (jax 0.10.2 at the bench's size, ``B = 256``, ``K = 8``,
    ``V = 32,000``, on a loaded 2-core machine, against one plain reduction of both arrays:
    the two plain reductions 1.9 times; a variadic reduce of minima and sums, one loop in XLA's
    own emitter, 11 times; the two with YNNPACK off, 6 times; a select of the negative entries
    before a sum, 10 times). The blocks keep YNNPACK's reductions, read each row from memory
    once, and read only the rows asked for (a caller's check reads only the rows the
    computation reads). Gathering every row costs about as much as the two passes over the
    whole array (the copy, then two reductions from the cache), so ``suspect_rows`` gathers
    only where a check reads at most ``_GATHER_FRACTION`` of the rows (ragged batches: 55% of
    them at the bench's size). On accelerators, whose XLA backends fuse sibling reductions of
    the same operand into one kernel (not measured here), whole arrays are reduced at once."""
    out = []
    for i, x in enumerate(arrays):
        dtype = jnp.promote_types(x.dtype, jnp.float32)
        if blocks is None or blocks[i] is None:
            out.append(_row_stats(x.astype(dtype)))
        else:
            index, count = selections[i]
            out.append(_gathered_row_stats(x.reshape(-1, x.shape[-1]), index, count, blocks[i],
                                           dtype))
    return tuple(out)


def suspect_rows(arrays, tolerances, selected=None) -> list:
    """For each concrete array of ``arrays``, a boolean mask over its rows (last axis),
    ``True`` on every row that may fail ``check_probabilities(..., tolerance=t)`` with ``t``
    its entry of ``tolerances``, among the rows its entry of ``selected`` marks (a boolean mask
    over its rows, or ``None`` for all; the others are ``False``). One compiled program computes
    each row's minimum and partial sums (``_screen``; on a CPU it reads only the selected rows,
    each from memory once), the host adds the partial sums in float64; a row is flagged when
    its minimum is NaN or has its sign bit set (a negative entry, ``-inf``, ``-0.0``, or a
    negative subnormal, which the CPU reads as ``-0.0``) or when its sum (NaN or infinite with a
    NaN or an infinity) is not within ``t - margin`` of one, the margin bounding the rounding of
    the partial sums with room. Every failing row is flagged (a row that passes may be flagged
    too, near the tolerance): check the flagged rows exactly. One exception: a CPU reads
    subnormals as zeros of their sign, and the minimum of a row holding both a ``+0.0`` (or a
    positive subnormal) and a negative subnormal may come out ``+0.0``, so such a row may pass
    unflagged (telling the zeros apart takes an elementwise pass, several times the screen's
    cost)."""
    arrays = tuple(device_array(x) for x in arrays)
    selected = [None] * len(arrays) if selected is None else list(selected)
    picks = [np.flatnonzero(np.ones(x.shape[:-1], bool) if chosen is None
                            else np.broadcast_to(np.asarray(chosen, bool), x.shape[:-1]))
             for x, chosen in zip(arrays, selected)]
    cpu = all(d.platform == "cpu" for x in arrays for d in x.devices())
    gather = [cpu and pick.size <= _GATHER_FRACTION * math.prod(x.shape[:-1])
              for x, pick in zip(arrays, picks)]
    masks = []
    for x, tolerance, (minima, parts), pick in zip(arrays, tolerances,
                                                   _stats(arrays, picks, gather), picks):
        with np.errstate(invalid="ignore", over="ignore"):
            sums = parts.sum(-1, dtype=np.float64)
            # A partial sum of non-negative terms, c = _chunk(V) of them added in any order,
            # is off by at most (c - 1) eps/2 of itself to first order, and NumPy's float64 sum
            # of the partials by at most (their number) 2^-53 of the total: 1.5 times their sum
            # for rows summing near one (a row whose sum is far from one is flagged whatever
            # the margin).
            eps = float(jnp.finfo(jnp.promote_types(x.dtype, jnp.float32)).eps)
            margin = 1.5 * ((_chunk(x.shape[-1]) - 1) * eps
                            + parts.shape[-1] * np.finfo(np.float64).eps) / 2
            close = np.abs(sums - 1) <= tolerance - margin
        mask = np.zeros(x.shape[:-1], bool)
        mask.reshape(-1)[pick] = np.signbit(minima) | np.isnan(minima) | ~close
        masks.append(mask)
    return masks


def _selections(arrays, picks, gather) -> tuple:
    """``(selections, blocks)`` for ``_screen`` to gather the rows ``picks`` (indices into each
    array's rows flattened) of the arrays ``gather`` marks by blocks of about ``_BLOCK_BYTES``:
    the indices padded with zeros to a multiple of the block (their length fixed by the array's
    shape), and their count; ``None`` for the others (reduced whole)."""
    selections, blocks = [], []
    for x, pick, gathered in zip(arrays, picks, gather):
        if not gathered:
            selections.append(None)
            blocks.append(None)
            continue
        rows = math.prod(x.shape[:-1])
        width = max(1, x.shape[-1]) * jnp.promote_types(x.dtype, jnp.float32).itemsize
        block = max(1, min(rows, _BLOCK_BYTES // width))
        index = np.zeros(-(-rows // block) * block, np.int32)
        index[:pick.size] = pick
        selections.append((index, np.int32(pick.size)))
        blocks.append(block)
    return tuple(selections), tuple(blocks)


def _stats(arrays, picks, gather) -> list:
    """``(minima, partial sums)`` as NumPy arrays, of the rows ``picks`` of each array (indices
    into its rows flattened): ``_screen`` of the picked rows gathered by blocks for the arrays
    ``gather`` marks (on a CPU), of whole arrays then picked for the others."""
    out = []
    stats = _screen(arrays, *_selections(arrays, picks, gather))
    for (minima, parts), pick, gathered in zip(stats, picks, gather):
        if gathered:
            out.append((np.asarray(minima)[:pick.size], np.asarray(parts)[:pick.size]))
        else:
            out.append((np.asarray(minima).reshape(-1)[pick],
                        np.asarray(parts).reshape(-1, parts.shape[-1])[pick]))
    return out


def check_positive_int(name: str, value, *, allow_none: bool = False) -> None:
    """Raise ``ValueError`` unless ``value`` is a positive Python integer. Every such argument
    of specjax is a static setting (a size, a count): an array, traced or not, is refused with a
    message that says so (``check_static_int``)."""
    if value is None and allow_none:
        return
    _refuse_array(name, value)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value}")


def check_static_int(name: str, value, *, allow_none: bool = False) -> None:
    """Like ``check_positive_int``, for a *static* setting (lookahead, number of drafts): a JAX
    or NumPy array, traced or not, is refused with a message that says the setting is static."""
    check_positive_int(name, value, allow_none=allow_none)


def check_static_non_negative_int(name: str, value) -> None:
    """Like ``check_static_int``, allowing 0."""
    _refuse_array(name, value)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")


def _refuse_array(name: str, value) -> None:
    if isinstance(value, (jax.Array, np.ndarray, jax.core.Tracer)):
        raise ValueError(
            f"{name} is a static setting (a Python int fixed when the computation is compiled), "
            f"got an array {value!r}; pass a Python int (inside your own jax.jit, mark it static "
            f"with static_argnames or bind it with functools.partial)")


def check_position(position, horizon: int) -> None:
    """Raise ``ValueError`` unless ``position`` is a static Python int in ``[1, horizon]``."""
    _refuse_array("position", position)
    if isinstance(position, bool) or not isinstance(position, numbers.Integral) \
            or not 1 <= position <= horizon:
        raise ValueError(f"position must be an integer in [1, T] = [1, {horizon}], "
                         f"got {position!r}")


def check_finite_non_negative(name: str, value) -> float:
    """Returns ``float(value)``; raises ``ValueError`` unless it is a finite number >= 0 (a
    Python or NumPy number or a 0-d array; not a tracer, so only for static settings)."""
    if isinstance(value, jax.core.Tracer):
        raise ValueError(f"{name} is a static setting: pass a Python number, not a traced value "
                         f"(got {value!r}; do not pass it through jax.jit or jax.grad)")
    try:
        if value is None or isinstance(value, (bool, str)) or np.ndim(value) != 0:
            raise TypeError
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a finite non-negative number, got {value!r}") from None
    if not (math.isfinite(number) and number >= 0):
        raise ValueError(f"{name} must be a finite non-negative number, got {value!r}")
    return number


def check_scalar_leaf(name: str, value, *, low: float = 0.0, high: float = math.inf,
                      low_open: bool = False) -> None:
    """A decoder's numeric parameter that is a pytree leaf (traced and differentiated like biased
    SD's ``epsilon``): a real scalar (a number or a 0-d array, or a tracer), in ``[low, high]``
    (``(low, high]`` with ``low_open``) when concrete."""
    if isinstance(value, (str, bytes, bool)) or not (
            isinstance(value, (int, float, np.number, np.ndarray, jax.Array))
            or isinstance(value, jax.core.Tracer)):
        raise ValueError(f"{name} must be a number (a float or a 0-d array), got "
                         f"{type(value).__name__} {value!r}")
    dtype = dtype_of(value)
    if not jnp.issubdtype(dtype, jnp.number) or jnp.issubdtype(dtype, jnp.complexfloating):
        raise ValueError(f"{name} must be a real number, got dtype {dtype}")
    if jnp.shape(value) != ():
        raise ValueError(f"{name} must be a scalar, got shape {jnp.shape(value)}")
    if not is_concrete(value):
        return
    number = float(np.asarray(value))
    inside = (number > low if low_open else number >= low) and number <= high
    if not inside:
        if low == 0 and not low_open and high == math.inf:
            raise ValueError(f"{name} must be non-negative and not NaN, got {number}")
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise ValueError(f"{name} must lie in {interval}, got {number}")


def check_logits(name: str, logits) -> None:
    """Raise ``ValueError`` unless the concrete ``logits`` are finite or ``-inf`` (a zero
    probability) with a finite entry in every row; skipped for tracers."""
    if not is_concrete(logits):
        return
    values = np.asarray(logits)
    if np.isnan(values).any() or (values == np.inf).any():
        raise ValueError(f"{name} must be finite or -inf (a zero probability), got NaN or +inf")
    empty = ~np.isfinite(values).any(axis=-1)
    if empty.any():
        row = tuple(int(i) for i in np.argwhere(empty)[0])
        raise ValueError(f"{name} row {row} is all -inf (no finite logit): it gives no token a "
                         f"positive probability")


def check_key(key) -> None:
    """Raise ``ValueError`` unless ``key`` is a JAX PRNG key (typed or raw uint32[2])."""
    if isinstance(key, (numbers.Number, np.integer)):
        raise ValueError(
            f"key must be a JAX PRNG key such as jax.random.key(0), got the number {key!r}"
        )
    if not hasattr(key, "dtype"):
        raise ValueError(
            "key must be a JAX PRNG key (jax.random.key(seed) or jax.random.PRNGKey(seed)), "
            f"got {type(key).__name__} {key!r}"[:300])
    arr = key
    if jnp.issubdtype(arr.dtype, jax.dtypes.prng_key):
        if arr.shape != ():
            raise ValueError(f"key must be a single PRNG key, got a key array of shape {arr.shape}")
        return
    if arr.dtype != jnp.uint32 or arr.shape != (2,):
        raise ValueError(
            "key must be a JAX PRNG key (jax.random.key(seed) or jax.random.PRNGKey(seed)), "
            f"got an array of dtype {arr.dtype} and shape {arr.shape}"
        )


def check_same_shape(draft, target, names=("draft", "target")) -> None:
    """Raise ``ValueError`` unless draft and target (or the two chains ``names``) agree in ``V``
    and ``T``."""
    a, b = names
    if draft.num_states != target.num_states:
        raise ValueError(
            f"{a} and {b} must have the same number of states V, got "
            f"{draft.num_states} ({a}) and {target.num_states} ({b})"
        )
    if draft.horizon != target.horizon:
        raise ValueError(
            f"{a} and {b} must have the same horizon T, got "
            f"{draft.horizon} ({a}) and {target.horizon} ({b})"
        )


def acceptance_tolerance(dtype) -> float:
    """How far outside ``[0, 1]`` an acceptance probability of ``dtype`` may fall by rounding
    (8 units of its precision)."""
    return 8 * float(jnp.finfo(dtype).eps)


def check_rows(*, probabilities: dict, acceptance: dict | None = None,
               masses: dict | None = None) -> None:
    """Checks the arguments of a function on token rows (``tv_distance(p, q)`` and its kind)
    before any work: every array has a last axis of the same length ``V`` and leading axes that
    broadcast; the ``probabilities`` are laws over their last axis and the ``acceptance``
    values lie in ``[0, 1]``, both checked when concrete (skipped under a caller's ``jit``,
    ``vmap`` or ``grad``).

    Args:
      probabilities: ``{name: array}`` of probability rows.
      acceptance: ``{name: array}`` of acceptance probabilities.
      masses: ``{name: array}`` of un-normalised masses (finite, non-negative).
    """
    acceptance = acceptance or {}
    masses = masses or {}
    arrays = {**probabilities, **acceptance, **masses}
    shapes = {}
    for name, x in arrays.items():
        shape = jnp.shape(x)
        if len(shape) == 0:
            raise ValueError(f"{name} must be an array of rows (..., V), got a scalar {x!r}")
        shapes[name] = shape
    lengths = {shape[-1] for shape in shapes.values()}
    described = ", ".join(f"{name} {shape}" for name, shape in shapes.items())
    if len(lengths) > 1:
        raise ValueError(f"{' and '.join(shapes)} must have the same number of tokens V on "
                         f"their last axis, got shapes {described}")
    try:
        np.broadcast_shapes(*(shape[:-1] for shape in shapes.values()))
    except ValueError:
        raise ValueError(f"the leading axes of {' and '.join(shapes)} must broadcast, got "
                         f"shapes {described}") from None
    for name, x in probabilities.items():
        check_probabilities(name, x)
    for name, x in acceptance.items():
        if not jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating):
            raise ValueError(f"{name} must hold floating-point probabilities, got dtype "
                             f"{jnp.asarray(x).dtype}")
        if not is_concrete(x):
            continue
        values = np.asarray(x, np.float64)
        tol = acceptance_tolerance(jnp.asarray(x).dtype)
        bad = ~((values >= -tol) & (values <= 1 + tol))
        if bad.any():
            raise ValueError(f"{name} must hold probabilities in [0, 1], got "
                             f"{values[bad][:4].tolist()} (NaN or out of range)")
    for name, x in masses.items():
        if not is_concrete(x):
            continue
        values = np.asarray(x, np.float64)
        bad = ~(np.isfinite(values) & (values >= 0))
        if bad.any():
            raise ValueError(f"{name} must hold finite non-negative masses, got "
                             f"{values[bad][:4].tolist()}")


def refuse_traced(driver: str, why: str, hint: str = "", **arguments) -> None:
    """Raise ``ValueError`` when an argument of the host-side driver ``driver`` is traced (it is
    called under ``jax.jit``, ``vmap`` or ``grad``), naming the driver, ``why`` it runs on the
    host and the first traced argument; ``hint`` is added to the message."""
    for name, value in arguments.items():
        if any(not is_concrete(leaf) for leaf in jax.tree_util.tree_leaves(value)):
            raise ValueError(f"{driver} is a host-side driver ({why}): call it outside jax.jit, "
                             f"vmap and grad; got a traced {name}" + (f". {hint}" if hint else ""))
