"""The command line's outputs (issue 52, items 14 and 15): ``bench`` and ``reproduce`` check every
output path before any work and refuse a bad one with a usage error naming ``--out``; ``bench``
writes ``bench.md`` and ``bench.json`` both or neither; and one Ctrl-C that a callback swallows
still ends the run at the next step (not at its end).

``specjax.cli.main`` runs in-process with the heavy functions replaced, except in the one slow
test that sends a real SIGINT to ``python -m specjax reproduce --quick``."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from specjax import _progress
from specjax import cli
from specjax._progress import Progress
from specjax.experiments import bench
from specjax.experiments import report
from specjax.experiments import reproduce
from test_cli import assert_usage_error
from test_cli import run_main
from test_scripts import ROOT

PROC = "/proc"
needs_proc = pytest.mark.skipif(not os.path.isdir(PROC), reason="no /proc on this system")


@pytest.fixture
def no_work(monkeypatch):
    """Any benchmark or experiment started fails the test: a refused ``--out`` must stop
    before any work."""
    def started(*args, **kwargs):
        raise AssertionError("the work ran although --out was refused")
    monkeypatch.setattr(bench, "run", started)
    monkeypatch.setattr(reproduce, "reproduce", started)
    monkeypatch.setattr(reproduce, "run_experiments", started)


def temporary_files(folder):
    return [n for n in os.listdir(folder) if n.startswith(".") or n.endswith(".tmp")]


# --- item 14: every output path checked before any work ---------------------------------------


@pytest.mark.parametrize("name", bench.OUTPUTS if hasattr(bench, "OUTPUTS")
                         else ("bench.md", "bench.json"))
def test_bench_refuses_a_folder_where_an_output_file_goes(name, capsys, no_work, tmp_path):
    (tmp_path / name).mkdir()
    code, out, err = run_main(["bench", "--quick", "--out", str(tmp_path)], capsys)
    assert_usage_error(code, err, "bench", f"--out {str(tmp_path / name)!r} is a folder, where "
                       f"bench writes the file {name}")
    assert out == ""
    assert sorted(os.listdir(tmp_path)) == [name]  # nothing written beside it


@needs_proc
@pytest.mark.parametrize("command", ["bench", "reproduce"])
@pytest.mark.parametrize("out", [PROC, f"{PROC}/specjax-test/out"])
def test_out_under_proc_is_refused_before_any_work(command, out, capsys, no_work):
    """``/proc`` lets no file be created, even by root (for whom ``os.access`` says yes)."""
    code, stdout, err = run_main([command, "--out", out], capsys)
    assert_usage_error(code, err, command, f"--out {out!r} ")
    assert "not writable" in err
    assert stdout == ""


def test_reproduce_refuses_a_folder_where_a_figure_goes(capsys, no_work, tmp_path):
    name = next(iter(reproduce.FIGURES))
    (tmp_path / name).mkdir()
    code, _, err = run_main(["reproduce", "--out", str(tmp_path)], capsys)
    assert_usage_error(code, err, "reproduce", f"--out {str(tmp_path / name)!r} is a folder, "
                       f"where reproduce writes the file {name}")


def test_a_missing_out_folder_is_not_created_by_the_check(capsys, no_work, tmp_path):
    out = tmp_path / "new" / "deeper"
    (tmp_path / "new").mkdir()
    (out.parent / "bench.json").mkdir()  # not in the folder bench writes to: no refusal
    with pytest.raises(AssertionError, match="the work ran"):
        cli.main(["bench", "--quick", "--out", str(out)])
    assert sorted(os.listdir(tmp_path / "new")) == ["bench.json"]  # the check left nothing


def fake_result():
    return bench.Result(device="cpu (cpu, 1 device)", platform="cpu", jax_version="0",
                        specjax_version="0", commit="unknown", date="today", mode="quick",
                        cpu_count=1, load=None, seconds=1.0, sizes={}, rows=[])


def test_bench_write_writes_both_files_or_neither(monkeypatch, tmp_path):
    (tmp_path / "bench.md").write_text("old md")
    (tmp_path / "bench.json").write_text('{"old": 1}')

    def broken(result):
        raise RuntimeError("bench.json cannot be made")
    monkeypatch.setattr(bench, "to_json", broken)
    with pytest.raises(RuntimeError, match="cannot be made"):
        bench.write(fake_result(), tmp_path)
    assert (tmp_path / "bench.md").read_text() == "old md"  # not the new one beside the old json
    assert (tmp_path / "bench.json").read_text() == '{"old": 1}'
    assert temporary_files(tmp_path) == []
    monkeypatch.undo()
    md, js = bench.write(fake_result(), tmp_path)
    assert md.read_text().startswith("`python -m specjax bench --quick`")
    assert json.loads(js.read_text())["mode"] == "quick"
    assert sorted(os.listdir(tmp_path)) == ["bench.json", "bench.md"]


def test_report_write_texts_renames_only_after_every_file_is_written(monkeypatch, tmp_path):
    a, b = tmp_path / "a.md", tmp_path / "b.json"
    a.write_text("old a")
    replaced = []
    real_replace = os.replace

    def replace(src, dst):
        replaced.append(os.path.basename(dst))
        if os.path.basename(dst) == "a.md":
            raise OSError(28, "No space left on device")
        real_replace(src, dst)
    monkeypatch.setattr(os, "replace", replace)  # every writer renames with os.replace
    with pytest.raises(OSError, match="No space"):
        report.write_texts({a: "new a", b: "new b"})
    assert replaced == ["a.md"]  # the first rename failed: the second never happened
    assert a.read_text() == "old a" and not b.exists()
    assert temporary_files(tmp_path) == []
    monkeypatch.undo()
    report.write_texts({a: "new a", b: "new b"})
    assert (a.read_text(), b.read_text()) == ("new a", "new b")


def test_bench_prints_its_table_before_writing(capsys, monkeypatch, tmp_path):
    """A write that fails at the end (the disk filled during the run) is one error line, and
    the finished run's table is on standard output, not lost."""
    monkeypatch.setattr(bench, "run", lambda sizes, cases=None, mode="default": fake_result())

    def full(files):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(report, "write_texts", full)
    code, out, err = run_main(["bench", "--quick", "--out", str(tmp_path)], capsys)
    assert code == 2, err
    assert "| case | what |" in out
    assert err.startswith("python -m specjax bench: error: ") and "No space left" in err
    assert "Traceback" not in err


# --- item 15: a Ctrl-C that a callback swallows ends the run at the next step -------------------


@pytest.fixture
def program_handler():
    """``cli.catch_lost_interrupts`` installed as ``python -m specjax`` installs it, and its
    handler; SIGINT's handler, the unraisable hook and the interrupt flag restored after."""
    previous, hook = signal.getsignal(signal.SIGINT), sys.unraisablehook
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        record = cli.catch_lost_interrupts()
        yield record, signal.getsignal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)
        sys.unraisablehook = hook
        _progress._interrupt_requested = False


class SwallowsCtrlC:
    """Calls the SIGINT handler in ``__del__``, where Python prints and drops any exception (as
    in JAX's garbage-collection callback)."""

    def __init__(self, handler):
        self.handler = handler

    def __del__(self):
        self.handler(signal.SIGINT, None)


def test_a_swallowed_ctrl_c_stops_the_next_progress_step(program_handler):
    record, handler = program_handler
    bar = Progress(5, enabled=False)
    bar.step("first")
    SwallowsCtrlC(handler)  # collected at once: its KeyboardInterrupt is lost
    assert record == [signal.SIGINT]
    with pytest.raises(KeyboardInterrupt):
        bar.step("second")
    assert bar.done == 1  # the step interrupted is not counted


def test_a_caught_ctrl_c_stops_the_next_bench_case(program_handler, monkeypatch):
    _, handler = program_handler
    ran = []

    def case(name, swallow=False):
        def rows(sizes, chains):
            ran.append(name)
            if swallow:
                try:
                    handler(signal.SIGINT, None)
                except KeyboardInterrupt:  # as a library's broad handler might
                    pass
            return iter(())
        return rows
    monkeypatch.setattr(bench, "CASES", {"a": case("a", swallow=True), "b": case("b")})
    with pytest.raises(KeyboardInterrupt):
        bench.run(bench.Sizes.quick(), progress=False)
    assert ran == ["a"]


def test_library_users_never_see_the_flag_set():
    """Without the program's handler a Progress never raises on its own."""
    assert _progress._interrupt_requested is False
    with Progress(3, enabled=False) as bar:
        for i in range(3):
            bar.step(str(i))
    assert bar.done == 3


@pytest.mark.slow
def test_ctrl_c_lost_in_a_gc_callback_ends_reproduce_at_the_next_step(tmp_path):
    """A real SIGINT, delivered while a garbage-collection callback runs (as JAX's
    ``_xla_gc_callback`` does after every collection), to ``python -m specjax reproduce
    --quick``: the run ends with status 130 at its next progress step, having written nothing,
    not after running to the end."""
    out = tmp_path / "figures"
    launch = textwrap.dedent(f"""
        import gc, os, runpy, signal, sys, time
        import specjax._progress
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a runner may ignore SIGINT
        stepped, sent = [], []
        real_step = specjax._progress.Progress.step

        def step(self, label):  # after the first step, one collection: Ctrl-C arrives there
            real_step(self, label)
            if not stepped:
                stepped.append(label)
                gc.collect()

        def swallow(phase, info):  # the KeyboardInterrupt raised in here is lost
            if stepped and not sent:
                sent.append(1)
                print("SIGINT sent", flush=True)
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)  # the handler runs here, inside the callback
        specjax._progress.Progress.step = step
        gc.callbacks.append(swallow)
        sys.argv = ["specjax", "reproduce", "--quick", "--no-progress", "--out", {str(out)!r}]
        runpy.run_module("specjax", run_name="__main__", alter_sys=True)
    """)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", launch], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert "SIGINT sent" in proc.stdout, (proc.stdout, proc.stderr)
    assert proc.returncode == 130, (proc.stdout, proc.stderr)
    assert "wrote " not in proc.stdout, "the run went on to its end"
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "python -m specjax reproduce: interrupted")
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr
    assert not out.exists() or sorted(os.listdir(out)) == []
    assert time.monotonic() - start < 240
