"""Brax and Jumanji through jaxplan's adapters: Brax backends on the CPU, and learning figures.

Part 1, Brax backends: PPO with the brax:inverted_pendulum preset for `--iterations` (default
50) x 2048 env steps as one compiled program (`jax.jit(jaxplan.make_train(plan, n))`), per
`env_config.backend`: compile_s (AOT trace+lower+compile), run_s (median of `--repeats`), env
steps/s.

Part 2, learning: the brax:inverted_pendulum preset (spring backend) for `--brax-steps`
(default 500k) env steps, seeds `--seeds` vmapped in one program: the env steps at which the
100-episode mean return first reaches 500 and 900, and the last one. Then Snake on a 6 x 6 grid
(jumanji:Snake-v1 preset, `env_config` num_rows=num_cols=6) for `--snake-steps` (default 300k),
next to a `RandomPolicy`'s mean return over 1000 episodes.

    python benchmarks/envs.py            # ~6 min on 2 CPUs
    python benchmarks/envs.py --quick    # spring only, 200k / 100k learning steps (~2-3 min)
"""

from __future__ import annotations

import argparse
import math
import sys

import jax
import jax.numpy as jnp
import numpy as np
from common import (
    add_common_args,
    apply_common_args,
    measure,
    print_table,
    warm_up_backend,
    write_jsonl,
)

import jaxplan
from jaxplan.counters import counter_value
from jaxplan.multi_agent import make_env

BRAX = "brax:inverted_pendulum"
SNAKE = "jumanji:Snake-v1"
SNAKE_6X6 = {"num_rows": 6, "num_cols": 6}
BACKENDS = ("spring", "positional", "generalized", "mjx")


def backends(args, key) -> list[dict]:
    rows = []
    for backend in args.backends:
        print(f"# {BRAX} backend={backend} ...", flush=True)
        config = jaxplan.preset_config(BRAX, {"env_config": {"backend": backend}})
        plan = jaxplan.ppo_plan(config)
        env_steps = args.iterations * plan.workers.round_env_steps
        train = jaxplan.make_train(plan, args.iterations)
        row, (_, res) = measure(f"ppo {backend}", train, key, args.repeats, env_steps)
        row.update(
            env=BRAX,
            backend=backend,
            iterations=args.iterations,
            final_episode_reward_mean=float(res["episode_reward_mean"][-1]),
            config=config.to_dict(),
        )
        rows.append(row)
        print(f"#   compile {row['compile_s']:.1f} s, run {row['run_s']:.2f} s", flush=True)
    return rows


def first_reaching(returns: np.ndarray, steps: np.ndarray, level: float) -> int | None:
    hit = np.flatnonzero(returns >= level)
    return int(steps[hit[0]]) if hit.size else None


def brax_learning(args) -> list[dict]:
    config = jaxplan.preset_config(BRAX, {"env_config": {"backend": "spring"}})
    plan = jaxplan.ppo_plan(config)
    n = math.ceil(args.brax_steps / plan.workers.round_env_steps)
    print(f"# learning {BRAX} (spring), {n} iterations, seeds {args.seeds} ...", flush=True)
    keys = jax.vmap(jax.random.PRNGKey)(jnp.asarray(args.seeds, jnp.uint32))
    train = jax.vmap(jaxplan.make_train(plan, n))
    batch = plan.workers.round_env_steps
    timing, (_, res) = measure("brax learning", train, keys, 1, len(args.seeds) * n * batch)
    returns = np.asarray(res["episode_reward_mean"])
    steps = counter_value(res["timesteps_total"])
    return [
        {
            "case": f"{BRAX} seed {seed}",
            "seed": seed,
            "env_steps": int(steps[i, -1]),
            "iter1_return": float(returns[i, 0]),
            "steps_to_500": first_reaching(returns[i], steps[i], 500.0),
            "steps_to_900": first_reaching(returns[i], steps[i], 900.0),
            "final_return": float(returns[i, -1]),
            "compile_s_all_seeds": timing["compile_s"],
            "run_s_all_seeds": timing["run_s"],
            "config": config.to_dict(),
        }
        for i, seed in enumerate(args.seeds)
    ]


def snake_learning(args, key) -> list[dict]:
    env = make_env(SNAKE, SNAKE_6X6)
    workers = jaxplan.WorkerSet(
        env,
        {"default_policy": jaxplan.RandomPolicy(env.observation_shape, env.action_space)},
        num_workers=4,
        num_envs_per_worker=8,
        rollout_fragment_length=32,
        metrics_smoothing_episodes=1000,
    )
    random_plan = jaxplan.sample_only_plan(workers, mode="bulk_sync")
    _, res = jax.jit(jaxplan.make_train(random_plan, 32))(key)
    random_return = float(res["episode_reward_mean"][-1])
    config = jaxplan.preset_config(SNAKE, {"env_config": SNAKE_6X6})
    plan = jaxplan.ppo_plan(config)
    n = math.ceil(args.snake_steps / plan.workers.round_env_steps)
    print(f"# learning Snake 6x6, {n} iterations, seeds {args.seeds} ...", flush=True)
    keys = jax.vmap(jax.random.PRNGKey)(jnp.asarray(args.seeds, jnp.uint32))
    train = jax.vmap(jaxplan.make_train(plan, n))
    batch = plan.workers.round_env_steps
    timing, (_, res) = measure("snake learning", train, keys, 1, len(args.seeds) * n * batch)
    returns = np.asarray(res["episode_reward_mean"])
    steps = counter_value(res["timesteps_total"])
    at_100k = min(n - 1, math.ceil(100_000 / batch) - 1)
    rows = [
        {
            "case": f"Snake 6x6 seed {seed}",
            "seed": seed,
            "env_steps": int(steps[i, -1]),
            "iter1_return": float(returns[i, 0]),
            "return_at_100k": float(returns[i, at_100k]),
            "final_return": float(returns[i, -1]),
            "random_return": random_return,
            "compile_s_all_seeds": timing["compile_s"],
            "run_s_all_seeds": timing["run_s"],
            "config": config.to_dict(),
        }
        for i, seed in enumerate(args.seeds)
    ]
    rows.append({"case": "Snake 6x6 random (1000 episodes)", "final_return": random_return})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=50, help="iterations per backend row")
    parser.add_argument("--repeats", type=int, default=2, help="executions per row (median)")
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    parser.add_argument("--brax-steps", type=int, default=500_000, help="0: no Brax learning")
    parser.add_argument("--snake-steps", type=int, default=300_000, help="0: no Snake learning")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--quick", action="store_true", help="spring only, 200k/100k steps")
    add_common_args(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.backends, args.repeats = ["spring"], 1
        args.brax_steps, args.snake_steps = 200_000, 100_000
    apply_common_args(args)
    warm_up_backend()
    key = jax.random.PRNGKey(0)
    rows = backends(args, key)
    brax = brax_learning(args) if args.brax_steps > 0 else []
    snake = snake_learning(args, key) if args.snake_steps > 0 else []
    print()
    print_table(
        rows,
        [
            ("backend", "backend", ""),
            ("compile_s", "compile_s", ".1f"),
            ("run_s", "run_s", ".2f"),
            ("env_steps/s", "steps_per_s", ",.0f"),
            ("final_R", "final_episode_reward_mean", ".1f"),
        ],
    )
    if brax:
        print()
        print_table(
            brax,
            [
                ("learning", "case", ""),
                ("env_steps", "env_steps", ","),
                ("iter1_R", "iter1_return", ".1f"),
                ("steps_to_500", "steps_to_500", ","),
                ("steps_to_900", "steps_to_900", ","),
                ("final_R", "final_return", ".1f"),
            ],
        )
    if snake:
        print()
        print_table(
            snake,
            [
                ("learning", "case", ""),
                ("env_steps", "env_steps", ","),
                ("iter1_R", "iter1_return", ".2f"),
                ("R_at_100k", "return_at_100k", ".2f"),
                ("final_R", "final_return", ".2f"),
            ],
        )
    if not args.no_write:
        records = [{**r, "part": "backends", "quick": args.quick} for r in rows]
        records += [{**r, "part": "learning", "quick": args.quick} for r in brax + snake]
        path = write_jsonl("envs", records, args.results_dir)
        print(f"\n# results appended to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
