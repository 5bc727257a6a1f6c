"""SGLang's per-request speculative decoding fields (``meta_info``), summed into per-step
quantities: ``read_sglang_requests``. Sources: ``specjax.pairs.formats``.
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import numpy as np

__all__ = [
    "SglangRequests",
    "read_sglang_requests",
]


_SGLANG_ACCEPTED = ("spec_num_correct_drafts", "spec_accepted_drafts", "spec_accept_token_num")
_SGLANG_PROPOSED = ("spec_num_proposed_drafts", "spec_proposed_drafts", "spec_draft_token_num")
_SGLANG_HISTOGRAM = ("spec_correct_drafts_histogram", "spec_accept_histogram")


class SglangRequests(NamedTuple):
    """SGLang's per-request speculative decoding fields, summed (``read_sglang_requests``).

    Attributes:
      requests: records read; ``without_steps`` of them had ``spec_verify_ct`` 0 (no ratio).
      verify_steps: ``sum(spec_verify_ct)``: speculation rounds.
      completion_tokens: ``sum(completion_tokens)``.
      tokens_per_step: ``sum(completion_tokens) / sum(spec_verify_ct)``: the per-step mean in
        SGLang's convention (exact from the counts).
      mean_of_request_ratios: the mean over requests of ``completion_tokens / spec_verify_ct``
        (``spec_accept_length``): weights a short request like a long one; another number.
      accepted_drafts, proposed_drafts: summed counts (``None`` if a record lacks them).
      mean_acceptance_length: ``1 + accepted_drafts / verify_steps`` (vLLM's convention; the
        prefill's token left out), or ``None``.
      draft_acceptance_rate: ``accepted_drafts / proposed_drafts`` or ``None``.
      histogram: ``(K + 1,)`` steps by accepted drafts, summed, or ``None``.
      profile: ``(K,)`` from the histogram, or ``None`` (not determined: ``profile_of``
        refuses).
    """

    requests: int
    without_steps: int
    verify_steps: int
    completion_tokens: int
    tokens_per_step: float
    mean_of_request_ratios: float
    accepted_drafts: int | None
    proposed_drafts: int | None
    mean_acceptance_length: float | None
    draft_acceptance_rate: float | None
    histogram: np.ndarray | None
    profile: np.ndarray | None


def _count(where: str, field: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) \
            or not math.isfinite(value) or value < 0 or value != int(value):
        raise ValueError(f"{where}: {field} must be a non-negative integer count, got "
                         f"{value!r}"[:300])
    return int(value)


def _alias(where: str, meta: dict, names: tuple):
    """The value under the first of ``names`` present; every other present must agree."""
    present = [(name, meta[name]) for name in names if meta.get(name) is not None]
    if not present:
        return None
    for name, value in present[1:]:
        if value != present[0][1]:
            raise ValueError(f"{where}: {present[0][0]} = {present[0][1]!r} and {name} = "
                             f"{value!r} disagree (the same count under two names)"[:300])
    return present[0]


def read_sglang_requests(records) -> SglangRequests:
    """SGLang's per-request speculative fields (``meta_info`` of ``/generate``'s responses, or
    the responses themselves), summed into per-step quantities.

    The per-step mean ``sum(completion_tokens) / sum(spec_verify_ct)`` is exact from per-request
    counts; the mean of per-request ratios (``spec_accept_length`` averaged over requests) is
    another number, and both are given, named. With accepted-draft counts, the mean acceptance
    length in vLLM's convention (``1 + accepted / steps``) and the draft acceptance rate too;
    with the per-step histogram, the profile. Without it the profile is not determined.

    Args:
      records: a sequence of dicts, each a ``meta_info`` or a response holding one, with
        ``spec_verify_ct`` and ``completion_tokens`` (non-negative integers).

    Raises:
      ValueError: naming the record: not a dict, a count missing, negative, non-integral or
        non-finite, a ``spec_accept_length`` that is neither ``completion_tokens /
        spec_verify_ct`` nor ``1 + accepted / spec_verify_ct``, accepted above proposed drafts,
        a histogram whose steps do not sum to ``spec_verify_ct`` (or its accepted drafts to the
        accepted count), aliases that disagree; or no record with a verify step.

    Example:
      >>> from specjax.pairs import formats
      >>> s = formats.read_sglang_requests([
      ...     {"completion_tokens": 30, "spec_verify_ct": 10, "spec_accept_length": 3.0},
      ...     {"completion_tokens": 4, "spec_verify_ct": 2, "spec_accept_length": 2.0}])
      >>> round(s.tokens_per_step, 4), s.mean_of_request_ratios
      (2.8333, 2.5)
    """
    if isinstance(records, (str, bytes, dict)) or not hasattr(records, "__iter__"):
        raise ValueError(f"records must be a sequence of SGLang meta_info dicts, got "
                         f"{type(records).__name__}")
    records = list(records)
    if not records:
        raise ValueError("records is empty")
    steps_total = tokens_total = without = 0
    accepted_total, proposed_total, ratios, histograms = 0, 0, [], []
    have_accepted = have_proposed = have_histogram = True
    for index, record in enumerate(records):
        where = f"records[{index}]"
        if not isinstance(record, dict):
            raise ValueError(f"{where} must be a dict (a meta_info), got {type(record).__name__}")
        meta = record["meta_info"] if isinstance(record.get("meta_info"), dict) else record
        for field in ("spec_verify_ct", "completion_tokens"):
            if meta.get(field) is None:
                raise ValueError(f"{where} has no {field} (SGLang without speculative "
                                 f"decoding, or not a meta_info)")
        steps = _count(where, "spec_verify_ct", meta["spec_verify_ct"])
        tokens = _count(where, "completion_tokens", meta["completion_tokens"])
        accepted = _alias(where, meta, _SGLANG_ACCEPTED)
        proposed = _alias(where, meta, _SGLANG_PROPOSED)
        histogram = _alias(where, meta, _SGLANG_HISTOGRAM)
        accepted = None if accepted is None else _count(where, accepted[0], accepted[1])
        proposed = None if proposed is None else _count(where, proposed[0], proposed[1])
        if accepted is not None and proposed is not None and accepted > proposed:
            raise ValueError(f"{where}: {accepted} accepted drafts exceed {proposed} proposed")
        reported = meta.get("spec_accept_length")
        if steps and reported not in (None, 0):  # 0: SGLang's default when not computed
            candidates = [tokens / steps] + ([1 + accepted / steps] if accepted is not None
                                             else [])
            if isinstance(reported, bool) or not isinstance(reported, numbers.Real) or not any(
                    math.isclose(reported, c, rel_tol=1e-6) for c in candidates):
                raise ValueError(f"{where}: spec_accept_length {reported!r} is not "
                                 f"completion_tokens / spec_verify_ct = {tokens / steps:g}"
                                 + ("" if accepted is None else
                                    f" nor 1 + accepted / spec_verify_ct = "
                                    f"{1 + accepted / steps:g}"))
        if histogram is not None:
            name, values = histogram
            h = np.asarray(values, np.float64) if isinstance(values, list) else None
            if h is None or h.ndim != 1 or h.size == 0 or not np.isfinite(h).all() \
                    or (h < 0).any() or (h != np.round(h)).any():
                raise ValueError(f"{where}: {name} must be a list of non-negative step counts, "
                                 f"got {values!r}"[:300])
            if h.sum() != steps:
                raise ValueError(f"{where}: {name} counts {h.sum():g} steps, spec_verify_ct is "
                                 f"{steps}")
            if accepted is not None and (np.arange(h.size) * h).sum() != accepted:
                raise ValueError(f"{where}: {name} accepts {(np.arange(h.size) * h).sum():g} "
                                 f"drafts, the accepted count is {accepted}")
            histograms.append(h)
        have_accepted &= accepted is not None
        have_proposed &= proposed is not None
        have_histogram &= histogram is not None
        steps_total += steps
        tokens_total += tokens
        accepted_total += accepted or 0
        proposed_total += proposed or 0
        if steps:
            ratios.append(tokens / steps)
        else:
            without += 1
    if not steps_total:
        raise ValueError("records: no request has a verify step (spec_verify_ct all 0): no "
                         "speculation to read")
    histogram = profile = None
    if have_histogram:
        histogram = np.zeros(max(h.size for h in histograms))
        for h in histograms:
            histogram[:h.size] += h
        survival = np.cumsum(histogram[::-1])[::-1]  # steps accepting >= j drafts
        profile = survival[1:] / steps_total
    return SglangRequests(
        requests=len(records), without_steps=without, verify_steps=steps_total,
        completion_tokens=tokens_total, tokens_per_step=tokens_total / steps_total,
        mean_of_request_ratios=float(np.mean(ratios)),
        accepted_drafts=accepted_total if have_accepted else None,
        proposed_drafts=proposed_total if have_proposed else None,
        mean_acceptance_length=1 + accepted_total / steps_total if have_accepted else None,
        draft_acceptance_rate=(accepted_total / proposed_total
                               if have_accepted and have_proposed and proposed_total else None),
        histogram=histogram, profile=profile)
