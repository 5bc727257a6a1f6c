"""Formats in and out: the files serving engines and benchmarks write about speculation's
acceptance, read into specjax's quantities where the conversion is exact and refused, with the
reason, where it is not; and the batch-size tables engines read, written from
``specjax.theory.batch_lookahead``.

Every quantity below is a ratio of counts summed over the speculation rounds (target calls) of
a run, as in ``specjax.theory.metrics``: the *profile* ``a_i`` is the fraction of rounds that
kept at least ``i`` drafts (marginal, ``EngineMetrics.acceptance_per_position``); the *mean
acceptance length* is ``1 + sum_i a_i`` tokens per round (bonus or correction token counted,
``EngineMetrics.mean_acceptance_length``); the *draft acceptance rate* is accepted over drafted
tokens. ``specjax.pairs.profiles`` says what a profile cannot determine.

================  =========================  ============================  =====================
format            holds                      specjax reads, exactly        refused, and why
================  =========================  ============================  =====================
vLLM /metrics     counters over the run:     the counts, the profile, the  several models in one
                  rounds, drafted and        mean acceptance length, the   text (pairs mixed);
                  accepted tokens, accepted  draft acceptance rate         positions not summing
                  per position, per engine                                 to the accepted count
vLLM log line     one interval: mean length  per line: the profile and     averaging lines: an
                  (%.2f), throughputs,       mean length to the printed    interval's weight
                  accepted and drafted       digits, the counts; over      (its rounds) is not
                  tokens, profile (%.3f),    lines: the summed counts and  in the line
                  rate (%)                   their rate
Model-Optimizer   marginal and conditional   the profile (from the         stubs (measured
profile JSON      rates, per-step and per-   histogram when there), the    false), schema 2+,
                  request mean length,       per-step mean; the per-       vectors cut short or
                  histogram of tokens per    request mean as a number      inconsistent
                  step
SGLang meta_info  per request: verify        tokens per step; the mean of  a profile from means
                  steps, completion tokens,  per-request ratios (named     and counts alone
                  accepted and proposed      apart); mean acceptance       (needs the histogram)
                  drafts, histogram of       length; profile (histogram)
                  accepted drafts
Spec-Bench        per answer, turn and       every step; their mean with   values below 1 (a
answers           step: tokens emitted       a standard error (answers as  fork without the
                  (bonus counted)            clusters); the profile        bonus token: say so)
================  =========================  ============================  =====================

Readers: ``read_vllm_metrics``, ``read_vllm_log`` (and ``sum_vllm_log``),
``read_speculation_profile``, ``read_sglang_requests``, ``read_spec_bench``.

Out: ``vllm_dynamic_table`` (vLLM's ``num_speculative_tokens_per_batch_size``) and
``trtllm_draft_len_schedule`` (TensorRT-LLM's ``draft_len_schedule``) from
``batch_lookahead``'s policies, which are computed at the batch sizes given; between two of them
both engines carry the smaller batch size's ``K`` forward (their documented semantics, not a
computed optimum). ``write_speculation_profile`` writes Model-Optimizer's schema from an exact
or estimated result. ``conditional_from_marginal`` and ``marginal_from_conditional`` convert
between the two conventions; ``profile_of`` gives the profile of any reading or refuses.

One module per format, every name served from here: ``vllm`` (counters and log line),
``modelopt`` (``speculation_profile.json``), ``sglang``, ``spec_bench``, ``schedules`` (the
tables out) and ``conversions``.

**Sources read, and the layout implemented.**

* vLLM: ``vllm/v1/spec_decode/metrics.py`` (vllm-project/vllm; ``SpecDecodingLogging.log``,
  ``SpecDecodingProm``): counters ``vllm:spec_decode_num_drafts``, ``..._num_draft_tokens``,
  ``..._num_accepted_tokens`` and ``..._num_accepted_tokens_per_pos`` (extra label
  ``position`` = 0..K-1), exposed by prometheus_client with the ``_total`` suffix (and a
  ``_created`` sample, ignored), labelled per engine (``model_name``, ``engine``); a round that
  accepts ``n`` drafts adds 1 to positions ``0..n-1``, so the positions sum to the accepted
  count. The log line is that file's format string (vLLM v1, 2025 and since); vLLM V0's
  "Speculative metrics:" line is another layout and is not read.
* vLLM dynamic speculative decoding: ``vllm/v1/spec_decode/dynamic/utils.py``
  (``validate_and_normalize_dynamic_sd_schedule``, ``build_dynamic_sd_schedule_lookup``) and
  PR #32374: ``speculative_config.num_speculative_tokens_per_batch_size`` is a list of
  ``[range_start, range_end, K]``, inclusive, non-overlapping, the first starting at 1; a gap and
  the tail carry the previous ``K``; every ``K`` is clamped to ``num_speculative_tokens`` (which
  must be positive). PR #32374's description shows an earlier form (a dict of ``"lo-hi"``
  strings); the list form is the one the code reads, and the one written here (the 5-item form
  with context ranges is not written).
* TensorRT-LLM: ``tensorrt_llm/llmapi/llm_args.py`` (``DecodingBaseConfig.draft_len_schedule``
  and ``validate_draft_len_schedule_and_sort``; NVIDIA/TensorRT-LLM): a dict of batch-size
  thresholds to draft lengths, a batch of size ``>= threshold`` using the largest threshold's
  length; it must contain ``1`` (older releases) or have its smallest key (newer) map to
  ``max_draft_len``, and no length may exceed it.
* Model-Optimizer: ``examples/specdec_bench/specdec_bench/speculation_profile.py``
  (``build_profile``, ``stub_profile``, schema ``"1.0"``) and ``.../metrics/acceptance_rate.py``
  (the histogram: steps by tokens emitted, bonus counted, keys strings after JSON),
  ``examples/speculative_decoding/scripts/attach_speculation_profile.py`` (NVIDIA/Model-Optimizer,
  read from the stored index in 2026; the fetched snapshot predates the file). The reader
  checks what the writer there guarantees: the marginals are the survival function of the
  histogram (position ``i`` is length ``i + 2``), conditionals their consecutive ratios (0 past
  a zero), rounded to 6 digits.
* SGLang: ``python/sglang/srt/managers/tokenizer_manager.py``
  (``_calculate_spec_decoding_metrics``; sgl-project/sglang): ``spec_verify_ct`` (verify steps),
  ``spec_accept_length = completion_tokens / spec_verify_ct``; accepted and proposed drafts
  under three generations of names (``spec_accept_token_num``/``spec_draft_token_num``,
  ``spec_accepted_drafts``/``spec_proposed_drafts``, ``spec_num_correct_drafts``/
  ``spec_num_proposed_drafts``), and a histogram of steps by accepted drafts
  (``spec_accept_histogram``, later ``spec_correct_drafts_histogram``). ``completion_tokens``
  counts the prefill's first token too, which no verify step emitted: SGLang's tokens per step
  is ``1 / spec_verify_ct`` above ``1 + accepted / spec_verify_ct`` for each request; the
  latter (vLLM's convention) is given when the accepted count is there.
* Spec-Bench: ``evaluation/eval.py`` and ``evaluation/speed.py`` (hemingkx/Spec-Bench): one JSON
  object per line, ``choices`` a list of ``{"index", "turns", "decoding_steps", "new_tokens",
  "wall_time", "accept_lengths"}``; ``accept_lengths`` lists, per step of every turn, the tokens
  the step added (``input_ids.shape[1] - cur_length`` in the ``inference_*.py`` scripts: accepted
  drafts plus one). ``speed.py`` reads ``choices[0]`` only; every choice is read here.
"""

from __future__ import annotations

from specjax.pairs.formats.conversions import conditional_from_marginal
from specjax.pairs.formats.conversions import marginal_from_conditional
from specjax.pairs.formats.conversions import profile_of
from specjax.pairs.formats.modelopt import SCHEMA_VERSION
from specjax.pairs.formats.modelopt import SpeculationProfile
from specjax.pairs.formats.modelopt import read_speculation_profile
from specjax.pairs.formats.modelopt import write_speculation_profile
from specjax.pairs.formats.schedules import trtllm_draft_len_schedule
from specjax.pairs.formats.schedules import vllm_dynamic_table
from specjax.pairs.formats.sglang import SglangRequests
from specjax.pairs.formats.sglang import read_sglang_requests
from specjax.pairs.formats.spec_bench import SpecBenchSteps
from specjax.pairs.formats.spec_bench import read_spec_bench
from specjax.pairs.formats.vllm import VllmLogLine
from specjax.pairs.formats.vllm import VllmLogTotals
from specjax.pairs.formats.vllm import VllmMetrics
from specjax.pairs.formats.vllm import read_vllm_log
from specjax.pairs.formats.vllm import read_vllm_metrics
from specjax.pairs.formats.vllm import sum_vllm_log

__all__ = [
    "SCHEMA_VERSION",
    "SglangRequests",
    "SpecBenchSteps",
    "SpeculationProfile",
    "VllmLogLine",
    "VllmLogTotals",
    "VllmMetrics",
    "conditional_from_marginal",
    "marginal_from_conditional",
    "profile_of",
    "read_sglang_requests",
    "read_spec_bench",
    "read_speculation_profile",
    "read_vllm_log",
    "read_vllm_metrics",
    "sum_vllm_log",
    "trtllm_draft_len_schedule",
    "vllm_dynamic_table",
    "write_speculation_profile",
]
