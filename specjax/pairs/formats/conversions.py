"""Conversions between the marginal and conditional conventions of an acceptance profile,
and ``profile_of``: the profile of any reading of ``specjax.pairs.formats``, or the reason
it has none (the readings' types are imported when called: their modules import this one).
"""

from __future__ import annotations

import numbers

import numpy as np

from specjax.pairs.profiles import _check_profile
from specjax.pairs.profiles import acceptance_profile

__all__ = [
    "conditional_from_marginal",
    "marginal_from_conditional",
    "profile_of",
]


def conditional_from_marginal(profile) -> np.ndarray:
    """The conditional rates ``c_i = a_i / a_(i-1)`` (``c_1 = a_1``; 0 past a zero) of a
    marginal profile.

    Exact as a ratio of averages: ``c_i`` is the rounds keeping ``i`` drafts over those keeping
    ``i - 1``, summed over the run (``EngineMetrics.conditional_acceptance``), not the
    acceptance of any context (``specjax.pairs.profiles``); Model-Optimizer's
    ``conditional_accept_rates`` is the same ratio.

    Raises:
      ValueError: not a non-empty, non-increasing vector of rates in ``[0, 1]``.

    Example:
      >>> from specjax.pairs import formats
      >>> print(*formats.conditional_from_marginal([0.8, 0.4, 0.0]))
      0.8 0.5 0.0
    """
    a = _check_profile(profile)
    previous = np.concatenate([[1.0], a[:-1]])
    return np.divide(a, previous, out=np.zeros_like(a), where=previous > 0)


def marginal_from_conditional(conditional) -> np.ndarray:
    """The marginal profile ``a_i = c_1 ... c_i`` of conditional rates (the inverse of
    ``conditional_from_marginal`` wherever ``a_(i-1) > 0``; exact, the same counts).

    Raises:
      ValueError: not a non-empty 1-D vector of rates in ``[0, 1]``.

    Example:
      >>> from specjax.pairs import formats
      >>> print(*formats.marginal_from_conditional([0.8, 0.5, 0.5]))
      0.8 0.4 0.2
    """
    c = np.asarray(conditional, np.float64)
    if c.ndim != 1 or c.size == 0 or not np.isfinite(c).all() or (c < 0).any() or (c > 1).any():
        raise ValueError(f"conditional must be a non-empty 1-D vector of rates in [0, 1], got "
                         f"{np.asarray(conditional)!r}"[:300])
    return np.cumprod(c)


def profile_of(reading) -> np.ndarray:
    """The marginal profile of a reading of ``specjax.pairs.formats`` (or of ``engine_metrics`` /
    ``estimate``), or a ``ValueError`` saying why the reading does not determine it.

    ``VllmLogLine``'s is rounded as vLLM prints it (3 decimals); ``SglangRequests`` has one only
    with its per-step histogram; a number (a mean acceptance length, per request or per step)
    never determines one: many profiles share a mean.

    Example:
      >>> from specjax.pairs import formats
      >>> formats.profile_of(2.4)
      Traceback (most recent call last):
      ...
      ValueError: a mean acceptance length (2.4) does not determine a per-position profile: \
many profiles have the same sum; read the per-position counts (vLLM's counters or log line, a \
histogram of accepted drafts per step)
    """
    from specjax.pairs.formats.modelopt import SpeculationProfile  # noqa: PLC0415
    from specjax.pairs.formats.sglang import SglangRequests  # noqa: PLC0415
    from specjax.pairs.formats.spec_bench import SpecBenchSteps  # noqa: PLC0415
    from specjax.pairs.formats.vllm import VllmLogLine  # noqa: PLC0415
    from specjax.pairs.formats.vllm import VllmMetrics  # noqa: PLC0415

    if isinstance(reading, (VllmMetrics, VllmLogLine, SpeculationProfile, SpecBenchSteps)):
        return np.array(reading.profile, np.float64)
    if isinstance(reading, SglangRequests):
        if reading.profile is None:
            raise ValueError("these SGLang records have no per-step histogram "
                             "(spec_accept_histogram / spec_correct_drafts_histogram): their "
                             "per-request means and counts determine the mean acceptance length "
                             "and the draft acceptance rate, not the per-position profile")
        return np.array(reading.profile, np.float64)
    if isinstance(reading, numbers.Real) and not isinstance(reading, bool):
        raise ValueError(f"a mean acceptance length ({reading!r}) does not determine a "
                         f"per-position profile: many profiles have the same sum; read the "
                         f"per-position counts (vLLM's counters or log line, a histogram of "
                         f"accepted drafts per step)")
    return acceptance_profile(reading)
