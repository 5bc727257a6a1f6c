"""Laying chains out over devices with JAX's own SPMD machinery (``jax.sharding``).

A run's chains are a 1-D axis of length ``C``. A user passes a ``jax.sharding.Mesh`` (chains are
split over all of its devices) or a ``NamedSharding`` of a 1-D array (``NamedSharding(mesh,
P("chains"))``); the samplers constrain every per-chain array to that layout inside ``jit``, and
XLA's partitioner runs each device's chains on that device, without communication until the
per-position counts are summed at the end. Everything else (the model's probabilities, the law
table, the key) is replicated. Because chain ``c`` draws its random numbers from a counter equal
to ``c`` (``specjax.sampling.engine.chain_bits``), the layout cannot change a single token.

**Several processes** (``jax.distributed.initialize``: a pod, several hosts, or two CPU
processes on one machine). ``jax.devices()`` is then every device of every process, so
``chain_sharding()`` is a global mesh, and every process makes the same call (same key, models
and settings: SPMD). Each process computes the chains of its own devices only, from the
replicated models and key, and nothing crosses processes on the trace path; the statistics path
all-reduces each chunk's counts. The results are global ``jax.Array``s: each process holds its
devices' chains (``addressable_shards``), and the counts of ``decoding_statistics`` (NumPy) are
the same on every process. ``gather(result)``, called on every process, gathers a result's
per-chain arrays into NumPy arrays on each (JAX's ``multihost_utils.process_allgather`` of each
array that spans processes). A key that differs between processes would silently mix two runs,
so it is checked first (``check_same_key``: one small all-gather).
"""

from __future__ import annotations

import math

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec

from specjax import _checks

__all__ = [
    "along_chains",
    "chain_sharding",
    "check_same_key",
    "constrain",
    "gather",
    "local_device",
    "local_share",
    "num_processes",
    "num_shards",
    "put_replicated",
    "replicated",
    "resolve",
]


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


def num_processes(sharding: NamedSharding | None) -> int:
    """How many processes hold devices of ``sharding`` (1 without a sharding)."""
    if sharding is None:
        return 1
    return len({device.process_index for device in sharding.device_set})


def local_share(sharding: NamedSharding | None) -> float:
    """The share of ``sharding``'s devices that this process holds (1 without a sharding): the
    part of a run's memory that lands on this host."""
    if sharding is None:
        return 1.0
    return len(sharding.addressable_devices) / len(sharding.device_set)


def local_device(sharding: NamedSharding | None):
    """A device of ``sharding`` that this process can address (the default device without
    one), for the memory checks."""
    if sharding is None:
        return jax.devices()[0]
    local = sharding.addressable_devices  # empty on a process outside the mesh
    return min(local, key=lambda device: device.id) if local else jax.local_devices()[0]


def check_same_key(key, sharding: NamedSharding | None) -> None:
    """Refuses a ``key`` that is not the same on every process of a ``sharding`` that spans
    several (``jax.distributed``): each process computes its own chains from its copy of the
    key, so different keys would silently join chains of different runs. One all-gather of the
    key's words; nothing to do on one process or under a transformation (a traced key).

    Raises:
      ValueError: the processes were given different keys.
    """
    if num_processes(sharding) <= 1 or not _checks.is_concrete(key):
        return
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    if isinstance(key, jax.Array) and not key.is_fully_addressable:
        if not key.is_fully_replicated:
            raise ValueError("key must be replicated on every process (a key from "
                             "jax.random.key(seed) on each), not split over them")
        key = key.addressable_data(0)
    words = np.asarray(key)
    every = np.asarray(multihost_utils.process_allgather(words))  # (processes, *shape)
    if not (every == words[None]).all():
        raise ValueError(
            f"key must be the same on every process under jax.distributed (each process "
            f"computes its own chains from its copy of it), got {every.shape[0]} processes whose "
            f"keys differ: seed every process alike, e.g. jax.random.key(0) on each")


def gather(result):
    """``result`` (a ``DecodingTrace``, ``DecodingStatistics``, ``Recording``, any pytree) with
    each of its arrays that spans several processes gathered into one NumPy array on this
    process; every other leaf as it is (the counts of ``decoding_statistics`` are already the
    same on every process). A collective under ``jax.distributed``: call it on every process.

    Example:
      >>> import jax, specjax
      >>> from specjax.sampling.sharding import gather
      >>> draft, target = specjax.paper_instance()
      >>> trace = specjax.decode(jax.random.key(0), specjax.Speculative(), draft, target, 8)
      >>> gather(trace).tokens.shape  # on one process, the arrays as they are
      (8, 51)
    """

    def one(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return multihost_utils.process_allgather(x, tiled=True)
        return x

    return jax.tree.map(one, result)
