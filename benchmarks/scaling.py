"""PPO env steps per second against the number of data-parallel devices.

Part 1, `scaling`: the CartPole-v1 preset PPO (`jaxplan.preset_config("CartPole-v1")`) with
`num_workers=8, num_envs_per_worker=2` (the preset's 16 envs as 8 actor groups, so they split
across 1, 2, 4 or 8 devices; train batch 512, 8 epochs x 4 minibatches of 128), the same config
for every device count N so the work per iteration is identical:

  N = 0      no mesh: plain single-device code, no `shard_map` (the baseline)
  N >= 1     `jax.shard_map` over the first N devices, `MultiGPUTrainOneStep` (each device
             samples its 8/N actor groups and computes the gradient of its 1/N of every
             minibatch; gradients are averaged across devices)

Each row is `run_iterations(plan, state, --iterations)` as one compiled `lax.scan`, from a state
made by `plan.init` beforehand: compile_s = AOT trace+lower+compile of that program, run_s =
median wall time of `--repeats` executions of it (steady state, compilation excluded).

Part 2, `fixed_work`: `throughput.py`'s fixed work (`FIXED_WORK`, 500,736 env steps, timed like
its `ppo` case) with three train ops, to show what the data-parallel machinery costs on one
device:

  multigpu_no_mesh      MultiGPUTrainOneStep, num_devices=0 (the default; throughput.py's ppo)
  train_one_step        TrainOneStep (simple_optimizer=True), num_devices=0
  multigpu_1_device     MultiGPUTrainOneStep, num_devices=1 (a one-device shard_map)

Several CPU devices need `XLA_FLAGS=--xla_force_host_platform_device_count=N` before JAX starts,
so every row runs in a fresh subprocess (this script with `--worker N`; it prints one
`SCALING_ROW <json>` line), which also makes every compile cold. On a CPU machine the devices
are fake CPU devices (`_fake_gpus`) that share the host's cores: CPU figures show the overhead
of the mesh and its collectives, not a speedup. When the default backend is a GPU or TPU (or
with `--gpu`) the rows use N = 1, 2, 4, 8 real devices, as many as there are.

    python benchmarks/scaling.py            # ~4 min on 2 CPUs
    python benchmarks/scaling.py --quick    # 30 iterations, 50k fixed-work steps, 2 repeats
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
from common import (
    add_common_args,
    apply_common_args,
    environment,
    measure,
    print_table,
    warm_up_backend,
    write_jsonl,
)
from throughput import ENV, check_steps, fixed_work_plan

import jaxplan

HERE = Path(__file__).resolve()
ROW_TAG = "SCALING_ROW"
DEVICE_COUNTS = (1, 2, 4, 8)
# On top of the CartPole preset: 8 actor groups x 2 envs (the preset's 4 x 4 = 16 envs, as
# groups that split across up to 8 devices); rollout 32, train batch 512, minibatch 128.
SCALING_OVERRIDES: dict = {"num_workers": 8, "num_envs_per_worker": 2}
FULL = {"iterations": 200, "steps": 500_000, "repeats": 3}
QUICK = {"iterations": 30, "steps": 50_000, "repeats": 2}
FIXED_CASES: dict[str, dict] = {
    "multigpu_no_mesh": {"num_devices": 0, "simple_optimizer": False},
    "train_one_step": {"num_devices": 0, "simple_optimizer": True},
    "multigpu_1_device": {"num_devices": 1, "simple_optimizer": False},
}
FIXED_BASELINE = "multigpu_no_mesh"
CPU_NOTE = (
    "# note: fake CPU devices (up to {n}) share this host's {cores} cores, so CPU figures show "
    "the overhead of the mesh, not a speedup"
)


def train_op_name(config) -> str:
    return "TrainOneStep" if config.simple_optimizer else "MultiGPUTrainOneStep"


def scaling_config(num_devices: int, fake: bool):
    return jaxplan.preset_config(
        ENV, {**SCALING_OVERRIDES, "num_devices": num_devices, "_fake_gpus": fake}
    )


# ---- worker: one row, in its own process ----------------------------------------------------
def worker(args) -> int:
    warm_up_backend()
    key = jax.random.PRNGKey(args.seed)
    if args.fixed_case is None:
        config = scaling_config(args.worker, args.fake)
        plan = jaxplan.ppo_plan(config)
        batch = plan.workers.round_env_steps
        assert batch == config.train_batch_size == 512, (batch, config.train_batch_size)
        n, steps = args.iterations, args.iterations * batch
        state = jax.block_until_ready(jax.jit(plan.init)(key))
        fn = lambda s: jaxplan.run_iterations(plan, s, n)
        name = f"N={args.worker}"
        row, (_, res) = measure(name, fn, state, args.repeats, steps)
    else:
        config, _, n, steps = fixed_work_plan(args.steps)
        config = config.updated({**FIXED_CASES[args.fixed_case], "_fake_gpus": args.fake})
        if config.data_parallel_devices != args.worker:
            raise AssertionError((args.fixed_case, args.worker))
        plan = jaxplan.ppo_plan(config)
        train = jaxplan.make_train(plan, n)
        row, (_, res) = measure(args.fixed_case, train, key, args.repeats, steps)
    env = environment()
    mesh = plan.workers.mesh
    row.update(
        devices=args.worker,
        mesh_size=0 if mesh is None else mesh.size,
        mesh_devices=[] if mesh is None else [str(d) for d in mesh.devices.flat],
        groups_per_device=plan.workers.local_groups,
        train_op=train_op_name(config),
        fake_devices=args.fake,
        iterations=n,
        final_episode_reward_mean=check_steps(res, steps),
        config=config.to_dict(),
        # this process's devices, not the parent's
        backend=env["backend"],
        device=env["device"],
        num_devices=env["num_devices"],
    )
    print(f"{ROW_TAG} {json.dumps(row)}", flush=True)
    return 0


# ---- parent: one subprocess per row ---------------------------------------------------------
def child_env(base: dict[str, str], num_devices: int, fake: bool) -> dict[str, str]:
    env = dict(base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE.parent), base.get("PYTHONPATH")) if p)
    if fake:
        flag = f"--xla_force_host_platform_device_count={max(num_devices, 1)}"
        env["XLA_FLAGS"] = " ".join(x for x in (base.get("XLA_FLAGS"), flag) if x)
        env["JAX_PLATFORMS"] = "cpu"
    return env


def run_worker(args, base_env, num_devices: int, fake: bool, fixed_case: str | None) -> dict:
    cmd = [
        sys.executable,
        str(HERE),
        "--worker",
        str(num_devices),
        f"--iterations={args.iterations}",
        f"--steps={args.steps}",
        f"--repeats={args.repeats}",
        f"--seed={args.seed}",
    ]
    if fake:
        cmd.append("--fake")
    if fixed_case:
        cmd.append(f"--fixed-case={fixed_case}")
    if args.compile_cache:
        cmd.append(f"--compile-cache={args.compile_cache}")
    load = os.getloadavg()[0]
    try:
        proc = subprocess.run(
            cmd,
            env=child_env(base_env, num_devices, fake),
            capture_output=True,
            text=True,
            timeout=args.timeout,
        )
        returncode, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired:
        returncode, stdout, stderr = None, "", f"timed out after {args.timeout:.0f} s"
    line = next((x for x in reversed(stdout.splitlines()) if x.startswith(ROW_TAG)), None)
    if returncode != 0 or line is None:
        tail = [x for x in stderr.strip().splitlines() if x.strip()][-1:] or ["(no stderr)"]
        print(f"#   failed (exit code {returncode}): {tail[0]}", flush=True)
        return {
            "case": fixed_case or f"N={num_devices}",
            "devices": num_devices,
            "error": stderr.strip()[-2000:],
            "returncode": returncode,
            "loadavg_1m_before": load,
        }
    row = {**json.loads(line.split(" ", 1)[1]), "loadavg_1m_before": load}
    print(
        f"#   compile {row['compile_s']:.1f} s, run {row['run_s']:.2f} s, "
        f"{row['steps_per_s']:,.0f} steps/s",
        flush=True,
    )
    return row


def with_ratio(rows, base_row, key: str) -> None:
    base = base_row.get("steps_per_s") if base_row else None
    for r in rows:
        r[key] = r["steps_per_s"] / base if base and "steps_per_s" in r else None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, help="PPO iterations per row (default 200)")
    parser.add_argument("--steps", type=int, help="fixed-work env steps (default 500,000)")
    parser.add_argument("--repeats", type=int, help="executions per row, median (default 3)")
    parser.add_argument(
        "--quick", action="store_true", help="defaults 30 iterations, 50k steps, 2 repeats"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--devices",
        type=int,
        nargs="+",
        default=list(DEVICE_COUNTS),
        help="mesh sizes to measure besides the no-mesh baseline (default 1 2 4 8)",
    )
    parser.add_argument("--no-fixed-work", action="store_true", help="skip part 2")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per worker")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--gpu",
        action="store_true",
        help="real devices of the default backend (GPU/TPU); default when it is not the CPU",
    )
    mode.add_argument("--cpu", action="store_true", help="fake CPU devices even on a GPU host")
    parser.add_argument("--worker", type=int, metavar="N", help=argparse.SUPPRESS)
    parser.add_argument("--fixed-case", choices=list(FIXED_CASES), help=argparse.SUPPRESS)
    parser.add_argument("--fake", action="store_true", help=argparse.SUPPRESS)
    add_common_args(parser)
    args = parser.parse_args(argv)
    defaults = QUICK if args.quick else FULL
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)

    if args.worker is not None:
        if args.compile_cache:
            apply_common_args(args)  # its environment line goes to the parent's pipe
        return worker(args)

    base_env = dict(os.environ)  # what the workers inherit
    # this process only reads the backend: keep it from preallocating GPU memory the workers need
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    apply_common_args(args)
    fake = args.cpu or (not args.gpu and jax.default_backend() == "cpu")
    available = jax.device_count()
    counts = sorted(set(args.devices))
    if not fake:
        skipped = [n for n in counts if n > available]
        counts = [n for n in counts if n <= available]
        if skipped:
            print(f"# {available} {jax.default_backend()} device(s): skipping N={skipped}")

    config = scaling_config(0, fake)
    print(
        f"# scaling: PPO {ENV} preset + {SCALING_OVERRIDES}: {config.num_workers} workers x "
        f"{config.num_envs_per_worker} envs x {config.rollout_fragment_length} steps = "
        f"{config.train_batch_size}/iter, {config.num_sgd_iter} epochs x minibatch "
        f"{config.sgd_minibatch_size} | {args.iterations} iterations = "
        f"{args.iterations * config.train_batch_size:,} env steps per row | "
        f"{args.repeats} repeat(s) | N = 0 (no mesh), {' '.join(map(str, counts))} "
        f"{'fake CPU' if fake else 'real ' + jax.default_backend()} device(s), "
        f"one process each",
        flush=True,
    )
    if fake:
        print(CPU_NOTE.format(n=max(counts, default=1), cores=os.cpu_count()), flush=True)

    rows = []
    for n in [0, *counts]:
        print(f"# N={n} ...", flush=True)
        rows.append({"part": "scaling", **run_worker(args, base_env, n, fake, None)})
    with_ratio(rows, rows[0], "ratio_to_no_mesh")

    fixed_rows = []
    if not args.no_fixed_work:
        _, _, n_fixed, steps = fixed_work_plan(args.steps)
        print(
            f"\n# fixed_work: throughput.py's FIXED_WORK, {n_fixed} iterations = {steps:,} env "
            f"steps, make_train(plan, n) | {args.repeats} repeat(s)",
            flush=True,
        )
        for case, overrides in FIXED_CASES.items():
            print(f"# {case} ...", flush=True)
            row = run_worker(args, base_env, overrides["num_devices"], fake, case)
            fixed_rows.append({"part": "fixed_work", **row})
        base = next((r for r in fixed_rows if r["case"] == FIXED_BASELINE), None)
        with_ratio(fixed_rows, base, "ratio_to_default")

    print()
    print_table(
        rows,
        [
            ("N devices", "case", ""),
            ("groups/dev", "groups_per_device", ""),
            ("compile_s", "compile_s", ".2f"),
            ("run_s", "run_s", ".2f"),
            ("env_steps", "env_steps", ","),
            ("steps_per_s", "steps_per_s", ",.0f"),
            ("vs_no_mesh", "ratio_to_no_mesh", ".2f"),
            ("final_R", "final_episode_reward_mean", ".1f"),
        ],
    )
    if fixed_rows:
        print()
        print_table(
            fixed_rows,
            [
                ("fixed work", "case", ""),
                ("train op", "train_op", ""),
                ("mesh", "mesh_size", ""),
                ("compile_s", "compile_s", ".2f"),
                ("run_s", "run_s", ".2f"),
                ("env_steps", "env_steps", ","),
                ("steps_per_s", "steps_per_s", ",.0f"),
                ("vs_default", "ratio_to_default", ".2f"),
                ("final_R", "final_episode_reward_mean", ".1f"),
            ],
        )
    if fake:
        print(CPU_NOTE.format(n=max(counts, default=1), cores=os.cpu_count()))
    failed = [r["case"] for r in rows + fixed_rows if "error" in r]
    if failed:
        print(f"# failed: {' '.join(failed)} (the error is in the JSON lines)")
    if not args.no_write:
        common = {"quick": args.quick, "fake_devices": fake}
        records = [{**r, **common} for r in rows + fixed_rows]
        path = write_jsonl("scaling", records, args.results_dir)
        print(f"\n# results appended to {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
