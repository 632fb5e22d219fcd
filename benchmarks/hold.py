"""Does a preset stay solved? Steps to the target and the lowest return over the rest of the budget.

For each seed, a whole run of `--budget` env steps with the env's tuned preset, unchanged:

  steps_to_target  `timesteps_total` of the first iteration with episode_reward_mean >= target
  min_after        the lowest episode_reward_mean from that iteration to the end of the budget
  final            episode_reward_mean of the last iteration

Two paths, since float rounding differs between them and a run's trajectory with it: `single`
(one compiled program per seed, what `jaxplan train` runs for one seed) and `vmap` (all seeds
in one program, `jaxplan.train_seeds`).

    python benchmarks/hold.py                                  # CartPole-v1, 475, 500k, 5 seeds
    python benchmarks/hold.py --env Acrobot-v1 --target -100 --budget 1000000
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from common import add_common_args, apply_common_args, print_table, write_jsonl

import jaxplan
from jaxplan.stages.concat_batches import num_rounds


def summarize(rewards: np.ndarray, timesteps: np.ndarray, target: float) -> dict:
    """Per-iteration `episode_reward_mean` and `timesteps_total` of one run -> the row."""
    hit = np.nonzero(rewards >= target)[0]
    if not len(hit):
        return {"steps_to_target": None, "min_after": None, "final": float(rewards[-1])}
    first = int(hit[0])
    return {
        "steps_to_target": int(timesteps[first]),
        "min_after": float(np.nanmin(rewards[first:])),
        "final": float(rewards[-1]),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--target", type=float, default=475.0)
    parser.add_argument("--budget", type=int, default=500_000, help="env steps per seed")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    add_common_args(parser)
    args = parser.parse_args(argv)
    apply_common_args(args)
    plan = jaxplan.ppo_plan(env=args.env)
    workers = plan.workers
    config = jaxplan.preset_config(args.env)
    round_steps = workers.round_env_steps  # the presets sample bulk_sync
    per_iter = num_rounds(config.train_batch_size, round_steps) * round_steps
    iterations = -(-args.budget // per_iter)
    print(
        f"{args.env}: preset, {workers.num_actor_groups} groups x {workers.num_envs_per_worker} "
        f"envs, {iterations} iterations (~{args.budget:,} steps), target {args.target:g}",
        flush=True,
    )
    train = jax.jit(jaxplan.make_train(plan, iterations))
    rows = []
    t0 = time.perf_counter()
    for seed in args.seeds:
        _, res = train(jax.random.PRNGKey(seed))
        timesteps = np.asarray(res["timesteps_total"].lo, np.int64)
        rewards = np.asarray(res["episode_reward_mean"])
        rows.append({"path": "single", "seed": seed, **summarize(rewards, timesteps, args.target)})
    t1 = time.perf_counter()
    keys = jax.vmap(jax.random.PRNGKey)(jnp.asarray(args.seeds, jnp.uint32))
    _, res = jax.jit(jax.vmap(jaxplan.make_train(plan, iterations)))(keys)
    for i, seed in enumerate(args.seeds):
        timesteps = np.asarray(res["timesteps_total"].lo[i], np.int64)
        rewards = np.asarray(res["episode_reward_mean"][i])
        rows.append({"path": "vmap", "seed": seed, **summarize(rewards, timesteps, args.target)})
    t2 = time.perf_counter()
    print_table(
        rows,
        [
            ("path", "path", ""),
            ("seed", "seed", ""),
            ("steps to target", "steps_to_target", ","),
            ("min after", "min_after", ".1f"),
            ("final", "final", ".1f"),
        ],
    )
    held = [r for r in rows if r["min_after"] is not None and r["min_after"] >= args.target]
    print(
        f"\n{len(held)}/{len(rows)} runs reached {args.target:g} and never fell below it "
        f"(single {t1 - t0:.0f} s, vmap {t2 - t1:.0f} s incl. compile)"
    )
    if not args.no_write:
        extra = {"env": args.env, "target": args.target, "budget": args.budget}
        path = write_jsonl("hold", [{**extra, **r} for r in rows], args.results_dir)
        print(f"# results appended to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
