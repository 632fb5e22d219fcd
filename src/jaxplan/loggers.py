"""Where each host result goes: RLlib's `logger_config` spirit (json, csv, tensorboard) plus
your own loggers (`Runner(loggers=[...])`, `jaxplan train --loggers json,csv,tensorboard`).

A logger is an object with `on_result(result)` and, optionally, `flush()` (called after each
chunk) and `close()` (when the run ends; it may be called again after a later chunk), or a
plain callable taking the result. `result` is one host result dict per seed per iteration
(`plan.report` plus `seed`, time and throughput keys), RLlib's nested keys, NaN as a float:
exactly what `result.jsonl` holds (where NaN/inf is null). The Runner calls the loggers in the
writing process only (process 0 of a multi-process run), after the chunk's lines and
checkpoint are written, so a logger that raises (`LoggerError`) leaves the run files whole.

Built in, by name, in the run folder `DIR`:

- `"json"`: `DIR/result.jsonl`, one strict-JSON line per result. It is `ResultWriter`'s file,
  written and rolled back together with the chunk's checkpoint (what `--resume` relies on), so
  it is a switch of the writer (`results_file`), not a logger object.
- `"csv"`: `DIR/progress.csv` (`CsvLogger`), RLlib/Tune's `progress.csv`.
- `"tensorboard"`: `DIR/tb/seed_S/events.out.tfevents.*` (`TensorBoardLogger`); view with
  `tensorboard --logdir DIR/tb` (one TensorBoard run per seed).

Key paths: nested keys joined by `/` (`info/learner/default_policy/learner_stats/cur_lr`),
the CSV column and the TensorBoard tag alike (Tune's `ray/tune/` prefix is not added). Lists
(`hist_stats`, `info/actor_group_versions/...`) are only in `result.jsonl`.
"""

from __future__ import annotations

import csv
import io
import math
import numbers
import os
import socket
import struct
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from jaxplan.checkpoint import write_bytes
from jaxplan.results import WriteError, append_bytes

LOGGER_NAMES = ("json", "csv", "tensorboard")
"""The built-in loggers, by name."""
DEFAULT_LOGGERS = LOGGER_NAMES
"""What a run with an output folder writes unless told otherwise (CLI and Runner)."""


@runtime_checkable
class Logger(Protocol):
    """Receives each host result; `flush()` and `close()` are optional."""

    def on_result(self, result: dict) -> None: ...


class LoggerError(RuntimeError):
    """A logger raised: names the logger, the seed and the iteration (the cause chained)."""


def check_names(names: Iterable[str]) -> list[str]:
    """The built-in logger names, in order without repeats; `ValueError` naming the valid ones
    for any other."""
    out = []
    for name in names:
        if name not in LOGGER_NAMES:
            raise ValueError(f"unknown logger {name!r}; valid: {', '.join(LOGGER_NAMES)}")
        if name not in out:
            out.append(name)
    return out


def flatten(result: dict, prefix: str = "") -> dict[str, Any]:
    """`{"info": {"num_steps_sampled": 128}}` -> `{"info/num_steps_sampled": 128}`: every
    leaf under its key path, in the dict's order."""
    out: dict[str, Any] = {}
    for key, value in result.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, path + "/"))
        else:
            out[path] = value
    return out


def _number(x: Any) -> float | int | None:
    """A numeric leaf as a Python number (bools as 0/1); None for anything else."""
    if hasattr(x, "item") and getattr(x, "shape", None) == ():  # numpy / jax scalars
        x = x.item()
    if isinstance(x, bool):
        return int(x)
    if isinstance(x, numbers.Integral):
        return int(x)
    if isinstance(x, numbers.Real):
        return float(x)
    return None


def scalars(result: dict) -> dict[str, float]:
    """The finite numeric leaves of `result` by key path (what TensorBoard gets): NaN/inf
    (no episode finished yet) and non-numeric leaves are left out."""
    out = {}
    for path, value in flatten(result).items():
        x = _number(value)
        if x is not None and math.isfinite(x):
            out[path] = float(x)
    return out


def _cell(value: Any) -> str | None:
    """A CSV cell: numbers exactly (`repr` of the float, as JSON writes them), NaN/inf and None
    as an empty cell (`null` in result.jsonl), strings as they are; None (no column) for lists
    and other non-scalars."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    x = _number(value)
    if x is None:
        return None
    if isinstance(x, float) and not math.isfinite(x):
        return ""
    return repr(x)


def csv_row(result: dict) -> dict[str, str]:
    """One `progress.csv` row: the result's scalar leaves by key path, as strings."""
    row = {}
    for path, value in flatten(result).items():
        cell = _cell(value)
        if cell is not None:
            row[path] = cell
    return row


def _csv_text(fields: list[str], rows: Iterable[dict[str, str]], header: bool) -> bytes:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields, restval="", lineterminator="\n")
    if header:
        writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue().encode()


class CsvLogger:
    """`progress.csv` at `path`: a header of key paths, one row per result (a `seed` column
    among them), appended per chunk with one fsynced write (truncated back on failure).

    The header is the first row's keys; keys that appear later (`evaluation/...` on the first
    evaluation iteration) extend it: the file is then rewritten whole with the wider header
    (atomically: temporary file and rename), earlier rows with empty cells there. An empty cell
    is a missing key, or NaN/inf (`null` in result.jsonl); pandas reads both as NaN.

    `history` (a resumed run): a function returning the run's results up to its checkpoint;
    the file is rebuilt from them at the first flush, so rows written after the checkpoint (a
    run killed in between) are dropped and none is missing. Without it an existing file is
    appended to (under its header).
    """

    def __init__(self, path: str | os.PathLike, history: Callable[[], list[dict]] | None = None):
        self.path = Path(path)
        self._history = history
        self._fields: list[str] | None = None
        self._pending: list[dict[str, str]] = []
        self._started = False

    def on_result(self, result: dict) -> None:
        self._pending.append(csv_row(result))

    def flush(self) -> None:
        if not self._pending:  # nothing is touched before the first rows
            return
        if not self._started:
            self._start()
        rows, self._pending = self._pending, []
        fields = list(self._fields or [])
        for row in rows:
            fields += [k for k in row if k not in fields]
        if self._fields is None or len(fields) > len(self._fields):
            self._rewrite(fields, [*self._read_rows(), *rows])
        else:
            append_bytes(self.path, _csv_text(fields, rows, header=False))

    def close(self) -> None:
        self.flush()

    def _start(self) -> None:
        self._started = True
        if self._history is not None:
            rows = [csv_row(r) for r in self._history()]
            fields: list[str] = []
            for row in rows:
                fields += [k for k in row if k not in fields]
            self._rewrite(fields, rows)
        elif self.path.exists():
            with open(self.path, newline="") as f:
                self._fields = next(csv.reader(f), None)

    def _read_rows(self) -> list[dict[str, str]]:
        if self._fields is None or not self.path.exists():
            return []
        with open(self.path, newline="") as f:
            return [{k: v or "" for k, v in r.items() if k is not None} for r in csv.DictReader(f)]

    def _rewrite(self, fields: list[str], rows: list[dict[str, str]]) -> None:
        data = _csv_text(fields, rows, header=True) if fields else b""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_bytes(self.path, data)
        except OSError as e:
            raise WriteError(self.path, e) from None
        self._fields = fields or None


class TensorBoardLogger:
    """TensorBoard event files in `directory/seed_S/` (one TensorBoard run per seed): per
    result one event at step `timesteps_total` holding every finite numeric leaf as a
    float64 scalar tagged by its key path (`episode_reward_mean`,
    `info/learner/default_policy/learner_stats/cur_lr`). NaN/inf are left out (a gap in the
    curve: no episode finished yet), and so are strings and lists.

    Written synchronously (no writer thread: a full disk is a `WriteError` now, not a lost
    thread), per chunk with one fsynced append, truncated back on failure. Each run (each
    `Runner` start or resume) writes a new event file; with `resume` the first event of each
    seed's file is TensorBoard's purge marker at that seed's first new step, so events of an
    earlier file from that step on (written after the checkpoint by a run killed in between)
    are hidden by TensorBoard. tensorboardX supplies the protobuf classes and the record CRC.
    """

    def __init__(self, directory: str | os.PathLike, resume: bool = False):
        from tensorboardX.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2
        from tensorboardX.record_writer import masked_crc32c

        self._pb = event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2
        self._crc = masked_crc32c
        self.directory = Path(directory)
        self.resume = resume
        self.files: dict[int, Path] = {}  # seed -> this run's event file
        self._pending: dict[int, list[bytes]] = {}

    def _record(self, event) -> bytes:
        """One TFRecord: length, its masked CRC32C, the serialized event, its masked CRC."""
        data = event.SerializeToString()
        header = struct.pack("<Q", len(data))
        return (
            header
            + struct.pack("<I", self._crc(header))
            + data
            + struct.pack("<I", self._crc(data))
        )

    def on_result(self, result: dict) -> None:
        event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2 = self._pb
        seed = int(result.get("seed", 0))
        step = int(result.get("timesteps_total", result.get("training_iteration", 0)))
        records = self._pending.setdefault(seed, [])
        if seed not in self.files and not records:
            records.append(
                self._record(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))
            )
            if self.resume:
                start = event_pb2.SessionLog(status=event_pb2.SessionLog.START)
                records.append(
                    self._record(
                        event_pb2.Event(step=step, session_log=start, wall_time=time.time())
                    )
                )
        meta = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars")
        )
        values = [
            summary_pb2.Summary.Value(
                tag=tag,
                metadata=meta,
                tensor=tensor_pb2.TensorProto(
                    dtype=2,  # DT_DOUBLE
                    double_val=[value],
                    tensor_shape=tensor_shape_pb2.TensorShapeProto(),
                ),
            )
            for tag, value in scalars(result).items()
        ]
        event = event_pb2.Event(
            wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=values)
        )
        records.append(self._record(event))

    def flush(self) -> None:
        for seed, records in list(self._pending.items()):
            if not records:
                continue
            path = self.files.get(seed) or self._new_file(seed)
            append_bytes(path, b"".join(records))
            self.files[seed] = path
            self._pending[seed] = []

    def close(self) -> None:
        """Flushes; the next result starts a new event file (per seed)."""
        self.flush()
        self.files = {}

    def _new_file(self, seed: int) -> Path:
        folder = self.directory / f"seed_{seed}"
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise WriteError(folder, e) from None
        stem = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}"
        n = 0
        while True:  # a new file per run, never an earlier one (same second, same pid)
            path = folder / f"{stem}.{n}"
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
                return path
            except FileExistsError:
                n += 1
            except OSError as e:
                raise WriteError(path, e) from None


class CallbackLogger:
    """A plain function as a logger: `fn(result)` for each result."""

    def __init__(self, fn: Callable[[dict], Any]):
        self.fn = fn

    def on_result(self, result: dict) -> None:
        self.fn(result)

    def __repr__(self) -> str:
        return getattr(self.fn, "__qualname__", repr(self.fn))


def as_logger(item: Any) -> Any:
    """A `Logger` object as it is, a callable wrapped in `CallbackLogger`; else `TypeError`."""
    if isinstance(item, Logger):
        return item
    if callable(item):
        return CallbackLogger(item)
    raise TypeError(
        f"a logger is a name ({', '.join(LOGGER_NAMES)}), an object with on_result(result) "
        f"or a callable taking the result, got {item!r}"
    )


def describe(logger: Any) -> str:
    return repr(logger) if isinstance(logger, CallbackLogger) else type(logger).__name__


def log_chunk(loggers: list, results: list[dict]) -> None:
    """Each logger gets every result of the chunk, then its `flush()`. A `WriteError` passes
    through; any other exception becomes `LoggerError` naming the logger and the result."""
    for logger in loggers:
        r = None
        try:
            for r in results:
                logger.on_result(r)
            r = None
            if hasattr(logger, "flush"):
                logger.flush()
        except WriteError:
            raise
        except Exception as e:  # noqa: BLE001 - a user's logger: say which, keep the cause
            where = (
                f" on seed {r.get('seed')}, iteration {r.get('training_iteration')}"
                if isinstance(r, dict)
                else " in flush()"
            )
            raise LoggerError(
                f"logger {describe(logger)} failed{where}: {type(e).__name__}: {e} (the run's "
                "files are whole up to this chunk)"
            ) from e


def close_all(loggers: list) -> None:
    """Calls each logger's `close()`; every one is closed, the first error raised after (a
    `WriteError` as it is, anything else as `LoggerError`)."""
    errors = []
    for logger in loggers:
        if hasattr(logger, "close"):
            try:
                logger.close()
            except Exception as e:  # noqa: BLE001 - a user's logger: say which
                errors.append((logger, e))
    if errors:
        logger, e = errors[0]
        if isinstance(e, WriteError):
            raise e
        raise LoggerError(
            f"logger {describe(logger)} failed in close(): {type(e).__name__}: {e}"
        ) from e
