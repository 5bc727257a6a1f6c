"""Token trees on a random Markov chain: specjax vs plain NumPy, exact values and the sampler.

On random chains (``specjax.random_markov_chain``, V = 256, T = 128 by default, float32 unless
--x64) and two trees of about 64 nodes with i.i.d. children (SpecInfer's multi-step speculative
sampling):

* the Sequoia tree: ``specjax.sequoia_tree`` (Sequoia's dynamic program) on
  the positional acceptance of the chains (``specjax.theory.positional_acceptance``, 8 children), 64
  nodes, depth at most 8: many node classes;
* a uniform tree (``--branching``, default (4, 2, 2, 1, 1, 1), 77 nodes): one class per depth,
  the cheap case of specjax's exact law.

Measured side by side in one run (best of --repeats; the first call, compilation included, is
shown apart):

1. Exact values. specjax: ``specjax.accepted_length(tree, draft, target, position=1)`` (``(V,)``
   expected drafts a call keeps after each previous token) and ``specjax.exact(tree, draft,
   target)`` (the forward recursion over call starts; the table shows its expected calls and
   rejections), both under ``jax.jit``. NumPy (``specjax.experiments.references``, written
   independently): the per-child masses of multi-step speculative sampling with i.i.d.
   children (un-normalised residual ``w_1 = q``, ``W_j = sum w_j``, child ``j`` accepts
   ``min(W_j p, w_j)``, ``w_{j+1} = [w_j - W_j p]_+``, the last token of a call that rejects
   every child ``w_{b+1}``);
   the accepted length by a backward recursion over the tree's nodes (``value(node) = sum_j
   accepted_j @ (1 + value(child_j))``, a leaf 0), and the whole-horizon expected calls and
   rejections by a forward recursion over (position, node, token) masses: every node of the
   tree on its own (no classes), ``O(T N V^2)`` for ``N`` nodes. NumPy runs in the chains'
   dtype (timed) and in float64 (the reference the differences are taken against).
2. The sampler: ``specjax.decoding_statistics(key, tree, draft, target, C)`` vs a NumPy Monte
   Carlo sampler of the same algorithm vectorised over chains (one loop over positions: draft
   the current node's children i.i.d. from the draft row, verify them in turn against the
   residual, descend into the accepted one or end the call with a token from the last residual,
   at a leaf the target's bonus token; calls repeat until position T is filled). Its draws are
   inverse-CDF searches (``np.searchsorted`` on the cumulative rows of one position, offset by
   the row index); its per-position tables (the draft's CDF, the residual chain, acceptance
   ratios) are built inside the timed run. Chain-steps per second = ``C T / seconds``. The mean
   number of calls of both samplers is compared with the exact value (``z``: the difference in
   standard errors).

Usage: python scripts/benchmark_token_tree.py [--states 256] [--horizon 128] [--num-chains 4096]
       [--repeats 3] [--budget 64] [--max-depth 8] [--branching 4 2 2 1 1 1] [--x64]
"""

from __future__ import annotations

import argparse
import math
import os
import time

import jax
import numpy as np

import specjax
from _timing import best_time
from _timing import timed
from specjax.experiments.bench import sequoia_parents
from specjax.experiments.references import NumpyTreeSampler
from specjax.experiments.references import depths
from specjax.experiments.references import numpy_accepted_length
from specjax.experiments.references import numpy_expected_calls


# ----------------------------------------------------------------------------- measuring
def _first_and_best(fn, repeats: int):
    """``(first call's seconds, best of ``repeats`` later calls, last result)``."""
    start = time.perf_counter()
    out = jax.block_until_ready(fn(0))
    first = time.perf_counter() - start
    best = best_time(fn, repeats) if repeats > 0 else first
    return first, best, out


def measure_exact(tree, parents, draft, target, repeats: int) -> dict:
    dtype = np.dtype(target.trans.dtype)
    al_fn = jax.jit(lambda d, t: specjax.accepted_length(tree, d, t, position=1))
    ex_fn = jax.jit(lambda d, t: specjax.exact(tree, d, t))
    al_first, al_s, al = _first_and_best(lambda i: al_fn(draft, target), repeats)
    ex_first, ex_s, ex = _first_and_best(lambda i: ex_fn(draft, target), repeats)
    al = np.asarray(al, np.float64)
    calls = float(ex.expected_calls)
    rejections = float(ex.expected_rejections)

    p, q, init = (np.asarray(a, dtype) for a in (draft.trans, target.trans, target.init))
    al_np_s = min(timed(lambda: numpy_accepted_length(parents, p, q)) for _ in range(repeats))
    ex_np_s = min(timed(lambda: numpy_expected_calls(parents, init, p, q))
                  for _ in range(repeats))
    al_np = numpy_accepted_length(parents, p, q).astype(np.float64)
    calls_np, rej_np = numpy_expected_calls(parents, init, p, q)
    p64, q64, init64 = (a.astype(np.float64) for a in (p, q, init))
    al64 = numpy_accepted_length(parents, p64, q64)
    calls64, rej64 = numpy_expected_calls(parents, init64, p64, q64)
    return dict(
        al_s=al_s, al_compile_s=al_first - al_s, al_numpy_s=al_np_s,
        exact_s=ex_s, exact_compile_s=ex_first - ex_s, exact_numpy_s=ex_np_s,
        accepted_length=float(al.mean()), accepted_length_numpy=float(al64.mean()),
        al_diff=float(np.max(np.abs(al - al64))),
        al_numpy_diff=float(np.max(np.abs(al_np - al64))),
        calls=calls, calls_numpy=calls64, calls_diff=abs(calls - calls64),
        calls_numpy_diff=abs(calls_np - calls64),
        rejections=rejections, rejections_numpy=rej64, rejections_diff=abs(rejections - rej64),
        rejections_numpy_diff=abs(rej_np - rej64))


def measure_sampler(tree, parents, draft, target, num_chains: int, repeats: int,
                    seed: int) -> dict:
    horizon = target.horizon
    key = jax.random.key(seed + 1)

    def run(i):
        k = jax.random.fold_in(key, i)
        return specjax.decoding_statistics(k, tree, draft, target, num_chains).num_calls

    first, best, calls = _first_and_best(run, repeats)
    calls = np.asarray(calls, np.float64)
    sampler = NumpyTreeSampler(parents, draft, target)
    np_s, np_calls = math.inf, None
    for i in range(max(repeats, 1)):
        start = time.perf_counter()
        out, _ = sampler.run(seed + 100 + i, num_chains)
        np_s = min(np_s, time.perf_counter() - start)
        np_calls = out if np_calls is None else np_calls
    np_calls = np.asarray(np_calls, np.float64)
    steps = num_chains * horizon
    return dict(
        sampler_s=best, sampler_compile_s=first - best,
        sampler_numpy_s=np_s,
        steps_per_s=steps / best, steps_per_s_numpy=steps / np_s,
        mean_calls=float(calls.mean()), se_calls=float(calls.std() / math.sqrt(num_chains)),
        mean_calls_numpy=float(np_calls.mean()),
        se_calls_numpy=float(np_calls.std() / math.sqrt(num_chains)))


def _fmt_s(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def print_tables(rows, args, dtype_name: str) -> None:
    print(f"\nToken trees with i.i.d. children on random Markov chains, V = {args.states:,}, "
          f"T = {args.horizon:,}, {dtype_name}; {os.cpu_count()} CPU cores; best of "
          f"{args.repeats} (compile: first call minus best).\n")
    print("Exact values (specjax under jax.jit vs NumPy in the chains' dtype; |diff|: largest "
          "absolute difference from NumPy float64)\n")
    print("| tree | nodes | depth | quantity | specjax | compile | NumPy | x NumPy | value "
          "| |diff| specjax | |diff| NumPy |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        head = f"| {r['tree']} | {r['nodes']} | {r['depth']} "
        print(head + f"| accepted length (V,) | {_fmt_s(r['al_s'])} | "
              f"{_fmt_s(r['al_compile_s'])} | {_fmt_s(r['al_numpy_s'])} | "
              f"{r['al_numpy_s'] / r['al_s']:.2f} | {r['accepted_length']:.6f} (mean) | "
              f"{r['al_diff']:.2e} | {r['al_numpy_diff']:.2e} |")
        print(head + f"| exact: E[calls] | {_fmt_s(r['exact_s'])} | "
              f"{_fmt_s(r['exact_compile_s'])} | {_fmt_s(r['exact_numpy_s'])} | "
              f"{r['exact_numpy_s'] / r['exact_s']:.2f} | {r['calls']:.6f} | "
              f"{r['calls_diff']:.2e} | {r['calls_numpy_diff']:.2e} |")
        print(head + f"| exact: E[rejections] | (same call) | | (same call) | | "
              f"{r['rejections']:.6f} | {r['rejections_diff']:.2e} | "
              f"{r['rejections_numpy_diff']:.2e} |")
    print("\nx NumPy: NumPy time / specjax time (above 1: specjax is faster). NumPy's E[calls] is "
          "a forward recursion over (position, node, token), every node on its own; specjax's "
          "exact pushes the mass of call starts through the tree's classes of nodes (nodes with the "
          "same subtree shape at the same depth share one (V,) vector), O(classes b V^2) per "
          "position.\n")
    print(f"Sampler ({args.num_chains:,} chains; chain-steps/s = C T / seconds)\n")
    print("| tree | specjax | compile | NumPy | specjax steps/s | NumPy steps/s | x NumPy "
          "| E[calls] exact | specjax mean (z) | NumPy mean (z) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        z_jax = (r["mean_calls"] - r["calls"]) / max(r["se_calls"], 1e-12)
        z_np = (r["mean_calls_numpy"] - r["calls"]) / max(r["se_calls_numpy"], 1e-12)
        r["z"], r["z_numpy"] = z_jax, z_np
        print(f"| {r['tree']} | {_fmt_s(r['sampler_s'])} | {_fmt_s(r['sampler_compile_s'])} | "
              f"{_fmt_s(r['sampler_numpy_s'])} | {r['steps_per_s']:,.0f} | "
              f"{r['steps_per_s_numpy']:,.0f} | "
              f"{r['sampler_numpy_s'] / r['sampler_s']:.2f} | {r['calls']:.4f} | "
              f"{r['mean_calls']:.4f} ({z_jax:+.2f}) | {r['mean_calls_numpy']:.4f} "
              f"({z_np:+.2f}) |")
    print("\nz: (sampler mean - exact) / standard error of the mean; |z| < 3 expected.")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--states", type=int, default=256, help="V")
    parser.add_argument("--horizon", type=int, default=128, help="T")
    parser.add_argument("--num-chains", type=int, default=4096, help="C for the samplers")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many runs")
    parser.add_argument("--budget", type=int, default=64, help="nodes of Sequoia's tree")
    parser.add_argument("--max-depth", type=int, default=8, help="depth of Sequoia's tree")
    parser.add_argument("--branching", type=int, nargs="+", default=[4, 2, 2, 1, 1, 1],
                        help="branching factors of the uniform tree")
    parser.add_argument("--x64", action="store_true", help="float64 chains (jax_enable_x64)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    with jax.enable_x64(args.x64):
        start = time.perf_counter()
        key_draft, key_target = jax.random.split(jax.random.key(args.seed))
        draft = specjax.random_markov_chain(key_draft, args.states, args.horizon)
        target = specjax.random_markov_chain(key_target, args.states, args.horizon)
        dtype_name = np.dtype(target.trans.dtype).name
        trees = []
        parents = sequoia_parents(draft, target, args.budget, args.max_depth)
        trees.append(("Sequoia", specjax.TokenTree.from_parents(parents, children="iid"),
                      parents))
        uniform = specjax.TokenTree(tuple(args.branching), children="iid")
        trees.append((f"uniform {tuple(args.branching)}", uniform, uniform.shape.parents))
        rows = []
        for name, tree, parents in trees:
            row = dict(tree=name, nodes=len(parents), depth=max(depths(parents)),
                       parents=parents)
            row.update(measure_exact(tree, parents, draft, target, args.repeats))
            row.update(measure_sampler(tree, parents, draft, target, args.num_chains,
                                       args.repeats, args.seed))
            rows.append(row)
        print_tables(rows, args, dtype_name)
        wall = time.perf_counter() - start
        print(f"\nWall time: {wall:.1f} s.")
    return dict(rows=rows, dtype=dtype_name, wall_s=wall)


if __name__ == "__main__":
    main()
