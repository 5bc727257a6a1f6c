"""NumPy references of the serving benchmark (``scripts/benchmark_serving.py`` and
``python -m specjax bench``), written once and independently of ``specjax.theory.serving``.

``numpy_goodput`` computes the long-run goodput of ``B`` lockstep slots from one slot's law of
work by the definition: the law of the tokens scored in a step by ``B`` successive direct
convolutions (no squaring), the number of slots in each draft pass from SciPy's binomial law, in
float64 (``numpy_goodput_grid``: a loop over slot works and batch sizes).
``numpy_best_allocation`` tries every allocation of draft lengths.
"""

from __future__ import annotations

import itertools

import numpy as np
from scipy import stats

__all__ = ["host_works", "numpy_best_allocation", "numpy_goodput", "numpy_goodput_grid"]


def numpy_goodput(mass, calls, tokens: float, passes, scored, draft_table, target_table,
                  batch_size: int) -> float:
    """Tokens per unit time of ``batch_size`` slots: ``B tokens / calls`` over the expected step
    time, each slot's step work ``(passes[i], scored[i])`` with probability ``mass[i] /
    calls``, the slots independent; ``draft_table[n]`` a pass over ``n`` slots,
    ``target_table[n]`` a forward over ``n`` tokens."""
    law = np.asarray(mass, np.float64) / float(calls)
    passes, scored = np.asarray(passes), np.asarray(scored)
    single = np.zeros(int(scored.max()) + 1)
    np.add.at(single, scored, law)
    total = np.ones(1)
    for _ in range(batch_size):
        total = np.convolve(total, single)
    time = float(total @ np.asarray(target_table, np.float64)[:total.size])
    for j in range(1, int(passes.max(initial=0)) + 1):
        tail = min(1.0, float(law[passes >= j].sum()))  # float32 sums may pass 1
        counts = np.arange(batch_size + 1)
        time += float(stats.binom.pmf(counts, batch_size, tail)
                      @ np.asarray(draft_table, np.float64)[:batch_size + 1])
    return batch_size * tokens / float(calls) / time


def host_works(works) -> list:
    """``(mass, calls, tokens, passes, scored)`` of each slot work (``specjax.theory.slot_work``)
    in NumPy and floats: ``numpy_goodput``'s first arguments."""
    return [(np.asarray(w.mass), float(w.calls), float(w.tokens), w.passes, w.scored)
            for w in works]


def numpy_goodput_grid(works, draft_table, target_table, batch_sizes) -> np.ndarray:
    """``(len(batch_sizes), len(works))``: ``numpy_goodput`` of every work ``(mass, calls,
    tokens, passes, scored)`` at every batch size, one at a time (the tables long enough for the
    largest)."""
    return np.asarray([[numpy_goodput(*work, draft_table, target_table, size) for work in works]
                       for size in batch_sizes])


def numpy_best_allocation(survival, draft_table, target_table, overhead: float = 0.0):
    """``(tokens per unit time, lookaheads)`` of the best of the ``(K + 1)^B`` allocations of
    one SD step: slot ``b`` drafting ``k`` emits ``1 + sum_{j <= k} survival[b, j - 1]``; pass
    ``j`` runs over the slots with ``k >= j``; the target scores ``sum (k + 1)`` tokens."""
    survival = np.asarray(survival, np.float64)
    batch, depth = survival.shape
    cumulative = np.concatenate([np.zeros((batch, 1)), np.cumsum(survival, axis=1)], axis=1)
    best, best_k = -1.0, None
    for ks in itertools.product(range(depth + 1), repeat=batch):
        ks = np.asarray(ks)
        tokens = batch + cumulative[np.arange(batch), ks].sum()
        time = overhead + target_table[batch + ks.sum()] + sum(
            draft_table[(ks >= j).sum()] for j in range(1, ks.max() + 1))
        if tokens / time > best:
            best, best_k = tokens / time, ks
    return best, best_k
