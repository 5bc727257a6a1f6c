"""Choosing a decoder from a recording, with error bars: which tree, which budget, which ``K``.

``best_decoder(recording, cost, candidates)`` estimates each candidate's expected time per
request on the same recorded sequences (``estimate``'s exact conditional expectations, one per
sequence) and returns the least, every candidate's time with its standard error, and the paired
difference to the runner-up. The same sequences decide every candidate, so the difference's
standard error is that of the per-sequence differences, much smaller than either time's when the
candidates are alike (two tree budgets, two ``K``). The candidates are any decoders ``estimate``
takes with a cost model: token trees of several shapes or budgets (EAGLE's and Medusa's top-k
trees, Sequoia's shapes from ``specjax.theory.sequoia_tree``), SD at several ``K``, multi-draft
decoders, HuggingFace's schedule. (For SD's ``K`` alone, ``best_lookahead`` runs every ``K`` in
one compiled program.)
"""

from __future__ import annotations

from typing import Any
from typing import NamedTuple

import numpy as np

from specjax._progress import Progress
from specjax.pairs.estimate import check_inputs
from specjax.pairs.estimate import per_sequence
from specjax.pairs.lookahead import least_time
from specjax.pairs.recording import Recording
from specjax.theory.cost import CostModel

__all__ = ["DecoderChoice", "best_decoder"]


class DecoderChoice(NamedTuple):
    """The candidate of least estimated expected time (``best_decoder``).

    Attributes:
      index: its position among the candidates.
      decoder: the candidate itself.
      expected_time: its estimated expected time per request.
      times, times_se: ``(N,)``, every candidate's estimated time and its standard error.
      runner_up: the index of the second least time (``-1`` for one candidate).
      difference, difference_se: ``times[runner_up] - times[index]`` (``>= 0``) and its
        standard error from the paired per-sequence differences.
    """

    index: int
    decoder: Any
    expected_time: float
    times: np.ndarray
    times_se: np.ndarray
    runner_up: int
    difference: float
    difference_se: float


def best_decoder(recording: Recording, cost: CostModel, candidates, *,
                 progress: bool = False) -> DecoderChoice:
    """The candidate decoder of least estimated time on ``recording`` under ``cost``.

    Args:
      recording: a ``Recording`` holding what every candidate reads (token trees: the rows).
      cost: a ``CostModel``.
      candidates: a non-empty sequence of decoders ``estimate`` takes with a cost model.
      progress: show a progress bar over the candidates.

    Returns:
      ``DecoderChoice``; ties go to the earlier candidate. Each time equals
      ``estimate(candidate, recording, cost=cost).expected_time``.

    Raises:
      ValueError: a bad ``recording``, ``cost`` or ``candidates`` (naming the candidate's
        position and what ``estimate`` refuses), before any work.

    Example:
      >>> import jax, specjax
      >>> draft, target = specjax.paper_instance()
      >>> rec = specjax.record(jax.random.key(0), draft, target, 300, keep_rows=True)
      >>> trees = [specjax.TokenTree((1, 1, 1)), specjax.TokenTree((2, 2)),
      ...          specjax.TokenTree((2, 1, 1))]
      >>> choice = specjax.pairs.best_decoder(rec, specjax.CostModel(0.1, 1.0), trees)
      >>> choice.decoder == trees[choice.index], choice.times.shape
      (True, (3,))
    """
    if not isinstance(cost, CostModel):
        raise ValueError(f"cost must be a specjax.CostModel, got {cost!r}"[:300])
    if isinstance(candidates, (str, bytes)) or not isinstance(candidates, (tuple, list)) \
            or not candidates:
        raise ValueError(f"candidates must be a non-empty list or tuple of decoders, got "
                         f"{candidates!r}"[:300])
    for i, decoder in enumerate(candidates):  # every refusal before any work
        try:
            check_inputs(decoder, recording)
        except ValueError as error:
            raise ValueError(f"candidates[{i}]: {error}") from None
    per = []
    with Progress(len(candidates), enabled=progress) as bar:
        for decoder in candidates:
            try:
                _, weighted, _ = per_sequence(decoder, recording, cost)
            except ValueError as error:  # a time a recording cannot tell (adaptive lengths)
                raise ValueError(f"candidates[{len(per)}]: {error}") from None
            per.append(np.asarray(weighted[:, 2], np.float64))
            bar.step(decoder.label)
    best, means, ses, second, difference, difference_se = least_time(np.stack(per),
                                                                     recording.weights)
    return DecoderChoice(best, candidates[best], float(means[best]), means, ses, second,
                         difference, difference_se)
