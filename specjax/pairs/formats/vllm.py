"""vLLM's speculative decoding metrics: its Prometheus counters (``read_vllm_metrics``) and
its periodic "SpecDecoding metrics" log line (``read_vllm_log``, ``sum_vllm_log``).
Sources: ``specjax.pairs.formats``.
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

import numpy as np

from specjax.pairs.profiles import read_profile

__all__ = [
    "VllmLogLine",
    "VllmLogTotals",
    "VllmMetrics",
    "read_vllm_log",
    "read_vllm_metrics",
    "sum_vllm_log",
]


# ------------------------------------------------------------------------------------------
# vLLM: Prometheus counters
# ------------------------------------------------------------------------------------------

_VLLM = "vllm:spec_decode_"
_VLLM_COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens",
                  "num_accepted_tokens_per_pos")
_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?"
                     r"\s+(?P<value>\S+)(?:\s+(?P<timestamp>-?\d+))?\s*$")
_LABEL = re.compile(r'\s*(?P<key>[A-Za-z_][A-Za-z0-9_]*)\s*=\s*"(?P<value>(?:[^"\\]|\\.)*)"'
                    r'\s*(?:,|$)')
_PER_ENGINE = ("engine", "position")  # labels summed over (engine) or kept (position)


class VllmMetrics(NamedTuple):
    """vLLM's speculative decoding counters, summed over engines (``read_vllm_metrics``).

    Attributes:
      num_drafts: speculation rounds (target calls that drafted).
      num_draft_tokens: drafted tokens.
      num_accepted_tokens: accepted drafts.
      num_accepted_tokens_per_pos: ``(K,)``, rounds whose ``i``-th draft was accepted.
      profile: ``(K,)``, ``num_accepted_tokens_per_pos / num_drafts``.
      mean_acceptance_length: ``1 + num_accepted_tokens / num_drafts``.
      draft_acceptance_rate: ``num_accepted_tokens / num_draft_tokens`` (0 without drafts).
      labels: the labels the series share (``engine`` and ``position`` left out).
      engines: the number of engines summed.
    """

    num_drafts: float
    num_draft_tokens: float
    num_accepted_tokens: float
    num_accepted_tokens_per_pos: np.ndarray
    profile: np.ndarray
    mean_acceptance_length: float
    draft_acceptance_rate: float
    labels: dict
    engines: int


def _parse_labels(text: str, line: int) -> dict:
    labels, position = {}, 0
    text = text.strip()
    while position < len(text):
        match = _LABEL.match(text, position)
        if match is None:
            raise ValueError(f"text: line {line}: malformed labels {{{text}}}"[:300])
        value = re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1),
                       match["value"])
        labels[match["key"]] = value
        position = match.end()
    return labels


def read_vllm_metrics(text: str, *, select: dict | None = None) -> VllmMetrics:
    """vLLM's speculative decoding counters from Prometheus exposition text (its ``/metrics``
    page, or ``prometheus_client.generate_latest``), summed over engines; the profile by
    ``read_profile``.

    Args:
      text: the exposition text. Samples are ``name{labels} value [timestamp]``; a counter's
        sample may end in ``_total`` (prometheus_client's) or not; ``# HELP``/``# TYPE`` lines,
        ``_created`` samples and every other metric are ignored.
      select: keep only the series whose labels include these (``{"model_name": "m"}``), when
        the text holds several models.

    Returns:
      ``VllmMetrics``: the counts are exact; the rates are their ratios, as vLLM's PromQL
      queries compute them over the whole run.

    Raises:
      ValueError: a malformed sample line, a counter missing (speculative decoding off), a
        counter given twice, a non-finite or negative count, positions that are not 0..K-1,
        counts that increase with the position, positions that do not sum to the accepted
        count, more accepted than drafted tokens, or series of several models (pairs: summing
        them would mix them; ``select`` one).

    Example:
      >>> from specjax.pairs import formats
      >>> m = formats.read_vllm_metrics('''
      ... # TYPE vllm:spec_decode_num_drafts counter
      ... vllm:spec_decode_num_drafts_total{engine="0"} 100.0
      ... vllm:spec_decode_num_draft_tokens_total{engine="0"} 300.0
      ... vllm:spec_decode_num_accepted_tokens_total{engine="0"} 120.0
      ... vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 70.0
      ... vllm:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 40.0
      ... vllm:spec_decode_num_accepted_tokens_per_pos_total{position="2"} 10.0
      ... ''')
      >>> m.profile.tolist(), m.mean_acceptance_length, m.draft_acceptance_rate
      ([0.7, 0.4, 0.1], 2.2, 0.4)
    """
    if not isinstance(text, str):
        raise ValueError(f"text must be the Prometheus exposition text (a str), got "
                         f"{type(text).__name__}")
    if select is not None and not isinstance(select, dict):
        raise ValueError(f"select must be a dict of label values, got {select!r}"[:300])
    series: dict[tuple, float] = {}  # (counter, frozenset(labels)) -> value
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            raise ValueError(f"text: line {number} is not a Prometheus sample: {line!r}"[:300])
        name = match["name"]
        if not name.startswith(_VLLM):
            continue
        counter = name[len(_VLLM):]
        counter = counter[:-len("_total")] if counter.endswith("_total") else counter
        if counter not in _VLLM_COUNTERS:
            continue  # _created samples, gauges of other versions
        labels = _parse_labels(match["labels"] or "", number)
        if select and any(labels.get(k) != str(v) for k, v in select.items()):
            continue
        try:
            value = float(match["value"])
        except ValueError:
            raise ValueError(f"text: line {number}: {name} has the value "
                             f"{match['value']!r}, not a number") from None
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"text: line {number}: {name} must be a finite non-negative "
                             f"count, got {match['value']}")
        key = (counter, frozenset(labels.items()))
        if key in series:
            raise ValueError(f"text: line {number}: {name} {labels} is given twice (with and "
                             f"without _total?)")
        series[key] = value
    groups = {frozenset((k, v) for k, v in labels if k not in _PER_ENGINE)
              for _, labels in series}
    if len(groups) > 1:
        shown = sorted(str(dict(sorted(g))) for g in groups)
        raise ValueError(f"text holds the counters of several series ({', '.join(shown)})"[:400]
                         + ": summing them would mix different models or pairs; pass select= "
                           "with the labels of one")
    totals = {name: 0.0 for name in _VLLM_COUNTERS[:3]}
    per_pos: dict[int, float] = {}
    found, engines = set(), set()
    for (counter, labels), value in series.items():
        labels = dict(labels)
        found.add(counter)
        engines.add(labels.get("engine"))
        if counter != "num_accepted_tokens_per_pos":
            totals[counter] += value
            continue
        position = labels.get("position", "")
        if not position.isdigit():
            raise ValueError(f"text: num_accepted_tokens_per_pos has position label "
                             f"{position!r}, not an integer")
        per_pos[int(position)] = per_pos.get(int(position), 0.0) + value
    missing = [f"{_VLLM}{name}" for name in _VLLM_COUNTERS if name not in found]
    if missing:
        raise ValueError(f"text has no {', '.join(missing)} counter: speculative decoding off, "
                         f"a filter (select) that matched nothing, or not vLLM v1's metrics")
    if sorted(per_pos) != list(range(len(per_pos))):
        raise ValueError(f"text: num_accepted_tokens_per_pos positions must be 0..K-1, got "
                         f"{sorted(per_pos)}")
    counts = np.asarray([per_pos[i] for i in range(len(per_pos))], np.float64)
    drafts, drafted, accepted = (totals[n] for n in _VLLM_COUNTERS[:3])
    if not math.isclose(counts.sum(), accepted, rel_tol=1e-9, abs_tol=1e-6):
        raise ValueError(f"text: the per-position counts sum to {counts.sum():g} but "
                         f"num_accepted_tokens is {accepted:g} (a round accepting n drafts "
                         f"counts at positions 0..n-1): a scrape taken mid-update? scrape again")
    if accepted > drafted:
        raise ValueError(f"text: num_accepted_tokens ({accepted:g}) exceeds num_draft_tokens "
                         f"({drafted:g})")
    try:
        profile = read_profile(counts, drafts)
    except ValueError as error:
        raise ValueError(f"text: {error}") from None
    return VllmMetrics(num_drafts=drafts, num_draft_tokens=drafted, num_accepted_tokens=accepted,
                       num_accepted_tokens_per_pos=counts, profile=profile,
                       mean_acceptance_length=1 + accepted / drafts,
                       draft_acceptance_rate=accepted / drafted if drafted else 0.0,
                       labels=dict(next(iter(groups))), engines=len(engines))


# ------------------------------------------------------------------------------------------
# vLLM: the periodic log line
# ------------------------------------------------------------------------------------------

_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf"
_LOG_FIELDS = {
    "mean_acceptance_length": rf"Mean acceptance length:\s*({_NUM})",
    "accepted_throughput": rf"Accepted throughput:\s*({_NUM})\s*tokens/s",
    "drafted_throughput": rf"Drafted throughput:\s*({_NUM})\s*tokens/s",
    "accepted": r"Accepted:\s*(\d+)\s*tokens",
    "drafted": r"Drafted:\s*(\d+)\s*tokens",
    "profile": rf"Per-position acceptance rate:\s*((?:{_NUM})(?:\s*,\s*(?:{_NUM}))*)",
    "draft_acceptance_rate": rf"Avg Draft acceptance rate:\s*({_NUM})\s*%",
}
_OPTIONAL = ("accepted_throughput", "drafted_throughput", "draft_acceptance_rate")


class VllmLogLine(NamedTuple):
    """One "SpecDecoding metrics" line of vLLM's log: one logging interval (``read_vllm_log``).

    Attributes:
      mean_acceptance_length: ``1 + accepted / rounds`` of the interval (printed ``%.2f``).
      accepted_throughput, drafted_throughput: tokens/s over the interval (``None`` if absent).
      accepted, drafted: accepted and drafted tokens of the interval (exact counts).
      profile: ``(K,)``, the per-position rates (printed ``%.3f``: exact to 0.0005).
      draft_acceptance_rate: ``accepted / drafted`` as a fraction (printed ``%.1f%%``; ``nan``
        without drafts; ``None`` if absent).
    """

    mean_acceptance_length: float
    accepted_throughput: float | None
    drafted_throughput: float | None
    accepted: int
    drafted: int
    profile: np.ndarray
    draft_acceptance_rate: float | None


class VllmLogTotals(NamedTuple):
    """Counts summed over several log lines (``sum_vllm_log``): ``accepted``, ``drafted``, their
    ratio ``draft_acceptance_rate`` (0 without drafts) and the number of ``intervals``."""

    accepted: int
    drafted: int
    draft_acceptance_rate: float
    intervals: int


def read_vllm_log(text: str) -> tuple[VllmLogLine, ...]:
    """Every "SpecDecoding metrics:" line of a vLLM log, in order, one ``VllmLogLine`` each.

    Each line covers one logging interval; the lines are not averaged: an interval's weight (its
    rounds) is not in the line, so the profiles and mean lengths of several intervals do not
    combine. ``sum_vllm_log`` sums the counts, which do.

    Args:
      text: one line or a whole log (other lines are skipped; a logger's prefix is allowed).

    Raises:
      ValueError: no such line; a line missing a field, with a rate outside ``[0, 1]``, rates
        that increase with the position, more accepted than drafted tokens, or a mean length
        that disagrees with the rates beyond the printed rounding (``mean - 1`` is the rates'
        sum).

    Example:
      >>> from specjax.pairs import formats
      >>> (line,) = formats.read_vllm_log(
      ...     "INFO 07-01 12:00:00 [metrics.py:86] SpecDecoding metrics: Mean acceptance "
      ...     "length: 2.10, Accepted throughput: 55.00 tokens/s, Drafted throughput: 150.00 "
      ...     "tokens/s, Accepted: 550 tokens, Drafted: 1500 tokens, Per-position acceptance "
      ...     "rate: 0.600, 0.350, 0.150, Avg Draft acceptance rate: 36.7%")
      >>> line.profile.tolist(), line.accepted, line.drafted, line.mean_acceptance_length
      ([0.6, 0.35, 0.15], 550, 1500, 2.1)
    """
    if not isinstance(text, str):
        raise ValueError(f"text must be a log line or log text (a str), got "
                         f"{type(text).__name__}")
    lines = []
    for number, raw in enumerate(text.splitlines(), 1):
        start = raw.find("SpecDecoding metrics:")
        if start >= 0:
            lines.append(_log_line(raw[start:], number))
    if not lines:
        raise ValueError("text has no 'SpecDecoding metrics:' line (vLLM v1's spec decoding "
                         "log; enable it with log stats on)")
    return tuple(lines)


def _log_line(line: str, number: int) -> VllmLogLine:
    values = {}
    for field, pattern in _LOG_FIELDS.items():
        match = re.search(pattern, line)
        if match is None:
            if field in _OPTIONAL:
                values[field] = None
                continue
            raise ValueError(f"text: line {number}: no {pattern.split(':')[0]!r} field in "
                             f"{line[:200]!r}")
        values[field] = match.group(1)
    rates = np.asarray([float(x) for x in values["profile"].split(",")], np.float64)
    where = f"text: line {number}"
    if not np.isfinite(rates).all() or (rates < 0).any() or (rates > 1).any():
        raise ValueError(f"{where}: per-position rates must be in [0, 1], got {rates.tolist()}")
    if (np.diff(rates) > 0).any():
        raise ValueError(f"{where}: per-position rates must not increase with the position, got "
                         f"{rates.tolist()}")
    mean = float(values["mean_acceptance_length"])
    accepted, drafted = int(values["accepted"]), int(values["drafted"])
    if not math.isfinite(mean) or mean < 1:
        raise ValueError(f"{where}: mean acceptance length must be a number >= 1, got {mean}")
    if accepted > drafted:
        raise ValueError(f"{where}: accepted ({accepted}) exceeds drafted ({drafted}) tokens")
    # mean - 1 = accepted / rounds = sum of the rates; both printed rounded
    if abs(mean - 1 - rates.sum()) > 0.005 + 0.0005 * rates.size + 1e-9:
        raise ValueError(f"{where}: mean acceptance length {mean} disagrees with the "
                         f"per-position rates (1 + their sum = {1 + rates.sum():.4f}) beyond "
                         f"the printed rounding")
    rate = values["draft_acceptance_rate"]
    throughputs = [None if values[k] is None else float(values[k]) for k in _OPTIONAL[:2]]
    return VllmLogLine(mean_acceptance_length=mean, accepted_throughput=throughputs[0],
                       drafted_throughput=throughputs[1], accepted=accepted, drafted=drafted,
                       profile=rates,
                       draft_acceptance_rate=None if rate is None else float(rate) / 100)


def sum_vllm_log(lines) -> VllmLogTotals:
    """The accepted and drafted tokens of several log intervals, summed, and their ratio: the
    draft acceptance rate of the intervals together (exact; averaging the lines' rates is not).

    Example:
      >>> from specjax.pairs import formats
      >>> line = formats.VllmLogLine(2.0, None, None, 30, 90, [0.6, 0.4], None)
      >>> formats.sum_vllm_log([line, line._replace(accepted=10, drafted=10)])
      VllmLogTotals(accepted=40, drafted=100, draft_acceptance_rate=0.4, intervals=2)
    """
    lines = tuple(lines)
    if not lines or not all(isinstance(line, VllmLogLine) for line in lines):
        raise ValueError("lines must be a non-empty sequence of VllmLogLine (read_vllm_log)")
    accepted = sum(line.accepted for line in lines)
    drafted = sum(line.drafted for line in lines)
    return VllmLogTotals(accepted=accepted, drafted=drafted,
                         draft_acceptance_rate=accepted / drafted if drafted else 0.0,
                         intervals=len(lines))
