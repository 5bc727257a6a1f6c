"""What ``python -m specjax bench`` writes (``specjax.experiments.bench``): the run's
environment, ``bench.json`` (``to_json``, schema version ``SCHEMA_VERSION``; its fields are listed
in ``specjax.experiments.bench``'s docstring) and ``bench.md`` (``markdown``: a header line, one
table and the legend of its columns)."""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
import platform
import sys
from typing import NamedTuple

import numpy as np

from specjax.experiments.bench_cases import Row
from specjax.experiments.bench_cases import Sizes
from specjax.experiments.bench_cases import Z_LIMIT
from specjax.experiments.bench_timing import BOOTSTRAP_LEVEL
from specjax.experiments.bench_timing import bootstrap_ratio
from specjax.experiments.bench_timing import summary

__all__ = [
    "LEGEND",
    "RATIO",
    "Result",
    "SCHEMA_VERSION",
    "SIZE_NAMES",
    "command",
    "cpu_model",
    "environment",
    "fmt_size",
    "fmt_time",
    "load_average",
    "markdown",
    "named_sizes",
    "row_json",
    "to_json",
]

SCHEMA_VERSION = 2  # bench.json's layout; ``bench compare`` reads this version only
RATIO = "reference_time / specjax_time"  # every ratio's direction (medians of the wall times)


class Result(NamedTuple):
    """A whole bench run: where it ran and its rows.

    Attributes:
      device: the device JAX ran on, in words (``jax.devices()[0]``).
      platform: ``cpu``, ``gpu`` or ``tpu``.
      jax_version: JAX's version.
      specjax_version: specjax's version.
      commit: the git commit of specjax's checkout (``+modified`` if it has uncommitted
        changes), or ``unknown``.
      date: when the run started (UTC, ISO 8601).
      mode: ``default`` or ``quick``.
      cpu_count: the host's CPU cores.
      load: the host's load averages (1, 5, 15 minutes) at the start, or None.
      seconds: the run's wall time.
      sizes: the ``Sizes`` of the run, as a dict.
      rows: the ``Row``s of every case, in order (a case has one or more).
      environment: the rest of the environment (``environment()``: versions, CPU model, CUDA,
        ``XLA_FLAGS`` and ``JAX_*``, the load at the end), or None.
    """

    device: str
    platform: str
    jax_version: str
    specjax_version: str
    commit: str
    date: str
    mode: str
    cpu_count: int
    load: tuple | None
    seconds: float
    sizes: dict
    rows: list
    environment: dict | None = None


# The names of each tuple of ``Sizes``, in order (``bench.json`` gives the sizes by name).
SIZE_NAMES = {
    "samplers": ("V", "T", "C"), "theory": ("V", "T", "M"),
    "token_tree": ("V", "T", "C", "budget", "max_depth", "branching"),
    "optimal_acceptance": ("rows", "V", "drafts"), "verify": ("B", "K", "V"),
    "verify_tree": ("B", "branching", "V"), "stop_tokens": ("C",), "adaptive": ("V", "T", "K"),
    "pairs": ("V", "T", "B"), "serving": ("V", "T", "B", "K", "slots"),
}


def named_sizes(sizes: dict) -> dict:
    """``Sizes`` as a dict (``dataclasses.asdict``) with every tuple's values named
    (``SIZE_NAMES``): ``{"samplers": {"V": 7, "T": 50, "C": 200000}, ...}``."""
    out = {}
    for key, value in sizes.items():
        names = SIZE_NAMES.get(key)
        if names and len(names) == 1 and not isinstance(value, (tuple, list)):
            value = {names[0]: value}
        elif names and isinstance(value, (tuple, list)) and len(names) == len(value):
            value = dict(zip(names, value))
        out[key] = value
    return out


def fmt_size(size) -> str:
    """A row's sizes in words: ``V = 7, T = 50, C = 200,000``."""
    if isinstance(size, str):
        return size
    return ", ".join(f"{k} = {v:,}" if isinstance(v, int) else f"{k} = {tuple(v)}"
                     if isinstance(v, list) else f"{k} = {v}" for k, v in size.items())


# ----------------------------------------------------------------------------------- environment
def load_average() -> list | None:
    """``os.getloadavg()`` rounded (1, 5 and 15 minutes), or None where there is none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def cpu_model() -> str:
    """The CPU's model name, from ``/proc/cpuinfo`` where there is one, else ``platform``'s."""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware", "cpu model") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _cuda() -> dict | None:
    """CUDA's runtime, driver and cuDNN versions as JAX reports them, or None (no CUDA)."""
    try:
        from jax._src import lib  # noqa: PLC0415 - JAX's own record of its CUDA plugin
        versions = lib.cuda_versions
    except (ImportError, AttributeError):
        return None
    if versions is None:
        return None
    out = {}
    for name in ("cuda_runtime", "cuda_driver", "cudnn", "cufft", "cusolver", "cusparse",
                 "cublas"):
        fn = getattr(versions, f"{name}_get_version", None)
        try:
            out[name] = None if fn is None else fn()
        except Exception:  # noqa: BLE001 - a plugin without a GPU raises; the version is unknown
            out[name] = None
    return out if any(v is not None for v in out.values()) else None


def environment(load_end=None) -> dict:
    """Where a run ran, beyond ``Result``'s own fields: jaxlib, NumPy and Python versions, the
    operating system, the CPU model, the device kind and count, the backend's version, CUDA
    (``_cuda``), ``XLA_FLAGS`` and every ``JAX_*`` variable, and ``load_end``."""
    import jax  # noqa: PLC0415
    import jaxlib  # noqa: PLC0415

    devices = jax.devices()
    try:
        backend_version = devices[0].client.platform_version
    except AttributeError:
        backend_version = None
    return {"jaxlib": jaxlib.__version__, "numpy": np.__version__,
            "python": sys.version.split()[0], "python_implementation":
            platform.python_implementation(), "os": platform.platform(),
            "machine": platform.machine(), "cpu_model": cpu_model(),
            "device_kind": devices[0].device_kind, "device_count": len(devices),
            "backend_version": backend_version, "cuda": _cuda(),
            "env": {k: v for k, v in sorted(os.environ.items())
                    if k == "XLA_FLAGS" or k.startswith("JAX_")},
            "load_end": load_end}


# ----------------------------------------------------------------------------------- bench.json
def _clean(x):
    """``x`` ready for JSON: NaN and infinities as null, tuples as lists."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, np.generic):
        return _clean(x.item())
    return x


def _timing(samples, seconds) -> dict | None:
    if samples is None:
        if seconds is None or not math.isfinite(seconds):
            return None
        return {"repeats": 1, "wall_s": summary([seconds]), "cpu_s": None, "first_call_s": None}
    first = None if samples.first_wall is None else {"wall": samples.first_wall,
                                                      "cpu": samples.first_cpu}
    return {"repeats": len(samples.wall), "wall_s": summary(samples.wall),
            "cpu_s": summary(samples.cpu), "first_call_s": first}


def _ratio(r: Row) -> dict | None:
    if r.ratio is None:
        return None
    ours = r.timing.wall if r.timing is not None else (r.specjax_s,)
    theirs = r.reference_timing.wall if r.reference_timing is not None else (r.reference_s,)
    n = min(len(ours), len(theirs))
    paired = [b / a for a, b in zip(ours[:n], theirs[:n])]
    lo, hi = bootstrap_ratio(theirs, ours)
    reading = ("above 1: specjax is faster than NumPy" if r.reference_kind == "numpy" else
               f"the reference is specjax itself ({r.reference}): below 1, the feature timed "
               "costs time")
    return {"of": f"{r.reference or 'reference'} / specjax", "reading": reading,
            "median": r.ratio, "min": min(paired), "max": max(paired),
            "interval": [lo, hi], "level": BOOTSTRAP_LEVEL, "pairs": n}


def row_json(r: Row) -> dict:
    """One row of ``bench.json``."""
    reference = None
    if r.reference_s is not None:
        reference = {"name": r.reference, "kind": r.reference_kind,
                     **_timing(r.reference_timing, r.reference_s)}
    work = None
    if r.work is not None:
        rate = r.work / r.specjax_s if r.specjax_s > 0 else None
        work = {"units": r.work, "unit": r.unit, "per_s": rate}
    check = None
    if r.check:
        check = {"text": r.check, "agree": r.agree, **(r.check_fields or {})}
    return {"case": r.case, "name": r.name,
            "size": dict(r.size) if isinstance(r.size, dict) else {"text": r.size},
            "specjax": _timing(r.timing, r.specjax_s), "reference": reference,
            "ratio": _ratio(r), "work": work, "floor": r.floor, "check": check,
            "error": r.error}


def to_json(result: Result) -> dict:
    """The run as a JSON-ready dict (schema ``SCHEMA_VERSION``; times in seconds; NaN as null)."""
    env = {"specjax": result.specjax_version, "jax": result.jax_version,
           "device": result.device, "platform": result.platform,
           "cpu_count": result.cpu_count, "load_start": result.load}
    env.update(result.environment or {})
    sizes = result.sizes
    return _clean({
        "schema_version": SCHEMA_VERSION, "ratio": RATIO, "command": command(result),
        "mode": result.mode, "commit": result.commit, "date": result.date,
        "seconds": result.seconds,
        "repeats": {"specjax": sizes.get("repeats"), "reference": sizes.get("numpy_repeats")},
        "environment": env, "sizes": named_sizes(sizes),
        "rows": [row_json(r) for r in result.rows]})


# ----------------------------------------------------------------------------------- bench.md
def fmt_time(seconds) -> str:
    """Seconds in words: ``1.23 s``, ``45.6 ms``, ``789 us``, or ``-``."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} us"


def _fmt_spread(samples, seconds) -> str:
    if samples is None or len(samples.wall) < 2:
        return fmt_time(seconds)
    return (f"{fmt_time(samples.median)} [{fmt_time(min(samples.wall))} .. "
            f"{fmt_time(max(samples.wall))}]")


def _fmt_rate(row: Row) -> str:
    if row.work is None or not row.specjax_s > 0:
        return ""
    rate = row.work / row.specjax_s
    for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if rate >= scale:
            return f"{rate / scale:.3g} {prefix} {row.unit}/s"
    return f"{rate:.3g} {row.unit}/s"


def _fmt_ratio(r: Row) -> str:
    ratio = _ratio(r)
    if ratio is None:
        return ""
    text = f"{ratio['median']:.2f}x"
    if ratio["pairs"] > 1:
        text += f" [{ratio['interval'][0]:.2f}, {ratio['interval'][1]:.2f}]"
    return text + (" (vs specjax)" if r.reference_kind == "specjax" else "")


def command(result: Result) -> str:
    """What made the run: the command for its two modes (with ``--repeats`` where it is not the
    mode's default), else ``run`` with the sizes that differ from the defaults (from Python)."""
    if result.mode in ("default", "quick"):
        quick = result.mode == "quick"
        default = Sizes.quick() if quick else Sizes()
        repeats = result.sizes.get("repeats", default.repeats)
        extra = "" if repeats == default.repeats else f" --repeats {repeats}"
        return f"python -m specjax bench{' --quick' if quick else ''}{extra}"
    defaults = dataclasses.asdict(Sizes())
    changed = ", ".join(f"{k}={v!r}" for k, v in result.sizes.items() if defaults.get(k) != v)
    return f"specjax.experiments.bench.run ({result.mode}: {changed or 'the default sizes'})"


LEGEND = (
    "specjax: the median wall time of the repeats (in brackets: the fastest .. the slowest), "
    "compilation excluded, on the device above; first call: the warm-up call's wall time, "
    "compilation included. reference: the same for the reference, timed in turn with specjax "
    "(A B A B) on the same run (NumPy on the host; no warm-up). ratio: the reference's median "
    "over specjax's (" + RATIO + "), with a {level:.0%} bootstrap interval over the paired "
    "repeats: against NumPy, above 1 means specjax is faster. The stop_tokens row is not against "
    "NumPy: its reference is specjax itself without stop tokens, so its ratio (vs specjax) is "
    "the time without over the time with, and below 1 is what a stop token costs. % floor: the "
    "time to draw one uniform per chain-step in a scan over specjax's time. outputs: what the "
    "two computed on this run, side by side (z: the difference in standard errors; |z| < {z:g} "
    "agrees). bench.json has every sample, wall and process CPU time, and the environment.")


def markdown(result: Result) -> str:
    """The run as Markdown: a header line (command, device, versions, commit, date, CPU, load),
    one table and the legend of its columns."""
    env = result.environment or {}
    load = "" if result.load is None else f", load average {result.load[0]:.2f}"
    if env.get("load_end"):
        load += f" at the start, {env['load_end'][0]:.2f} at the end"
    versions = "".join(f", {name} {env[key]}" for name, key in (
        ("jaxlib", "jaxlib"), ("NumPy", "numpy"), ("Python", "python")) if env.get(key))
    cpu = f"{env['cpu_model']}, " if env.get("cpu_model") else ""
    repeats = result.sizes.get("repeats")
    runs = f"{repeats} repeats; " if repeats else ""
    name, _, sizes = command(result).partition(" (")  # from Python: the function, then sizes
    lines = [f"`{name}`{' (' + sizes if sizes else ''} on {result.device}; "
             f"JAX {result.jax_version}{versions}, "
             f"specjax {result.specjax_version}, commit {result.commit}; {result.date}; "
             f"{cpu}{result.cpu_count} CPU cores{load}; {runs}{result.seconds:.0f} s in all.",
             "",
             "| case | what | size | specjax | first call | reference | ratio | % floor "
             "| specjax rate | outputs |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in result.rows:
        if r.error is not None:
            lines.append(f"| {r.case} | failed: {r.error.replace('|', '/')} | | | | | | | | |")
            continue
        ref = "-" if r.reference_s is None else \
            f"{_fmt_spread(r.reference_timing, r.reference_s)} ({r.reference})"
        first = "" if r.timing is None else fmt_time(r.timing.first_wall)
        floor = "" if r.floor is None else f"{100 * r.floor:.{0 if r.floor >= 0.01 else 2}f}%"
        check = r.check + {None: "", True: "", False: " **DISAGREE**"}[r.agree]
        lines.append(f"| {r.case} | {r.name} | {fmt_size(r.size)} | "
                     f"{_fmt_spread(r.timing, r.specjax_s)} | {first} | {ref} | {_fmt_ratio(r)} "
                     f"| {floor} | {_fmt_rate(r)} | {check} |")
    lines += ["", LEGEND.format(level=BOOTSTRAP_LEVEL, z=Z_LIMIT)]
    return "\n".join(lines) + "\n"
