"""One GPU session's measurements in one run: PPO env steps/s against the env count, compile
time, peak memory, and data-parallel scaling over the visible GPUs, written as one table.

Work per row: PPO on CartPole-v1 with throughput.py's hyper-parameters (64x64 tanh actor and
critic, 4 epochs x 4 minibatches, clip 0.2, no KL term, ...), `num_workers=8` actor groups x
`envs/8` envs x `--fragment` steps per iteration (the train batch is `envs * fragment`, each
minibatch a quarter of it), `--iterations` iterations as one compiled `run_iterations` program:

  envs       one device, envs = 1k, 2k, ..., 64k (`--envs`)
  scaling    `--scaling-envs` envs (16k) on a mesh of N = 1, 2, 4, 8 devices (as many as there
             are; `MultiGPUTrainOneStep`, each device samples 8/N actor groups and computes the
             gradient of its share of every minibatch); efficiency = steps/s / (N x steps/s on 1)

Every row runs in its own process (fresh, cold compile; `XLA_PYTHON_CLIENT_PREALLOCATE=false`
so that the peak device memory is what the row used): compile = AOT trace+lower and XLA
compile, run = median wall time of `--repeats` executions, peak memory = the largest
`peak_bytes_in_use` of the row's devices (GPU/TPU) or the process's peak RSS (CPU). A row that
fails (out of memory, timeout) is reported as such and the run goes on; rows past `--budget`
seconds are skipped and listed.

    python benchmarks/gpu.py               # on a GPU host: a few minutes
    python benchmarks/gpu.py --tiny        # CPU smoke run (tests/test_gpu_benchmark.py): 8 and
                                           # 16 envs, 1 and 2 fake CPU devices
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
ROW_TAG = "GPU_ROW"
FULL = {
    "envs": [1024, 2048, 4096, 8192, 16384, 32768, 65536],
    "scaling_envs": 16384,
    "devices": [1, 2, 4, 8],
    "fragment": 128,
    "iterations": 5,
    "repeats": 2,
}
TINY = {
    "envs": [8, 16],
    "scaling_envs": 16,
    "devices": [1, 2],
    "fragment": 16,
    "iterations": 2,
    "repeats": 1,
}
GROUPS = 8  # actor groups: they split evenly over 1, 2, 4 or 8 devices


def row_config(envs: int, fragment: int, num_devices: int, fake: bool) -> dict:
    """The PPO config overrides of a row (on top of throughput.py's FIXED_WORK)."""
    if envs % GROUPS:
        raise ValueError(f"--envs {envs}: must be a multiple of {GROUPS} (the actor groups)")
    batch = envs * fragment
    return {
        "num_workers": GROUPS,
        "num_envs_per_worker": envs // GROUPS,
        "rollout_fragment_length": fragment,
        "train_batch_size": batch,
        "sgd_minibatch_size": batch // 4,
        "num_devices": num_devices,
        "_fake_gpus": fake,
    }


# ---- worker: one row, in its own process ----------------------------------------------------
def peak_memory_bytes(devices) -> tuple[int | None, str]:
    """The largest `peak_bytes_in_use` over `devices`, or this process's peak RSS on CPU."""
    peaks = []
    for d in devices:
        stats = d.memory_stats() if hasattr(d, "memory_stats") else None
        if stats and "peak_bytes_in_use" in stats:
            peaks.append(int(stats["peak_bytes_in_use"]))
    if peaks:
        return max(peaks), "device"
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return int(rss_kib) * 1024, "host RSS"


def worker(spec: dict) -> dict:
    import jax
    from common import measure, warm_up_backend
    from throughput import ENV, FIXED_WORK, check_steps

    import jaxplan

    warm_up_backend()
    config = jaxplan.preset_config(
        ENV,
        {
            **FIXED_WORK,
            **row_config(spec["envs"], spec["fragment"], spec["devices"], spec["fake"]),
        },
    )
    plan = jaxplan.ppo_plan(config)
    n, batch = spec["iterations"], plan.workers.round_env_steps
    if batch != spec["envs"] * spec["fragment"]:
        raise AssertionError(f"round of {batch} env steps, expected {spec['envs']} x fragment")
    state = jax.block_until_ready(jax.jit(plan.init)(jax.random.PRNGKey(spec["seed"])))
    row, (_, results) = measure(
        spec["case"],
        lambda s: jaxplan.run_iterations(plan, s, n),
        state,
        spec["repeats"],
        n * batch,
    )
    final = check_steps(results, n * batch)
    mesh = plan.workers.mesh
    devices = list(mesh.devices.flat) if mesh is not None else jax.devices()[:1]
    peak, peak_kind = peak_memory_bytes(devices)
    return {
        **row,
        "part": spec["part"],
        "envs": spec["envs"],
        "devices": spec["devices"],
        "mesh_size": 0 if mesh is None else mesh.size,
        "device": f"{devices[0].platform}:{devices[0].device_kind}",
        "train_batch": batch,
        "iterations": n,
        "peak_bytes": peak,
        "peak_kind": peak_kind,
        "final_episode_reward_mean": final,
    }


# ---- parent ---------------------------------------------------------------------------------
def child_env(num_devices: int, fake: bool) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE.parent), env.get("PYTHONPATH")) if p)
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    if fake:
        flag = f"--xla_force_host_platform_device_count={max(num_devices, 1)}"
        env["XLA_FLAGS"] = " ".join(x for x in (env.get("XLA_FLAGS"), flag) if x)
        env["JAX_PLATFORMS"] = "cpu"
    return env


def run_row(spec: dict, timeout: float) -> dict:
    cmd = [sys.executable, str(HERE), "--worker", json.dumps(spec)]
    try:
        proc = subprocess.run(
            cmd,
            env=child_env(spec["devices"], spec["fake"]),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        code, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired:
        code, out, err = None, "", f"timed out after {timeout:.0f} s"
    line = next((x for x in reversed(out.splitlines()) if x.startswith(ROW_TAG)), None)
    if code != 0 or line is None:
        lines = [x for x in err.strip().splitlines() if x.strip()]
        reason = lines[-1] if lines else f"exit code {code}"
        return {**spec, "error": reason[:300]}
    return {**spec, **json.loads(line.split(" ", 1)[1])}


def add_ratios(rows: list[dict]) -> None:
    """`efficiency` of each scaling row against its 1-device row, and `per_env_steps_per_s`."""
    one = next((r for r in rows if r["part"] == "scaling" and r["devices"] == 1), None)
    for r in rows:
        if "steps_per_s" not in r:
            continue
        r["steps_per_s_per_env"] = r["steps_per_s"] / r["envs"]
        if r["part"] == "scaling" and one and "steps_per_s" in one:
            r["efficiency"] = r["steps_per_s"] / (r["devices"] * one["steps_per_s"])


def markdown(rows: list[dict], header: str) -> str:
    lines = [
        *(line.lstrip("# ") + "  " for line in header.splitlines()),
        "",
        "| part | envs | devices | compile s (lower + XLA) | run s | env steps/s "
        "| efficiency | peak memory | final return |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(
                f"| {r['part']} | {r['envs']:,} | {r['devices']} | failed: {r['error']} | | | | | |"
            )
            continue
        eff = f"{r['efficiency']:.2f}" if "efficiency" in r else ""
        devices = f"{r['devices']}" if r["mesh_size"] else "1 (no mesh)"
        mem = f"{r['peak_bytes'] / 2**20:,.0f} MiB ({r['peak_kind']})"
        lines.append(
            f"| {r['part']} | {r['envs']:,} | {devices} | {r['compile_s']:.1f} "
            f"({r['lower_s']:.1f} + {r['xla_compile_s']:.1f}) | {r['run_s']:.3f} "
            f"| {r['steps_per_s']:,.0f} | {eff} | {mem} | {r['final_episode_reward_mean']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="CPU smoke sizes (see above)")
    parser.add_argument("--envs", type=int, nargs="+", help="env counts of the envs part")
    parser.add_argument("--scaling-envs", type=int, help="env count of the scaling part")
    parser.add_argument("--devices", type=int, nargs="+", help="mesh sizes of the scaling part")
    parser.add_argument("--fragment", type=int, help="rollout_fragment_length (default 128)")
    parser.add_argument("--iterations", type=int, help="iterations per timed program")
    parser.add_argument("--repeats", type=int, help="executions per row (median)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=300, help="seconds per row")
    parser.add_argument("--budget", type=float, default=540, help="seconds for all rows")
    parser.add_argument(
        "--cpu", action="store_true", help="fake CPU devices for the scaling part even on a GPU"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=HERE.parent / "results" / "gpu.md",
        help="the markdown table (default benchmarks/results/gpu.md); rows also go to --json",
    )
    parser.add_argument("--json", type=Path, help="also write the rows as a JSON list here")
    parser.add_argument(
        "--no-write", action="store_true", help="no line in benchmarks/results/gpu.jsonl"
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker is not None:
        sys.path.insert(0, str(HERE.parent))
        row = worker(json.loads(args.worker))
        print(f"{ROW_TAG} {json.dumps(row, default=float)}", flush=True)
        return 0

    defaults = TINY if args.tiny else FULL
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    try:  # a bad env count fails here, before any row
        for n in [*args.envs, args.scaling_envs]:
            row_config(n, args.fragment, 1, False)
    except ValueError as e:
        parser.error(str(e))

    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax

    sys.path.insert(0, str(HERE.parent))
    from common import describe_environment, write_jsonl

    backend = jax.default_backend()
    fake = args.cpu or backend == "cpu"
    available = jax.device_count()
    counts = sorted(set(args.devices))
    if not fake and any(n > available for n in counts):
        too_many = [n for n in counts if n > available]
        print(f"# {available} {backend} device(s): skipping N={too_many}")
        counts = [n for n in counts if n <= available]
    header = (
        f"{describe_environment()}\n# PPO CartPole-v1, {GROUPS} actor groups, fragment "
        f"{args.fragment}, {args.iterations} iterations per program, {args.repeats} repeat(s); "
        f"scaling on {'fake CPU' if fake else 'real ' + backend} devices"
    )
    print(header, flush=True)
    base = {"fragment": args.fragment, "iterations": args.iterations, "repeats": args.repeats}
    specs = [
        {**base, "part": "envs", "case": f"envs={n}", "envs": n, "devices": 0, "fake": False}
        for n in args.envs
    ] + [
        {
            **base,
            "part": "scaling",
            "case": f"N={n}",
            "envs": args.scaling_envs,
            "devices": n,
            "fake": fake,
        }
        for n in counts
    ]
    rows, skipped, start = [], [], time.monotonic()
    for spec in specs:
        spec["seed"] = args.seed
        if time.monotonic() - start > args.budget:
            skipped.append(spec["case"])
            continue
        print(f"# {spec['part']} {spec['case']} ...", flush=True)
        row = run_row(spec, args.timeout)
        print(
            f"#   failed: {row['error']}"
            if "error" in row
            else f"#   compile {row['compile_s']:.1f} s, {row['steps_per_s']:,.0f} steps/s",
            flush=True,
        )
        rows.append(row)
    add_ratios(rows)
    table = markdown(rows, header)
    if skipped:
        table += f"\nSkipped past the {args.budget:.0f} s budget: {', '.join(skipped)}\n"
    write_atomically(args.out, table)
    if args.json:
        write_atomically(args.json, json.dumps(rows, indent=1, default=float))
    if not args.no_write:
        write_jsonl("gpu", rows)
    print(f"\n{table}\n# table in {args.out}", flush=True)
    return 0 if rows and not any("error" in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
