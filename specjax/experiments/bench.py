"""``python -m specjax bench``: every benchmark's headline case in one run, on any device, as a
harness whose runs compare across commits and machines (``python -m specjax bench compare``).

Each case (``bench_cases``) times a public specjax entry point beside its NumPy reference
(``specjax.experiments.references``, the same code the scripts ``scripts/benchmark_*.py`` use) in
the same process: ``repeats`` timed calls of each, taken in turn (A B A B, ``bench_timing``),
after a warm-up call of specjax's (which compiles; its time is kept as the first call's). Every
sample is kept, in wall time (``time.perf_counter``) and process CPU time
(``time.process_time``). The table gives medians with their min .. max, and the ratio
``reference time / specjax time`` of the medians (against NumPy, above 1: specjax is faster)
with a bootstrap interval over the paired repeats. The ``stop_tokens`` row's reference is
specjax itself without stop tokens: its ratio (without / with) is the stop token's cost.
Samplers also give the fraction of the random-number floor: the time JAX takes just to draw one
uniform per chain-step (accumulated in a ``lax.scan``), over specjax's time. The cases run one
after another, each on its own: one that fails (out of memory on some device, say) ends with a
``failed`` row, after the rows it finished, and the others still run. JAX runs on whatever
device it finds (``jax.devices()[0]``); NumPy on the host. Beside the times, each row shows what
the two computed on the run (means, exact values, the requests they agree on) and whether they
agree.

Two sizes (``Sizes``): the default, the scripts' headline settings where they fit a few minutes
on a 2-core CPU (the exceptions are listed in ``Sizes``' docstring), 5 repeats; and ``quick``,
toy sizes and 3 repeats that check the command end to end in the test suite (its timings mean
little). ``--repeats N`` sets the repeats of both.

The output: ``bench.md`` (a header line, one Markdown table and the legend of its columns) and
``bench.json``, written whole into the output folder, both or neither (``write``;
``check_out_dir`` checks the folder before a run). ``bench.json``, schema version 2 (times in
seconds; a number that is not finite is ``null``):

* ``schema_version``: 2 (``bench compare`` refuses any other).
* ``ratio``: the direction of every ratio, ``"reference_time / specjax_time"``.
* ``command``, ``mode`` (``default``, ``quick``, or a name given to ``run``), ``commit`` (git,
  ``+modified`` with uncommitted changes), ``date`` (UTC), ``seconds`` (the whole run).
* ``repeats``: ``{"specjax": n, "reference": n}``, the timed calls per row.
* ``environment``: ``specjax``, ``jax``, ``jaxlib``, ``numpy``, ``python``,
  ``python_implementation``, ``os``, ``machine``, ``cpu_model`` (``/proc/cpuinfo``),
  ``cpu_count``, ``device`` (in words), ``device_kind``, ``device_count``, ``platform``
  (``cpu``, ``gpu``, ``tpu``), ``backend_version``, ``cuda`` (``cuda_runtime``,
  ``cuda_driver``, ``cudnn``, ... as JAX reports them, or ``null``), ``env`` (``XLA_FLAGS`` and
  every ``JAX_*`` variable), ``load_start`` and ``load_end`` (``os.getloadavg``: 1, 5, 15 min).
* ``sizes``: every case's sizes (``Sizes``).
* ``rows``: one per line of the table, each with:

  * ``case``, ``name``: the case and what is timed.
  * ``size``: the sizes by name (``{"V": 7, "T": 8, "C": 2000}``; ``{"text": ...}`` for a size in
    words).
  * ``specjax``: ``repeats``; ``wall_s`` and ``cpu_s``, each ``{median, min, max, samples}``
    (one sample per timed call, in order); ``first_call_s``: ``{wall, cpu}`` of the warm-up call,
    compilation included.
  * ``reference``: ``null`` or the same with ``name`` (``NumPy``, or ``specjax without stop
    tokens``) and ``kind`` (``numpy`` or ``specjax``); its ``first_call_s`` is ``null``.
  * ``ratio``: ``null`` or ``{of, reading, median, min, max, interval, level, pairs}``: the
    reference's median over specjax's; ``min`` and ``max`` of the ratios of the ``pairs`` rounds
    timed side by side; ``interval``: a bootstrap interval of ``median`` at ``level``; ``reading``
    says which way is faster.
  * ``work``: ``null`` or ``{units, unit, per_s}`` (the work of one call and specjax's rate).
  * ``floor``: for a sampler, the random-number floor's median time over specjax's; else
    ``null``.
  * ``check``: ``null`` or ``{text, agree, kind, quantity, ...}``, the numbers of the outputs'
    comparison as fields: ``kind`` ``means`` (``specjax_mean``, ``reference_mean``, ``z``,
    ``z_limit``), ``values`` (``max_abs_diff``, ``limit``), ``requests`` (``same`` of ``total``),
    ``estimate`` (``value``, ``se``).
  * ``error``: why the case failed, or ``null``.

``python -m specjax bench compare A.json B.json`` (``bench_compare``) reads two such files and
marks the rows whose median time changed beyond the noise of the two runs.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import pathlib
import subprocess
import sys
import time

import jax

import specjax
from specjax._progress import check_interrupt
from specjax.experiments import report
from specjax.experiments.bench_cases import CASES
from specjax.experiments.bench_cases import RTOL  # noqa: F401 - the module's API, as before
from specjax.experiments.bench_cases import Z_LIMIT  # noqa: F401
from specjax.experiments.bench_cases import Row
from specjax.experiments.bench_cases import Sizes
from specjax.experiments.bench_cases import _Chains
from specjax.experiments.bench_cases import _means  # noqa: F401
from specjax.experiments.bench_cases import _requests  # noqa: F401
from specjax.experiments.bench_cases import _values  # noqa: F401
from specjax.experiments.bench_cases import sequoia_parents  # noqa: F401 - for the scripts
from specjax.experiments.bench_report import SCHEMA_VERSION  # noqa: F401
from specjax.experiments.bench_report import Result
from specjax.experiments.bench_report import environment
from specjax.experiments.bench_report import load_average
from specjax.experiments.bench_report import markdown  # noqa: F401 - the CLI prints it
from specjax.experiments.bench_report import to_json
from specjax.experiments.bench_timing import best_time  # noqa: F401 - for the scripts
from specjax.experiments.bench_timing import best_times  # noqa: F401
from specjax.experiments.bench_timing import time_against_numpy  # noqa: F401
from specjax.experiments.bench_timing import timed  # noqa: F401
from specjax.experiments.bench_timing import uniform_floor  # noqa: F401

__all__ = ["OUTPUTS", "check_out_dir", "commit", "device_name", "run", "write"]

OUTPUTS = ("bench.md", "bench.json")  # the files ``write`` puts in its folder, in this order


def commit() -> str:
    """The git commit of the checkout specjax is imported from (``+modified`` where tracked
    files have uncommitted changes), or ``unknown`` (an installed copy, no git)."""
    root = pathlib.Path(specjax.__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
                              capture_output=True, text=True, timeout=10)
        if head.returncode != 0 or not head.stdout.strip():
            return "unknown"
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True,
                               timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() + ("+modified" if dirty.stdout.strip() else "")


def device_name() -> str:
    """The first device JAX finds, in words, with how many there are."""
    devices = jax.devices()
    kind = devices[0].device_kind
    return f"{kind} ({devices[0].platform}, {len(devices)} device{'s' * (len(devices) > 1)})"


def _error(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:200]}"


def run(sizes: Sizes | None = None, *, cases=None, mode: str = "default",
        progress: bool = True) -> Result:
    """Runs the cases (default: all of ``CASES``, in order) and returns their rows.

    Each case runs on its own: an exception in one (out of memory, a bug) ends that case with a
    failed row (after the rows it had finished) and the next case runs. Progress goes to
    standard output: a line per case, with its time and ratios (of the medians). The load
    average is read at the start and at the end (``Result.load``, ``environment["load_end"]``).

    Args:
      sizes: the sizes of every case (default ``Sizes()``; ``Sizes.quick()`` for toy sizes).
      cases: names of ``CASES`` to run (default all).
      mode: the name of the sizes, as the table shows it.
      progress: print the progress lines.

    Raises:
      ValueError: a name in ``cases`` that is not a case.
    """
    sizes = Sizes() if sizes is None else sizes
    names = list(CASES) if cases is None else list(cases)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise ValueError(f"cases: unknown {unknown}; the cases are {', '.join(CASES)}")
    start = time.perf_counter()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load = load_average()
    device = device_name()
    checkout = commit()  # at the start: the code that runs is the code imported now
    out = sys.stdout if progress else None
    if out is not None:
        print(f"specjax bench ({mode}) on {device}, JAX {jax.__version__}", file=out, flush=True)
    chains = _Chains()
    rows = []
    for i, name in enumerate(names):
        # Between cases (and rows, and repeats): a Ctrl-C of ``python -m specjax bench`` whose
        # KeyboardInterrupt a callback lost ends the run here (``specjax._progress``).
        check_interrupt()
        case_start = time.perf_counter()
        if out is not None:
            print(f"[{i + 1}/{len(names)}] {name} ...", end=" ", file=out, flush=True)
        got = []
        try:
            for row in CASES[name](sizes, chains):
                got.append(row)
                check_interrupt()
            status = "ok"
        except Exception as err:  # noqa: BLE001 - one case failing must not stop the others
            got.append(Row(name, name, {}, math.nan, error=_error(err)))
            status = f"FAILED ({got[-1].error})"
        rows.extend(got)
        if out is not None:
            ratios = ", ".join(f"{r.ratio:.2f}x" for r in got if r.ratio is not None)
            print(f"{status} in {time.perf_counter() - case_start:.1f} s"
                  + (f" (ratios {ratios})" if ratios else ""), file=out, flush=True)
    return Result(device=device, platform=jax.devices()[0].platform,
                  jax_version=jax.__version__, specjax_version=specjax.__version__,
                  commit=checkout, date=date, mode=mode, cpu_count=os.cpu_count() or 0,
                  load=None if load is None else tuple(load),
                  seconds=time.perf_counter() - start, sizes=dataclasses.asdict(sizes),
                  rows=rows, environment=environment(load_end=load_average()))


def check_out_dir(out_dir) -> pathlib.Path:
    """``out_dir`` as a path, checked before any work (``python -m specjax bench`` checks
    ``--out`` with it): a writable folder, or one that can be created, with no folder where
    ``bench.md`` or ``bench.json`` goes (``reproduce.check_out_dir``).

    Raises:
      ValueError: saying why.
    """
    from specjax.experiments import reproduce  # noqa: PLC0415
    return reproduce.check_out_dir(out_dir, OUTPUTS, "bench")


def write(result: Result, out_dir) -> tuple[pathlib.Path, pathlib.Path]:
    """Writes ``bench.md`` and ``bench.json`` into ``out_dir`` (created if needed), each file
    whole and both or neither (``report.write_texts``); returns their paths.

    Raises:
      ValueError: ``out_dir`` is not a writable folder (``check_out_dir``), or a file could not
        be written (neither is then, as far as the file system allows).
    """
    from specjax.experiments import reproduce  # noqa: PLC0415
    folder = reproduce.make_out_dir(out_dir, OUTPUTS, "bench")
    md, js = folder / OUTPUTS[0], folder / OUTPUTS[1]
    texts = {md: markdown(result), js: json.dumps(to_json(result), indent=2) + "\n"}
    try:
        report.write_texts(texts)
    except OSError as err:
        raise ValueError(f"out_dir {str(folder)!r}: bench.md and bench.json could not be "
                         f"written ({err.strerror or err})") from None
    return md, js
