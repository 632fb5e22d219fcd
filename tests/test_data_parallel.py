"""Data-parallel learners on 2 fake CPU devices against the same plan on one device: the
gradient each device contributes is its own (averaged, not summed: JAX transposes the
broadcast of replicated params into a `psum` inside `shard_map`, see `devices.varying`), and
DQN's replay buffer sharded over the devices replays the rows one device would.

One subprocess (the fake devices must be set before JAX starts) runs every case; the plans
are tiny, so it is compile time (~1 min on 2 cores)."""

from __future__ import annotations

import os
import textwrap

import pytest
from conftest import run_json_worker

SCRIPT = r"""
import json
import jax, jax.numpy as jnp, numpy as np
from jaxplan.algorithms import get_algorithm

def run(algo, config, n, iters):
    if n:
        config = {**config, "num_devices": n, "_fake_gpus": True}
    plan = get_algorithm(algo).plan(config, env="CartPole-v1")
    state = plan.init(jax.random.PRNGKey(0))
    step = jax.jit(plan.step)
    for _ in range(iters):
        state, result = step(state)
    return plan, state, plan.report(result)

def leaves(tree):
    return [np.asarray(x, np.float64) for x in jax.tree.leaves(tree)]

def max_diff(a, b):
    return max(float(np.max(np.abs(x - y))) for x, y in zip(leaves(a), leaves(b), strict=True))

out = {}
# PPO without gradient clipping: Adam's first moment is the mean gradient (2x if summed)
ppo = {"num_workers": 2, "num_envs_per_worker": 2, "rollout_fragment_length": 8,
       "train_batch_size": 32, "sgd_minibatch_size": 16, "num_sgd_iter": 2, "grad_clip": None}
_, one, _ = run("ppo", ppo, 0, 1)
_, two, _ = run("ppo", ppo, 2, 1)
mu = lambda s: s.policies["default_policy"].opt_state
out["ppo_opt_state_diff"] = max_diff(mu(one), mu(two))
out["ppo_opt_state_scale"] = max(  # of Adam's first moment
    float(np.max(np.abs(np.asarray(x))))
    for path, x in jax.tree_util.tree_leaves_with_path(mu(one))
    if jax.tree_util.keystr(path).endswith(".mu"))

# DQN: sharded replay buffer + data-parallel TrainOneStep
dqn = {"num_workers": 2, "num_envs_per_worker": 2, "rollout_fragment_length": 4,
       "buffer_size": 160, "train_batch_size": 32, "learning_starts": 32,
       "timesteps_per_iteration": 64, "target_network_update_freq": 48,
       "model": {"fcnet_hiddens": [16]}}
_, one, r1 = run("dqn", dqn, 0, 4)
plan, two, r2 = run("dqn", dqn, 2, 4)
out["dqn_policy_diff"] = max_diff(one.policies, two.policies)
out["dqn_params_changed"] = max_diff(
    one.policies["default_policy"].params["q"],
    plan.init(jax.random.PRNGKey(0)).policies["default_policy"].params["q"])
buf1 = one.stages["local_replay_buffer"].storage["default_policy"]
buf2 = two.stages["local_replay_buffer"].storage["default_policy"]
lrb = dict(plan.flow.stages)["local_replay_buffer"]
device, local = map(np.asarray, lrb.locate("default_policy", jnp.arange(160)))
out["shard_rows"] = int(np.asarray(two.stages["local_replay_buffer"].storage[
    "default_policy"]["obs"]).shape[0] // 2)
out["buffer_equal"] = all(
    np.array_equal(np.asarray(buf1[k]), np.asarray(buf2[k])[device * 80 + local]) for k in buf1)
out["devices_hold_own_rows"] = sorted(np.unique(device).tolist())
s1 = r1["info"]["learner"]["default_policy"]["learner_stats"]
s2 = r2["info"]["learner"]["default_policy"]["learner_stats"]
out["dqn_stats_diff"] = {k: abs(s1[k] - s2[k]) for k in s1}
out["steps"] = [r1["timesteps_total"], r2["timesteps_total"]]

# SAC (DQN's plan with a loss that samples): the same noise per row on any device count
sac = {"num_workers": 2, "num_envs_per_worker": 2, "rollout_fragment_length": 2,
       "buffer_size": 80, "train_batch_size": 16, "learning_starts": 16,
       "timesteps_per_iteration": 32,
       "Q_model": {"fcnet_hiddens": [16]}, "policy_model": {"fcnet_hiddens": [16]}}
def run_sac(n):
    config = {**sac, **({"num_devices": n, "_fake_gpus": True} if n else {})}
    plan = get_algorithm("sac").plan(config, env="Pendulum-v1")
    state = plan.init(jax.random.PRNGKey(0))
    step = jax.jit(plan.step)
    for _ in range(3):
        state, result = step(state)
    return state, plan.report(result)
(one, r1), (two, r2) = run_sac(0), run_sac(2)
out["sac_policy_diff"] = max_diff(one.policies, two.policies)
out["sac_trained"] = r1["info"]["num_steps_trained"]
s1 = r1["info"]["learner"]["default_policy"]["learner_stats"]
s2 = r2["info"]["learner"]["default_policy"]["learner_stats"]
out["sac_stats_diff"] = {k: abs(s1[k] - s2[k]) for k in s1}

# DQN with prioritized replay: replicated priorities, TD errors gathered from the devices
per = {**dqn, "prioritized_replay": True}
_, one, _ = run("dqn", per, 0, 3)
_, two, _ = run("dqn", per, 2, 3)
out["per_policy_diff"] = max_diff(one.policies, two.policies)
p1 = np.asarray(one.stages["local_replay_buffer"].priorities["default_policy"])
p2 = np.asarray(two.stages["local_replay_buffer"].priorities["default_policy"])
out["per_priorities_diff"] = float(np.max(np.abs(p1 - p2)))
out["per_priorities_spread"] = float(np.max(p1) - np.min(p1))

errors = {}
for key, overrides in {
    "buffer_size": {"buffer_size": 150},
    "train_batch_size": {"train_batch_size": 33},
}.items():
    try:
        get_algorithm("dqn").plan({**dqn, **overrides, "num_devices": 2, "_fake_gpus": True},
                                  env="CartPole-v1")
        errors[key] = None
    except ValueError as e:
        errors[key] = str(e)
out["errors"] = errors
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def two_devices() -> dict:
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    return run_json_worker(["-c", textwrap.dedent(SCRIPT)], env)


def test_each_device_contributes_its_own_gradient(two_devices):
    """Adam's moments after one PPO iteration without clipping: the same on 2 devices as on
    one. Before `devices.varying` they were 2x (mu) and 4x (nu): the all-reduced gradient was
    the devices' sum, which Adam's scale invariance hid from the params."""
    assert two_devices["ppo_opt_state_scale"] > 0.1  # the moments are not ~0
    assert two_devices["ppo_opt_state_diff"] < 1e-5, two_devices


def test_dqn_on_two_devices_matches_one_device(two_devices):
    """4 iterations (120 replayed train steps): the buffer's rows (mapped to their devices'
    shards) are bit-identical, params and Adam moments agree to float rounding."""
    out = two_devices
    assert out["steps"][0] == out["steps"][1] == 256
    assert out["shard_rows"] == 80 and out["devices_hold_own_rows"] == [0, 1]
    assert out["buffer_equal"]
    assert out["dqn_params_changed"] > 1e-2  # the update is real
    assert out["dqn_policy_diff"] < 1e-6, out["dqn_policy_diff"]
    for key, diff in out["dqn_stats_diff"].items():  # min_q / max_q over the whole batch
        assert diff < 1e-5, (key, diff)


def test_sac_on_two_devices_matches_one_device(two_devices):
    """SAC's loss samples actions: on a mesh each device keeps its rows' share of the whole
    minibatch's noise, so 2 devices give the 1-device params (3 iterations)."""
    out = two_devices
    assert out["sac_trained"] > 0
    assert out["sac_policy_diff"] < 1e-5, out["sac_policy_diff"]
    for key, diff in out["sac_stats_diff"].items():
        assert diff < 1e-4, (key, diff)


def test_dqn_prioritized_replay_on_two_devices_matches_one_device(two_devices):
    """3 iterations of prioritized replay: the priorities (set from the TD errors of rows
    trained on both devices) and the params agree with one device to float rounding."""
    out = two_devices
    assert out["per_priorities_spread"] > 1e-2  # priorities were updated, not all max
    assert out["per_priorities_diff"] < 1e-4, out["per_priorities_diff"]
    assert out["per_policy_diff"] < 1e-5, out["per_policy_diff"]


def test_dqn_mesh_errors_name_the_key(two_devices):
    errors = two_devices["errors"]
    assert "buffer_size (150)" in errors["buffer_size"] and "(16)" in errors["buffer_size"]
    assert "train_batch_size: 33" in errors["train_batch_size"]
    assert "multiple of 2" in errors["train_batch_size"]
