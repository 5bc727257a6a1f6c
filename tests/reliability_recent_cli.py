"""Battery cases of issue 52, items 14 and 15 (the command line's outputs, and a lost Ctrl-C), in
the style of ``reliability_cases._cases``: ``add_cases(add, S)`` adds them with that function's
``add`` (``S`` is ``specjax``).

* Item 14: ``python -m specjax bench --out D`` (and ``reproduce``) where an output file's path is
  a folder, or ``D`` is under ``/proc``, is refused before any work with a usage error naming
  ``--out`` (here a ``ValueError``, as ``reliability_cases.cli`` turns exit status 2 into one);
  ``bench.write`` writes ``bench.md`` and ``bench.json`` whole, and refuses a folder in their
  place naming the file.
* Item 15: a Ctrl-C whose ``KeyboardInterrupt`` a callback swallows (a ``__del__``, an ``except
  KeyboardInterrupt: pass``) under the program's SIGINT handler still ends the run: the next
  ``Progress.step``, or ``bench``'s next case, raises ``KeyboardInterrupt``.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import sys
import tempfile


def _in_folder(setup, argv):
    """A case body: a fresh temporary folder ``D``, ``setup(D)``, then ``python -m specjax`` with
    ``argv`` (``"{D}"`` in an argument is replaced by the folder) in-process."""
    from reliability_cases import cli  # noqa: PLC0415 - not at import: no circular import

    def run():
        with tempfile.TemporaryDirectory() as tmp:
            setup(pathlib.Path(tmp))
            return cli(*[str(a).replace("{D}", tmp) for a in argv])()
    return run


def _mkdir(name):
    return lambda folder: (folder / name).mkdir()


def _fake_result():
    from specjax.experiments import bench  # noqa: PLC0415
    return bench.Result(device="cpu (cpu, 1 device)", platform="cpu", jax_version="0",
                        specjax_version="0", commit="unknown", date="today", mode="quick",
                        cpu_count=1, load=None, seconds=1.0, sizes={}, rows=[])


def _bench_write(setup):
    """``bench.write`` of a small result into a temporary folder prepared by ``setup``; returns
    what the folder holds then: ``{name: text}``."""
    def run():
        from specjax.experiments import bench  # noqa: PLC0415
        with tempfile.TemporaryDirectory() as tmp:
            folder = pathlib.Path(tmp)
            setup(folder)
            bench.write(_fake_result(), folder)
            return {p.name: p.read_text() for p in sorted(folder.iterdir())}
    return run


def _old_outputs(folder):
    (folder / "bench.md").write_text("old md")
    (folder / "bench.json").write_text('{"old": 1}')


def _both_new(files) -> bool:
    return (sorted(files) == ["bench.json", "bench.md"]
            and files["bench.md"].startswith("`python -m specjax bench --quick`")
            and json.loads(files["bench.json"])["mode"] == "quick")


@contextlib.contextmanager
def _program_handler():
    """The program's SIGINT handler (``cli.catch_lost_interrupts``) installed; yields it.
    SIGINT's handler, the unraisable hook and the interrupt flag are restored after."""
    from specjax import _progress  # noqa: PLC0415
    from specjax import cli as specjax_cli  # noqa: PLC0415
    previous, hook = signal.getsignal(signal.SIGINT), sys.unraisablehook
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        specjax_cli.catch_lost_interrupts()
        yield signal.getsignal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)
        sys.unraisablehook = hook
        _progress._interrupt_requested = False


class _SwallowsCtrlC:
    """Calls the SIGINT handler in ``__del__``, where Python drops any exception."""

    def __init__(self, handler):
        self.handler = handler

    def __del__(self):
        self.handler(signal.SIGINT, None)


def _lost_in_del_then_step():
    """``True`` when the ``Progress.step`` after a Ctrl-C lost in a ``__del__`` raises."""
    from specjax._progress import Progress  # noqa: PLC0415
    with _program_handler() as handler:
        bar = Progress(3, enabled=False)
        _SwallowsCtrlC(handler)  # collected at once: its KeyboardInterrupt is lost
        try:
            bar.step("after the lost Ctrl-C")
        except KeyboardInterrupt:
            return bar.done == 0
        return False


def _caught_in_a_case_then_next_case():
    """``True`` when ``bench.run`` stops before its next case after a case swallowed a Ctrl-C
    (``except KeyboardInterrupt: pass``)."""
    from specjax.experiments import bench  # noqa: PLC0415
    ran = []

    def case(name, handler=None):
        def rows(sizes, chains):
            ran.append(name)
            if handler is not None:
                with contextlib.suppress(KeyboardInterrupt):
                    handler(signal.SIGINT, None)
            return iter(())
        return rows
    saved = bench.CASES
    with _program_handler() as handler:
        bench.CASES = {"swallows": case("swallows", handler), "next": case("next")}
        try:
            bench.run(bench.Sizes.quick(), progress=False)
        except KeyboardInterrupt:
            return ran == ["swallows"]
        finally:
            bench.CASES = saved
        return False


def add_cases(add, S) -> None:
    """Adds the cases of issue 52's items 14 and 15 with ``reliability_cases._cases``' ``add``."""
    kind = "CLI"
    entry = "python -m specjax"
    # A refusal must come before any work: "--cases theory" keeps the run short were it not.
    for name in ("bench.json", "bench.md"):
        add(kind, entry, f"bench --out D where D/{name} is a folder",
            _in_folder(_mkdir(name), ["bench", "--quick", "--cases", "theory", "--out", "{D}"]),
            "--out")
    if os.path.isdir("/proc"):
        for out in ("/proc", "/proc/specjax-battery/bench"):
            add(kind, entry, f"bench --out {out}",
                _in_folder(lambda folder: None,
                           ["bench", "--quick", "--cases", "theory", "--out", out]), "--out")
        add(kind, entry, "reproduce --out /proc",
            _in_folder(lambda folder: None, ["reproduce", "--quick", "--no-progress", "--out",
                                             "/proc"]), "--out")
    add(kind, entry, "reproduce --out D where D/fig3_pareto.png is a folder",
        _in_folder(_mkdir("fig3_pareto.png"),
                   ["reproduce", "--quick", "--no-progress", "--out", "{D}"]), "--out")
    add(kind, entry, "reproduce --out D where D/summary.json is a folder",
        _in_folder(_mkdir("summary.json"),
                   ["reproduce", "--quick", "--no-progress", "--out", "{D}"]), "--out")
    entry = "specjax.experiments.bench.write"
    add(kind, entry, "a folder holding bench.json as a folder",
        _bench_write(_mkdir("bench.json")), "bench.json")
    add(kind, entry, "over an earlier run's files (valid: both replaced whole)",
        _bench_write(_old_outputs), check=_both_new)
    entry = "python -m specjax (SIGINT handler)"
    add(kind, entry, "Ctrl-C lost in a __del__, then Progress.step (raises)",
        _lost_in_del_then_step, check=lambda r: r is True)
    add(kind, entry, "Ctrl-C swallowed by a bench case, then the next case (stops)",
        _caught_in_a_case_then_next_case, check=lambda r: r is True)
