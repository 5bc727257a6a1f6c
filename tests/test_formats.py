"""Formats in and out (specjax.pairs.formats): every reader on a file or text written literally
in its published schema (made-up numbers), the writers' round trips, the refusals, and the
exported tables against the engines' documented rules. No JAX program runs here."""

import bisect
import json
import math

import numpy as np
import pytest

from specjax.pairs import formats
from specjax.theory.metrics import EngineMetrics
from specjax.theory.serving import BatchPolicy

# --------------------------------------------------------------------------------------------
# vLLM: Prometheus exposition text (prometheus_client's layout: _total and _created samples)
# --------------------------------------------------------------------------------------------

VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="l8b"} 3.0
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="l8b"} 6000.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="l8b"} 4000.0
# HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{engine="0",model_name="l8b"} 1.7e9
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="l8b"} 18000.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="l8b"} 12000.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="l8b"} 8100.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="l8b"} 5400.0
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="l8b",position="0"} 4200.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="l8b",position="1"} 2700.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="l8b",position="2"} 1200.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="l8b",position="0"} 2800.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="l8b",position="1"} 1800.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="l8b",position="2"} 800.0
"""


def test_vllm_metrics_sum_engines_and_give_the_profile():
    m = formats.read_vllm_metrics(VLLM_METRICS)
    assert (m.num_drafts, m.num_draft_tokens, m.num_accepted_tokens) == (10000, 30000, 13500)
    np.testing.assert_array_equal(m.num_accepted_tokens_per_pos, [7000, 4500, 2000])
    np.testing.assert_allclose(m.profile, [0.7, 0.45, 0.2], rtol=1e-15)
    assert m.mean_acceptance_length == pytest.approx(2.35, rel=1e-15)
    assert m.draft_acceptance_rate == pytest.approx(0.45, rel=1e-15)
    assert m.engines == 2 and m.labels == {"model_name": "l8b"}
    # the same counters without the _total suffix, one engine, escaped label values
    bare = "\n".join([
        'vllm:spec_decode_num_drafts{model_name="a \\"b\\""} 10',
        'vllm:spec_decode_num_draft_tokens{model_name="a \\"b\\""} 20 1700000000000',
        'vllm:spec_decode_num_accepted_tokens{model_name="a \\"b\\""} 9',
        'vllm:spec_decode_num_accepted_tokens_per_pos{model_name="a \\"b\\"",position="1"} 3',
        'vllm:spec_decode_num_accepted_tokens_per_pos{model_name="a \\"b\\"",position="0"} 6'])
    m = formats.read_vllm_metrics(bare)
    np.testing.assert_allclose(m.profile, [0.6, 0.3])
    assert m.labels == {"model_name": 'a "b"'} and formats.profile_of(m).tolist() == [0.6, 0.3]


def _two_models():
    other = VLLM_METRICS.replace("l8b", "other/model")
    return VLLM_METRICS + "\n".join(line for line in other.splitlines() if "spec_decode" in line
                                    and not line.startswith("#"))


def test_vllm_metrics_refuse_mixing_models_unless_one_is_selected():
    text = _two_models()
    with pytest.raises(ValueError, match="several series.*select="):
        formats.read_vllm_metrics(text)
    m = formats.read_vllm_metrics(text, select={"model_name": "other/model"})
    assert m.num_drafts == 10000 and m.labels == {"model_name": "other/model"}
    with pytest.raises(ValueError, match="no vllm:spec_decode_num_drafts.*select"):
        formats.read_vllm_metrics(text, select={"model_name": "absent"})


@pytest.mark.parametrize("edit, match", [
    (lambda t: t.replace('position="1"} 2700.0', 'position="1"} 2600.0'), "sum to"),
    (lambda t: t.replace('position="0"} 4200.0', 'position="0"} 1000.0').replace(
        'position="2"} 1200.0', 'position="2"} 4400.0'), "must not increase"),
    (lambda t: t.replace("} 6000.0", "} -6000.0"), "finite non-negative"),
    (lambda t: t.replace("} 6000.0", "} NaN"), "finite non-negative"),
    (lambda t: t.replace("} 6000.0", "} lots"), "not a number"),
    (lambda t: t.replace('position="2"', 'position="5"'), "0..K-1"),
    (lambda t: t.replace('position="2"', 'position="x"'), "not an integer"),
    (lambda t: "\n".join(x for x in t.splitlines() if "num_draft_tokens" not in x),
     "no vllm:spec_decode_num_draft_tokens"),
    (lambda t: t + "vllm:spec_decode_num_drafts{engine=\"0\",model_name=\""
                   "l8b\"} 1\n", "given twice"),
    (lambda t: t + "this is not a sample\n", "not a Prometheus sample"),
    (lambda t: t.replace("18000.0", "1000.0"), "exceeds num_draft_tokens"),
    (lambda t: t.replace("} 6000.0", "} 100.0").replace("} 4000.0", "} 100.0"), "num_drafts"),
])
def test_vllm_metrics_refuse_malformed_text(edit, match):
    with pytest.raises(ValueError, match=match):
        formats.read_vllm_metrics(edit(VLLM_METRICS))


def test_vllm_metrics_refuse_what_is_not_text():
    with pytest.raises(ValueError, match="text must be"):
        formats.read_vllm_metrics(b"bytes")
    with pytest.raises(ValueError, match="select must be"):
        formats.read_vllm_metrics(VLLM_METRICS, select="model")


# --------------------------------------------------------------------------------------------
# vLLM: the periodic log line (vllm/v1/spec_decode/metrics.py's format string)
# --------------------------------------------------------------------------------------------

LOG_LINE = ("INFO 08-14 09:12:03 [metrics.py:96] SpecDecoding metrics: Mean acceptance length: "
            "2.35, Accepted throughput: 135.00 tokens/s, Drafted throughput: 300.00 tokens/s, "
            "Accepted: 1350 tokens, Drafted: 3000 tokens, Per-position acceptance rate: 0.700, "
            "0.450, 0.200, Avg Draft acceptance rate: 45.0%")


def test_vllm_log_line_parses_to_the_printed_numbers():
    (line,) = formats.read_vllm_log(LOG_LINE)
    assert line.mean_acceptance_length == 2.35 and line.accepted == 1350
    assert line.drafted == 3000 and line.draft_acceptance_rate == pytest.approx(0.45)
    assert (line.accepted_throughput, line.drafted_throughput) == (135.0, 300.0)
    assert line.profile.tolist() == [0.7, 0.45, 0.2]
    assert formats.profile_of(line).tolist() == [0.7, 0.45, 0.2]


def test_vllm_log_gives_each_interval_and_sums_only_counts():
    second = LOG_LINE.replace("Accepted: 1350", "Accepted: 650").replace(
        "Drafted: 3000", "Drafted: 1000")
    text = "\n".join(["INFO starting", LOG_LINE, "INFO Avg prompt throughput: 1.0 tokens/s",
                      second])
    lines = formats.read_vllm_log(text)
    assert len(lines) == 2 and [x.accepted for x in lines] == [1350, 650]
    totals = formats.sum_vllm_log(lines)
    assert totals == formats.VllmLogTotals(accepted=2000, drafted=4000,
                                           draft_acceptance_rate=0.5, intervals=2)
    with pytest.raises(ValueError, match="VllmLogLine"):
        formats.sum_vllm_log([])
    # a line without the optional throughputs and rate still reads
    (bare,) = formats.read_vllm_log(
        "SpecDecoding metrics: Mean acceptance length: 1.50, Accepted: 5 tokens, Drafted: 20 "
        "tokens, Per-position acceptance rate: 0.500, 0.000")
    assert bare.accepted_throughput is None and bare.draft_acceptance_rate is None
    assert bare.profile.tolist() == [0.5, 0.0]


@pytest.mark.parametrize("text, match", [
    ("INFO nothing about speculation", "no 'SpecDecoding metrics:'"),
    (LOG_LINE.replace("2.35", "2.60"), "disagrees"),
    (LOG_LINE.replace("0.450, 0.200", "0.200, 0.450"), "must not increase"),
    (LOG_LINE.replace("0.700", "1.700"), r"in \[0, 1\]"),
    (LOG_LINE.replace("Drafted: 3000", "Drafted: 30"), "exceeds drafted"),
    (LOG_LINE.replace("Accepted: 1350 tokens, ", ""), "'Accepted'"),
    (LOG_LINE.replace("Mean acceptance length: 2.35", "Mean acceptance length: 0.35"), ">= 1"),
])
def test_vllm_log_refuses_malformed_lines(text, match):
    with pytest.raises(ValueError, match=match):
        formats.read_vllm_log(text)


# --------------------------------------------------------------------------------------------
# Model-Optimizer: speculation_profile.json (specdec_bench/speculation_profile.py, schema 1.0)
# --------------------------------------------------------------------------------------------

# As build_profile writes it: steps by tokens emitted (120 x 1, 150 x 2, 130 x 3, 100 x 4), so
# P(len >= 2, 3, 4) = 0.76, 0.46, 0.2 and the per-step mean 1210 / 500 = 2.42.
MODELOPT_PROFILE = """\
{
  "schema_version": "1.0",
  "measured": true,
  "method": "eagle3",
  "draft_checkpoint": {"id": "nvidia/Llama-3.1-8B-Instruct-Eagle3"},
  "target_model": {"id": "l8b"},
  "num_speculative_tokens": 3,
  "block_size": null,
  "max_supported_k": 3,
  "verification_method": "longest_prefix",
  "conditional_accept_rates": [0.76, 0.605263, 0.434783],
  "marginal_accept_rates": [0.76, 0.46, 0.2],
  "mean_accept_length": 2.42,
  "mean_accept_length_per_request": 2.487113,
  "accept_length_model": "chain_analytic",
  "accept_length_by_k": {"3": 2.42},
  "acceptance_length_histogram": {"1": 120, "2": 150, "3": 130, "4": 100},
  "per_category": {"writing": {"mean_accept_length": 2.3}},
  "measurement_conditions": {"dataset": "mtbench", "concurrency": 1},
  "validation": {
    "mean_consistency": {"implied_mean_accept_length": 2.42,
                         "reported_mean_accept_length": 2.42, "abs_delta": 0.0,
                         "tolerance": 0.02, "passed": true},
    "marginal_monotonicity": {"passed": true, "violations": []}
  }
}
"""


def _file(tmp_path, text, name="speculation_profile.json"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_modelopt_profile_reads_the_histogram_exactly(tmp_path):
    p = formats.read_speculation_profile(_file(tmp_path, MODELOPT_PROFILE))
    np.testing.assert_allclose(p.profile, [0.76, 0.46, 0.2], rtol=1e-15)
    np.testing.assert_allclose(p.conditional, [0.76, 0.46 / 0.76, 0.2 / 0.46], rtol=1e-15)
    assert p.mean_accept_length == pytest.approx(2.42, rel=1e-15)
    assert p.mean_accept_length_per_request == 2.487113
    assert (p.num_speculative_tokens, p.method, p.accept_length_model) == (3, "eagle3",
                                                                          "chain_analytic")
    assert p.verification_method == "longest_prefix" and p.histogram == {1: 120, 2: 150, 3: 130,
                                                                           4: 100}
    assert p.document["measurement_conditions"]["dataset"] == "mtbench"


def test_modelopt_profile_with_conditional_rates_only(tmp_path):
    # Model-Optimizer's own test payload (tests of hf_spec_export): conditionals, no K field
    payload = {"schema_version": "1.0", "measured": True,
               "conditional_accept_rates": [0.816082, 0.776577, 0.749591],
               "mean_accept_length": 2.924887}
    p = formats.read_speculation_profile(_file(tmp_path, json.dumps(payload)))
    np.testing.assert_allclose(p.profile, np.cumprod([0.816082, 0.776577, 0.749591]))
    assert p.num_speculative_tokens == 3 and p.histogram is None
    assert p.mean_accept_length == pytest.approx(1 + p.profile.sum())
    assert p.mean_accept_length == pytest.approx(2.924887, abs=1e-4)


def _edited(**changes):
    document = json.loads(MODELOPT_PROFILE)
    for key, value in changes.items():
        if value is KeyError:
            del document[key]
        else:
            document[key] = value
    return json.dumps(document)


@pytest.mark.parametrize("text, match", [
    ("{not json", "not JSON"),
    ("[1, 2, 3]", "schema_version"),
    (_edited(schema_version=KeyError), "schema_version"),
    (_edited(schema_version="2.0"), "only 1.x"),
    (_edited(measured=False), "unmeasured stub"),
    (_edited(marginal_accept_rates=[0.76, 0.46]), "has 2 entries"),
    (_edited(acceptance_length_histogram=None, conditional_accept_rates=None,
             marginal_accept_rates=[0.46, 0.76, 0.2]), "increase with the position"),
    (_edited(conditional_accept_rates=[0.76, 0.7, 0.434783]), "disagree"),
    (_edited(marginal_accept_rates=[0.76, 0.45, 0.2], conditional_accept_rates=None),
     "disagree with the histogram"),
    (_edited(acceptance_length_histogram={"1": 1, "5": 1}), "cut short"),
    (_edited(acceptance_length_histogram={"0": 3}), "integers >= 1"),
    (_edited(acceptance_length_histogram={"1": -3}), "non-negative integer"),
    (_edited(marginal_accept_rates=[0.76, float("nan"), 0.2]), "rates in"),
    (_edited(acceptance_length_histogram=None, conditional_accept_rates=None,
             marginal_accept_rates=None), "no rates"),
    (_edited(num_speculative_tokens=0), "positive integer"),
    (_edited(validation={"mean_consistency": {"passed": False,
                                              "implied_mean_accept_length": 2.1,
                                              "reported_mean_accept_length": 2.42}}),
     "mean_consistency check failed"),
])
def test_modelopt_profile_refuses_malformed_files(tmp_path, text, match):
    path = _file(tmp_path, text)
    with pytest.raises(ValueError, match=match) as error:
        formats.read_speculation_profile(path)
    assert str(path) in str(error.value)
    with pytest.raises(ValueError, match="no such file"):
        formats.read_speculation_profile(tmp_path / "absent.json")


def _metrics(profile):
    a = np.asarray(profile)
    return EngineMetrics(expected_calls=np.float64(10.0), expected_drafted=np.float64(30.0),
                         accepted_at=10 * a, acceptance_per_position=a,
                         conditional_acceptance=formats.conditional_from_marginal(a),
                         mean_acceptance_length=1 + a.sum(),
                         draft_acceptance_rate=10 * a.sum() / 30)


def test_modelopt_writer_round_trips_atomically(tmp_path):
    path = tmp_path / "speculation_profile.json"
    profile = [0.546187, 0.29213, 0.156205, 0.083]
    document = formats.write_speculation_profile(
        path, _metrics(profile), method="draft_model", target_model={"id": "q"},
        measurement_conditions={"note": "paper instance"})
    assert json.loads(path.read_text()) == document
    assert [p.name for p in tmp_path.iterdir()] == ["speculation_profile.json"]  # no temp file
    assert document["schema_version"] == "1.0" and document["measured"] is True
    assert document["measurement_conditions"] == {"source": "specjax", "kind": "exact",
                                                  "note": "paper instance"}
    assert document["mean_accept_length_per_request"] is None
    back = formats.read_speculation_profile(path)
    assert back.profile.tolist() == profile  # exact: JSON floats round-trip
    np.testing.assert_allclose(back.conditional, formats.conditional_from_marginal(profile))
    assert back.mean_accept_length == pytest.approx(1 + sum(profile), rel=1e-15)
    assert back.accept_length_model == "chain_analytic"
    # overwritten whole; a profile vector and a block method
    formats.write_speculation_profile(path, [0.9, 0.0], method="dflash")
    back = formats.read_speculation_profile(path)
    assert back.profile.tolist() == [0.9, 0.0] and back.accept_length_model == "measured_per_k"
    assert back.conditional.tolist() == [0.9, 0.0]
    with pytest.raises(ValueError, match="must not increase"):
        formats.write_speculation_profile(path, [0.2, 0.5])
    with pytest.raises(ValueError, match="result must be"):
        formats.write_speculation_profile(path, "0.9, 0.5")
    assert formats.read_speculation_profile(path).profile.tolist() == [0.9, 0.0]  # untouched


# --------------------------------------------------------------------------------------------
# SGLang: per-request meta_info (tokenizer_manager._calculate_spec_decoding_metrics)
# --------------------------------------------------------------------------------------------

SGLANG_RESPONSES = [  # /generate responses, newest field names (with their aliases)
    {"text": "...", "meta_info": {
        "id": "a1", "prompt_tokens": 120, "completion_tokens": 31, "spec_verify_ct": 10,
        "spec_accept_length": 3.1, "spec_accept_rate": 20 / 30,
        "spec_num_correct_drafts": 20, "spec_accepted_drafts": 20,
        "spec_num_proposed_drafts": 30, "spec_proposed_drafts": 30,
        "spec_correct_drafts_histogram": [2, 1, 2, 5], "spec_accept_histogram": [2, 1, 2, 5],
        "finish_reason": {"type": "length", "length": 31}}},
    {"text": "...", "meta_info": {
        "id": "a2", "prompt_tokens": 80, "completion_tokens": 5, "spec_verify_ct": 4,
        "spec_accept_length": 1.25, "spec_accept_rate": 0.0, "spec_num_correct_drafts": 0,
        "spec_num_proposed_drafts": 12, "spec_correct_drafts_histogram": [4, 0, 0, 0]}},
    {"text": "", "meta_info": {"id": "a3", "completion_tokens": 1, "spec_verify_ct": 0,
                               "spec_accept_length": 0, "spec_num_correct_drafts": 0,
                               "spec_num_proposed_drafts": 0,
                               "spec_correct_drafts_histogram": [0]}},
]


def test_sglang_per_step_and_per_request_means_are_named_apart():
    s = formats.read_sglang_requests(SGLANG_RESPONSES)
    assert (s.requests, s.without_steps, s.verify_steps, s.completion_tokens) == (3, 1, 14, 37)
    assert s.tokens_per_step == 37 / 14  # sum over sum
    assert s.mean_of_request_ratios == pytest.approx((3.1 + 1.25) / 2)  # mean of ratios
    assert (s.accepted_drafts, s.proposed_drafts) == (20, 42)
    assert s.mean_acceptance_length == 1 + 20 / 14
    assert s.draft_acceptance_rate == 20 / 42
    np.testing.assert_array_equal(s.histogram, [6, 1, 2, 5])
    np.testing.assert_allclose(s.profile, [8 / 14, 7 / 14, 5 / 14])
    assert formats.profile_of(s).sum() == pytest.approx(s.mean_acceptance_length - 1)


def test_sglang_older_names_and_a_missing_histogram():
    records = [{"completion_tokens": 21, "spec_verify_ct": 8, "spec_accept_length": 21 / 8,
                "spec_accept_token_num": 12, "spec_draft_token_num": 24},
               {"completion_tokens": 9, "spec_verify_ct": 3, "spec_accept_length": 3.0,
                "spec_accepted_drafts": 6, "spec_proposed_drafts": 9}]
    s = formats.read_sglang_requests(records)
    assert s.accepted_drafts == 18 and s.proposed_drafts == 33 and s.histogram is None
    assert s.tokens_per_step == 30 / 11 and s.mean_of_request_ratios == (21 / 8 + 3.0) / 2
    with pytest.raises(ValueError, match="not the per-position profile"):
        formats.profile_of(s)
    s = formats.read_sglang_requests([{"completion_tokens": 9, "spec_verify_ct": 3}])
    assert s.accepted_drafts is None and s.mean_acceptance_length is None
    assert s.draft_acceptance_rate is None and s.tokens_per_step == 3.0


def _sglang(**changes):
    meta = dict(SGLANG_RESPONSES[0]["meta_info"])
    for key, value in changes.items():
        if value is KeyError:
            del meta[key]
        else:
            meta[key] = value
    return [meta]


@pytest.mark.parametrize("records, match", [
    ("not records", "sequence of SGLang"),
    ([], "empty"),
    (["x"], r"records\[0\] must be a dict"),
    (_sglang(spec_verify_ct=KeyError), "no spec_verify_ct"),
    (_sglang(completion_tokens=-1), "non-negative integer"),
    (_sglang(completion_tokens=31.5), "non-negative integer"),
    (_sglang(spec_verify_ct=float("nan")), "non-negative integer"),
    (_sglang(spec_accept_length=2.0), "spec_accept_length 2.0 is not"),
    (_sglang(spec_accepted_drafts=19), "disagree"),
    (_sglang(spec_num_correct_drafts=40, spec_accepted_drafts=40), "exceed"),
    (_sglang(spec_correct_drafts_histogram=[2, 1, 2, 4], spec_accept_histogram=KeyError),
     "counts 9 steps"),
    (_sglang(spec_correct_drafts_histogram=[2, 2, 1, 5], spec_accept_histogram=KeyError),
     "accepts 19"),
    (_sglang(spec_correct_drafts_histogram=[2, -1, 4, 5], spec_accept_histogram=KeyError),
     "non-negative step counts"),
    ([{"completion_tokens": 1, "spec_verify_ct": 0}], "no request has a verify step"),
])
def test_sglang_refuses_malformed_records(records, match):
    with pytest.raises(ValueError, match=match):
        formats.read_sglang_requests(records)


# --------------------------------------------------------------------------------------------
# Spec-Bench: answer files (evaluation/eval.py's layout)
# --------------------------------------------------------------------------------------------

SPEC_BENCH_ANSWERS = [  # one object per line, as evaluation/eval.py appends them
    {"question_id": 81, "category": "writing", "answer_id": "Q7u3",
     "model_id": "vicuna-7b-v1.3-eagle-float16",
     "choices": [{"index": 0, "turns": ["Aloha!", "Sure."], "decoding_steps": [3, 2],
                  "new_tokens": [7, 3], "wall_time": [0.21, 0.09],
                  "accept_lengths": [3, 1, 3, 2, 1]}],
     "tstamp": 1715000000.1},
    {"question_id": 82, "category": "writing", "answer_id": "Zk2p",
     "model_id": "vicuna-7b-v1.3-eagle-float16",
     "choices": [{"index": 0, "turns": ["Dear..."], "decoding_steps": [2], "new_tokens": [8],
                  "wall_time": [0.2], "accept_lengths": [4, 4]},
                 {"index": 1, "turns": ["Hi"], "decoding_steps": [1], "new_tokens": [1],
                  "wall_time": [0.05], "accept_lengths": [1]}],
     "tstamp": 1715000001.2},
]
SPEC_BENCH = "".join(json.dumps(answer) + "\n" for answer in SPEC_BENCH_ANSWERS)


def test_spec_bench_steps_mean_and_clustered_error(tmp_path):
    steps = formats.read_spec_bench(_file(tmp_path, SPEC_BENCH, "answers.jsonl"))
    assert steps.lengths.tolist() == [3, 1, 3, 2, 1, 4, 4, 1]
    assert [(q, i, a.tolist()) for q, i, a in steps.answers] == [
        (81, 0, [3, 1, 3, 2, 1]), (82, 0, [4, 4]), (82, 1, [1])]
    assert steps.mean == 19 / 8
    sums, sizes = np.array([10.0, 8.0, 1.0]), np.array([5.0, 2.0, 1.0])
    residual = sums - 19 / 8 * sizes
    assert steps.mean_se == pytest.approx(math.sqrt(3 / 2 * residual @ residual) / 8)
    kept = np.array([2, 0, 2, 1, 0, 3, 3, 0])
    np.testing.assert_allclose(steps.profile, [(kept >= i).mean() for i in (1, 2, 3)])
    assert steps.profile.sum() == pytest.approx(steps.mean - 1)  # 1 + sum(a) is the mean
    # a fork that records accepted drafts only
    path = _file(tmp_path, SPEC_BENCH.replace('"accept_lengths": [1]', '"accept_lengths": [0]'),
                 "fork.jsonl")
    with pytest.raises(ValueError, match="bonus_included=False"):
        formats.read_spec_bench(path)
    fork = formats.read_spec_bench(path, bonus_included=False)
    assert fork.lengths.tolist() == [4, 2, 4, 3, 2, 5, 5, 1]


@pytest.mark.parametrize("text, match", [
    ("{oops\n", "not JSON"),
    ('{"question_id": 1}\n', "no 'choices'"),
    ('{"question_id": 1, "choices": [{"index": 0, "turns": ["x"]}]}\n', "no 'accept_lengths'"),
    ('{"question_id": 1, "choices": [{"accept_lengths": [2.5]}]}\n', "integers >= 1"),
    ('{"question_id": 1, "choices": [{"accept_lengths": [true]}]}\n', "integers >= 1"),
    ('{"question_id": 1, "choices": [{"accept_lengths": []}]}\n', "no step"),
    ("\n", "no step"),
])
def test_spec_bench_refuses_malformed_files(tmp_path, text, match):
    path = _file(tmp_path, text, "answers.jsonl")
    with pytest.raises(ValueError, match=match) as error:
        formats.read_spec_bench(path)
    assert str(path) in str(error.value)


# --------------------------------------------------------------------------------------------
# Out: vLLM's num_speculative_tokens_per_batch_size and TensorRT-LLM's draft_len_schedule
# --------------------------------------------------------------------------------------------

SIZES = (1, 2, 4, 8, 16, 32, 64)
KS = (4, 4, 3, 3, 1, 0, 0)


def _policies(ks=KS):
    return tuple(BatchPolicy(decoder=None, lookahead=k, price=None, tokens_per_time=1.0,
                             fixed_rates=np.ones(5)) for k in ks)


def _vllm_lookup(config, max_num_seqs):
    """vLLM's rules (dynamic/utils.py): validate, then expand to a dense batch size -> K."""
    schedule = config["num_speculative_tokens_per_batch_size"]
    cap = config["num_speculative_tokens"]
    assert isinstance(cap, int) and cap > 0 and isinstance(schedule, list) and schedule
    previous_end = 0
    for entry in schedule:
        assert isinstance(entry, list) and len(entry) == 3 and all(type(x) is int for x in entry)
        lo, hi, k = entry
        assert 0 < lo <= hi and k >= 0 and lo > previous_end
        previous_end = hi
    assert schedule[0][0] == 1
    dense, last = [0] * (max_num_seqs + 1), None
    for lo, hi, k in schedule:
        start = lo if last is None else min(lo, len(dense))
        for b in range(start, min(hi, max_num_seqs) + 1):
            dense[b] = min(cap, k)
        last = k
    for b in range(previous_end + 1, max_num_seqs + 1):
        dense[b] = min(cap, last)
    return dense


def test_vllm_dynamic_table_has_vllms_shape_and_keys():
    config = formats.vllm_dynamic_table(_policies(), SIZES, max_batch_size=256)
    assert config == {"num_speculative_tokens": 4,
                      "num_speculative_tokens_per_batch_size": [[1, 3, 4], [4, 15, 3],
                                                                [16, 31, 1], [32, 256, 0]]}
    json.loads(json.dumps({"method": "eagle", **config}))  # --speculative-config's JSON
    dense = _vllm_lookup(config, 256)
    assert [dense[b] for b in SIZES] == list(KS)
    assert dense[5] == dense[4] and dense[100] == 0  # carried forward, as vLLM does
    assert formats.vllm_dynamic_table(_policies(), SIZES)[
        "num_speculative_tokens_per_batch_size"][-1] == [32, 64, 0]
    assert formats.vllm_dynamic_table(_policies()[0], 1) == {
        "num_speculative_tokens": 4, "num_speculative_tokens_per_batch_size": [[1, 1, 4]]}
    assert formats.vllm_dynamic_table([2, 3], [1, 8])[
        "num_speculative_tokens_per_batch_size"] == [[1, 7, 2], [8, 8, 3]]


def test_trtllm_schedule_has_trtllms_shape_and_rules():
    config = formats.trtllm_draft_len_schedule(_policies(), SIZES)
    assert config == {"max_draft_len": 4, "draft_len_schedule": {1: 4, 4: 3, 16: 1, 32: 0}}
    schedule = config["draft_len_schedule"]
    # llm_args.py's validator: keys >= 1, lengths >= 0, 1 present, schedule[1] == max_draft_len,
    # every length <= max_draft_len
    assert all(type(b) is int and b >= 1 for b in schedule) and 1 in schedule
    assert schedule[1] == config["max_draft_len"] == max(schedule.values())
    thresholds = sorted(schedule)  # drafter.py: the largest threshold <= batch size
    for size, k in zip(SIZES, KS):
        assert schedule[thresholds[bisect.bisect_right(thresholds, size) - 1]] == k
    assert json.loads(json.dumps(schedule)) == {"1": 4, "4": 3, "16": 1, "32": 0}


@pytest.mark.parametrize("policies, sizes, match", [
    (_policies(), SIZES[1:], "one batch size per policy"),
    (_policies()[1:], SIZES[1:], "must start at 1"),
    (_policies((1, 2)), (1, 1), "increase strictly"),
    (_policies((0, 0)), (1, 8), "turns speculation off"),
    ([-1], (1,), "non-negative ints"),
    ([1.5], (1,), "non-negative ints"),
    (_policies((1,)), "1", "sequence"),
    (_policies((1,)), (0,), "positive integer"),
])
def test_exported_tables_refuse(policies, sizes, match):
    with pytest.raises(ValueError, match=match):
        formats.vllm_dynamic_table(policies, sizes)
    with pytest.raises(ValueError, match=match):
        formats.trtllm_draft_len_schedule(policies, sizes)


def test_tables_refuse_what_the_engines_cannot_hold():
    with pytest.raises(ValueError, match="draft_len_schedule\\[1\\] == max_draft_len"):
        formats.trtllm_draft_len_schedule([2, 3], [1, 8])
    with pytest.raises(ValueError, match="below the last batch size"):
        formats.vllm_dynamic_table(_policies(), SIZES, max_batch_size=32)


# --------------------------------------------------------------------------------------------
# Conversions
# --------------------------------------------------------------------------------------------


def test_conditional_and_marginal_convert_exactly():
    marginal = np.array([0.546187, 0.29213, 0.156205, 0.083])
    conditional = formats.conditional_from_marginal(marginal)
    np.testing.assert_allclose(conditional, [0.546187, 0.29213 / 0.546187,
                                             0.156205 / 0.29213, 0.083 / 0.156205])
    np.testing.assert_allclose(formats.marginal_from_conditional(conditional), marginal,
                               rtol=1e-15)
    assert formats.conditional_from_marginal([0.5, 0.0, 0.0]).tolist() == [0.5, 0.0, 0.0]
    with pytest.raises(ValueError, match="conditional rates"):  # the usual mix-up, named
        formats.conditional_from_marginal([0.8, 0.9])
    with pytest.raises(ValueError, match="conditional must be"):
        formats.marginal_from_conditional([1.2])


def test_profile_of_refuses_what_does_not_determine_a_profile():
    with pytest.raises(ValueError, match="does not determine"):
        formats.profile_of(2.4)
    assert formats.profile_of(_metrics([0.5, 0.25])).tolist() == [0.5, 0.25]
    with pytest.raises(ValueError, match="engine_metrics"):
        formats.profile_of("a profile")
