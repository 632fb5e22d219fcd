"""Time and env steps for PPO to solve CartPole-v1 (episode_reward_mean >= 475).

Uses the tuned preset unchanged (`jaxplan.preset_config("CartPole-v1")`). For each seed, one
measurement as a user would see it in a fresh process:

  compile_s  AOT trace+lower+compile of `plan.init` and of a chunk function
             `run_iterations(plan, state, chunk, Stop(episode_reward_mean=475))` (caches are
             cleared before each seed, so every seed pays the full compile)
  run_s      wall time from running `init` until the host sees the first result with `done`;
             the host loop runs one chunk (`--chunk` iterations, default 10) at a time and
             stops at the first chunk containing a `done` result (within a chunk, iterations
             after `done` are frozen `cond`s and cost next to nothing)
  steps      `timesteps_total` of the first result with `done` (exact, per iteration)
  total_s    compile_s + run_s: wall time to 475, compile included

A seed that has not solved within `--budget` env steps is reported as unsolved. Programs are
compiled with `jaxplan.compiler_options()`, as `jaxplan train` compiles them (until 7 December
2026 with XLA's defaults).

Then the `vmap`ped variant: all seeds in one program, chunked the same way, timed until every
seed has solved (each seed's steps are still taken at its own first `done`).

    python benchmarks/solve.py            # seeds 0..4, budget 500k steps
    python benchmarks/solve.py --quick    # seeds 0..1, a smoke run
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from common import (
    add_common_args,
    aot_compile,
    apply_common_args,
    median,
    print_table,
    warm_up_backend,
    write_jsonl,
)

import jaxplan
from jaxplan.counters import counter_value

ENV = "CartPole-v1"
TARGET = 475.0
OPTIONS = jaxplan.compiler_options()  # the XLA options the CLI compiles with (jaxplan.compiler)


def compile_detail(init, step) -> dict:
    """Lower and compile seconds of the init and chunk programs (for the JSON lines)."""
    return {
        "init_lower": init.lower_s,
        "init_compile": init.compile_s,
        "chunk_lower": step.lower_s,
        "chunk_compile": step.compile_s,
    }


def chunk_fn(plan, chunk: int, stop):
    def run_chunk(state):
        return jaxplan.run_iterations(plan, state, chunk, stop)

    return run_chunk


def first_done(results) -> list[tuple[int, int, float] | None]:
    """Per seed (leading axis, if any): (iteration index in the chunk, timesteps_total,
    episode_reward_mean) of the first result with `done`, or None."""
    done = np.asarray(results["done"])
    steps = np.asarray(counter_value(results["timesteps_total"]))
    reward = np.asarray(results["episode_reward_mean"])
    if done.ndim == 1:
        done, steps, reward = done[None], steps[None], reward[None]
    out = []
    for d, s, r in zip(done, steps, reward, strict=True):
        i = int(np.argmax(d))
        out.append((i, int(s[i]), float(r[i])) if d[i] else None)
    return out


def solve_one(config, seed: int, budget: int, chunk: int) -> dict:
    jax.clear_caches()
    plan = jaxplan.ppo_plan(config)
    stop = jaxplan.Stop(episode_reward_mean=TARGET)
    key = jax.random.PRNGKey(seed)
    init = aot_compile(plan.init, key, compiler_options=OPTIONS)
    state_shape = jax.eval_shape(plan.init, key)
    step = aot_compile(
        chunk_fn(plan, chunk, stop), state_shape, donate_argnums=0, compiler_options=OPTIONS
    )
    compile_s = init.total_s + step.total_s

    per_iter = plan.workers.round_env_steps  # the preset samples one round per iteration
    max_chunks = math.ceil(math.ceil(budget / per_iter) / chunk)
    solved = None
    t0 = time.perf_counter()
    state = init(key)
    for c in range(max_chunks):
        state, results = step(state)
        hit = first_done(results)[0]  # fetching `done` waits for the chunk
        if hit is not None:
            solved = (c, *hit)
            break
    run_s = time.perf_counter() - t0
    row = {
        "case": "seed",
        "seed": seed,
        "compile_s": compile_s,
        "compile_detail_s": compile_detail(init, step),
        "run_s": run_s,
        "chunks_run": (solved[0] + 1) if solved else max_chunks,
    }
    if solved and solved[2] <= budget:
        c, i, steps, reward = solved
        row.update(
            solved=True,
            steps_to_475=steps,
            iterations_to_475=c * chunk + i + 1,
            reward_at_solve=reward,
            total_s=compile_s + run_s,
        )
    else:
        row.update(solved=False, steps_to_475=None, total_s=None)
    return row


def solve_vmapped(config, seeds: list[int], budget: int, chunk: int) -> dict:
    jax.clear_caches()
    plan = jaxplan.ppo_plan(config)
    stop = jaxplan.Stop(episode_reward_mean=TARGET)
    keys = jax.vmap(jax.random.PRNGKey)(jnp.asarray(seeds, jnp.uint32))
    init = aot_compile(jax.vmap(plan.init), keys, compiler_options=OPTIONS)
    states_shape = jax.eval_shape(jax.vmap(plan.init), keys)
    step = aot_compile(
        jax.vmap(chunk_fn(plan, chunk, stop)),
        states_shape,
        donate_argnums=0,
        compiler_options=OPTIONS,
    )
    compile_s = init.total_s + step.total_s

    per_iter = plan.workers.round_env_steps
    max_chunks = math.ceil(math.ceil(budget / per_iter) / chunk)
    # Note: `done` is not carried from one chunk call to the next, so a seed that solved keeps
    # training in later chunks; only its first `done` counts here.
    steps: dict[int, int] = {}
    solved_at_s: dict[int, float] = {}
    t0 = time.perf_counter()
    states = init(keys)
    chunks_run = 0
    for _ in range(max_chunks):
        states, results = step(states)
        chunks_run += 1
        now = time.perf_counter() - t0
        for seed, hit in zip(seeds, first_done(results), strict=True):
            if hit is not None and seed not in steps and hit[1] <= budget:
                steps[seed] = hit[1]
                solved_at_s[seed] = now
        if len(steps) == len(seeds):
            break
    run_s = time.perf_counter() - t0
    all_solved = len(steps) == len(seeds)
    return {
        "case": f"vmap{len(seeds)}",
        "seeds": seeds,
        "compile_s": compile_s,
        "compile_detail_s": compile_detail(init, step),
        "run_s": run_s,
        "chunks_run": chunks_run,
        "solved": all_solved,
        "steps_to_475_per_seed": {str(s): steps.get(s) for s in seeds},
        "run_s_to_solve_per_seed": {str(s): solved_at_s.get(s) for s in seeds},
        "steps_to_475": median(list(steps.values())) if all_solved else None,
        "total_s": compile_s + run_s if all_solved else None,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--budget", type=int, default=500_000, help="max env steps per seed")
    parser.add_argument("--chunk", type=int, default=10, help="iterations per compiled chunk")
    parser.add_argument("--no-vmap", action="store_true", help="skip the vmapped variant")
    parser.add_argument("--quick", action="store_true", help="smoke run: seeds 0 and 1")
    add_common_args(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds = args.seeds[:2]
    apply_common_args(args)
    warm_up_backend()

    config = jaxplan.preset_config(ENV)
    w = jaxplan.build_workers(config)
    print(
        f"# PPO {ENV}, preset: {w.num_actor_groups} workers x {w.num_envs_per_worker} envs x "
        f"{w.rollout_fragment_length} steps = {w.round_env_steps}/iter, train batch "
        f"{config.train_batch_size}, {config.num_sgd_iter} epochs x minibatch "
        f"{config.sgd_minibatch_size}, lr {config.lr:g} | target {TARGET:g} | budget "
        f"{args.budget:,} steps | chunk {args.chunk} iters | seeds {args.seeds}",
        flush=True,
    )
    if w.round_env_steps != config.train_batch_size:
        print("# note: train batch spans several rollout rounds; steps are still exact")

    rows = []
    for seed in args.seeds:
        row = solve_one(config, seed, args.budget, args.chunk)
        rows.append(row)
        print(
            f"# seed {seed}: "
            + (f"{row['steps_to_475']:,} steps" if row["solved"] else "NOT solved")
            + f", compile {row['compile_s']:.1f} s, run {row['run_s']:.2f} s",
            flush=True,
        )
    solved = [r for r in rows if r["solved"]]
    summary = {
        "case": "median",
        "seed": f"{len(solved)}/{len(rows)} solved",
        "steps_to_475": median([r["steps_to_475"] for r in solved]) if solved else None,
        "compile_s": median([r["compile_s"] for r in rows]),
        "run_s": median([r["run_s"] for r in solved]) if solved else None,
        "total_s": median([r["total_s"] for r in solved]) if solved else None,
    }
    vrow = None
    if not args.no_vmap and len(args.seeds) > 1:
        vrow = solve_vmapped(config, args.seeds, args.budget, args.chunk)
        per_seed = vrow["steps_to_475_per_seed"]
        print(
            f"# {vrow['case']}: steps {per_seed}, compile {vrow['compile_s']:.1f} s, "
            f"run {vrow['run_s']:.2f} s (until all solved)",
            flush=True,
        )

    print()
    table = [*rows, summary]
    if vrow is not None:
        table.append({**vrow, "seed": f"{vrow['case']} (median steps; time until all)"})
    print_table(
        table,
        [
            ("seed", "seed", ""),
            ("steps_to_475", "steps_to_475", ",.0f"),
            ("compile_s", "compile_s", ".2f"),
            ("run_s", "run_s", ".2f"),
            ("total_s", "total_s", ".2f"),
        ],
    )
    if not args.no_write:
        records = [
            {**r, "budget": args.budget, "chunk": args.chunk, "target": TARGET}
            for r in [*rows, summary, *([vrow] if vrow else [])]
        ]
        records = [{**r, "config": config.to_dict(), "quick": args.quick} for r in records]
        path = write_jsonl("solve", records, args.results_dir)
        print(f"\n# results appended to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
