"""Real model pairs: record target rollouts once, estimate what any lossless decoder costs.

* ``calls``: the filter over the phase of a call given the output (``call_structure``), the
  kernel every estimate (and a distillation objective) is built on;
* ``recording``: ``Recording`` (from arrays, statistics or a ``.npz`` file) and ``record``;
  ``top_k_dumps``: ``from_top_k``, a recording from engines' top-``k`` log-probabilities;
* ``estimate``: ``estimate`` from a recording; ``lookahead``: ``best_lookahead``, every ``K`` in
  one program, with standard errors; ``choice``: ``best_decoder``, which tree, which budget,
  which decoder, with the paired difference to the runner-up;
* ``profiles``: engines' per-position acceptance vectors;
* ``distill``: objectives to distill a draft for what decoding costs (``decoding_objective``)
  and the forward-KL and total-variation baselines (``divergence_objective``);
* ``formats``: engines' and benchmarks' files in and out (vLLM's counters and log line,
  Model-Optimizer's ``speculation_profile.json``, SGLang's per-request fields, Spec-Bench's
  answers; vLLM's and TensorRT-LLM's draft-length schedules);
* ``serving``: ``estimate``'s goodput of a batch from a recording (``cost=ServingCost``).

``specjax.Recording``, ``specjax.record`` and ``specjax.estimate`` are also served from the top
level. See the guide "Real model pairs".
"""

from specjax.pairs.calls import CallStructure
from specjax.pairs.calls import call_structure
from specjax.pairs.calls import expected_call_time
from specjax.pairs.calls import rejection_rate
from specjax.pairs.choice import DecoderChoice
from specjax.pairs.choice import best_decoder
from specjax.pairs.distill import DistillLoss
from specjax.pairs.distill import decoding_objective
from specjax.pairs.distill import divergence_objective
from specjax.pairs.estimate import Estimate
from specjax.pairs.estimate import estimate
from specjax.pairs.formats import SglangRequests
from specjax.pairs.formats import SpecBenchSteps
from specjax.pairs.formats import SpeculationProfile
from specjax.pairs.formats import VllmLogLine
from specjax.pairs.formats import VllmLogTotals
from specjax.pairs.formats import VllmMetrics
from specjax.pairs.formats import conditional_from_marginal
from specjax.pairs.formats import marginal_from_conditional
from specjax.pairs.formats import profile_of
from specjax.pairs.formats import read_sglang_requests
from specjax.pairs.formats import read_spec_bench
from specjax.pairs.formats import read_speculation_profile
from specjax.pairs.formats import read_vllm_log
from specjax.pairs.formats import read_vllm_metrics
from specjax.pairs.formats import sum_vllm_log
from specjax.pairs.formats import trtllm_draft_len_schedule
from specjax.pairs.formats import vllm_dynamic_table
from specjax.pairs.formats import write_speculation_profile
from specjax.pairs.lookahead import BatchLookahead
from specjax.pairs.lookahead import LookaheadEstimate
from specjax.pairs.lookahead import batch_lookahead
from specjax.pairs.lookahead import best_lookahead
from specjax.pairs.profiles import ProfileChoice
from specjax.pairs.profiles import acceptance_profile
from specjax.pairs.profiles import profile_accepted_length
from specjax.pairs.profiles import profile_lookahead
from specjax.pairs.profiles import profile_tree
from specjax.pairs.profiles import read_profile
from specjax.pairs.recording import DecoderRates
from specjax.pairs.recording import Recording
from specjax.pairs.rollouts import record
from specjax.pairs.top_k_dumps import TopKRecording
from specjax.pairs.top_k_dumps import from_top_k
from specjax.pairs.top_k_dumps import pack_top_k

__all__ = [
    "BatchLookahead",
    "CallStructure",
    "DecoderChoice",
    "DecoderRates",
    "DistillLoss",
    "Estimate",
    "LookaheadEstimate",
    "ProfileChoice",
    "Recording",
    "SglangRequests",
    "SpecBenchSteps",
    "SpeculationProfile",
    "TopKRecording",
    "VllmLogLine",
    "VllmLogTotals",
    "VllmMetrics",
    "acceptance_profile",
    "batch_lookahead",
    "best_decoder",
    "best_lookahead",
    "call_structure",
    "conditional_from_marginal",
    "decoding_objective",
    "divergence_objective",
    "estimate",
    "expected_call_time",
    "from_top_k",
    "marginal_from_conditional",
    "pack_top_k",
    "profile_accepted_length",
    "profile_lookahead",
    "profile_of",
    "profile_tree",
    "read_profile",
    "read_sglang_requests",
    "read_spec_bench",
    "read_speculation_profile",
    "read_vllm_log",
    "read_vllm_metrics",
    "record",
    "rejection_rate",
    "sum_vllm_log",
    "trtllm_draft_len_schedule",
    "vllm_dynamic_table",
    "write_speculation_profile",
]
