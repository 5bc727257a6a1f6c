"""Goodput against batch size: when speculative decoding stops paying in a serving engine.

``B`` slots decode in lockstep under continuous batching (``specjax.serving_rate``: exact
long-run tokens per unit time). For each batch size the table gives the goodput of

* ``AR``: autoregressive decoding (``K = 0``), ``B / target_time[B]``;
* ``SD K``: speculative decoding with the fixed lookahead ``--fixed-lookahead``;
* ``batch K``: one ``K <= --max-lookahead`` for the whole batch, the best for this ``B``
  (``specjax.theory.batch_lookahead``: vLLM's dynamic SD, with exact rates);
* ``per request``: each request's draft length from its own drafts, the threshold rule of
  ``specjax.theory.request_policy`` (draft the next token while its probability of being
  accepted with every draft before it exceeds a batch-wide price; best cap and price for this
  ``B``), never below ``batch K``;

and the gain of per-request allocation over one ``K`` for all.

Step times: a roofline (``specjax.theory.roofline``), a model and not a measurement: a target
forward over ``n`` tokens takes ``max(1, n / knee)`` (time unit: one memory-bound target pass),
with the knee of an H100-class accelerator (``H100_KNEE`` = 295 tokens, from spec-sheet FLOP/s
over bandwidth for bf16 weights); a draft pass over ``n`` slots takes ``--draft-time`` times
``max(1, n / knee)`` (memory-bound at these batch sizes).

Instances: the paper's (``specjax.paper_instance()``: V = 7, T = 50) and n-grams of text
(``scripts/token_tree_study.py``'s: a bigram draft and a trigram target on 4 character classes of
the standard library's source, lifted to 16 context states, stationary, ``T = --horizon``).

Figure ``docs/serving_goodput.png``: goodput over autoregressive goodput against ``B``, one panel
per instance (below 1: SD costs more than it gives).

Usage: python scripts/study_serving.py [--out docs/serving_goodput.png]
       [--batch-sizes 1,2,4,8,16,32,64,128,256] [--max-lookahead 4] [--skip-ngram]
       tiny: --batch-sizes 1,64 --max-lookahead 2 --prices 2 --skip-ngram
The default run takes about 3 minutes on 2 CPU cores (float64; most of it the exact laws of the
per-request policies).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import jax
import numpy as np

import specjax
from specjax.theory import serving

ROOT = pathlib.Path(__file__).resolve().parents[1]
COLUMNS = ("AR", "SD K", "batch K", "per request")


def ngram_instance(horizon: int):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import token_tree_study
    finally:
        sys.path.pop(0)
    draft, target, text, _ = token_tree_study.ngram_instance(400_000, horizon)
    return draft, target, text


def study(name, draft, target, cost, args):
    sizes = args.batch_sizes
    k = args.fixed_lookahead
    fixed = serving.slot_work(specjax.Speculative(lookahead=k), draft, target)
    prices = np.linspace(0.05, 0.95, args.prices)
    start = time.perf_counter()
    batch = specjax.theory.batch_lookahead(draft, target, cost, batch_size=sizes,
                                           max_lookahead=args.max_lookahead)
    request = specjax.theory.request_policy(draft, target, cost, batch_size=sizes,
                                            max_lookahead=args.max_lookahead, prices=prices)
    seconds = time.perf_counter() - start
    rows = []
    for b, best_batch, best_request in zip(sizes, batch, request):
        sd = float(serving.goodput(fixed, cost, batch_size=b).tokens_per_time)
        rows.append({"B": b, "AR": float(best_batch.fixed_rates[0]), "SD K": sd,
                     "batch K": best_batch.tokens_per_time, "K": best_batch.lookahead,
                     "per request": best_request.tokens_per_time,
                     "cap": best_request.lookahead, "price": best_request.price,
                     "gain": best_request.tokens_per_time / best_batch.tokens_per_time - 1})
    return {"name": name, "short": name.split(":")[0].split(" (")[0], "rows": rows,
            "seconds": seconds}


def print_table(result, fixed_lookahead: int) -> None:
    print(f"\n{result['name']}  (solved in {result['seconds']:.1f} s)\n")
    print(f"| B | AR | SD K = {fixed_lookahead} | best batch-wide K (K) | per request (cap, price) "
          "| per request vs batch-wide |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in result["rows"]:
        policy = ("fixed" if r["price"] is None else f"{r['cap']}, {r['price']:.2f}")
        print(f"| {r['B']} | {r['AR']:.2f} | {r['SD K']:.2f} | {r['batch K']:.2f} ({r['K']}) | "
              f"{r['per request']:.2f} ({policy}) | {100 * r['gain']:+.1f}% |")
    off = [r["B"] for r in result["rows"] if r["K"] == 0]
    print(f"\nSD stops paying (best batch-wide K = 0) from B = {off[0]}" if off else
          "\nSD pays at every batch size tried")


def plot(results, out: pathlib.Path, fixed_lookahead: int) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, axes = plt.subplots(1, len(results), figsize=(5.2 * len(results), 4.2), squeeze=False)
    labels = {"AR": "autoregressive", "SD K": f"SD, K = {fixed_lookahead}",
              "batch K": "best batch-wide K", "per request": "best per-request allocation"}
    styles = {"AR": "k-", "SD K": "C0--", "batch K": "C1-o", "per request": "C2-s"}
    for ax, result in zip(axes[0], results):
        sizes = [r["B"] for r in result["rows"]]
        for column in COLUMNS:
            ax.plot(sizes, [r[column] / r["AR"] for r in result["rows"]], styles[column],
                    label=labels[column], markersize=4)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size B (slots)")
        ax.set_ylabel("goodput / autoregressive goodput")
        ax.set_title(result["short"], fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Exact goodput under continuous batching, roofline with an H100-class knee "
                 f"({serving.H100_KNEE} tokens)", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "docs" / "serving_goodput.png")
    parser.add_argument("--batch-sizes", default="1,2,4,8,16,32,64,128,256",
                        type=lambda s: tuple(int(x) for x in s.split(",")))
    parser.add_argument("--max-lookahead", type=int, default=4)
    parser.add_argument("--fixed-lookahead", type=int, default=None,
                        help="the fixed K of the 'SD K' column (default --max-lookahead)")
    parser.add_argument("--prices", type=int, default=19, help="prices tried per cap")
    parser.add_argument("--draft-time", type=float, default=0.05,
                        help="a memory-bound draft pass, in memory-bound target passes")
    parser.add_argument("--knee", type=float, default=serving.H100_KNEE)
    parser.add_argument("--horizon", type=int, default=32, help="T of the n-gram requests")
    parser.add_argument("--skip-ngram", action="store_true")
    args = parser.parse_args(argv)
    args.fixed_lookahead = args.fixed_lookahead or args.max_lookahead
    jax.config.update("jax_enable_x64", True)
    try:
        size = max(args.batch_sizes) * (args.max_lookahead + 1)
        cost = specjax.ServingCost(serving.roofline(args.draft_time, knee=args.knee,
                                                    size=max(args.batch_sizes)),
                                   serving.roofline(1.0, knee=args.knee, size=size))
        draft, target = specjax.paper_instance()
        results = [study("paper's instance (V = 7, T = 50)", draft, target, cost, args)]
        if not args.skip_ngram:
            draft, target, text = ngram_instance(args.horizon)
            results.append(study(text, draft, target, cost, args))
        for result in results:
            print_table(result, args.fixed_lookahead)
        plot(results, args.out, args.fixed_lookahead)
        print(f"\nwrote {args.out}")
        return results
    finally:
        jax.config.update("jax_enable_x64", False)


if __name__ == "__main__":
    main()
