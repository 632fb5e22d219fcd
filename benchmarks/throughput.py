"""Env steps per second of PPO training on CartPole-v1 at a fixed amount of work.

The work matches the peer figures in the project's anchors (PureJaxRL, rejax, SB3, RLlib at
"same work"): 8 envs x 128 steps (train batch 1024), 4 epochs of 4 minibatches of 256, 64x64
tanh actor and critic, lr 2.5e-4, gamma 0.99, lambda 0.95, clip 0.2, no KL term, grad clip
0.5, value loss coefficient 0.5, entropy coefficient 0.01, 500k env steps.

The 8 envs are laid out as `num_workers=8, num_envs_per_worker=1` (8 actor groups of one env;
jaxplan `vmap`s both axes, so `1 x 8` is the same program shape-wise).

Cases, each the whole run (the same env steps per seed) as one `lax.scan` program:

  ppo                    PPO, one seed, bulk_sync rollouts (`jax.jit(make_train(plan, n))`); the
                         baseline of `ratio_to_ppo`
  ppo_async              the same PPO with `rollout_mode="async"` (staggered actor groups with
                         lagged params; 8 rounds of one 128-step fragment make a train batch)
  ppo_async_vtrace       `rollout_mode="async", vtrace=True`
  sample_only_bulk_sync  acting alone with the same workers: rollouts + metrics, no learning
                         (`sample_only_plan(workers, mode="bulk_sync")`); the ceiling for PPO at
                         this env count
  sample_only_async      the same with `mode="async"` (`sample_only_plan`'s default, RLlib's seed
                         plan); one iteration is one round = one group's fragment (128 steps)
  random_async           `sample_only_async` with `RandomPolicy` in place of the PPO policy
                         (acting without the network)
  ppo_vmap8              the `ppo` run for 8 seeds `vmap`ped in one program, lowered as
                         `jaxplan.train_seeds` does (threefry unrolled, the seeds split over
                         the devices: `--cpu-devices`, default one per core); steps/s summed

Wide acting, 2048 envs (8 workers x 256 envs x 128 steps = 262,144 env steps per iteration,
`--wide-iterations` iterations, default 8):

  ppo_2048               PPO training at that width: train batch 262,144, 4 epochs x 4
                         minibatches of 65,536 (FIXED_WORK's shape, 256x wider)
  sample_only_2048       `sample_only_plan(workers, mode="bulk_sync")` with the PPO policy
  random_2048            the same with `RandomPolicy` (acting without the network)
  gymnax_random_2048     the yardstick: a raw gymnax rollout of the same size written as a
                         user would (`vmap(env.step)` over 2048 envs with random actions from
                         `vmap(action_space.sample)`, `lax.scan` over 128 steps keeping obs,
                         action, reward and done, gymnax's own auto-reset), no jaxplan; its
                         steps/s over `random_2048`'s is `random_2048`'s gap to raw gymnax

For each: compile_s = AOT trace+lower+compile, run_s = median wall time of executing the
compiled program (`--repeats` times, each from the same initial key, waiting for the results),
program_MiB = the compiled program's memory by XLA's buffer assignment (arguments + outputs +
temporaries: the host memory one execution needs on the CPU, load-independent); the run also
prints the process's peak resident memory.

    python benchmarks/throughput.py            # 500k steps per seed
    python benchmarks/throughput.py --quick    # 50k steps, a smoke run
"""

from __future__ import annotations

import argparse
import math
import resource
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
from jaxplan.fast_rng import unrolled_threefry
from jaxplan.seed_devices import seed_mesh, spread_seeds


def jaxplan_compile() -> dict:
    """`measure` kwargs: jaxplan's programs are compiled as `Runner` and `train_seeds`
    compile them (the raw gymnax rollout, the yardstick without jaxplan: XLA's defaults)."""
    return {"compiler_options": jaxplan.compiler_options()}


ENV = "CartPole-v1"

# Every key that decides the work is pinned, so this does not drift with the tuned preset.
FIXED_WORK: dict = {
    "num_workers": 8,
    "num_envs_per_worker": 1,
    "rollout_fragment_length": 128,
    "train_batch_size": 1024,
    "num_sgd_iter": 4,
    "sgd_minibatch_size": 256,
    "shuffle_sequences": True,
    "model": {"fcnet_hiddens": [64, 64], "fcnet_activation": "tanh", "vf_share_layers": False},
    "lr": 2.5e-4,
    "gamma": 0.99,
    "lambda": 0.95,
    "clip_param": 0.2,
    "vf_clip_param": 10.0,
    "kl_coeff": 0.0,
    "grad_clip": 0.5,
    "vf_loss_coeff": 0.5,
    "entropy_coeff": 0.01,
    "metrics_smoothing_episodes": 100,
}
NUM_SEEDS_VMAP = 8
# PPO cases: config overrides on top of FIXED_WORK (`ppo`, bulk_sync, is the ratio baseline).
PPO_CASES: dict[str, dict] = {
    "ppo": {},
    "ppo_async": {"rollout_mode": "async"},
    "ppo_async_vtrace": {"rollout_mode": "async", "vtrace": True},
}
# Acting-only cases, `sample_only_plan` on FIXED_WORK's workers: (rollout mode, policy).
SAMPLE_CASES: dict[str, tuple[str, str]] = {
    "sample_only_bulk_sync": ("bulk_sync", "ppo"),
    "sample_only_async": ("async", "ppo"),
    "random_async": ("async", "random"),
}
WIDE_ENVS = 2048  # 8 workers x 256 envs
WIDE_CASES: dict[str, str | None] = {  # case -> policy (None: raw gymnax, no jaxplan)
    "ppo_2048": "ppo",  # training; the others act only
    "sample_only_2048": "ppo",
    "random_2048": "random",
    "gymnax_random_2048": None,
}
CASES = (*PPO_CASES, *SAMPLE_CASES, "ppo_vmap8", *WIDE_CASES)


def gymnax_random_rollout(num_envs: int, length: int, iterations: int):
    """A raw gymnax random-action rollout, as a user writes one without a framework:
    `train(key)` runs `iterations` rollouts of `length` steps of `num_envs` envs (one `lax.scan`
    each, gymnax's auto-reset, the transitions kept as the scan's outputs) and returns each
    iteration's mean reward and done count (so no transition is dead code)."""
    import gymnax

    env, params = gymnax.make(ENV)
    sample = jax.vmap(env.action_space(params).sample)
    step = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def train(key):
        key, reset_key = jax.random.split(key)
        obs, state = jax.vmap(env.reset, in_axes=(0, None))(
            jax.random.split(reset_key, num_envs), params
        )

        def env_step(carry, _):
            key, obs, state = carry
            key, act_key, step_key = jax.random.split(key, 3)
            action = sample(jax.random.split(act_key, num_envs))
            next_obs, state, reward, terminated, truncated, _ = step(
                jax.random.split(step_key, num_envs), state, action, params
            )
            done = terminated | truncated
            return (key, next_obs, state), (obs, action, reward, done)

        def iteration(carry, _):
            carry, (obs, action, reward, done) = jax.lax.scan(env_step, carry, None, length)
            stats = (jnp.mean(reward), jnp.sum(done), jnp.sum(obs), jnp.sum(action))
            return carry, stats

        _, stats = jax.lax.scan(iteration, (key, obs, state), None, iterations)
        return stats

    return train


def fixed_work_plan(min_steps: int, overrides: dict | None = None):
    """The FIXED_WORK config (with `overrides` on top) and PPO plan, and the whole iterations
    `n` covering `min_steps` (`n * 1024` env steps per seed)."""
    config = jaxplan.preset_config(ENV, {**FIXED_WORK, **(overrides or {})})
    plan = jaxplan.ppo_plan(config)
    batch = plan.workers.round_env_steps
    assert batch == config.train_batch_size == 1024, (batch, config.train_batch_size)
    n = math.ceil(min_steps / batch)
    return config, plan, n, n * batch


def random_workers(workers):
    """`workers` with a `RandomPolicy` in place of its policy: same env, actor groups, envs per
    group, fragment length, metrics window and mesh."""
    env, normalize = workers.env, workers.normalize_actions
    policy = jaxplan.RandomPolicy(
        env.observation_shape, env.action_space, normalize_actions=normalize
    )
    return jaxplan.WorkerSet(
        env,
        {jaxplan.DEFAULT_POLICY_ID: policy},
        num_workers=workers.num_workers,
        num_envs_per_worker=workers.num_envs_per_worker,
        rollout_fragment_length=workers.rollout_fragment_length,
        normalize_actions=normalize,
        metrics_smoothing_episodes=workers.metrics_smoothing_episodes,
        mesh=workers.mesh,
    )


def sample_plan(config, mode: str, policy: str, steps: int):
    """`sample_only_plan(workers, mode=mode)` on the config's workers (PPO policy, or a
    `RandomPolicy` when `policy == "random"`), and the iterations that sample exactly `steps`:
    an iteration is a whole round in bulk_sync, one group's fragment per device in async."""
    workers = jaxplan.build_workers(config)
    if policy == "random":
        workers = random_workers(workers)
    per_iteration = workers.round_env_steps
    if mode == "async":
        per_iteration //= workers.local_groups
    assert steps % per_iteration == 0, (steps, per_iteration)
    return jaxplan.sample_only_plan(workers, mode=mode), steps // per_iteration


def check_steps(results, expected_per_seed: int) -> float:
    """Asserts the run sampled exactly the steps it was meant to; returns the last mean return
    (averaged over seeds) as a sanity figure."""
    last = jax.tree.map(lambda x: x[..., -1], results)  # last iteration (any leading seed axis)
    steps = np.atleast_1d(counter_value(last["timesteps_total"]))
    if not np.all(steps == expected_per_seed):
        raise AssertionError(f"expected {expected_per_seed} env steps per seed, got {steps}")
    return float(np.nanmean(np.asarray(last["episode_reward_mean"])))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=500_000, help="env steps per seed")
    parser.add_argument("--quick", action="store_true", help="smoke run: 50k steps, 1 repeat")
    parser.add_argument("--repeats", type=int, default=3, help="executions per case (median)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument(
        "--wide-iterations",
        type=int,
        default=8,
        help=f"iterations of the {WIDE_ENVS}-env cases ({WIDE_ENVS * 128:,} env steps each)",
    )
    parser.add_argument(
        "--unrolled-rng",
        action="store_true",
        help="lower threefry unrolled on the CPU (jaxplan.fast_rng) before compiling",
    )
    add_common_args(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.repeats, args.wide_iterations = 50_000, 1, 2
    apply_common_args(args)
    if args.unrolled_rng:
        from jaxplan.fast_rng import use_unrolled_threefry

        print(f"# unrolled threefry on the CPU: {use_unrolled_threefry()}", flush=True)
    warm_up_backend()

    config, plan, n, steps = fixed_work_plan(args.steps)
    batch = plan.workers.round_env_steps
    print(
        f"# PPO {ENV}: {plan.workers.num_actor_groups} workers x "
        f"{plan.workers.num_envs_per_worker} envs x {plan.workers.rollout_fragment_length} steps"
        f" = {batch}/iter, {config.num_sgd_iter} epochs x minibatch {config.sgd_minibatch_size}"
        f" | {n} iterations = {steps:,} env steps per seed | {args.repeats} repeat(s)",
        flush=True,
    )

    key = jax.random.PRNGKey(args.seed)
    rows = []
    for case in args.cases:
        print(f"# {case} ...", flush=True)
        row_config, seeds, iterations = config, 1, n
        if case in PPO_CASES:
            row_config, row_plan, n_case, _ = fixed_work_plan(args.steps, PPO_CASES[case])
            assert n_case == n, (case, n_case, n)
            mode, policy = row_config.rollout_mode, "ppo"
            train = jaxplan.make_train(row_plan, n)
            row, (_, res) = measure(case, train, key, args.repeats, steps, **jaxplan_compile())
        elif case in SAMPLE_CASES:
            mode, policy = SAMPLE_CASES[case]
            row_config = config.updated({"rollout_mode": mode})  # recorded; workers unchanged
            sample, iterations = sample_plan(row_config, mode, policy, steps)
            train = jaxplan.make_train(sample, iterations)
            row, (_, res) = measure(case, train, key, args.repeats, steps, **jaxplan_compile())
        elif case in WIDE_CASES:
            mode, policy = "bulk_sync", WIDE_CASES[case] or "gymnax"
            iterations = args.wide_iterations
            wide_envs = WIDE_ENVS // config.num_workers
            row_config = config.updated({"num_envs_per_worker": wide_envs})
            wide_steps = WIDE_ENVS * config.rollout_fragment_length * iterations
            if case == "ppo_2048":
                batch = WIDE_ENVS * config.rollout_fragment_length
                row_config = config.updated(
                    {
                        "num_envs_per_worker": wide_envs,
                        "train_batch_size": batch,
                        "sgd_minibatch_size": batch // 4,
                    }
                )
                train = jaxplan.make_train(jaxplan.ppo_plan(row_config), iterations)
                row, (_, res) = measure(
                    case, train, key, args.repeats, wide_steps, **jaxplan_compile()
                )
                check_steps(res, wide_steps)
            elif WIDE_CASES[case] is None:
                train = gymnax_random_rollout(WIDE_ENVS, config.rollout_fragment_length, iterations)
                row, _ = measure(case, train, key, args.repeats, wide_steps)
            else:
                sample, n_wide = sample_plan(row_config, mode, policy, wide_steps)
                assert n_wide == iterations, (n_wide, iterations)
                train = jaxplan.make_train(sample, iterations)
                row, (_, res) = measure(
                    case, train, key, args.repeats, wide_steps, **jaxplan_compile()
                )
                check_steps(res, wide_steps)
            row.update(
                mode=mode,
                policy=policy,
                seeds=1,
                iterations=iterations,
                steps_per_seed=wide_steps,
                config=row_config.to_dict(),
                final_episode_reward_mean=None,
            )
            rows.append(row)
            print(
                f"#   {WIDE_ENVS} envs: compile {row['compile_s']:.1f} s, run {row['run_s']:.2f} s,"
                f" {row['steps_per_s']:,.0f} steps/s",
                flush=True,
            )
            continue
        else:
            mode, policy, seeds = config.rollout_mode, "ppo", NUM_SEEDS_VMAP
            seed_ids = jnp.arange(args.seed, args.seed + seeds, dtype=jnp.uint32)
            keys = jax.vmap(jax.random.PRNGKey)(seed_ids)
            train = jax.vmap(jaxplan.make_train(plan, n))
            train = spread_seeds(train, seed_mesh(seeds))  # as train_seeds: over the devices
            with unrolled_threefry():  # lowered as `jaxplan.train_seeds` does
                row, (_, res) = measure(
                    case, train, keys, args.repeats, seeds * steps, **jaxplan_compile()
                )
        row["final_episode_reward_mean"] = check_steps(res, steps)
        row.update(
            mode=mode,
            policy=policy,
            seeds=seeds,
            iterations=iterations,
            steps_per_seed=steps,
            config=row_config.to_dict(),
        )
        rows.append(row)
        print(
            f"#   {mode}: compile {row['compile_s']:.1f} s, run {row['run_s']:.2f} s, "
            f"{row['steps_per_s']:,.0f} steps/s",
            flush=True,
        )

    base = next((r["steps_per_s"] for r in rows if r["case"] == "ppo"), None)
    raw = next((r["steps_per_s"] for r in rows if r["case"] == "gymnax_random_2048"), None)
    for r in rows:
        r["ratio_to_ppo"] = r["steps_per_s"] / base if base else None
        wide = r["case"] in WIDE_CASES and r["case"] != "ppo_2048"  # acting rows only
        r["ratio_to_gymnax"] = r["steps_per_s"] / raw if raw and wide else None
        mem = r.get("program_bytes")
        r["program_MiB"] = mem / 2**20 if mem is not None else None

    print()
    print_table(
        rows,
        [
            ("case", "case", ""),
            ("mode", "mode", ""),
            ("compile_s", "compile_s", ".2f"),
            ("run_s", "run_s", ".2f"),
            ("env_steps", "env_steps", ","),
            ("steps_per_s", "steps_per_s", ",.0f"),
            ("ratio_to_ppo", "ratio_to_ppo", ".2f"),
            ("ratio_to_gymnax", "ratio_to_gymnax", ".2f"),
            ("program_MiB", "program_MiB", ",.1f"),
            ("final_R", "final_episode_reward_mean", ".1f"),
        ],
    )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(f"\n# peak resident memory of this process (all cases): {peak:,.0f} MiB")
    if not args.no_write:
        records = [{**r, "quick": args.quick} for r in rows]
        path = write_jsonl("throughput", records, args.results_dir)
        print(f"\n# results appended to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
