"""Beyond one machine: ``decode``, ``decoding_statistics`` and ``record`` under ``jax.distributed``.

Two CPU processes on this machine (JAX's CPU collectives with gloo) join one coordinator on a
free local port and run on the global mesh of their devices (``distributed_check.py``); their
tokens and counts, gathered, must equal one process's, and each process must hold its own half
of the chains. The processes run with a deadline and are killed on any failure, so the suite
never hangs on them.
"""

import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

import specjax
from conftest import read_archive
from specjax.sampling import sharding as _sharding

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import distributed_check  # noqa: E402  (tests/ on the path)

NUM_PROCESSES = 2
DEADLINE_S = 240  # both start-ups and compilations on a loaded 2-core machine; normally ~15 s


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(out_dir: pathlib.Path) -> list[pathlib.Path]:
    """Runs the two processes; returns their output files. Kills both (their process groups)
    when one fails or the deadline passes, and fails with their output."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = " ".join(flag for flag in env.get("XLA_FLAGS", "").split()
                                if "host_platform_device_count" not in flag)  # 1 device each
    env["PYTHONPATH"] = os.pathsep.join(
        [str(HERE), str(HERE.parent)] + env.get("PYTHONPATH", "").split(os.pathsep))
    port = free_port()
    outs = [out_dir / f"process{i}.npz" for i in range(NUM_PROCESSES)]
    logs = [open(out_dir / f"process{i}.log", "w+") for i in range(NUM_PROCESSES)]
    procs = [subprocess.Popen([sys.executable, str(HERE / "distributed_check.py"), str(port),
                               str(i), str(outs[i])], env=env, stdout=log,
                              stderr=subprocess.STDOUT, start_new_session=True)
             for i, log in enumerate(logs)]
    deadline = time.monotonic() + DEADLINE_S
    try:
        while any(p.poll() is None for p in procs):
            failed = any(p.returncode not in (None, 0) for p in procs)
            if failed or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    texts = []
    for log in logs:
        log.seek(0)
        texts.append(log.read())
        log.close()
    report = "\n".join(f"--- process {i} (exit {p.returncode}):\n{text[-3000:]}"
                       for i, (p, text) in enumerate(zip(procs, texts)))
    if all(p.returncode == 0 for p in procs):
        return outs
    raise PortTaken(report) if "ddress already in use" in report else AssertionError(report)


class PortTaken(AssertionError):
    """The free port was taken by another program before the coordinator bound it."""


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    try:
        outs = launch(tmp_path_factory.mktemp("distributed"))
    except PortTaken:  # a race with another program, not a failure of the run: once more
        outs = launch(tmp_path_factory.mktemp("distributed"))
    return [read_archive(path) for path in outs]


@pytest.mark.slow  # two more JAX processes start and compile (about 15 s on the loaded machine)
@pytest.mark.skipif(sys.platform == "win32", reason="process groups")
def test_two_processes_give_one_process_tokens_and_counts(two_processes):
    """``decode``, ``decoding_statistics`` (3 chunks, the last padded) and ``record`` on a mesh
    over two processes: every result, gathered on either process, equals one process's (tokens,
    flags and counts exactly; the recorded probabilities too, as they are read off the same
    rows); each process held its own half of the chains. In the subprocesses: a key
    that differs between the processes is refused with a ValueError, and saving a recording
    spread over them says to gather it first."""
    expected = distributed_check.flatten(*distributed_check.run(None))
    half = distributed_check.NUM_CHAINS // 2
    for i, got in enumerate(two_processes):
        assert set(got) == set(expected) | {"local_tokens"}
        for name, value in expected.items():
            np.testing.assert_array_equal(got[name], value, err_msg=f"process {i}: {name}")
        np.testing.assert_array_equal(got["local_tokens"],
                                      expected["trace.tokens"][i * half:(i + 1) * half])
    assert expected["stats.final_token_counts"].sum() == distributed_check.NUM_CHAINS


def test_one_process_helpers():
    """On one process nothing communicates: one process, all devices local, the key check a
    no-op (also for a raw uint32 key), and the memory check's device is this process's."""
    sharding = specjax.chain_sharding()
    assert _sharding.num_processes(sharding) == _sharding.num_processes(None) == 1
    assert _sharding.local_share(sharding) == _sharding.local_share(None) == 1.0
    assert _sharding.local_device(sharding) in jax.local_devices()
    assert _sharding.local_device(None) == jax.devices()[0]
    _sharding.check_same_key(jax.random.key(0), sharding)
    _sharding.check_same_key(jax.random.PRNGKey(0), sharding)
