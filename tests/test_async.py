"""Async rollouts (staggered actor groups): designed policy lag, continuous env steps,
determinism, learning with lag (+ V-trace), and the sample-only plan as an evaluator."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxplan import (
    PPOConfig,
    RandomPolicy,
    Stop,
    WorkerSet,
    build_workers,
    ppo_plan,
    preset_config,
    run_iterations,
    sample_only_plan,
    train_seeds,
)
from jaxplan.batch import DEFAULT_POLICY_ID
from jaxplan.envs import Discrete
from jaxplan.stages import ParallelRollouts

PID = DEFAULT_POLICY_ID


# ---- policy lag -----------------------------------------------------------------------------
def expected_lags(groups: int, num_async: int, rounds_per_update: int, iterations: int):
    """Independent reference: replays the staggered schedule with plain integers.

    Group j starts `j` segments into its fragment (params version 0); every round each group
    advances one segment; the group that fills its fragment emits it; a group starting a
    fragment takes the version that was newest `num_async - 1` rounds earlier; the learner's
    version goes up by one after every `rounds_per_update` rounds. Returns per iteration the
    lags (learner version - acting version) of the fragments trained in it.
    """
    fill = list(range(groups))  # in segments
    acting = [0] * groups
    newest_at_round = []  # the learner's version at the start of each round
    version, lags, pending = 0, [], []
    for r in range(iterations * rounds_per_update):
        newest_at_round.append(version)
        for j in range(groups):
            if fill[j] == 0:
                acting[j] = newest_at_round[max(0, r - (num_async - 1))]
        fill = [f + 1 for f in fill]
        (done,) = [j for j in range(groups) if fill[j] == groups]
        pending.append(version - acting[done])
        fill[done] = 0
        if (r + 1) % rounds_per_update == 0:
            lags.append(pending)
            pending = []
            version += 1
    return lags


def _async_ppo(groups, num_async, rounds_per_update, extra=None):
    envs, t = 2, 4 * groups
    return ppo_plan(
        {
            "rollout_mode": "async",
            "num_async": num_async,
            "num_workers": groups,
            "num_envs_per_worker": envs,
            "rollout_fragment_length": t,
            "train_batch_size": rounds_per_update * envs * t,
            "sgd_minibatch_size": envs * t,
            "num_sgd_iter": 1,
            "model": {"fcnet_hiddens": [8]},
            **(extra or {}),
        },
        env="CartPole-v1",
    )


@pytest.mark.parametrize(
    "groups,num_async,rounds_per_update",
    [(4, 1, 1), (2, 3, 1), (1, 2, 1), (3, 2, 3)],
)
def test_async_lag_is_the_designed_value(groups, num_async, rounds_per_update):
    iterations = 12
    plan = _async_ppo(groups, num_async, rounds_per_update)
    state = jax.jit(plan.init)(jax.random.PRNGKey(0))
    _, results = jax.jit(lambda s: run_iterations(plan, s, iterations))(state)
    reports = plan.reports(results)
    want = expected_lags(groups, num_async, rounds_per_update, iterations)
    for r, lags in zip(reports, want, strict=True):
        info = r["info"]["learner"][PID]
        assert info["policy_lag_max"] == max(lags), (r["training_iteration"], lags)
        assert info["policy_lag_mean"] == pytest.approx(np.mean(lags)), r["training_iteration"]
    if rounds_per_update == 1:  # steady state: groups - 1 + num_async - 1 updates
        assert want[-1] == [groups - 1 + num_async - 1]
    # each group reports the version it acts with; the newest is the number of train steps
    last = reports[-1]["info"]
    assert last["policy_versions"][PID] == iterations
    versions = last["actor_group_versions"][PID]
    assert len(versions) == groups and max(versions) <= iterations


def test_bulk_sync_lag_is_zero():
    plan = ppo_plan(
        {"train_batch_size": 256, "num_sgd_iter": 1, "rollout_fragment_length": 16},
        env="CartPole-v1",
    )
    state = jax.jit(plan.init)(jax.random.PRNGKey(0))
    _, results = jax.jit(lambda s: run_iterations(plan, s, 5))(state)
    for i, r in enumerate(plan.reports(results)):
        info = r["info"]
        assert info["learner"][PID]["policy_lag_max"] == 0
        assert info["learner"][PID]["policy_lag_mean"] == 0.0
        assert info["actor_group_versions"][PID] == [i + 1] * 4  # the newest, after the update


# ---- env steps are continuous: none lost, none repeated -----------------------------------
@dataclasses.dataclass(frozen=True)
class CountingEnv:
    """obs = [env id, steps this env has taken in its life, step in episode]; episodes last
    `length` steps. Lets a test follow every env's steps through the emitted fragments."""

    length: int = 5
    observation_shape: tuple = (3,)
    action_space: Discrete = Discrete(2)
    name: str = "Counting"

    def reset(self, key):
        env_id = jax.random.randint(key, (), 0, 2**30).astype(jnp.float32)
        state = (env_id, jnp.float32(0), jnp.float32(0))
        return jnp.stack(state), state

    def step(self, key, state, action):
        env_id, total, t = state
        total, t = total + 1, t + 1
        done = t >= self.length
        final = jnp.stack([env_id, total, t])
        t = jnp.where(done, 0.0, t)
        new = (env_id, total, t)
        return jnp.stack(new), new, jnp.float32(1), done, jnp.bool_(False), final


@pytest.mark.parametrize("groups,num_async", [(4, 1), (3, 2)])
def test_async_env_steps_are_continuous(groups, num_async):
    envs, t, rounds = 2, 3 * groups, 11
    env = CountingEnv()
    workers = WorkerSet(
        env,
        {PID: RandomPolicy(env.observation_shape, env.action_space)},
        num_workers=groups,
        num_envs_per_worker=envs,
        rollout_fragment_length=t,
    )
    flow = ParallelRollouts(workers, mode="async", num_async=num_async)
    state = flow.init(workers.init(jax.random.PRNGKey(1)))
    assert list(state.stages) == ["parallel_rollouts"]  # the stage's own state
    pull = jax.jit(flow.pull)
    seen: dict[float, list[float]] = {}
    for _ in range(rounds):
        state, batch = pull(state)
        pb = batch.policy_batches[PID]
        assert batch.env_steps == envs * t and pb["obs"].shape == (envs * t, 3)
        obs, new_obs = np.asarray(pb["obs"]), np.asarray(pb["new_obs"])
        for row in range(obs.shape[0]):
            seen.setdefault(obs[row, 0], []).append(obs[row, 1])
            # a step's next obs is the step after it (the env's lifetime counter goes up by 1)
            assert new_obs[row, 1] == obs[row, 1] + 1
    # every env of every group appears, and its steps are 0, 1, 2, ... without gaps/repeats
    assert len(seen) == groups * envs
    for steps in seen.values():
        steps = sorted(steps)
        assert steps == list(range(len(steps))), steps
    # every env stepped every round: (pre-roll j segments) + rounds segments, of which all
    # but the fragment in progress were emitted
    segment = t // groups
    env_total = np.asarray(state.actors.obs["agent0"][..., 1])  # [groups, envs]
    fill = np.asarray(state.stages["parallel_rollouts"].groups.fill)
    for j in range(groups):
        assert (env_total[j] == (j + rounds) * segment).all()
        emitted = [len(seen[i]) for i in np.asarray(state.actors.obs["agent0"][j, :, 0])]
        assert emitted == [(j + rounds) * segment - fill[j]] * envs
    assert sum(len(v) for v in seen.values()) == rounds * envs * t


# ---- determinism ------------------------------------------------------------------------------
def test_two_async_runs_with_one_seed_are_identical():
    plan = _async_ppo(4, 2, 2, {"num_sgd_iter": 2, "sgd_minibatch_size": 8})
    run = jax.jit(lambda k: run_iterations(plan, plan.init(k), 6))
    a_state, a_res = run(jax.random.PRNGKey(7))
    b_state, b_res = run(jax.random.PRNGKey(7))
    for x, y in zip(
        jax.tree.leaves((a_state, a_res)), jax.tree.leaves((b_state, b_res)), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    c_state, _ = run(jax.random.PRNGKey(8))
    assert not np.array_equal(
        np.asarray(jax.tree.leaves(c_state.policies)[0]),
        np.asarray(jax.tree.leaves(a_state.policies)[0]),
    )


# ---- learning with lag ----------------------------------------------------------------------
@pytest.mark.parametrize("vtrace", [False, True])
def test_async_ppo_solves_cartpole(vtrace):
    """The CartPole preset with 4 staggered groups (lag up to 1 train step at 4 rounds per
    train batch); both seeds reach 475 within 150k env steps (measured: 57k-61k)."""
    plan = ppo_plan({"rollout_mode": "async", "vtrace": vtrace}, env="CartPole-v1")
    assert plan.workers.num_actor_groups == 4
    stop = Stop(episode_reward_mean=475.0, timesteps_total=150_000)
    _, results = train_seeds(plan, [0, 1], 300, stop)
    for seed in range(2):
        reports = plan.reports(jax.tree.map(lambda x, s=seed: x[s], results))
        done = [r for r in reports if r["done"]]
        assert done, f"seed {seed} never stopped"
        assert done[0]["episode_reward_mean"] >= 475.0, (seed, done[0]["timesteps_total"])
        assert max(r["info"]["learner"][PID]["policy_lag_max"] for r in reports) == 1


# ---- the sample-only plan as an evaluator ------------------------------------------------------
def _gymnax_random_returns(num_envs: int, steps: int, seed: int) -> np.ndarray:
    """Reference: plain gymnax CartPole-v1 with uniform random actions; the returns of all
    episodes that end within `steps` steps of each env."""
    import gymnax

    env, params = gymnax.make("CartPole-v1")
    keys = jax.random.split(jax.random.PRNGKey(seed), num_envs)
    obs, state = jax.vmap(env.reset, in_axes=(0, None))(keys, params)

    def step(carry, key):
        state, ret = carry
        k_act, k_env = jax.random.split(key)
        actions = jax.random.randint(k_act, (num_envs,), 0, 2)
        _, state, reward, term, trunc, _ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
            jax.random.split(k_env, num_envs), state, actions, params
        )
        ret = ret + reward
        done = term | trunc
        return (state, jnp.where(done, 0.0, ret)), (done, ret)

    _, (done, ret) = jax.jit(
        lambda: jax.lax.scan(
            step,
            (state, jnp.zeros(num_envs)),
            jax.random.split(jax.random.PRNGKey(seed + 1), steps),
        )
    )()
    return np.asarray(ret)[np.asarray(done)]


def test_sample_only_async_plan_reports_random_policy_returns():
    config = preset_config("CartPole-v1", {"metrics_smoothing_episodes": 1500})
    workers = build_workers(config)
    random = RandomPolicy(workers.env.observation_shape, workers.env.action_space)
    workers = WorkerSet(
        workers.env,
        {PID: random},
        num_workers=4,
        num_envs_per_worker=4,
        rollout_fragment_length=32,
        metrics_smoothing_episodes=1500,
    )
    plan = sample_only_plan(workers)  # ParallelRollouts(async) -> Select -> Reporting
    state = jax.jit(plan.init)(jax.random.PRNGKey(0))
    state, results = jax.jit(lambda s: run_iterations(plan, s, 200))(state)  # 25,600 steps
    last = plan.reports(jax.tree.map(lambda x: x[-1:], results))[0]
    n_ours = min(last["episodes_total"], 1500)
    assert n_ours >= 1000
    assert last["timesteps_total"] == 200 * 4 * 32
    ref = _gymnax_random_returns(num_envs=16, steps=1600, seed=3)
    assert len(ref) >= 1000
    # random CartPole returns: mean ~22, std ~12; means agree within 4 standard errors
    tolerance = 4 * ref.std() * np.sqrt(1 / n_ours + 1 / len(ref))
    assert abs(last["episode_reward_mean"] - ref.mean()) < tolerance, (
        last["episode_reward_mean"],
        ref.mean(),
        tolerance,
    )
    assert 15 < ref.mean() < 30  # sanity: it is the random-policy regime


# ---- errors ----------------------------------------------------------------------------------
def test_async_configuration_errors():
    workers = build_workers(PPOConfig().updated({"num_workers": 3, "rollout_fragment_length": 200}))
    with pytest.raises(ValueError, match=r"rollout_fragment_length \(200\).*multiple.*\(3\)"):
        ParallelRollouts(workers, mode="async")
    with pytest.raises(ValueError, match="num_async must be an integer >= 1"):
        ParallelRollouts(build_workers(PPOConfig()), mode="async", num_async=0)
    with pytest.raises(ValueError, match="only applies to mode='async'"):
        ParallelRollouts(build_workers(PPOConfig()), mode="bulk_sync", num_async=2)
    with pytest.raises(ValueError, match="valid modes"):
        ParallelRollouts(build_workers(PPOConfig()), mode="sync")
    with pytest.raises(ValueError, match="broadcast_interval must be an integer >= 1"):
        ParallelRollouts(build_workers(PPOConfig()), mode="async", broadcast_interval=0)
    with pytest.raises(ValueError, match="broadcast_interval only applies to mode='async'"):
        ParallelRollouts(build_workers(PPOConfig()), mode="bulk_sync", broadcast_interval=2)
    # the config leaves these to ParallelRollouts: building the plan raises (nothing compiles)
    with pytest.raises(ValueError, match=r"rollout_fragment_length \(200\).*multiple.*\(3\)"):
        ppo_plan(PPOConfig().updated({"rollout_mode": "async", "num_workers": 3}))
    with pytest.raises(ValueError, match="only applies to mode='async'"):
        ppo_plan(PPOConfig().updated({"num_async": 2}))
    with pytest.raises(ValueError, match="valid modes"):
        ppo_plan(PPOConfig().updated({"rollout_mode": "asynch"}))
