"""Faults of multi-process runs (`jaxplan.distributed`): a peer that never starts, one on
another port, Ctrl-C while waiting, a peer killed mid-run and a peer that hangs.

Each scenario is real CLI processes on 127.0.0.1 (gloo CPU collectives), all started at once
by one module fixture so that they share the wait; every wait is bounded. The hello protocol
of the start-up is also checked in-process, on plain sockets.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from jaxplan import __version__
from jaxplan.distributed import DistributedError, _gather, _join
from jaxplan.results import read_checkpoint

START_S = 3  # --distributed-timeout of the start-up scenarios
HUNG_S = 4  # --distributed-timeout of the hung-peer scenario
KILLED_S = 10  # ... of the killed-peer one (found at once, by the next collective)
TINY = {
    "num_workers": 2,
    "num_envs_per_worker": 2,
    "rollout_fragment_length": 16,
    "train_batch_size": 64,
    "sgd_minibatch_size": 16,
    "num_sgd_iter": 1,
    "model": {"fcnet_hiddens": [8]},
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Proc:
    """A CLI process whose stdout and stderr lines are collected as they come."""

    def __init__(self, port: int, pid: int, timeout_s: float, extra: list[str] = ()):
        config = [a for k, v in TINY.items() for a in ("--config", f"{k}={json.dumps(v)}")]
        cmd = [sys.executable, "-m", "jaxplan.cli", "train", "ppo", *config, "--no-compile-cache"]
        cmd += ["--coordinator-address", f"127.0.0.1:{port}", "--num-processes", "2"]
        cmd += ["--process-id", str(pid), "--distributed-timeout", str(timeout_s), *extra]
        # PYTHONFAULTHANDLER: a process that hangs past `exit`'s timeout dumps its threads'
        # Python stacks on SIGABRT, so the failure says where it hung
        env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "", "PYTHONFAULTHANDLER": "1"}
        for var in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
            env.pop(var, None)
        self.port, self.lines = port, {"out": [], "err": []}
        self.seen: dict[str, float] = {}  # line -> when it was read
        self.popen = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for name, stream in (("out", self.popen.stdout), ("err", self.popen.stderr)):
            threading.Thread(target=self._read, args=(name, stream), daemon=True).start()

    def _read(self, name, stream) -> None:
        for line in stream:
            self.seen.setdefault(line.rstrip("\n"), time.monotonic())
            self.lines[name].append(line.rstrip("\n"))

    def wait_for(self, text: str, stream: str = "err", timeout: float = 300) -> float:
        """Waits until a line of `stream` contains `text`; returns the time it was read."""
        deadline, exited = time.monotonic() + timeout, None
        while not any(text in line for line in self.lines[stream]):
            if exited is None and self.popen.poll() is not None:
                exited = time.monotonic() + 1.0  # the readers drain the pipes, then fail
            now = time.monotonic()
            assert now < deadline and (exited is None or now < exited), (text, self.lines)
            time.sleep(0.05)
        return min(t for line, t in self.seen.items() if text in line)

    def exit(self, timeout: float) -> tuple[int, float]:
        """The exit status, and when the last line of stderr was read (waits `timeout`)."""
        try:
            code = self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.popen.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack
            self.popen.wait(timeout=30)
            time.sleep(0.5)
            raise AssertionError(
                f"still running after {timeout} s; its stderr:\n" + "\n".join(self.lines["err"])
            ) from None
        time.sleep(0.2)  # the reader threads drain the pipes
        return code, self.seen.get(self.last_err, time.monotonic())

    @property
    def last_err(self) -> str:
        return self.lines["err"][-1] if self.lines["err"] else ""

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGCONT)
            self.popen.kill()
            self.popen.wait(timeout=30)


@pytest.fixture(scope="module")
def procs(tmp_path_factory):
    out = tmp_path_factory.mktemp("faults")
    p = {}
    # process 0 alone: its process 1 never starts; a process 1 sent to a port nobody listens on
    p["alone"] = _Proc(_free_port(), 0, START_S, ["--stop-iters", "1"])
    p["elsewhere"] = _Proc(_free_port(), 1, START_S, ["--stop-iters", "1"])
    p["sigint"] = _Proc(_free_port(), 0, 60, ["--stop-iters", "1"])
    run = ["--stop-iters", "100000", "--report-every", "1", "--output", str(out / "killed")]
    run += ["--print-every", "0"]  # "iter     2" is printed
    port = _free_port()
    p["killed0"], p["killed1"] = (_Proc(port, i, KILLED_S, run) for i in (0, 1))
    port = _free_port()
    hung = ["--stop-iters", "100000"]
    p["hung0"], p["hung1"] = (_Proc(port, i, HUNG_S, hung) for i in (0, 1))
    p["out"] = out
    yield p
    for proc in p.values():
        if isinstance(proc, _Proc):
            proc.kill()


def _no_trace(proc: _Proc) -> None:
    err = "\n".join(proc.lines["err"])
    assert "Traceback" not in err and "stack trace" not in err and "F1" not in err, err


def test_peer_never_starts(procs):
    proc = procs["alone"]
    t0 = proc.wait_for("waiting up to 3 s for the other processes")
    code, t1 = proc.exit(timeout=30)
    assert code == 1
    assert proc.last_err == (
        f"jaxplan: error: process 1 of 2 did not join the coordinator at 127.0.0.1:{proc.port} "
        "within 3 s"
    )
    assert START_S - 0.5 < t1 - t0 < START_S + 2
    _no_trace(proc)


def test_peer_on_another_port(procs):
    proc = procs["elsewhere"]
    t0 = proc.wait_for("joining the coordinator at")
    code, t1 = proc.exit(timeout=30)
    assert code == 1
    assert proc.last_err == (
        f"jaxplan: error: process 1 of 2: nothing answered at 127.0.0.1:{proc.port} within 3 s "
        "(process 0 not started, or listening on another address or port)"
    )
    assert START_S - 0.5 < t1 - t0 < START_S + 2
    _no_trace(proc)


def test_sigint_while_waiting_for_peers(procs):
    proc = procs["sigint"]
    proc.wait_for("waiting up to 60 s")
    time.sleep(0.5)
    t0 = time.monotonic()
    proc.popen.send_signal(signal.SIGINT)
    code, t1 = proc.exit(timeout=30)
    assert code == 130 and proc.last_err == "jaxplan: interrupted"
    assert t1 - t0 < 5
    _no_trace(proc)


def test_hung_peer_is_reported_within_the_timeout(procs):
    """Process 0 stops (SIGSTOP) after start-up, while process 1 compiles: no collective
    fails, the watch finds it: no sign of life for HUNG_S seconds."""
    p0, p1 = procs["hung0"], procs["hung1"]
    p0.wait_for("jaxplan: PPO on", stream="out", timeout=300)
    p0.popen.send_signal(signal.SIGSTOP)
    t0 = time.monotonic()
    code, t1 = p1.exit(timeout=60)
    assert code == 1, p1.lines
    assert p1.last_err == (
        "jaxplan: error: process 0 of 2 was lost: no sign of life for 4 s "
        "(killed, hung or unreachable)"
    )
    assert HUNG_S - 1 < t1 - t0 < HUNG_S + 4
    _no_trace(p1)


def test_peer_killed_mid_run(procs):
    p0, p1 = procs["killed0"], procs["killed1"]
    p0.wait_for("iter     2", stream="out", timeout=600)
    p1.popen.kill()
    t0 = time.monotonic()
    code, t1 = p0.exit(timeout=60)
    assert code == 1, p0.lines
    assert p0.last_err.startswith("jaxplan: error: process 1 of 2 was lost"), p0.lines
    assert t1 - t0 < 5  # at once: the next collective fails (the watch would take KILLED_S)
    _no_trace(p0)
    # the survivor's files are whole: every line parses, the checkpoint reads
    directory = procs["out"] / "killed"
    rows = [json.loads(line) for line in (directory / "result.jsonl").read_text().splitlines()]
    assert [r["training_iteration"] for r in rows] == list(range(1, len(rows) + 1))
    assert len(rows) >= 2
    saved = read_checkpoint(directory)  # the last chunk's (or, stopped between the two
    # writes, the one before)
    assert saved["params"]["seeds"] == [0] and saved["jaxplan_version"] == __version__
    iteration = int(saved["state"]["counters"]["training_iteration"])
    assert rows[-1]["training_iteration"] - 1 <= iteration <= rows[-1]["training_iteration"]
    assert json.loads((directory / "params.json").read_text())["seeds"] == [0]
    assert not list(directory.glob("*.tmp"))


def test_hello_names_missing_and_refuses_bad_peers():
    """In-process, on plain sockets: process 0 of 3 hears from process 1 but not 2; a second
    process 1 and a process started with another count are refused at once."""
    port, errors = _free_port(), {}

    def run(name, fn, *args):
        try:
            fn(*args)
        except DistributedError as e:
            errors[name] = str(e)

    address = f"127.0.0.1:{port}"
    threads = [threading.Thread(target=run, args=("p0", _gather, port, 3, 2.0, address))]
    threads[0].start()
    time.sleep(0.2)
    for name, n in (("p1", 3), ("dup", 3), ("other_n", 4)):
        threads.append(
            threading.Thread(target=run, args=(name, _join, "127.0.0.1", port, n, 1, 2.0, address))
        )
        threads[-1].start()
        time.sleep(0.3)  # p1 joins first
    for t in threads:
        t.join(timeout=15)
    missing = f"process 2 of 3 did not join the coordinator at {address} within 2 s"
    assert errors["p0"] == missing and errors["p1"] == missing
    assert errors["dup"] == (
        "process 1 of 3: refused by process 0: process id 1 is taken or out of range for 3 "
        "processes"
    )
    assert errors["other_n"] == (
        "process 1 of 4: refused by process 0: process 1 was started with 4 processes, "
        "process 0 with 3"
    )


def test_distributed_timeout_flag_is_checked(capsys):
    from jaxplan.cli import main

    for bad in ("0", "nan", "-1"):
        assert main(["train", "ppo", "--distributed-timeout", bad]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--distributed-timeout" in err, err
        assert f"expected a positive number of seconds, got {bad}" in err, err
