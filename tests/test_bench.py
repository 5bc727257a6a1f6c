"""``python -m specjax bench``: every case runs end to end at toy sizes and writes one table; a
case that fails is a failed row and the others still run; flags are checked before any work."""

import json
import math

import pytest

from specjax import cli
from specjax.experiments import bench


@pytest.mark.slow
def test_bench_quick_runs_every_case_and_writes_one_table(tmp_path, capsys):
    """The smallest mode end to end (in-process, as ``python -m specjax bench --quick``)."""
    cli.main(["bench", "--quick", "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    for i, name in enumerate(bench.CASES):
        assert f"[{i + 1}/{len(bench.CASES)}] {name} ... ok" in printed  # progress per case
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["mode"] == "quick" and result["jax_version"] and result["commit"]
    assert result["device"] and result["date"]
    rows = result["rows"]
    assert {r["case"] for r in rows} == set(bench.CASES)
    for r in rows:
        assert r["error"] is None, r
        assert r["specjax_s"] > 0, r
        if r["reference"] in ("NumPy", "the same call without stop tokens"):
            assert r["reference_s"] > 0 and math.isclose(r["ratio"],
                                                         r["reference_s"] / r["specjax_s"]), r
        if r["reference"] == "NumPy":  # the two outputs of the run agree (means within 5 se)
            assert r["check"] and r["agree"] is True, r
    floors = [r for r in rows if r["floor"] is not None]
    assert {r["case"] for r in floors} == {"samplers", "token_tree"}
    table = (tmp_path / "bench.md").read_text()
    assert "| case | what | size | specjax | reference | ratio | % floor |" in table
    assert "DISAGREE" not in table
    assert table.count("\n| ") == len(rows) + 2  # header, rule, one line per row
    assert f"commit {result['commit']}" in table and table in printed


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
    assert ("| fine | a fast thing | n = 1 | 500.0 ms | 2.00 s (NumPy) | 4.00x | 25% "
            "| 20 steps/s |  |") in table
    rows = json.loads(js.read_text())["rows"]
    assert rows[2]["specjax_s"] is None and rows[2]["ratio"] is None  # NaN is null in JSON


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
    text, agree = bench._means("calls", [1, 2, 1, 2], [1, 2, 2, 1])
    assert text == "mean calls 1.5 vs 1.5 (z +0.00)" and agree
    assert bench._means("calls", [1, 2, 1, 2], [11, 12, 11, 12])[1] is False
    assert bench._means("calls", [3, 3], [3, 3]) == ("mean calls 3 vs 3 (z +0.00)", True)
    assert bench._means("calls", [3, 3], [4, 4])[1] is False  # no spread: any difference
    assert bench._values("v", [10.0, 2.0], [10.0005, 2.0]) == ("v max abs diff 5.0e-04", True)
    assert bench._values("v", [10.0, 2.0], [10.01, 2.0])[1] is False
    assert bench._requests("accepted", [True, True, False], 3) == ("accepted agree on 2 of 3",
                                                                   False)
