"""The rejax half of `yardstick_rejax.py`; runs in a separate virtualenv that has rejax.

Never imports jaxplan (rejax lives in its own venv, see yardstick_rejax.py). It borrows only
the timing helpers of `common.py` (stdlib + jax), so both halves are timed the same way.

rejax 0.1.3 expects gymnax's old 5-tuple `step` (obs, state, reward, done, info); gymnax 1.0
returns (obs, state, reward, terminated, truncated, info). `FiveTupleEnv` adapts it
(done = terminated | truncated, which is what rejax did with old gymnax) and also keeps the
return of each env's last finished episode, so the run reports a training return without
rejax's periodic evaluation (turned off: it is not training work).

Prints progress on stderr and one line `YARDSTICK_RESULT <json>` on stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from importlib.metadata import version

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import rejax
from common import measure, warm_up_backend
from flax import struct

ENV = "CartPole-v1"
BATCH = 8 * 128  # num_envs x num_steps


@struct.dataclass
class LogState:
    env_state: object
    episode_return: jax.Array
    returned_episode_return: jax.Array  # return of the last finished episode (nan: none yet)


class FiveTupleEnv:
    """gymnax 1.0 env -> the 5-tuple `step` rejax 0.1.3 calls; everything else delegates."""

    def __init__(self, env):
        self.env = env

    def __getattr__(self, name):
        if name.startswith("__") or name == "env":  # copy.deepcopy probes before __init__
            raise AttributeError(name)
        return getattr(self.env, name)

    def reset(self, key, params=None):
        obs, state = self.env.reset(key, params)
        return obs, LogState(state, jnp.zeros((), jnp.float32), jnp.full((), jnp.nan))

    def step(self, key, state, action, params=None):
        obs, env_state, reward, terminated, truncated, info = self.env.step(
            key, state.env_state, action, params
        )
        done = jnp.logical_or(terminated, truncated)
        ret = state.episode_return + reward
        state = LogState(
            env_state,
            jnp.where(done, 0.0, ret),
            jnp.where(done, ret, state.returned_episode_return),
        )
        return obs, state, reward, done, info


def _no_eval(algo, ts, rng):
    return ()


def make_algo(total_timesteps: int):
    """rejax PPO with the yardstick's fixed work (see yardstick_rejax.py for the mapping)."""
    env, env_params = gymnax.make(ENV)
    algo = rejax.get_algo("ppo").create(
        env=FiveTupleEnv(env),
        env_params=env_params,
        num_envs=8,
        num_steps=128,
        num_epochs=4,
        num_minibatches=4,
        learning_rate=2.5e-4,
        gamma=0.99,
        gae_lambda=0.95,
        clip_eps=0.2,
        vf_coef=0.5,
        ent_coef=0.01,
        max_grad_norm=0.5,
        normalize_observations=False,
        normalize_rewards=False,
        agent_kwargs={"activation": "tanh", "hidden_layer_sizes": (64, 64)},
        total_timesteps=total_timesteps,
        eval_freq=BATCH,  # one train iteration per outer scan step ...
        skip_initial_evaluation=True,
    )
    return algo.replace(eval_callback=_no_eval)  # ... and no evaluation in it


def config_of(algo) -> dict:
    keys = (
        "num_envs num_steps num_epochs num_minibatches learning_rate gamma gae_lambda clip_eps "
        "vf_coef ent_coef max_grad_norm normalize_observations normalize_rewards total_timesteps "
        "eval_freq skip_initial_evaluation"
    ).split()
    out = {k: getattr(algo, k) for k in keys}
    out["actor"] = repr(algo.actor)
    out["critic"] = repr(algo.critic)
    return {k: (v.item() if hasattr(v, "item") else v) for k, v in out.items()}


def measure_rejax(case, fn, arg, execs, env_steps, steps_per_seed):
    row, out = measure(case, fn, arg, execs, env_steps)
    ts, _ = out
    steps = np.atleast_1d(np.asarray(ts.global_step))
    if not np.all(steps == steps_per_seed):
        raise AssertionError(f"expected {steps_per_seed} env steps per seed, got {steps}")
    return {**row, "final_R": float(np.nanmean(np.asarray(ts.env_state.returned_episode_return)))}


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--execs", type=int, default=2)
    p.add_argument("--vmap-execs", type=int, default=1)
    p.add_argument("--seeds", type=int, default=8, help="seeds in the vmap case")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cases", nargs="+", default=["ppo", "ppo_vmap8"])
    p.add_argument("--compile-cache", default=None)
    args = p.parse_args(argv)
    if args.compile_cache:
        jax.config.update("jax_compilation_cache_dir", str(args.compile_cache))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    warm_up_backend()

    n = math.ceil(args.steps / BATCH)
    steps = n * BATCH
    algo = make_algo(steps)
    rows = []
    for case in args.cases:
        load = os.getloadavg()[0]
        if case == "ppo":
            row = measure_rejax(
                case, algo.train, jax.random.PRNGKey(args.seed), args.execs, steps, steps
            )
        elif case == "ppo_vmap8":
            seeds = jnp.arange(args.seed, args.seed + args.seeds, dtype=jnp.uint32)
            keys = jax.vmap(jax.random.PRNGKey)(seeds)
            train = jax.vmap(algo.train)
            row = measure_rejax(case, train, keys, args.vmap_execs, args.seeds * steps, steps)
        else:
            raise ValueError(case)
        row.update(seeds=args.seeds if case != "ppo" else 1, loadavg_1m_before=load)
        rows.append(row)
        print(
            f"#   rejax {case}: compile {row['compile_s']:.1f} s, run {row['run_s']:.2f} s, "
            f"{row['steps_per_s']:,.0f} steps/s, R {row['final_R']:.1f}",
            file=sys.stderr,
            flush=True,
        )
    assert "jaxplan" not in sys.modules
    out = {
        "rejax": version("rejax"),
        "gymnax": version("gymnax"),
        "jax": jax.__version__,
        "jaxlib": version("jaxlib"),
        "flax": version("flax"),
        "optax": version("optax"),
        "iterations": n,
        "steps_per_seed": steps,
        "config": config_of(algo),
        "rows": rows,
    }
    print("YARDSTICK_RESULT " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
