"""Multi-agent throughput (agent steps per second) and a learning figure on JaxMARL's MPE.

Part 1, throughput: every row runs the same fixed work, `--iterations` (default 200)
iterations of 4 actor groups x 8 envs x 32 steps = 1024 env steps (`LAYOUT`, pinned so it does
not drift with the presets), as one compiled program (`jax.jit(jaxplan.make_train(plan, n))`).

  ippo_shared      PPO on MPE simple spread (3 agents), one policy shared by all agents (IPPO
                   with parameter sharing; the tuned preset, the baseline of `ratio`)
  ippo_separate    the same with 3 policies, one per agent
  random_sample    acting only on MPE: `sample_only_plan(workers, mode="bulk_sync")` with a
                   `RandomPolicy` for every agent (the acting ceiling, no network)
  ppo_ma_cartpole  PPO on the built-in 2-agent `MultiAgentCartPole` (CartPole's preset with
                   `LAYOUT` on top), one shared policy

For each: compile_s = AOT trace+lower+compile, run_s = median wall time of `--repeats`
executions, env steps/s and agent steps/s (env steps x agents).

Part 2, learning: the team return (`episode_reward_mean`, the sum over agents of an episode's
rewards, last 100 episodes) of shared-policy IPPO with the MPE preset unchanged after
`--learn-steps` env steps (default 500k), for `--seeds` (default 0 1, `vmap`ped in one
program), next to the random policy's mean team return over its last 1000 episodes (the
`random_sample` row, whose metrics window is 1000 episodes).

    python benchmarks/multiagent.py            # 200 iterations per row, 500k learning steps
    python benchmarks/multiagent.py --quick    # 50 iterations, 200k learning steps (~2 min)
"""

from __future__ import annotations

import argparse
import math
import sys

import jax
import jax.numpy as jnp
from common import (
    add_common_args,
    apply_common_args,
    measure,
    print_table,
    warm_up_backend,
    write_jsonl,
)

import jaxplan
from jaxplan.multi_agent import make_env
from jaxplan.ppo.config import preset_config

MPE = "jaxmarl:MPE_simple_spread_v3"
MA_CARTPOLE = "MultiAgentCartPole"

# The work of every throughput row (the MPE preset's own layout and SGD, pinned).
LAYOUT: dict = {
    "num_workers": 4,
    "num_envs_per_worker": 8,
    "rollout_fragment_length": 32,
    "train_batch_size": 1024,
    "num_sgd_iter": 4,
    "sgd_minibatch_size": 256,
    "model": {"fcnet_hiddens": [64, 64], "fcnet_activation": "tanh"},
}
SEPARATE = {
    "multiagent": {
        "policies": {"a0": {}, "a1": {}, "a2": {}},
        "policy_mapping": {"agent_0": "a0", "agent_1": "a1", "agent_2": "a2"},
    }
}
# PPO rows: (env, config overrides on top of its preset and LAYOUT).
PPO_CASES: dict[str, tuple[str, dict]] = {
    "ippo_shared": (MPE, {}),
    "ippo_separate": (MPE, SEPARATE),
    "ppo_ma_cartpole": (MA_CARTPOLE, {}),
}
RANDOM_CASE = "random_sample"
CASES = ("ippo_shared", "ippo_separate", RANDOM_CASE, "ppo_ma_cartpole")
RANDOM_WINDOW = 1000  # episodes in the random policy's metrics window


def ppo_case(env: str, overrides: dict):
    config = preset_config(env, {**LAYOUT, **overrides})
    return config, jaxplan.ppo_plan(config)


def random_plan(env_name: str, metrics_smoothing_episodes: int = RANDOM_WINDOW):
    """`sample_only_plan(mode="bulk_sync")` on LAYOUT's workers with one `RandomPolicy` that
    every agent maps to."""
    env = make_env(env_name)
    agent = env.agents[0]
    policy = jaxplan.RandomPolicy(env.observation_shapes[agent], env.action_spaces[agent])
    workers = jaxplan.WorkerSet(
        env,
        {"random": policy},
        num_workers=LAYOUT["num_workers"],
        num_envs_per_worker=LAYOUT["num_envs_per_worker"],
        rollout_fragment_length=LAYOUT["rollout_fragment_length"],
        metrics_smoothing_episodes=metrics_smoothing_episodes,
    )
    return jaxplan.sample_only_plan(workers, mode="bulk_sync")


def last_reports(plan, results) -> list[dict]:
    """The host report of the last iteration, per seed (results with or without a leading
    seed axis)."""
    steps = results["training_iteration"]
    if steps.ndim == 1:
        return [plan.report(jax.tree.map(lambda x: x[-1], results))]
    return [plan.report(jax.tree.map(lambda x, s=s: x[s, -1], results)) for s in range(len(steps))]


def check_steps(plan, results, env_steps: int) -> list[dict]:
    """Asserts every seed sampled exactly `env_steps` env steps and `env_steps x agents` agent
    steps; returns the last reports."""
    agents = len(plan.workers.agents)
    reports = last_reports(plan, results)
    for r in reports:
        got = (int(r["timesteps_total"]), int(r["agent_timesteps_total"]))
        if got != (env_steps, env_steps * agents):
            raise AssertionError(f"expected {(env_steps, env_steps * agents)} steps, got {got}")
    return reports


def throughput(args, key) -> list[dict]:
    rows = []
    for case in args.cases:
        print(f"# {case} ...", flush=True)
        if case == RANDOM_CASE:
            env, config, plan = MPE, None, random_plan(MPE)
            policy = "random"
        else:
            env, overrides = PPO_CASES[case]
            config, plan = ppo_case(env, overrides)
            policy = "ppo"
        workers = plan.workers
        batch = workers.round_env_steps
        assert batch == 1024, (case, batch)
        env_steps = args.iterations * batch
        agents = len(workers.agents)
        train = jaxplan.make_train(plan, args.iterations)
        row, (_, res) = measure(case, train, key, args.repeats, env_steps)
        last = check_steps(plan, res, env_steps)[0]
        row.update(
            env=env,
            policy=policy,
            agents=agents,
            policies=len(workers.policies),
            iterations=args.iterations,
            agent_steps=env_steps * agents,
            agent_steps_per_s=row["steps_per_s"] * agents,
            final_episode_reward_mean=float(last["episode_reward_mean"]),
            episode_len_mean=float(last["episode_len_mean"]),
            episodes_total=int(last["episodes_total"]),
            metrics_smoothing_episodes=workers.metrics_smoothing_episodes,
            config=None if config is None else config.to_dict(),
        )
        rows.append(row)
        print(
            f"#   compile {row['compile_s']:.1f} s, run {row['run_s']:.2f} s, "
            f"{row['agent_steps_per_s']:,.0f} agent steps/s",
            flush=True,
        )
    base = next((r["agent_steps_per_s"] for r in rows if r["case"] == "ippo_shared"), None)
    for r in rows:
        r["ratio_to_ippo_shared"] = r["agent_steps_per_s"] / base if base else None
    return rows


def random_baseline(rows, key) -> dict:
    """The random policy's mean team return over its last RANDOM_WINDOW episodes: the
    `random_sample` row's, or a run of its own when that row was not measured."""
    row = next((r for r in rows if r["case"] == RANDOM_CASE), None)
    if row is None:
        plan = random_plan(MPE)
        # twice the window's env steps (MPE episodes are 26 steps)
        iterations = math.ceil(2 * RANDOM_WINDOW * 26 / plan.workers.round_env_steps)
        _, res = jax.jit(jaxplan.make_train(plan, iterations))(key)
        last = last_reports(plan, res)[0]
        row = {
            "final_episode_reward_mean": float(last["episode_reward_mean"]),
            "episodes_total": int(last["episodes_total"]),
            "env_steps": iterations * plan.workers.round_env_steps,
        }
    if row["episodes_total"] < RANDOM_WINDOW:
        print(f"# warning: random baseline from {row['episodes_total']} < {RANDOM_WINDOW} episodes")
    return {
        "team_return": row["final_episode_reward_mean"],
        "episodes": min(row["episodes_total"], RANDOM_WINDOW),
        "episodes_total": row["episodes_total"],
        "env_steps": row["env_steps"],
    }


def learning(args, rows, key) -> list[dict]:
    config = preset_config(MPE)
    plan = jaxplan.ppo_plan(config)
    batch = plan.workers.round_env_steps
    n = math.ceil(args.learn_steps / batch)
    env_steps = n * batch
    print(
        f"# learning: IPPO shared, MPE preset, {n} iterations = {env_steps:,} env steps, "
        f"seeds {args.seeds} (vmapped) ...",
        flush=True,
    )
    keys = jax.vmap(jax.random.PRNGKey)(jnp.asarray(args.seeds, jnp.uint32))
    train = jax.vmap(jaxplan.make_train(plan, n))
    timing, (_, res) = measure("ippo_shared_learning", train, keys, 1, len(args.seeds) * env_steps)
    lasts = check_steps(plan, res, env_steps)
    first = jax.device_get(res["episode_reward_mean"][:, 0])
    random = random_baseline(rows, key)
    out = []
    for seed, last, r0 in zip(args.seeds, lasts, first, strict=True):
        team = float(last["episode_reward_mean"])
        out.append(
            {
                "case": f"ippo_shared seed {seed}",
                "seed": seed,
                "env_steps": env_steps,
                "team_return": team,
                "first_iteration_team_return": float(r0),
                "episode_len_mean": float(last["episode_len_mean"]),
                "metrics_smoothing_episodes": config.metrics_smoothing_episodes,
                "random_team_return": random["team_return"],
                "improvement": team - random["team_return"],
                "improvement_rel": (team - random["team_return"]) / abs(random["team_return"]),
                "compile_s_all_seeds": timing["compile_s"],
                "run_s_all_seeds": timing["run_s"],
                "config": config.to_dict(),
            }
        )
    out.append(
        {
            "case": "random (RandomPolicy)",
            "env_steps": random["env_steps"],
            "team_return": random["team_return"],
            "metrics_smoothing_episodes": RANDOM_WINDOW,
            "episodes_total": random["episodes_total"],
            "random_team_return": random["team_return"],
            "improvement": 0.0,
            "improvement_rel": 0.0,
        }
    )
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=200, help="iterations per row")
    parser.add_argument("--repeats", type=int, default=3, help="executions per row (median)")
    parser.add_argument("--learn-steps", type=int, default=500_000, help="0: no learning part")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 50 iterations, 1 repeat, 200k steps"
    )
    parser.add_argument("--seed", type=int, default=0, help="key of the throughput rows")
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    add_common_args(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.iterations, args.repeats, args.learn_steps = 50, 1, 200_000
    apply_common_args(args)
    warm_up_backend()
    print(
        f"# {LAYOUT['num_workers']} groups x {LAYOUT['num_envs_per_worker']} envs x "
        f"{LAYOUT['rollout_fragment_length']} steps = 1024 env steps/iter | {args.iterations} "
        f"iterations per row | {args.repeats} repeat(s)",
        flush=True,
    )
    key = jax.random.PRNGKey(args.seed)
    rows = throughput(args, key)
    learned = learning(args, rows, key) if args.learn_steps > 0 else []

    print()
    print_table(
        rows,
        [
            ("case", "case", ""),
            ("env", "env", ""),
            ("agents", "agents", ""),
            ("policies", "policies", ""),
            ("compile_s", "compile_s", ".2f"),
            ("run_s", "run_s", ".2f"),
            ("env_steps/s", "steps_per_s", ",.0f"),
            ("agent_steps/s", "agent_steps_per_s", ",.0f"),
            ("ratio", "ratio_to_ippo_shared", ".2f"),
            ("final_R", "final_episode_reward_mean", ".1f"),
        ],
    )
    if learned:
        print()
        print_table(
            learned,
            [
                ("learning (MPE simple spread)", "case", ""),
                ("env_steps", "env_steps", ","),
                ("team_return", "team_return", ".2f"),
                ("iter1_return", "first_iteration_team_return", ".2f"),
                ("vs_random", "improvement", "+.2f"),
                ("vs_random_rel", "improvement_rel", "+.1%"),
            ],
        )
    if not args.no_write:
        records = [{**r, "part": "throughput", "quick": args.quick} for r in rows]
        records += [{**r, "part": "learning", "quick": args.quick} for r in learned]
        path = write_jsonl("multiagent", records, args.results_dir)
        print(f"\n# results appended to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
