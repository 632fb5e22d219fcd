"""Every algorithm's preset on one env, side by side in one run: steps to the target, best and
final `episode_reward_mean`, env steps per second and compile time.

Each algorithm trains `--seeds` in one `vmap`ped program (`jaxplan.make_train`), AOT-compiled
(compile time reported apart) then run once for the whole `--budget` (no stop, so the rate is
the algorithm's steady work per env step, and `final` shows whether the preset holds).

    python benchmarks/algorithms.py                      # CartPole-v1, seeds 0-2, 300k steps
    python benchmarks/algorithms.py --algorithms ppo a2c --budget 100000
    python benchmarks/algorithms.py --env Pendulum-v1 --target -200 --algorithms sac --budget 50000
    python benchmarks/algorithms.py --env Breakout-MinAtar --target 28 \
        --config 'model.conv_filters=[]'

`--config KEY=VALUE` (JSON value, repeatable) overrides a key of every algorithm's preset.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    Column,
    aot_compile,
    config_override,
    environment,
    format_table,
    timed,
    write_jsonl,
)

import jaxplan  # noqa: E402
from jaxplan.algorithms import ALGORITHM_NAMES, get_algorithm  # noqa: E402
from jaxplan.counters import counter_value  # noqa: E402


def measure(
    name: str,
    env: str,
    seeds: list[int],
    budget: int,
    target: float,
    overrides: dict | None = None,
) -> dict:
    algorithm = get_algorithm(name)
    plan = algorithm.plan(overrides, env=env)
    keys = jax.vmap(jax.random.PRNGKey)(np.asarray(seeds, np.uint32))
    state0 = jax.jit(plan.init)(keys[0])
    _, first = jax.jit(plan.step)(state0)
    steps_per_iter = int(plan.report(first)["timesteps_this_iter"])
    iters = max(1, budget // steps_per_iter)
    run = jax.vmap(jaxplan.make_train(plan, iters))
    compiled = aot_compile(run, keys)
    (_, results), run_s = timed(compiled, keys)
    reward = np.asarray(results["episode_reward_mean"])  # [seeds, iters]
    steps = counter_value(results["timesteps_total"])
    to_target = []
    for s in range(len(seeds)):
        hit = np.flatnonzero(reward[s] >= target)
        to_target.append(int(steps[s, hit[0]]) if hit.size else None)
    return {
        "algorithm": algorithm.name,
        "env": env,
        "seeds": seeds,
        "budget": int(steps[0, -1]),
        "steps_to_target": to_target,
        "best": [float(np.nanmax(r)) for r in reward],
        "final": [float(r[-1]) for r in reward],
        "env_steps_per_s": float(steps[:, -1].sum() / run_s),
        "compile_s": compiled.total_s,
        "run_s": run_s,
        "overrides": dict(overrides or {}),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--target", type=float, default=475.0)
    parser.add_argument("--budget", type=int, default=300_000, help="env steps per seed")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--algorithms", nargs="+", default=None, choices=ALGORITHM_NAMES)
    parser.add_argument(
        "--config",
        type=config_override,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a preset key of every algorithm (JSON value), e.g. 'model.conv_filters=[]'",
    )
    args = parser.parse_args(argv)
    names = args.algorithms or [n for n in ALGORITHM_NAMES if args.env in get_algorithm(n).presets]
    rows = []
    for name in names:
        row = measure(name, args.env, args.seeds, args.budget, args.target, dict(args.config))
        rows.append(row)
        print(row, flush=True)
    write_jsonl("algorithms", [{**r, "environment": environment()} for r in rows])

    def fmt(values):
        return ", ".join("-" if v is None else f"{v:,.0f}" for v in values)

    table = [
        {
            "algorithm": r["algorithm"],
            "steps to target": fmt(r["steps_to_target"]),
            "best": fmt(r["best"]),
            "final": fmt(r["final"]),
            "env steps/s (all seeds)": f"{r['env_steps_per_s']:,.0f}",
            "compile s": f"{r['compile_s']:.1f}",
        }
        for r in rows
    ]
    columns: list[Column] = [(k, k, "") for k in table[0]] if table else []
    print(format_table(table, columns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
