"""Laying chains out over devices with JAX's own SPMD machinery (``jax.sharding``).

A run's chains are a 1-D axis of length ``C``. A user passes a ``jax.sharding.Mesh`` (chains are
split over all of its devices) or a ``NamedSharding`` of a 1-D array (``NamedSharding(mesh,
P("chains"))``); the samplers constrain every per-chain array to that layout inside ``jit``, and
XLA's partitioner runs each device's chains on that device, without communication until the
per-position counts are summed at the end. Everything else (the model's probabilities, the law
table, the key) is replicated. Because chain ``c`` draws its random numbers from a counter equal
to ``c`` (``specjax.sampling.engine.chain_bits``), the layout cannot change a single token.
"""

from __future__ import annotations

import math

import jax
import numpy as np
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec


def chain_sharding(devices=None, axis_name: str = "chains") -> NamedSharding:
    """A sharding that splits chains evenly over ``devices`` (default: all of ``jax.devices()``).

    Args:
      devices: a sequence of devices; ``None`` for every device JAX sees (with
        ``jax.distributed``, every device of every process).
      axis_name: the name of the mesh axis.

    Returns:
      ``NamedSharding(Mesh(devices, (axis_name,)), P(axis_name))``, for the samplers'
      ``sharding=`` argument.
    """
    devices = jax.devices() if devices is None else list(devices)
    if not devices:
        raise ValueError("devices must name at least one device")
    mesh = Mesh(np.asarray(devices), (axis_name,))
    return NamedSharding(mesh, PartitionSpec(axis_name))


def resolve(sharding, num_chains: int | None = None) -> NamedSharding | None:
    """Validates the ``sharding=`` argument and returns a ``NamedSharding`` of 1-D chain arrays.

    Raises:
      ValueError: ``sharding`` is neither ``None``, a ``Mesh`` nor a 1-D ``NamedSharding``, or
        ``num_chains`` is not a multiple of the number of shards.
    """
    if sharding is None:
        return None
    if isinstance(sharding, Mesh):
        sharding = NamedSharding(sharding, PartitionSpec(tuple(sharding.axis_names)))
    if not isinstance(sharding, NamedSharding):
        raise ValueError(
            "sharding must be None, a jax.sharding.Mesh or a jax.sharding.NamedSharding of the "
            f"chain axis (e.g. specjax.chain_sharding()), got {type(sharding).__name__}")
    if len(sharding.spec) > 1:
        raise ValueError(
            "sharding must describe a 1-D array of chains (a PartitionSpec with one entry), got "
            f"spec {sharding.spec}")
    shards = num_shards(sharding)
    if num_chains is not None and num_chains % shards:
        raise ValueError(
            f"num_chains ({num_chains}) must be a multiple of the number of shards ({shards}) "
            f"of sharding")
    return sharding


def _axes(sharding: NamedSharding) -> tuple:
    if not len(sharding.spec) or sharding.spec[0] is None:
        return ()
    entry = sharding.spec[0]
    return entry if isinstance(entry, tuple) else (entry,)


def num_shards(sharding: NamedSharding | None) -> int:
    """How many pieces the chain axis is cut into (1 without a sharding)."""
    if sharding is None:
        return 1
    return math.prod(sharding.mesh.shape[a] for a in _axes(sharding))


def along_chains(sharding: NamedSharding | None, ndim: int) -> NamedSharding | None:
    """The sharding of an ``ndim``-D array whose first axis is the chains."""
    if sharding is None:
        return None
    first = sharding.spec[0] if len(sharding.spec) else None
    return NamedSharding(sharding.mesh, PartitionSpec(first, *([None] * (ndim - 1))))


def replicated(sharding: NamedSharding | None) -> NamedSharding | None:
    """The fully replicated sharding on the same mesh."""
    return None if sharding is None else NamedSharding(sharding.mesh, PartitionSpec())


def constrain(x: jax.Array, sharding: NamedSharding | None) -> jax.Array:
    """``x`` (first axis: chains) laid out like ``sharding``; a no-op without a sharding."""
    if sharding is None:
        return x
    return jax.lax.with_sharding_constraint(x, along_chains(sharding, x.ndim))


def put_replicated(tree, sharding: NamedSharding | None):
    """Places the (small) model arrays on every device of the mesh, so a model committed to one
    device does not clash with chains laid out over several."""
    if sharding is None:
        return tree
    return jax.device_put(tree, replicated(sharding))
