"""Pytrees by one mechanism: frozen dataclasses registered as JAX pytrees (``pytree_dataclass``).

Models and decoders are values: immutable, hashable by value, and JAX pytrees whose array fields
are leaves (traced, differentiable) and whose other fields are static metadata (part of ``jit``'s
cache key).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["array_field", "pytree_dataclass", "tree_where"]


def tree_where(flag, new, old):
    """``new`` where ``flag``, else ``old``, leaf by leaf (two pytrees of one structure)."""
    return jax.tree_util.tree_map(lambda a, b: jnp.where(flag, a, b), new, old)


def array_field(**kwargs):
    """A dataclass field that is a pytree child (a leaf or a subtree of leaves: traced under
    ``jit``, differentiable); every other field of a ``pytree_dataclass`` (``decoder_dataclass``)
    is static metadata."""
    metadata = dict(kwargs.pop("metadata", {}), array=True)
    return dataclasses.field(metadata=metadata, **kwargs)


def _leaf_key(x):
    if isinstance(x, jax.core.Tracer):
        return ("traced", id(x))
    value = np.asarray(x)
    return (value.dtype.str, value.shape, value.tobytes())


def _value_key(obj):
    leaves, treedef = jax.tree_util.tree_flatten(obj)
    return (type(obj), treedef, tuple(_leaf_key(leaf) for leaf in leaves))


def pytree_dataclass(cls=None, *, init_on_unflatten: bool = True):
    """Makes ``cls`` a frozen dataclass and a JAX pytree: fields made with ``array_field()`` are
    leaves, the others static metadata (hashable: part of ``jit``'s cache key). Equality and
    hashing compare values (leaves by content when concrete), so two equal decoders are one
    static setting.

    ``init_on_unflatten=True`` (the default) unflattens by calling the constructor (as
    ``jax.tree_util.register_dataclass`` would): ``__post_init__`` then also sees tracers,
    abstract values, placeholders (``None``, ``object()``) and gradients as leaves, so it may
    check static fields only. With ``init_on_unflatten=False``
    (``@pytree_dataclass(init_on_unflatten=False)``) unflattening sets the fields directly and
    only a call of the class runs ``__init__`` and ``__post_init__``: for classes whose
    constructor validates the leaves' values (models: rows summing to one), which a gradient or
    a placeholder need not satisfy.
    """
    if cls is None:
        return functools.partial(pytree_dataclass, init_on_unflatten=init_on_unflatten)
    cls = dataclasses.dataclass(frozen=True, eq=False, repr=True)(cls)
    data = [f.name for f in dataclasses.fields(cls) if f.metadata.get("array")]
    meta = [f.name for f in dataclasses.fields(cls) if not f.metadata.get("array")]
    cls.__eq__ = lambda self, other: type(other) is type(self) and \
        _value_key(self) == _value_key(other)
    cls.__hash__ = lambda self: hash(_value_key(self))
    # Registered by hand rather than with jax.tree_util.register_dataclass: in jaxlib 0.10.2 the
    # PyTreeDefs of two register_dataclass classes with the same fields compare equal (their
    # hashes differ), so jit's caches could hand one decoder's compiled program to another of
    # the same layout (RejectionThreshold and ConfidenceThreshold, KSequential(2) and
    # ImportanceWeighted(2)) when a hash table matched them by chance; a study saw it happen.
    # A custom node's PyTreeDef compares its class. tests/test_api.py checks both.
    keys = [jax.tree_util.GetAttrKey(name) for name in data]

    def flatten(obj):
        return (tuple(getattr(obj, name) for name in data),
                tuple(getattr(obj, name) for name in meta))

    def flatten_with_keys(obj):
        children, aux = flatten(obj)
        return tuple(zip(keys, children)), aux

    def unflatten(aux, children):
        if init_on_unflatten:  # as register_dataclass: the constructor sees the leaves
            return cls(**dict(zip(meta, aux)), **dict(zip(data, children)))
        obj = object.__new__(cls)
        for name, value in zip(meta, aux):
            object.__setattr__(obj, name, value)
        for name, value in zip(data, children):
            object.__setattr__(obj, name, value)
        return obj

    jax.tree_util.register_pytree_with_keys(cls, flatten_with_keys, unflatten, flatten)
    return cls
