"""``python -m specjax bench``: every case runs end to end at toy sizes and writes one table and
a JSON of schema version 2 (per-run samples, intervals, the environment, named sizes); a case
that fails is a failed row and the others still run; flags are checked before any work;
``bench compare`` marks a 2x slowdown, not a run against itself, and refuses other schemas."""

import copy
import json
import math

import pytest

from specjax import cli
from specjax.experiments import bench
from specjax.experiments import bench_compare
from specjax.experiments import bench_timing


@pytest.mark.slow
def test_bench_quick_runs_every_case_and_writes_one_table(tmp_path, capsys):
    """The smallest mode end to end (in-process, as ``python -m specjax bench --quick``), then
    ``bench compare`` of the run with itself (nothing marked) and with a copy where one case's
    samples are twice as slow (that case marked)."""
    cli.main(["bench", "--quick", "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    for i, name in enumerate(bench.CASES):
        assert f"[{i + 1}/{len(bench.CASES)}] {name} ... ok" in printed  # progress per case
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["schema_version"] == 2 and result["ratio"] == "reference_time / specjax_time"
    assert result["mode"] == "quick" and result["commit"] and result["date"]
    repeats = bench.Sizes.quick().repeats
    assert result["repeats"] == {"specjax": repeats, "reference": repeats}
    env = result["environment"]
    for key in ("specjax", "jax", "jaxlib", "numpy", "python", "os", "cpu_model", "cpu_count",
                "device", "device_kind", "platform", "backend_version", "env", "load_start",
                "load_end"):
        assert key in env, key
    assert env["jax"] and env["device"] and env["cpu_model"] and "cuda" in env
    assert result["sizes"]["samplers"] == {"V": 7, "T": 8, "C": 2000}  # named, not a list
    rows = result["rows"]
    assert {r["case"] for r in rows} == set(bench.CASES)
    for r in rows:
        assert r["error"] is None, r
        assert r["size"] and "text" not in r["size"] and all(
            not isinstance(v, list) or k in ("tree", "branching") for k, v in r["size"].items())
        ours = r["specjax"]
        assert ours["repeats"] == repeats and len(ours["wall_s"]["samples"]) == repeats
        assert len(ours["cpu_s"]["samples"]) == repeats
        wall = ours["wall_s"]
        assert 0 < wall["min"] <= wall["median"] <= wall["max"], r
        assert ours["first_call_s"]["wall"] > 0  # the compilation, kept
        if r["reference"] is not None:
            ref, ratio = r["reference"], r["ratio"]
            assert ref["kind"] in ("numpy", "specjax") and len(ref["wall_s"]["samples"]) > 0
            assert math.isclose(ratio["median"], ref["wall_s"]["median"] / wall["median"]), r
            assert ratio["min"] <= ratio["max"] and ratio["pairs"] == repeats
            assert ratio["interval"][0] <= ratio["interval"][1]
        if r["reference"] is not None and r["reference"]["kind"] == "numpy":
            assert r["check"]["agree"] is True, r  # the two outputs of the run agree
            assert r["ratio"]["of"] == "NumPy / specjax"
    stop, = (r for r in rows if r["case"] == "stop_tokens")
    assert stop["reference"]["kind"] == "specjax" and "NumPy" not in stop["name"]
    assert stop["ratio"]["of"] == "specjax without stop tokens / specjax"
    means = [r["check"] for r in rows if r["check"] and r["check"]["kind"] == "means"]
    assert means and all(abs(c["z"]) < c["z_limit"] for c in means)  # a number, not text
    floors = [r for r in rows if r["floor"] is not None]
    assert {r["case"] for r in floors} == {"samplers", "token_tree"}
    table = (tmp_path / "bench.md").read_text()
    assert "| case | what | size | specjax | first call | reference | ratio | % floor |" in table
    assert "DISAGREE" not in table and "(vs specjax)" in table
    assert "its reference is specjax itself without stop tokens" in table
    assert table.count("\n| ") == len(rows) + 2  # header, rule, one line per row
    assert f"commit {result['commit']}" in table and table in printed

    js = tmp_path / "bench.json"
    cli.main(["bench", "compare", str(js), str(js)])
    out = capsys.readouterr().out
    assert "0 slower, 0 faster" in out and "**" not in out
    # The row whose samples spread least, every sample made twice as slow: marked slower.
    def spread(r):
        return r["specjax"]["wall_s"]["max"] / r["specjax"]["wall_s"]["min"]
    k = min(range(len(rows)), key=lambda i: spread(rows[i]))
    assert spread(rows[k]) < 2
    slow = copy.deepcopy(result)
    wall = slow["rows"][k]["specjax"]["wall_s"]
    wall.update({key: [2 * x for x in v] if key == "samples" else 2 * v
                 for key, v in wall.items()})
    (tmp_path / "slow.json").write_text(json.dumps(slow))
    cli.main(["bench", "compare", str(js), str(tmp_path / "slow.json")])
    out = capsys.readouterr().out
    assert "1 slower, 0 faster" in out
    name = rows[k]["name"]
    line, = (x for x in out.splitlines() if f"| {name} |" in x)
    assert "| 2.00x |" in line and "**SLOWER**" in line


@pytest.fixture
def fake_cases(monkeypatch):
    """Two cheap cases around one that fails as an accelerator out of memory would."""
    def fine(sizes, chains):
        yield bench.Row("fine", "a fast thing", "n = 1", 0.5, 2.0, work=10, unit="steps",
                        floor=0.25)

    def broken(sizes, chains):
        yield bench.Row("broken", "the first part", "n = 1", 1.0, 1.0,
                        check="mean x 1 vs 2 (z +9.00)", agree=False)
        raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate | 8 GB")

    monkeypatch.setattr(bench, "CASES", {"fine": fine, "broken": broken, "after": fine})


def test_a_failing_case_is_a_failed_row_and_the_others_still_run(fake_cases, tmp_path):
    result = bench.run(bench.Sizes.quick(), progress=False)
    assert [r.case for r in result.rows] == ["fine", "broken", "broken", "fine"]
    assert result.rows[1].error is None and result.rows[1].ratio == 1.0  # finished before
    broken = result.rows[2]
    assert broken.error.startswith("RuntimeError: RESOURCE_EXHAUSTED") and broken.ratio is None
    assert result.rows[0].ratio == 4.0 and result.rows[3].ratio == 4.0
    md, js = bench.write(result, tmp_path / "new")
    table = md.read_text()
    assert "| broken | failed: RuntimeError: RESOURCE_EXHAUSTED" in table
    assert "allocate / 8 GB" in table  # a '|' in the message does not break the table
    assert "| mean x 1 vs 2 (z +9.00) **DISAGREE** |" in table
    assert ("| fine | a fast thing | n = 1 | 500.0 ms |  | 2.00 s (NumPy) | 4.00x | 25% "
            "| 20 steps/s |  |") in table
    rows = json.loads(js.read_text())["rows"]
    assert rows[2]["specjax"] is None and rows[2]["ratio"] is None  # NaN is null in JSON
    assert rows[0]["size"] == {"text": "n = 1"} and rows[0]["ratio"]["median"] == 4.0


def test_the_header_names_what_made_the_run(fake_cases):
    """The command for the CLI's two modes; ``run`` and the sizes that differ from the defaults
    for a run from Python with sizes of its own."""
    quick = bench.markdown(bench.run(bench.Sizes.quick(), mode="quick", progress=False))
    assert quick.startswith("`python -m specjax bench --quick` on ")
    default = bench.markdown(bench.run(progress=False))
    assert default.startswith("`python -m specjax bench` on ")
    large = bench.Sizes(repeats=3, samplers=(7, 50, 2_000_000))
    header = bench.markdown(bench.run(large, mode="large", progress=False)).splitlines()[0]
    assert header.startswith("`specjax.experiments.bench.run` (large: repeats=3, "
                             "samplers=(7, 50, 2000000)) on ")


def test_bench_flags_are_checked_before_any_work(fake_cases, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["bench", "--cases", "fine", "nope", "--out", str(tmp_path)])
    assert exit_.value.code == 2
    assert "--cases: unknown nope; the cases are fine, broken, after" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit):
        cli.main(["bench", "--out", str(tmp_path / "file")])
    assert "--out" in capsys.readouterr().err
    with pytest.raises(ValueError, match="cases: unknown"):
        bench.run(cases=["nope"])


def test_bench_runs_the_named_cases_only(fake_cases, tmp_path, capsys):
    cli.main(["bench", "--cases", "after", "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert [r["case"] for r in rows] == ["fine"]
    assert "[1/1] after ... ok" in capsys.readouterr().out


def test_the_outputs_are_compared_by_standard_errors_and_float32_rounding():
    text, agree, fields = bench._means("calls", [1, 2, 1, 2], [1, 2, 2, 1])
    assert text == "mean calls 1.5 vs 1.5 (z +0.00)" and agree
    assert fields == {"kind": "means", "quantity": "calls", "specjax_mean": 1.5,
                      "reference_mean": 1.5, "z": 0.0, "z_limit": 5.0}
    assert bench._means("calls", [1, 2, 1, 2], [11, 12, 11, 12])[1] is False
    assert bench._means("calls", [3, 3], [3, 3])[:2] == ("mean calls 3 vs 3 (z +0.00)", True)
    assert bench._means("calls", [3, 3], [4, 4])[1] is False  # no spread: any difference
    assert bench._values("v", [10.0, 2.0], [10.0005, 2.0])[:2] == ("v max abs diff 5.0e-04",
                                                                   True)
    assert bench._values("v", [10.0, 2.0], [10.01, 2.0])[1] is False
    assert bench._requests("accepted", [True, True, False], 3)[:2] == (
        "accepted agree on 2 of 3", False)


def test_measure_takes_the_functions_in_turn_and_keeps_the_first_call():
    calls = []

    def fn(name):
        return lambda i: calls.append((name, i)) or 0
    a, b = bench_timing.measure([fn("A"), fn("B")], [3, 2], [True, False])
    assert calls == [("A", 0), ("A", 1), ("B", 1), ("A", 2), ("B", 2), ("A", 3)]  # A B A B
    assert len(a.wall) == len(a.cpu) == 3 and a.first_wall is not None
    assert len(b.wall) == 2 and b.first_wall is None  # no warm-up: nothing to compile
    assert bench_timing.bootstrap_ratio([2.0] * 5, [1.0] * 5) == (2.0, 2.0)
    lo, hi = bench_timing.bootstrap_ratio([2.0, 2.2, 1.8, 2.1], [1.0, 1.1, 0.9, 1.0])
    assert 1.6 < lo <= 2.0 <= hi < 2.5


def test_the_compare_rule_marks_changes_beyond_both_runs_spread_and_the_margin():
    a = [1.0, 1.1, 0.9]
    assert bench_compare.change(a, a)[3] == "within noise"
    assert bench_compare.change(a, [2 * x for x in a])[3] == "slower"
    assert bench_compare.change(a, [x / 2 for x in a])[3] == "faster"
    ratio, interval, band, verdict = bench_compare.change(a, [1.15, 1.2, 1.25])
    assert verdict == "slower" and math.isclose(ratio, 1.2 / 1.0) and band == (0.9, 1.1)
    assert interval[0] <= ratio <= interval[1]
    assert bench_compare.change(a, [1.05, 1.06, 1.07])[3] == "within noise"  # in the band
    assert bench_compare.change([1.0], [1.08])[3] == "within noise"  # under the 10% margin
    assert bench_compare.change([1.0], [1.08], margin=0.05)[3] == "slower"
    wide = [0.5, 1.0, 3.0]  # a run whose own samples spread over 3x: 2x is within its noise
    assert bench_compare.change(wide, [2 * x for x in wide])[3] == "within noise"


def fake_json(tmp_path, name="a"):
    result = bench.run(bench.Sizes.quick(), progress=False)
    _, js = bench.write(result, tmp_path / name)
    return js


def test_bench_compare_refuses_another_schema_version_naming_the_file(fake_cases, tmp_path,
                                                                       capsys):
    js = fake_json(tmp_path)
    assert json.loads(js.read_text())["schema_version"] == 2
    old = tmp_path / "old.json"
    old.write_text(json.dumps({**json.loads(js.read_text()), "schema_version": 1}))
    with pytest.raises(SystemExit) as exit_:
        cli.main(["bench", "compare", str(js), str(old)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m specjax bench compare: error: ") and err.count("\n") == 1
    assert f"{str(old)!r} has schema_version 1" in err
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    garbage = tmp_path / "rows.json"
    garbage.write_text('{"schema_version": 2, "rows": [1, 2]}')
    for path, says in ((bad, "is not JSON"), (garbage, "not bench rows"),
                       (tmp_path / "missing.json", "no such file"), (tmp_path, "is a folder")):
        with pytest.raises(SystemExit) as exit_:
            cli.main(["bench", "compare", str(js), str(path)])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert repr(str(path)) in err and says in err and "Traceback" not in err, err
    with pytest.raises(ValueError, match="no schema_version"):
        old.write_text('{"rows": []}')
        bench_compare.load(old)


def test_bench_compare_of_a_run_with_itself_marks_nothing(fake_cases, tmp_path, capsys):
    js = fake_json(tmp_path)
    cli.main(["bench", "compare", str(js), str(js)])
    out = capsys.readouterr().out
    assert "| case | what | A median | B median | change B/A | 95% interval |" in out
    assert "| fine | a fast thing | 500.0 ms | 500.0 ms | 1.00x |" in out
    assert "| broken | broken | | | | | | failed |" in out
    assert "0 slower, 0 faster" in out


def test_bench_repeats_is_checked_and_recorded(fake_cases, tmp_path, capsys):
    for bad in ("0", "-1", "100000"):
        with pytest.raises(SystemExit) as exit_:
            cli.main(["bench", "--repeats", bad, "--out", str(tmp_path)])
        assert exit_.value.code == 2 and "--repeats" in capsys.readouterr().err
    cli.main(["bench", "--quick", "--repeats", "2", "--cases", "after", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["repeats"] == {"specjax": 2, "reference": 2}
    assert result["command"] == "python -m specjax bench --quick --repeats 2"
    assert (tmp_path / "bench.md").read_text().startswith(
        "`python -m specjax bench --quick --repeats 2` on ")


def test_every_json_field_is_in_the_legend(fake_cases, tmp_path):
    """The module docstring lists every key ``bench.json`` has (``schema_version`` 2)."""
    result = json.loads(fake_json(tmp_path).read_text())
    checks = [bench._means("x", [1], [1]), bench._values("x", [1], [1]),
              bench._requests("x", [True], 1)]
    keys = set()

    def walk(x):
        if isinstance(x, dict):
            for k, v in x.items():
                keys.add(k)
                if k not in ("size", "sizes", "env"):  # named by the run, not the schema
                    walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
    walk(result)
    walk([c.fields for c in checks])
    missing = sorted(k for k in keys if f"``{k}``" not in bench.__doc__
                     and f"{k}," not in bench.__doc__ and f"{k}}}" not in bench.__doc__)
    assert missing == []
