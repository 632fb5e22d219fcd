"""A stateful stage written outside the library, with its public API only, in PPO's plan.

`RunningObsStats` keeps a running mean / variance of the observations of every sampled row
(the statistics an observation normaliser needs) in its own stage state, merged per rollout
round with Chan et al.'s parallel update and summed across devices on a mesh. `ObsRecorder`
(a second stage, a fixed-size buffer like a replay buffer) keeps every observation so the test
can compute the reference in float64 numpy. Both are inserted after ParallelRollouts, so they
also run inside ConcatBatches' scan. Checked: the statistics against numpy, the plan's training
unchanged (the stages pass batches through), bulk_sync and async, 4 fake devices against 1
(in a subprocess: `python tests/test_custom_stage.py --devices 4` prints JSON), and `vmap` over
seeds against one run per seed. Nothing here imports a jaxplan module beyond `jaxplan`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

import jaxplan

SMALL = {
    "num_workers": 4,
    "num_envs_per_worker": 2,
    "rollout_fragment_length": 8,
    "train_batch_size": 128,  # 2 bulk_sync rounds of 64 rows (8 async rounds of 16)
    "sgd_minibatch_size": 32,
    "num_sgd_iter": 2,
    "model": {"fcnet_hiddens": [16]},
}
ITERATIONS = 5
PID = jaxplan.DEFAULT_POLICY_ID


@struct.dataclass
class ObsStats:
    count: jax.Array  # float32 []
    mean: jax.Array  # float32 [obs_dim]
    m2: jax.Array  # float32 [obs_dim], sum of squared deviations


class RunningObsStats(jaxplan.Stage):
    """Running mean and std of `obs` over every row sampled for `policy_id`."""

    def __init__(self, policy_id: str, obs_dim: int):
        self.policy_id = policy_id
        self.obs_dim = obs_dim

    def init(self, state):
        zeros = jnp.zeros((self.obs_dim,), jnp.float32)
        return state, ObsStats(count=jnp.float32(0), mean=zeros, m2=zeros)

    def apply(self, state, stats, batch):
        obs = batch.policy_batches[self.policy_id]["obs"]  # [rows on this device, obs_dim]
        total = obs.sum(0)
        if batch.shard_axis is not None:  # every device's rows
            total = jax.lax.psum(total, batch.shard_axis)
        n = jnp.float32(obs.shape[0] * batch.num_shards)
        mean = total / n
        m2 = jnp.square(obs - mean).sum(0)
        if batch.shard_axis is not None:
            m2 = jax.lax.psum(m2, batch.shard_axis)
        count = stats.count + n
        delta = mean - stats.mean
        merged = ObsStats(
            count=count,
            mean=stats.mean + delta * n / count,
            m2=stats.m2 + m2 + jnp.square(delta) * stats.count * n / count,
        )
        return state, merged, batch

    def metrics(self, state, stats):
        std = jnp.sqrt(stats.m2 / jnp.maximum(stats.count, 1.0))
        return {
            "custom_metrics": {"obs_mean": stats.mean, "obs_std": std, "obs_count": stats.count}
        }


@struct.dataclass
class Recorded:
    obs: jax.Array  # [capacity, obs_dim]
    size: jax.Array  # int32 []


class ObsRecorder(jaxplan.Stage):
    """Appends every sampled `obs` row to a fixed buffer (one device)."""

    def __init__(self, policy_id: str, obs_dim: int, capacity: int):
        self.policy_id, self.obs_dim, self.capacity = policy_id, obs_dim, capacity

    def init(self, state):
        buffer = jnp.zeros((self.capacity, self.obs_dim), jnp.float32)
        return state, Recorded(obs=buffer, size=jnp.int32(0))

    def apply(self, state, rec, batch):
        obs = batch.policy_batches[self.policy_id]["obs"]
        buffer = jax.lax.dynamic_update_slice_in_dim(rec.obs, obs, rec.size, 0)
        return state, Recorded(obs=buffer, size=rec.size + obs.shape[0]), batch


def plan_with(workers, config, extra=()):
    """PPO's execution plan (as `jaxplan.execution_plan` writes it) with `extra` stages
    inserted after ParallelRollouts."""
    rollouts = jaxplan.ParallelRollouts(
        workers, mode=config.rollout_mode, num_async=config.num_async
    )
    for stage in extra:
        rollouts = rollouts.for_each(stage)
    rollouts = rollouts.for_each(jaxplan.SelectExperiences(workers.trainable_policies()))
    rollouts = rollouts.combine(jaxplan.ConcatBatches(min_batch_size=config.train_batch_size))
    rollouts = rollouts.for_each(jaxplan.StandardizeFields(["advantages"]))
    train_op = rollouts.for_each(
        jaxplan.MultiGPUTrainOneStep(
            workers,
            sgd_minibatch_size=config.sgd_minibatch_size,
            num_sgd_iter=config.num_sgd_iter,
        )
    )
    train_op = train_op.for_each(lambda t: t[1]).for_each(jaxplan.UpdateKL())
    return jaxplan.StandardMetricsReporting(train_op, workers)


def build(overrides=None, record=False):
    config = jaxplan.preset_config("CartPole-v1", {**SMALL, **(overrides or {})})
    workers = jaxplan.build_workers(config)
    (obs_dim,) = workers.env.observation_shape
    extra = [RunningObsStats(PID, obs_dim)]
    if record:
        rows = -(-config.train_batch_size // 64) * 64 * ITERATIONS
        extra.append(ObsRecorder(PID, obs_dim, capacity=rows))
    return plan_with(workers, config, extra), plan_with(workers, config)


def run(plan, seed=0, iterations=ITERATIONS):
    state = jax.jit(plan.init)(jax.random.PRNGKey(seed))
    return jax.jit(lambda s: jaxplan.run_iterations(plan, s, iterations))(state)


@pytest.fixture(scope="module")
def bulk_runs():
    custom, plain = build(record=True)
    return custom, run(custom), run(plain)


def test_stage_state_lives_in_plan_state_under_the_stages_names(bulk_runs):
    custom, (state, _), _ = bulk_runs
    assert sorted(state.stages) == ["obs_recorder", "running_obs_stats"]
    assert isinstance(state.stages["running_obs_stats"], ObsStats)
    assert not hasattr(state.actors, "running_obs_stats")


def test_running_stats_match_numpy_over_every_sampled_observation(bulk_runs):
    _, (state, results), _ = bulk_runs
    rec = state.stages["obs_recorder"]
    rows = int(rec.size)
    assert rows == ITERATIONS * 128 == rec.obs.shape[0]
    obs = np.asarray(rec.obs, np.float64)
    last = jax.tree.map(lambda x: np.asarray(x[-1]), results["custom_metrics"])
    assert float(last["obs_count"]) == rows
    np.testing.assert_allclose(last["obs_mean"], obs.mean(0), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(last["obs_std"], obs.std(0), rtol=1e-4, atol=1e-5)
    # the statistics grew iteration by iteration (reported from the stage's state)
    counts = np.asarray(results["custom_metrics"]["obs_count"]).tolist()
    assert counts == [128.0 * (i + 1) for i in range(ITERATIONS)]


def test_pass_through_stages_leave_training_bit_identical(bulk_runs):
    _, (state, results), (plain_state, plain_results) = bulk_runs
    for a, b in zip(
        jax.tree.leaves((state.policies, state.counters, state.key)),
        jax.tree.leaves((plain_state.policies, plain_state.counters, plain_state.key)),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    learner = results["info"]["learner"][PID]["learner_stats"]
    for name, value in learner.items():
        np.testing.assert_array_equal(
            np.asarray(value),
            np.asarray(plain_results["info"]["learner"][PID]["learner_stats"][name]),
        )


def test_stage_in_async_plan():
    custom, _ = build({"rollout_mode": "async"})
    state, results = run(custom, iterations=2)
    assert sorted(state.stages) == ["parallel_rollouts", "running_obs_stats"]
    assert np.asarray(results["custom_metrics"]["obs_count"]).tolist() == [128.0, 256.0]
    assert np.all(np.asarray(results["custom_metrics"]["obs_std"][-1]) > 0)


def test_vmap_over_seeds_equals_one_run_per_seed(bulk_runs):
    custom = bulk_runs[0]
    _, results = jaxplan.train_seeds(custom, [0, 1], ITERATIONS)
    for seed in (0, 1):
        _, alone = bulk_runs[1] if seed == 0 else run(custom, seed=seed)
        for name in ("obs_mean", "obs_std", "obs_count"):
            np.testing.assert_allclose(
                np.asarray(results["custom_metrics"][name][seed]),
                np.asarray(alone["custom_metrics"][name]),
                rtol=1e-5,
                atol=1e-6,
            )
    # different seeds saw different observations
    means = np.asarray(results["custom_metrics"]["obs_mean"][:, -1])
    assert not np.allclose(means[0], means[1])


def test_four_fake_devices_give_the_one_device_statistics():
    """One iteration (two rounds, both sampled with the initial params: the same data on 1 and
    4 devices by design) on 4 fake devices, in a subprocess, against one device. Later
    iterations may sample differently once float rounding of the all-reduced update flips an
    action, so only the first is compared (whole-plan params: tests/test_devices.py)."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    proc = subprocess.run(
        [sys.executable, __file__, "--devices", "4"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    many = json.loads(proc.stdout.strip().splitlines()[-1])
    assert many["devices"] == 4 and many["stages"] == ["running_obs_stats"]
    one = _one_iteration(1)
    assert many["custom_metrics"]["obs_count"] == one["custom_metrics"]["obs_count"] == 128.0
    for name in ("obs_mean", "obs_std"):
        np.testing.assert_allclose(
            many["custom_metrics"][name], one["custom_metrics"][name], rtol=1e-5, atol=1e-6
        )
    assert many["trained"] == one["trained"] == 1  # the 4-device plan trained too


def _one_iteration(num_devices: int) -> dict:
    custom, _ = build({"num_devices": num_devices} if num_devices > 1 else {})
    state, results = run(custom, iterations=1)
    return {
        "devices": jax.device_count(),
        "stages": sorted(state.stages),
        "custom_metrics": jax.tree.map(
            lambda x: np.asarray(x[0]).tolist(), results["custom_metrics"]
        ),
        "trained": int(state.policies[PID].version),
    }


if __name__ == "__main__":  # the N-device run, in a process of its own
    print(json.dumps(_one_iteration(int(sys.argv[sys.argv.index("--devices") + 1]))))


def test_a_stage_that_changes_its_state_shape_is_named_before_compiling():
    class Growing(jaxplan.Stage):
        def init(self, state):
            return state, jnp.zeros(3)

        def apply(self, state, own, batch):
            return state, jnp.concatenate([own, own]), batch

    config = jaxplan.preset_config("CartPole-v1", SMALL)
    workers = jaxplan.build_workers(config)
    plan = jaxplan.StandardMetricsReporting(
        jaxplan.ParallelRollouts(workers).for_each(Growing()), workers
    )
    state = jax.eval_shape(plan.init, jax.random.PRNGKey(0))
    with pytest.raises(TypeError, match=r"stage 'growing': apply must return its state"):
        jax.eval_shape(plan.step, state)
