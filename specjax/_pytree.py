"""Pytrees by one mechanism: frozen dataclasses registered with ``jax.tree_util.register_dataclass``.

Models and decoders are values: immutable, hashable by value, and JAX pytrees whose array fields
are leaves (traced, differentiable) and whose other fields are static metadata (part of ``jit``'s
cache key).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np


def array_field(**kwargs):
    """A dataclass field that is a pytree leaf (traced under ``jit``, differentiable); every
    other field of a ``decoder_dataclass`` is static metadata."""
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


def pytree_dataclass(cls):
    """Makes ``cls`` a frozen dataclass and a JAX pytree: fields made with ``array_field()`` are
    leaves, the others static metadata (hashable: part of ``jit``'s cache key). Equality and
    hashing compare values (leaves by content when concrete), so two equal decoders are one
    static setting."""
    cls = dataclasses.dataclass(frozen=True, eq=False, repr=True)(cls)
    data = [f.name for f in dataclasses.fields(cls) if f.metadata.get("array")]
    meta = [f.name for f in dataclasses.fields(cls) if not f.metadata.get("array")]
    cls.__eq__ = lambda self, other: type(other) is type(self) and \
        _value_key(self) == _value_key(other)
    cls.__hash__ = lambda self: hash(_value_key(self))
    return jax.tree_util.register_dataclass(cls, data_fields=data, meta_fields=meta)
