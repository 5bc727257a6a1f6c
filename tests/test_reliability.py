"""The reliability battery of issue 19: no silent wrong result, no crash.

Every case of ``tests/reliability_cases.py`` (bad inputs and faults in classes, across every
public entry point and the command line) must end in a clear error (a ``ValueError`` naming the
argument) or a right result. The size cases run in one memory-limited child process per test
session (shared by the xdist workers through a file under pytest's base temporary folder), so a
library that does not refuse them crashes that child, not the test run.
``python scripts/reliability_battery.py`` prints the same battery as a table.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import threading

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import reliability_cases as rc

CASES = rc.cases()


_ISOLATED: dict = {}  # "thread": the background job, "outcomes": its result


def _isolated_job(shared):
    """Computes (or, when another xdist worker did, reads) the isolated cases' outcomes."""
    batch = [c for c in CASES if c.isolate]
    if shared is None:
        _ISOLATED["outcomes"] = rc.run_isolated(batch)
        return
    with open(str(shared) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if shared.exists():
                data = json.loads(shared.read_text())
                _ISOLATED["outcomes"] = {k: rc.Outcome(*v) for k, v in data.items()}
                return
            outcomes = rc.run_isolated(batch)
            shared.write_text(json.dumps({k: [o.outcome, o.detail, o.seconds]
                                          for k, o in outcomes.items()}))
            _ISOLATED["outcomes"] = outcomes
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="module", autouse=True)
def _start_isolated_cases(request, tmp_path_factory, worker_id):
    """Starts the isolated (size) cases in the background as soon as this module runs, when
    any of them is selected, so that their child process overlaps the in-process cases."""
    selected = any(getattr(item, "callspec", None) is not None
                   and getattr(item.callspec.params.get("case"), "isolate", False)
                   for item in request.session.items)
    if selected and "thread" not in _ISOLATED:
        shared = None if worker_id == "master" else \
            tmp_path_factory.getbasetemp().parent / "reliability_isolated.json"
        thread = threading.Thread(target=_isolated_job, args=(shared,), daemon=True)
        thread.start()
        _ISOLATED["thread"] = thread
    yield


def isolated_outcome(case):
    _ISOLATED["thread"].join()
    return _ISOLATED["outcomes"][case.id]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_clear_error_or_right(case):
    if case.isolate:
        outcome = isolated_outcome(case)
    else:
        outcome = rc.classify_here(case)
    assert outcome.outcome in rc.PASSING, (
        f"{case.kind} | {case.entry} | {case.what}: expected {case.expectation}; "
        f"got {outcome.outcome}: {outcome.detail}")


def test_battery_covers_every_public_entry_point():
    """Every name of ``specjax.__all__`` that can be called wrongly is in some case."""
    import specjax
    entries = {c.entry.split(" ")[0].split(".")[0] for c in CASES}
    data_only = {"AuditReport", "AutoregressiveModel", "CallDecoder", "CallLaw", "Decoder",
                 "DecodingStatistics", "DecodingTime", "DecodingTrace", "DraftState", "OptimalStopping",
                 "OptimalRate", "StationaryRate",
                 "StoppingPolicy", "EngineMetrics", "DraftFamily", "ExactDecoding",
                 "LookaheadChoice", "Objective", "ParetoFront", "SequoiaChoice", "TokenwiseDecoder", "TreeBudgetChoice", "TuneResult",
                 "VerificationLaw", "array_field", "decoder_dataclass", "Autoregressive",
                 "marginals", "DraftsLaw", "EngineComparison", "Verified", "ProcessedModel",
                 "PromptedModel", "TreeLaw", "VerifiedTree", "Estimate"}
    missing = sorted(set(specjax.__all__) - entries - data_only)
    assert not missing, missing


def test_inputs_are_concrete_when_first_built_inside_a_trace():
    """The battery's cached inputs are built once per process, by whichever case asks first; a
    case that asks inside ``jax.jit`` must not leave tracers in the cache (they leaked into the
    next case and failed it, depending on which worker ran what first)."""
    import jax

    built = (rc.pair, rc.key, rc.rows, rc.half_pair, rc._f16_dirichlet, rc._int_pair)
    for build in built:
        build.cache_clear()
    jax.jit(lambda x: (rc.pair(), rc.key(), rc.rows(), rc.half_pair("float32"),
                       rc._f16_dirichlet(), rc._int_pair(), x)[-1])(1.0)
    leaves = jax.tree_util.tree_leaves((rc.pair(), rc.key(), rc.rows(), rc.half_pair("float32"),
                                        rc._f16_dirichlet(), rc._int_pair()))
    assert leaves and not any(isinstance(leaf, jax.core.Tracer) for leaf in leaves)
