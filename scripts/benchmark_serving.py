"""Serving a batch: how long the exact goodput and the allocation take against ``B`` and ``K``.

Two tables, each beside its NumPy reference (``specjax.experiments.serving_references``) in the
same run, both in float64:

1. Goodput (``specjax.theory.goodput`` from one slot's law of work, ``slot_work``, computed once
   per ``K``; the law does not depend on ``B``): SD with lookahead ``K`` on the paper's instance
   (V = 7, T = 50) under a roofline with an H100-class knee, against ``numpy_goodput`` (``B``
   direct convolutions, SciPy's binomial). Also the time of ``slot_work`` itself (``exact``).
2. Allocation of one step (``specjax.theory.allocate_drafts``) on random survival tables,
   against trying every one of the ``(K + 1)^B`` allocations (``numpy_best_allocation``; only
   where there are at most ``--max-brute`` of them).

Times are the best of ``--repeats`` calls after a warm-up (compilation excluded); the machine's
load is printed (a shared 2-core CPU is noisy: compare within one run).

Usage: python scripts/benchmark_serving.py [--batch-sizes 1,8,64,256] [--lookaheads 1,2,4]
       tiny: --batch-sizes 2,4 --lookaheads 1,2 --repeats 1
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

import jax
import numpy as np

import specjax
from specjax.experiments.serving_references import numpy_best_allocation
from specjax.experiments.serving_references import numpy_goodput
from specjax.theory import serving

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from _timing import best_time  # noqa: E402
from _timing import timed  # noqa: E402


def goodput_table(args) -> list[dict]:
    draft, target = specjax.paper_instance()
    size = max(args.batch_sizes) * (max(args.lookaheads) + 1)
    cost = specjax.ServingCost(serving.roofline(0.05, knee=serving.H100_KNEE,
                                                size=max(args.batch_sizes)),
                               serving.roofline(1.0, knee=serving.H100_KNEE, size=size))
    rows = []
    for k in args.lookaheads:
        decoder = specjax.Speculative(lookahead=k)
        work = serving.slot_work(decoder, draft, target)
        t_work = best_time(lambda i: serving.slot_work(decoder, draft, target).mass,
                           args.repeats)
        for b in args.batch_sizes:
            ours = serving.goodput(work, cost, batch_size=b)
            t_ours = best_time(lambda i, b=b: serving.goodput(work, cost, batch_size=b)
                               .tokens_per_time, args.repeats)
            reference = numpy_goodput(np.asarray(work.mass), float(work.calls), float(work.tokens),
                                      work.passes, work.scored, cost.draft_times(b),
                                      cost.target_times(b * (k + 1)), b)
            t_numpy = min(timed(lambda b=b: numpy_goodput(
                np.asarray(work.mass), float(work.calls), float(work.tokens), work.passes,
                work.scored, cost.draft_times(b), cost.target_times(b * (k + 1)), b))
                for _ in range(args.repeats))
            rows.append(dict(K=k, B=b, goodput=float(ours.tokens_per_time),
                             reference=reference, slot_work_s=t_work, specjax_s=t_ours,
                             numpy_s=t_numpy))
    return rows


def allocation_table(args) -> list[dict]:
    rng = np.random.default_rng(0)
    rows = []
    for k in args.lookaheads:
        for b in args.batch_sizes:
            survival = np.cumprod(rng.uniform(0.3, 1.0, (b, k)), axis=1)
            cost = specjax.ServingCost(0.05, serving.roofline(1.0, knee=2 * b, size=b * (k + 1)))
            ours = specjax.theory.allocate_drafts(survival, cost)
            t_ours = best_time(lambda i: specjax.theory.allocate_drafts(survival, cost)
                               .tokens_per_time, args.repeats)
            row = dict(K=k, B=b, rate=ours.tokens_per_time, specjax_s=t_ours, reference=None,
                       numpy_s=None)
            if (k + 1) ** b <= args.max_brute:
                tables = (cost.draft_times(b), cost.target_times(b * (k + 1)))
                row["reference"] = numpy_best_allocation(survival, *tables)[0]
                row["numpy_s"] = min(timed(lambda: numpy_best_allocation(survival, *tables))
                                     for _ in range(args.repeats))
            rows.append(row)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-sizes", default="1,4,8,64,256",
                        type=lambda s: tuple(int(x) for x in s.split(",")))
    parser.add_argument("--lookaheads", default="1,2,4",
                        type=lambda s: tuple(int(x) for x in s.split(",")))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-brute", type=int, default=20_000,
                        help="the most allocations the brute force tries")
    args = parser.parse_args(argv)
    print(f"device: {jax.devices()[0]}; load average {os.getloadavg()}; float64")
    jax.config.update("jax_enable_x64", True)
    try:
        goodput = goodput_table(args)
        allocation = allocation_table(args)
    finally:
        jax.config.update("jax_enable_x64", False)
    print("\nGoodput of B slots (SD, paper's instance, roofline; slot_work once per K)\n")
    print("| K | B | goodput | NumPy | slot_work | goodput time | NumPy time | NumPy / specjax |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in goodput:
        print(f"| {r['K']} | {r['B']} | {r['goodput']:.6f} | {r['reference']:.6f} | "
              f"{r['slot_work_s'] * 1e3:.1f} ms | {r['specjax_s'] * 1e3:.2f} ms | "
              f"{r['numpy_s'] * 1e3:.2f} ms | {r['numpy_s'] / r['specjax_s']:.2f}x |")
    print("\nAllocation of one step (random survival, roofline knee 2 B)\n")
    print("| K | B | tokens per time | brute force | allocate_drafts | brute force time |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in allocation:
        ref = "—" if r["reference"] is None else f"{r['reference']:.6f}"
        t_ref = "—" if r["numpy_s"] is None else f"{r['numpy_s'] * 1e3:.1f} ms"
        print(f"| {r['K']} | {r['B']} | {r['rate']:.6f} | {ref} | "
              f"{r['specjax_s'] * 1e3:.2f} ms | {t_ref} |")
    return goodput, allocation


if __name__ == "__main__":
    main()
