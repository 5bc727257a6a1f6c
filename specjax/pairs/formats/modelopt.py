"""Model-Optimizer's ``speculation_profile.json`` (schema 1.x): ``read_speculation_profile``
and ``write_speculation_profile``. Sources: ``specjax.pairs.formats``.
"""

from __future__ import annotations

import json
import math
import numbers
import pathlib
from typing import NamedTuple

import numpy as np

from specjax import _checks
from specjax._files import atomic_write
from specjax.pairs.formats.conversions import conditional_from_marginal
from specjax.pairs.formats.conversions import profile_of
from specjax.pairs.profiles import _check_profile
from specjax.theory.metrics import EngineMetrics

__all__ = [
    "SCHEMA_VERSION",
    "SpeculationProfile",
    "read_speculation_profile",
    "write_speculation_profile",
]

SCHEMA_VERSION = "1.0"  # Model-Optimizer's speculation_profile.json schema written here
_CHAIN_METHODS = frozenset({"eagle", "eagle1", "eagle2", "eagle3", "draft_model"})
_ROUNDING = 2e-6  # the file's rates are rounded to 6 digits


class SpeculationProfile(NamedTuple):
    """A Model-Optimizer ``speculation_profile.json`` (``read_speculation_profile``).

    Attributes:
      profile: ``(K,)``, the marginal rates (``marginal_accept_rates``; from the histogram when
        the file has one, exactly).
      conditional: ``(K,)``, ``conditional_from_marginal(profile)``.
      mean_accept_length: tokens per step, per-step mean (``1 + sum(profile)``; the histogram's
        mean when there is one).
      mean_accept_length_per_request: the file's mean of per-request means, or ``None``: another
        number, kept as a number (no profile has it as its sum).
      num_speculative_tokens: ``K`` of the measurement.
      method, verification_method, accept_length_model: the file's strings (or ``None``);
        ``"measured_per_k"`` says the profile holds at ``K`` only (block drafters re-plan when
        ``K`` changes), so ``profile_lookahead``'s shorter lookaheads do not apply.
      histogram: ``{tokens per step: steps}`` or ``None``.
      document: the whole file, as read.
    """

    profile: np.ndarray
    conditional: np.ndarray
    mean_accept_length: float
    mean_accept_length_per_request: float | None
    num_speculative_tokens: int
    method: str | None
    verification_method: str | None
    accept_length_model: str | None
    histogram: dict | None
    document: dict


def _rates(where: str, field: str, value) -> np.ndarray:
    try:
        a = np.asarray(value, np.float64)
    except (TypeError, ValueError):
        a = None
    if a is None or a.ndim != 1 or not np.isfinite(a).all() or (a < 0).any() or (a > 1).any():
        raise ValueError(f"{where}: {field} must be a list of rates in [0, 1], got "
                         f"{value!r}"[:300])
    return a


def _histogram(where: str, value) -> dict:
    if not isinstance(value, dict) or not value:
        raise ValueError(f"{where}: acceptance_length_histogram must be a non-empty object of "
                         f"{{tokens per step: steps}}, got {value!r}"[:300])
    histogram = {}
    for key, count in value.items():
        try:
            length = int(key)
        except (TypeError, ValueError):
            length = None
        if length is None or str(length) != str(key).strip() or length < 1:
            raise ValueError(f"{where}: acceptance_length_histogram keys must be tokens per "
                             f"step (integers >= 1), got {key!r}")
        if isinstance(count, bool) or not isinstance(count, numbers.Integral) or count < 0:
            raise ValueError(f"{where}: acceptance_length_histogram[{key!r}] must be a "
                             f"non-negative integer count of steps, got {count!r}")
        histogram[length] = histogram.get(length, 0) + int(count)
    if sum(histogram.values()) == 0:
        raise ValueError(f"{where}: acceptance_length_histogram counts no step")
    return dict(sorted(histogram.items()))


def read_speculation_profile(path) -> SpeculationProfile:
    """Model-Optimizer's ``speculation_profile.json`` (schema 1.x; sources:
    ``specjax.pairs.formats``).

    The marginal rates are specjax's profile; when the file has its histogram of tokens per
    step, the profile and the per-step mean are recomputed from it (exact counts) and the
    file's vectors checked against them. The per-request mean stays a separate number. The
    file's ``mean_accept_length`` is not read: without the histogram Model-Optimizer writes
    the per-request mean there, so the per-step mean is ``1 + sum(a)`` then.

    Args:
      path: the file.

    Returns:
      ``SpeculationProfile``.

    Raises:
      ValueError: naming the file: not JSON, not an object, no ``schema_version`` or a major
        version other than 1, an unmeasured stub (``measured`` false), no rates, vectors of
        other lengths than ``num_speculative_tokens``, marginals that increase with the position,
        conditionals and marginals (or either and the histogram) that disagree beyond the
        6-digit rounding, a histogram with steps longer than ``K + 1`` tokens (the vector cut
        short), or a failed ``validation.mean_consistency`` recorded by the producer.

    Example:
      >>> import json, pathlib, tempfile
      >>> from specjax.pairs import formats
      >>> folder = tempfile.TemporaryDirectory()
      >>> path = pathlib.Path(folder.name) / "speculation_profile.json"
      >>> _ = path.write_text(json.dumps({"schema_version": "1.0", "measured": True,
      ...     "num_speculative_tokens": 2, "marginal_accept_rates": [0.75, 0.5],
      ...     "acceptance_length_histogram": {"1": 1, "2": 1, "3": 2}}))
      >>> p = formats.read_speculation_profile(path)
      >>> p.profile.tolist(), p.conditional.tolist(), p.mean_accept_length
      ([0.75, 0.5], [0.75, 0.6666666666666666], 2.25)
      >>> folder.cleanup()
    """
    where = str(path)
    try:
        document = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{where}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{where}: not JSON ({error})") from None
    if not isinstance(document, dict) or "schema_version" not in document:
        raise ValueError(f"{where}: not a speculation profile (a JSON object with a "
                         f"schema_version)")
    version = str(document["schema_version"])
    if version.split(".")[0] != "1":
        raise ValueError(f"{where}: schema_version {version!r}: only 1.x is read (its fields' "
                         f"meanings are the ones checked here)")
    if document.get("measured") is False:
        raise ValueError(f"{where}: an unmeasured stub (measured: false): it holds no rates; "
                         f"attach a measured profile (specdec_bench) first")
    marginal = conditional = None
    if document.get("marginal_accept_rates") is not None:
        marginal = _rates(where, "marginal_accept_rates", document["marginal_accept_rates"])
    if document.get("conditional_accept_rates") is not None:
        conditional = _rates(where, "conditional_accept_rates",
                             document["conditional_accept_rates"])
    histogram = None
    if document.get("acceptance_length_histogram") is not None:
        histogram = _histogram(where, document["acceptance_length_histogram"])
    k = document.get("num_speculative_tokens")
    if k is None:
        known = [x.size for x in (marginal, conditional) if x is not None]
        k = known[0] if known else (max(histogram) - 1 if histogram else None)
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
        raise ValueError(f"{where}: num_speculative_tokens must be a positive integer, got "
                         f"{document.get('num_speculative_tokens')!r}")
    k = int(k)
    for name, vector in (("marginal_accept_rates", marginal),
                         ("conditional_accept_rates", conditional)):
        if vector is not None and vector.size != k:
            raise ValueError(f"{where}: {name} has {vector.size} entries, "
                             f"num_speculative_tokens is {k}")
    if marginal is not None and (np.diff(marginal) > _ROUNDING).any():
        raise ValueError(f"{where}: marginal_accept_rates increase with the position "
                         f"({marginal.tolist()}): not the fraction of steps keeping >= i drafts")
    if marginal is not None and conditional is not None:
        implied = np.cumprod(conditional)
        if np.max(np.abs(implied - marginal)) > _ROUNDING * (1 + np.arange(k)).max():
            raise ValueError(f"{where}: conditional_accept_rates (their products "
                             f"{np.round(implied, 6).tolist()}) disagree with "
                             f"marginal_accept_rates {marginal.tolist()}")
    if marginal is None and conditional is not None:
        marginal = np.cumprod(conditional)  # the producer's ratios of consecutive marginals
    mean = None
    if histogram is not None:
        if max(histogram) > k + 1:
            raise ValueError(f"{where}: the histogram has steps of {max(histogram)} tokens, "
                             f"more than num_speculative_tokens + 1 = {k + 1}: the vectors are "
                             f"cut short")
        steps = sum(histogram.values())
        counted = np.asarray([sum(c for n, c in histogram.items() if n >= i + 2)
                              for i in range(k)], np.float64)
        exact = counted / steps
        if marginal is not None and np.max(np.abs(exact - marginal)) > _ROUNDING:
            raise ValueError(f"{where}: marginal_accept_rates {marginal.tolist()} disagree with "
                             f"the histogram's {np.round(exact, 6).tolist()}")
        marginal = exact
        mean = sum(n * c for n, c in histogram.items()) / steps
    if marginal is None:
        raise ValueError(f"{where}: no rates (marginal_accept_rates, conditional_accept_rates "
                         f"or acceptance_length_histogram)")
    marginal = np.minimum.accumulate(np.clip(marginal, 0, 1))  # 6-digit rounding's ties
    if mean is None:
        mean = 1 + float(marginal.sum())
    consistency = (document.get("validation") or {}).get("mean_consistency") or {}
    if consistency.get("passed") is False:
        raise ValueError(f"{where}: the producer's mean_consistency check failed (implied "
                         f"{consistency.get('implied_mean_accept_length')} vs reported "
                         f"{consistency.get('reported_mean_accept_length')}): the vectors do "
                         f"not describe the measured mean")
    per_request = document.get("mean_accept_length_per_request")
    if per_request is not None:
        per_request = _checks.check_finite_non_negative(
            f"{where}: mean_accept_length_per_request", per_request)
    strings = [document.get(name) for name in ("method", "verification_method",
                                                "accept_length_model")]
    return SpeculationProfile(profile=marginal, conditional=conditional_from_marginal(marginal),
                              mean_accept_length=float(mean),
                              mean_accept_length_per_request=per_request,
                              num_speculative_tokens=k, method=strings[0],
                              verification_method=strings[1], accept_length_model=strings[2],
                              histogram=histogram, document=document)


def write_speculation_profile(path, result, *, method: str | None = None,
                              draft_checkpoint=None, target_model=None,
                              measurement_conditions: dict | None = None) -> dict:
    """Writes ``result``'s profile as Model-Optimizer's ``speculation_profile.json`` (schema
    ``"1.0"``), atomically; returns the document written.

    Written: ``measured`` true (the rates are numbers, exact or estimated; ``measured: false``
    means a stub there), ``num_speculative_tokens`` and ``max_supported_k`` ``K``,
    ``verification_method`` ``"longest_prefix"``, the marginal and conditional rates at full
    precision, ``mean_accept_length`` ``1 + sum(a)`` (per step), ``accept_length_model`` from
    ``method`` as Model-Optimizer picks it, ``accept_length_by_k``, and its ``validation``
    block. Left null: ``mean_accept_length_per_request`` (a profile does not determine it) and
    ``acceptance_length_histogram`` (counts of steps, which expectations are not).
    ``measurement_conditions`` records ``{"source": "specjax", "kind": ...}`` plus yours.

    Args:
      path: the file to write.
      result: ``engine_metrics(...)`` (kind ``"exact"``), ``estimate(...)`` (``"estimate"``)
        or a profile vector (``"profile"``).
      method, draft_checkpoint, target_model, measurement_conditions: provenance fields.

    Raises:
      ValueError: ``result`` is none of those, or its profile is not a non-increasing vector of
        rates.

    Example:
      >>> import pathlib, tempfile
      >>> from specjax.pairs import formats
      >>> folder = tempfile.TemporaryDirectory()
      >>> path = pathlib.Path(folder.name) / "speculation_profile.json"
      >>> _ = formats.write_speculation_profile(path, [0.8, 0.6], method="eagle3")
      >>> p = formats.read_speculation_profile(path)
      >>> p.profile.tolist(), p.mean_accept_length, p.accept_length_model
      ([0.8, 0.6], 2.4, 'chain_analytic')
      >>> folder.cleanup()
    """
    from specjax.pairs.estimate import Estimate  # noqa: PLC0415

    if isinstance(result, Estimate):
        kind = "estimate"
    elif isinstance(result, EngineMetrics):
        kind = "exact"
    else:
        kind = "profile"
    try:
        a = _check_profile(profile_of(result) if kind != "profile" else result)
    except (TypeError, ValueError) as error:
        raise ValueError(f"result must be engine_metrics(...), estimate(...) or a profile "
                         f"vector: {error}"[:400]) from None
    if method is not None and not isinstance(method, str):
        raise ValueError(f"method must be a string or None, got {method!r}"[:300])
    if measurement_conditions is not None and not isinstance(measurement_conditions, dict):
        raise ValueError(f"measurement_conditions must be a dict or None, got "
                         f"{measurement_conditions!r}"[:300])
    k = int(a.size)
    marginal = [float(x) for x in a]
    mean = 1.0 + math.fsum(marginal)
    model = "chain_analytic" if method and method.lower() in _CHAIN_METHODS else "measured_per_k"
    monotone = [{"position": i, "value": marginal[i], "previous": marginal[i - 1]}
                for i in range(1, k) if marginal[i] > marginal[i - 1]]
    document = {
        "schema_version": SCHEMA_VERSION,
        "measured": True,
        "method": method,
        "draft_checkpoint": draft_checkpoint,
        "target_model": target_model,
        "num_speculative_tokens": k,
        "block_size": None,
        "max_supported_k": k,
        "verification_method": "longest_prefix",
        "conditional_accept_rates": [float(x) for x in conditional_from_marginal(a)],
        "marginal_accept_rates": marginal,
        "mean_accept_length": mean,
        "mean_accept_length_per_request": None,
        "accept_length_model": model,
        "accept_length_by_k": {str(k): mean},
        "acceptance_length_histogram": None,
        "per_category": None,
        "measurement_conditions": {"source": "specjax", "kind": kind,
                                   **(measurement_conditions or {})},
        "validation": {
            "mean_consistency": {"implied_mean_accept_length": mean,
                                 "reported_mean_accept_length": mean, "abs_delta": 0.0,
                                 "tolerance": 0.02, "passed": True},
            "marginal_monotonicity": {"passed": not monotone, "violations": monotone},
        },
    }
    with atomic_write(path) as f:
        json.dump(document, f, indent=2)
        f.write("\n")
    return document
