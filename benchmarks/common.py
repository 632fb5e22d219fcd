"""Shared helpers for the jaxplan benchmarks: timing, AOT compilation, results files, tables.

Every timing here waits for the device (`jax.block_until_ready`), and compilation is measured
ahead of time (`jax.jit(f).lower(*args).compile()`), so compile time and execution time are
reported separately and never mixed.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import socket
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax

RESULTS_DIR = Path(__file__).resolve().parent / "results"


# ---- timing -------------------------------------------------------------------------------
def timed(fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    """`fn(*args)` and its wall time in seconds, waiting for every output array."""
    t0 = time.perf_counter()
    out = fn(*args)
    jax.block_until_ready(out)
    return out, time.perf_counter() - t0


@dataclass
class Compiled:
    """An AOT-compiled function with how long tracing+lowering and XLA compilation took."""

    fn: Any  # jax.stages.Compiled
    lower_s: float
    compile_s: float

    @property
    def total_s(self) -> float:
        return self.lower_s + self.compile_s

    def memory_bytes(self) -> int | None:
        """The program's memory by XLA's buffer assignment (arguments + outputs + temporaries,
        less outputs aliased to donated arguments): what one execution needs on its device
        (host memory on the CPU), independent of the machine's load; None if the backend does
        not report it."""
        try:
            m = self.fn.memory_analysis()
        except Exception:  # noqa: BLE001 - optional on some backends
            return None
        if m is None:
            return None
        total = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
        return int(total - m.alias_size_in_bytes)

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)


def aot_compile(fn: Callable[..., Any], *args: Any, **jit_kwargs: Any) -> Compiled:
    """`jax.jit(fn, **jit_kwargs).lower(*args).compile()`, timing both phases."""
    jitted = jax.jit(fn, **jit_kwargs)
    t0 = time.perf_counter()
    lowered = jitted.lower(*args)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    return Compiled(compiled, lower_s=t1 - t0, compile_s=t2 - t1)


DEFAULT_REJAX_PYTHON = "/work/yard/.venv/bin/python"
"""The venv with rejax that `yardstick_rejax.py` and `compile_profile.py` run it from (never the
project's: rejax is not a dependency)."""


def warm_up_backend() -> None:
    """Initialises the JAX backend so that its one-time start-up cost is not billed to the
    first measured compile."""
    jax.block_until_ready(jax.numpy.zeros(()) + 1)


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def measure(
    name,
    fn,
    arg,
    runs: int,
    env_steps: int,
    extra: dict | None = None,
    compiler_options: dict | None = None,
):
    """AOT-compiles `fn(arg)` (with XLA `compiler_options`, e.g. `jaxplan.compiler_options()`)
    and runs it `runs` times. Returns the result row (compile and run seconds, median `run_s`,
    `steps_per_s = env_steps / run_s`) and the last output."""
    compiled = aot_compile(fn, arg, compiler_options=compiler_options)
    times, out = [], None
    for _ in range(runs):
        out, dt = timed(compiled, arg)
        times.append(dt)
    run_s = median(times)
    row = {
        "case": name,
        "compile_s": compiled.total_s,
        "lower_s": compiled.lower_s,
        "xla_compile_s": compiled.compile_s,
        "run_s": run_s,
        "run_s_all": times,
        "run_s_min": min(times),
        "env_steps": env_steps,
        "steps_per_s": env_steps / run_s,
        "program_bytes": compiled.memory_bytes(),
        **(extra or {}),
    }
    return row, out


# ---- environment and results files --------------------------------------------------------
def _git_commit() -> str | None:
    root = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return sha + ("-dirty" if dirty else "")


def environment() -> dict[str, Any]:
    """Where and with what a measurement was taken."""
    import jaxlib

    import jaxplan

    dev = jax.devices()[0]
    return {
        "timestamp": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "jaxplan": getattr(jaxplan, "__version__", None),
        "git": _git_commit(),
        "backend": jax.default_backend(),
        "device": f"{dev.platform}:{dev.device_kind}",
        "num_devices": jax.device_count(),
        "cpu_count": os.cpu_count(),
        "loadavg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "compilation_cache": jax.config.jax_compilation_cache_dir,
    }


def write_jsonl(name: str, records: Sequence[dict[str, Any]], results_dir: Path | None = None):
    """Appends `records` (each merged with `environment()`) to `<results_dir>/<name>.jsonl`
    and returns the path."""
    results_dir = Path(results_dir or RESULTS_DIR)
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{name}.jsonl"
    env = environment()
    with path.open("a") as f:
        for rec in records:
            f.write(json.dumps({"benchmark": name, **env, **rec}, default=_json_default) + "\n")
    return path


def _json_default(x: Any) -> Any:
    try:
        import numpy as np

        if isinstance(x, np.generic):
            return x.item()
        if isinstance(x, np.ndarray):
            return x.tolist()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(x, tuple | set):
        return list(x)
    return str(x)


# ---- printed tables -----------------------------------------------------------------------
Column = tuple[str, str, str]  # (header, key in the row dict, format spec)


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[Column]) -> str:
    """A plain-text table; missing or None values print as '-'."""

    def cell(row, key, spec):
        v = row.get(key)
        if v is None:
            return "-"
        if isinstance(v, float) and v != v:  # NaN
            return "nan"
        return format(v, spec) if spec else str(v)

    body = [[cell(r, key, spec) for _, key, spec in columns] for r in rows]
    headers = [h for h, _, _ in columns]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(headers)]

    def line(cells):
        first = cells[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join([first, *rest])

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), sep, *(line(b) for b in body)])


def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[Column]) -> None:
    print(format_table(rows, columns), flush=True)


# ---- command line -------------------------------------------------------------------------
def config_override(text: str) -> tuple[str, object]:
    """argparse type of `--config KEY=VALUE`: the value as JSON if it parses, else the text."""
    key, sep, raw = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"--config wants KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(raw)
    except json.JSONDecodeError:
        return key, raw


def add_common_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=RESULTS_DIR,
        help="where <benchmark>.jsonl is appended (default: benchmarks/results)",
    )
    parser.add_argument("--no-write", action="store_true", help="print only, write no JSON lines")
    parser.add_argument(
        "--cpu-devices",
        type=int,
        default=None,
        metavar="N",
        help="CPU devices JAX makes of the cores, which the vmapped-seed cases split their "
        "seeds over (jaxplan.seed_devices; default one per core, as `jaxplan train "
        "--num-seeds`; 1 = all seeds on one device)",
    )
    parser.add_argument(
        "--compile-cache",
        metavar="DIR",
        default=None,
        help="enable JAX's persistent compilation cache in DIR (off by default, so compile "
        "times are cold; run twice with the same DIR to measure a warm start)",
    )


def apply_common_args(args: argparse.Namespace) -> None:
    """Applies the common flags; call it before any JAX operation (the CPU device count)."""
    if getattr(args, "cpu_devices", 1) != 1:
        from jaxplan.seed_devices import use_cpu_devices  # here: rejax's worker has no jaxplan

        use_cpu_devices(args.cpu_devices)
    if args.compile_cache:
        jax.config.update("jax_compilation_cache_dir", str(args.compile_cache))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    print(describe_environment(), flush=True)


def describe_environment() -> str:
    env = environment()
    return (
        f"# jax {env['jax']} | {env['device']} x{env['num_devices']} | {env['cpu_count']} CPUs "
        f"(load {env['loadavg_1m']}) | host "
        f"{env['hostname']} | jaxplan {env['git'] or env['jaxplan']} | {env['timestamp']}"
    )
