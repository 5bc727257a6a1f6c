"""optimal_acceptance on many large rows: specjax (jitted, float32) vs plain NumPy, one run.

At 1,000 rows of V = 32,000 by default (Dirichlet rows with some exact zeros, independent for the
draft ``p`` and the target ``q``), for M = 2, 4, 8 drafts drawn i.i.d. (``replacement=True``),
measured side by side on the CPU (best of --repeats, compilation excluded and shown apart):

* specjax: ``jax.jit(specjax.optimal_acceptance)`` in float32;
* NumPy float32: the same formula written the straightforward vectorised way, the reference a
  user would write: the ratio ``q / p`` (``+inf`` where ``p = 0 < q``, 0 where both are 0),
  ``argsort`` (NumPy's default kind), two ``take_along_axis``, two ``cumsum`` with a leading 0,
  the ``M``-th power and a ``max`` over the ``V + 1`` prefixes:
  ``alpha* = 1 - max_k [p(first k)^M - q(first k)]``.

The order of tokens with equal ratios does not change the value (along a run of equal ratios
``p(A)^M - q(A)`` is convex, so its maximum is at the ends of the run), so any sort kind gives
the same ``alpha*``. As a sanity check the table shows the largest absolute difference of the
values from NumPy float32 and from NumPy float64 (same rows in float64, computed once, untimed).

Drafts without replacement are not benchmarked: they enumerate ``V^M`` draw paths per row and
the library refuses them far below this size (``V^M x rows`` is capped at 2^26 elements, and
already ``32,000^2`` exceeds it for a single row).

``--breakdown`` also times the stages of specjax's computation separately (the ratio and the
stable argsort, the two gathers, the cumulative sums with the power and the max) beside NumPy's
argsort, to show where the time goes. specjax's stable argsort of float32 rows (``V <= 2^15``) is
two passes of a radix sort on packed int32 keys (``optimal_acceptance.stable_argsort_nonnegative``):
XLA's CPU sort is fast only for one int32 operand, and several times slower for a float key or an
argsort (key and index carried together); the breakdown shows one such pass, the floor of any
sort-based computation here, beside a float sort and an argsort.

Usage: python scripts/benchmark_optimal_acceptance.py [--rows 1000] [--states 32000]
       [--drafts 2 4 8] [--repeats 3] [--breakdown]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import specjax
from _timing import best_time
from _timing import timed
from specjax.experiments.references import dirichlet_rows
from specjax.experiments.references import numpy_optimal_acceptance


def breakdown(p, q, num_drafts: int, repeats: int) -> dict:
    """Seconds (best of ``repeats``) of each stage of specjax's computation, jitted apart, and of
    NumPy's argsort (default and stable kinds) on the same ratios."""
    from specjax.decoders import optimal_acceptance as oa
    order_fn = jax.jit(oa.ratio_order)
    sort_only = jax.jit(lambda x: jnp.sort(x, axis=-1))
    int_sort = jax.jit(lambda x: jnp.sort(jax.lax.bitcast_convert_type(x, jnp.int32), axis=-1))
    xla_argsort = jax.jit(lambda x: jnp.argsort(x, axis=-1, stable=True))
    gather = jax.jit(lambda p, q, o: (jnp.take_along_axis(p, o, -1),
                                      jnp.take_along_axis(q, o, -1)))
    rest = jax.jit(lambda ps, qs: 1 - jnp.max(oa.prefix_with_zero(ps) ** num_drafts
                                              - oa.prefix_with_zero(qs), axis=-1))
    order = order_fn(p, q)
    ps, qs = gather(p, q, order)
    ratio = np.asarray(q) / np.where(np.asarray(p) > 0, np.asarray(p), 1)
    out = {
        "ratio + stable argsort": best_time(lambda i: order_fn(p, q), repeats),
        "jnp.sort float32 values": best_time(lambda i: sort_only(p), repeats),
        "jnp.argsort float32": best_time(lambda i: xla_argsort(p), repeats),
        "jnp.sort int32 (one pass)": best_time(lambda i: int_sort(p), repeats),
        "two take_along_axis": best_time(lambda i: gather(p, q, order), repeats),
        "cumsum, power, max": best_time(lambda i: rest(ps, qs), repeats),
        "NumPy argsort (default)": min(timed(lambda: np.argsort(ratio, axis=-1))
                                       for _ in range(repeats)),
        "NumPy argsort (stable)": min(timed(lambda: np.argsort(ratio, axis=-1, kind="stable"))
                                      for _ in range(repeats)),
    }
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--states", type=int, default=32_000, help="V")
    parser.add_argument("--drafts", type=int, nargs="+", default=[2, 4, 8], help="values of M")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many runs")
    parser.add_argument("--concentration", type=float, default=0.3)
    parser.add_argument("--zeros", type=float, default=0.1,
                        help="fraction of entries set to exactly 0")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--breakdown", action="store_true",
                        help="also time the stages of specjax's computation")
    args = parser.parse_args(argv)

    rng = np.random.default_rng(args.seed)
    p64 = dirichlet_rows(rng, args.rows, args.states, args.concentration, args.zeros, np.float64)
    q64 = dirichlet_rows(rng, args.rows, args.states, args.concentration, args.zeros, np.float64)
    p_np, q_np = p64.astype(np.float32), q64.astype(np.float32)
    device = jax.devices("cpu")[0]
    p, q = jax.device_put(p_np, device), jax.device_put(q_np, device)

    rows = []
    for m in args.drafts:
        fn = jax.jit(lambda p, q, m=m: specjax.optimal_acceptance(p, q, num_drafts=m))
        start = time.perf_counter()
        compiled = fn.lower(p, q).compile()
        compile_s = time.perf_counter() - start
        t_jax = best_time(lambda i, f=compiled: f(p, q), args.repeats)
        got = np.asarray(compiled(p, q), np.float64)
        ref32 = numpy_optimal_acceptance(p_np, q_np, m)
        t_np = min(timed(lambda m=m: numpy_optimal_acceptance(p_np, q_np, m))
                   for _ in range(args.repeats))
        ref64 = numpy_optimal_acceptance(p64, q64, m)
        rows.append(dict(num_drafts=m, specjax_s=t_jax, compile_s=compile_s, numpy_s=t_np,
                         speedup=t_np / t_jax,
                         diff32=float(np.max(np.abs(got - ref32.astype(np.float64)))),
                         diff64=float(np.max(np.abs(got - ref64))),
                         numpy_diff64=float(np.max(np.abs(ref32.astype(np.float64) - ref64))),
                         mean=float(got.mean())))

    print(f"optimal_acceptance, {args.rows:,} rows of V = {args.states:,} (Dirichlet("
          f"{args.concentration:g}), {args.zeros:.0%} zeros), i.i.d. drafts, float32 on "
          f"{device.device_kind} ({jax.device_count('cpu')} device, "
          f"best of {args.repeats}, compilation excluded).")
    header = (f"{'M':>3}{'specjax s':>11}{'compile s':>11}{'NumPy s':>10}{'x NumPy':>9}"
              f"{'|diff| f32':>12}{'|diff| f64':>12}{'NumPy f32 vs f64':>18}{'mean alpha*':>13}")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['num_drafts']:>3}{r['specjax_s']:>11.4f}{r['compile_s']:>11.2f}"
              f"{r['numpy_s']:>10.4f}{r['speedup']:>9.2f}{r['diff32']:>12.2e}"
              f"{r['diff64']:>12.2e}{r['numpy_diff64']:>18.2e}{r['mean']:>13.6f}")
    print("x NumPy: NumPy float32 time / specjax time (above 1: specjax is faster). |diff|: the "
          "largest absolute difference of specjax's values from NumPy float32 / float64.")
    out = dict(rows=rows)
    if args.breakdown:
        parts = breakdown(p, q, args.drafts[0], args.repeats)
        print(f"\nWhere the time goes (M = {args.drafts[0]}, each stage jitted on its own, best of "
              f"{args.repeats}):")
        for name, seconds in parts.items():
            print(f"  {name:<26}{seconds:>9.3f} s")
        out["breakdown"] = parts
    return out


if __name__ == "__main__":
    main()
