"""Result files of a run, all in one folder (`Runner(output=DIR)`, `jaxplan train --output DIR`):

```
DIR/.lock                          held (fcntl.flock) by the run writing here; its pid inside
DIR/params.json                    the run's params: algorithm, seeds, resolved config
DIR/result.jsonl                   one strict-JSON line per iteration and seed (NaN/inf: null)
DIR/checkpoint.msgpack             the latest whole run state: what --resume reads
DIR/checkpoints/iter_000040.msgpack  the run state after the last `keep_checkpoints` chunks
DIR/checkpoints/best.msgpack       the run state with the best episode_reward_mean so far
DIR/progress.csv, DIR/tb/seed_S/   the csv and tensorboard loggers' files (`jaxplan.loggers`)
DIR/params.1.json, result.1.jsonl, checkpoint.1.msgpack, checkpoints.1/, progress.1.csv,
    tb.1/                          an earlier run's
```

A checkpoint is the whole run state (every `PlanState` leaf: policies, actor groups and env
states, stage state, episode windows, counters, key; per seed) with the run's params, the
library version, the training seconds so far, its `training_iteration` (the largest over the
seeds) and `episode_reward_mean` (the mean over the seeds of each seed's latest result; NaN
while any seed has no episode yet, and NaN is never best), so a run continues exactly
(`Runner(..., resume=True)`, `jaxplan train ... --resume DIR`). The kept checkpoints are hard
links of one file where the filesystem allows (no extra bytes). Read one with
`read_checkpoint(DIR)` (latest), `read_checkpoint(DIR, "best")` or
`read_checkpoint(DIR, 40)`; `checkpoint_paths(DIR)` lists them.

Rules that keep the files whole:
- One run per folder: a second run is refused at once, naming the holding pid; a lock left by a
  dead process does not block (the kernel releases a dead process's flock).
- Nothing of an earlier run is renamed or overwritten until the new run has its first chunk of
  results; then all of its files become `NAME.N.SUFFIX` (one free N for the whole earlier run)
  and are never overwritten. A run that stops before its first chunk leaves the folder as it
  was. A resumed run appends to the run's files instead (its `params.json` stays).
- Every file is replaced atomically (tmp + fsync + rename + directory fsync); a chunk's result
  lines are appended with one write and truncated back if the write or the chunk's checkpoint
  fails (full disk) or is interrupted (a signal), so `result.jsonl` ends with the last
  complete line and matches `checkpoint.msgpack`. Only a `SIGKILL` inside that write can leave
  a cut last line (nothing runs to truncate it): `jaxplan.plot.read_rows` skips a cut last line
  and a resume truncates the file to the checkpoint's rows. Old checkpoints are pruned only
  after the new one is whole. Rows written after the latest checkpoint (a run killed between
  the two) are dropped on resume, which writes them again, identically.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import re
import signal
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flax import serialization

from jaxplan.checkpoint import TMP_SUFFIX, fsync_dir, link_or_copy, to_bytes, write_bytes

RUN_FILES = (
    "params.json",
    "result.jsonl",
    "checkpoint.msgpack",
    "checkpoints",
    "progress.csv",
    "tb",
)
"""What a run writes (the last two: `jaxplan.loggers`); an earlier run's are kept as
`params.N.json`, ..., `checkpoints.N`, `progress.N.csv`, `tb.N`, with one N."""
_ITER = re.compile(r"iter_(\d+)\.msgpack")


def finite(x: Any) -> Any:
    """NaN/inf -> None, recursively: `episode_reward_mean` is NaN before the first episode and
    NaN is not JSON (jq and browsers reject it)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [finite(v) for v in x]
    return x


def _numbered(path: Path, n: int) -> Path:
    return path.with_name(f"{path.stem}.{n}{path.suffix}")


def keep_previous(directory: Path, names=RUN_FILES) -> list[tuple[Path, Path]]:
    """Renames the existing `names` in `directory` to `NAME.N.SUFFIX` with the first N free
    for all of them (one earlier run, one number); returns the `(old, new)` paths."""
    present = [directory / name for name in names if (directory / name).exists()]
    if not present:
        return []
    n = 1
    while any(_numbered(directory / name, n).exists() for name in names):
        n += 1
    kept = []
    for path in present:
        path.rename(_numbered(path, n))
        kept.append((path, _numbered(path, n)))
    fsync_dir(directory)
    return kept


@contextlib.contextmanager
def signals_deferred():
    """SIGINT and SIGTERM arriving inside the block are raised when it ends, so that what it
    writes is whole (in the main thread; elsewhere signals are not delivered to Python)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    names = (signal.SIGINT, signal.SIGTERM)
    old = {s: signal.signal(s, lambda signum, frame: pending.append(signum)) for s in names}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        for s in dict.fromkeys(pending):
            signal.raise_signal(s)  # the restored handler runs now (KeyboardInterrupt, ...)


class WriteError(OSError):
    """A run file could not be written (full disk, quota, permissions): one line naming the
    file and the OS error; the files already written stay whole."""

    def __init__(self, path: Path, error: OSError):
        code = errno.errorcode.get(error.errno or 0, "")
        reason = error.strerror or str(error)
        super().__init__(error.errno, f"{reason}{f' ({code})' if code else ''}", str(path))

    def __str__(self) -> str:
        return f"cannot write {self.filename}: {self.strerror}"


def append_bytes(path: Path, data: bytes) -> int:
    """Appends `data` to `path` with one write, fsynced; on an error or an interrupt the file
    is truncated back (it keeps its last whole record). Returns the file's size before.
    Raises `WriteError`."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as e:
        raise WriteError(path, e) from None
    try:
        before = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except BaseException as e:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, before)
                os.fsync(fd)
            if isinstance(e, OSError):
                raise WriteError(path, e) from None
            raise
    finally:
        os.close(fd)
    return before


class FolderInUse(ValueError):
    """Another live process is writing the run folder."""


class RunLock:
    """An exclusive `fcntl.flock` on `directory/.lock` for a run's life. Raises `FolderInUse`
    naming the folder and the holding pid when another process holds it. `release()` removes
    the file; a lock file left by a dead process is taken over (its flock died with it)."""

    def __init__(self, directory: Path):
        self.path = directory / ".lock"
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise FolderInUse(
                    f"{directory} is in use by another run (pid {holder}, holding "
                    f"{self.path.name}); wait for it to end or write to another folder"
                ) from None
            try:  # the holder may have removed the file between our open and our flock
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd: int | None = fd

    def __del__(self) -> None:
        self.release()

    @property
    def released(self) -> bool:
        return getattr(self, "_fd", None) is None

    def release(self) -> None:
        if getattr(self, "_fd", None) is None:
            return
        with contextlib.suppress(OSError):
            self.path.unlink()  # while still held: a waiting open then sees another inode
        os.close(self._fd)
        self._fd = None


class ResultWriter:
    """Writes a run's files in `directory` (layout and rules: this module's docstring).

    Creating it takes the folder's lock (raises `FolderInUse`; `OSError` when the folder cannot
    be created) and touches nothing else. `write_chunk` writes a chunk: on the first one the
    earlier run's files are kept (`kept` lists the `(old, new)` paths) and `params.json`
    written; then the result lines and the checkpoints. Write failures raise `WriteError`.
    `close()` releases the lock (and removes a folder it created, if nothing was written); a
    later write takes it again.
    With `resume` (the `read_checkpoint` of this folder) it appends to the run's files instead.
    `results_file=False` (the json logger turned off) writes no `result.jsonl` lines; params
    and checkpoints as always.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        params: dict[str, Any],
        *,
        resume: Mapping[str, Any] | None = None,
        keep_checkpoints: int = 3,
        results_file: bool = True,
    ):
        if keep_checkpoints < 0:
            raise ValueError(f"keep_checkpoints must be >= 0, got {keep_checkpoints}")
        self.directory = directory = Path(directory)
        self.path = directory / "result.jsonl"
        self.checkpoint_path = directory / "checkpoint.msgpack"
        self.checkpoints = directory / "checkpoints"
        self.params = params
        self.keep_checkpoints = keep_checkpoints
        self.results_file = results_file
        self.kept: list[tuple[Path, Path]] = []
        self._created = []
        for d in (directory, *directory.parents):
            if d.exists():
                break
            self._created.append(d)
        directory.mkdir(parents=True, exist_ok=True)
        try:
            self.lock = RunLock(directory)
        except BaseException:
            self._remove_created()
            raise
        self._started = False
        self._best = (float("nan"), None)  # (episode_reward_mean, training_iteration)
        self._result_bytes = None
        self._resuming = False
        self._latest: dict[int, tuple[int, float]] = {}
        if resume is not None:
            self.resume_from(resume)

    def resume_from(self, saved: Mapping[str, Any]) -> None:
        """Appends to the run's files from the checkpoint `saved` on (its best so far; rows
        after it are dropped at the first write)."""
        self._resuming = True
        best = saved.get("best") or {}
        self._best = (
            float(best.get("episode_reward_mean", float("nan"))),
            best.get("training_iteration"),
        )
        latest = saved.get("latest") or {}
        self._latest = {
            int(s): (int(v["training_iteration"]), float(v["episode_reward_mean"]))
            for s, v in latest.items()
        }
        self._result_bytes = saved.get("result_bytes")

    def _remove_created(self) -> None:
        for d in self._created:
            try:
                d.rmdir()
            except OSError:
                break

    def close(self) -> None:
        """Releases the lock; a folder this writer created and never wrote is removed."""
        self.lock.release()
        if not self._started:
            self._remove_created()

    def _start(self) -> None:
        """Before the first lines: the earlier run's files kept, stale temporaries removed,
        this run's params written; or, on resume, rows after the checkpoint dropped."""
        d = self.directory
        for tmp in [*d.glob(f".*{TMP_SUFFIX}"), *d.glob(f"checkpoints/.*{TMP_SUFFIX}")]:
            with contextlib.suppress(OSError):
                tmp.unlink()  # left by a killed run (we hold the lock: nobody else writes)
        if self._resuming:
            size = self.path.stat().st_size if self.path.exists() else 0
            if self._result_bytes is not None and size > self._result_bytes:
                self._guard(self.path, lambda: os.truncate(self.path, self._result_bytes))
        else:
            self.kept = self._guard(d, lambda: keep_previous(d))
            data = (json.dumps(finite(self.params), indent=2) + "\n").encode()
            self._guard(d / "params.json", lambda: write_bytes(d / "params.json", data))
        self._guard(self.checkpoints, lambda: self.checkpoints.mkdir(exist_ok=True))
        self._started = True

    @staticmethod
    def _guard(path: Path, fn):
        try:
            return fn()
        except WriteError:
            raise
        except OSError as e:
            raise WriteError(path, e) from None

    def write(self, results: list[dict]) -> int:
        """Appends one strict-JSON line per result with one write, fsynced; on an error or an
        interrupt the file is truncated back. Returns the file's size before."""
        if self.lock.released:  # closed, then written again: the folder is ours again first
            self.directory.mkdir(parents=True, exist_ok=True)
            self.lock = RunLock(self.directory)
        if not self._started:
            self._start()
        if not self.results_file:  # the json logger is off: no lines, the checkpoints still
            return self.path.stat().st_size if self.path.exists() else 0
        data = "".join(json.dumps(finite(r), allow_nan=False) + "\n" for r in results).encode()
        return append_bytes(self.path, data)

    def write_chunk(
        self, results: list[dict], seeds: list[int], state, elapsed_s: float = 0.0
    ) -> None:
        """Appends `results` (dicts with `seed`), then saves the whole run state `state`
        (host arrays, leading seed axis with several seeds) as the latest checkpoint, as
        `iter_N` (pruning to the last `keep_checkpoints`) and as `best` when its reward beats
        the best so far. When the checkpoint fails the lines are truncated back (the files stay
        in step) and `WriteError` is raised. SIGINT/SIGTERM wait until the chunk is written."""
        with signals_deferred():
            self._write_chunk(results, seeds, state, elapsed_s)

    def _write_chunk(self, results, seeds, state, elapsed_s) -> None:
        from jaxplan import __version__

        for r in results:  # each seed's latest (iteration, reward); stopped seeds keep theirs
            self._latest[int(r["seed"])] = (
                int(r["training_iteration"]),
                float(r["episode_reward_mean"]),
            )
        iteration = max(self._latest[s][0] for s in seeds)
        reward = sum(self._latest[s][1] for s in seeds) / len(seeds)  # NaN: no episode
        best_reward, best_iteration = self._best
        is_best = math.isfinite(reward) and (math.isnan(best_reward) or reward > best_reward)
        if is_best:
            best_reward, best_iteration = reward, iteration
        before = self.write(results)
        tree = {
            "jaxplan_version": __version__,
            "params": json.dumps(finite(self.params), sort_keys=True),
            "seeds": list(seeds),
            "elapsed_s": float(elapsed_s),
            "training_iteration": iteration,
            "episode_reward_mean": reward,
            "best": {"training_iteration": best_iteration, "episode_reward_mean": best_reward},
            "latest": {
                str(s): {"training_iteration": it, "episode_reward_mean": r}
                for s, (it, r) in ((s, self._latest[s]) for s in seeds)
            },
            "result_bytes": self.path.stat().st_size if self.path.exists() else 0,
            "state": state,
        }
        data = to_bytes(tree)
        it_path = self.checkpoints / f"iter_{iteration:06d}.msgpack"
        latest = self.checkpoint_path
        try:
            if self.keep_checkpoints:
                self._guard(it_path, lambda: write_bytes(it_path, data))
                self._guard(latest, lambda: link_or_copy(it_path, latest))
            else:
                self._guard(latest, lambda: write_bytes(latest, data))
        except BaseException:
            with contextlib.suppress(OSError):
                if self.results_file:
                    os.truncate(self.path, before)
            if self.keep_checkpoints:
                with contextlib.suppress(OSError):
                    it_path.unlink()
            raise
        self._best = (best_reward, best_iteration)
        if is_best:
            best = self.checkpoints / "best.msgpack"
            self._guard(best, lambda: link_or_copy(latest, best))
        iters = sorted(
            (int(m.group(1)), p)
            for p in self.checkpoints.iterdir()
            if (m := _ITER.fullmatch(p.name))
        )
        for _, old in iters[: max(len(iters) - self.keep_checkpoints, 0)]:
            self._guard(old, old.unlink)
        fsync_dir(self.checkpoints)


def checkpoint_paths(directory: str | os.PathLike) -> dict[str | int, Path]:
    """The run's checkpoints that exist: `"latest"`, `"best"` and each kept iteration (int)."""
    directory = Path(directory)
    out: dict[str | int, Path] = {}
    if (directory / "checkpoint.msgpack").is_file():
        out["latest"] = directory / "checkpoint.msgpack"
    if (directory / "checkpoints" / "best.msgpack").is_file():
        out["best"] = directory / "checkpoints" / "best.msgpack"
    if (directory / "checkpoints").is_dir():
        for p in sorted((directory / "checkpoints").iterdir()):
            if m := _ITER.fullmatch(p.name):
                out[int(m.group(1))] = p
    return out


def read_checkpoint(directory: str | os.PathLike, which: str | int = "latest") -> dict[str, Any]:
    """The raw contents of one of the run's checkpoints: `which` is `"latest"` (the one
    `--resume` reads), `"best"` (by `episode_reward_mean`) or a kept `training_iteration`.
    Keys: `jaxplan_version`, `params` (a dict), `seeds`, `elapsed_s`, `training_iteration`,
    `episode_reward_mean`, `best`, `state` (nested dicts of arrays, leading seed axis with
    several seeds: `flax.serialization.from_state_dict(plan_state, raw["state"])` makes it a
    `PlanState`). Raises `ValueError` naming the file, or the choices, when it is missing or
    not a run checkpoint."""
    directory = Path(directory)
    paths = checkpoint_paths(directory)
    if which not in paths:
        if which == "latest":
            raise ValueError(f"no checkpoint at {directory / 'checkpoint.msgpack'}")
        kept = ", ".join(str(k) for k in paths) or "none"
        raise ValueError(f"no checkpoint {which!r} in {directory} (kept: {kept})")
    path = paths[which]
    raw = serialization.msgpack_restore(path.read_bytes())
    if not isinstance(raw, dict) or not {"jaxplan_version", "params", "state"} <= set(raw):
        raise ValueError(
            f"{path}: not a whole-run checkpoint (written by an older "
            "jaxplan that kept only policies and counters)"
        )
    return {**raw, "params": json.loads(raw["params"]), "path": str(path)}


def differences(saved: Any, now: Any, prefix: str = "", defaults: Any = None) -> list[str]:
    """`key: saved -> now` for every leaf where two nested dicts differ. A key that `saved`
    lacks is compared as if it held its value in `defaults` (the same nesting; None: no
    defaults): a setting added to the library after `saved` was written, still at its
    default, is no difference."""
    if isinstance(saved, dict) and isinstance(now, dict):
        defaults = defaults if isinstance(defaults, dict) else {}
        out = []
        for key in sorted(set(saved) | set(now), key=str):
            old = saved[key] if key in saved else defaults.get(key)
            out += differences(old, now.get(key), f"{prefix}{key}.", defaults.get(key))
        return out
    return [] if saved == now else [f"{prefix[:-1]}: {saved!r} -> {now!r}"]


def with_empty_fields(target: Any, saved: Any) -> Any:
    """`saved` (a checkpoint's state dict) with the fields of `target` (this plan's) that it
    lacks added where they are empty containers (`{}`): state fields added to jaxplan after
    the checkpoint was written that this run does not use (e.g. `ActorState.policy_states`
    without recurrent policies). Any other missing field stays missing (an error on restore)."""
    if not isinstance(target, dict) or not isinstance(saved, dict):
        return saved
    out = {k: with_empty_fields(target.get(k), v) for k, v in saved.items()}
    for key, value in target.items():
        if key not in saved and isinstance(value, dict) and not value:
            out[key] = {}
    return out
