"""Where the cold compile of the fixed-work PPO program goes: jaxplan against rejax, by phase.

Each round compiles the program once per library in a fresh process (`_compile_child.py`),
rejax first, then jaxplan, and reads the phases from the process and from XLA's own CPU
compiler log (`TF_CPP_VMODULE=cpu_compiler=1`):

  trace     Python tracing to a jaxpr (`jit(...).trace`)
  lower     jaxpr -> StableHLO (`.lower()`)
  hlo       XLA's HLO passes (XLA's "Running HLO passes" time)
  emit      kernel emission: each fusion lowered to an LLVM module (from "Compiling: <module>"
            to the first "Running LLVM verifier" line)
  llvm      LLVM's optimization and code generation of those modules, and the linking (from
            there to "Compilation finished"); emit and llvm use both cores
  xla       the XLA compile's wall time (`.compile()`), and xla_cpu its process CPU seconds
  total     trace + lower + xla: what `yardstick_rejax.py` reports as compile_s
  kernels   LLVM modules XLA compiled (its verifier runs; one per distinct kernel)

With `--kernels` one more compile per library dumps the program (XLA_FLAGS --xla_dump_to) and
counts its kernels by loop depth: 0 the entry (initialisation), 1 the loop over iterations, 2
and deeper the loops inside it (rollout steps, SGD epochs, minibatches).

rejax runs in its own venv as in yardstick_rejax.py (`--rejax-python`; without it, jaxplan
only). `--baseline DIR` adds a third library, `baseline`: the jaxplan of another checkout
(`DIR/src`, its own `benchmarks/_compile_child.py`, this venv's packages) compiled in the same
rounds, for a before/after of a change side by side (`git worktree add /tmp/base HEAD~1`).
Medians over `--rounds`; the ratio is jaxplan / rejax (and jaxplan / baseline). The log lines
are XLA's (jaxlib 0.10); a phase that cannot be read is reported as missing, not guessed.

    python benchmarks/compile_profile.py                  # ~1 min on 2 CPUs
    python benchmarks/compile_profile.py --rounds 5 --kernels
    python benchmarks/compile_profile.py --rounds 5 --baseline /tmp/base
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from common import DEFAULT_REJAX_PYTHON, add_common_args, median, print_table, write_jsonl

HERE = Path(__file__).resolve().parent
CHILD = HERE / "_compile_child.py"
PHASES = ("trace_s", "lower_s", "hlo_s", "emit_s", "llvm_s", "xla_s", "xla_cpu_s", "total_s")

_STAMP = re.compile(r"^[IWEF]\d{4} (\d\d):(\d\d):(\d\d\.\d+)\s+\S+\s+\S+\] (.*)$")
_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def _seconds(text: str) -> float | None:
    m = re.match(r"([\d.]+) (us|ms|s)\b", text)
    return float(m[1]) * _UNITS[m[2]] if m else None


def xla_phases(log: str, module: str) -> dict[str, float | int | None]:
    """XLA's CPU compile phases of `module` from its log (`TF_CPP_VMODULE=cpu_compiler=1`):
    hlo_s, emit_s, llvm_s (seconds; None when a line is missing) and kernels (the LLVM
    verifier's runs between "Compiling: <module>" and "Compilation finished")."""
    hlo = start = first_verify = end = None
    kernels = 0
    for line in log.splitlines():
        m = _STAMP.match(line)
        if not m:
            continue
        t = int(m[1]) * 3600 + int(m[2]) * 60 + float(m[3])
        msg = m[4]
        if msg.startswith(f"Running HLO passes on [{module}]"):
            hlo = _seconds(msg.split(" time: ", 1)[1]) if " time: " in msg else None
        elif msg.strip() == f"Compiling: {module}":
            start, first_verify, end, kernels = t, None, None, 0
        elif start is not None and end is None and "Running LLVM verifier" in msg:
            kernels += 1
            first_verify = t if first_verify is None else first_verify
        elif start is not None and end is None and msg.startswith("Compilation finished"):
            end = t
    emit = first_verify - start if start is not None and first_verify is not None else None
    llvm = end - first_verify if end is not None and first_verify is not None else None
    return {"hlo_s": hlo, "emit_s": emit, "llvm_s": llvm, "kernels": kernels or None}


def run_child(
    python: str, library: str, steps: int, dump: str | None = None, checkout: Path | None = None
) -> dict:
    """One cold compile in a fresh process; `checkout`: the jaxplan of that tree (its `src`
    and `benchmarks` first on the path) instead of the installed one."""
    bench = HERE if checkout is None else checkout / "benchmarks"
    cmd = [python, str(bench / CHILD.name), f"--library={library}", f"--steps={steps}"]
    if dump:
        cmd.append(f"--dump={dump}")
    path = str(bench) if checkout is None else f"{checkout / 'src'}{os.pathsep}{bench}"
    env = {**os.environ, "PYTHONPATH": path, "TF_CPP_MIN_LOG_LEVEL": "0"}
    env["TF_CPP_VMODULE"] = "cpu_compiler=1"
    env.pop("VIRTUAL_ENV", None)
    proc = subprocess.run(cmd, cwd=bench, env=env, capture_output=True, text=True)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("COMPILE_CHILD ")]
    if proc.returncode != 0 or not lines:
        tail = "\n".join(proc.stderr.splitlines()[-15:])
        raise RuntimeError(f"{library} compile failed ({proc.returncode}): {cmd}\n{tail}")
    row = json.loads(lines[-1].split(" ", 1)[1])
    row.update(xla_phases(proc.stderr, row["module"]))  # with `dump`, slowed by the dumping
    row["total_s"] = row["trace_s"] + row["lower_s"] + row["xla_s"]
    return row


def summarize(records: list[dict], libraries: list[str]) -> list[dict]:
    """One row per phase: each library's median over the rounds (`median_<library>`),
    jaxplan / rejax (`ratio`) and jaxplan / baseline (`ratio_baseline`)."""
    out = []
    for key in (*PHASES, "kernels"):
        row = {"phase": key.removesuffix("_s")}
        for lib in libraries:
            vals = [r[key] for r in records if r["library"] == lib and r.get(key) is not None]
            row[f"median_{lib}"] = median(vals) if vals else None
        rejax, jaxplan = row.get("median_rejax"), row.get("median_jaxplan")
        if rejax and jaxplan is not None:
            row["ratio"] = jaxplan / rejax
        baseline = row.get("median_baseline")
        if baseline and jaxplan is not None:
            row["ratio_baseline"] = jaxplan / baseline
        out.append(row)
    return out


def _shown(value: float | None, phase: str) -> str | None:
    if value is None:
        return None
    return f"{value:.0f}" if phase == "kernels" else f"{value:.2f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=500_000, help="env steps per seed")
    parser.add_argument("--rounds", type=int, default=3, help="compiles per library")
    parser.add_argument("--kernels", action="store_true", help="also count kernels by depth")
    parser.add_argument(
        "--rejax-python",
        default=DEFAULT_REJAX_PYTHON,
        help=f"Python of the venv that has rejax (default {DEFAULT_REJAX_PYTHON}; "
        "missing: jaxplan only)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        metavar="DIR",
        help="also compile the jaxplan of this checkout (a git worktree of an earlier commit)",
    )
    add_common_args(parser)
    args = parser.parse_args(argv)
    if args.baseline is not None and not (args.baseline / "benchmarks" / CHILD.name).exists():
        parser.error(f"--baseline {args.baseline}: no benchmarks/{CHILD.name} in that checkout")
    libraries = (["rejax"] if Path(args.rejax_python).exists() else []) + ["jaxplan"]
    libraries += ["baseline"] if args.baseline is not None else []
    pythons = {"rejax": args.rejax_python, "jaxplan": sys.executable, "baseline": sys.executable}
    checkouts = {"baseline": args.baseline and args.baseline.resolve()}
    print(
        f"# cold compiles of the fixed-work PPO program, {args.steps:,} steps: "
        f"{' then '.join(libraries)}, {args.rounds} round(s)",
        flush=True,
    )
    records = []
    for rnd in range(args.rounds):
        for lib in libraries:
            child_lib = "jaxplan" if lib == "baseline" else lib
            row = run_child(pythons[lib], child_lib, args.steps, checkout=checkouts.get(lib))
            row = {**row, "library": lib, "round": rnd}
            records.append(row)
            print(
                f"#   {lib}: total {row['total_s']:.2f} s (xla {row['xla_s']:.2f} s, "
                f"{row['kernels']} kernels)",
                flush=True,
            )
    summary = summarize(records, libraries)
    shown = [
        {**s, **{lib: _shown(s[f"median_{lib}"], s["phase"]) for lib in libraries}} for s in summary
    ]
    cols = [("phase", "phase", "")] + [(f"{lib} (s)", lib, "") for lib in libraries]
    if "rejax" in libraries:
        cols.append(("jaxplan/rejax", "ratio", ".2f"))
    if "baseline" in libraries:
        cols.append(("jaxplan/baseline", "ratio_baseline", ".2f"))
    print()
    print_table(shown, cols)
    depth = {}
    if args.kernels:
        for lib in libraries:
            child_lib = "jaxplan" if lib == "baseline" else lib
            with tempfile.TemporaryDirectory() as d:
                row = run_child(pythons[lib], child_lib, args.steps, d, checkouts.get(lib))
                depth[lib] = row["kernels_by_depth"]
            print(f"# {lib} kernels by loop depth: {depth[lib]}")
    if not args.no_write:
        lines = [{**r, "kind": "measurement"} for r in records]
        lines += [{**s, "kind": "summary", "kernels_by_depth": depth} for s in summary]
        write_jsonl("compile_profile", lines, args.results_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
