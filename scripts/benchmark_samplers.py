"""Chain-steps per second of specjax's samplers vs a plain NumPy reference and the JAX floor.

For each decoder on the paper's instance shape (V = 7, T = 50) with C chains, measured side by
side in one run (best of --repeats, compilation excluded):

* specjax: the public sampler, full ``DecodingTrace`` materialised;
* NumPy: the reference a user would otherwise write, vectorised over chains (inverse-CDF draws
  on precomputed cumulative tables, one Python loop over positions);
* floor: the time JAX takes just to draw one uniform per chain-step, two ways: accumulated inside
  a ``lax.scan`` (nothing materialised, the strictest floor) and materialised as a ``(T, C)`` array.

Growth (``--growth``): how the time and memory of SD (K = T) grow with the number of chains C
(10^3 to 10^6, T = 50), the horizon T (50 to 2,000, C = 10^5) and the number of host devices
(1, 2, 4 forced CPU devices, C = 10^6, T = 200), for the full trace and for the statistics-only
path. Each point runs in its own process (a clean peak RSS, and XLA's device-count flag must be
set before JAX starts); the table reports ns per chain-step, the log-log slope against the
previous row (1.00 = linear), peak RSS and XLA's compiled memory (temporaries + outputs).

Usage: python scripts/benchmark_samplers.py [--num-chains 200000] [--repeats 5]
       python scripts/benchmark_samplers.py --growth [--repeats 3] [--max-chains 1000000]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

import jax
import numpy as np

import specjax
from specjax._memory import peak_resident_bytes
from _timing import best_time
from _timing import timed
from specjax.experiments.bench import uniform_floor
from specjax.experiments.references import NumpyDecoder


# ----------------------------------------------------------------------------- growth
def measure(path: str, num_chains: int, horizon: int, repeats: int) -> dict:
    """One point of the growth table, in this process (see ``growth``)."""
    draft, target = specjax.paper_instance(horizon=horizon)
    key = jax.random.key(0)
    devices = len(jax.devices())
    sharding = specjax.chain_sharding() if devices > 1 else None
    if path == "trace":
        def run(k):
            return specjax.speculative_decoding(k, draft, target, num_chains, sharding=sharding)
    else:
        def run(k):
            return specjax.decoding_statistics(k, specjax.Speculative(), draft, target,
                                               num_chains, sharding=sharding)
    idle_rss = _current_rss()
    start = time.perf_counter()
    jax.block_until_ready(run(key))
    first = time.perf_counter() - start
    best = best_time(lambda i: run(jax.random.fold_in(key, i)), repeats)
    compiled = _compiled_bytes(path, draft, target, num_chains, sharding)
    return dict(path=path, chains=num_chains, horizon=horizon, devices=devices, seconds=best,
                compile_seconds=first - best, compiled_bytes=compiled,
                peak_rss=peak_resident_bytes(),
                idle_rss=idle_rss)


def _current_rss() -> int:
    """Resident memory now (Linux), before the run: JAX's own footprint, for comparison."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def _compiled_bytes(path, draft, target, num_chains, sharding):
    """XLA's temporaries + outputs for the whole run (all devices), or None if not reported."""
    from specjax.sampling import counts
    from specjax.sampling import decoding
    key = jax.random.key(0)
    run = decoding.replicate(decoding.plan(key, specjax.Speculative(), draft, target,
                                           num_chains, sharding=sharding))
    static = dict(num_chains=num_chains, lookahead=run.lookahead, sharding=run.sharding)
    args = (key, run.decoder, run.draft, run.target, np.uint32(0))
    if path == "trace":
        lowered = decoding._simulate_markov.lower(*args, **static)
    else:
        static["num_chains"] = min(num_chains, counts.default_chunk_size(run.sharding))
        lowered = counts._markov_counts.lower(*args, np.int32(1), **static)
    memory = lowered.compile().memory_analysis()
    if memory is None:
        return None
    return memory.temp_size_in_bytes + memory.output_size_in_bytes - memory.alias_size_in_bytes


def _point(path, num_chains, horizon, devices, repeats) -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "")
                        + f" --xla_force_host_platform_device_count={devices}")
    env["JAX_PLATFORMS"] = env.get("JAX_PLATFORMS", "cpu")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this checkout first
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in [env.get("PYTHONPATH")] if p])
    cmd = [sys.executable, __file__, "--measure", path, str(num_chains), str(horizon),
           "--repeats", str(repeats)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"measuring {path} C={num_chains} T={horizon} on {devices} devices "
                           f"failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def growth(repeats: int, max_chains: int, max_horizon: int, devices=(1, 2, 4)) -> list[dict]:
    """Runs the three sweeps and prints one table; returns its rows."""
    chains = [c for c in (10**3, 10**4, 10**5, 10**6) if c <= max_chains]
    horizons = [t for t in (50, 200, 1000, 2000) if t <= max_horizon]
    c_fixed = min(10**5, max_chains)
    c_devices = min(10**6, max_chains) // 4 * 4
    t_devices = min(200, max_horizon)
    sweeps = [("C", [(c, 50, 1) for c in chains]),
              ("T", [(c_fixed, t, 1) for t in horizons]),
              ("devices", [(c_devices, t_devices, d) for d in devices])]
    print(f"SD (K = T) on the paper's chains (V = 7); best of {repeats} after a warm-up; "
          f"{os.cpu_count()} CPU cores; each row in a fresh process.")
    header = (f"{'sweep':<8}{'path':<7}{'C':>10}{'T':>6}{'dev':>4}{'ms':>10}{'ns/step':>9}"
              f"{'slope':>7}{'speedup':>8}{'peak RSS':>10}{'run RSS':>9}{'XLA/dev':>9}")
    print(header)
    print("-" * len(header))
    rows = []
    for sweep, points in sweeps:
        for path in ("trace", "stats"):
            previous = None
            for num_chains, horizon, n_dev in points:
                row = _point(path, num_chains, horizon, n_dev, repeats)
                row["sweep"] = sweep
                steps = num_chains * horizon
                row["ns_per_step"] = 1e9 * row["seconds"] / steps
                slope = speedup = ""
                if previous is not None and sweep != "devices":
                    size = steps / (previous["chains"] * previous["horizon"])
                    row["slope"] = math.log(row["seconds"] / previous["seconds"]) / math.log(size)
                    slope = f"{row['slope']:.2f}"
                if sweep == "devices":
                    base = previous or row
                    row["speedup"] = (base.get("base_seconds", base["seconds"]) / row["seconds"])
                    row["base_seconds"] = base.get("base_seconds", base["seconds"])
                    speedup = f"{row['speedup']:.2f}x"
                compiled = ("" if row["compiled_bytes"] is None
                            else f"{row['compiled_bytes'] / 2**20:.0f} MB")
                print(f"{sweep:<8}{path:<7}{num_chains:>10,}{horizon:>6}{n_dev:>4}"
                      f"{row['seconds'] * 1e3:>10.1f}{row['ns_per_step']:>9.2f}{slope:>7}"
                      f"{speedup:>8}{row['peak_rss'] / 2**20:>7.0f} MB"
                      f"{(row['peak_rss'] - row['idle_rss']) / 2**20:>6.0f} MB{compiled:>9}",
                      flush=True)
                rows.append(row)
                previous = row
    print("slope: d log(time) / d log(C T) against the row above (1.00 = linear; below 1 means "
          "fixed costs still matter). speedup: time on 1 device / time on d devices. run RSS: peak "
          "RSS minus the process's RSS before the run (JAX itself). XLA/dev: XLA's temporaries "
          "+ outputs per device (the statistics path: per chunk, at most 2**20 chains per CPU "
          "device).")
    return rows


# ----------------------------------------------------------------------------- main
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-chains", type=int, default=200_000)
    parser.add_argument("--states", type=int, default=7)
    parser.add_argument("--horizon", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--numpy-repeats", type=int, default=2)
    parser.add_argument("--growth", action="store_true",
                        help="time and memory against C, T and the number of host devices")
    parser.add_argument("--max-chains", type=int, default=10**6)
    parser.add_argument("--max-horizon", type=int, default=2000)
    parser.add_argument("--measure", nargs=3, metavar=("PATH", "C", "T"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        path, num_chains, horizon = args.measure
        print(json.dumps(measure(path, int(num_chains), int(horizon), args.repeats)))
        return None
    if args.growth:
        return growth(args.repeats, args.max_chains, args.max_horizon)
    c, horizon = args.num_chains, args.horizon
    steps = c * horizon
    draft, target = specjax.paper_instance(num_states=args.states, horizon=horizon)
    key = jax.random.key(0)

    floor_mat = jax.jit(lambda k: jax.random.uniform(k, (horizon, c)))
    t_floor = uniform_floor(c, horizon, args.repeats)
    t_floor_mat = best_time(lambda i: floor_mat(jax.random.fold_in(key, i)), args.repeats)

    cases = [
        ("SD, K = T", dict(), lambda k: specjax.speculative_decoding(k, draft, target, c)),
        ("SD, K = 4", dict(lookahead=4),
         lambda k: specjax.speculative_decoding(k, draft, target, c, lookahead=4)),
        ("batch SD, M = 4", dict(num_drafts=4),
         lambda k: specjax.batch_speculative_decoding(k, draft, target, c, num_drafts=4)),
        ("biased SD, eps = 0.1 (OPT)", dict(epsilon=0.1),
         lambda k: specjax.biased_speculative_decoding(k, draft, target, c, epsilon=0.1)),
    ]
    print(f"C = {c:,} chains, V = {args.states}, T = {horizon}: {steps:,} chain-steps per run; "
          f"device {jax.devices()[0].device_kind}; best of {args.repeats} (NumPy: "
          f"{args.numpy_repeats}).")
    print(f"floor, one uniform per chain-step in a scan: {t_floor * 1e3:8.1f} ms "
          f"({steps / t_floor / 1e6:7.1f} M/s)")
    print(f"floor, uniforms materialised as (T, C):      {t_floor_mat * 1e3:8.1f} ms "
          f"({steps / t_floor_mat / 1e6:7.1f} M/s)")
    header = (f"{'decoder':<28}{'specjax ms':>11}{'M steps/s':>10}{'NumPy ms':>10}"
              f"{'x NumPy':>9}{'% floor':>9}{'% mat.':>8}{'N_rej jax':>10}{'N_rej np':>10}")
    print(header)
    print("-" * len(header))
    rows = []
    for name, np_kwargs, run in cases:
        t_jax = best_time(lambda i: run(jax.random.fold_in(key, i)), args.repeats)
        decoder = NumpyDecoder(draft, target, **np_kwargs)
        decoder.run(0, min(c, 1000))
        t_np = min(timed(lambda: decoder.run(i, c)) for i in range(args.numpy_repeats))
        # Same algorithm, two implementations: their mean rejections agree within Monte Carlo error.
        rej_jax = float(run(jax.random.fold_in(key, 99)).num_rejections.mean())
        rej_np = float(decoder.run(99, c)[1].mean())
        row = (name, t_jax * 1e3, steps / t_jax / 1e6, t_np * 1e3, t_np / t_jax,
               100 * t_floor / t_jax, 100 * t_floor_mat / t_jax, rej_jax, rej_np)
        rows.append(row)
        print(f"{row[0]:<28}{row[1]:>11.1f}{row[2]:>10.1f}{row[3]:>10.1f}{row[4]:>9.1f}"
              f"{row[5]:>8.0f}%{row[6]:>7.0f}%{row[7]:>10.3f}{row[8]:>10.3f}")
    print("x NumPy: NumPy time / specjax time. % floor: floor time / specjax time (scan floor; "
          "'% mat.' against the materialised floor).")
    return rows


if __name__ == "__main__":
    main()
