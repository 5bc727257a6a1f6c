"""The model protocol: what a model must provide so that every entry point can run it.

Every member of the protocol is declared on the base classes below with its default, and the
library reads the members, never probes for them: a model's ``kind`` is a class attribute, an
optional hook a method whose default is the behaviour of a model without it, and whether a
model gives a hook itself is a class-level flag (``has_logits``, ``has_probs_block``, ...) set
for a subclass that defines it. ``MODEL_PROTOCOL`` lists the members of each base class.

**Every model** (``Model``) provides

* ``kind``: a ``ModelKind``, what the entry points can do with it (``"markov"``: a
  ``MarkovChain``, every decoder, exact and Monte Carlo; ``"finite_state"``: a
  ``FiniteStateModel``, exact values on a shared state space; ``"protocol"``: any other model of
  the protocol, Monte Carlo). The kind of a pair of models is ``markov`` for two chains,
  ``finite_state`` for two finite-state models and ``protocol`` for any other two protocol models
  (``specjax.models.checks.model_kind``);
* ``num_states``: ``V``, the number of tokens (a static Python int);
* ``dtype``: the float dtype of its probabilities.

**A model of the protocol** (``ProtocolModel``; every model but ``MarkovChain``) provides

* ``init_state() -> state``: the context before ``x_0`` (a pytree of arrays); required;
* ``update(state, token) -> state``: the context after emitting ``token`` (an int32 scalar);
  required;
* ``probs(state) -> (V,)`` or ``logits(state) -> (V,)``: the next-token law in that context; one
  of the two is required, the other's default is derived from it (``softmax`` of the logits,
  ``log`` of the probabilities);
* optionally ``probs_block(state, tokens) -> (K + 1, V)`` and ``logits_block``: the rows in
  ``state`` and after each prefix of ``tokens (K,)``, scored in one evaluation (batched scoring).
  The defaults: ``probs_block`` scans ``probs`` and ``update``; ``logits_block`` is the log of
  the model's own ``probs_block`` when it gives one, else a scan of ``logits`` and ``update``.

``init_state``, ``probs`` (``logits``) and ``update`` work on one context and must be traceable;
the engines ``vmap`` them over chains.

**A user's model need not subclass these.** Any JAX pytree with the required members is a model
of the protocol (``docs/guides/models.md``). ``as_model(obj)`` is the one place that reads such
an object: it returns a library model unchanged, and a user's object as a ``UserModel``, a view
of it that declares the members the object gives (found once, by a static lookup of the declared
names) and the defaults of the others; an object that lacks a required member gets one
``ValueError`` naming what it lacks.
"""

from __future__ import annotations

import enum
import inspect
from typing import ClassVar

import jax
import jax.numpy as jnp

__all__ = [
    "MODEL_PROTOCOL",
    "Model",
    "ModelKind",
    "ProtocolModel",
    "REQUIRED_HOOKS",
    "UserModel",
    "as_model",
    "model_view",
    "scan_rows",
]


class ModelKind(enum.StrEnum):
    """What the entry points can do with a model (or a pair): its class's ``kind``. A
    ``str``: each kind equals its name (``ModelKind.MARKOV == "markov"``), as the decoders'
    ``model_kinds`` spell them."""

    #: A ``MarkovChain``: position-indexed tables, every decoder, exact values and Monte Carlo.
    MARKOV = "markov"
    #: A ``FiniteStateModel``: ``S`` integer states, exact values on a shared state space.
    FINITE_STATE = "finite_state"
    #: Any other model of the protocol: Monte Carlo.
    PROTOCOL = "protocol"


def scan_rows(row, update, state, tokens) -> jax.Array:
    """``(K + 1, ...)``: ``row(state)`` after each prefix of ``tokens``, one position at a time."""

    def step(s, x):
        return update(s, x), row(s)

    last, rows = jax.lax.scan(step, state, tokens)
    return jnp.concatenate([rows, row(last)[None]], axis=0)


class Model:
    """Base class of every model (see the module docstring for the protocol)."""

    #: What the entry points can do with the model (``ModelKind``); every model class declares
    #: it.
    kind: ClassVar[ModelKind]

    @property
    def num_states(self) -> int:
        """``V``, the number of tokens (static)."""
        raise NotImplementedError(f"{type(self).__name__} does not give num_states")

    @property
    def dtype(self):
        """The float dtype of the model's probabilities."""
        raise NotImplementedError(f"{type(self).__name__} does not give its dtype")


#: The hooks of ``ProtocolModel`` whose presence a flag declares: hook -> flag.
_FLAGGED = {"probs": "has_probs", "logits": "has_logits", "probs_block": "has_probs_block",
            "logits_block": "has_logits_block"}


class ProtocolModel(Model):
    """A model of the autoregressive protocol: ``init_state``, ``update``, and ``probs`` or
    ``logits`` (see the module docstring). A subclass that defines a hook gives it: its flag
    (``has_probs``, ``has_logits``, ``has_probs_block``, ``has_logits_block``) is set."""

    kind: ClassVar[ModelKind] = ModelKind.PROTOCOL
    #: Whether the model gives ``probs`` itself (set for a subclass that defines it).
    has_probs: ClassVar[bool] = False
    #: Whether the model gives ``logits`` itself (set for a subclass that defines it).
    has_logits: ClassVar[bool] = False
    #: Whether the model scores a block itself with ``probs_block`` (set for a subclass that
    #: defines it).
    has_probs_block: ClassVar[bool] = False
    #: Whether the model scores a block itself with ``logits_block`` (set for a subclass that
    #: defines it).
    has_logits_block: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for hook, flag in _FLAGGED.items():
            if callable(cls.__dict__.get(hook)) and flag not in cls.__dict__:
                setattr(cls, flag, True)

    @property
    def dtype(self):
        """The dtype of ``probs(init_state())`` (its shape evaluated, nothing computed)."""
        return jax.eval_shape(lambda: self.probs(self.init_state())).dtype

    def init_state(self):
        """The context before ``x_0`` (a pytree of arrays). Required."""
        raise NotImplementedError(f"{type(self).__name__} does not give init_state")

    def update(self, state, token):
        """The context after emitting ``token`` (an int32 scalar) in ``state``. Required."""
        raise NotImplementedError(f"{type(self).__name__} does not give update")

    def probs(self, state) -> jax.Array:
        """``(V,)`` next-token probabilities in ``state``: by default the softmax of
        ``logits``."""
        if not self.has_logits:
            raise NotImplementedError(f"{type(self).__name__} gives neither probs nor logits")
        return jax.nn.softmax(self.logits(state), axis=-1)

    def logits(self, state) -> jax.Array:
        """``(V,)`` next-token logits in ``state``: by default the log of ``probs``."""
        if not self.has_probs:
            raise NotImplementedError(f"{type(self).__name__} gives neither probs nor logits")
        return jnp.log(self.probs(state))

    def probs_block(self, state, tokens) -> jax.Array:
        """``(K + 1, V)``: the rows in ``state`` and after each prefix of ``tokens (K,)`` (row
        ``j`` after ``tokens[:j]``). By default a scan of ``probs`` and ``update``."""
        return scan_rows(self.probs, self.update, state, tokens)

    def logits_block(self, state, tokens) -> jax.Array:
        """``probs_block``'s rows as logits: by default the log of the model's own
        ``probs_block`` when it gives one, else a scan of ``logits`` and ``update``."""
        if self.has_probs_block:
            return jnp.log(self.probs_block(state, tokens))
        return scan_rows(self.logits, self.update, state, tokens)


#: Every member of the protocol, by the base class that declares it with its default.
MODEL_PROTOCOL = {
    Model: ("kind", "num_states", "dtype"),
    ProtocolModel: ("init_state", "update", "probs", "logits", "probs_block", "logits_block",
                    "has_probs", "has_logits", "has_probs_block", "has_logits_block"),
}

#: What a user's object must give to be a model of the protocol; ``("probs", "logits")``: one
#: of the two.
REQUIRED_HOOKS = ("num_states", "init_state", ("probs", "logits"), "update")

_METHODS = ("init_state", "update", "probs", "logits", "probs_block", "logits_block")
_ABSENT = object()


def _given_members(obj) -> frozenset:
    """The declared members ``obj`` gives: each of ``num_states`` and the hooks found by a
    static lookup (the instance's attributes, then its class's), a hook only when callable.
    The one place that reads a user's object; nothing is called or evaluated."""
    found = set()
    for name in ("num_states",) + _METHODS:
        raw = inspect.getattr_static(obj, name, _ABSENT)
        if raw is _ABSENT:
            continue
        if name == "num_states" or callable(raw) or isinstance(raw, classmethod):
            found.add(name)
    return frozenset(found)


def _missing(members: frozenset) -> list[str]:
    return [" or ".join(need) if isinstance(need, tuple) else need for need in REQUIRED_HOOKS
            if not (set(need) if isinstance(need, tuple) else {need}) & members]


@jax.tree_util.register_pytree_node_class
class UserModel(ProtocolModel):
    """A user's object of the protocol, seen as a ``ProtocolModel`` (``as_model`` builds it):
    its members where the object gives them, the protocol's defaults for the others.

    A pytree whose child is the object (its leaves are the object's leaves) and whose static
    data is the set of members the object gives.

    Attributes:
      model: the user's object.
      members: the declared members it gives (a frozenset of names).
    """

    kind: ClassVar[ModelKind] = ModelKind.PROTOCOL

    def __init__(self, model, members: frozenset):
        self.model = model
        self.members = frozenset(members)

    def tree_flatten(self):
        return (self.model,), self.members

    @classmethod
    def tree_unflatten(cls, members, children):
        return cls(children[0], members)

    has_probs = property(lambda self: "probs" in self.members)
    has_logits = property(lambda self: "logits" in self.members)
    has_probs_block = property(lambda self: "probs_block" in self.members)
    has_logits_block = property(lambda self: "logits_block" in self.members)

    @property
    def num_states(self) -> int:
        return self.model.num_states

    def init_state(self):
        return self.model.init_state()

    def update(self, state, token):
        return self.model.update(state, token)

    def probs(self, state) -> jax.Array:
        return self.model.probs(state) if self.has_probs else super().probs(state)

    def logits(self, state) -> jax.Array:
        return self.model.logits(state) if self.has_logits else super().logits(state)

    def probs_block(self, state, tokens) -> jax.Array:
        if self.has_probs_block:
            return self.model.probs_block(state, tokens)
        return super().probs_block(state, tokens)

    def logits_block(self, state, tokens) -> jax.Array:
        if self.has_logits_block:
            return self.model.logits_block(state, tokens)
        return super().logits_block(state, tokens)

    def __repr__(self) -> str:
        return f"UserModel({self.model!r})"


def _lacks(obj) -> list[str]:
    """The required members ``obj`` lacks: read off the class of a ``Model`` (the base's
    default of a required hook is not a hook), off ``obj`` itself otherwise."""
    if isinstance(obj, UserModel) or not isinstance(obj, ProtocolModel):
        return [] if isinstance(obj, Model) else _missing(_given_members(obj))
    cls = type(obj)
    return [name for name, given in (
        ("init_state", cls.init_state is not ProtocolModel.init_state),
        ("probs or logits", obj.has_probs or obj.has_logits),
        ("update", cls.update is not ProtocolModel.update)) if not given]


def model_view(obj) -> Model | None:
    """``obj`` as a ``Model``: a library model itself, a user's object of the protocol as a
    ``UserModel``; ``None`` for anything else (a class, a value without the required
    members)."""
    if isinstance(obj, type) or _lacks(obj):
        return None
    return obj if isinstance(obj, Model) else UserModel(obj, _given_members(obj))


def as_model(obj, name: str = "model") -> Model:
    """``obj`` as a ``Model`` (``model_view``), or a ``ValueError`` naming ``name`` and the
    required members ``obj`` lacks.

    Example:
      >>> import jax.numpy as jnp, specjax
      >>> from specjax.models.base import as_model
      >>> class Uniform:  # a user's model of the protocol: no base class needed
      ...     num_states = 3
      ...     def init_state(self): return jnp.zeros((), jnp.int32)
      ...     def logits(self, state): return jnp.zeros(3)
      ...     def update(self, state, token): return state
      >>> model = as_model(Uniform())
      >>> model.kind, model.has_probs, round(float(model.probs(model.init_state())[0]), 4)
      (<ModelKind.PROTOCOL: 'protocol'>, False, 0.3333)
      >>> as_model(specjax.paper_instance()[0]).kind == "markov"
      True
    """
    view = model_view(obj)
    if view is not None:
        return view
    lacks = "" if isinstance(obj, type) else f"; it lacks {', '.join(_lacks(obj))}"
    what = f"the class {obj.__name__} (pass an instance)" if isinstance(obj, type) else \
        type(obj).__name__
    raise ValueError(
        f"{name} must be a specjax.MarkovChain or an autoregressive model (num_states, "
        f"init_state(), probs(state) or logits(state), update(state, token); see "
        f"specjax.models), got {what}{lacks}")
