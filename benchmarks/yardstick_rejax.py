"""jaxplan against rejax, side by side in one invocation, at the same PPO work on CartPole-v1.

A yardstick for a shared, noisy machine: absolute steps/s drift from run to run, so this
reports ratios (jaxplan / rejax) of measurements taken alternately in the same invocation:
rejax, jaxplan, rejax, jaxplan, ... for `--repeats` rounds.

The work is `throughput.py`'s `FIXED_WORK` (the "same work" of the project's anchors): 8 envs x
128 steps (batch 1024), 4 epochs of 4 minibatches of 256, 64x64 tanh actor and critic, lr
2.5e-4, gamma 0.99, lambda 0.95, clip 0.2, entropy 0.01, value coeff 0.5, grad clip 0.5,
`--steps` env steps per seed (default 500k, rounded up to whole iterations: 500,736).

rejax is never installed in the project's venv. It runs in its own (default
/work/yard/.venv, `--rejax-python`) through `benchmarks/_rejax_worker.py`, a subprocess that
does not import jaxplan; create it with

    python3 -m venv /work/yard/.venv && /work/yard/.venv/bin/pip install rejax==0.1.3 six

Cases, each the whole run as one jitted program, per library and round:

  ppo         one seed: jaxplan `jax.jit(make_train(plan, n))`, rejax `jax.jit(algo.train)`
  ppo_vmap8   8 seeds `vmap`ped in one program (jaxplan: split over the CPU devices as
              `jaxplan train --num-seeds 8` does, `--cpu-devices`, default one per core;
              rejax: its one program on one device); steps/s summed over seeds

compile_s = AOT trace+lower+compile (cold: fresh process for rejax, `jax.clear_caches()` for
jaxplan); run_s = median of `--execs` executions of the compiled program; final_R = the
training return at the end (jaxplan: `episode_reward_mean` over the last 100 episodes; rejax:
mean over the 8 envs of each env's last finished episode), averaged over seeds.

    python benchmarks/yardstick_rejax.py            # ~8 min on 2 CPUs
    python benchmarks/yardstick_rejax.py --quick    # 100k steps per seed
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
from common import (
    DEFAULT_REJAX_PYTHON,
    _git_commit,
    add_common_args,
    apply_common_args,
    measure,
    median,
    print_table,
    warm_up_backend,
    write_jsonl,
)
from throughput import ENV, check_steps, fixed_work_plan

import jaxplan
from jaxplan.fast_rng import unrolled_threefry
from jaxplan.seed_devices import seed_mesh, spread_seeds

HERE = Path(__file__).resolve().parent
WORKER = HERE / "_rejax_worker.py"
NUM_SEEDS_VMAP = 8
CASES = ("ppo", "ppo_vmap8")
SETUP_HINT = (
    "rejax's interpreter {path} was not found. Create a separate venv for it (never the "
    "project's):\n\n"
    "    python3 -m venv /work/yard/.venv\n"
    "    /work/yard/.venv/bin/pip install rejax==0.1.3 six\n\n"
    "or point --rejax-python at a Python that has rejax."
)

# jaxplan (RLlib keys) -> rejax 0.1.3 PPO.create arguments used by _rejax_worker.py.
CONFIG_MAPPING = {
    "num_workers x num_envs_per_worker = 8 x 1": "num_envs=8",
    "rollout_fragment_length=128": "num_steps=128",
    "num_sgd_iter=4": "num_epochs=4",
    "sgd_minibatch_size=256 (of train_batch_size=1024)": "num_minibatches=4",
    "lr=2.5e-4": "learning_rate=2.5e-4",
    "gamma=0.99": "gamma=0.99",
    "lambda=0.95": "gae_lambda=0.95",
    "clip_param=0.2": "clip_eps=0.2",
    "vf_loss_coeff=0.5": "vf_coef=0.5",
    "entropy_coeff=0.01": "ent_coef=0.01",
    "grad_clip=0.5": "max_grad_norm=0.5",
    "model 64x64 tanh, vf_share_layers=False": "agent_kwargs hidden_layer_sizes=(64, 64), tanh",
    "steps": "total_timesteps=iterations*1024, eval_freq=1024, no evaluation",
}


class CpuShare:
    """Share of the machine's CPU time used by *other* processes while a block ran: busy
    time from /proc/stat minus this process's and its children's CPU time (Linux only;
    `foreign` stays None elsewhere)."""

    def __enter__(self):
        self._t0 = self._sample()
        return self

    def __exit__(self, *exc):
        t1 = self._sample()
        self.foreign = None
        if self._t0 and t1:
            busy, own, wall = (b - a for a, b in zip(self._t0, t1, strict=True))
            self.foreign = max(0.0, busy - own) / (wall * (os.cpu_count() or 1))
        return False

    @staticmethod
    def _sample():
        try:
            with open("/proc/stat") as f:
                ticks = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        hz = os.sysconf("SC_CLK_TCK")
        busy = (sum(ticks[:8]) - ticks[3] - ticks[4]) / hz  # all but idle and iowait
        t = os.times()
        own = t.user + t.system + t.children_user + t.children_system
        return busy, own, time.perf_counter()


def run_rejax(args, cases) -> dict:
    cmd = [
        args.rejax_python,
        str(WORKER),
        f"--steps={args.steps}",
        f"--execs={args.execs}",
        f"--vmap-execs={args.vmap_execs}",
        f"--seeds={NUM_SEEDS_VMAP}",
        f"--seed={args.seed}",
        "--cases",
        *cases,
    ]
    if args.compile_cache:
        cmd.append(f"--compile-cache={args.compile_cache}")
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    env.pop("VIRTUAL_ENV", None)
    proc = subprocess.run(cmd, cwd=HERE, env=env, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"rejax worker failed with exit code {proc.returncode}: {cmd}")
    line = next(x for x in reversed(proc.stdout.splitlines()) if x.startswith("YARDSTICK_"))
    return json.loads(line.split(" ", 1)[1])


def measure_jaxplan(name, fn, arg, execs, env_steps, steps_per_seed) -> dict:
    jax.clear_caches()  # cold compile in every round, like rejax's fresh process
    # compiled as jaxplan's Runner and train_seeds compile (rejax: as its users do)
    row, out = measure(name, fn, arg, execs, env_steps, compiler_options=jaxplan.compiler_options())
    return {**row, "final_R": check_steps(out[1], steps_per_seed)}


def run_jaxplan(args, plan, n, steps, cases) -> list[dict]:
    rows = []
    for case in cases:
        load = os.getloadavg()[0]
        if case == "ppo":
            train = jaxplan.make_train(plan, n)
            key = jax.random.PRNGKey(args.seed)
            row = measure_jaxplan(case, train, key, args.execs, steps, steps)
            row["seeds"] = 1
        else:
            seeds = jnp.arange(args.seed, args.seed + NUM_SEEDS_VMAP, dtype=jnp.uint32)
            keys = jax.vmap(jax.random.PRNGKey)(seeds)
            train = jax.vmap(jaxplan.make_train(plan, n))
            train = spread_seeds(train, seed_mesh(NUM_SEEDS_VMAP))  # as train_seeds does
            with unrolled_threefry():  # lowered as `jaxplan.train_seeds` does
                row = measure_jaxplan(
                    case, train, keys, args.vmap_execs, NUM_SEEDS_VMAP * steps, steps
                )
            row["seeds"] = NUM_SEEDS_VMAP
        row["loadavg_1m_before"] = load
        rows.append(row)
        print(
            f"#   jaxplan {case}: compile {row['compile_s']:.1f} s, run {row['run_s']:.2f} s, "
            f"{row['steps_per_s']:,.0f} steps/s, R {row['final_R']:.1f}",
            flush=True,
        )
    return rows


METRICS = (("compile_s", ".2f"), ("steps_per_s", ",.0f"), ("final_R", ".1f"))


def summarize(records, cases) -> list[dict]:
    """One row per (case, metric): medians over rounds, their ratio, and per-round ratios."""
    out = []
    for case in cases:
        by_lib = {
            lib: [r for r in records if r["case"] == case and r["library"] == lib]
            for lib in ("rejax", "jaxplan")
        }
        for metric, _ in METRICS:
            rj = [r[metric] for r in by_lib["rejax"]]
            jp = [r[metric] for r in by_lib["jaxplan"]]
            per_round = [j / r for j, r in zip(jp, rj, strict=True) if r]
            m_rj, m_jp = median(rj), median(jp)
            out.append(
                {
                    "case": case,
                    "metric": metric,
                    "rejax": m_rj,
                    "jaxplan": m_jp,
                    "ratio": m_jp / m_rj if m_rj else None,
                    "per_round": " ".join(f"{x:.2f}" for x in per_round),
                    "rejax_all": rj,
                    "jaxplan_all": jp,
                    "ratio_all": per_round,
                }
            )
    return out


def print_summary(summary) -> None:
    fmt = dict(METRICS)
    rows = [
        {
            **s,
            "rejax_s": format(s["rejax"], fmt[s["metric"]]),
            "jaxplan_s": format(s["jaxplan"], fmt[s["metric"]]),
        }
        for s in summary
    ]
    print_table(
        rows,
        [
            ("case", "case", ""),
            ("metric", "metric", ""),
            ("rejax", "rejax_s", ""),
            ("jaxplan", "jaxplan_s", ""),
            ("jaxplan/rejax", "ratio", ".2f"),
            ("per round", "per_round", ""),
        ],
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=500_000, help="env steps per seed")
    parser.add_argument("--quick", action="store_true", help="100k steps per seed")
    parser.add_argument("--repeats", type=int, default=2, help="A/B rounds (rejax, jaxplan)")
    parser.add_argument("--execs", type=int, default=2, help="executions per round (ppo)")
    parser.add_argument("--vmap-execs", type=int, default=1, help="executions per round (vmap)")
    parser.add_argument("--no-vmap", action="store_true", help="skip the 8-seed vmap case")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--rejax-python",
        default=DEFAULT_REJAX_PYTHON,
        help=f"Python of the venv that has rejax (default {DEFAULT_REJAX_PYTHON})",
    )
    add_common_args(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.steps = 100_000
    if not Path(args.rejax_python).exists():
        print(SETUP_HINT.format(path=args.rejax_python), file=sys.stderr)
        return 2
    apply_common_args(args)
    warm_up_backend()
    cases = ["ppo"] if args.no_vmap else list(CASES)

    config, plan, n, steps = fixed_work_plan(args.steps)
    print(
        f"# PPO {ENV}, same work: 8 envs x 128 steps = 1024/iter, 4 epochs x 4 minibatches "
        f"of 256 | {n} iterations = {steps:,} env steps per seed | cases {' '.join(cases)} | "
        f"{args.repeats} rounds rejax/jaxplan alternating, {args.execs} exec(s) per round "
        f"({args.vmap_execs} for vmap)",
        flush=True,
    )

    git_at_start = _git_commit()  # write_jsonl's `git` is read at the end of the run
    records, rejax_meta = [], None
    for rnd in range(args.repeats):
        print(f"# round {rnd + 1}/{args.repeats}: rejax (load {os.getloadavg()[0]:.2f})")
        with CpuShare() as cpu:
            res = run_rejax(args, cases)
        print(f"#   other processes used {cpu.foreign:.1%} of the CPU meanwhile", flush=True)
        rejax_meta = {k: v for k, v in res.items() if k != "rows"}
        if res["steps_per_seed"] != steps:
            raise AssertionError(f"rejax ran {res['steps_per_seed']} steps, expected {steps}")
        tag = {"round": rnd, "foreign_cpu_share": cpu.foreign}
        records += [{**r, "library": "rejax", **tag} for r in res["rows"]]
        print(f"# round {rnd + 1}/{args.repeats}: jaxplan (load {os.getloadavg()[0]:.2f})")
        with CpuShare() as cpu:
            rows = run_jaxplan(args, plan, n, steps, cases)
        print(f"#   other processes used {cpu.foreign:.1%} of the CPU meanwhile", flush=True)
        tag = {"round": rnd, "foreign_cpu_share": cpu.foreign}
        records += [{**r, "library": "jaxplan", **tag} for r in rows]

    loads = [r["loadavg_1m_before"] for r in records]
    foreign = [r["foreign_cpu_share"] for r in records if r["foreign_cpu_share"] is not None]
    print(
        f"\n# rejax {rejax_meta['rejax']} (gymnax {rejax_meta['gymnax']}, jax "
        f"{rejax_meta['jax']}) vs jaxplan {jaxplan.__version__} | medians over "
        f"{args.repeats} rounds | 1-min load before each measurement {min(loads):.2f}-"
        f"{max(loads):.2f} (includes this run's own load) | CPU used by other processes "
        f"{max(foreign, default=float('nan')):.1%} at most (per library and round)\n"
        "# compile_s: lower is better; steps_per_s and final_R: higher is better"
    )
    for lib in ("rejax", "jaxplan"):
        shares = [r["foreign_cpu_share"] for r in records if r["library"] == lib]
        shares = " ".join("-" if x is None else f"{x:.0%}" for x in shares[:: len(cases)])
        print(f"# CPU used by other processes while {lib} ran, per round: {shares}")
    print()
    summary = summarize(records, cases)
    print_summary(summary)
    if not args.no_write:
        common = {
            "quick": args.quick,
            "steps_per_seed": steps,
            "iterations": n,
            "git_at_start": git_at_start,
        }
        versions = {k: v for k, v in rejax_meta.items() if k != "config"}
        lines = [
            {
                **r,
                **common,
                "kind": "measurement",
                "config": config.to_dict() if r["library"] == "jaxplan" else rejax_meta["config"],
                **({"rejax_versions": versions} if r["library"] == "rejax" else {}),
            }
            for r in records
        ]
        lines += [
            {  # the medians renamed: a line's "jaxplan" is the version (write_jsonl's)
                **{k: v for k, v in s.items() if k not in ("rejax", "jaxplan")},
                "median_rejax": s["rejax"],
                "median_jaxplan": s["jaxplan"],
                **common,
                "kind": "summary",
                "rejax_versions": versions,
                "config_mapping": CONFIG_MAPPING,
            }
            for s in summary
        ]
        path = write_jsonl("yardstick_rejax", lines, args.results_dir)
        print(f"\n# results appended to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
