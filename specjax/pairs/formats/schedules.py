"""The batch-size tables engines read, from ``specjax.theory.batch_lookahead``'s policies:
vLLM's dynamic speculative decoding schedule (``vllm_dynamic_table``) and TensorRT-LLM's
``draft_len_schedule`` (``trtllm_draft_len_schedule``). Sources: ``specjax.pairs.formats``.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable

from specjax import _checks
from specjax.pairs.lookahead import BatchLookahead
from specjax.theory.serving import BatchPolicy

__all__ = [
    "trtllm_draft_len_schedule",
    "vllm_dynamic_table",
]


def _schedule(policies, batch_sizes) -> tuple[list[tuple[int, int]], int]:
    """``[(batch size, K)]`` checked, runs of one ``K`` merged to their first size; and the last
    batch size."""
    single = isinstance(policies, (BatchPolicy, BatchLookahead)) or \
        not isinstance(policies, (tuple, list))
    policies = (policies,) if single else tuple(policies)
    if isinstance(batch_sizes, numbers.Integral):
        batch_sizes = (batch_sizes,)
    if isinstance(batch_sizes, (str, bytes)) or not isinstance(batch_sizes, Iterable):
        raise ValueError(f"batch_sizes must be a positive int or a sequence of them, got "
                         f"{batch_sizes!r}"[:300])
    sizes = tuple(batch_sizes)
    if not policies or len(sizes) != len(policies):
        raise ValueError(f"batch_sizes must give one batch size per policy: {len(sizes)} sizes "
                         f"for {len(policies)} policies")
    ks = []
    for policy in policies:
        k = policy.lookahead if isinstance(policy, (BatchPolicy, BatchLookahead)) else policy
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 0:
            raise ValueError(f"policies must be batch_lookahead's BatchPolicy or BatchLookahead "
                             f"values (or non-negative ints K), got {policy!r}"[:300])
        ks.append(int(k))
    for size in sizes:
        _checks.check_positive_int("batch_sizes", size)
    sizes = [int(s) for s in sizes]
    if any(b <= a for a, b in zip(sizes, sizes[1:])):
        raise ValueError(f"batch_sizes must increase strictly (the sizes batch_lookahead was "
                         f"given), got {sizes}")
    if sizes[0] != 1:
        raise ValueError(f"batch_sizes must start at 1: engines need a K for every batch size "
                         f"from 1, and K below {sizes[0]} was not computed (add 1 to "
                         f"batch_lookahead's batch_size)")
    if max(ks) == 0:
        raise ValueError("every policy turns speculation off (K = 0): serve without a "
                         "speculative config rather than a table of zeros")
    merged = []
    for size, k in zip(sizes, ks):
        if not merged or merged[-1][1] != k:
            merged.append((size, k))
    return merged, sizes[-1]


def vllm_dynamic_table(policies, batch_sizes, *, max_batch_size: int | None = None) -> dict:
    """vLLM's dynamic speculative decoding schedule from ``batch_lookahead``'s policies: the
    entries of ``speculative_config`` (``json.dumps`` it for ``--speculative-config``, with your
    ``method`` and ``model``).

    ``num_speculative_tokens_per_batch_size`` lists ``[range_start, range_end, K]`` (inclusive):
    each computed batch size's ``K`` holds up to the next computed size (vLLM carries a ``K``
    over a gap and past the last range alike); runs of one ``K`` are merged.
    ``num_speculative_tokens`` is the largest ``K`` (vLLM's buffers; it clamps every entry to
    it).

    Args:
      policies: ``batch_lookahead``'s tuple of ``BatchPolicy`` (or one), or ints ``K``.
      batch_sizes: the batch sizes they were computed at, increasing, starting at 1.
      max_batch_size: where the last range ends (default: the last batch size; vLLM carries its
        ``K`` to ``max_num_seqs`` either way).

    Raises:
      ValueError: lengths that differ, sizes not increasing from 1 (``K`` below the first
        computed size is unknown), ``max_batch_size`` below the last size, or ``K = 0`` at every
        size (vLLM needs ``num_speculative_tokens > 0``).

    Example:
      >>> from specjax.pairs import formats
      >>> formats.vllm_dynamic_table([3, 3, 1, 0], [1, 4, 8, 32], max_batch_size=256)
      {'num_speculative_tokens': 3, 'num_speculative_tokens_per_batch_size': [[1, 7, 3], \
[8, 31, 1], [32, 256, 0]]}
    """
    merged, last = _schedule(policies, batch_sizes)
    if max_batch_size is not None:
        _checks.check_positive_int("max_batch_size", max_batch_size)
        if max_batch_size < last:
            raise ValueError(f"max_batch_size ({max_batch_size}) is below the last batch size "
                             f"({last})")
        last = max_batch_size
    ends = [start - 1 for start, _ in merged[1:]] + [int(last)]
    return {"num_speculative_tokens": max(k for _, k in merged),
            "num_speculative_tokens_per_batch_size": [[start, end, k] for (start, k), end
                                                      in zip(merged, ends)]}


def trtllm_draft_len_schedule(policies, batch_sizes) -> dict:
    """TensorRT-LLM's ``draft_len_schedule`` (and its ``max_draft_len``) from
    ``batch_lookahead``'s policies: the speculative config's entries (its YAML
    ``extra_llm_api_options`` or the ``*DecodingConfig`` arguments).

    The schedule maps batch-size thresholds to draft lengths, a batch of size ``>= threshold``
    using the largest threshold below it; only the sizes where ``K`` changes are kept.

    Args:
      policies: ``batch_lookahead``'s tuple of ``BatchPolicy`` (or one), or ints ``K``.
      batch_sizes: the batch sizes they were computed at, increasing, starting at 1.

    Raises:
      ValueError: what ``vllm_dynamic_table`` raises, or a ``K`` above batch size 1's:
        TensorRT-LLM requires ``draft_len_schedule[1] == max_draft_len`` (its validator), so a
        schedule whose ``K`` grows with the batch cannot be written.

    Example:
      >>> from specjax.pairs import formats
      >>> formats.trtllm_draft_len_schedule([3, 3, 1, 0], [1, 4, 8, 32])
      {'max_draft_len': 3, 'draft_len_schedule': {1: 3, 8: 1, 32: 0}}
    """
    merged, _ = _schedule(policies, batch_sizes)
    first = merged[0][1]
    if any(k > first for _, k in merged):
        raise ValueError(f"K at batch size 1 is {first}, below the largest K "
                         f"{max(k for _, k in merged)}: TensorRT-LLM requires "
                         f"draft_len_schedule[1] == max_draft_len, so a schedule whose K grows "
                         f"with the batch cannot be written")
    return {"max_draft_len": first, "draft_len_schedule": dict(merged)}
