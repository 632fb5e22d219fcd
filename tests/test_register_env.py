"""`jaxplan.register_env`: a hand-written env trained by PPO, resolved by name everywhere
(config, CLI, checkpoints), and the contract checked before anything compiles."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxplan
from jaxplan import cli
from jaxplan.envs import Box, Discrete, check_env
from jaxplan.multi_agent import make_env


class GuessTheSign:
    """Each step shows `x ~ U(-1, 1)` (obs `[x]`); action 1 guesses `x > 0`, action 0 `x <= 0`.
    A right guess earns 1 and shows a new `x`; a wrong one earns 0 and terminates; after
    `horizon` right guesses the episode is truncated. Random guessing returns
    `sum_{k=1..10} 0.5^k = 0.999` on average (horizon 10), always guessing right 10."""

    def __init__(self, horizon: int = 10):
        self.observation_shape = (1,)
        self.action_space = Discrete(2)
        self.max_episode_steps = horizon

    def reset(self, key):
        x = jax.random.uniform(key, (), minval=-1.0, maxval=1.0)
        return x[None], {"x": x, "t": jnp.zeros((), jnp.int32)}

    def step(self, key, state, action):
        k_next, k_reset = jax.random.split(key)
        right = (action == 1) == (state["x"] > 0)
        t = state["t"] + 1
        terminated = ~right
        truncated = right & (t >= self.max_episode_steps)
        x = jax.random.uniform(k_next, (), minval=-1.0, maxval=1.0)
        done = terminated | truncated
        obs_reset, state_reset = self.reset(k_reset)
        state = jax.tree.map(lambda r, s: jnp.where(done, r, s), state_reset, {"x": x, "t": t})
        obs = jnp.where(done, obs_reset, x[None])
        return obs, state, right.astype(jnp.float32), terminated, truncated, x[None]


def make_sign(env_config: dict) -> GuessTheSign:
    return GuessTheSign(**env_config)


@pytest.fixture(autouse=True)
def sign_env():
    jaxplan.register_env("GuessTheSign", make_sign)
    yield
    jaxplan.envs._REGISTRY.pop("GuessTheSign", None)


def test_env_steps_as_computed_by_hand():
    env = make_env("GuessTheSign", {"horizon": 3})
    assert env.max_episode_steps == 3
    key = jax.random.PRNGKey(0)
    state = {"x": jnp.float32(0.5), "t": jnp.int32(1)}
    obs, s, r, term, trunc, final = env.step(key, state, jnp.int32(1))  # right
    assert (float(r), bool(term), bool(trunc), int(s["t"])) == (1.0, False, False, 2)
    assert float(obs[0]) == float(final[0]) == float(s["x"])
    obs, s, r, term, trunc, final = env.step(key, state, jnp.int32(0))  # wrong: terminated
    assert (float(r), bool(term), bool(trunc), int(s["t"])) == (0.0, True, False, 0)
    obs, s, r, term, trunc, final = env.step(key, {**state, "t": jnp.int32(2)}, jnp.int32(1))
    assert (float(r), bool(term), bool(trunc), int(s["t"])) == (1.0, False, True, 0)
    assert float(obs[0]) == float(s["x"]) != float(final[0])  # reset obs vs. the reached one


SIGN_PPO = {
    "env": "GuessTheSign",
    "num_workers": 1,
    "num_envs_per_worker": 8,
    "rollout_fragment_length": 16,
    "train_batch_size": 128,
    "sgd_minibatch_size": 64,
    "num_sgd_iter": 4,
    "lr": 3e-3,
    "gamma": 0.9,
    "lambda": 0.95,
    "model": {"fcnet_hiddens": [16]},
}


def test_ppo_learns_what_random_guessing_cannot_reach():
    env = make_env("GuessTheSign")
    random = jaxplan.RandomPolicy(env.observation_shape, env.action_space)
    workers = jaxplan.WorkerSet(
        env,
        {"default_policy": random},
        num_workers=1,
        num_envs_per_worker=64,
        rollout_fragment_length=32,
        policies_to_train=[],
        metrics_smoothing_episodes=2000,
    )
    sampler = jaxplan.sample_only_plan(workers, mode="bulk_sync")
    _, results = jax.jit(jaxplan.make_train(sampler, 3))(jax.random.PRNGKey(1))
    assert abs(float(results["episode_reward_mean"][-1]) - 0.999) < 0.1  # ~2000 episodes

    config = jaxplan.PPOConfig().updated(SIGN_PPO)  # no preset for this name
    plan = jaxplan.ppo_plan(config)
    assert plan.workers.env is not env and plan.workers.env.observation_shape == (1,)
    _, results = jax.jit(jaxplan.make_train(plan, 30))(jax.random.PRNGKey(0))
    returns = np.asarray(results["episode_reward_mean"])
    # seeds 0, 1, 2 reach 7.7, 7.9, 7.6 after 30 iterations (3840 env steps), 10 is perfect
    assert returns[-1] > 6.0, returns


def test_cli_trains_and_load_policy_resolves_the_name(tmp_path, monkeypatch):
    out = tmp_path / "run"
    flags = ["--env", "GuessTheSign", "--config", "env_config.horizon=4", "--quiet"]
    tiny = [
        f"--config={k}"
        for k in ("train_batch_size=64", "sgd_minibatch_size=32", "rollout_fragment_length=16")
    ]
    tiny += ["--config", "num_sgd_iter=1", "--config", "model.fcnet_hiddens=[8]"]
    argv = ["train", "ppo", *flags, *tiny, "--no-compile-cache", "--stop-iters", "1"]
    assert cli.main([*argv, "--output", str(out)]) == 0
    policy = jaxplan.load_policy(out)
    assert policy.env.max_episode_steps == 4  # the run's env_config
    assert int(policy.act(np.array([0.3], np.float32))) in (0, 1)
    monkeypatch.delitem(jaxplan.envs._REGISTRY, "GuessTheSign")
    with pytest.raises(ValueError, match="Unknown env 'GuessTheSign'.*register_env"):
        jaxplan.load_policy(out)


def test_import_path_names_a_creator():
    env = make_env("test_register_env:make_sign", {"horizon": 5})
    assert isinstance(env, GuessTheSign) and env.max_episode_steps == 5
    with pytest.raises(ValueError, match="cannot import"):
        make_env("no_such_module_xyz:make")


def test_unknown_name_lists_registered_and_gymnax_envs():
    with pytest.raises(ValueError) as e:
        make_env("GuessTheSing")
    msg = str(e.value)
    assert "'GuessTheSign'" in msg and "CartPole-v1" in msg and "Did you mean" in msg


class Broken(GuessTheSign):
    def __init__(self, fault):
        super().__init__()
        self.fault = fault
        if fault == "no_space":
            del self.action_space
        if fault == "obs_shape":
            self.observation_shape = (2,)

    def step(self, key, state, action):
        out = super().step(key, state, action)
        if self.fault == "arity":
            return out[:5]
        if self.fault == "reward_dtype":
            return (out[0], out[1], out[2].astype(jnp.int32), *out[3:])
        if self.fault == "state":
            return (out[0], {**out[1], "t": out[1]["t"].astype(jnp.float32)}, *out[2:])
        return out


@pytest.mark.parametrize(
    "fault, message",
    [
        ("no_space", "Broken has no 'action_space'"),
        ("obs_shape", r"reset's obs is float32\[1\]; observation_shape \(2,\) needs float32\[2\]"),
        ("arity", r"step\(key, state, action\) must return \(obs, .*final_obs\), got 5 values"),
        ("reward_dtype", r"step's reward is int32\[\], expected float32\[\]"),
        ("state", r"state\['t'\] is int32\[\] after reset but float32\[\] after step"),
    ],
)
def test_contract_errors_when_the_workers_are_built(fault, message, monkeypatch):
    jaxplan.register_env("Broken", lambda cfg: Broken(**cfg))
    monkeypatch.setattr(jax, "jit", None)  # checked abstractly: nothing compiles
    config = jaxplan.PPOConfig().updated(
        {**SIGN_PPO, "env": "Broken", "env_config": {"fault": fault}}
    )
    with pytest.raises(ValueError, match=f"env 'Broken': {message}"):
        jaxplan.build_workers(config)
    jaxplan.envs._REGISTRY.pop("Broken")


def test_space_and_register_errors():
    env = GuessTheSign()
    env.action_space = Box((1,), np.zeros(3), np.ones(3))
    with pytest.raises(ValueError, match="Box low .* does not broadcast"):
        check_env(env, "x")
    env.action_space = "two"
    with pytest.raises(ValueError, match="action_space is 'two'; expected"):
        check_env(env, "x")
    with pytest.raises(ValueError, match="expected a creator"):
        jaxplan.register_env("x", 3)
