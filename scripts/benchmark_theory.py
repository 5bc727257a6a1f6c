"""Exact batch-SD rejections (Theorem 3) and their gradient: specjax vs plain NumPy, one run.

At V = 512, T = 128, M = 8 by default (the issue's setting), measured side by side (best of
--repeats, compilation excluded):

* NumPy float64: the same recursion written the plain way: the residual chain
  ``w^{m+1} = [w^m - s_m p]_+`` over all ``(T, V, V)`` rows at once, then the forward pass over
  positions with two vector-matrix products per phase;
* specjax: ``batch_expected_rejections`` (float64 and float32), its gradient with respect to both
  draft and target transitions, and the peak temporary memory XLA reserves for each (from the
  compiled executable's memory analysis) against the size of one ``(T, V, V)`` array;
* one pass: the time of a single fused read of ``p`` and ``q`` (``sum [q - p]_+``), the unit the
  recursion's ``M`` passes are made of.

Usage: python scripts/benchmark_theory.py [--states 512] [--horizon 128] [--num-drafts 8]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import specjax
from _timing import best_time
from _timing import timed
from specjax.experiments.references import numpy_batch_rejections


def temp_bytes(fn, *args) -> int | None:
    try:
        analysis = jax.jit(fn).lower(*args).compile().memory_analysis()
        return int(analysis.temp_size_in_bytes)
    except Exception:  # noqa: BLE001 - not every backend reports memory
        return None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--states", type=int, default=512)
    parser.add_argument("--horizon", type=int, default=128)
    parser.add_argument("--num-drafts", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--numpy-repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    v, t, m = args.states, args.horizon, args.num_drafts

    key_d, key_t = jax.random.split(jax.random.key(args.seed))
    rows = []
    with jax.enable_x64(True):
        draft = specjax.random_markov_chain(key_d, v, t)
        target = specjax.random_markov_chain(key_t, v, t)
        init = np.asarray(target.init)
        p_np, q_np = np.asarray(draft.trans), np.asarray(target.trans)
        numpy_value = numpy_batch_rejections(init, p_np, q_np, m)
        t_numpy = min(timed(lambda: numpy_batch_rejections(init, p_np, q_np, m))
                      for _ in range(args.numpy_repeats))
        array_bytes = {np.float64: p_np.nbytes, np.float32: p_np.nbytes // 2}

    for dtype in (jnp.float64, jnp.float32):
        with jax.enable_x64(dtype == jnp.float64):
            d = specjax.MarkovChain(jnp.asarray(draft.init, dtype), jnp.asarray(draft.trans, dtype))
            tg = specjax.MarkovChain(jnp.asarray(target.init, dtype),
                                     jnp.asarray(target.trans, dtype))

            def value(d, tg):
                return specjax.batch_expected_rejections(d, tg, num_drafts=m)

            grad = jax.grad(value, argnums=(0, 1))
            value_jit, grad_jit = jax.jit(value), jax.jit(grad)
            one_pass = jax.jit(lambda d, tg: jnp.sum(jnp.maximum(tg.trans - d.trans, 0)))
            t_value = best_time(lambda i: value_jit(d, tg), args.repeats)
            t_grad = best_time(lambda i: grad_jit(d, tg), args.repeats)
            t_pass = best_time(lambda i: one_pass(d, tg), args.repeats)
            got = float(value_jit(d, tg))
            g_d, g_t = grad_jit(d, tg)
            finite = bool(jnp.isfinite(g_d.trans).all() & jnp.isfinite(g_t.trans).all())
            mem_value = temp_bytes(value, d, tg)
            mem_grad = temp_bytes(grad, d, tg)
            size = array_bytes[np.float64 if dtype == jnp.float64 else np.float32]
            rows.append(dict(dtype=jnp.dtype(dtype).name, value_ms=t_value * 1e3,
                             grad_ms=t_grad * 1e3, pass_ms=t_pass * 1e3,
                             speedup=t_numpy / t_value, grad_over_value=t_grad / t_value,
                             value=got, finite_grad=finite,
                             value_temp=mem_value, grad_temp=mem_grad, array_bytes=size))

    print(f"batch_expected_rejections, V = {v}, T = {t}, M = {m}; device "
          f"{jax.devices()[0].device_kind}; best of {args.repeats} (NumPy: {args.numpy_repeats}).")
    print(f"NumPy float64 value: {t_numpy * 1e3:9.1f} ms   (E[N_rej] = {numpy_value:.10f})")
    header = (f"{'specjax':<9}{'value ms':>10}{'x NumPy':>9}{'grad ms':>10}{'grad/value':>12}"
              f"{'1 pass ms':>11}{'value/pass':>12}{'temp value':>12}{'temp grad':>11}"
              f"{'E[N_rej]':>18}")
    print(header)
    print("-" * len(header))
    for r in rows:
        def mem(b):
            return "n/a" if b is None else f"{b / r['array_bytes']:.2f} TV2"
        print(f"{r['dtype']:<9}{r['value_ms']:>10.1f}{r['speedup']:>9.1f}{r['grad_ms']:>10.1f}"
              f"{r['grad_over_value']:>12.2f}{r['pass_ms']:>11.2f}"
              f"{r['value_ms'] / r['pass_ms']:>12.1f}{mem(r['value_temp']):>12}"
              f"{mem(r['grad_temp']):>11}{r['value']:>18.10f}")
    print("x NumPy: NumPy float64 time / specjax time. temp: XLA's temporary buffers in units of "
          "one (T, V, V) array of that dtype (inputs and outputs not included).")
    for r in rows:
        assert r["finite_grad"], f"non-finite gradient in {r['dtype']}"
    return dict(numpy_ms=t_numpy * 1e3, numpy_value=numpy_value, rows=rows)


if __name__ == "__main__":
    main()
