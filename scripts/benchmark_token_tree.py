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
   rejections), both under ``jax.jit``. NumPy (written here, independently): the per-child masses
   of multi-step speculative sampling with i.i.d. children (un-normalised residual ``w_1 = q``,
   ``W_j = sum w_j``, child ``j`` accepts ``min(W_j p, w_j)``, ``w_{j+1} = [w_j - W_j p]_+``, the
   last token of a call that rejects every child ``w_{b+1}``);
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


# ----------------------------------------------------------------------------- tree facts
def children_lists(parents) -> list:
    """``children[i]``: the children of node ``i`` in order (index order)."""
    children = [[] for _ in parents]
    for i in range(1, len(parents)):
        children[parents[i]].append(i)
    return children


def depths(parents) -> list:
    depth = [0] * len(parents)
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
    return depth


# ----------------------------------------------------------------------------- NumPy exact
def stage_laws(p, q, num_children: int):
    """Multi-step speculative sampling with i.i.d. children on rows ``p``, ``q`` ``(..., V)``:
    ``(accepted (b, ..., V), last (..., V))``, the mass child ``j`` accepts (token and all) and
    the mass of the token drawn when every child is rejected."""
    w = q
    accepted = []
    for _ in range(num_children):
        scaled = w.sum(-1, keepdims=True) * p
        accepted.append(np.minimum(scaled, w))
        w = np.maximum(w - scaled, 0)
    return np.stack(accepted), w


def numpy_accepted_length(parents, p, q, position: int = 1) -> np.ndarray:
    """``(V,)``: expected drafts kept by a call at ``position`` (1-based) after each previous
    token; a node at depth ``d`` drafts its children from row ``position - 1 + d``, and only
    while ``position + d <= T``. Backward recursion over the nodes (children after parents)."""
    horizon, num_states = p.shape[0], p.shape[-1]
    kids, depth = children_lists(parents), depths(parents)
    laws = {}
    value = [None] * len(parents)
    for i in range(len(parents) - 1, -1, -1):
        d, b = depth[i], len(kids[i])
        if b == 0 or position + d > horizon:
            value[i] = np.zeros(num_states, p.dtype)
            continue
        if (d, b) not in laws:
            row = position - 1 + d
            laws[(d, b)] = stage_laws(p[row], q[row], b)[0]
        accepted = laws[(d, b)]
        total = np.zeros(num_states, p.dtype)
        for j, c in enumerate(kids[i]):
            total += accepted[j] @ (1 + value[c])
        value[i] = total
    return value[0]


def numpy_expected_calls(parents, init, p, q):
    """``(expected calls, expected rejections)`` over the whole horizon: a forward recursion
    over ``m[node, x]`` = P(the token at the current position is ``x`` and held by ``node``);
    the root holds the token a call starts after. ``O(T N V^2)``."""
    horizon = p.shape[0]
    kids = children_lists(parents)
    groups = {}  # branching factor -> (nodes (n,), their children (b, n))
    for i, ks in enumerate(kids):
        if ks:
            nodes, children = groups.setdefault(len(ks), ([], []))
            nodes.append(i)
            children.append(ks)
    groups = {b: (np.array(nodes), np.array(children).T) for b, (nodes, children) in
              groups.items()}
    leaves = np.array([i for i, ks in enumerate(kids) if not ks])
    mass = np.zeros((len(parents), p.shape[-1]), p.dtype)
    mass[0] = init
    calls = rejections = 0.0
    for n in range(horizon):
        calls += mass[0].sum()
        new = np.zeros_like(mass)
        for b, (nodes, children) in groups.items():
            accepted, last = stage_laws(p[n], q[n], b)
            here = mass[nodes]
            for j in range(b):
                new[children[j]] += here @ accepted[j]
            rejected = here.sum(0) @ last
            rejections += rejected.sum()
            new[0] += rejected
        new[0] += mass[leaves].sum(0) @ q[n]
        mass = new
    return float(calls), float(rejections)


# ----------------------------------------------------------------------------- NumPy sampler
def _cdf(rows):
    c = np.cumsum(rows, axis=-1)
    total = c[..., -1:]
    return np.where(total > 0, c / np.where(total > 0, total, 1), 1.0)


def _offset_cdf(rows):
    """Cumulative rows ``(R, V)`` offset by their index and flattened: one ``searchsorted`` then
    draws from row ``r`` for ``r + u``."""
    return (_cdf(rows) + np.arange(rows.shape[0])[:, None]).ravel()


def _search(flat, rows, u, num_states):
    k = np.searchsorted(flat, rows + u, side="right") - rows * num_states
    return np.minimum(k, num_states - 1)


class NumpyTreeSampler:
    """The token-tree sampler in NumPy (i.i.d. children), vectorised over chains."""

    def __init__(self, parents, draft, target):
        self.p = np.asarray(draft.trans, np.float64)
        self.q = np.asarray(target.trans, np.float64)
        self.init_cdf = _offset_cdf(np.asarray(target.init, np.float64)[None])
        kids = children_lists(parents)
        self.num_kids = np.array([len(k) for k in kids])
        self.width = int(self.num_kids.max())
        self.table = np.zeros((len(parents), max(self.width, 1)), np.int64)
        for i, k in enumerate(kids):
            self.table[i, :len(k)] = k

    def run(self, seed: int, num_chains: int):
        """``(calls (C,), rejections (C,))`` of ``num_chains`` chains."""
        rng = np.random.default_rng(seed)
        horizon, num_states = self.q.shape[0], self.q.shape[-1]
        c = num_chains
        x = _search(self.init_cdf, np.zeros(c, np.int64), rng.random(c), num_states)
        node = np.zeros(c, np.int64)
        calls = np.zeros(c, np.int64)
        rejections = np.zeros(c, np.int64)
        for n in range(horizon):
            p, q = self.p[n], self.q[n]
            # The residual chain r_1 = q, r_{j+1} = [r_j - p]_+ (normalised), its CDFs (the token
            # ending a call after j rejections; j = 0: the bonus at a leaf) and the acceptance
            # ratios min(1, r_j / p).
            residuals = [q]
            for _ in range(self.width):
                w = np.maximum(residuals[-1] - p, 0)
                s = w.sum(-1, keepdims=True)
                residuals.append(np.where(s > 0, w / np.where(s > 0, s, 1), 0.0))
            residuals = np.stack(residuals)  # (b + 1, V, V)
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = np.where(p > 0, np.minimum(residuals[:-1] / p, 1), 0.0)
            end_cdf = _offset_cdf(residuals.reshape(-1, num_states))
            p_cdf = _offset_cdf(p)
            calls += node == 0
            b = self.num_kids[node]
            found = np.zeros(c, bool)
            choice = np.zeros(c, np.int64)
            token = np.zeros(c, np.int64)
            for j in range(self.width):
                idx = np.flatnonzero((j < b) & ~found)
                if idx.size == 0:
                    break
                xs = x[idx]
                t = _search(p_cdf, xs, rng.random(idx.size), num_states)
                ok = rng.random(idx.size) < ratio[j, xs, t]
                hit = idx[ok]
                found[hit] = True
                choice[hit] = j
                token[hit] = t[ok]
            ends = np.flatnonzero(~found)  # every child rejected, or a leaf (b = 0: the bonus)
            token[ends] = _search(end_cdf, b[ends] * num_states + x[ends], rng.random(ends.size),
                                  num_states)
            rejections += ~found & (b > 0)
            node = np.where(found, self.table[node, choice], 0)
            x = token
        return calls, rejections


# ----------------------------------------------------------------------------- the trees
def sequoia_parents(draft, target, budget: int, max_depth: int):
    """Sequoia's tree on the chains' positional acceptance (8 children)."""
    acceptance = specjax.theory.positional_acceptance(draft, target, num_children=8)
    _, parents = specjax.sequoia_tree(acceptance, budget=budget, max_depth=max_depth)
    return tuple(int(x) for x in parents)


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
