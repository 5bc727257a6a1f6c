"""Validation of models: the autoregressive-model protocol, finite-state pairs, and model kinds.

Every entry point classifies its models with ``model_kind`` before any work, from the ``kind``
each model declares (``specjax.models.base``): ``ModelKind.MARKOV`` (two ``MarkovChain``s),
``ModelKind.FINITE_STATE`` (two ``FiniteStateModel``s on one state space) or
``ModelKind.PROTOCOL`` (any other models of the protocol), and refuses mixtures with a
``ValueError``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax.models.base import ModelKind
from specjax.models.base import ProtocolModel
from specjax.models.base import as_model
from specjax.models.base import model_view
from specjax.models.finite_state import FiniteStateModel
from specjax.models.markov import check_pair

__all__ = [
    "PROBE_DEPTH",
    "PROBE_TOKENS",
    "check_horizon",
    "check_models",
    "check_shared_states",
    "model_dtype",
    "model_kind",
    "probe_rows",
    "probs_at",
    "update_at",
]


def _check_protocol_model(name: str, model) -> None:
    """Raise ``ValueError`` unless ``model`` follows the protocol: a JAX pytree whose
    ``probs(init_state())`` is a float ``(V,)`` law (values checked when concrete)."""
    view = as_model(model, name)  # names the members a user's object lacks
    if not isinstance(view, ProtocolModel):
        raise ValueError(
            f"{name} must be a specjax.MarkovChain or an autoregressive model (num_states, "
            f"init_state(), probs(state), update(state, token); see specjax.models), got "
            f"{type(model).__name__}")
    leaves = jax.tree_util.tree_leaves(model)
    if any(leaf is model for leaf in leaves):
        raise ValueError(
            f"{name} must be a JAX pytree (e.g. a class registered with "
            f"jax.tree_util.register_pytree_node_class, arrays as leaves), got an unregistered "
            f"{type(model).__name__}")
    try:
        num_states = model.num_states
    except Exception as error:  # a user's model: report what failed, naming the argument
        raise ValueError(f"{name}.num_states failed: {error}") from error
    _checks.check_positive_int(f"{name}.num_states", num_states)
    rows_of = model if view.has_probs else view  # a model that gives logits alone: softmax
    try:
        row = jax.eval_shape(lambda m: m.probs(m.init_state()), rows_of)
    except Exception as error:  # a user's model: report what failed, naming the argument
        raise ValueError(f"{name}.probs(init_state()) failed: {error}") from error
    if row.shape != (num_states,) or not jnp.issubdtype(row.dtype, jnp.floating):
        raise ValueError(
            f"{name}.probs(state) must return a float array of shape (num_states,) = "
            f"({num_states},), got shape {row.shape} and dtype {row.dtype}")
    if all(_checks.is_concrete(leaf) for leaf in leaves):
        try:
            rows = probe_rows(rows_of)
        except Exception as error:  # a user's model: report what failed, naming the argument
            raise ValueError(f"{name}: evaluating probs(update(state, token)) on a few states "
                             f"reached from init_state() failed: {error}") from error
        for where, row in rows:
            _checks.check_probabilities(f"{name}.probs({where})", row)


#: A model's row at a state, and its state after a token: compiled once per model type (a new
#: ``jax.jit`` of a lambda at every probe would compile again before every run).
probs_at = jax.jit(lambda model, state: model.probs(state))
update_at = jax.jit(lambda model, state, token: model.update(state, token))

#: Tokens tried from each probed state of a protocol model, and the depth of the probe.
PROBE_TOKENS, PROBE_DEPTH = 4, 2


def probe_rows(model):
    """A protocol model's rows at a few reachable states, as ``(where, row)`` pairs: the initial
    state, then up to ``PROBE_TOKENS`` tokens (the first, the middle, the last and the most
    probable) from each probed state, ``PROBE_DEPTH`` tokens deep (at most 21 rows). A cheap
    check before a run; the samplers also flag an invalid row met during the run."""
    num_states = model.num_states
    probs, update = probs_at, update_at
    frontier = [((), model.init_state())]
    rows = []
    for depth in range(PROBE_DEPTH + 1):
        next_frontier = []
        for path, state in frontier:
            row = probs(model, state)
            where = "init_state()" if not path else \
                f"state after tokens {list(path)} from init_state()"
            rows.append((where, row))
            if depth == PROBE_DEPTH:
                continue
            values = np.asarray(row)
            best = int(np.nanargmax(values)) if np.isfinite(values).any() else 0
            tokens = sorted({0, num_states // 2, num_states - 1, best})[:PROBE_TOKENS]
            for token in tokens:
                next_frontier.append((path + (token,),
                                      update(model, state, jnp.asarray(token, jnp.int32))))
        frontier = next_frontier
    return rows


def check_models(draft, target) -> None:
    """Raise ``ValueError`` unless both follow the protocol with the same ``V`` (the target
    alone when ``draft is target``: autoregressive decoding)."""
    for name, model in (("target", target),) if draft is target is not None else \
            (("draft", draft), ("target", target)):
        _check_protocol_model(name, model)
    if draft.num_states != target.num_states:
        raise ValueError(
            f"draft and target must have the same number of states V, got "
            f"{draft.num_states} (draft) and {target.num_states} (target)")


def model_dtype(model):
    """The float dtype of a model's probabilities (its declared ``dtype``:
    ``specjax.models.base.Model``)."""
    return as_model(model).dtype


def check_shared_states(draft, target) -> None:
    """Raise ``ValueError`` unless both are ``FiniteStateModel``s on one state space (same ``V``,
    ``S``, start and ``next_state``; the values are compared when concrete)."""
    for name, model in (("draft", draft), ("target", target)):
        if not isinstance(model, FiniteStateModel):
            raise ValueError(
                f"{name} must be a specjax.models.FiniteStateModel (e.g. "
                f"NGramModel.as_finite_state()), got {type(model).__name__}")
    check_models(draft, target)
    if draft.num_contexts != target.num_contexts or draft.start != target.start:
        raise ValueError(
            f"draft and target must share their state space: S = {draft.num_contexts} and "
            f"{target.num_contexts}, start = {draft.start} and {target.start}")
    a, b = draft.next_state, target.next_state
    if a is not b and _checks.is_concrete(a) and _checks.is_concrete(b) \
            and not np.array_equal(np.asarray(a), np.asarray(b)):
        raise ValueError("draft and target must share next_state (the same state space); "
                         "lift both to one context length, e.g. as_finite_state(3)")


def _kind(model) -> ModelKind | None:
    """The ``kind`` a model declares (a user's object of the protocol: ``PROTOCOL``); ``None``
    for what is not a model."""
    view = model_view(model)
    return None if view is None else view.kind


def model_kind(draft, target, *, allow_no_draft: bool = False) -> ModelKind:
    """Validates a pair of models and returns its kind (a ``ModelKind``, equal to its name):
    ``"markov"``, ``"finite_state"`` or ``"protocol"``. With ``allow_no_draft`` (autoregressive
    decoding) ``draft`` may be ``None`` and the target is validated alone."""
    if draft is None and allow_no_draft:
        draft = target
    kinds = (_kind(draft), _kind(target))
    if ModelKind.MARKOV in kinds:
        if any(kind not in (ModelKind.MARKOV, None) for kind in kinds):
            raise ValueError("draft and target must both be MarkovChains or both other "
                             "autoregressive models (lift a MarkovChain with "
                             "specjax.FiniteStateModel.from_markov_chain)")
        check_pair(draft, target)  # names a non-model argument
        return ModelKind.MARKOV
    if kinds == (ModelKind.FINITE_STATE, ModelKind.FINITE_STATE):
        check_shared_states(draft, target)
        return ModelKind.FINITE_STATE
    check_models(draft, target)
    return ModelKind.PROTOCOL


def check_horizon(kind: str, target, horizon) -> int:
    """``T`` of a run on models of ``kind``: a ``MarkovChain`` carries its own (``horizon`` must
    then be ``None`` or equal), any other model needs it given."""
    if kind == ModelKind.MARKOV:
        _checks.check_positive_int("horizon", horizon, allow_none=True)
        if horizon is not None and horizon != target.horizon:
            raise ValueError(f"horizon is the chains' own T = {target.horizon} for MarkovChain "
                             f"models; leave it None (got {horizon})")
        return target.horizon
    if horizon is None:
        raise ValueError("horizon must be given (a positive integer T) for models other than "
                         "MarkovChain (finite-state, n-gram and protocol models)")
    _checks.check_positive_int("horizon", horizon)
    return horizon
