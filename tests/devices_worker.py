"""Runs in a subprocess started by `test_devices.py` with
`XLA_FLAGS=--xla_force_host_platform_device_count=N` (JAX must see N CPU devices from the
start). Prints one JSON line of measurements for the parent test to assert on.

    python tests/devices_worker.py equivalence N   # N-device stages vs the 1-device ones
    python tests/devices_worker.py solve N         # PPO on N devices, CartPole to 475
    python tests/devices_worker.py evaluation N    # the evaluation stage, N devices vs 1
    python tests/devices_worker.py plan N          # two PPO iterations, N devices vs 1
    python tests/devices_worker.py plan_ma N       # the same, multi-agent with a shared policy
"""

from __future__ import annotations

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from jaxplan import (
    MultiGPUTrainOneStep,
    ParallelRollouts,
    StandardizeFields,
    TrainOneStep,
    ppo_plan,
)
from jaxplan.batch import DEFAULT_POLICY_ID, MultiAgentBatch
from jaxplan.devices import AXIS
from jaxplan.ppo.config import preset_config
from jaxplan.ppo.plan import build_workers
from jaxplan.run import Stop, run_iterations

PID = DEFAULT_POLICY_ID
# 8 groups x 2 envs x 16 steps = 256 rows per round: divisible by every N in 1, 2, 4, 8
SMALL = {
    "num_workers": 8,
    "num_envs_per_worker": 2,
    "rollout_fragment_length": 16,
    "train_batch_size": 256,
    "sgd_minibatch_size": 32,
    "num_sgd_iter": 2,
    "model": {"fcnet_hiddens": [32, 32]},
}


def max_diff(a, b) -> float:
    """Largest absolute difference over all leaves (a pytree of arrays)."""
    diffs = jax.tree.map(
        lambda x, y: float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)))),
        a,
        b,
    )
    return max(jax.tree.leaves(diffs))


def rounds_one_and_many(one, many, key):
    """One rollout round from the same initial state: on one device (`one`, no mesh) and
    sharded over `many`'s mesh. Returns `(ref_state, ref_batch, state, batch)`; the sharded
    batch's rows are device-major."""
    state0 = one.init(key)
    ref_state, ref_batch = jax.jit(ParallelRollouts(one).pull)(state0)
    specs = many.state_specs()
    sharded_round = jax.shard_map(
        ParallelRollouts(many).pull,
        mesh=many.mesh,
        in_specs=(specs,),
        out_specs=(specs, P(AXIS)),
    )
    state, batch = jax.jit(sharded_round)(many.place(state0, specs))
    return ref_state, ref_batch, state, batch


def equivalence(n: int) -> dict:
    assert jax.device_count() == n, jax.devices()
    one = build_workers(preset_config("CartPole-v1", SMALL))  # no mesh
    many = build_workers(preset_config("CartPole-v1", {**SMALL, "num_devices": n}))
    out = {"devices": jax.device_count(), "mesh": many.mesh.size}

    # 1. one rollout round: N devices produce the single device's data, row for row
    ref_state, ref_batch, dev_state, dev_batch = rounds_one_and_many(
        one, many, jax.random.PRNGKey(3)
    )
    t, g, e = one.rollout_fragment_length, one.num_actor_groups // n, one.num_envs_per_worker

    def device_major_to_time_major(x):  # [n * (t g e), ...] -> [(t n g e), ...]
        x = np.asarray(x).reshape(n, t, g, e, *x.shape[1:])
        return x.transpose(1, 0, 2, 3, *range(4, x.ndim)).reshape(-1, *x.shape[4:])

    rows = jax.tree.map(device_major_to_time_major, dev_batch.policy_batches[PID])
    out["rollout_max_diff"] = max_diff(rows, ref_batch.policy_batches[PID])
    out["rollout_actions_equal"] = bool(
        np.array_equal(rows["actions"], ref_batch.policy_batches[PID]["actions"])
    )
    out["episodes_equal"] = bool(
        all(
            np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True)
            for x, y in zip(
                jax.tree.leaves(dev_state.episodes),
                jax.tree.leaves(ref_state.episodes),
                strict=True,
            )
        )
    )
    out["counters_equal"] = bool(
        all(
            np.array_equal(x, y)
            for x, y in zip(
                jax.tree.leaves(dev_state.counters),
                jax.tree.leaves(ref_state.counters),
                strict=True,
            )
        )
    )

    # 2. StandardizeFields + MultiGPUTrainOneStep on the same global batch (device-major shards)
    #    against the single-device StandardizeFields + TrainOneStep
    global_batch = ref_batch.policy_batches[PID]
    train_state = ref_state

    def reference(state, pb):
        batch = StandardizeFields(["advantages"])(MultiAgentBatch({PID: pb}, env_steps=256))
        train = TrainOneStep(one, num_sgd_iter=2, sgd_minibatch_size=32)
        state, _, (batch, info) = train.apply(state, None, batch)
        return state.policies, info, batch.policy_batches[PID]["advantages"]

    def data_parallel(state, pb):
        batch = MultiAgentBatch({PID: pb}, env_steps=256, shard_axis=AXIS, num_shards=n)
        batch = StandardizeFields(["advantages"])(batch)
        step = MultiGPUTrainOneStep(many, sgd_minibatch_size=32, num_sgd_iter=2, num_gpus=n)
        state, _, (batch, info) = step.apply(state, None, batch)
        return state.policies, info, batch.policy_batches[PID]["advantages"]

    ref_pol, ref_info, ref_adv = jax.jit(reference)(train_state, global_batch)
    dp = jax.shard_map(
        data_parallel,
        mesh=many.mesh,
        in_specs=(P(), P(AXIS)),
        out_specs=(P(), P(), P(AXIS)),
    )
    dp_pol, dp_info, dp_adv = jax.jit(dp)(train_state, global_batch)
    out["standardized_max_diff"] = max_diff(dp_adv, ref_adv)
    out["params_max_diff"] = max_diff(dp_pol[PID].params, ref_pol[PID].params)
    out["params_max_abs"] = max(
        float(np.max(np.abs(x))) for x in jax.tree.leaves(ref_pol[PID].params)
    )
    out["opt_state_max_diff"] = max_diff(dp_pol[PID].opt_state, ref_pol[PID].opt_state)
    out["stats_max_diff"] = {
        k: max_diff(dp_info[PID]["learner_stats"][k], v)
        for k, v in ref_info[PID]["learner_stats"].items()
    }
    out["params_changed"] = max_diff(ref_pol[PID].params, train_state.policies[PID].params)

    # 3. the replication check notices a replica that differs (N > 1 only)
    if n > 1:
        from jax.sharding import NamedSharding

        from jaxplan.distributed import check_replicated

        sharding = NamedSharding(many.mesh, P())
        replicas = [
            jax.device_put(jnp.full((3,), float(i == 1)), d)
            for i, d in enumerate(many.mesh.devices.flat)
        ]
        bad = jax.make_array_from_single_device_arrays((3,), sharding, replicas)
        try:
            check_replicated({"w": bad})
            out["divergence_caught"] = False
        except RuntimeError as e:
            out["divergence_caught"] = "['w']" in str(e)
        check_replicated(dp_pol)  # the trained policies are replicated: no error
    return out


def solve(n: int) -> dict:
    """The CartPole preset on n devices, stopped at 475 or 150k env steps."""
    plan = ppo_plan({"num_devices": n}, env="CartPole-v1")
    stop = Stop(episode_reward_mean=475.0, timesteps_total=150_000)
    run = jax.jit(lambda s: run_iterations(plan, s, 50, stop))
    state = jax.jit(plan.init)(jax.random.PRNGKey(0))
    best, steps = float("nan"), 0
    for _ in range(6):  # 300 iterations of 512 steps at most; Stop ends it earlier
        state, results = run(state)
        reports = plan.reports(results)
        done = [r for r in reports if r["done"]]
        last = done[0] if done else reports[-1]
        best, steps = last["episode_reward_mean"], last["timesteps_total"]
        if done:
            break
    return {"mesh": plan.workers.mesh.size, "episode_reward_mean": best, "timesteps_total": steps}


def async_lag(n: int) -> dict:
    """Async PPO on n devices: each device staggers its own groups, so the steady-state lag is
    `groups / n - 1` (one train step per round); every round emits one fragment per device."""
    plan = ppo_plan(
        {
            **SMALL,
            "num_devices": n,
            "rollout_mode": "async",
            "num_workers": 4 * n,
            "rollout_fragment_length": 8,
            "train_batch_size": 8 * 2 * n,  # one round (a fragment per device) per train step
            "sgd_minibatch_size": 8 * n,
            "num_sgd_iter": 1,
        },
        env="CartPole-v1",
    )
    state = jax.jit(plan.init)(jax.random.PRNGKey(0))
    _, results = jax.jit(lambda s: run_iterations(plan, s, 8))(state)
    reports = plan.reports(results)
    return {
        "mesh": plan.workers.mesh.size,
        "lag_max": [r["info"]["learner"][PID]["policy_lag_max"] for r in reports],
        "steps_per_iter": reports[0]["timesteps_this_iter"],
        "group_versions": reports[-1]["info"]["actor_group_versions"][PID],
    }


def multiagent(n: int) -> dict:
    """MultiAgentCartPole with two policies on n devices: the sharded rollouts give each
    policy the one-device rows; async + data-parallel SGD run and report lag per policy."""
    ma = {
        **SMALL,
        "env": "MultiAgentCartPole",
        "multiagent": {
            "policies": {"p0": {}, "p1": {"lr": 1e-3}},
            "policy_mapping": {"agent_0": "p0", "agent_1": "p1"},
        },
    }
    one = build_workers(preset_config("MultiAgentCartPole", ma))
    many = build_workers(preset_config("MultiAgentCartPole", {**ma, "num_devices": n}))
    _, ref, _, got = rounds_one_and_many(one, many, jax.random.PRNGKey(4))
    t, g, e = one.rollout_fragment_length, one.num_actor_groups // n, one.num_envs_per_worker
    diffs = {}
    for pid in ("p0", "p1"):
        rows = jax.tree.map(
            lambda x: np.moveaxis(np.asarray(x).reshape(n, t, g, e, *x.shape[1:]), 0, 1).reshape(
                x.shape
            ),
            got.policy_batches[pid],
        )
        diffs[pid] = max_diff(rows, ref.policy_batches[pid])
    plan = ppo_plan(
        preset_config(
            "MultiAgentCartPole",
            {
                **ma,
                "num_devices": n,
                "rollout_mode": "async",
                "rollout_fragment_length": 8,
                "train_batch_size": 8 * 2 * n,
                "sgd_minibatch_size": 8 * n,
                "num_sgd_iter": 1,
            },
        )
    )
    state = jax.jit(plan.init)(jax.random.PRNGKey(0))
    _, results = jax.jit(lambda s: run_iterations(plan, s, 6))(state)
    reports = plan.reports(results)
    return {
        "rollout_max_diff": diffs,
        "lag_max": {
            pid: [r["info"]["learner"][pid]["policy_lag_max"] for r in reports]
            for pid in ("p0", "p1")
        },
        "policy_reward_keys": sorted(reports[-1]["policy_reward_mean"]),
        "agent_steps": reports[-1]["agent_timesteps_total"],
        "env_steps": reports[-1]["timesteps_total"],
    }


def evaluation(n: int) -> dict:
    """The evaluation stage on n devices (5 episodes: padded to a multiple of n) against
    `evaluate` on one device with the same params (the ones just trained) and key: the
    episodes are the same, since each is its own actor group with keys split for all."""
    from jaxplan.stages.evaluation import evaluate

    config = {**SMALL, "evaluation_interval": 1, "evaluation_duration": 5, "num_devices": n}
    plan = ppo_plan(config, env="CartPole-v1")
    state = plan.init(jax.random.PRNGKey(3))
    key = state.stages["evaluation"].key
    state, result = jax.jit(plan.step)(state)
    mesh = plan.report(result)["evaluation"]
    one = ppo_plan({**config, "num_devices": 0}, env="CartPole-v1")
    params = jax.device_get({pid: ps.params for pid, ps in state.policies.items()})
    ref = jax.jit(lambda p, k: evaluate(one.workers, p, k, num_episodes=5, explore=True))(
        params, jax.random.split(key)[1]
    )
    ref = {k: np.asarray(v).tolist() for k, v in ref["hist_stats"].items()}
    return {"equal": mesh["hist_stats"] == ref, "evaluation": mesh, "reference": ref}


PLAN_SMALL = {
    "num_workers": 4,
    "num_envs_per_worker": 2,
    "rollout_fragment_length": 8,
    "train_batch_size": 128,  # ConcatBatches of 2 rounds of 4 groups x 2 envs x 8 steps
    "sgd_minibatch_size": 32,  # 4 shuffled minibatches per epoch
    "num_sgd_iter": 2,
    "lr": 1e-3,
    "model": {"fcnet_hiddens": [16]},
}


def plan_equivalence(n: int, env: str = "CartPole-v1", config: dict = PLAN_SMALL) -> dict:
    """Two whole PPO iterations (rollouts, ConcatBatches of 2 rounds, 2 epochs of shuffled
    minibatches of a quarter of the batch) on n devices against no mesh, from the same key: the
    gathered train batch has the one-device row order, so the minibatches hold the same rows
    and the params agree up to float rounding. Also `devices.gather_rows` on known rows."""
    from jaxplan.devices import gather_rows

    params, init = {}, None
    for num_devices in (0, n):
        plan = ppo_plan(preset_config(env, {**config, "num_devices": num_devices}))
        state = jax.jit(plan.init)(jax.random.PRNGKey(7))
        init = jax.device_get({pid: ps.params for pid, ps in state.policies.items()})
        step = jax.jit(plan.step)
        for _ in range(2):
            state, _ = step(state)
        params[num_devices] = jax.device_get({pid: ps.params for pid, ps in state.policies.items()})
    blocks, rows = 3, np.arange(n * 3 * 2)  # each device: 3 blocks of 2 rows
    interleaved = jax.jit(
        jax.shard_map(
            lambda x: gather_rows(x, AXIS, blocks),
            mesh=plan.workers.mesh,
            in_specs=P(AXIS),
            out_specs=P(),
        )
    )(rows)
    expected = rows.reshape(n, blocks, 2).transpose(1, 0, 2).reshape(-1)
    return {
        "mesh": plan.workers.mesh.size,
        "policies": sorted(params[0]),
        "params_max_diff": max_diff(params[n], params[0]),
        "params_changed": max_diff(params[0], init),
        "gather_rows_ok": bool(np.array_equal(np.asarray(interleaved), expected)),
    }


def plan_equivalence_multi_agent(n: int) -> dict:
    """`plan_equivalence` on 3-agent CartPole: `agent_0` and `agent_1` share `p0` (2 rows per
    env step), `agent_2` has `p1`."""
    ma = {
        **PLAN_SMALL,
        "env_config": {"num_agents": 3},
        "multiagent": {
            "policies": {"p0": {}, "p1": {}},
            "policy_mapping": {"agent_0": "p0", "agent_1": "p0", "agent_2": "p1"},
        },
    }
    return plan_equivalence(n, "MultiAgentCartPole", ma)


if __name__ == "__main__":
    mode, n = sys.argv[1], int(sys.argv[2])
    modes = {"equivalence": equivalence, "solve": solve, "async": async_lag, "ma": multiagent}
    modes["evaluation"] = evaluation
    modes["plan"], modes["plan_ma"] = plan_equivalence, plan_equivalence_multi_agent
    result = modes[mode](n)
    print(json.dumps(result))
