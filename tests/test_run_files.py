"""Run files that last: checkpoints kept (last k + best), one run per folder (the lock), an
earlier run's files untouched until the new run writes, write errors (a real full tmpfs where
mounting is allowed, a real EFBIG under RLIMIT_FSIZE, a simulated EIO), signals.

The writer tests use `ResultWriter` with made-up results and a small numpy state (no JAX
compile). The signal and lock tests are CLI subprocesses sharing one persistent compile cache
and one stop criterion (the same executable), run side by side.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from flax import serialization

from jaxplan import cli
from jaxplan.results import FolderInUse, ResultWriter, WriteError, read_checkpoint
from jaxplan.runner import Runner

NAN = float("nan")


def state_of(i: int, size: int = 64) -> dict:
    """A made-up run state for chunk `i` (random bytes: msgpack keeps their size)."""
    return {
        "w": np.random.default_rng(i).standard_normal(size).astype(np.float32),
        "n": np.int64(i),
    }


def row(seed: int, it: int, reward: float) -> dict:
    return {"seed": seed, "training_iteration": it, "episode_reward_mean": reward}


def chunks(writer, rewards: dict[int, list[float]], first: int = 1, size: int = 64) -> None:
    """One chunk per iteration; `rewards[seed][k]` is that seed's reward at chunk k."""
    seeds = sorted(rewards)
    for k in range(len(rewards[seeds[0]])):
        it = first + k
        writer.write_chunk([row(s, it, rewards[s][k]) for s in seeds], seeds, state_of(it, size))


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under `directory` (relative path -> bytes)."""
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def lines(path: Path) -> list[dict]:
    text = path.read_text()
    assert text == "" or text.endswith("\n"), "last line cut"
    return [json.loads(line) for line in text.splitlines()]


# ---- checkpoints kept ------------------------------------------------------------------------
def test_last_k_and_best_checkpoints(tmp_path):
    writer = ResultWriter(tmp_path, {"seeds": [0, 1]}, keep_checkpoints=2)
    # seed means per chunk: nan (seed 1 no episode), 15, 35, nan, 25, 30 -> best is chunk 3
    chunks(writer, {0: [10, 10, 30, NAN, 20, 30], 1: [NAN, 20, 40, 50, 30, 30]})
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "best.msgpack",
        "iter_000005.msgpack",
        "iter_000006.msgpack",
    ]
    best = read_checkpoint(tmp_path, "best")
    assert best["training_iteration"] == 3 and best["episode_reward_mean"] == 35.0
    np.testing.assert_array_equal(best["state"]["w"], state_of(3)["w"])
    latest = read_checkpoint(tmp_path)
    assert latest["training_iteration"] == 6 and latest["episode_reward_mean"] == 30.0
    assert latest["best"] == {"training_iteration": 3, "episode_reward_mean": 35.0}
    np.testing.assert_array_equal(read_checkpoint(tmp_path, 5)["state"]["w"], state_of(5)["w"])
    with pytest.raises(ValueError, match=r"no checkpoint 4 in .* \(kept: latest, best, 5, 6\)"):
        read_checkpoint(tmp_path, 4)
    assert [r["training_iteration"] for r in lines(tmp_path / "result.jsonl")] == [
        i for i in range(1, 7) for _ in (0, 1)
    ]
    writer.close()
    # killed between a chunk's lines and its checkpoint, in the middle of a line: resume
    # drops what is after the checkpoint's rows
    with open(tmp_path / "result.jsonl", "a") as f:
        f.write(json.dumps(row(0, 7, 1.0)) + '\n{"seed": 1, "train')
    # a resumed writer goes on from the checkpoint's best: 34 < 35 is no new best, 36 is
    writer = ResultWriter(tmp_path, {"seeds": [0, 1]}, resume=latest, keep_checkpoints=2)
    chunks(writer, {0: [34], 1: [34]}, first=7)
    assert read_checkpoint(tmp_path, "best")["training_iteration"] == 3
    chunks(writer, {0: [36], 1: [36]}, first=8)
    assert read_checkpoint(tmp_path, "best")["training_iteration"] == 8
    assert sorted(k for k in read_checkpoint(tmp_path)["latest"]) == ["0", "1"]
    rows = lines(tmp_path / "result.jsonl")
    assert [(r["training_iteration"], r["seed"]) for r in rows] == [
        (i, s) for i in range(1, 9) for s in (0, 1)
    ]
    assert rows[12]["episode_reward_mean"] == 34


def test_nan_is_never_best_and_zero_keeps_latest_only(tmp_path):
    writer = ResultWriter(tmp_path, {"seeds": [0]}, keep_checkpoints=0)
    chunks(writer, {0: [NAN, NAN]})
    assert list((tmp_path / "checkpoints").iterdir()) == []  # no finite reward yet: no best
    chunks(writer, {0: [5.0, NAN]}, first=3)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["best.msgpack"]
    assert read_checkpoint(tmp_path, "best")["training_iteration"] == 3
    assert read_checkpoint(tmp_path)["training_iteration"] == 4


# ---- one run per folder ------------------------------------------------------------------------
def test_second_writer_is_refused_and_a_dead_lock_does_not_block(tmp_path):
    first = ResultWriter(tmp_path, {})
    with pytest.raises(
        FolderInUse,
        match=rf"{tmp_path} is in use by another run \(pid "
        rf"{os.getpid()}, holding .lock\)",
    ):
        ResultWriter(tmp_path, {})
    first.close()
    assert not (tmp_path / ".lock").exists()
    # a process that took the lock and was killed leaves .lock behind: it does not block
    code = (
        "import sys, time; from pathlib import Path; from jaxplan.results import RunLock; "
        "lock = RunLock(Path(sys.argv[1])); print('locked', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "locked"
    with pytest.raises(FolderInUse, match=f"pid {proc.pid}"):
        ResultWriter(tmp_path, {})
    proc.kill()
    proc.wait(timeout=10)
    assert (tmp_path / ".lock").read_text().strip() == str(proc.pid)
    ResultWriter(tmp_path, {}).close()


# ---- an earlier run's files ------------------------------------------------------------------
def earlier_run(directory: Path) -> None:
    writer = ResultWriter(directory, {"run": "earlier"}, keep_checkpoints=1)
    chunks(writer, {0: [1.0, 2.0]})
    writer.close()
    (directory / "params.1.json").write_text('{"run": "older"}\n')  # an even older run's


def test_nothing_is_touched_until_the_first_chunk(tmp_path):
    earlier_run(tmp_path)
    before = snapshot(tmp_path)
    ResultWriter(tmp_path, {"run": "new"}).close()  # stopped before its first chunk
    assert snapshot(tmp_path) == before and not (tmp_path / ".lock").exists()
    missing = tmp_path / "a" / "b"
    ResultWriter(missing, {}).close()  # a folder it created and never wrote is removed
    assert not (tmp_path / "a").exists()

    writer = ResultWriter(tmp_path, {"run": "new"})
    chunks(writer, {0: [3.0]})
    # the earlier run's files, all with the first number free for every one of them: 2
    kept = {str(new.relative_to(tmp_path)) for _, new in writer.kept}
    assert kept == {"params.2.json", "result.2.jsonl", "checkpoint.2.msgpack", "checkpoints.2"}
    after = snapshot(tmp_path)
    for name, data in before.items():
        moved = (
            name.replace("params.json", "params.2.json")
            .replace("result.jsonl", "result.2.jsonl")
            .replace("checkpoint.msgpack", "checkpoint.2.msgpack")
            .replace("checkpoints/", "checkpoints.2/")
        )
        assert after[moved] == data, name
    assert json.loads(after["params.json"]) == {"run": "new"}
    assert len(lines(tmp_path / "result.jsonl")) == 1


@pytest.mark.parametrize("error", [KeyboardInterrupt, ValueError], ids=["interrupt", "failure"])
def test_cli_stopped_before_its_first_iteration_leaves_the_folder(
    tmp_path, monkeypatch, capsys, error
):
    earlier_run(tmp_path)
    before = snapshot(tmp_path)

    def compile_fails(self):
        raise error("compile failed")

    monkeypatch.setattr(Runner, "_compile", compile_fails)  # fails inside compile()
    argv = ["train", "ppo", "--stop-iters", "2", "--output", str(tmp_path), "--quiet"]
    assert cli.main(argv) == (130 if error is KeyboardInterrupt else 2)
    assert snapshot(tmp_path) == before and not (tmp_path / ".lock").exists()
    assert "kept the previous" not in capsys.readouterr().out


# ---- write errors ----------------------------------------------------------------------------
def assert_whole(directory: Path, killed_pid: int | None = None) -> list[dict]:
    """Every line parses, the latest checkpoint is the last line's (or, after SIGKILL between
    the two, an earlier one: resume drops the rows after it), no temporary file (after SIGKILL,
    only the killed writer's own `.NAME.PID.tmp`, which the next run in the folder removes)."""
    rows = lines(directory / "result.jsonl")
    latest = read_checkpoint(directory)
    size = (directory / "result.jsonl").stat().st_size
    temporaries = [p.name for p in directory.rglob("*") if p.name.endswith(".tmp")]
    if killed_pid is not None:
        assert latest["training_iteration"] <= rows[-1]["training_iteration"]
        assert latest["result_bytes"] <= size
        assert [t for t in temporaries if not t.endswith(f".{killed_pid}.tmp")] == []
    else:
        assert latest["training_iteration"] == rows[-1]["training_iteration"]
        assert latest["result_bytes"] == size
        assert temporaries == []
    return rows


def test_failed_checkpoint_rolls_back_the_chunk(tmp_path, monkeypatch):
    writer = ResultWriter(tmp_path, {}, keep_checkpoints=2)
    chunks(writer, {0: [1.0, 2.0]})
    real_fsync = os.fsync

    def fsync(fd):  # the checkpoint's temporary file cannot be made durable
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".tmp"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(WriteError) as err:
        chunks(writer, {0: [3.0]}, first=3)
    assert str(err.value) == (
        f"cannot write {tmp_path}/checkpoints/iter_000003.msgpack: Input/output error (EIO)"
    )
    monkeypatch.undo()
    rows = assert_whole(tmp_path)
    assert [r["training_iteration"] for r in rows] == [1, 2]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "best.msgpack",
        "iter_000001.msgpack",
        "iter_000002.msgpack",
    ]


def test_full_disk_keeps_every_file_whole(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()})")
    writer = None
    try:
        writer = ResultWriter(disk / "run", {}, keep_checkpoints=3)
        with pytest.raises(WriteError, match="No space left on device") as err:
            # 80 kB states; the best (chunk 1, no later reward beats it) stays besides the
            # last 3: the 4th chunk's checkpoint does not fit in 300 kB
            for it in range(1, 100):
                writer.write_chunk([row(0, it, 1.0)], [0], state_of(it, 20_000))
        assert err.value.errno == errno.ENOSPC and str(disk) in str(err.value)
        rows = assert_whole(disk / "run")
        assert [r["training_iteration"] for r in rows] == [1, 2, 3]
        last = read_checkpoint(disk / "run")
        np.testing.assert_array_equal(last["state"]["w"], state_of(3, 20_000)["w"])
        assert read_checkpoint(disk / "run", "best")["training_iteration"] == 1
    finally:
        if writer is not None:
            writer.close()
        subprocess.run(["umount", "-l", str(disk)], check=True)


# ---- CLI runs: signals, two runs on one folder, EFBIG --------------------------------------
TINY = [
    "--config",
    "train_batch_size=128",
    "--config",
    "model.fcnet_hiddens=[8]",
    "--config",
    "num_sgd_iter=1",
    "--report-every",
    "2",
    "--quiet",
]
FOREVER = ["--stop-iters", "1000000"]  # one stop for every run: one executable, cached


EFBIG_LIMIT = 12_000
"""The EFBIG run's files may not grow past 12 kB (result.jsonl does after ~10 rows): a write
past it fails with EFBIG (SIGXFSZ ignored, as a shell's `ulimit -f` with the signal trapped)."""
LIMITED = (
    "import resource, runpy, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
    f"resource.setrlimit(resource.RLIMIT_FSIZE, ({EFBIG_LIMIT}, {EFBIG_LIMIT})); "
    "sys.argv[0] = 'jaxplan'; runpy.run_module('jaxplan.cli', run_name='__main__')"
)


class Cli:
    def __init__(self, env: dict, directory: Path, resume: bool = False, limited: bool = False):
        self.directory = directory
        where = ["--resume", str(directory)] if resume else ["--output", str(directory)]
        if limited:  # result.jsonl alone reaches the file-size limit (not a bigger event file)
            where += ["--loggers", "json"]
        python = [sys.executable, *(["-c", LIMITED] if limited else ["-m", "jaxplan.cli"])]
        self.proc = subprocess.Popen(
            [*python, "train", "ppo", *TINY, *FOREVER, *where],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def rows(self) -> int:
        path = self.directory / "result.jsonl"
        return len(path.read_bytes().splitlines()) if path.exists() else 0

    def wait_rows(self, n: int, timeout: float = 240) -> None:
        t0 = time.monotonic()
        while self.rows() < n:
            if self.proc.poll() is not None:
                raise AssertionError(f"exited {self.proc.returncode}: {self.proc.stderr.read()}")
            assert time.monotonic() - t0 < timeout, "no results in time"
            time.sleep(0.05)

    def stop(self, sig: int) -> tuple[int, str]:
        self.proc.send_signal(sig)
        _, err = self.proc.communicate(timeout=60)
        return self.proc.returncode, err


WALL_CLOCK = ("time_this_iter_s", "time_total_s", "num_env_steps_sampled_throughput_per_sec")


def plain(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in WALL_CLOCK} for r in rows]


def test_signals_lock_and_efbig_keep_files_whole_and_resumable(tmp_path):
    env = {**os.environ, "JAXPLAN_CACHE_DIR": str(tmp_path / "cache"), "JAX_PLATFORMS": "cpu"}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    a = Cli(env, tmp_path / "int")
    a.wait_rows(1)  # compiled (and cached for the others)
    (tmp_path / "term").mkdir()
    (tmp_path / "term" / "notes.txt").write_text("mine\n")  # a user's file: kept as it is
    runs = {
        "int": a,
        "term": Cli(env, tmp_path / "term"),
        "kill": Cli(env, tmp_path / "kill"),
        "efbig": Cli(env, tmp_path / "efbig", limited=True),
    }
    # a second run on a busy folder is refused before it compiles or prints anything, naming
    # the folder and the holder
    second = subprocess.run(
        [
            sys.executable,
            "-m",
            "jaxplan.cli",
            "train",
            "ppo",
            *TINY,
            *FOREVER,
            "--output",
            str(a.directory),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert second.returncode == 2, second.stderr
    assert second.stderr == (
        f"jaxplan: error: {a.directory} is in use by another run "
        f"(pid {a.proc.pid}, holding .lock); wait for it to end or write "
        "to another folder\n"
    )
    assert second.stdout == "" and a.proc.poll() is None
    assert a.stop(signal.SIGINT) == (130, "jaxplan: interrupted\n")
    for name, sig in (("term", signal.SIGTERM), ("kill", signal.SIGKILL)):
        # SIGTERM waits for the chunk (2 rows) and its checkpoint; SIGKILL does not: the 2nd
        # chunk's rows are written after the 1st chunk's checkpoint, so one checkpoint exists
        runs[name].wait_rows(2 if sig == signal.SIGTERM else 4)
        code, err = runs[name].stop(sig)
        assert (code, err) == (
            (143, "jaxplan: terminated (SIGTERM); the files written are whole\n")
            if sig == signal.SIGTERM
            else (-9, "")
        ), err
    _, err = runs["efbig"].proc.communicate(timeout=240)  # stops itself: the file is full
    assert runs["efbig"].proc.returncode == 1, err
    assert err == (
        f"jaxplan: error: cannot write {tmp_path}/efbig/result.jsonl: File too large (EFBIG)\n"
    )
    assert (tmp_path / "kill" / ".lock").exists()  # SIGKILL left it: it must not block
    killed = {"kill": runs["kill"].proc.pid}
    before = {name: assert_whole(tmp_path / name, killed.get(name)) for name in runs}
    assert (tmp_path / "efbig" / "result.jsonl").stat().st_size <= EFBIG_LIMIT
    # every run resumes from its checkpoint and goes on; all four are one computation
    resumed = {name: Cli(env, tmp_path / name, resume=True) for name in before}
    for name, run in resumed.items():
        run.wait_rows(len(before[name]) + 2)
        assert run.stop(signal.SIGINT)[0] == 130
    after = {name: plain(assert_whole(tmp_path / name)) for name in before}
    longest = max(after.values(), key=len)
    for name, rows in after.items():
        assert rows[: len(before[name])] == plain(before[name])  # earlier rows untouched
        assert [r["training_iteration"] for r in rows] == list(range(1, len(rows) + 1))
        assert rows == longest[: len(rows)], name  # bitwise the rows of one uninterrupted run
    assert (tmp_path / "term" / "notes.txt").read_text() == "mine\n"
    ckpt = serialization.msgpack_restore((tmp_path / "kill" / "checkpoint.msgpack").read_bytes())
    assert ckpt["training_iteration"] == after["kill"][-1]["training_iteration"]


class _SignalInDel:
    """Raises SIGINT from `__del__`: Python ignores the KeyboardInterrupt raised there, as it
    does one raised inside any callback it calls itself (gc callbacks such as XLA's)."""

    def __del__(self):
        signal.raise_signal(signal.SIGINT)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_ctrl_c_that_python_swallowed_still_stops_the_run(tmp_path, monkeypatch, capsys):
    printed = []
    real = cli._print_results

    def print_results(*args, **kwargs):
        real(*args, **kwargs)
        printed.append(1)
        if len(printed) == 1:
            _SignalInDel()  # dropped at once: its KeyboardInterrupt is ignored

    monkeypatch.setattr(cli, "_print_results", print_results)
    argv = ["train", "ppo", *TINY, "--stop-iters", "8", "--output", str(tmp_path / "run")]
    assert cli.main(argv) == 130
    assert "jaxplan: interrupted" in capsys.readouterr().err
    assert len(printed) == 1 and len(lines(tmp_path / "run" / "result.jsonl")) == 2


# ---- multi-process resume --------------------------------------------------------------------
def two_processes(env: dict, argv: list[str]) -> None:
    """One CLI run as 2 processes x 2 CPU devices (jax.distributed on 127.0.0.1, gloo)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "jaxplan.cli", "train", "ppo", *argv]
            + ["--coordinator-address", f"127.0.0.1:{port}", "--num-processes", "2"]
            + ["--process-id", str(i)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]


def test_two_processes_resume_bitwise(tmp_path):
    """2 processes x 4 iterations, against the same 2 processes resumed from that run's kept
    iteration-2 checkpoint (the folder a 2-iteration run leaves: its checkpoint, its rows)."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join(sys.path))
    env.pop("JAX_COORDINATOR_ADDRESS", None)
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    argv = [*TINY, "--config", "sgd_minibatch_size=32", "--no-compile-cache", "--seed", "5"]
    two_processes(env, [*argv, "--stop-iters", "4", "--output", str(whole)])
    shutil.copytree(whole, resumed)
    at_2 = read_checkpoint(resumed, 2)
    shutil.copy(at_2["path"], resumed / "checkpoint.msgpack")
    os.truncate(resumed / "result.jsonl", at_2["result_bytes"])
    assert len(lines(resumed / "result.jsonl")) == 2
    two_processes(env, [*TINY, "--resume", str(resumed), "--stop-iters", "4"])
    rows = plain(assert_whole(resumed))
    assert [r["training_iteration"] for r in rows] == [1, 2, 3, 4]
    assert rows == plain(lines(whole / "result.jsonl"))
