"""History-dependent processing as engines do it: repetition, frequency and presence penalties, and
grammar masks, as finite-state models.

A penalty or a grammar makes the next-token law depend on the whole history, not only on the
model's own state. Both are a finite automaton over tokens (a *processor*, ``P`` states: the
penalty state or the grammar's state) and a rule that turns the model's row in state ``s`` into
the processed row in processor state ``c``. ``penalize`` and ``constrain`` return the product, a
``FiniteStateModel`` with states ``(s, c)``, index ``s P + c``: every entry point (``decode``,
``exact``, ``decoding_statistics``) then works on it unchanged, and SD with a processed draft and a
processed target is lossless for the processed target (it is SD on two finite-state models).

**Penalties** (``Penalties``; the rule is ``apply_penalties``), as vLLM applies them
(``apply_penalties``: repetition, then frequency, then presence) and as HuggingFace applies the
repetition penalty (``RepetitionPenaltyLogitsProcessor``):

* repetition ``r``: on every token *seen* (in the prompt or the output), a logit ``l > 0``
  becomes ``l / r`` and ``l <= 0`` becomes ``l r``;
* frequency ``f`` and presence ``a`` (vLLM, OpenAI): ``l - f n - a [n > 0]`` with ``n`` the
  token's count in the *output* (prompt excluded).

The prompt is ``x_0`` (specjax draws it from the target's first row): the penalty state is
``(x_0, counts of x_1, x_2, ... per token)``, so the repetition penalty counts ``x_0`` and the
frequency and presence penalties do not. **The choice that keeps it finite: capped counts.** A
count stops at ``cap``: with ``cap >= T - 1`` (horizon ``T``: the rows of ``x_1..x_T`` see at most
``T - 1`` output tokens) the model is exactly vLLM's over ``T`` tokens; a smaller cap saturates
the frequency penalty at ``f cap`` (``cap = 1`` is exact for repetition and presence alone). The
processor has ``P = (V + 1) (cap + 1)^V`` states (``x_0`` not yet seen, or which token it was;
the capped counts), all of them indexed, reachable or not, so that two penalised models of one
state space share one product state space whatever their settings.

**Grammar masks** (``Grammar``): a deterministic automaton over tokens, ``allowed[c]`` the tokens
it allows in state ``c`` and ``transitions[c, x]`` its state after ``x``, as structured-output
engines (xgrammar, llguidance, outlines) mask logits with a bitmask per position. The processed
row is the model's row on the allowed tokens, renormalised (the softmax of the masked logits);
in a state whose row has no mass on an allowed token (never reached when the model can always
follow the grammar) the row is uniform on the allowed tokens, so that the table stays a law.

A model's logits are taken as ``log(row)`` (``-inf`` for a zero): non-positive, so the
repetition penalty multiplies them. An engine penalises the network's raw logits, which differ
from ``log(row)`` by a shift that the repetition penalty does not ignore: pass them as
``logits=`` to ``penalize``.
"""

from __future__ import annotations

import numbers
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax.models.autoregressive import check_table_size
from specjax.models.finite_state import FiniteStateModel
from specjax.models.markov import MarkovChain

__all__ = ["Grammar", "Penalties", "apply_penalties", "constrain", "penalize"]


class Penalties(NamedTuple):
    """Penalty settings (vLLM's ``SamplingParams`` names without ``_penalty``).

    Attributes:
      repetition: ``r > 0``; ``1`` is none (HuggingFace, vLLM).
      frequency: ``f``, subtracted ``count`` times (vLLM, OpenAI; ``0`` is none).
      presence: ``a``, subtracted once per token present in the output (``0`` is none).
      cap: counts stop at ``cap >= 1`` (a Python int: the state space; see the module docstring).
    """

    repetition: float = 1.0
    frequency: float = 0.0
    presence: float = 0.0
    cap: int = 1


class Grammar(NamedTuple):
    """A deterministic automaton over tokens: the grammar an engine masks logits with.

    Attributes:
      allowed: ``(A, V)`` bool: the tokens allowed in each automaton state (at least one each).
      transitions: ``(A, V)`` ints in ``[0, A)``: the state after each token (read only for
        allowed tokens).
      start: the state before ``x_0`` (the prompt token is masked too).
    """

    allowed: np.ndarray
    transitions: np.ndarray
    start: int = 0


def apply_penalties(logits, seen, counts, *, repetition=1.0, frequency=0.0, presence=0.0):
    """Penalised logits, as vLLM's ``apply_penalties`` computes them.

    ``l / r`` where ``l > 0`` and ``l r`` where ``l <= 0`` on seen tokens, then
    ``- frequency * counts - presence * [counts > 0]``. Infinite logits (``-inf``: a masked or
    zero-probability token) stay as they are, with finite gradients in every setting.

    Args:
      logits: ``(..., V)`` floating logits.
      seen: ``(..., V)`` bool: tokens in the prompt or the output (the repetition penalty's set).
      counts: ``(..., V)`` counts in the output (the frequency and presence penalties').
      repetition, frequency, presence: the settings (may be traced).

    Returns:
      ``(..., V)`` logits.

    Example:
      >>> import jax.numpy as jnp, specjax
      >>> out = specjax.models.apply_penalties(
      ...     jnp.array([2.0, -1.0, 0.5]), jnp.array([True, True, False]), jnp.array([1, 0, 2]),
      ...     repetition=2.0, frequency=0.5, presence=0.25)
      >>> tuple(round(float(v), 3) for v in out)
      (0.25, -2.0, -0.75)
    """
    logits = jnp.asarray(logits)
    counts = jnp.asarray(counts).astype(logits.dtype)
    finite = jnp.isfinite(logits)
    z = jnp.where(finite, logits, 0)
    r = jnp.where(jnp.asarray(seen), jnp.asarray(repetition, logits.dtype), 1)
    z = jnp.where(z > 0, z / r, z * r)
    z = z - frequency * counts - presence * (counts > 0).astype(logits.dtype)
    return jnp.where(finite, z, logits)


class Processor(NamedTuple):
    """A processor's automaton: ``P`` states, ``start``, ``next (P, V)`` (NumPy)."""

    num: int
    start: int
    next: np.ndarray


def check_model(name, model) -> FiniteStateModel:
    if isinstance(model, MarkovChain):
        # Lifted eagerly: under a caller's jax.jit the lift's next_state (built from NumPy)
        # would otherwise be traced, and the product state space needs its values.
        with jax.ensure_compile_time_eval():
            return FiniteStateModel.from_markov_chain(model)
    if not isinstance(model, FiniteStateModel):
        raise ValueError(f"{name} must be a FiniteStateModel or a MarkovChain (lift an n-gram "
                         f"with as_finite_state), got {type(model).__name__}")
    if not _checks.is_concrete(model.next_state):
        raise ValueError(f"{name}.next_state must be concrete (the product state space is built "
                         f"from it)")
    return model


def safe_log(table):
    positive = table > 0
    return jnp.where(positive, jnp.log(jnp.where(positive, table, 1)), -jnp.inf)


def check_penalties(penalties, num_states: int) -> Penalties:
    """``penalties`` as ``Penalties``, validated (``ValueError`` naming the setting)."""
    if not isinstance(penalties, Penalties):
        raise ValueError(f"penalties must be a specjax.models.Penalties, got "
                         f"{type(penalties).__name__}")
    cap = penalties.cap
    if not _checks.is_concrete(cap):
        raise ValueError("penalties.cap is static (it sets the state space): pass a Python int, "
                         "not a traced value; only the penalty strengths may be traced")
    if isinstance(cap, bool) or not isinstance(cap, numbers.Integral) or cap < 1:
        raise ValueError(f"penalties.cap must be an int >= 1, got {cap!r}")
    for name, value in (("repetition", penalties.repetition),
                        ("frequency", penalties.frequency), ("presence", penalties.presence)):
        if _checks.is_concrete(value):
            v = np.asarray(value, np.float64) if not isinstance(value, (str, bytes)) else None
            if v is None or v.shape != () or not np.isfinite(v) or (
                    name == "repetition" and not v > 0):
                bound = "a finite number > 0" if name == "repetition" else "a finite number"
                raise ValueError(f"penalties.{name} must be {bound}, got {value!r}")
    check_table_size("penalties", (num_states + 1) * (cap + 1) ** num_states, num_states)
    return penalties._replace(cap=int(cap))


def penalty_processor(num_states: int, cap: int) -> tuple[Processor, np.ndarray, np.ndarray]:
    """The penalty automaton and, per state, ``seen (P, V)`` and ``counts (P, V)``.

    State ``c = first (cap + 1)^V + sum_v counts[v] (cap + 1)^v`` with ``first`` the prompt token
    ``x_0`` (``V``: not yet emitted)."""
    v, base = num_states, cap + 1
    cube = base ** v
    num = (v + 1) * cube
    index = np.arange(num)
    first = index // cube
    counts = (index[:, None] // base ** np.arange(v)[None, :]) % base
    seen = (counts > 0) | (first[:, None] == np.arange(v)[None, :])
    nxt = np.empty((num, v), np.int64)
    for x in range(v):
        bumped = np.where(counts[:, x] < cap, index + base ** x, index)
        nxt[:, x] = np.where(first == v, x * cube + index % cube, bumped)
    return Processor(num, v * cube, nxt.astype(np.int32)), seen, counts


def check_grammar(grammar, num_states: int) -> Grammar:
    """``grammar`` with NumPy fields, validated (``ValueError`` naming the field)."""
    if not isinstance(grammar, Grammar):
        raise ValueError(f"grammar must be a specjax.models.Grammar, got {type(grammar).__name__}")
    allowed = np.asarray(grammar.allowed)
    transitions = np.asarray(grammar.transitions)
    if allowed.ndim != 2 or allowed.shape[1] != num_states or allowed.shape[0] < 1 \
            or allowed.dtype != bool:
        raise ValueError(f"grammar.allowed must be a bool array of shape (A, V = {num_states}), "
                         f"got {allowed.dtype} {allowed.shape}")
    if not allowed.any(1).all():
        raise ValueError(f"grammar.allowed must allow at least one token in every state; states "
                         f"{np.flatnonzero(~allowed.any(1)).tolist()[:5]} allow none")
    num = allowed.shape[0]
    if transitions.shape != allowed.shape or not np.issubdtype(transitions.dtype, np.integer) \
            or transitions.min() < 0 or transitions.max() >= num:
        raise ValueError(f"grammar.transitions must be ints in [0, {num}) of shape "
                         f"{allowed.shape}, got {transitions.dtype} {transitions.shape}")
    start = grammar.start
    if isinstance(start, bool) or not isinstance(start, numbers.Integral) \
            or not 0 <= start < num:
        raise ValueError(f"grammar.start must be an int in [0, {num}), got {start!r}")
    return Grammar(allowed, transitions.astype(np.int32), int(start))


def penalized_rows(logits, penalties: Penalties, seen, counts):
    """``(S, P, V)``: the softmax of ``apply_penalties`` of each base row in each penalty
    state."""
    out = apply_penalties(logits[:, None, :], jnp.asarray(seen)[None],
                          jnp.asarray(counts)[None], repetition=penalties.repetition,
                          frequency=penalties.frequency, presence=penalties.presence)
    return jax.nn.softmax(out, axis=-1)


def masked_rows(table, allowed):
    """``(S, A, V)``: each base row on each state's allowed tokens, renormalised (uniform on
    them where the row has no mass there)."""
    mask = jnp.asarray(allowed, table.dtype)[None]
    kept = table[:, None, :] * mask
    mass = kept.sum(-1, keepdims=True)
    uniform = mask / mask.sum(-1, keepdims=True)
    return jnp.where(mass > 0, kept / jnp.where(mass > 0, mass, 1), uniform)


def product_model(model: FiniteStateModel, processor: Processor, rows) -> FiniteStateModel:
    """The finite-state model on states ``(s, c)`` (index ``s P + c``) with rows ``rows (S, P,
    V)``: ``s`` moves by the model's ``next_state``, ``c`` by the processor's."""
    num, (s, v) = processor.num, model.table.shape
    check_table_size("the processed model", s * num, v)
    base_next = np.asarray(model.next_state, np.int64)
    next_state = (base_next[:, None, :] * num + processor.next[None, :, :]).reshape(s * num, v)
    return FiniteStateModel(model.start * num + processor.start, next_state.astype(np.int32),
                            rows.reshape(s * num, v))


def penalize(model, penalties: Penalties, *, logits=None) -> FiniteStateModel:
    """``model`` with repetition, frequency and presence penalties, as a ``FiniteStateModel``.

    States ``(s, c)``: ``s`` the model's state, ``c`` the penalty state (``x_0`` and the capped
    output counts; see the module docstring), index ``s P + c``. Two models of one state space
    penalised with one ``cap`` share the product state space (whatever the other settings), so
    a penalised draft and a penalised target go to ``exact`` and ``decode`` together; an
    unpenalised draft is ``penalize(draft, Penalties(cap=cap))``.

    Args:
      model: a ``FiniteStateModel`` (concrete ``next_state``) or a ``MarkovChain`` (lifted with
        ``FiniteStateModel.from_markov_chain``).
      penalties: ``Penalties``; the strengths may be traced (differentiable), ``cap`` is static.
      logits: optional ``(S, V)`` raw logits of the model's states (an engine penalises these);
        by default ``log(table)``.

    Returns:
      ``FiniteStateModel`` with ``S (V + 1) (cap + 1)^V`` states.

    Raises:
      ValueError: a bad model, setting or ``logits``, or a state space above
        ``MAX_TABLE_SIZE``; before any work.

    Example:
      >>> import jax.numpy as jnp, specjax
      >>> from specjax.models import Penalties, penalize
      >>> base = specjax.FiniteStateModel(0, jnp.zeros((1, 2), int), jnp.array([[0.5, 0.5]]))
      >>> model = penalize(base, Penalties(frequency=1.0, cap=2))
      >>> state = model.update(model.update(model.init_state(), 0), 1)  # x_0 = 0, x_1 = 1
      >>> tuple(round(float(v), 3) for v in model.probs(state))
      (0.731, 0.269)
    """
    model = check_model("model", model)
    s, v = model.table.shape
    penalties = check_penalties(penalties, v)
    if logits is None:
        logits = safe_log(model.table)
    else:
        logits = jnp.asarray(logits)
        if logits.shape != (s, v) or not jnp.issubdtype(logits.dtype, jnp.floating):
            raise ValueError(f"logits must be floating of shape (S, V) = {(s, v)}, got "
                             f"{logits.dtype} {logits.shape}")
        _checks.check_logits("logits", logits)
    processor, seen, counts = penalty_processor(v, penalties.cap)
    return product_model(model, processor, penalized_rows(logits, penalties, seen, counts))


def constrain(model, grammar: Grammar) -> FiniteStateModel:
    """``model`` under a grammar mask, as a ``FiniteStateModel`` on states ``(s, a)``.

    ``a`` is the grammar automaton's state (index ``s A + a``); the row is the model's on the
    tokens ``allowed[a]``, renormalised. An unmasked model on the same product state space (a
    draft that the engine does not mask) is ``constrain(draft, grammar._replace(allowed=...all
    True))``: the same ``transitions``, every token allowed.

    Args:
      model: a ``FiniteStateModel`` (concrete ``next_state``) or a ``MarkovChain``.
      grammar: ``Grammar``.

    Returns:
      ``FiniteStateModel`` with ``S A`` states.

    Raises:
      ValueError: a bad model or grammar; before any work.

    Example:
      >>> import jax.numpy as jnp, numpy as np, specjax
      >>> from specjax.models import Grammar, constrain
      >>> base = specjax.FiniteStateModel(0, jnp.zeros((1, 3), int), jnp.array([[0.5, 0.3, 0.2]]))
      >>> alternate = Grammar(np.array([[True, False, True], [False, True, True]]),
      ...                     np.array([[1, 1, 1], [0, 0, 0]]))  # 0 and 1 alternate, 2 anywhere
      >>> model = constrain(base, alternate)
      >>> tuple(round(float(v), 3) for v in model.probs(model.update(model.init_state(), 0)))
      (0.0, 0.6, 0.4)
    """
    model = check_model("model", model)
    grammar = check_grammar(grammar, model.table.shape[1])
    processor = Processor(grammar.allowed.shape[0], grammar.start, grammar.transitions)
    return product_model(model, processor, masked_rows(model.table, grammar.allowed))
