"""The command line (``python -m specjax``): every flag is checked before any work and a mistake is
a usage message naming the flag, a ``ValueError`` of specjax is one ``error:`` line, Ctrl-C is one
``interrupted`` line with exit status 130, and ``reproduce`` writes every file whole or not at all.

``specjax.cli.main`` runs in-process with the heavy functions replaced, so every test is fast."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

import specjax
from specjax import cli
from specjax.experiments import plots
from specjax.experiments import report
from specjax.experiments import reproduce
from test_scripts import ROOT

GB = 10**9


def run_main(argv, capsys):
    """``(exit status, stdout, stderr)`` of ``cli.main(argv)``; status 0 if it returned."""
    try:
        cli.main(argv)
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def no_run(monkeypatch):
    """Any experiment started fails the test: a refused flag must stop before any work."""
    def started(*args, **kwargs):
        raise AssertionError("an experiment ran although a flag was refused")
    monkeypatch.setattr(reproduce, "reproduce", started)
    monkeypatch.setattr(reproduce, "run_experiments", started)
    monkeypatch.setattr(cli, "simulate", started)
    monkeypatch.setattr(specjax, "paper_instance", started)
    # The memory bounds against a fixed 8 GB, whatever this machine has.
    monkeypatch.setattr(cli, "memory_limit", lambda: (8 * GB, "the test's 8 GB"))


def assert_usage_error(code, err, command, message):
    assert code == 2, err
    assert err.startswith(f"usage: python -m specjax {command}"), err
    assert f"python -m specjax {command}: error: {message}" in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("args,message", [
    (["--states", "0"], "--states must be at least 1 (V, the number of tokens), got 0"),
    (["--states", "-3"], "--states must be at least 1"),
    (["--horizon", "0"], "--horizon must be at least 1 (T, the tokens to decode), got 0"),
    (["--seed", "-1"], "--seed must be in 0 .. 2**32 - 1"),
    (["--seed", str(2**32)], "--seed must be in 0 .. 2**32 - 1"),
    (["--seed", str(2**63)], "--seed must be in 0 .. 2**32 - 1"),
    (["--num-chains", "1"], "--num-chains must be at least 2"),
    (["--num-chains", str(2**32 + 1)], "--num-chains must be at most 2**32"),
    # 16 bytes per chain and position: 10^8 chains of T = 50 are 82 GB, over the 8 GB.
    (["--num-chains", str(10**8)], "--num-chains 100,000,000 with --horizon 50 does not fit"),
    # 160 bytes per (position, token, token): V = 10^5, T = 50 is 80 TB.
    (["--states", str(10**5)], "--states 100,000 with --horizon 50 does not fit"),
    (["--states", "1000", "--horizon", "1000"], "--states 1,000 with --horizon 1,000 does"),
    (["--states", "x"], "argument --states: invalid int value: 'x'"),
])
def test_simulate_refuses_a_bad_flag_before_any_work(args, message, capsys, no_run):
    code, out, err = run_main(["simulate", *args], capsys)
    assert_usage_error(code, err, "simulate", message)
    assert out == ""


def test_too_many_chains_point_to_the_counts_only_path(capsys, no_run):
    code, _, err = run_main(["simulate", "--num-chains", str(10**9)], capsys)
    assert code == 2 and "specjax.decoding_statistics" in err and "the test's 8 GB" in err


@pytest.mark.parametrize("args,message", [
    (["--num-runs", "1"], "--num-runs must be at least 2"),
    (["--num-runs", "-5"], "--num-runs must be at least 2"),
    (["--num-runs", str(10**9)], "--num-runs 1,000,000,000 does not fit"),
    (["--seed", "-1"], "--seed must be in 0 .. 2**32 - 1"),
    (["--seed", str(2**32)], "--seed must be in 0 .. 2**32 - 1"),
    (["--out", ""], "--out '' is empty"),
])
def test_reproduce_refuses_a_bad_flag_before_any_work(args, message, capsys, no_run, tmp_path):
    code, _, err = run_main(["reproduce", "--out", str(tmp_path / "figures"), *args], capsys)
    assert_usage_error(code, err, "reproduce", message)
    assert not (tmp_path / "figures").exists()  # nothing created


def test_out_that_is_a_file(capsys, no_run, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    code, _, err = run_main(["reproduce", "--out", str(tmp_path / "notes.txt")], capsys)
    assert_usage_error(code, err, "reproduce", "--out ")
    assert "exists and is not a folder" in err
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_out_under_a_file(capsys, no_run, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    out = tmp_path / "notes.txt" / "figures" / "deeper"
    code, _, err = run_main(["reproduce", "--out", str(out)], capsys)
    assert_usage_error(code, err, "reproduce", f"--out {str(out)!r} cannot be created: ")
    assert f"{str(tmp_path / 'notes.txt')!r} is a file, not a folder" in err


def test_out_holding_a_folder_where_an_output_file_goes(capsys, no_run, tmp_path):
    (tmp_path / "summary.md").mkdir()
    code, _, err = run_main(["reproduce", "--out", str(tmp_path)], capsys)
    assert_usage_error(code, err, "reproduce", "--out ")
    assert "is a folder, where reproduce writes the file summary.md" in err


def test_no_arguments_check_the_default_out(capsys, no_run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "figures").write_text("not a folder")
    code, _, err = run_main([], capsys)
    assert_usage_error(code, err, "reproduce", "--out 'figures' exists and is not a folder")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0,
                    reason="root writes into any folder, whatever its permissions")
@pytest.mark.parametrize("below", ["", "sub/deeper"])
def test_out_in_an_unwritable_folder(below, capsys, no_run, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        out = locked / below if below else locked
        code, _, err = run_main(["reproduce", "--out", str(out)], capsys)
        assert_usage_error(code, err, "reproduce", f"--out {str(out)!r} ")
        assert "not writable" in err
        assert os.listdir(locked) == []
    finally:
        locked.chmod(0o700)


def test_out_not_writable_as_the_system_says(capsys, no_run, tmp_path, monkeypatch):
    """The same refusals where the folder's permissions cannot be relied on (run as root):
    the system's answers are replaced by a refusal."""
    def refused(folder):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(reproduce, "_probe_writable", refused)
    code, _, err = run_main(["reproduce", "--out", str(tmp_path)], capsys)
    assert_usage_error(code, err, "reproduce",
                       f"--out {str(tmp_path)!r} is not writable (Permission denied)")
    monkeypatch.setattr(reproduce.os, "access", lambda path, mode: False)
    out = tmp_path / "sub" / "deeper"
    code, _, err = run_main(["reproduce", "--out", str(out)], capsys)
    assert_usage_error(code, err, "reproduce", f"--out {str(out)!r} cannot be created: "
                       f"{str(tmp_path)!r} is not writable")


def test_memory_limit_is_known_here():
    limit, what = cli.memory_limit()
    assert limit > 10**8 and what


# --- errors found during a run, and Ctrl-C -------------------------------------------------------


def test_a_value_error_of_specjax_is_one_error_line(capsys, monkeypatch):
    def instance(seed, states, horizon):
        specjax._checks.check_positive_int("num_states", 0)  # as specjax refuses a bad input
    monkeypatch.setattr(specjax, "paper_instance", instance)
    code, _, err = run_main(["simulate", "--num-chains", "2"], capsys)
    assert code == 2
    assert err == ("python -m specjax simulate: error: num_states must be a positive integer, "
                   "got 0\n")


def test_a_value_error_from_elsewhere_is_a_bug_and_keeps_its_traceback(capsys, monkeypatch):
    def instance(seed, states, horizon):
        raise ValueError("a bug")
    monkeypatch.setattr(specjax, "paper_instance", instance)
    with pytest.raises(ValueError, match="a bug"):
        cli.main(["simulate", "--num-chains", "2"])


def test_simulate_interrupted(capsys, monkeypatch):
    def instance(seed, states, horizon):
        raise KeyboardInterrupt
    monkeypatch.setattr(specjax, "paper_instance", instance)
    code, _, err = run_main(["simulate", "--num-chains", "2"], capsys)
    assert code == 130 and err == "python -m specjax simulate: interrupted\n"


def fake_reproduction(monkeypatch, tmp_path, interrupt_at=None):
    """``reproduce.reproduce``'s real file writing with the experiments and plots replaced:
    ``summary.md``, ``summary.json`` and two figures, the second interrupted by Ctrl-C midway
    through its file if ``interrupt_at`` is its name."""
    import matplotlib.pyplot as plt

    results = {"settings": {"horizon": 8}, "figure": [1.0, 2.0],
               "convergence": {"sd": {"exact": 3.0, "mean": 3.1, "se": 0.1}, "batch": {}},
               "scaling": {"limit": 2.0}, "checks": [{"check": "c", "ok": True, "detail": ""}]}
    monkeypatch.setattr(reproduce, "run_experiments", lambda settings, bar: results)
    monkeypatch.setattr(report, "summary_markdown", lambda results, paper, z: "# summary\n")

    def plot(name):
        def draw(values):
            fig = plt.figure()

            def savefig(f, **kwargs):
                f.write(b"PNG of " + name.encode())
                if name == interrupt_at:
                    raise KeyboardInterrupt  # halfway through the file
                f.write(b", whole")
            fig.savefig = savefig
            return fig
        return draw

    figures = {}
    for name in ("fig_a.png", "fig_b.png"):
        monkeypatch.setattr(plots, f"fake_{name[:-4]}", plot(name), raising=False)
        figures[name] = ("figure", f"fake_{name[:-4]}", None)
    monkeypatch.setattr(report, "FIGURES", figures)
    monkeypatch.setattr(reproduce, "FIGURES", figures)


def temporary_files(folder):
    return [n for n in os.listdir(folder) if n.startswith(".") or n.endswith(".tmp")]


def test_reproduce_interrupted_leaves_only_whole_files_and_a_rerun_works(capsys, monkeypatch,
                                                                         tmp_path):
    out = tmp_path / "figures"
    out.mkdir()
    (out / "fig_b.png").write_bytes(b"PNG of an earlier run")
    fake_reproduction(monkeypatch, tmp_path, interrupt_at="fig_b.png")
    code, _, err = run_main(["reproduce", "--out", str(out), "--no-progress"], capsys)
    assert code == 130
    assert err == (f"python -m specjax reproduce: interrupted; {out}{os.sep} holds only whole "
                   "files (a rerun replaces them)\n")
    assert (out / "summary.md").read_text() == "# summary\n"
    assert json.loads((out / "summary.json").read_text())["figure"] == [1.0, 2.0]
    assert (out / "fig_a.png").read_bytes() == b"PNG of fig_a.png, whole"
    assert (out / "fig_b.png").read_bytes() == b"PNG of an earlier run"  # not half of the new
    assert temporary_files(out) == []
    # The rerun into the same folder replaces every file.
    fake_reproduction(monkeypatch, tmp_path)
    code, stdout, err = run_main(["reproduce", "--out", str(out), "--no-progress"], capsys)
    assert code == 0, err
    assert "wrote fig_a.png, fig_b.png, summary.md, summary.json" in stdout
    assert (out / "fig_b.png").read_bytes() == b"PNG of fig_b.png, whole"
    assert sorted(os.listdir(out)) == ["fig_a.png", "fig_b.png", "summary.json", "summary.md"]


@pytest.mark.slow
def test_ctrl_c_ends_the_program_with_one_line():
    """A real SIGINT to ``python -m specjax simulate`` while it compiles: one line, status 130,
    no traceback (and no crash of JAX's runtime at exit, which ends the process at once)."""
    args = ["-m", "specjax", "simulate", "--num-chains", "1000", "--states", "3", "--horizon",
            "4"]
    # The program, with SIGINT's default disposition (a test runner may ignore it, and a
    # child inherits that): set it, then exec (no preexec_fn: a fork of this multithreaded
    # process would warn).
    launch = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
              f"os.execv(sys.executable, [sys.executable, *{args!r}])")
    proc = subprocess.Popen([sys.executable, "-c", launch], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith("specjax ")  # started: the header
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "python -m specjax simulate: interrupted"
    assert "Traceback" not in err


def test_a_ctrl_c_that_a_callback_swallows_is_still_an_interruption():
    """SIGINT while a ``__del__`` (or JAX's garbage-collection callback) runs: Python prints
    "Exception ignored" and loses the KeyboardInterrupt. The program's handler records it, so
    the run still ends as interrupted, and the lost exception is not printed (a CI run under load
    once saw exit status 0 this way)."""
    script = textwrap.dedent("""
        import os, signal, sys, time
        from specjax import cli
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a runner may ignore SIGINT
        record = cli.catch_lost_interrupts()

        class Swallows:
            def __del__(self):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)  # the handler runs here, inside __del__

        Swallows()  # collected at once: its KeyboardInterrupt is unraisable
        print("went on", len(record))
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "went on 1"
    assert "Exception ignored" not in out.stderr and "Traceback" not in out.stderr


def test_lost_interrupt_handler_leaves_an_ignored_sigint_alone():
    script = ("import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); "
              "from specjax import cli; cli.catch_lost_interrupts(); "
              "print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)")
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.strip() == "True", out.stderr


# --- atomic writes -------------------------------------------------------------------------------


def test_atomic_write_writes_whole_files(tmp_path):
    path = tmp_path / "summary.md"
    report.write_text(path, "first ± 1\n")
    assert path.read_text(encoding="utf-8") == "first ± 1\n"
    report.write_text(path, "second\n")
    assert path.read_text() == "second\n"
    with report.atomic_write(tmp_path / "image.png", binary=True) as f:
        f.write(b"\x89PNG")
    assert (tmp_path / "image.png").read_bytes() == b"\x89PNG"
    assert sorted(os.listdir(tmp_path)) == ["image.png", "summary.md"]
    # The permissions of a plain open(): 0o666 less the umask (not mkstemp's 0o600).
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_atomic_write_interrupted_leaves_the_old_file(error, tmp_path):
    path = tmp_path / "summary.json"
    path.write_text('{"old": 1}')
    with pytest.raises(error), report.atomic_write(path) as f:
        f.write('{"new": ')
        raise error
    assert path.read_text() == '{"old": 1}'
    assert os.listdir(tmp_path) == ["summary.json"]
    with pytest.raises(error), report.atomic_write(tmp_path / "absent.md") as f:
        f.write("half")
        raise error
    assert os.listdir(tmp_path) == ["summary.json"]
