"""Size estimates before allocating: refuse a run that cannot fit, before any JAX work.

The entry points that allocate in proportion to their arguments (``decode``'s trace, the law
tables of the Markov engine, ``decoding_statistics``' per-chain counts, the exact recursion's
per-position laws, ``random_markov_chain``'s transitions) estimate the bytes they will need and
call ``check_fits`` first. ``check_fits`` compares the estimate with ``available_bytes()``:

* on a CPU, the memory the machine (or its cgroup, when one limits the process) has available
  now: ``MemAvailable`` of ``/proc/meminfo``, else ``os.sysconf``'s available pages;
* on a GPU or TPU, the device's ``memory_stats()``: ``bytes_limit - bytes_in_use``.

When neither is known the check passes (nothing is refused on a guess). The estimates count
what XLA allocates (measured with ``jax.jit(...).lower(...).compile().memory_analysis()``) and
aim to be within a factor of 2 of the real peak; they do not count JAX's own footprint (about
0.3 GB of a CPU process). Tests patch ``available_bytes`` to a small number.
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["available_bytes", "check_fits", "format_bytes", "peak_resident_bytes"]

#: Above this, a cgroup limit means "no limit" (cgroup v1 writes 2**63 rounded to a page).
_NO_LIMIT = 1 << 60


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _stat_field(path: str, names) -> int:
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key in names and value.strip().isdigit():
                    return int(value)
    except OSError:
        pass
    return 0


def _cgroup_available() -> int | None:
    """What the process's memory cgroup (v2, else v1) still allows, page cache counted as free;
    ``None`` without a limit."""
    for limit_path, usage_path, stat_path, inactive in (
            ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current",
             "/sys/fs/cgroup/memory.stat", ("inactive_file",)),
            ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
             "/sys/fs/cgroup/memory/memory.usage_in_bytes",
             "/sys/fs/cgroup/memory/memory.stat", ("total_inactive_file",))):
        limit = _read_int(limit_path)
        if limit is None or limit >= _NO_LIMIT:
            continue
        usage = _read_int(usage_path)
        if usage is None:
            continue
        return max(0, limit - usage + _stat_field(stat_path, inactive))
    return None


def _host_available() -> int | None:
    """The machine's available RAM: ``MemAvailable`` (Linux), else available physical pages."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def available_bytes(device=None) -> int | None:
    """Bytes that a new allocation on ``device`` can use now, or ``None`` when unknown.

    Args:
      device: a ``jax.Device``; ``None`` for ``jax.devices()[0]``.

    Returns:
      On a CPU device, the host's available memory (``/proc/meminfo``'s ``MemAvailable``, or
      ``os.sysconf`` on other systems), lowered to what a memory cgroup still allows; on a GPU
      or TPU, ``bytes_limit - bytes_in_use`` of ``device.memory_stats()``; ``None`` when the
      platform reports nothing.
    """
    if device is None:
        import jax

        device = jax.devices()[0]
    if device.platform != "cpu":
        try:
            stats = device.memory_stats()
        except Exception:  # noqa: BLE001 - a backend without statistics: unknown, not an error
            stats = None
        if stats and "bytes_limit" in stats:
            return max(0, int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0)))
        return None
    host = _host_available()
    group = _cgroup_available()
    if host is None:
        return group
    return host if group is None else min(host, group)


def peak_resident_bytes() -> int:
    """This process's peak resident memory in bytes (``VmHWM`` of ``/proc/self/status`` on
    Linux, else ``ru_maxrss``), for benchmarks and memory tests.

    Not ``ru_maxrss`` on Linux: the kernel keeps it across ``execve``, so a child started by
    ``subprocess`` (vfork + exec) reports at least its parent's peak, e.g. a pytest worker's
    1.7 GB for a child that used 0.5 GB. ``VmHWM`` belongs to the process's own address space.
    """
    with contextlib.suppress(OSError):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


def format_bytes(nbytes: float) -> str:
    """``nbytes`` in decimal units for messages: ``'612 GB'``, ``'1.3 GB'``, ``'48 MB'``."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= size:
            value = nbytes / size
            return f"{value:.2g} {unit}" if value < 10 else f"{value:.0f} {unit}"
    return f"{int(nbytes)} B"


def check_fits(nbytes: int, *, argument: str, remedy: str, what: str = "",
               device=None) -> None:
    """Raise ``ValueError`` when an allocation of about ``nbytes`` cannot fit.

    Call it before any JAX work, with an honest estimate of the peak the call will add.

    Args:
      nbytes: the estimate, in bytes (on an accelerator: per device).
      argument: the argument(s) that set the size, as the message should show them, e.g.
        ``"num_chains = 3,000,000,000"``.
      remedy: what the user can do instead, e.g. ``"use specjax.decoding_statistics (counts
        only, chunked) or fewer chains"``.
      what: what the bytes hold, e.g. ``"tokens and flags of every chain"``.
      device: the device that will hold the allocation (``None``: the default device).

    Raises:
      ValueError: ``"<argument> needs about <size> (<what>), more than the <size> this machine
        has available; <remedy>"``.

    Example:
      >>> check_fits(10**3, argument="num_chains = 10", remedy="use fewer chains")
    """
    available = available_bytes(device)
    if available is None or nbytes <= available:
        return
    where = "this machine has" if device is None or device.platform == "cpu" else \
        f"device {device} has"
    detail = f" ({what})" if what else ""
    raise ValueError(f"{argument} needs about {format_bytes(nbytes)}{detail}, more than the "
                     f"{format_bytes(available)} {where} available; {remedy}")
