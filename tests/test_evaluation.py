"""Evaluation: RLlib's evaluation_interval / evaluation_duration / evaluation_config as a stage.

References: a toy env whose episode lengths and rewards are known by hand (first episode 3
steps, later ones 7; reward 1 for action 1, 0.25 for action 0), the deterministic action as
numpy's argmax of the policy's logits, and the plan's own params: an evaluation inside the
step equals `evaluate` with the newest params (not async groups' snapshots) and the same key.
The 1-device == N-devices check runs in tests/devices_worker.py (mode "evaluation").
"""

from __future__ import annotations

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TINY_PPO

from jaxplan import PPOConfig, RandomPolicy, WorkerSet, cli, ppo_plan
from jaxplan.distributions import Categorical, DiagGaussian
from jaxplan.envs import Discrete
from jaxplan.models import ActorCritic
from jaxplan.ppo.policy import PPOPolicy
from jaxplan.stages.evaluation import Evaluation, evaluate, play_episodes, report_evaluation
from jaxplan.trained import load_run


class Corridor:
    """Single-agent toy env: the first episode lasts 3 steps, every later one 7 (its state
    counts the episodes), reward 1.0 for action 1 and 0.25 for action 0; obs `[t, episodes]`."""

    def __init__(self, max_episode_steps=None, first=3, later=7):
        self.observation_shape = (2,)
        self.action_space = Discrete(2)
        self.max_episode_steps = max_episode_steps
        self.first, self.later = first, later

    def _obs(self, state):
        return jnp.stack(state).astype(jnp.float32)

    def reset(self, key):
        state = (jnp.int32(0), jnp.int32(0))
        return self._obs(state), state

    def step(self, key, state, action):
        t, n = state
        t = t + 1
        limit = jnp.where(n == 0, self.first, self.later)
        terminated = t >= limit
        reward = jnp.where(action == 1, 1.0, 0.25).astype(jnp.float32)
        reached = self._obs((t, n))
        new = (jnp.where(terminated, 0, t), jnp.where(terminated, n + 1, n))
        return self._obs(new), new, reward, terminated, jnp.zeros((), bool), reached


def corridor_workers(env, bias):
    """One PPO policy on `env` whose logits are `bias` whatever the observation."""
    config = PPOConfig().updated({"model": {"fcnet_hiddens": [4]}})
    policy = PPOPolicy(env.observation_shape, env.action_space, config)
    params = policy.init(jax.random.PRNGKey(0)).params
    params = jax.tree.map(jnp.zeros_like, params)
    logits_bias = [p for p in jax.tree_util.tree_flatten_with_path(params)[0]]
    # the actor's last layer: the only bias of size 2
    (path, _) = [(path, x) for path, x in logits_bias if x.shape == (2,)][0]
    params = jax.tree_util.tree_map_with_path(
        lambda p, x: jnp.asarray(bias, jnp.float32) if p == path else x, params
    )
    workers = WorkerSet(env, {"default_policy": policy}, num_workers=1)
    return workers, {"default_policy": params}


def test_deterministic_actions_are_the_distributions_modes():
    logits = np.array([[0.1, 2.0, -1.0], [3.0, 0.0, 2.9]], np.float32)
    np.testing.assert_array_equal(Categorical(3).deterministic_sample(logits), [1, 0])
    inputs = np.array([[0.5, -2.0, 1.0, 3.0]], np.float32)  # mean (0.5, -2), log_std (1, 3)
    np.testing.assert_array_equal(DiagGaussian(2).deterministic_sample(inputs), [[0.5, -2.0]])
    # a PPO policy's deterministic action is numpy's argmax of its model's logits
    config = PPOConfig().updated({"model": {"fcnet_hiddens": [8]}})
    policy = PPOPolicy((4,), Discrete(3), config)
    params = policy.init(jax.random.PRNGKey(1)).params
    obs = jax.random.normal(jax.random.PRNGKey(2), (32, 4))
    actions, _ = policy.compute_actions(params, obs, jax.random.PRNGKey(3), explore=False)
    logits = policy.model.apply(params, obs, method=ActorCritic.policy)
    np.testing.assert_array_equal(actions, np.argmax(np.asarray(logits), axis=-1))
    sampled, _ = policy.compute_actions(params, obs, jax.random.PRNGKey(3))
    assert not np.array_equal(sampled, actions)  # exploring samples (32 draws, 3 actions)


def test_episodes_by_hand():
    workers, params = corridor_workers(Corridor(), bias=[0.0, 0.5])  # p(action 1) = 0.62
    out = jax.jit(lambda k: evaluate(workers, params, k, num_episodes=5))(jax.random.PRNGKey(0))
    # only each env's first episode counts: 3 steps of reward 1 (deterministic action 1)
    np.testing.assert_array_equal(out["hist_stats"]["episode_lengths"], [3] * 5)
    np.testing.assert_array_equal(out["hist_stats"]["episode_reward"], [3.0] * 5)
    assert float(out["episode_reward_mean"]) == 3.0 and float(out["episode_len_mean"]) == 3.0
    assert int(out["episodes_this_iter"]) == 5 and int(out["timesteps_this_iter"]) == 15
    assert out["policy_reward_mean"] == {}
    # exploring: returns are 3 x 0.25 .. 3 x 1 in steps of 0.75; statistics are numpy's
    out = jax.jit(lambda k: evaluate(workers, params, k, num_episodes=40, explore=True))(
        jax.random.PRNGKey(0)
    )
    returns = np.asarray(out["hist_stats"]["episode_reward"])
    assert set(np.round((returns - 0.75) / 0.75, 6)) <= {0.0, 1.0, 2.0, 3.0}
    assert len(set(returns.tolist())) > 1
    assert float(out["episode_reward_mean"]) == pytest.approx(returns.mean(), rel=1e-6)
    assert float(out["episode_reward_min"]) == returns.min()
    assert float(out["episode_reward_max"]) == returns.max()


def test_step_limit_cuts_episodes_and_reports_none():
    env = Corridor(max_episode_steps=5, first=9)  # the first episode would need 9 steps
    workers, params = corridor_workers(env, bias=[1.0, 0.0])
    out = jax.jit(lambda k: evaluate(workers, params, k, num_episodes=3))(jax.random.PRNGKey(0))
    assert int(out["episodes_this_iter"]) == 0 and int(out["timesteps_this_iter"]) == 0
    assert np.isnan(float(out["episode_reward_mean"]))
    assert np.isnan(np.asarray(out["hist_stats"]["episode_reward"])).all()
    # with room for it, the same episode counts (reward 0.25 for the mode action 0)
    out = jax.jit(lambda k: evaluate(workers, params, k, num_episodes=3, max_episode_steps=9))(
        jax.random.PRNGKey(0)
    )
    assert int(out["episodes_this_iter"]) == 3 and float(out["episode_reward_mean"]) == 2.25


def test_not_running_takes_no_step():
    workers, params = corridor_workers(Corridor(), bias=[0.0, 1.0])
    from jaxplan.stages.evaluation import evaluation_workers

    ew = evaluation_workers(workers, 4)
    out = jax.jit(
        lambda k, run: play_episodes(ew, params, k, 4, explore=False, max_steps=10, run=run)
    )(jax.random.PRNGKey(0), jnp.bool_(False))
    assert int(out["episodes_this_iter"]) == 0 and np.isnan(float(out["episode_reward_mean"]))


def test_plan_evaluates_newest_params_every_interval():
    mode = "async"  # where the actor groups act with lagged snapshots
    config = {**TINY_PPO, "rollout_mode": mode, "evaluation_interval": 2}
    config["evaluation_duration"] = 3
    config["evaluation_config"] = {"explore": False}
    plan = ppo_plan(config, env="CartPole-v1")
    plain = ppo_plan({**TINY_PPO, "rollout_mode": mode}, env="CartPole-v1")
    stage = dict(plan.flow.stages)["evaluation"]
    assert isinstance(stage, Evaluation)
    state, other = plan.init(jax.random.PRNGKey(4)), plain.init(jax.random.PRNGKey(4))
    step, plain_step = jax.jit(plan.step), jax.jit(plain.step)
    evaluate_jit = jax.jit(functools.partial(evaluate, plan.workers, num_episodes=3))
    for i in range(1, 4):
        key = state.stages["evaluation"].key
        state, result = step(state)
        other, plain_result = plain_step(other)
        report = plan.report(result)
        # training is the plain plan's, bit for bit (the evaluation draws from its own key)
        jax.tree.map(np.testing.assert_array_equal, state.policies, other.policies)
        assert report["episode_reward_mean"] == plain.report(plain_result)["episode_reward_mean"]
        if i % 2:
            assert "evaluation" not in report
            continue
        # iteration 2: the episodes of the params just trained, with the stage's key
        params = {pid: ps.params for pid, ps in state.policies.items()}
        expected = evaluate_jit(params, jax.random.split(key)[1])
        got = report["evaluation"]
        assert (
            got["hist_stats"]["episode_reward"]
            == np.asarray(expected["hist_stats"]["episode_reward"]).tolist()
        )
        assert got["episode_reward_mean"] == float(expected["episode_reward_mean"])
        assert got["episodes_this_iter"] == 3 and "evaluated" not in got
    # the groups act with lagged snapshots; the evaluation did not
    snapshots = state.stages["parallel_rollouts"].groups.version["default_policy"]
    assert int(snapshots.min()) < int(state.policies["default_policy"].version)


def test_multi_agent_policy_rewards():
    config = {
        **TINY_PPO,
        "evaluation_interval": 1,
        "evaluation_duration": 2,
        "multiagent": {
            "policies": {"p0": {}, "p1": {}},
            "policy_mapping": {"agent_0": "p0", "agent_1": "p1"},
        },
    }
    plan = ppo_plan(config, env="MultiAgentCartPole")
    state, result = jax.jit(plan.step)(plan.init(jax.random.PRNGKey(0)))
    ev = plan.report(result)["evaluation"]
    lengths = np.asarray(ev["hist_stats"]["episode_lengths"], np.float32)
    # every agent earns 1 per step of the shared episode: team return 2 x length, each policy 1x
    np.testing.assert_array_equal(ev["hist_stats"]["episode_reward"], 2 * lengths)
    assert ev["policy_reward_mean"] == {"p0": lengths.mean(), "p1": lengths.mean()}
    assert ev["policy_reward_max"]["p1"] == lengths.max()


def test_random_policy_and_report_hook():
    env = Corridor()
    workers = WorkerSet(env, {"default_policy": RandomPolicy((2,), Discrete(2))}, num_workers=1)
    out = evaluate(workers, {"default_policy": {}}, jax.random.PRNGKey(0), num_episodes=2)
    assert int(out["episodes_this_iter"]) == 2  # RandomPolicy takes explore and ignores it
    assert report_evaluation({"a": 1, "evaluation": {"x": 1, "evaluated": False}}) == {"a": 1}
    kept = report_evaluation({"a": 1, "evaluation": {"x": 1, "evaluated": True}})
    assert kept == {"a": 1, "evaluation": {"x": 1}}


def test_config_validation():
    config = PPOConfig().updated({"evaluation_num_episodes": 4, "evaluation_duration": 9})
    assert config.evaluation_episodes == 4  # RLlib's older key wins when set
    assert PPOConfig().evaluation_episodes == 10 and PPOConfig().evaluation_interval is None
    with pytest.raises(ValueError, match="did you mean 'evaluation_config.explore'"):
        PPOConfig().updated({"evaluation_config": {"explor": False}})
    with pytest.raises(ValueError, match="evaluation_duration_unit.*'timesteps' is not"):
        PPOConfig().updated({"evaluation_duration_unit": "timesteps"})
    with pytest.raises(ValueError, match="evaluation_interval"):
        PPOConfig().updated({"evaluation_interval": -1})
    with pytest.raises(ValueError, match="Unknown env_config key"):
        ppo_plan({"evaluation_interval": 1, "evaluation_config": {"env_config": {"gg": 1}}})


def test_evaluation_env_config(tmp_path):
    # a shorter episode limit for evaluation only: every deterministic episode is cut at 20
    config = {**TINY_PPO, "evaluation_interval": 1, "evaluation_duration": 2}
    config["evaluation_config"] = {"explore": False, "env_config": {"max_steps_in_episode": 20}}
    plan = ppo_plan(config, env="CartPole-v1")
    ev = dict(plan.flow.stages)["evaluation"]
    assert ev.max_steps == 20 and plan.workers.env.max_episode_steps == 500


def test_cli_evaluate(tmp_path, capsys):
    out = tmp_path / "run"
    tiny = ["--config", "train_batch_size=128", "--config", "model.fcnet_hiddens=[8]"]
    common = [*tiny, "--quiet", "--no-compile-cache", "--stop-iters", "2", "--num-seeds", "2"]
    assert cli.main(["train", "ppo", *common, "--output", str(out)]) == 0
    capsys.readouterr()
    assert cli.main(["evaluate", str(out), "--episodes", "3", "--json"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [r["seed"] for r in lines] == [0, 1]
    run = load_run(out)
    evaluate_jit = jax.jit(functools.partial(evaluate, run.plan.workers, num_episodes=3))
    for r in lines:  # each seed's own trained params, the documented key
        params = jax.tree.map(lambda x, s=r["seed"]: x[s], run.policy_params())
        key = jax.random.fold_in(jax.random.PRNGKey(0), r["seed"])
        expected = evaluate_jit(params, key)
        assert (
            r["hist_stats"]["episode_lengths"]
            == np.asarray(expected["hist_stats"]["episode_lengths"]).tolist()
        )
    assert cli.main(["evaluate", str(tmp_path / "nothing")]) == 2
    assert "params.json" in capsys.readouterr().err
