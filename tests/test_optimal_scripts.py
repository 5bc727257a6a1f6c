"""Smoke tests: the optimal-verifier benchmark and study run end to end at tiny sizes."""

import pytest

from test_scripts import import_script

# End-to-end runs (the scripts end to end): part of the full suite, skipped by the inner loop's
# `-m "not slow"`.
pytestmark = pytest.mark.slow

TOL = 1e-5  # float32 rounding of acceptances in [0, 1]


def markdown_tables(text):
    """Every markdown table printed: a list of (header, rows), cells stripped."""
    tables, current = [], None
    for line in text.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if current is None:
                current = (cells, [])
                tables.append(current)
            elif not set("".join(cells)) <= {"-"}:
                current[1].append(cells)
        else:
            current = None
    return tables


def test_benchmark_optimal_acceptance_tiny(capsys):
    benchmark = import_script("benchmark_optimal_acceptance")
    out = benchmark.main(["--rows", "8", "--states", "300", "--drafts", "2", "5",
                          "--repeats", "1"])
    text = capsys.readouterr().out
    assert "specjax s" in text and "compile s" in text and "NumPy s" in text
    assert "x NumPy" in text and "|diff| f64" in text
    assert [r["num_drafts"] for r in out["rows"]] == [2, 5]
    for row in out["rows"]:
        # specjax and the NumPy formula compute the same numbers (float32 cumulative sums).
        assert row["diff32"] < 1e-4 and row["diff64"] < 1e-4, row
        assert row["specjax_s"] > 0 and row["numpy_s"] > 0 and row["compile_s"] > 0
        assert 0 <= row["mean"] <= 1


def test_optimal_multi_draft_study_tiny(tmp_path, capsys):
    study = import_script("optimal_multi_draft_study")
    out = study.main(["--quick", "--out", str(tmp_path)])
    text = capsys.readouterr().out
    for name in study.FIGURES.values():
        assert (tmp_path / name).stat().st_size > 0, name
    tables = markdown_tables(text)
    curves = list(study.CURVES)

    # (a) one table per concentration, (b) one per family of q: every curve, optimum >= batch
    # SD for both draw schemes, no i.i.d. scheme above the i.i.d. optimum, and M = 1 (SD) equal
    # for every scheme defined there except the Gumbel coupling (SpecHub is M = 2 only).
    acceptance = [t for t in tables if t[0][1:] == curves]
    assert len(acceptance) == 4, tables
    for header, rows in acceptance:
        assert rows
        for row in rows:
            value = {c: (None if v == "-" else float(v)) for c, v in zip(curves, row[1:])}
            assert value["optimal iid"] >= value["batch iid"] - TOL, row
            assert value["optimal wor"] >= value["batch wor"] - TOL, row
            for c in study.IID:
                assert value[c] is not None and 0 <= value[c] <= value["optimal iid"] + TOL, row
            assert value["SpecHub"] is None or 0 <= value["SpecHub"] <= 1 + TOL, row
        if header[0] == "M":
            assert [int(r[0]) for r in rows] == [1, 2]
            assert rows[0][-1] == "-" and rows[1][-1] != "-"  # SpecHub: M = 2 only
            # M = 1: SD for every scheme but the Gumbel coupling, whose one-draft match
            # probability is below the maximal coupling's 1 - TV (drafter invariance costs).
            first = dict(zip(curves, rows[0][1:]))
            gumbel = float(first.pop("Gumbel list"))
            first.pop("SpecHub")
            assert len(set(first.values())) == 1 and gumbel <= float(first["batch iid"]) + TOL
    for res in out["a"]["result"].values():
        assert res["min_gap"]["iid"] >= -TOL and res["min_gap"]["wor"] >= -TOL
        assert all(v <= TOL for name, v in res["above"].items()), res["above"]

    # (c) exact beside simulated; the optimum has the fewest rejections at each M and scheme.
    (header, rows), = [t for t in tables if t[0][0] == "decoder"]
    assert header == ["decoder", "M", "exact", "simulated", "z"]
    exact = {(r[0], int(r[1])): float(r[2]) for r in rows if r[2] != "refused"}
    for how in ("i.i.d.", "w/o replacement"):
        assert exact[(f"optimal, {how}", 2)] <= exact[(f"batch SD, {how}", 2)] + 1e-4
        assert exact[(f"batch SD, {how}", 2)] <= exact[("SD", 1)] + 1e-4
    assert {name for name, m in exact} == {"SD"} | set(study.PAPER_NAMES.values())
    simulated = [row for row in out["c"]["rows"] if "z" in row]
    assert [row["decoder"] for row in simulated] == ["optimal, i.i.d.", "batch SD, i.i.d."]
    for row in simulated:
        # 2 estimates at 2,000 chains: |z| < 4.5 is the suite's bound.
        assert abs(row["z"]) < 4.5, row

    # (d) the 2 x 2 cross-evaluation (and the KL fit); each tuned draft is no worse than the
    # start on its own objective (the tuner keeps the best iterate).
    (header, rows), = [t for t in tables if t[0][0] == "draft"]
    assert len(header) == 3 and [r[0] for r in rows] == ["KL fit", "tuned for optimal",
                                                         "tuned for batch SD"]
    table = out["d"]["table"]
    assert table["tuned for optimal"]["optimal"] <= table["KL fit"]["optimal"] + 1e-6
    assert table["tuned for batch SD"]["batch SD"] <= table["KL fit"]["batch SD"] + 1e-6
    assert out["d"]["skipped"] == {"optimal": 0, "batch SD": 0}  # finite gradients throughout
    for vals in table.values():
        assert vals["optimal"] <= vals["batch SD"] + 1e-4
