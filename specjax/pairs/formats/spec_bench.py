"""Spec-Bench's answer files (``model_answer/*.jsonl``): every step's tokens, their mean with a
standard error, the profile: ``read_spec_bench``. Sources: ``specjax.pairs.formats``.
"""

from __future__ import annotations

import json
import math
import numbers
import pathlib
from typing import NamedTuple

import numpy as np

from specjax import _checks

__all__ = [
    "SpecBenchSteps",
    "read_spec_bench",
]


class SpecBenchSteps(NamedTuple):
    """The steps of a Spec-Bench answer file (``read_spec_bench``).

    Attributes:
      lengths: ``(S,)`` int64, tokens emitted by every step (accepted drafts plus one), in file
        order.
      answers: one ``(question_id, choice index, (S_j,) lengths)`` per choice of every line.
      mean: ``lengths.mean()``: mean acceptance length per step (Spec-Bench's "#Mean accepted
        tokens", vLLM's convention).
      mean_se: its standard error with the answers as independent clusters (steps of one answer
        are not independent; 0 with one answer).
      profile: ``(K,)``, the fraction of steps keeping at least ``i`` drafts, ``K`` the most
        drafts any step kept (``K`` itself is not in the file: past it every rate is 0).
    """

    lengths: np.ndarray
    answers: tuple
    mean: float
    mean_se: float
    profile: np.ndarray


def read_spec_bench(path, *, bonus_included: bool = True) -> SpecBenchSteps:
    """Every step of a Spec-Bench answer file (``data/spec_bench/model_answer/*.jsonl``): the
    tokens each emitted, their mean with a standard error, and the profile (exact from the
    steps).

    Args:
      path: the ``.jsonl`` file, one answer object per line.
      bonus_included: the values count the step's bonus (or correction) token, as Spec-Bench's
        scripts record them; ``False`` for a fork that records accepted drafts only (1 is
        added).

    Raises:
      ValueError: naming the file and line: not JSON, no ``choices`` list, a choice without an
        ``accept_lengths`` list, a value not an integer, or below 1 (below 0 with
        ``bonus_included=False``: a step emits at least one token), or no step at all.

    Example:
      >>> import json, pathlib, tempfile
      >>> from specjax.pairs import formats
      >>> folder = tempfile.TemporaryDirectory()
      >>> path = pathlib.Path(folder.name) / "answers.jsonl"
      >>> _ = path.write_text(json.dumps({"question_id": 81, "category": "writing",
      ...     "choices": [{"index": 0, "accept_lengths": [3, 1, 2, 2]}]}) + "\\n")
      >>> steps = formats.read_spec_bench(path)
      >>> steps.mean, steps.profile.tolist()
      (2.0, [0.75, 0.25])
      >>> folder.cleanup()
    """
    _checks.check_bool("bonus_included", bonus_included)
    where = str(path)
    try:
        text = pathlib.Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"{where}: no such file") from None
    low = 1 if bonus_included else 0
    answers = []
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        at = f"{where}:{number}"
        try:
            line = json.loads(raw)
        except json.JSONDecodeError as error:
            raise ValueError(f"{at}: not JSON ({error})") from None
        choices = line.get("choices") if isinstance(line, dict) else None
        if not isinstance(choices, list) or not choices:
            raise ValueError(f"{at}: no 'choices' list (not a Spec-Bench answer)")
        for j, choice in enumerate(choices):
            values = choice.get("accept_lengths") if isinstance(choice, dict) else None
            if not isinstance(values, list):
                raise ValueError(f"{at}: choices[{j}] has no 'accept_lengths' list (an answer "
                                 f"of the autoregressive baseline?)")
            for value in values:
                if isinstance(value, bool) or not isinstance(value, numbers.Real) \
                        or not math.isfinite(value) or value != int(value) or value < low:
                    raise ValueError(f"{at}: choices[{j}].accept_lengths holds {value!r}: "
                                     f"tokens per step are integers >= {low}"
                                     + (" (pass bonus_included=False if the file counts "
                                        "accepted drafts only)" if bonus_included else ""))
            lengths = np.asarray(values, np.int64) + (0 if bonus_included else 1)
            answers.append((line.get("question_id"), choice.get("index", j), lengths))
    answers = [a for a in answers if a[2].size]
    if not answers:
        raise ValueError(f"{where}: no step (no answer with accept_lengths)")
    lengths = np.concatenate([a[2] for a in answers])
    mean = float(lengths.mean())
    sums = np.asarray([a[2].sum() for a in answers], np.float64)
    sizes = np.asarray([a[2].size for a in answers], np.float64)
    clusters = sums.size
    residual = sums - mean * sizes
    se = (math.sqrt(clusters / (clusters - 1) * float(residual @ residual)) / sizes.sum()
          if clusters > 1 else 0.0)
    kept = lengths - 1
    profile = np.asarray([(kept >= i).mean() for i in range(1, max(int(kept.max()), 1) + 1)])
    return SpecBenchSteps(lengths=lengths, answers=tuple(answers), mean=mean, mean_se=se,
                          profile=profile)
