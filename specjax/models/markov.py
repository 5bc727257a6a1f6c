"""Markov-chain language models: the paper's abstraction of a draft ``p`` or a target ``q``."""

from __future__ import annotations

import numbers
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax import _memory
from specjax._pytree import array_field
from specjax._pytree import pytree_dataclass
from specjax.models.base import Model
from specjax.models.base import ModelKind
from specjax.models.random_chains import _blocked_draw_supported
from specjax.models.random_chains import _dirichlet_rows
from specjax.models.random_chains import _draw_block  # noqa: F401 - read by the tests
from specjax.models.random_chains import _fast_rows
from specjax.models.random_chains import _fill_in_blocks
from specjax.models.random_chains import _mul_wide  # noqa: F401 - read by the tests
from specjax.models.random_chains import concentration_range

__all__ = ["MarkovChain", "check_chain", "check_pair", "check_values", "greedy_chain",
           "one_hot_argmax", "DIRECT_DRAW_ENTRIES", "DRAW_BLOCK_ENTRIES", "FAST_DRAW_ENTRIES",
           "FAST_BLOCK_ENTRIES", "concentration_range", "markov_chain_bytes", "random_markov_chain",
           "PAPER_SEED", "PAPER_NUM_STATES", "PAPER_HORIZON", "paper_instance"]


@pytree_dataclass(init_on_unflatten=False)
class MarkovChain(Model):
    """A non-stationary Markov chain over ``V`` tokens with horizon ``T``.

    Attributes:
      init: ``(V,)`` law of the prompt token ``x_0``.
      trans: ``(T, V, V)``; ``trans[n - 1, a, b] = P(x_n = b | x_{n-1} = a)`` for ``n = 1..T``.

    Construction validates shapes always and values (no NaN, no negative entries, rows summing to
    one) whenever the arrays are concrete; inside a transformation (``jit``, ``vmap``, ``grad``)
    value checks are skipped because tracers carry no values. A ``MarkovChain`` is a frozen
    dataclass and a pytree (``specjax._pytree.pytree_dataclass``: both fields are leaves), so it
    passes through ``jax.jit``, ``jax.vmap`` (a batch of chains: leading axes on both fields) and
    ``jax.grad`` (a gradient is a ``MarkovChain`` of gradients: unflattening does not validate).
    Two chains are equal when their arrays are.

    Example:
      >>> import jax.numpy as jnp, specjax
      >>> chain = specjax.MarkovChain(jnp.array([0.5, 0.5]), jnp.full((3, 2, 2), 0.5))
      >>> chain.num_states, chain.horizon
      (2, 3)
    """

    kind: ClassVar[ModelKind] = ModelKind.MARKOV
    #: Whether construction checked the values: set on a constructed chain; a chain unflattened
    #: from arrays (a batch, a transformation's output, ``tree_unflatten``) has this default and
    #: is checked by the entry points instead (``check_values``).
    _validated: ClassVar[bool] = False

    init: jax.Array = array_field()
    trans: jax.Array = array_field()

    def __post_init__(self):
        init = _as_array("init", self.init)
        trans = _as_array("trans", self.trans)
        if init.ndim != 1:
            raise ValueError(f"init must have shape (V,), got shape {init.shape}")
        if trans.ndim != 3 or trans.shape[1] != trans.shape[2]:
            raise ValueError(f"trans must have shape (T, V, V), got shape {trans.shape}")
        if trans.shape[1] != init.shape[0]:
            raise ValueError(
                f"init has V = {init.shape[0]} states but trans has V = {trans.shape[1]} "
                f"(trans shape {trans.shape})"
            )
        if trans.shape[0] < 1:
            raise ValueError("trans must have a horizon T >= 1, got T = 0")
        if init.shape[0] < 1:
            raise ValueError("init must have at least one state, got V = 0")
        if not jnp.issubdtype(init.dtype, jnp.floating):
            init = init.astype(jnp.result_type(float))
        if not jnp.issubdtype(trans.dtype, jnp.floating):
            trans = trans.astype(jnp.result_type(float))
        _checks.check_probabilities("init", init)
        _checks.check_probabilities("trans", trans)
        object.__setattr__(self, "init", init)
        object.__setattr__(self, "trans", trans)
        object.__setattr__(self, "_validated", _checks.is_concrete(init)
                           and _checks.is_concrete(trans))

    # The pytree protocol's names, kept for callers that build a chain without validation
    # (``MarkovChain.tree_unflatten(None, (init, trans))``, e.g. a batch of chains, or a chain
    # whose rows are known to be laws), as JAX unflattens one.
    def tree_flatten(self):
        """``((init, trans), None)``."""
        return (self.init, self.trans), None

    @classmethod
    def tree_unflatten(cls, aux, children) -> "MarkovChain":
        """The chain with fields ``children = (init, trans)``, as given: no validation, no
        conversion (leaves may be tracers, batches or placeholders). ``aux`` is ignored."""
        del aux
        init, trans = children
        chain = object.__new__(cls)
        object.__setattr__(chain, "init", init)
        object.__setattr__(chain, "trans", trans)
        return chain

    @property
    def num_states(self) -> int:
        """``V``, the number of tokens."""
        return self.init.shape[-1]

    @property
    def horizon(self) -> int:
        """``T``, the number of generated tokens after the prompt."""
        return self.trans.shape[-3]

    @property
    def dtype(self):
        """The dtype of the probabilities (``trans``'s)."""
        return self.trans.dtype

    @classmethod
    def from_logits(cls, init_logits, trans_logits) -> "MarkovChain":
        """Builds a chain through a softmax over the last axis (differentiable in the logits).

        Args:
          init_logits: ``(V,)`` logits of the prompt law; ``-inf`` gives a zero probability.
          trans_logits: ``(T, V, V)`` logits of the transitions.
        """
        init_logits = _as_array("init_logits", init_logits)
        trans_logits = _as_array("trans_logits", trans_logits)
        if not jnp.issubdtype(init_logits.dtype, jnp.floating):
            init_logits = init_logits.astype(jnp.result_type(float))
        if not jnp.issubdtype(trans_logits.dtype, jnp.floating):
            trans_logits = trans_logits.astype(jnp.result_type(float))
        if init_logits.ndim != 1 or trans_logits.ndim != 3 \
                or trans_logits.shape[1:] != init_logits.shape * 2:
            raise ValueError(f"init_logits must have shape (V,) and trans_logits (T, V, V), got "
                             f"{init_logits.shape} and {trans_logits.shape}")
        for name, logits in (("init_logits", init_logits), ("trans_logits", trans_logits)):
            _checks.check_logits(name, logits)
        return cls(jax.nn.softmax(init_logits, axis=-1), jax.nn.softmax(trans_logits, axis=-1))

    def __repr__(self) -> str:
        return (
            f"MarkovChain(V={self.num_states}, T={self.horizon}, "
            f"dtype={self.trans.dtype})"
        )


def _as_array(name: str, value):
    """``value`` as a JAX array of real numbers, or a ``ValueError`` naming the field."""
    try:
        array = _checks.device_array(value)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{name} must be an array of probabilities, got {type(value).__name__}"
                         f" {value!r}"[:300]) from error
    if not (jnp.issubdtype(array.dtype, jnp.floating) or jnp.issubdtype(array.dtype, jnp.integer)
            or array.dtype == bool):
        raise ValueError(f"{name} must hold real probabilities, got dtype {array.dtype}")
    return array


def check_chain(name: str, model) -> None:
    """Raise ``ValueError`` unless ``model`` is one ``MarkovChain`` (not a stacked batch)."""
    if not isinstance(model, MarkovChain):
        raise ValueError(f"{name} must be a specjax.MarkovChain, got {type(model).__name__}")
    if model.init.ndim != 1 or model.trans.ndim != 3:
        raise ValueError(
            f"{name} must be a single chain (init (V,), trans (T, V, V)); got init "
            f"{model.init.shape} and trans {model.trans.shape}; use jax.vmap for a batch"
        )


def check_pair(draft, target) -> None:
    """Raise ``ValueError`` unless draft and target are single chains with the same ``V`` and ``T``."""
    check_chain("draft", draft)
    check_chain("target", target)
    _checks.check_same_shape(draft, target)
    for name, chain in (("draft", draft), ("target", target)):
        check_values(name, chain)


def check_values(name: str, chain: MarkovChain) -> None:
    """Checks the values of a chain that construction did not check (one rebuilt from arrays by
    ``tree_unflatten``, ``jax.tree.map`` or a transformation), when they are concrete. Row sums
    get float32's tolerance at least: a float32 chain cast to float64 with ``jax.tree.map`` (a
    common idiom) misses one by about ``1e-8``, which is not a mistake to refuse."""
    if chain._validated:
        return
    if _checks.is_concrete(chain.init) and _checks.is_concrete(chain.trans):
        tolerance = max(_checks.row_sum_tolerance(chain.trans.dtype),
                        _checks.row_sum_tolerance(jnp.float32))
        _checks.check_probabilities(f"{name}.init", chain.init, tolerance=tolerance)
        _checks.check_probabilities(f"{name}.trans", chain.trans, tolerance=tolerance)


def greedy_chain(model: MarkovChain) -> MarkovChain:
    """The deterministic (greedy) draft of ``model``: each row one-hot at its most likely token.

    Greedy drafting (or n-gram lookup, as in vLLM's ngram drafting) proposes one token with
    certainty. Verifying it with SD then accepts ``x`` with probability ``q(x)`` and otherwise
    resamples from ``q`` with ``x`` removed (SD's residual ``[q - 1_x]_+``, normalised), which is
    exactly unbiased; scoring the greedy token with ``model``'s own (softmax) probabilities
    instead is biased (``specjax.audit`` flags it). Every sampler and exact function of specjax
    takes the returned chain as an ordinary draft, so rejections of greedy drafting are exact:
    ``sum_n E_{x_{n-1} ~ q}[1 - q_n(g_n(x_{n-1}) | x_{n-1})]`` with ``g_n`` the argmax.

    Ties go to the lowest token index. ``init`` is kept (decoding never uses the draft's prompt
    law). The result is not differentiable in ``model`` (an argmax).
    ``specjax.models.greedy_draft`` also takes n-gram and other autoregressive models.

    Args:
      model: a ``MarkovChain`` (the draft model ``p`` whose argmax is drafted).

    Returns:
      A ``MarkovChain`` with one-hot transition rows.

    Raises:
      ValueError: ``model`` is not a single ``MarkovChain``.
    """
    check_chain("model", model)
    return MarkovChain(model.init, one_hot_argmax(model.trans))


def one_hot_argmax(rows: jax.Array) -> jax.Array:
    """Each ``(..., V)`` row replaced by the one-hot of its argmax (ties: lowest index)."""
    return jax.nn.one_hot(jnp.argmax(rows, axis=-1), rows.shape[-1], dtype=rows.dtype)


#: Transition tables of at most this many entries are drawn as every earlier version drew them:
#: one call of ``jax.random.dirichlet``, whose gamma sampler holds about 31 times the result
#: (``_DIRECT_BYTES_PER_ENTRY``). Larger ones are drawn in blocks of rows, straight into the
#: result: the same numbers (tested), a small multiple of the result's memory.
DIRECT_DRAW_ENTRIES = 1 << 20
#: Entries drawn by one block of rows (each holds about ``_DIRECT_BYTES_PER_ENTRY`` bytes of
#: the gamma sampler's temporaries while it is drawn).
DRAW_BLOCK_ENTRIES = 1 << 18
#: Bytes of ``jax.random.dirichlet``'s temporaries per entry (XLA's ``memory_analysis``: 124).
_DIRECT_BYTES_PER_ENTRY = 128


def _draw_in_blocks(key, alpha: jax.Array, horizon: int) -> jax.Array:
    """``jax.random.dirichlet(key, alpha, (T, V))`` drawn ``DRAW_BLOCK_ENTRIES`` entries at a
    time (``_fill_in_blocks`` of ``_dirichlet_rows``: the same numbers as the direct draw,
    tested)."""
    num_states = alpha.shape[-1]
    return _fill_in_blocks(_dirichlet_rows, key, alpha, horizon, num_states,
                           DRAW_BLOCK_ENTRIES, alpha.dtype)


#: ``method="auto"`` (the default) draws tables of more than this many entries with
#: ``method="fast"``; smaller ones, the paper's instance and every table of the docs and tests
#: among them, with ``method="jax"`` (``jax.random.dirichlet``'s numbers, as every earlier
#: version drew them): ``V = 1,024`` at ``T = 2`` is drawn by JAX, ``V = 2,048`` at ``T = 1``
#: (``2**22`` entries) fast.
FAST_DRAW_ENTRIES = 1 << 21
#: Entries drawn by one block of rows of the fast draw.
FAST_BLOCK_ENTRIES = 1 << 21
#: Bytes of the fast draw's temporaries per entry of a block (XLA's ``memory_analysis`` of one
#: block: about 16 at concentration 1, 45 otherwise), with room.
_FAST_BYTES_PER_ENTRY = 64
_METHODS = ("auto", "jax", "fast")


def _draw_fast(key, concentration, num_states: int, horizon: int, dtype) -> jax.Array:
    """The ``(T, V, V)`` table of ``method="fast"`` (``_fast_rows``), drawn
    ``FAST_BLOCK_ENTRIES`` entries at a time (``_fill_in_blocks``)."""
    kind = "any"  # the static path of _fast_rows
    if _checks.is_concrete(concentration):
        kind = "one" if float(concentration) == 1.0 else "above" if float(concentration) > 1 \
            else "any"
    return _fill_in_blocks(_fast_rows, key, jnp.asarray(concentration, dtype), horizon,
                           num_states, FAST_BLOCK_ENTRIES, dtype,
                           options=(kind, num_states, jnp.dtype(dtype)))


def _resolve_method(method, entries: int) -> str:
    """``"jax"`` or ``"fast"``: ``method``, or for ``"auto"`` the fast draw above
    ``FAST_DRAW_ENTRIES`` entries."""
    if not isinstance(method, str) or method not in _METHODS:
        raise ValueError(f"method must be one of {', '.join(map(repr, _METHODS))}, got "
                         f"{method!r}")
    if method == "auto":
        return "fast" if entries > FAST_DRAW_ENTRIES else "jax"
    return method


def markov_chain_bytes(num_states: int, horizon: int, dtype=None, *, blocked=None,
                       method: str = "auto") -> int:
    """Estimated peak bytes of ``random_markov_chain(key, num_states, horizon, method=method)``:
    the ``(T, V, V)`` result, the validation's temporaries (a boolean per entry), and the draw's
    temporaries: for ``method="jax"``, a block of ``DRAW_BLOCK_ENTRIES`` entries (``blocked``,
    the default above ``DIRECT_DRAW_ENTRIES``) or every entry; for ``method="fast"``, a block of
    ``FAST_BLOCK_ENTRIES`` entries."""
    dtype = jnp.dtype(jnp.result_type(float) if dtype is None else dtype)
    entries = horizon * num_states * num_states
    if _resolve_method(method, entries) == "fast":
        drawn = min(entries, max(FAST_BLOCK_ENTRIES, num_states))
        return entries * (dtype.itemsize + 1) + drawn * _FAST_BYTES_PER_ENTRY
    if blocked is None:
        blocked = entries > DIRECT_DRAW_ENTRIES
    drawn = min(entries, max(DRAW_BLOCK_ENTRIES, num_states)) if blocked else entries
    return entries * (dtype.itemsize + 1) + drawn * _DIRECT_BYTES_PER_ENTRY


def random_markov_chain(key, num_states: int, horizon: int, concentration=1.0, *,
                        method: str = "auto") -> MarkovChain:
    """A random non-stationary chain: rows from a symmetric Dirichlet, uniform prompt.

    This is the setting of the paper's simulations (Appendix "Numerical Simulation Details").
    Two draws of the same law, each reproducible from ``key``:

    * ``method="jax"``: the rows are ``jax.random.dirichlet(key, alpha, (T, V))``, as every
      earlier version drew them. JAX's gamma sampler costs about a microsecond per entry (9 s
      at ``V = 2,048``, ``T = 2``). Tables of more than ``DIRECT_DRAW_ENTRIES`` entries are
      drawn in blocks of rows, with the same numbers, so that memory stays a small multiple of
      the result (``markov_chain_bytes``) instead of the 31 times the result that
      ``jax.random.dirichlet`` holds.
    * ``method="fast"``: row ``r`` drawn from its own key ``fold_in(k1, r)``, ``k1, _ =
      split(key)`` (the same numbers whatever the blocks): at concentration 1 normalised
      exponentials; otherwise log-gammas by Marsaglia and Tsang's method, the refused entries
      drawn again until none is left (exact; see ``_fast_rows``). About 20 times faster than
      JAX's gamma sampler at concentration 1; other numbers than ``"jax"``'s, the same law. Under a
      caller's ``jax.jit`` (a traced key) the blocks are a ``fori_loop`` whose numbers can
      differ in the last bit; a traced concentration takes the Marsaglia-Tsang path even at 1.
    * ``method="auto"`` (the default): ``"fast"`` for tables of more than
      ``FAST_DRAW_ENTRIES`` (``2**21``) entries, ``"jax"`` otherwise, so the paper's instance
      and every smaller table keep their numbers; ``V = 2,048`` at ``T = 1`` or more, and
      ``V = 16,384``, are drawn fast.

    The draw depends on the working dtype: JAX's samplers draw in float64 when
    ``jax_enable_x64`` is on, so the same key gives another chain there (and
    ``paper_instance()`` another instance) than in float32.

    Args:
      key: a JAX PRNG key.
      num_states: ``V``.
      horizon: ``T``.
      concentration: Dirichlet concentration; small values give peaked rows with near-zeros.
        A number in ``specjax.models.markov.concentration_range(dtype)`` (``[2.6e-37, 3.4e38]``
        in float32: what the dtype holds and draws without NaN; ``1e39`` is infinite in
        float32). Traced (under a caller's ``jax.jit``), it cannot be checked: a value outside
        the range (NaN, ``-1``, infinite, too small) gives a ``trans`` of NaN (documented, never
        a hang; validate ``chain.trans`` or the value before the call).
      method: ``"auto"``, ``"jax"`` or ``"fast"`` (above).

    Returns:
      A ``MarkovChain`` with ``init`` uniform and ``trans`` of shape ``(T, V, V)``.

    Raises:
      ValueError: a bad argument (a concrete ``concentration`` outside
        ``concentration_range(dtype)`` among them, naming it and the range), ``T V >= 2**31``
        rows, or a table whose estimated memory (``markov_chain_bytes``) exceeds what the
        machine has available (naming ``num_states`` and ``horizon``, the size and what is
        available); before any work.

    Example:
      >>> import jax, specjax
      >>> chain = specjax.random_markov_chain(jax.random.key(0), 5, 3, method="fast")
      >>> chain.trans.shape, round(float(chain.trans[0, 0].sum()), 5)
      ((3, 5, 5), 1.0)
    """
    _checks.check_key(key)
    _checks.check_positive_int("num_states", num_states)
    _checks.check_positive_int("horizon", horizon)
    dtype = jnp.result_type(float)
    low, high = concentration_range(dtype)
    if _checks.is_concrete(concentration):
        value = np.asarray(concentration) if not isinstance(concentration, (str, bytes)) \
            else None
        if value is None or value.shape != () or value.dtype == bool \
                or not np.issubdtype(value.dtype, np.number) \
                or not low <= float(value) <= high:
            raise ValueError(f"concentration must be positive and finite, a number in "
                             f"[{low:.3g}, {high:.3g}] (what {jnp.dtype(dtype).name} holds and "
                             f"draws without NaN), got {concentration!r}")
        valid = None
    else:  # traced: a guard, not a check (module docstring of the draw below)
        concentration = jnp.asarray(concentration, dtype)
        valid = (concentration >= low) & (concentration <= high)  # False for NaN
        concentration = jnp.where(valid, concentration, 1)
    entries = horizon * num_states * num_states
    method = _resolve_method(method, entries)
    if horizon * num_states >= 2**31:
        raise ValueError(f"num_states x horizon must be below 2**31 rows, got num_states = "
                         f"{num_states:,} and horizon = {horizon:,}; use fewer states or a "
                         f"shorter horizon")
    blocked = entries > DIRECT_DRAW_ENTRIES and _blocked_draw_supported(key)
    _memory.check_fits(
        markov_chain_bytes(num_states, horizon, dtype, blocked=blocked, method=method),
        argument=f"num_states = {num_states:,} and horizon = {horizon:,}",
        what=f"the ({horizon:,}, {num_states:,}, {num_states:,}) {jnp.dtype(dtype).name} "
             f"transition table: {_memory.format_bytes(entries * jnp.dtype(dtype).itemsize)}",
        remedy="use fewer states or a shorter horizon")
    if method == "fast":
        trans = _draw_fast(key, concentration, num_states, horizon, dtype)
    else:
        alpha = jnp.full((num_states,), concentration, dtype)
        if blocked:
            trans = _draw_in_blocks(key, alpha, horizon)
        else:
            trans = jax.random.dirichlet(key, alpha, shape=(horizon, num_states), dtype=dtype)
    if valid is not None:
        trans = jnp.where(valid, trans, jnp.nan)
    init = jnp.full((num_states,), 1.0 / num_states, dtype)
    return MarkovChain(init, trans)


PAPER_SEED = 10
PAPER_NUM_STATES = 7
PAPER_HORIZON = 50


def paper_instance(seed: int = PAPER_SEED, num_states: int = PAPER_NUM_STATES,
                   horizon: int = PAPER_HORIZON) -> tuple[MarkovChain, MarkovChain]:
    """The paper's default setting: draft and target drawn at random, 7 states, ``T = 50``.

    The paper (Appendix "Numerical Simulation Details") uses seed 10 with its own random
    generator; its draws are unknown, so exact values differ from the paper's (e.g. its 16.41).

    Returns:
      ``(draft, target)``, two independent ``random_markov_chain`` draws with uniform prompt.
    """
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    key_draft, key_target = jax.random.split(jax.random.key(seed))
    return (random_markov_chain(key_draft, num_states, horizon),
            random_markov_chain(key_target, num_states, horizon))
