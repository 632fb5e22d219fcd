"""RLlib's `observation_filter="MeanStdFilter"` and `clip_rewards` (`jaxplan.filters`).

References: float64 numpy. The running statistics are checked against numpy's mean and
sample variance of every raw observation the envs returned (the reset observations, each
step's `new_obs` and the reset observation after an episode's end), collected from a run
without the filter: with `RandomPolicy` the actions depend on the key alone, so both runs
step the same trajectories. The batch's observations against RLlib's formula
`clip((obs - mean) / (std + 1e-8), -10, 10)`; the policy acts on them (its stored log-probs
are those of the filtered observations); evaluation and a loaded policy apply the
statistics frozen; a resumed run continues them; 4 fake devices hold the 1-device statistics
(in a subprocess: `python tests/test_filters.py devices` prints JSON). `clip_rewards` against
`np.sign` / `np.clip` of the unclipped run's rewards, the episode returns unclipped.
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
from flax import serialization

from jaxplan import ParallelRollouts, PPOConfig, RandomPolicy, WorkerSet, cli, ppo_plan
from jaxplan.envs import Discrete
from jaxplan.filters import MeanStd, moments
from jaxplan.multi_agent import SINGLE_AGENT_ID, make_env
from jaxplan.stages.acting import step_envs
from jaxplan.stages.evaluation import evaluate
from jaxplan.trained import load_run

PID = "default_policy"
TINY = {
    "num_workers": 2,
    "num_envs_per_worker": 2,
    "rollout_fragment_length": 16,
    "train_batch_size": 32,
    "sgd_minibatch_size": 16,
    "num_sgd_iter": 1,
    "model": {"fcnet_hiddens": [8]},
    "observation_filter": "MeanStdFilter",
}


def rllib_filter(obs, count, mean, m2):
    """RLlib's MeanStdFilter with RunningStat's variance, float64."""
    obs, mean, m2 = (np.asarray(x, np.float64) for x in (obs, mean, m2))
    var = m2 / (count - 1) if count > 1 else np.square(mean)
    return np.clip((obs - mean) / (np.sqrt(var) + 1e-8), -10.0, 10.0)


def test_moments_merged_batch_by_batch_equal_numpy():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=(n, 3)) * [1.0, 0.01, 100.0] for n in (1, 7, 40, 5)]
    weights = [rng.random(len(b)) < 0.7 for b in batches]
    stats = MeanStd.empty((3,))
    seen = []
    for x, w in zip(batches, weights, strict=True):
        stats = stats.merge(moments(x.astype(np.float32), w, batch_ndim=1))
        seen.append(x[w])
        ref = np.concatenate(seen)
        assert float(stats.count) == len(ref)
        np.testing.assert_allclose(stats.mean, ref.mean(0), rtol=1e-5, atol=1e-6)
        if len(ref) > 1:
            np.testing.assert_allclose(stats.var, ref.var(0, ddof=1), rtol=1e-4)
    obs = rng.normal(3.0, 50.0, size=(9, 3)).astype(np.float32)
    want = rllib_filter(obs, float(stats.count), stats.mean, stats.m2)
    np.testing.assert_allclose(stats(obs), want, rtol=1e-5, atol=1e-5)
    assert np.abs(want).max() == 10.0  # some are clipped


def test_variance_of_one_observation_is_the_mean_squared():
    one = moments(np.float32([[2.0, -3.0]]), np.ones(1), batch_ndim=1)
    np.testing.assert_allclose(one.var, [4.0, 9.0])  # RLlib's RunningStat with n = 1
    np.testing.assert_allclose(one(np.float32([4.0, -3.0])), [(4 - 2) / (2 + 1e-8), 0.0])
    assert float(MeanStd.empty((2,)).merge(MeanStd.empty((2,))).count) == 0


def random_workers(env="CartPole-v1", **kwargs):
    env = make_env(env) if isinstance(env, str) else env
    policy = RandomPolicy(env.observation_shape, env.action_space)
    return WorkerSet(
        env,
        {PID: policy},
        num_workers=2,
        num_envs_per_worker=2,
        rollout_fragment_length=16,
        **kwargs,
    )


def rounds(workers, n, seed=1):
    """`n` bulk_sync rollout rounds: the states (before each round and after the last) and
    each round's batch of `PID`."""
    flow = ParallelRollouts(workers)
    state = flow.init(workers.init(jax.random.PRNGKey(seed)))
    pull = jax.jit(flow.pull)
    states, batches = [state], []
    for _ in range(n):
        state, batch = pull(state)
        states.append(state)
        batches.append(jax.device_get(batch.policy_batches[PID]))
    return states, batches


@pytest.fixture(scope="module")
def cartpole_rounds():
    return rounds(random_workers(), 3), rounds(
        random_workers(observation_filter="MeanStdFilter"), 3
    )


def test_statistics_and_filtered_batches_match_numpy(cartpole_rounds):
    (raw_states, raw), (states, filtered) = cartpole_rounds
    t, groups = 16, 4

    def obs_of(state):
        return np.asarray(state.actors.obs[SINGLE_AGENT_ID], np.float64).reshape(groups, 4)

    seen = [obs_of(raw_states[0])]  # the reset observations
    for k, (r, f) in enumerate(zip(raw, filtered, strict=True)):
        # the same trajectories (random actions): only the observations are filtered
        np.testing.assert_array_equal(f["actions"], r["actions"])
        np.testing.assert_array_equal(f["rewards"], r["rewards"])
        before = states[k].obs_filters[PID]
        stats = (float(before.count), before.mean, before.m2)
        for field in ("obs", "new_obs"):
            np.testing.assert_allclose(
                f[field], rllib_filter(r[field], *stats), rtol=1e-5, atol=1e-5
            )
            assert not np.allclose(f[field], r[field])
        # every raw observation the round returned: new_obs, and the reset obs after an end
        new_obs = np.asarray(r["new_obs"], np.float64).reshape(t, groups, 4)
        done = (r["terminateds"] | r["truncateds"]).reshape(t, groups)
        obs = np.asarray(r["obs"], np.float64).reshape(t, groups, 4)
        after = np.concatenate([obs[1:], obs_of(raw_states[k + 1])[None]])  # obs after step t
        seen += [new_obs.reshape(-1, 4), after[done]]
        ref = np.concatenate(seen)
        got = states[k + 1].obs_filters[PID]
        assert float(got.count) == len(ref)
        np.testing.assert_allclose(got.mean, ref.mean(0), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got.var, ref.var(0, ddof=1), rtol=1e-4)
    assert done.any()  # the reset path was taken
    assert raw_states[-1].obs_filters == {}  # NoFilter keeps no statistics


def test_ppo_policy_acts_on_the_filtered_observations():
    plan = ppo_plan(TINY, env="CartPole-v1")
    workers = plan.workers
    state = workers.init(jax.random.PRNGKey(0))
    state, batch = jax.jit(ParallelRollouts(workers).pull)(state)
    b = batch.policy_batches[PID]
    policy, params = workers.policies[PID], state.policies[PID].params
    logp = policy.dist.log_prob(policy.net.policy(params, b["obs"]), b["actions"])
    np.testing.assert_allclose(logp, b["action_logp"], rtol=1e-5, atol=1e-6)
    assert float(np.abs(b["obs"]).max()) <= 10.0


def test_async_rounds_count_every_observation():
    workers = random_workers(observation_filter="MeanStdFilter")
    flow = ParallelRollouts(workers, mode="async")
    state = jax.jit(lambda k: flow.init(workers.init(k)))(jax.random.PRNGKey(2))
    pull = jax.jit(flow.pull)
    for _ in range(3):
        state, _ = pull(state)
    # 4 reset obs, the pre-roll (group 1: 8 steps x 2 envs), 3 rounds x 4 envs x 8 steps,
    # and one reset observation per finished episode
    steps = 4 + 16 + 3 * 4 * 8
    assert float(state.obs_filters[PID].count) == steps + int(state.episodes.num_episodes)


def test_evaluation_and_step_envs_apply_the_statistics_frozen():
    config = {**TINY, "evaluation_interval": 1, "evaluation_duration": 2}
    config["evaluation_config"] = {"explore": False}
    plan = ppo_plan(config, env="CartPole-v1")
    state = plan.init(jax.random.PRNGKey(4))
    key = state.stages["evaluation"].key
    state, result = jax.jit(plan.step)(state)
    # the statistics hold the training round's observations alone (4 reset, 64 new, one reset
    # per finished episode), none of the evaluation episodes'
    assert float(state.obs_filters[PID].count) == 4 + 64 + int(state.episodes.num_episodes)
    params = {pid: ps.params for pid, ps in state.policies.items()}
    expected = evaluate(
        plan.workers, params, jax.random.split(key)[1], num_episodes=2, filters=state.obs_filters
    )
    got = plan.report(result)["evaluation"]
    assert (
        got["hist_stats"]["episode_reward"]
        == np.asarray(expected["hist_stats"]["episode_reward"]).tolist()
    )
    # acting: the deterministic action is the argmax of the logits of the filtered obs
    workers, f = plan.workers, state.obs_filters[PID]
    actors = state.actors
    _, tr, _ = step_envs(workers, params, actors, jax.random.PRNGKey(0), None, explore=False)
    _, frozen, _ = step_envs(
        workers, params, actors, jax.random.PRNGKey(0), None, explore=False, filters={PID: f}
    )
    obs = np.asarray(actors.obs[SINGLE_AGENT_ID])
    filtered = rllib_filter(obs, float(f.count), f.mean, f.m2).astype(np.float32)
    policy = workers.policies[PID]
    want = np.argmax(np.asarray(policy.net.policy(params[PID], filtered)), -1)
    np.testing.assert_array_equal(np.asarray(frozen[PID]["actions"])[:, :, 0], want)
    np.testing.assert_array_equal(tr[PID]["obs"], frozen[PID]["obs"])  # step_envs stores raw obs


@pytest.mark.parametrize("shared", [False, True], ids=["two_policies", "shared_policy"])
def test_multi_agent_statistics_per_policy(shared):
    mapping = {"agent_0": "p0", "agent_1": "p0" if shared else "p1"}
    policies = {"p0": {}} if shared else {"p0": {}, "p1": {}}
    config = {**TINY, "multiagent": {"policies": policies, "policy_mapping": mapping}}
    workers = ppo_plan(config, env="MultiAgentCartPole").workers
    state = workers.init(jax.random.PRNGKey(3))
    state, batch = jax.jit(ParallelRollouts(workers).pull)(state)
    episodes = int(state.episodes.num_episodes)  # both agents' episodes end together
    for pid, agents in workers.policy_agents.items():
        count = float(state.obs_filters[pid].count)
        assert count == len(agents) * (4 + 64 + episodes)
        assert float(np.abs(batch.policy_batches[pid]["obs"]).max()) <= 10.0
    if not shared:  # each policy's own statistics (the agents' poles differ)
        assert not np.allclose(state.obs_filters["p0"].mean, state.obs_filters["p1"].mean)


class Signed:
    """Toy env with rewards of both signs and several sizes: `(2a - 1) * 1.5 * (t % 4) - 0.25`
    at step `t` of 5-step episodes; obs `[t, t^2]`."""

    observation_shape = (2,)
    action_space = Discrete(2)
    max_episode_steps = None

    def _obs(self, t):
        return jnp.stack([t, t * t]).astype(jnp.float32)

    def reset(self, key):
        return self._obs(jnp.int32(0)), jnp.int32(0)

    def step(self, key, t, action):
        reward = ((2 * action - 1) * 1.5 * (t % 4) - 0.25).astype(jnp.float32)
        t = t + 1
        terminated = t >= 5
        new = jnp.where(terminated, 0, t)
        return self._obs(new), new, reward, terminated, jnp.zeros((), bool), self._obs(t)


@pytest.mark.parametrize("clip", [True, 2.0], ids=["sign", "float"])
def test_clip_rewards_in_the_batch_not_in_the_metrics(clip):
    (raw_states, raw), (states, clipped) = (
        rounds(random_workers(Signed()), 2),
        rounds(random_workers(Signed(), clip_rewards=clip), 2),
    )
    for r, c in zip(raw, clipped, strict=True):
        want = np.sign(r["rewards"]) if clip is True else np.clip(r["rewards"], -clip, clip)
        np.testing.assert_array_equal(c["rewards"], want)
        assert not np.array_equal(c["rewards"], r["rewards"])
    # the episode returns are the raw rewards' sums (the same episodes as without clipping)
    raw_window, window = raw_states[-1].episodes, states[-1].episodes
    assert int(window.num_episodes) >= 8
    np.testing.assert_array_equal(window.returns, raw_window.returns)
    rewards = np.concatenate([r["rewards"].reshape(16, 4) for r in raw])  # [T, groups x envs]
    first = rewards[:5, 0].sum()  # env 0's first episode
    assert float(window.returns[0]) == pytest.approx(float(first))


def test_config_errors():
    with pytest.raises(ValueError, match=r"observation_filter.*valid values: \['NoFilter', 'Me"):
        PPOConfig.from_dict({"observation_filter": "ConcurrentMeanStdFilter"})
    with pytest.raises(ValueError, match=r"clip_rewards'\] = -1.0: must be None or false"):
        PPOConfig.from_dict({"clip_rewards": -1})
    with pytest.raises(ValueError, match=r"clip_rewards'\] = 'yes': expected a number"):
        PPOConfig.from_dict({"clip_rewards": "yes"})
    with pytest.raises(ValueError, match="observation_filter = 'meanstd' is not supported"):
        random_workers(observation_filter="meanstd")
    with pytest.raises(ValueError, match="clip_rewards = 0: expected None or False"):
        random_workers(clip_rewards=0)
    config = PPOConfig.from_dict({"observation_filter": "MeanStdFilter", "clip_rewards": 5})
    assert (config.observation_filter, config.clip_rewards) == ("MeanStdFilter", 5.0)
    assert PPOConfig.from_dict(config.to_dict()) == config
    assert (PPOConfig().observation_filter, PPOConfig().clip_rewards) == ("NoFilter", None)


# ---- runs: resume, loaded policy, devices ---------------------------------------------------
CLI = ["--config", "train_batch_size=128", "--config", "model.fcnet_hiddens=[8]"]
CLI += ["--config", "num_sgd_iter=1", "--config", "observation_filter=MeanStdFilter"]
CLI += ["--quiet", "--no-compile-cache", "--report-every", "1"]


@pytest.fixture(scope="module")
def resumed_and_whole(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("filters")
    a, b = tmp / "a", tmp / "b"
    assert cli.main(["train", "ppo", *CLI, "--stop-iters", "2", "--output", str(a)]) == 0
    saved = load_run(a).state.obs_filters
    assert cli.main(["train", "ppo", "--resume", str(a), "--stop-iters", "3", *CLI[8:]]) == 0
    assert cli.main(["train", "ppo", *CLI, "--stop-iters", "3", "--output", str(b)]) == 0
    return saved, a, b


def test_resume_restores_the_statistics(resumed_and_whole):
    saved, a, b = resumed_and_whole
    ckpt = serialization.msgpack_restore((a / "checkpoint.msgpack").read_bytes())
    assert set(ckpt["state"]["obs_filters"]) == {PID}
    resumed, whole = load_run(a).state.obs_filters, load_run(b).state.obs_filters
    jax.tree.map(np.testing.assert_array_equal, resumed, whole)
    assert float(saved[PID].count) < float(whole[PID].count)  # they went on from the saved


def test_loaded_policy_filters_with_the_checkpoint_statistics(resumed_and_whole):
    from jaxplan import load_policy

    _, _, b = resumed_and_whole
    policy = load_policy(b)
    f = load_run(b).state.obs_filters[PID]
    assert policy.obs_filter is not None
    obs = np.random.default_rng(0).normal(0.0, 0.5, size=(32, 4)).astype(np.float32)
    filtered = rllib_filter(obs, float(f.count), f.mean, f.m2).astype(np.float32)
    logits = np.asarray(policy.policy.net.policy(policy.params, filtered))
    np.testing.assert_array_equal(np.asarray(policy.act(obs)), np.argmax(logits, -1))
    values = policy.policy.net.value(policy.params, filtered)
    np.testing.assert_allclose(policy.value(obs), values, rtol=1e-5, atol=1e-6)


def devices_report() -> dict:
    """Three PPO rollout rounds (params fixed) sharded on 4 devices and on 1 from one state:
    each round's statistics and the largest difference of the filtered observations (run in
    a subprocess)."""
    from jax.sharding import PartitionSpec as P

    from jaxplan import build_workers, preset_config
    from jaxplan.devices import AXIS

    config = {**TINY, "num_workers": 4}
    one = build_workers(preset_config("CartPole-v1", config))
    many = build_workers(preset_config("CartPole-v1", {**config, "num_devices": 4}))
    specs = many.state_specs()
    sharded = jax.shard_map(
        ParallelRollouts(many).pull, mesh=many.mesh, in_specs=(specs,), out_specs=(specs, P(AXIS))
    )
    pulls = {"one": jax.jit(ParallelRollouts(one).pull), "four": jax.jit(sharded)}
    state0 = one.init(jax.random.PRNGKey(7))
    states = {"one": state0, "four": many.place(state0, specs)}
    out = {"devices": jax.device_count(), "one": [], "four": [], "obs_max_diff": []}
    t, g, e = 16, 1, 2  # per device: T steps x 1 group x 2 envs, device-major rows
    for _ in range(3):
        obs = {}
        for name, pull in pulls.items():
            states[name], batch = pull(states[name])
            f = jax.device_get(states[name].obs_filters[PID])
            out[name].append([float(f.count), f.mean.tolist(), f.m2.tolist()])
            obs[name] = np.asarray(batch.policy_batches[PID]["obs"])
        four = obs["four"].reshape(4, t, g, e, 4).transpose(1, 0, 2, 3, 4).reshape(-1, 4)
        out["obs_max_diff"].append(float(np.max(np.abs(four - obs["one"]))))
    return out


def test_four_devices_hold_the_one_device_statistics():
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run(
        [sys.executable, __file__, "devices"], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["devices"] == 4
    counts = []
    for (n1, mean1, m21), (n4, mean4, m24) in zip(out["one"], out["four"], strict=True):
        assert n1 == n4
        counts.append(n1)
        np.testing.assert_allclose(mean4, mean1, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(m24, m21, rtol=1e-5)
    assert counts == sorted(counts) and counts[0] >= 8 + 128  # reset obs + one round's
    assert max(out["obs_max_diff"]) < 1e-4


if __name__ == "__main__" and sys.argv[1:] == ["devices"]:
    print(json.dumps(devices_report()))
