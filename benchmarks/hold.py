"""Does a preset stay solved? Steps to the target, the lowest return after it, best and final.

For each seed, a whole run of `--budget` env steps with the env's tuned preset (unchanged
unless `--config KEY=VALUE` is given, to try a change before it goes into the preset):

  steps_to_target  `timesteps_total` of the first iteration with episode_reward_mean >= target
  min_after        the lowest episode_reward_mean from that iteration to the end of the budget
  best             the highest episode_reward_mean of the run
  final            episode_reward_mean of the last iteration
  holds            final >= best - 0.1 * |best| (the run ends within 10% of its best)

Two paths, since float rounding differs between them and a run's trajectory with it: `single`
(one compiled program per seed, what `jaxplan train` runs for one seed) and `vmap` (all seeds
in one program, `jaxplan.train_seeds`); `--paths vmap` runs only the second. Each JSON line
carries the run's curve (`curve_timesteps`, `curve_reward`: one entry per iteration), and
`--plot FILE.png` draws the curves (mean and min-max band over seeds, per path).

    python benchmarks/hold.py                                  # CartPole-v1, 475, 500k, 5 seeds
    python benchmarks/hold.py --env Acrobot-v1 --budget 1000000 --paths vmap --plot a.png
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from common import (
    add_common_args,
    aot_compile,
    apply_common_args,
    config_override,
    print_table,
    timed,
    write_jsonl,
)

import jaxplan
from jaxplan.stages.concat_batches import num_rounds

# a target per env (`--target` overrides): CartPole's solved threshold; gymnasium's Acrobot
# threshold (-100) and the usual -200 for Pendulum (gymnax's PPO checkpoints: -80, -130);
# MinAtar: the returns of gymnax's PPO checkpoints (gymnax README, gymnax-blines' ppo.yaml:
# 10M steps, 64 envs), i.e. a 10M-step figure that shorter budgets need not reach
TARGETS = {
    "CartPole-v1": 475.0,
    "Acrobot-v1": -100.0,
    "Pendulum-v1": -200.0,
    "Asterix-MinAtar": 15.0,
    "Breakout-MinAtar": 28.0,
    "Freeway-MinAtar": 58.0,
    "SpaceInvaders-MinAtar": 131.0,
}
HOLD_FRACTION = 0.1


def summarize(rewards: np.ndarray, timesteps: np.ndarray, target: float) -> dict:
    """Per-iteration `episode_reward_mean` [iters] and `timesteps_total` [iters] of one run ->
    the row (NaN rewards, iterations before the first episode ends, are skipped)."""
    finite = np.isfinite(rewards)
    best = float(np.max(rewards[finite])) if finite.any() else None
    final = float(rewards[-1]) if finite[-1] else None
    holds = None
    if best is not None and final is not None:
        holds = bool(final >= best - HOLD_FRACTION * abs(best))
    row = {"steps_to_target": None, "min_after": None, "best": best, "final": final}
    hit = np.nonzero(finite & (rewards >= target))[0]
    if len(hit):
        first = int(hit[0])
        row["steps_to_target"] = int(timesteps[first])
        row["min_after"] = float(np.nanmin(rewards[first:]))
    return {**row, "holds": holds}


def curve(rewards: np.ndarray, timesteps: np.ndarray) -> dict:
    """The run's curve as JSON lists (NaN -> None)."""
    return {
        "curve_timesteps": [int(t) for t in timesteps],
        "curve_reward": [float(r) if np.isfinite(r) else None for r in rewards],
    }


def plot(rows: list[dict], path: Path, title: str, target: float) -> None:
    """Mean and min-max band of episode_reward_mean over seeds, one line per path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2), dpi=80)
    for name in dict.fromkeys(r["path"] for r in rows):
        runs = [r for r in rows if r["path"] == name]
        t = np.asarray(runs[0]["curve_timesteps"], float)
        r = np.asarray([[np.nan if v is None else v for v in x["curve_reward"]] for x in runs])
        with warnings.catch_warnings():  # iterations before any episode ended: all NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            mean, lo, hi = np.nanmean(r, 0), np.nanmin(r, 0), np.nanmax(r, 0)
        ax.plot(t, mean, label=f"{name} (mean of {len(runs)})", lw=1.2)
        ax.fill_between(t, lo, hi, alpha=0.25, lw=0)
    ax.axhline(target, color="gray", ls="--", lw=0.8, label=f"target {target:g}")
    ax.set_xlabel("env steps")
    ax.set_ylabel("episode_reward_mean")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--target", type=float, default=None, help="default: TARGETS[env]")
    parser.add_argument("--budget", type=int, default=500_000, help="env steps per seed")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument(
        "--paths", nargs="+", choices=["single", "vmap"], default=["single", "vmap"]
    )
    parser.add_argument(
        "--config",
        type=config_override,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a preset key (JSON value), e.g. --config 'lr_schedule=[[0,1e-3],[1e6,0]]'",
    )
    parser.add_argument("--plot", type=Path, default=None, metavar="PNG", help="draw the curves")
    add_common_args(parser)
    args = parser.parse_args(argv)
    target = args.target if args.target is not None else TARGETS.get(args.env)
    if target is None:
        parser.error(f"no default target for --env {args.env!r}: give --target")
    apply_common_args(args)
    overrides = dict(args.config)
    config = jaxplan.preset_config(args.env, overrides)
    plan = jaxplan.ppo_plan(config)
    workers = plan.workers
    round_steps = workers.round_env_steps  # the presets sample bulk_sync
    per_iter = num_rounds(config.train_batch_size, round_steps) * round_steps
    iterations = -(-args.budget // per_iter)
    print(
        f"{args.env}: preset{' + ' + json.dumps(overrides) if overrides else ''}, "
        f"{workers.num_actor_groups} groups x {workers.num_envs_per_worker} envs, "
        f"{iterations} iterations (~{args.budget:,} steps), target {target:g}",
        flush=True,
    )
    rows, timing = [], {}
    train = jaxplan.make_train(plan, iterations)
    if "single" in args.paths:
        key = jax.random.PRNGKey(args.seeds[0])
        compiled = aot_compile(train, key)
        run_s = 0.0
        for seed in args.seeds:
            (_, res), dt = timed(compiled, jax.random.PRNGKey(seed))
            run_s += dt
            ts = np.asarray(res["timesteps_total"].lo, np.int64)
            rw = np.asarray(res["episode_reward_mean"])
            rows.append(
                {"path": "single", "seed": seed, **summarize(rw, ts, target), **curve(rw, ts)}
            )
        timing["single"] = (compiled.total_s, run_s, len(args.seeds) * int(ts[-1]) / run_s)
    if "vmap" in args.paths:
        keys = jax.vmap(jax.random.PRNGKey)(jnp.asarray(args.seeds, jnp.uint32))
        compiled = aot_compile(jax.vmap(train), keys)
        (_, res), run_s = timed(compiled, keys)
        for i, seed in enumerate(args.seeds):
            ts = np.asarray(res["timesteps_total"].lo[i], np.int64)
            rw = np.asarray(res["episode_reward_mean"][i])
            rows.append(
                {"path": "vmap", "seed": seed, **summarize(rw, ts, target), **curve(rw, ts)}
            )
        timing["vmap"] = (compiled.total_s, run_s, len(args.seeds) * int(ts[-1]) / run_s)
    print_table(
        rows,
        [
            ("path", "path", ""),
            ("seed", "seed", ""),
            ("steps to target", "steps_to_target", ","),
            ("min after", "min_after", ".1f"),
            ("best", "best", ".1f"),
            ("final", "final", ".1f"),
            ("holds", "holds", ""),
        ],
    )
    held = [r for r in rows if r["min_after"] is not None and r["min_after"] >= target]
    kept = [r for r in rows if r["holds"]]
    print(
        f"\n{len(held)}/{len(rows)} runs reached {target:g} and never fell below it; "
        f"{len(kept)}/{len(rows)} end within {HOLD_FRACTION:.0%} of their best"
    )
    for name, (compile_s, run_s, sps) in timing.items():
        print(f"{name}: compile {compile_s:.0f} s, run {run_s:.0f} s, {sps:,.0f} env steps/s")
    if args.plot:
        title = f"{args.env} preset, {len(args.seeds)} seeds, {int(ts[-1]):,} steps"
        plot(rows, args.plot, title, target)
        print(f"# curves drawn to {args.plot}")
    if not args.no_write:
        extra = {
            "env": args.env,
            "target": target,
            "budget": args.budget,
            "iterations": iterations,
            "overrides": overrides,
        }
        path = write_jsonl("hold", [{**extra, **r} for r in rows], args.results_dir)
        print(f"# results appended to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
