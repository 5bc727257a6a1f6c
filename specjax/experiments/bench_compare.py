"""``python -m specjax bench compare A.json B.json``: two bench runs (two commits, two machines)
case by case.

For each row of both runs (matched by case and name), the change is ``median_B / median_A`` of
specjax's wall times, with a ``BOOTSTRAP_LEVEL`` bootstrap interval (each run's samples
resampled on their own). The rule that marks a change beyond the measured noise:

* each run's spread is ``[min / median, max / median]`` of its samples; the noise band is the
  union of the two runs' spreads, ``[lo, hi]``;
* a change is **slower** when ``median_B / median_A > max(hi, 1 + margin)`` and its bootstrap
  interval lies wholly above 1; **faster** when it is below ``min(lo, 1 / (1 + margin))`` and
  its interval wholly below 1 (``margin``, default ``NOISE_MARGIN`` = 10%, keeps runs of one
  repeat, or of tiny spread, from marking a few percent); else it is within the noise.

A run compared with itself marks nothing; every sample of one case made twice as slow is marked
slower when that case's samples spread over less than a factor of two (``max / min < 2``).
"""

from __future__ import annotations

import json
import math
import pathlib
from typing import NamedTuple

import numpy as np

from specjax.experiments.bench_report import SCHEMA_VERSION
from specjax.experiments.bench_report import fmt_time
from specjax.experiments.bench_timing import BOOTSTRAP_LEVEL
from specjax.experiments.bench_timing import bootstrap_ratio

__all__ = ["Change", "NOISE_MARGIN", "change", "compare", "load", "markdown"]

NOISE_MARGIN = 0.10  # the least change marked, whatever the spread


def load(path) -> dict:
    """``bench.json`` at ``path``, checked to be of schema ``SCHEMA_VERSION``.

    Raises:
      ValueError: naming ``path``: it cannot be read, is not JSON, is not a bench run, or has
        another schema version.
    """
    name = repr(str(path))
    try:
        text = pathlib.Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise ValueError(f"{name} cannot be read ({err.strerror or err})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{name} is not a text file (a bench.json is JSON)") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{name} is not JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(data, dict) or "rows" not in data:
        raise ValueError(f"{name} is not a bench.json (no rows)")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        was = "no schema_version (a run of an older specjax)" if version is None else \
            f"schema_version {version!r}"
        raise ValueError(f"{name} has {was}; bench compare reads schema_version "
                         f"{SCHEMA_VERSION} only: rerun python -m specjax bench")
    if not isinstance(data["rows"], list) or not all(
            isinstance(r, dict) and "case" in r and "name" in r for r in data["rows"]):
        raise ValueError(f"{name}: its rows are not bench rows (each with a case and a name)")
    return data


class Change(NamedTuple):
    """One row of ``compare``: specjax's median time in two runs.

    Attributes:
      case, name: the row's.
      a, b: the two runs' median wall times (seconds), or None (no row, failed, no samples).
      change: ``b / a``, or None.
      interval: its bootstrap interval ``(lo, hi)``, or None.
      band: the noise band ``(lo, hi)`` (the union of the two runs' relative spreads), or None.
      verdict: ``slower``, ``faster``, ``within noise``, ``only in A``, ``only in B``,
        ``failed`` or ``no samples``.
      ratio_a, ratio_b: the row's ratio (reference / specjax) in each run, or None.
    """

    case: str
    name: str
    a: float | None
    b: float | None
    change: float | None
    interval: tuple | None
    band: tuple | None
    verdict: str
    ratio_a: float | None = None
    ratio_b: float | None = None

    @property
    def flagged(self) -> bool:
        """Whether the change is beyond the noise."""
        return self.verdict in ("slower", "faster")


def _samples(row) -> list | None:
    try:
        values = [float(x) for x in row["specjax"]["wall_s"]["samples"]]
    except (KeyError, TypeError, ValueError):
        return None
    return values if values and all(math.isfinite(x) and x > 0 for x in values) else None


def _ratio(row):
    ratio = row.get("ratio")
    return ratio.get("median") if isinstance(ratio, dict) else None


def _keyed(rows) -> dict:
    """``{(case, name, k): row}``, ``k`` counting rows of the same case and name."""
    out, seen = {}, {}
    for r in rows:
        key = (str(r["case"]), str(r["name"]))
        seen[key] = seen.get(key, -1) + 1
        out[(*key, seen[key])] = r
    return out


def change(a_samples, b_samples, margin: float = NOISE_MARGIN):
    """``(change, interval, band, verdict)`` of two runs' samples (the module's rule).

    Example:
        >>> from specjax.experiments.bench_compare import change
        >>> change([1.0, 1.1, 0.9], [2.0, 2.2, 1.8])[3]
        'slower'
    """
    med_a, med_b = float(np.median(a_samples)), float(np.median(b_samples))
    ratio = med_b / med_a
    lo = min(min(a_samples) / med_a, min(b_samples) / med_b)
    hi = max(max(a_samples) / med_a, max(b_samples) / med_b)
    interval = bootstrap_ratio(b_samples, a_samples, paired=False)
    if ratio > max(hi, 1 + margin) and interval[0] > 1:
        verdict = "slower"
    elif ratio < min(lo, 1 / (1 + margin)) and interval[1] < 1:
        verdict = "faster"
    else:
        verdict = "within noise"
    return ratio, interval, (lo, hi), verdict


def compare(a: dict, b: dict, margin: float = NOISE_MARGIN) -> list:
    """The ``Change`` of every row of two runs (``load``'s dicts), A's rows first, then those
    only in B."""
    rows_a, rows_b = _keyed(a["rows"]), _keyed(b["rows"])
    out = []
    for key in [*rows_a, *(k for k in rows_b if k not in rows_a)]:
        ra, rb = rows_a.get(key), rows_b.get(key)
        case, name = key[0], key[1]
        if ra is None or rb is None:
            only = "only in A" if rb is None else "only in B"
            out.append(Change(case, name, None, None, None, None, None, only))
            continue
        sa, sb = _samples(ra), _samples(rb)
        ratios = (_ratio(ra), _ratio(rb))
        if ra.get("error") or rb.get("error"):
            out.append(Change(case, name, None, None, None, None, None, "failed", *ratios))
        elif sa is None or sb is None:
            out.append(Change(case, name, None, None, None, None, None, "no samples", *ratios))
        else:
            ratio, interval, band, verdict = change(sa, sb, margin)
            out.append(Change(case, name, float(np.median(sa)), float(np.median(sb)), ratio,
                              interval, band, verdict, *ratios))
    return out


def _run_line(label: str, path, run: dict) -> str:
    env = run.get("environment") or {}
    device = env.get("device", "?")
    cpu = env.get("cpu_model")
    reps = (run.get("repeats") or {}).get("specjax")
    return (f"{label} = {path}: commit {run.get('commit', '?')}, {run.get('date', '?')}, "
            f"{run.get('mode', '?')} mode, {reps} repeats, {device}"
            + (f", {cpu}" if cpu else "") + f", JAX {env.get('jax', '?')}")


def markdown(a: dict, b: dict, changes, paths=("A", "B"), margin: float = NOISE_MARGIN) -> str:
    """``compare``'s table: per row the two medians, the change with its interval, the noise
    band, the verdict, and the ratio against the reference in each run; then a count."""
    lines = [_run_line("A", paths[0], a), _run_line("B", paths[1], b), ""]
    env_a, env_b = a.get("environment") or {}, b.get("environment") or {}
    differ = [k for k in ("device", "cpu_model", "jax", "jaxlib", "numpy", "cpu_count")
              if env_a.get(k) != env_b.get(k)]
    if differ:
        lines += [f"The runs differ in {', '.join(differ)}: a change may be the machine's.", ""]
    lines += ["| case | what | A median | B median | change B/A | "
              f"{BOOTSTRAP_LEVEL:.0%} interval | noise band | verdict | ratio A -> B |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
    for c in changes:
        ratios = " -> ".join("-" if r is None else f"{r:.2f}x" for r in (c.ratio_a, c.ratio_b))
        if c.change is None:
            lines.append(f"| {c.case} | {c.name} | | | | | | {c.verdict} | {ratios} |")
            continue
        verdict = f"**{c.verdict.upper()}**" if c.flagged else c.verdict
        lines.append(f"| {c.case} | {c.name} | {fmt_time(c.a)} | {fmt_time(c.b)} | "
                     f"{c.change:.2f}x | [{c.interval[0]:.2f}, {c.interval[1]:.2f}] | "
                     f"[{c.band[0]:.2f}, {c.band[1]:.2f}] | {verdict} | {ratios} |")
    slower = sum(c.verdict == "slower" for c in changes)
    faster = sum(c.verdict == "faster" for c in changes)
    compared = sum(c.change is not None for c in changes)
    lines += ["", f"{compared} rows compared: {slower} slower, {faster} faster beyond the "
              f"noise. change: B's median wall time of specjax over A's (above 1: B is slower). "
              f"A change is marked when it lies outside the noise band (the union of both runs' "
              f"min/median .. max/median) and beyond {margin:.0%}, and its interval excludes 1."]
    return "\n".join(lines) + "\n"
