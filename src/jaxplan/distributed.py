"""Multi-process (multi-host) runs: start-up through `jax.distributed`, the checks and rules
that keep processes in step, and what happens when a process is missing or lost.

Every process runs the same program on its own devices; the plan's mesh spans the devices of
all processes (`num_devices=-1`). Randomness needs no per-process seed: each actor group draws
from the shared key folded with its *global* group index, so processes never share a stream
and a run does not depend on how its devices are spread over processes (2 processes x 2
devices compute what 1 process x 4 devices does). Only process 0 writes results and
checkpoints (`is_writer`).

Faults, with `timeout_s` (the CLI's `--distributed-timeout`, default 60 s) as the one bound;
every failure below is one line on stderr, `jaxplan: error: ...`, and exit status 1:

- Start-up. Before `jax.distributed` starts, process 0 listens on the coordinator's port and
  every other process says hello there (its id, the process count, the jaxplan version).
  Process 0 waits `timeout_s` for all of them, then fails naming who is missing (`process 1 of
  2 did not join the coordinator at 10.0.0.1:1234 within 60 s`); the processes that did join
  fail with the same line. A process that reaches nothing for `timeout_s` says so (`process 1
  of 2: nothing answered at 10.0.0.1:1234 within 60 s (process 0 not started, or listening on
  another address or port)`). A duplicate id, another process count or another version is
  refused at once. These waits are Python socket calls: Ctrl-C ends them at once (exit 130).
- `jax.distributed.initialize` then runs in a helper thread (the main thread stays
  interruptible) and must connect within `timeout_s`. Its own C++ bounds (initialization,
  heartbeat and shutdown timeouts) are set to `2 * timeout_s + 10` s, a backstop that the
  checks here come before.
- During the run a watch (two daemon threads per process) beats a counter in the
  coordinator's key-value store every `min(1, timeout_s / 4)` s. Process 0 reports a process
  whose counter stood still for `timeout_s` (killed, hung, stopped, unreachable) and tells the
  others; the others report process 0 when its counter stands still, or the store does not
  answer, for `timeout_s`: `process 1 of 2 was lost: no sign of life for 60 s (killed, hung or
  unreachable)`, within `timeout_s` + 2 beats (measured 5.6-7.5 s for 4-5 s on a loaded
  machine). A killed peer is found sooner, at the next collective (its sockets close; measured
  1.6-2.3 s): `failure_message` turns that error into `process 1 of 2 was lost mid-run (a
  collective with it failed: ...)`. The survivor exits at once (`os._exit`: no shutdown
  barrier waiting for the dead). Only process 0 writes files; stopped this way it stops as a
  SIGKILL would, between whole writes (lines appended whole, checkpoints replaced
  atomically), so its files stay whole.
- When process 0 itself dies, the survivors' C++ runtime aborts on its own (the coordinator's
  socket closed: `F... client.h:80] Terminating process ...`), racing our line; those C++
  lines may come before our line, never after it (stderr goes to /dev/null once our line is
  written), and the exit status may be 134 when the abort wins. When process 0 stops for its
  own reasons (an error, Ctrl-C, a lost peer) it first tells the others (`process 0 of 2
  stopped (exit status 2); stopping too`) and waits up to `2 * beat + 1` s for them to leave.
- `leave(code)` ends a process: 0 marks it done (peers do not report a process that finished
  and waits in jax's shutdown barrier), anything else exits at once; an uncaught traceback
  exits at once with status 1.
"""

from __future__ import annotations

import atexit
import hashlib
import math
import os
import socket
import sys
import threading
import time
from collections.abc import Mapping

import jax
import numpy as np

ENV_VARS = {
    "coordinator_address": "JAX_COORDINATOR_ADDRESS",
    "num_processes": "JAX_NUM_PROCESSES",
    "process_id": "JAX_PROCESS_ID",
}


def resolve_settings(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict | None:
    """The `jax.distributed.initialize` arguments from explicit values, else the environment
    variables `JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES`, `JAX_PROCESS_ID`; None when
    none of them is set (a single-process run). Raises `ValueError` naming what is missing or
    malformed."""
    environ = os.environ if environ is None else environ
    given = {
        "coordinator_address": coordinator_address,
        "num_processes": num_processes,
        "process_id": process_id,
    }
    for name, var in ENV_VARS.items():
        if given[name] is None and environ.get(var):
            given[name] = environ[var]
    if all(v is None for v in given.values()):
        return None
    missing = [
        f"{n} (--{n.replace('_', '-')} or {ENV_VARS[n]})" for n, v in given.items() if v is None
    ]
    if missing:
        raise ValueError(
            "a multi-process run needs all three settings; missing: " + ", ".join(missing)
        )
    address = str(given["coordinator_address"])
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"coordinator address {address!r}: expected HOST:PORT, e.g. 10.0.0.1:1234")
    try:
        n, i = int(given["num_processes"]), int(given["process_id"])
    except ValueError:
        raise ValueError(
            f"num_processes {given['num_processes']!r} and process_id {given['process_id']!r} "
            "must be integers"
        ) from None
    if n < 1 or not 0 <= i < n:
        raise ValueError(f"process_id must be in [0, num_processes={n}), got {i}")
    return {"coordinator_address": address, "num_processes": n, "process_id": i}


DEFAULT_TIMEOUT_S = 60.0
EXIT_LOST = 1
"""Exit status of a process whose run lost (or never had) one of its processes."""

_HELLO = "jaxplan-hello"
_KEY = "jaxplan/"  # the watch's keys in the coordinator's key-value store


_COLLECTIVE_FAILURES = ("gloo", "connection reset", "connection closed", "socket closed")
"""Words of the runtime errors that a lost peer's closed sockets raise in a collective."""


class DistributedError(RuntimeError):
    """A process of a multi-process run is missing, lost or refused (a one-line message)."""


def initialize(settings: dict | None, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """Starts `jax.distributed` (before any other JAX call) when `settings` is not None:
    waits up to `timeout_s` for every process, connects, and starts the watch that reports a
    lost process (module docstring). Returns whether this is a multi-process run. Raises
    `DistributedError` naming the missing processes, `ValueError` for a bad `timeout_s`."""
    if settings is None:
        return False
    if not (isinstance(timeout_s, int | float) and math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(
            f"distributed timeout must be a positive number of seconds, got {timeout_s}"
        )
    address, n, me = (
        settings["coordinator_address"],
        settings["num_processes"],
        settings["process_id"],
    )
    host, _, port = address.rpartition(":")
    if n > 1:
        if me == 0:
            _gather(int(port), n, timeout_s, address)
        else:
            _join(host.strip("[]"), int(port), n, me, timeout_s, address)
    _connect(settings, timeout_s)
    if n > 1:
        from jax._src import distributed as jax_distributed

        _STATE.watch = _Watch(jax_distributed.global_state.client, me, n, timeout_s)
        _STATE.excepthook, sys.excepthook = sys.excepthook, _excepthook
        atexit.register(_at_exit)  # runs before jax's own exit handler (the shutdown barrier)
    return jax.process_count() > 1


def failure_message(error: BaseException) -> str | None:
    """The one line to print for `error` when it is a `DistributedError`, or a failed
    collective of a multi-process run (a lost peer's closed sockets); else None. Names the lost
    process (with 2 processes, the other one; else the watch's finding, waited for up to the
    timeout). Once this returned a line the watch prints nothing more."""
    if isinstance(error, DistributedError):
        return str(error)
    watch = _STATE.watch
    text = str(error).strip()
    collective = any(word in text.lower() for word in _COLLECTIVE_FAILURES)
    if watch is None or watch.stopped.is_set() or not collective:
        return None
    first = text.splitlines()[0] if text else type(error).__name__
    lost = [1 - watch.me] if watch.n == 2 else watch.wait_for_lost()
    if not _REPORT.acquire(blocking=False):  # the watch is already reporting
        time.sleep(3600)
    watch.lost = lost
    what = _processes(lost, watch.n) if lost else f"a process of {watch.n}"
    return f"{what} was lost mid-run (a collective with it failed: {first})"


def stop(line: str, code: int) -> int:
    """Prints `line` on stderr and returns `code`; in a started multi-process run, exits at
    once instead (`leave`), with `line` as the last line of stderr."""
    if _STATE.watch is None and not _STATE.connecting:
        print(line, file=sys.stderr)
        return code
    _exit(code, line)


def leave(code: int) -> int:
    """Ends this process's part of a multi-process run: code 0 marks it done (the others do not
    report it while it waits in jax's shutdown barrier) and returns 0; any other code exits at
    once with it (`os._exit`, skipping the barrier that would wait for lost processes)."""
    if _STATE.watch is None and not _STATE.connecting:
        return code
    if code == 0:
        _finish()
        return 0
    _exit(code)


def _exit(code: int, line: str | None = None):
    """Exits at once with `code`, `line` (if any) the last line on stderr: the C++ runtime's
    own lines (the abort of a process whose coordinator died) go to /dev/null from here on.
    Process 0 (whose exit closes the coordinator) first tells the others and gives them up to
    `2 * interval + 1` s to leave."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - exiting anyway
            pass
    try:
        err = os.dup(2)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        if line is not None:
            os.write(err, (line + "\n").encode())
    except OSError:
        pass
    if _STATE.watch is not None:
        _STATE.watch.leave(code)
    os._exit(code)


class _State:
    watch: _Watch | None = None
    connecting: bool = False
    crashed: bool = False
    excepthook = None


_STATE = _State()
_REPORT = threading.Lock()  # held by whoever prints the one line about a lost process


def _processes(ids: list[int], n: int) -> str:
    return (
        f"process {ids[0]} of {n}"
        if len(ids) == 1
        else (f"processes {', '.join(map(str, ids))} of {n}")
    )


def _send(conn: socket.socket, line: str) -> None:
    try:
        conn.sendall((line + "\n").encode())
    except OSError:
        pass


def _read_line(conn: socket.socket, timeout_s: float) -> str | None:
    """One line from `conn` within `timeout_s` (None on timeout, EOF or a socket error)."""
    deadline, data = time.monotonic() + timeout_s, b""
    while b"\n" not in data and len(data) < 1024:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        conn.settimeout(min(left, 0.5))
        try:
            chunk = conn.recv(256)
        except TimeoutError:
            continue
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk
    return data.partition(b"\n")[0].decode(errors="replace")


def _listen(port: int, n: int) -> socket.socket:
    try:
        if socket.has_dualstack_ipv6():
            return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
        return socket.create_server(("", port))
    except OSError as e:
        raise DistributedError(
            f"process 0 of {n}: cannot listen on port {port} for the other processes "
            f"({e.strerror}); pick a free port for --coordinator-address"
        ) from None


def _gather(port: int, n: int, timeout_s: float, address: str) -> None:
    """Process 0: waits up to `timeout_s` for the hello of processes 1..n-1 on `port`."""
    from jaxplan import __version__

    server = _listen(port, n)
    joined: dict[int, socket.socket] = {}
    deadline = time.monotonic() + timeout_s
    print(
        f"jaxplan: process 0 of {n}: waiting up to {timeout_s:g} s for the other processes "
        f"at {address}",
        file=sys.stderr,
        flush=True,
    )
    try:
        while len(joined) < n - 1:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = [p for p in range(1, n) if p not in joined]
                for conn in joined.values():
                    _send(conn, "missing " + " ".join(map(str, missing)))
                raise DistributedError(_missing(missing, n, address, timeout_s))
            server.settimeout(min(left, 0.25))
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            words = (_read_line(conn, 2.0) or "").split()
            refusal = _refusal(words, n, joined, __version__)
            if refusal:
                _send(conn, "refused " + refusal)
                conn.close()
                continue
            joined[int(words[3])] = conn
        for conn in joined.values():
            _send(conn, "go")
        for conn in joined.values():  # they close first: the port stays free for jax's service
            _read_line(conn, 2.0)
    finally:
        for conn in joined.values():
            conn.close()
        server.close()


def _refusal(words: list[str], n: int, joined: dict, version: str) -> str | None:
    """Why process 0 refuses the hello `words` (`jaxplan-hello VERSION N ID`), or None."""
    if len(words) != 4 or words[0] != _HELLO or not words[2].isdigit() or not words[3].isdigit():
        return "not a jaxplan process (bad hello)"
    their_n, pid = int(words[2]), int(words[3])
    if words[1] != version:
        return f"process {pid} runs jaxplan {words[1]}, process 0 runs {version}"
    if their_n != n:
        return f"process {pid} was started with {their_n} processes, process 0 with {n}"
    if not 1 <= pid < n or pid in joined:
        return f"process id {pid} is taken or out of range for {n} processes"
    return None


def _missing(missing: list[int], n: int, address: str, timeout_s: float) -> str:
    return (
        f"{_processes(missing, n)} did not join the coordinator at {address} within {timeout_s:g} s"
    )


def _join(host: str, port: int, n: int, me: int, timeout_s: float, address: str) -> None:
    """Process `me` > 0: says hello to process 0 (retrying for `timeout_s`), waits for go."""
    from jaxplan import __version__

    deadline = time.monotonic() + timeout_s
    print(
        f"jaxplan: process {me} of {n}: joining the coordinator at {address} "
        f"(up to {timeout_s:g} s)",
        file=sys.stderr,
        flush=True,
    )
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise DistributedError(
                f"process {me} of {n}: nothing answered at {address} within {timeout_s:g} s "
                "(process 0 not started, or listening on another address or port)"
            )
        try:
            conn = socket.create_connection((host, port), timeout=min(left, 1.0))
            break
        except OSError:
            time.sleep(min(0.2, max(left, 0)))
    with conn:
        _send(conn, f"{_HELLO} {__version__} {n} {me}")
        reply = _read_line(conn, timeout_s + 5.0) or ""
    if reply == "go":
        return
    if reply.startswith("missing "):
        missing = [int(w) for w in reply.split()[1:] if w.isdigit()]
        raise DistributedError(_missing(missing, n, address, timeout_s))
    if reply.startswith("refused "):
        raise DistributedError(f"process {me} of {n}: refused by process 0: {reply[8:]}")
    raise DistributedError(
        f"process {me} of {n}: no jaxplan coordinator answered at {address} "
        "(another program on that port, or process 0 stopped)"
    )


def _connect(settings: dict, timeout_s: float) -> None:
    """`jax.distributed.initialize` in a helper thread, so that the main thread can time out
    and stays interruptible; its own C++ timeouts are the backstop `2 * timeout_s + 10`."""
    backstop = int(2 * timeout_s + 10)
    done, failure = threading.Event(), []

    def connect():
        try:
            jax.distributed.initialize(
                **settings,
                initialization_timeout=backstop,
                heartbeat_timeout_seconds=backstop,
                shutdown_timeout_seconds=backstop,
            )
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            failure.append(e)
        finally:
            done.set()

    _STATE.connecting = True
    threading.Thread(target=connect, name="jaxplan-connect", daemon=True).start()
    if not done.wait(timeout_s):
        raise DistributedError(
            f"process {settings['process_id']} of {settings['num_processes']}: "
            f"jax.distributed did not connect to {settings['coordinator_address']} "
            f"within {timeout_s:g} s"
        )
    if failure:
        first = (str(failure[0]).strip().splitlines() or [type(failure[0]).__name__])[0]
        raise DistributedError(f"jax.distributed.initialize failed: {first}")


class _Watch:
    """Beats a counter in the coordinator's key-value store and watches the others' (module
    docstring); prints the one line and exits when a process is lost."""

    def __init__(self, client, me: int, n: int, timeout_s: float):
        self.client, self.me, self.n, self.timeout_s = client, me, n, timeout_s
        self.interval = min(1.0, timeout_s / 4)
        self.watched = list(range(1, n)) if me == 0 else [0]
        now = time.monotonic()
        self.seen = {p: (None, now) for p in self.watched}  # last counter, when it last moved
        self.last_ok = now
        self.lost: list[int] = []
        self.stopped = threading.Event()
        for target in (self._beat, self._judge):
            threading.Thread(target=target, name="jaxplan-watch", daemon=True).start()

    def _get(self, key: str) -> str | None:
        try:
            return self.client.key_value_try_get(_KEY + key)
        except Exception:  # noqa: BLE001 - not set (yet)
            return None

    def _beat(self) -> None:
        count = 0
        while not self.stopped.wait(self.interval):
            try:
                count += 1
                self.client.key_value_set(f"{_KEY}beat/{self.me}", str(count), True)
                now, stale = time.monotonic(), []
                stop = self._get("stop") if self.me != 0 else None
                if stop and stop.startswith("lost "):
                    self._report([int(p) for p in stop.split()[1].split(",")])
                elif stop:
                    self._say(f"process 0 of {self.n} stopped ({stop}); stopping too")
                for p in self.watched:
                    value = self._get(f"beat/{p}")
                    if value != self.seen[p][0]:
                        self.seen[p] = (value, now)
                    elif now - self.seen[p][1] > self.timeout_s and self._get(f"done/{p}") is None:
                        stale.append(p)
                self.last_ok = now
            except Exception:  # noqa: BLE001 - the store does not answer: `_judge` decides
                continue
            if stale and not self.stopped.is_set():
                if self.me == 0:  # tell the others
                    self._set("stop", "lost " + ",".join(map(str, stale)))
                self._report(stale)

    def _judge(self) -> None:
        while not self.stopped.wait(self.interval):
            if time.monotonic() - self.last_ok > self.timeout_s:
                self._report([0] if self.me != 0 else [])

    def _report(self, lost: list[int]) -> None:
        self.lost = lost
        what = _processes(lost, self.n) if lost else f"a process of {self.n}"
        self._say(
            f"{what} was lost: no sign of life for {self.timeout_s:g} s "
            "(killed, hung or unreachable)"
        )

    def _say(self, message: str) -> None:
        """Prints the one line and exits (unless this process finished, or already reports)."""
        if self.stopped.is_set() or not _REPORT.acquire(blocking=False):
            return
        _exit(EXIT_LOST, f"jaxplan: error: {message}")

    def _set(self, key: str, value: str) -> None:
        try:
            self.client.key_value_set(_KEY + key, value, True)
        except Exception:  # noqa: BLE001 - the coordinator may be gone already
            pass

    def leave(self, code: int) -> None:
        """Before an exit with `code`: marks this process gone; process 0 also says why, then
        waits (up to `2 * interval + 1` s) until every other process is gone or lost."""
        if self.stopped.is_set():
            return
        self.stopped.set()
        if self.me != 0:  # in a thread: a hung coordinator must not hold the exit up
            thread = threading.Thread(target=self._set, args=(f"left/{self.me}", "1"))
            thread.start()
            thread.join(0.2)
            return
        if not self.lost:
            self._set("stop", f"exit status {code}")
        deadline = time.monotonic() + 2 * self.interval + 1.0
        waiting = [p for p in self.watched if p not in self.lost]
        while waiting and time.monotonic() < deadline:
            waiting = [p for p in waiting if not (self._get(f"left/{p}") or self._get(f"done/{p}"))]
            time.sleep(0.05)

    def wait_for_lost(self) -> list[int]:
        """The lost processes once the watch finds them (up to its timeout), else []."""
        deadline = time.monotonic() + self.timeout_s + 2 * self.interval
        while not self.lost and time.monotonic() < deadline:
            time.sleep(self.interval / 2)
        return self.lost

    def finish(self) -> None:
        """Marks this process done and stops watching."""
        if self.stopped.is_set():
            return
        self.stopped.set()
        try:
            self.client.key_value_set(f"{_KEY}done/{self.me}", "1", True)
        except Exception:  # noqa: BLE001 - the coordinator may be gone already
            pass


def _finish() -> None:
    if _STATE.watch is not None:
        _STATE.watch.finish()


def _excepthook(kind, value, tb) -> None:
    _STATE.crashed = True
    _STATE.excepthook(kind, value, tb)


def _at_exit() -> None:
    """A traceback exits at once (status 1; the others report this process lost); a normal
    exit is marked done before jax's shutdown barrier."""
    if _STATE.crashed:
        _exit(1)
    _finish()


def is_writer() -> bool:
    """Whether this process writes results and checkpoints (process 0)."""
    return jax.process_index() == 0


def _digest(x: np.ndarray) -> int:
    return int.from_bytes(
        hashlib.blake2b(np.ascontiguousarray(x).tobytes(), digest_size=4).digest()
    )


def check_replicated(tree, what: str = "params") -> None:
    """Raises `RuntimeError` unless every replica of every leaf of `tree` is bitwise identical,
    on each of this process's devices and (via an all-gather of digests) on every process.
    Host-side and cheap for policy-sized trees; call it between compiled chunks."""
    paths, leaves = zip(*jax.tree_util.tree_flatten_with_path(tree)[0], strict=True)
    local = []
    for path, leaf in zip(paths, leaves, strict=True):
        shards = getattr(leaf, "addressable_shards", None)
        values = [np.asarray(s.data) for s in shards] if shards else [np.asarray(leaf)]
        digests = {_digest(v) for v in values}
        if len(digests) > 1:
            raise RuntimeError(
                f"{what}{jax.tree_util.keystr(path)} differs between this process's devices "
                f"(process {jax.process_index()})"
            )
        local.append(digests.pop())
    if jax.process_count() == 1:
        return
    from jax.experimental import multihost_utils

    mine = np.asarray(local, np.uint32).view(np.int32)
    every = np.asarray(multihost_utils.process_allgather(mine))  # [processes, leaves]
    for j, path in enumerate(paths):
        if len(set(every[:, j].tolist())) > 1:
            raise RuntimeError(
                f"{what}{jax.tree_util.keystr(path)} differs between processes "
                f"(digests by process: {every[:, j].tolist()})"
            )
