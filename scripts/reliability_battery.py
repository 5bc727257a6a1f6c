"""Runs the reliability battery of issue 19 (``tests/reliability_cases.py``) and prints the counts
per class and outcome, then every case that is neither a clear error nor right.

    python scripts/reliability_battery.py [--json FILE] [--class NAME] [--quiet]

``import specjax`` resolves as usual: put another checkout first on ``PYTHONPATH`` to run the
battery against it (the script prints which ``specjax`` it ran). The size cases run in a child
process limited to 3 GiB of address space (see ``reliability_cases.run_isolated``).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))


def table(results, cases, outcomes) -> str:
    kinds = list(dict.fromkeys(c.kind for c in cases))
    counts = collections.Counter((c.kind, results[c.id].outcome) for c in cases)
    width = max(len(k) for k in kinds + ["total"]) + 2
    head = f"{'class':<{width}}" + "".join(f"{o:>13}" for o in outcomes) + f"{'cases':>8}"
    lines = [head, "-" * len(head)]
    for kind in kinds + ["total"]:
        row = [counts[(kind, o)] if kind != "total" else
               sum(counts[(k, o)] for k in kinds) for o in outcomes]
        lines.append(f"{kind:<{width}}" + "".join(f"{n:>13}" for n in row) + f"{sum(row):>8}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write the counts and every case's outcome to FILE")
    parser.add_argument("--class", dest="kind", action="append",
                        help="only the cases of this class (repeatable)")
    parser.add_argument("--quiet", action="store_true", help="no progress line per case")
    args = parser.parse_args(argv)

    import jax
    jax.config.update("jax_numpy_rank_promotion", "raise")  # as the test suite
    import reliability_cases as rc

    import specjax

    cases = [c for c in rc.cases() if not args.kind or c.kind in args.kind]
    print(f"specjax {specjax.__version__} from {specjax.__file__}; {len(cases)} cases",
          flush=True)
    start = time.perf_counter()

    def progress(case, outcome):
        if not args.quiet:
            print(f"  {outcome.outcome:<12} {case.id}", file=sys.stderr, flush=True)

    results = rc.run_all(cases, progress=progress)
    elapsed = time.perf_counter() - start
    print()
    print(table(results, cases, rc.OUTCOMES))
    failing = [c for c in cases if results[c.id].outcome not in rc.PASSING]
    print(f"\n{len(cases) - len(failing)} of {len(cases)} cases pass (clear error or right) "
          f"in {elapsed:.0f} s; {len(failing)} do not:")
    for case in failing:
        r = results[case.id]
        print(f"- [{r.outcome}] {case.kind} | {case.entry} | {case.what}\n"
              f"    expected {case.expectation}; got: {r.detail}")
    if args.json:
        counts = collections.defaultdict(dict)
        for case in cases:
            o = results[case.id].outcome
            counts[case.kind][o] = counts[case.kind].get(o, 0) + 1
        with open(args.json, "w") as f:
            json.dump({
                "specjax": specjax.__file__,
                "seconds": round(elapsed, 1),
                "counts": counts,
                "cases": [{"id": c.id, "class": c.kind, "entry": c.entry, "what": c.what,
                           "expected": c.expectation, "outcome": results[c.id].outcome,
                           "detail": results[c.id].detail,
                           "seconds": round(results[c.id].seconds, 2)} for c in cases],
            }, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
