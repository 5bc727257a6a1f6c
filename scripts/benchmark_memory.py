"""Peak memory of the Monte Carlo sampler on large Markov chains, per number of tokens ``V``.

For each ``V`` (default 1,024, 2,048 and 4,096 tokens, ``T = 2``, ``C = 1,000`` chains) and each
decoder (SD with ``K = T``, batch SD with ``M = 2``, SD with ``K = 1``), one fresh process builds
the draft and the target with ``random_markov_chain`` and runs ``specjax.decode``. Each row
reports:

* ``models``: the bytes of the two ``(T, V, V)`` transition tables;
* ``table``: the engine's plan (``all``: every position's table built before the scan; ``pos``:
  one position's table built inside it, in blocks of rows) and the int32 thresholds it holds;
* ``estimate``: what ``decode`` estimates before it runs (``specjax.sampling.decoding.run_bytes``:
  the law tables with their temporaries, and the trace);
* ``XLA``: the compiled run's temporaries and outputs (``memory_analysis``);
* ``RSS models`` and ``RSS peak``: the process's peak resident memory (``VmHWM``) after the
  models are built and at the end, JAX included (about 0.15 GB after import on a CPU);
* the seconds to build the models and to decode (compilation included).

``--pythonpath DIR`` runs the processes on another copy of specjax (e.g. an older checkout, to
compare); ``--models logits`` builds the models with a softmax of Gaussian logits instead of
``random_markov_chain`` (faster; the sampler's memory is the same).

Usage: python scripts/benchmark_memory.py [--states 1024 2048 4096] [--horizon 2]
       [--num-chains 1000] [--decoders sd batch k1] [--models dirichlet|logits]
       [--pythonpath DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

DECODERS = {"sd": "SD, K = T", "batch": "batch SD, M = 2", "k1": "SD, K = 1"}


def _decoder(name: str):
    import specjax

    return {"sd": specjax.Speculative(), "batch": specjax.BatchSpeculative(2),
            "k1": specjax.Speculative(lookahead=1)}[name]


def _peak_rss() -> int:
    from specjax._memory import peak_resident_bytes  # not ru_maxrss: exec keeps the parent's

    return peak_resident_bytes()


def measure(num_states: int, horizon: int, num_chains: int, decoder_name: str,
            models: str = "dirichlet") -> dict:
    """One row, measured in this process (call it in a fresh one for a clean peak)."""
    import jax
    import jax.numpy as jnp

    import specjax

    row = dict(states=num_states, horizon=horizon, chains=num_chains, decoder=decoder_name,
               models_bytes=2 * horizon * num_states * num_states * 4)
    start = time.perf_counter()
    key_draft, key_target = jax.random.split(jax.random.key(1))
    if models == "dirichlet":
        draft = specjax.random_markov_chain(key_draft, num_states, horizon)
        target = specjax.random_markov_chain(key_target, num_states, horizon)
    else:
        uniform = jnp.zeros((num_states,))
        draft, target = (specjax.MarkovChain.from_logits(
            uniform, jax.random.normal(k, (horizon, num_states, num_states)))
            for k in (key_draft, key_target))
    jax.block_until_ready((draft.trans, target.trans))
    row["models_s"] = time.perf_counter() - start
    row["rss_models"] = _peak_rss()
    decoder = _decoder(decoder_name)
    try:  # the estimate and the plan, on a specjax that has them
        from specjax.sampling import decoding

        run = decoding.plan(jax.random.key(0), decoder, draft, target, num_chains)
        plan = decoding.table_plan(run)
        row["estimate"] = decoding.run_bytes(run, num_chains).total
        row["plan"] = "all" if plan.block_rows is None else "pos"
        rows = horizon * num_states if plan.block_rows is None else \
            num_states * plan.block_positions
        from specjax.sampling import tables

        row["table"] = rows * len(plan.kinds) * tables.table_width(num_states) * 4
        compiled = decoding._simulate_markov.lower(
            jax.random.key(0), run.decoder, draft, target, 0, num_chains=num_chains,
            lookahead=run.lookahead, sharding=None, tables=plan).compile()
    except (ImportError, AttributeError, TypeError):
        from specjax.sampling import decoding

        lookahead = decoder.resolve_lookahead(horizon)
        compiled = decoding._simulate_markov.lower(
            jax.random.key(0), decoder, draft, target, 0, num_chains=num_chains,
            lookahead=lookahead, sharding=None).compile()
        width = 1 << max(0, (2 * num_states - 1).bit_length())
        row["plan"], row["table"] = "all", horizon * num_states * 3 * width * 4
    memory = compiled.memory_analysis()
    if memory is not None:
        row["xla"] = memory.temp_size_in_bytes + memory.output_size_in_bytes
    del compiled
    start = time.perf_counter()
    trace = specjax.decode(jax.random.key(0), decoder, draft, target, num_chains)
    jax.block_until_ready(trace.tokens)
    row["decode_s"] = time.perf_counter() - start
    row["rss_peak"] = _peak_rss()
    return row


def _point(num_states, horizon, num_chains, decoder, models, pythonpath=None) -> dict:
    env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([pythonpath, env.get("PYTHONPATH", "")])
    cmd = [sys.executable, os.path.abspath(__file__), "--measure", str(num_states),
           str(horizon), str(num_chains), decoder, models]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
        return dict(states=num_states, horizon=horizon, chains=num_chains, decoder=decoder,
                    error=f"exit {out.returncode}: {last[:120]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _gb(x) -> str:
    return "-" if x is None else f"{x / 1e9:.2f}"


def table(rows) -> str:
    header = (f"{'V':>6} {'T':>3} {'decoder':<16} {'models':>7} {'plan':>4} {'table':>7} "
              f"{'estimate':>8} {'XLA':>7} {'RSS models':>10} {'RSS peak':>9} {'build s':>8} "
              f"{'decode s':>9}")
    lines = [header, "-" * len(header)]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['states']:>6} {r['horizon']:>3} {DECODERS[r['decoder']]:<16} "
                         f"{r['error']}")
            continue
        lines.append(
            f"{r['states']:>6} {r['horizon']:>3} {DECODERS[r['decoder']]:<16} "
            f"{_gb(r['models_bytes']):>7} {r['plan']:>4} {_gb(r['table']):>7} "
            f"{_gb(r.get('estimate')):>8} {_gb(r.get('xla')):>7} {_gb(r['rss_models']):>10} "
            f"{_gb(r['rss_peak']):>9} {r['models_s']:>8.1f} {r['decode_s']:>9.1f}")
    lines.append("(GB = 10^9 bytes; estimate and XLA exclude the models and JAX itself, the RSS "
                 "columns include both)")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--states", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--horizon", type=int, default=2)
    parser.add_argument("--num-chains", type=int, default=1000)
    parser.add_argument("--decoders", nargs="+", choices=sorted(DECODERS),
                        default=["sd", "batch", "k1"])
    parser.add_argument("--models", choices=["dirichlet", "logits"], default="dirichlet")
    parser.add_argument("--pythonpath", default=None, help="run on another copy of specjax")
    parser.add_argument("--measure", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        v, t, c, decoder, models = args.measure
        print(json.dumps(measure(int(v), int(t), int(c), decoder, models)))
        return None
    rows = []
    for v in args.states:
        for decoder in args.decoders:
            rows.append(_point(v, args.horizon, args.num_chains, decoder, args.models,
                               args.pythonpath))
            print(table(rows[-1:]).splitlines()[2], flush=True)
    print()
    print(table(rows))
    return rows


if __name__ == "__main__":
    main()
