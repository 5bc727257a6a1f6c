"""``python -m specjax``: reproduce the paper, or simulate the default instance.

* ``python -m specjax reproduce --out DIR`` (also ``python -m specjax`` with no arguments, into
  ``figures``): every figure of the paper's numerical simulations as PNG files, and
  ``summary.md`` / ``summary.json`` with every number, exact values beside simulated ones and the
  paper's beside ours (``specjax.experiments.reproduce``).
* ``python -m specjax simulate``: mean rejections and target calls of SD, SD with lookahead 4 and
  batch SD with their Monte Carlo standard errors beside the exact values (Theorem 1, Theorem 3).
* ``python -m specjax bench [--quick] [--repeats N] [--out DIR]``: every benchmark's headline
  case, specjax beside its NumPy reference on the same run (``N`` timed calls of each, in turn),
  on whatever device JAX finds; ``bench.md`` and ``bench.json`` in ``DIR``
  (``specjax.experiments.bench``). ``python -m specjax bench compare A.json B.json``: two runs
  case by case, the changes beyond their noise marked (``specjax.experiments.bench_compare``).

Every output path is checked before any work: ``--out`` must be a writable folder, or one that
can be created, with no folder where an output file goes; otherwise a usage error names ``--out``
and the path. Every file is written atomically (a temporary file in the same folder, then
renamed), so an interrupted or failed run leaves each file whole or absent; ``bench`` writes its
two files both or neither, and prints its table before writing them. One Ctrl-C ends a run with
status 130, also when the ``KeyboardInterrupt`` it raised was lost inside a callback (see
``catch_lost_interrupts``): the run then ends at its next progress step, or ``bench``'s next case.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import time

import jax

import specjax
from specjax import _progress
from specjax.decoders.planning import MAX_COUNTER
from specjax.models import markov as _models
from specjax.experiments.reproduce import mean_se

__all__ = ["catch_lost_interrupts", "main", "memory_limit", "simulate"]

SEED_LIMIT = 2**32  # seeds 0 .. 2**32 - 1: JAX without x64 keeps a seed's low 32 bits only
MAX_CHAINS = MAX_COUNTER  # chains are numbered with 32 bits (specjax.decode's own bound)
# The memory a run takes, from its peak resident memory on CPU against its sizes (measured:
# about 150 bytes per (position, token, token) at V = 1024 and 2048 for the law tables of
# simulate's decoders and exact values; about 14 bytes per chain and position for a trace's
# tokens, rejections and call starts; about 690 bytes per run for reproduce's running means and
# their plotted curves). A flag whose run would need more than the device has is refused up
# front, rather than failing (or being killed) partway.
TABLE_BYTES = 160
CHAIN_BYTES = 16
RUN_BYTES = 700
MAX_BENCH_REPEATS = 1000  # bench --repeats: beyond, a default run would take a day


def _instance_arguments(parser):
    parser.add_argument("--seed", type=int, default=_models.PAPER_SEED,
                        help=f"seed of the random draft/target instance, 0 .. 2**32 - 1 "
                             f"(paper: {_models.PAPER_SEED})")
    parser.add_argument("--states", type=int, default=_models.PAPER_NUM_STATES,
                        help=f"V, at least 1 (paper: {_models.PAPER_NUM_STATES})")
    parser.add_argument("--horizon", type=int, default=_models.PAPER_HORIZON,
                        help=f"T, at least 1 (paper: {_models.PAPER_HORIZON})")


def _parsers():
    parser = argparse.ArgumentParser(prog="python -m specjax", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command")
    rep = commands.add_parser("reproduce", help="the paper's figures and numbers")
    rep.add_argument("--out", default="figures",
                     help="output folder, created if needed and checked before any work; every "
                          "file is written whole or not at all (default: figures)")
    rep.add_argument("--quick", action="store_true",
                     help="toy sizes (about 30 s, mostly compilation; for tests)")
    rep.add_argument("--num-runs", type=int, default=None,
                     help="runs per running-mean curve, at least 2 (default 20,000)")
    rep.add_argument("--seed", type=int, default=_models.PAPER_SEED,
                     help=f"seed of the random instance, 0 .. 2**32 - 1 "
                          f"(paper: {_models.PAPER_SEED})")
    rep.add_argument("--no-progress", action="store_true", help="no progress bar")
    sim = commands.add_parser("simulate", help="Monte Carlo vs exact table on one instance")
    sim.add_argument("--num-chains", type=int, default=200_000,
                     help="chains per decoder, at least 2 (default 200,000)")
    _instance_arguments(sim)
    bench = commands.add_parser("bench", help="every benchmark's headline case, one table")
    bench.add_argument("--out", default="bench",
                       help="output folder for bench.md and bench.json, created if needed and "
                            "checked before any work; both files are written whole, both or "
                            "neither (default: bench)")
    bench.add_argument("--quick", action="store_true",
                       help="toy sizes (seconds plus compilation; for tests): the timings mean "
                            "little")
    bench.add_argument("--cases", nargs="+", default=None, metavar="CASE",
                       help="run only these cases (default: all): " + ", ".join(_bench_cases()))
    bench.add_argument("--repeats", type=int, default=None, metavar="N",
                       help="timed calls of specjax and of its reference per row, taken in "
                            f"turn, 1 .. {MAX_BENCH_REPEATS} (default: 5; 3 with --quick)")
    compare = bench.add_subparsers(dest="bench_command", metavar="{compare}").add_parser(
        "compare", help="two runs' bench.json, case by case: the changes beyond the noise",
        description="Compares two runs of python -m specjax bench (their bench.json, schema "
                    "version 2): per row the change of specjax's median time (B over A) with a "
                    "bootstrap interval, marked slower or faster when it lies outside the union "
                    "of both runs' min .. max spread around their medians, beyond --margin, and "
                    "its interval excludes 1.")
    compare.add_argument("a", metavar="A.json", help="the first run's bench.json")
    compare.add_argument("b", metavar="B.json", help="the second run's bench.json")
    compare.add_argument("--margin", type=float, default=0.10,
                         help="the least change marked, as a fraction, 0 .. 10 (default 0.10)")
    bench.compare = compare
    return parser, rep, sim, bench


def _bench_cases() -> list:
    from specjax.experiments import bench
    return list(bench.CASES)


def main(argv=None) -> None:
    """Runs the command line with ``argv`` (default ``sys.argv[1:]``).

    Every flag is checked before any work, and a mistake ends the run with a usage message
    naming the flag (exit status 2). A ``ValueError`` that specjax raises during the run (bad
    input it found later) is one ``error:`` line, also status 2, not a traceback; Ctrl-C is one
    ``interrupted`` line, status 130 (every output file is written whole or not at all), also
    when a callback lost the ``KeyboardInterrupt`` (``catch_lost_interrupts``).
    """
    parser, rep, sim, bench = _parsers()
    args = parser.parse_args(argv)
    if args.command is None:
        args = rep.parse_args([])
        args.command = "reproduce"
    command = {"reproduce": rep, "simulate": sim, "bench": bench}[args.command]
    if args.command == "bench" and args.bench_command == "compare":
        command = bench.compare
    interrupts = catch_lost_interrupts() if _is_program() else []
    try:
        if args.command == "reproduce":
            check_reproduce_args(rep, args)
            run_reproduce(args)
        elif args.command == "bench" and args.bench_command == "compare":
            check_bench_compare_args(command, args)
            run_bench_compare(args)
        elif args.command == "bench":
            check_bench_args(bench, args)
            run_bench(args)
        else:
            check_simulate_args(sim, args)
            simulate(args)
        if interrupts:  # a Ctrl-C that a callback swallowed: the run is still interrupted
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        where = ""
        if args.command == "reproduce" and os.path.isdir(args.out):
            folder = args.out if args.out.endswith(os.sep) else args.out + os.sep
            where = f"; {folder} holds only whole files (a rerun replaces them)"
        message = f"{command.prog}: interrupted{where}\n"
        if not _is_program():
            command.exit(130, message)
        # As the program, end at once: after an interrupted compilation, JAX's runtime can
        # crash (segfault) as the interpreter shuts down, and there is nothing left to save
        # (files are whole or absent: report.atomic_write removed any temporary one).
        sys.stdout.flush()
        sys.stderr.write(message)
        sys.stderr.flush()
        os._exit(130)
    except ValueError as err:
        if not _raised_by_specjax(err):
            raise  # a bug, not a user's mistake: its traceback is wanted
        sys.stdout.flush()
        command.exit(2, f"{command.prog}: error: {err}\n")


def catch_lost_interrupts() -> list:
    """Records every Ctrl-C of the program, also those Python loses; returns the record.

    Python raises ``KeyboardInterrupt`` wherever the main thread runs Python code next after
    SIGINT arrives. Inside a callback whose exceptions are ignored it is printed as "Exception
    ignored" and lost, and the run goes on. The usual place is JAX's garbage-collection
    callback (``jax._src.lib._xla_gc_callback``, in ``gc.callbacks``): the collector calls it
    at the end of every collection, and it is the first Python code to run after one, so a
    SIGINT that arrives while a collection runs (or while the callback's
    ``collect_garbage()`` runs) is raised inside it and lost, every time. Collections are
    frequent while JAX traces and compiles, and slower under load and with a large heap,
    hence a Ctrl-C lost twice in a row on a loaded machine (a plain JAX script loses it the
    same way). A ``__del__``, or code that catches ``KeyboardInterrupt``, loses it too.

    This handler raises as Python's does, appends to the returned list (which ``main`` checks
    when the work returns) and sets the flag of ``specjax._progress`` (``request_interrupt``),
    which every ``Progress.step`` and ``bench``'s loop over its cases check: a lost Ctrl-C ends
    the run at its next step, with status 130, not at its end. A lost ``KeyboardInterrupt`` is
    not printed. Nothing is installed when SIGINT is not Python's default handler (ignored, or
    a caller's own); it is installed only by ``main`` run as ``python -m specjax``, so a
    library user's ``Progress`` never sees the flag set."""
    record: list = []
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return record

    def on_sigint(signum, frame):
        record.append(signum)
        _progress.request_interrupt()
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    previous_hook = sys.unraisablehook

    def hook(unraisable):
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and record:
            return  # recorded: main reports it as one line when the work returns
        previous_hook(unraisable)

    sys.unraisablehook = hook
    return record


def _is_program() -> bool:
    """Whether this process is ``python -m specjax`` (or ``python -m specjax.cli``), not a
    caller of ``main`` such as a test or a notebook."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) in ("specjax.__main__", "specjax.cli")


def _raised_by_specjax(err: BaseException) -> bool:
    """Whether ``err`` was raised in specjax's own code (its checks of what a user gave), not
    inside a library it calls (where a ``ValueError`` is a bug to show in full)."""
    tb = err.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    package = os.path.dirname(os.path.abspath(specjax.__file__)) + os.sep
    return os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(package)


def _size(num_bytes: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:,.0f} {unit}" if num_bytes >= 100 * scale else \
                f"{num_bytes / scale:.1f} {unit}"
    return f"{num_bytes / 1e3:.0f} kB"


def _round_down(n: int) -> int:
    """``n`` rounded down to two significant digits."""
    scale = 10 ** max(len(str(n)) - 2, 0)
    return n // scale * scale


def memory_limit() -> tuple[int, str] | None:
    """``(bytes, what)``: the memory a run has on the default device (an accelerator's own
    memory, else the machine's physical memory); ``None`` where it cannot be told."""
    device = jax.devices()[0]
    stats = getattr(device, "memory_stats", lambda: None)()
    if stats and stats.get("bytes_limit"):
        limit = int(stats["bytes_limit"])
        return limit, f"the {device.platform.upper()}'s {_size(limit)}"
    try:
        limit = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None
    return limit, f"this machine's {_size(limit)} of memory"


def _check_seed(parser, seed) -> None:
    if not 0 <= seed < SEED_LIMIT:
        parser.error(f"--seed must be in 0 .. 2**32 - 1 = {SEED_LIMIT - 1:,}, got {seed}: JAX "
                     "keeps a seed's low 32 bits only (without x64), so a larger or negative "
                     "seed would silently repeat another seed's instance")


def check_reproduce_args(rep, args) -> None:
    """Every flag of ``reproduce``, before any work: ``rep.error`` (exit 2) names the first
    wrong one."""
    _check_seed(rep, args.seed)
    if args.num_runs is not None:
        if args.num_runs < 2:
            rep.error(f"--num-runs must be at least 2 (a standard error needs two runs), got "
                      f"{args.num_runs}")
        limit = memory_limit()
        need = RUN_BYTES * args.num_runs
        if limit is not None and need > limit[0]:
            rep.error(f"--num-runs {args.num_runs:,} does not fit: the running means and their "
                      f"plotted curves take about {RUN_BYTES} bytes per run, {_size(need)} in "
                      f"all, more than {limit[1]}; use at most "
                      f"about {_round_down(limit[0] // RUN_BYTES):,} runs")
    from specjax.experiments import reproduce
    try:
        reproduce.check_out_dir(args.out)
    except ValueError as err:
        rep.error(f"--out {err}")


def check_simulate_args(sim, args) -> None:
    """Every flag of ``simulate``, before any work: ``sim.error`` (exit 2) names the first
    wrong one."""
    _check_seed(sim, args.seed)
    if args.states < 1:
        sim.error(f"--states must be at least 1 (V, the number of tokens), got {args.states}")
    if args.horizon < 1:
        sim.error(f"--horizon must be at least 1 (T, the tokens to decode), got {args.horizon}")
    c, t, v = args.num_chains, args.horizon, args.states
    if c < 2:
        sim.error(f"--num-chains must be at least 2 (a standard error needs two chains), got {c}")
    if c > MAX_CHAINS:
        sim.error(f"--num-chains must be at most 2**32 = {MAX_CHAINS:,} (chains are numbered "
                  f"with 32 bits), got {c:,}")
    limit = memory_limit()
    if limit is None:
        return
    tables = TABLE_BYTES * t * v * v
    if tables > limit[0]:
        sim.error(f"--states {v:,} with --horizon {t:,} does not fit: the decoders' law tables "
                  f"take about {TABLE_BYTES} bytes per (position, token, token), "
                  f"{_size(tables)} in all, more than {limit[1]}; use fewer states or a "
                  "shorter horizon")
    chains = CHAIN_BYTES * c * (t + 1)
    if tables + chains > limit[0]:
        sim.error(f"--num-chains {c:,} with --horizon {t:,} does not fit: simulate keeps every "
                  f"chain's tokens, about {CHAIN_BYTES} bytes per chain and position, "
                  f"{_size(chains)} in all, which with the law tables' {_size(tables)} is more "
                  f"than {limit[1]}; use fewer chains, or specjax.decoding_statistics, which "
                  "keeps counts only and runs up to 2**32 chains in chunks of bounded memory")


def check_bench_args(bench, args) -> None:
    """Every flag of ``bench``, before any work: ``bench.error`` (exit 2) names the first wrong
    one."""
    cases = _bench_cases()
    unknown = [c for c in args.cases or [] if c not in cases]
    if unknown:
        bench.error(f"--cases: unknown {', '.join(unknown)}; the cases are {', '.join(cases)}")
    if args.repeats is not None and not 1 <= args.repeats <= MAX_BENCH_REPEATS:
        bench.error(f"--repeats {args.repeats}: give 1 .. {MAX_BENCH_REPEATS} timed calls per row")
    from specjax.experiments import bench as _bench
    try:
        _bench.check_out_dir(args.out)
    except ValueError as err:
        bench.error(f"--out {err}")


def check_bench_compare_args(compare, args) -> None:
    """``bench compare``'s arguments, before any work: both files exist (what they hold is
    checked as they are read: ``bench_compare.load`` raises a ``ValueError`` naming the path)."""
    if not (math.isfinite(args.margin) and 0 <= args.margin <= 10):
        compare.error(f"--margin {args.margin}: give a fraction, 0 .. 10 (0.10: 10%)")
    for path in (args.a, args.b):
        if not os.path.exists(path):
            compare.error(f"{path!r}: no such file")
        if os.path.isdir(path):
            compare.error(f"{path!r} is a folder: give its bench.json")


def run_bench_compare(args) -> None:
    from specjax.experiments import bench_compare
    a, b = bench_compare.load(args.a), bench_compare.load(args.b)
    changes = bench_compare.compare(a, b, margin=args.margin)
    print(bench_compare.markdown(a, b, changes, (args.a, args.b), margin=args.margin), end="")


def run_bench(args) -> None:
    import dataclasses
    from specjax.experiments import bench
    sizes = bench.Sizes.quick() if args.quick else bench.Sizes()
    if args.repeats is not None:
        sizes = dataclasses.replace(sizes, repeats=args.repeats, numpy_repeats=args.repeats)
    result = bench.run(sizes, cases=args.cases, mode="quick" if args.quick else "default")
    # The table first: if writing fails at the end (the disk filled during the run), the
    # finished run is still on standard output.
    print()
    print(bench.markdown(result), end="", flush=True)
    md, js = bench.write(result, args.out)
    failed = sum(r.error is not None for r in result.rows)
    print(f"wrote {md} and {js} in {result.seconds:.0f} s"
          + (f"; {failed} case{'s' * (failed > 1)} FAILED" if failed else "") + ".")


def run_reproduce(args) -> None:
    import dataclasses

    from specjax.experiments import reproduce
    settings = reproduce.Settings.quick() if args.quick else reproduce.Settings()
    settings = dataclasses.replace(settings, seed=args.seed)
    if args.num_runs is not None:
        settings = dataclasses.replace(settings, num_runs=args.num_runs)
    start = time.perf_counter()
    print(f"specjax {specjax.__version__}: reproducing the paper's numerical simulations into "
          f"{args.out}/ on {jax.devices()[0].platform} ...", flush=True)
    results = reproduce.reproduce(args.out, settings, progress=not args.no_progress)
    sd = results["convergence"]["sd"]
    failed = [c for c in results["checks"] if not c["ok"]]
    t = settings.horizon
    print(f"SD, T = {t}: E[N_rej] = {sd['exact']:.3f} exact (Theorem 1), {sd['mean']:.3f} ± "
          f"{sd['se']:.3f} simulated; acceleration T / E[N_rej] = {t / sd['exact']:.2f} "
          f"(paper, with its own random instance: {reproduce.PAPER['expected_rejections_T50']}"
          f" and {reproduce.PAPER['acceleration_T50']}).")
    for m, e in results["convergence"]["batch"].items():
        print(f"batch SD, M = {m}: E[N_rej] = {e['exact']:.3f} exact (Theorem 3), "
              f"{e['mean']:.3f} ± {e['se']:.3f} simulated.")
    print(f"batch SD as M -> infinity: {results['scaling']['limit']:.3f} (never 0).")
    print(f"checks: {len(results['checks']) - len(failed)} of {len(results['checks'])} hold"
          + "".join(f"\n  FAILED: {c['check']} ({c['detail']})" for c in failed))
    names = list(reproduce.FIGURES) + ["summary.md", "summary.json"]
    print(f"wrote {', '.join(names)} to {args.out}/ in {time.perf_counter() - start:.0f} s.")


def simulate(args) -> None:
    draft, target = specjax.paper_instance(args.seed, args.states, args.horizon)
    c, horizon = args.num_chains, args.horizon
    print(f"specjax {specjax.__version__}: random non-stationary Markov chains, V = {args.states}, "
          f"T = {horizon}, uniform prompt, seed {args.seed}; {c:,} chains per decoder "
          f"on {jax.devices()[0].platform}.")
    print("(The paper's own random draws are unknown, so its 16.41 rejections are not expected.)")
    runs = [
        ("autoregressive (Alg. 3)", lambda k: specjax.autoregressive_decoding(k, target, c),
         None),
        ("SD, K = T (Alg. 1)", lambda k: specjax.speculative_decoding(k, draft, target, c),
         specjax.exact(specjax.Speculative(), draft, target)),
        ("SD, K = 4", lambda k: specjax.speculative_decoding(k, draft, target, c, lookahead=4),
         specjax.exact(specjax.Speculative(4), draft, target)),
    ] + [
        (f"batch SD, M = {m} (Alg. 4)",
         lambda k, m=m: specjax.batch_speculative_decoding(k, draft, target, c, num_drafts=m),
         specjax.exact(specjax.BatchSpeculative(m), draft, target))
        for m in (2, 4, 5)
    ]
    header = f"{'decoder':<26}{'N_rej':>9}{'± se':>8}{'exact':>9}{'calls':>9}{'± se':>8}" \
             f"{'exact':>9}{'T/calls':>9}{'wall*':>8}"
    print(header)
    print("-" * len(header))
    key = jax.random.key(args.seed)
    for i, (name, run, exact) in enumerate(runs):
        _progress.check_interrupt()
        start = time.perf_counter()
        trace = jax.block_until_ready(run(jax.random.fold_in(key, i)))
        elapsed = time.perf_counter() - start
        rej, rej_se = mean_se(trace.num_rejections)
        calls, calls_se = mean_se(trace.num_calls)
        exact_rej = 0.0 if exact is None else float(exact.expected_rejections)
        exact_calls = float(horizon) if exact is None else float(exact.expected_calls)
        print(f"{name:<26}{rej:>9.3f}{rej_se:>8.3f}{exact_rej:>9.3f}{calls:>9.3f}{calls_se:>8.3f}"
              f"{exact_calls:>9.3f}{horizon / calls:>9.2f}{elapsed:>7.2f}s")
    limit = float(specjax.batch_expected_rejections(draft, target, num_drafts=math.inf))
    print(f"exact: specjax.exact_* (no sampling). Batch SD as M -> infinity: {limit:.3f} "
          "rejections; it never reaches 0 (the paper's Proposition).")
    print("* wall time of the first call, compilation included.")


if __name__ == "__main__":
    main()
