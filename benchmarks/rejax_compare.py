"""jaxplan against rejax 0.1.3, algorithm by algorithm, at the same work, in one process.

For each algorithm both libraries are configured to the same work (mappings below), each whole
run is one jitted program AOT-compiled once per library (compile_s, cold: `jax.clear_caches()`
before each compile), then the compiled programs run alternately, jaxplan, rejax, jaxplan,
rejax, ... for `--repeats` rounds, so that the noise of a shared machine falls on both alike.
steps/s = env steps of the run / median run time (compile excluded); the ratio is
jaxplan / rejax (> 1: jaxplan faster). final_R shows that both learn: jaxplan's
`episode_reward_mean` (last 100 episodes) at the end; rejax has no such window: the mean over
its envs of each env's last finished episode (kept by the adapter below), so it is noisier.

    ppo   CartPole-v1: the project's PPO "same work" (`throughput.FIXED_WORK`,
          `yardstick_rejax.CONFIG_MAPPING`): 8 envs x 128 steps, 4 epochs x 4 minibatches of
          256, 64x64 tanh, lr 2.5e-4, 500,736 steps.
    dqn   CartPole-v1: `DQN_MAPPING`: rejax's own CartPole DQN config (its
          configs/gymnax/cartpole.yaml) made comparable: 10 envs x 1 step per round, 5 replayed
          batches of 100 per round, 64x64 relu Q-MLP, double-Q, MSE TD loss, lr 1e-3, eps
          1 -> 0.05 over 50k steps, buffer 50k, learning starts 5k, hard target copy every 500
          steps (rejax: polyak 0, target_update_freq 500), 100k steps.
    sac   Pendulum-v1: `SAC_MAPPING`, run only when `jaxplan.algorithms.MODULES` has "sac"
          (otherwise one line says it is skipped).

rejax 0.1.3 expects gymnax's old 5-tuple `step`; gymnax 1.0 returns (obs, state, reward,
terminated, truncated, info). `_rejax_worker.FiveTupleEnv` adapts it with done = terminated |
truncated, which is what rejax did with old gymnax: rejax therefore treats a time-limit
truncation as terminal (no bootstrap), and its replay `next_obs` at an episode end is the reset
observation (masked by `done`). jaxplan bootstraps from the true final observation at a
truncation. This changes learning a little, not the work.

rejax is an optional, separate install (never a jaxplan dependency, never imported by the
library, not needed by CI): a venv with jaxplan and `pip install rejax==0.1.3`, e.g.

    python3 -m venv /work/rejax-venv && /work/rejax-venv/bin/pip install -e . rejax==0.1.3
    /work/rejax-venv/bin/python benchmarks/rejax_compare.py           # ~6 min on 2 CPUs
    /work/rejax-venv/bin/python benchmarks/rejax_compare.py --quick   # ~2 min
    make rejax-compare REJAX_PYTHON=/work/rejax-venv/bin/python
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from importlib.metadata import version
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from common import (  # noqa: E402
    add_common_args,
    aot_compile,
    apply_common_args,
    median,
    timed,
    warm_up_backend,
    write_jsonl,
)

import jaxplan  # noqa: E402
from jaxplan.algorithms import MODULES  # noqa: E402

SETUP_HINT = (
    "rejax_compare needs rejax 0.1.3 next to jaxplan ({error}). In a separate venv (never the "
    "project's):\n"
    "    python3 -m venv /work/rejax-venv && /work/rejax-venv/bin/pip install -e . rejax==0.1.3"
)

# ---- DQN: rejax DQN.create kwargs <- jaxplan (RLlib) keys ---------------------------------
DQN_STEPS = 100_000
DQN_JAXPLAN = {
    "num_workers": 0,
    "num_envs_per_worker": 10,
    "rollout_fragment_length": 1,
    "train_batch_size": 100,
    "training_intensity": 50,  # 5 batches of 100 per 10 sampled steps -> rr weights [1, 5]
    "lr": 1e-3,
    "adam_epsilon": 1e-8,
    "grad_clip": 10.0,
    "gamma": 0.99,
    "double_q": True,
    "dueling": False,
    "n_step": 1,
    "td_error_loss_fn": "mse",
    "model": {"fcnet_hiddens": [64, 64], "fcnet_activation": "relu"},
    "hiddens": [],
    "buffer_size": 50_000,
    "learning_starts": 5_000,
    "prioritized_replay": False,
    "target_network_update_freq": 500,
    "exploration_config": {
        "initial_epsilon": 1.0,
        "final_epsilon": 0.05,
        "epsilon_timesteps": 50_000,
    },
    "timesteps_per_iteration": 1_000,
}
DQN_REJAX = {
    "agent": "QNetwork",
    "agent_kwargs": {"activation": "relu"},  # rejax DQN: always (64, 64)
    "num_envs": 10,
    "batch_size": 100,
    "num_epochs": 5,
    "learning_rate": 1e-3,
    "max_grad_norm": 10.0,
    "gamma": 0.99,
    "ddqn": True,
    "buffer_size": 50_000,
    "fill_buffer": 5_000,
    "polyak": 0.0,
    "target_update_freq": 500,
    "eps_start": 1.0,
    "eps_end": 0.05,
    "exploration_fraction": 0.5,  # of total_timesteps: set to 50k / steps by `dqn_rejax`
    "normalize_observations": False,
    "eval_freq": 1_000,
}
DQN_MAPPING = {
    "num_envs_per_worker=10, rollout_fragment_length=1": "num_envs=10 (one step per env)",
    "train_batch_size=100": "batch_size=100",
    "training_intensity=50 (rr weights [1, 5])": "num_epochs=5 (updates per env step)",
    "lr=1e-3, adam_epsilon=1e-8": "learning_rate=1e-3 (optax.adam, eps 1e-8)",
    "grad_clip=10 (global norm)": "max_grad_norm=10 (optax.clip: per element)",
    "double_q=True, n_step=1, gamma=0.99": "ddqn=True, gamma=0.99",
    "td_error_loss_fn=mse": "optax.l2_loss (0.5 x^2)",
    "model [64, 64] relu, hiddens [], dueling=False": "QNetwork (64, 64) relu",
    "buffer_size=50000, uniform replay": "buffer_size=50000 (sampled without replacement)",
    "learning_starts=5000": "fill_buffer=5000 (uniform actions until then)",
    "target_network_update_freq=500": "polyak=0, target_update_freq=500",
    "epsilon 1 -> 0.05 over 50k steps": "eps 1 -> 0.05, exploration_fraction 0.5 of 100k",
    "timesteps_per_iteration=1000, 100 iterations": "total_timesteps=100k, eval_freq=1000",
}

# ---- SAC (Pendulum-v1), used once jaxplan has "sac" ---------------------------------------
SAC_STEPS = 40_000
SAC_JAXPLAN = {
    "num_workers": 0,
    "num_envs_per_worker": 4,
    "rollout_fragment_length": 1,
    "train_batch_size": 256,
    "training_intensity": 64,  # one batch of 256 per 4 sampled steps
    "gamma": 0.99,
    "tau": 0.005,
    "target_network_update_freq": 0,
    "n_step": 1,
    "twin_q": True,
    "buffer_size": 50_000,
    "learning_starts": 1_000,
    "Q_model": {"fcnet_hiddens": [64, 64], "fcnet_activation": "relu"},
    "policy_model": {"fcnet_hiddens": [64, 64], "fcnet_activation": "relu"},
    "optimization": {
        "actor_learning_rate": 3e-4,
        "critic_learning_rate": 3e-4,
        "entropy_learning_rate": 3e-4,
    },
    "timesteps_per_iteration": 1_000,
}
SAC_REJAX = {
    "agent_kwargs": {"activation": "relu"},
    "num_envs": 4,
    "batch_size": 256,
    "num_epochs": 1,
    "learning_rate": 3e-4,
    "gamma": 0.99,
    "polyak": 0.995,
    "buffer_size": 50_000,
    "fill_buffer": 1_000,
    "normalize_observations": False,
    "eval_freq": 1_000,
}
SAC_MAPPING = {
    "num_envs_per_worker=4, rollout_fragment_length=1": "num_envs=4",
    "train_batch_size=256, training_intensity=64": "batch_size=256, num_epochs=1",
    "optimization lrs 3e-4 (actor, critic, alpha)": "learning_rate=3e-4 (all three)",
    "tau=0.005 every step, twin_q": "polyak=0.995, num_critics=2",
    "Q_model/policy_model [64, 64] relu": "hidden_layer_sizes (64, 64) relu",
    "buffer_size=50000, learning_starts=1000": "buffer_size=50000, fill_buffer=1000",
    "target_entropy auto (-|A|)": "target_entropy -|A| (continuous)",
}


def dqn_rejax(steps: int) -> dict:
    """`DQN_REJAX` for a run of `steps`: rejax decays epsilon over a fraction of the run,
    jaxplan over `epsilon_timesteps` (50k) whatever the run's length."""
    epsilon_steps = DQN_JAXPLAN["exploration_config"]["epsilon_timesteps"]
    return {**DQN_REJAX, "exploration_fraction": epsilon_steps / steps}


def _last_return(algo, ts, rng):
    return ()


def rejax_off_policy(name: str, env_id: str, kwargs: dict, steps: int):
    """rejax's `name` on gymnax `env_id` through the 5-tuple adapter, no evaluation."""
    import gymnax
    import rejax
    from _rejax_worker import FiveTupleEnv

    env, env_params = gymnax.make(env_id)
    algo = rejax.get_algo(name).create(
        env=FiveTupleEnv(env),
        env_params=env_params,
        total_timesteps=steps,
        skip_initial_evaluation=True,
        **kwargs,
    )
    return algo.replace(eval_callback=_last_return)


def jaxplan_plan(name: str, env_id: str, config: dict, steps: int):
    """The plan and the iterations covering `steps` (their env steps must equal `steps`)."""
    plan = jaxplan.get_algorithm(name).plan(config, env=env_id)
    per_iter = config.get("timesteps_per_iteration")
    if per_iter is None:  # PPO: one train batch per iteration
        per_iter = plan.workers.round_env_steps
    n = math.ceil(steps / per_iter)
    return plan, n


def build_cases(args) -> list[dict]:
    """Per case: the two (name, fn, arg) programs, the env steps per run, a mapping note."""
    cases = []
    if "ppo" in args.algorithms:
        from _rejax_worker import make_algo as make_rejax_ppo
        from throughput import fixed_work_plan

        _, plan, n, steps = fixed_work_plan(args.ppo_steps)
        cases.append(
            {
                "case": "ppo",
                "env": "CartPole-v1",
                "steps": steps,
                "jaxplan": jaxplan.make_train(plan, n),
                "rejax": make_rejax_ppo(steps).train,
            }
        )
    if "dqn" in args.algorithms:
        steps = args.dqn_steps
        plan, n = jaxplan_plan("dqn", "CartPole-v1", DQN_JAXPLAN, steps)
        cases.append(
            {
                "case": "dqn",
                "env": "CartPole-v1",
                "steps": steps,
                "jaxplan": jaxplan.make_train(plan, n),
                "rejax": rejax_off_policy("dqn", "CartPole-v1", dqn_rejax(steps), steps).train,
            }
        )
    if "sac" in args.algorithms:
        if "sac" not in MODULES:
            print("# sac: skipped (no SAC in jaxplan yet: 'sac' not in jaxplan.algorithms.MODULES)")
        else:
            steps = args.sac_steps
            plan, n = jaxplan_plan("sac", "Pendulum-v1", SAC_JAXPLAN, steps)
            cases.append(
                {
                    "case": "sac",
                    "env": "Pendulum-v1",
                    "steps": steps,
                    "jaxplan": jaxplan.make_train(plan, n),
                    "rejax": rejax_off_policy("sac", "Pendulum-v1", SAC_REJAX, steps).train,
                }
            )
    return cases


def final_return(lib: str, out, steps: int) -> float:
    """The training return at the end, after checking the env steps the run took."""
    if lib == "jaxplan":
        from throughput import check_steps

        return check_steps(out[1], steps)
    ts = out[0]
    if int(ts.global_step) != steps:
        raise AssertionError(f"rejax ran {int(ts.global_step)} env steps, expected {steps}")
    return float(np.nanmean(np.asarray(ts.env_state.returned_episode_return)))


def run_case(case: dict, args) -> list[dict]:
    key = jax.random.PRNGKey(args.seed)
    compiled, rows = {}, []
    for lib in ("jaxplan", "rejax"):
        jax.clear_caches()  # cold compile for both libraries
        compiled[lib] = aot_compile(case[lib], key)
        print(f"#   {case['case']} {lib}: compile {compiled[lib].total_s:.1f} s", flush=True)
    for rnd in range(args.repeats):
        for lib in ("jaxplan", "rejax"):
            load = os.getloadavg()[0]
            out, run_s = timed(compiled[lib], key)
            row = {
                "case": case["case"],
                "env": case["env"],
                "library": lib,
                "round": rnd,
                "compile_s": compiled[lib].total_s,
                "run_s": run_s,
                "env_steps": case["steps"],
                "steps_per_s": case["steps"] / run_s,
                "final_R": final_return(lib, out, case["steps"]),
                "loadavg_1m_before": load,
            }
            rows.append(row)
            print(
                f"#   round {rnd + 1} {case['case']} {lib}: run {run_s:.2f} s, "
                f"{row['steps_per_s']:,.0f} steps/s, R {row['final_R']:.1f}",
                flush=True,
            )
    return rows


def summarize(records: list[dict]) -> list[dict]:
    out = []
    for case in dict.fromkeys(r["case"] for r in records):
        by = {
            lib: [r for r in records if r["case"] == case and r["library"] == lib]
            for lib in ("jaxplan", "rejax")
        }
        med = {
            lib: {m: median([r[m] for r in rs]) for m in ("steps_per_s", "final_R", "run_s")}
            for lib, rs in by.items()
        }
        pairs = zip(by["jaxplan"], by["rejax"], strict=True)
        per_round = [j["steps_per_s"] / r["steps_per_s"] for j, r in pairs]
        out.append(
            {
                "case": case,
                "env": by["jaxplan"][0]["env"],
                "env_steps": by["jaxplan"][0]["env_steps"],
                "jaxplan_steps_per_s": med["jaxplan"]["steps_per_s"],
                "rejax_steps_per_s": med["rejax"]["steps_per_s"],
                "ratio": med["jaxplan"]["steps_per_s"] / med["rejax"]["steps_per_s"],
                "per_round": " ".join(f"{x:.2f}" for x in per_round),
                "jaxplan_compile_s": by["jaxplan"][0]["compile_s"],
                "rejax_compile_s": by["rejax"][0]["compile_s"],
                "jaxplan_final_R": med["jaxplan"]["final_R"],
                "rejax_final_R": med["rejax"]["final_R"],
            }
        )
    return out


def markdown_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """A markdown table: (header, key, format spec) per column."""

    def cell(row, key, spec):
        v = row.get(key)
        return "-" if v is None else format(v, spec) if spec else str(v)

    lines = ["| " + " | ".join(h for h, _, _ in columns) + " |"]
    lines.append("|" + "|".join("---" for _ in columns) + "|")
    lines += ["| " + " | ".join(cell(r, k, f) for _, k, f in columns) + " |" for r in rows]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--algorithms", nargs="+", default=["ppo", "dqn", "sac"], choices=["ppo", "dqn", "sac"]
    )
    parser.add_argument("--repeats", type=int, default=2, help="alternating rounds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ppo-steps", type=int, default=500_000)
    parser.add_argument("--dqn-steps", type=int, default=DQN_STEPS)
    parser.add_argument("--sac-steps", type=int, default=SAC_STEPS)
    parser.add_argument("--quick", action="store_true", help="100k PPO, 30k DQN, 10k SAC steps")
    add_common_args(parser)
    args = parser.parse_args(argv)
    try:
        import _rejax_worker  # noqa: F401 - imports rejax and gymnax
    except ImportError as e:
        print(SETUP_HINT.format(error=e), file=sys.stderr)
        return 2
    if args.quick:
        args.ppo_steps, args.dqn_steps, args.sac_steps = 100_000, 30_000, 10_000
    apply_common_args(args)
    warm_up_backend()
    print(
        f"# jaxplan {jaxplan.__version__} vs rejax {version('rejax')} (gymnax "
        f"{version('gymnax')}, jax {jax.__version__}) | {args.repeats} rounds, jaxplan/rejax "
        f"alternating | one seed ({args.seed})",
        flush=True,
    )
    records = []
    for case in build_cases(args):
        print(f"# {case['case']} on {case['env']}: {case['steps']:,} env steps", flush=True)
        records += run_case(case, args)
    summary = summarize(records)
    print()
    table = markdown_table(
        summary,
        [
            ("algorithm", "case", ""),
            ("env", "env", ""),
            ("env steps", "env_steps", ",.0f"),
            ("jaxplan steps/s", "jaxplan_steps_per_s", ",.0f"),
            ("rejax steps/s", "rejax_steps_per_s", ",.0f"),
            ("jaxplan/rejax", "ratio", ".2f"),
            ("per round", "per_round", ""),
            ("compile jaxplan s", "jaxplan_compile_s", ".1f"),
            ("compile rejax s", "rejax_compile_s", ".1f"),
            ("final R jaxplan", "jaxplan_final_R", ".1f"),
            ("final R rejax", "rejax_final_R", ".1f"),
        ],
    )
    print(table, flush=True)
    if not args.no_write:
        mapping = {"dqn": DQN_MAPPING, "sac": SAC_MAPPING}
        lines = [{**r, "kind": "measurement"} for r in records]
        lines += [{**s, "kind": "summary", "mapping": mapping.get(s["case"])} for s in summary]
        path = write_jsonl("rejax_compare", lines, args.results_dir)
        print(f"\n# results appended to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
