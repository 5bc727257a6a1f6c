"""Smoke test: the lossy-rules study runs end to end at a tiny size; its run-time checks of
Theorems 4 and 5 hold there, and the rules land where the theory puts them."""

import pytest

from test_scripts import import_script

pytestmark = pytest.mark.slow


def test_lossy_rules_study_tiny(capsys, tmp_path):
    study = import_script("lossy_rules_study")
    out = tmp_path / "front.png"
    results = study.main(["--states", "4", "--horizon", "6", "--skip-paper", "--out", str(out)])
    assert out.exists() and "| rule |" in capsys.readouterr().out
    (rows,) = results.values()
    for (family, setting), m in rows.items():
        assert m["gap"] >= -1e-9 and m["removable"] >= -1e-9, (family, setting)
        if family.startswith(("biased", "lenient", "top-k")):  # over-acceptance: on the front
            assert abs(m["gap"]) < 1e-9, (family, setting)
    assert rows[("SGLang threshold", "single = 1, acc = 1")]["kl"] < 1e-12  # lossless
