"""Every action-space kind runs through the PPO plan: Discrete(2|3), image obs, Box actions."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxplan
from jaxplan.distributions import Categorical, DiagGaussian
from jaxplan.stages.acting import to_env_action

SMALL = {
    "num_workers": 1,
    "num_envs_per_worker": 2,
    "rollout_fragment_length": 8,
    "train_batch_size": 16,
    "sgd_minibatch_size": 8,
    "num_sgd_iter": 1,
    "model": {"fcnet_hiddens": [8]},
}


@pytest.mark.parametrize(
    "env, dist, obs_shape",
    [
        ("Acrobot-v1", Categorical(3), (6,)),
        ("Breakout-MinAtar", Categorical(3), (10, 10, 4)),
        ("Pendulum-v1", DiagGaussian(1), (3,)),
    ],
)
def test_plan_runs_and_learner_stats_are_finite(env, dist, obs_shape):
    plan = jaxplan.ppo_plan(SMALL, env=env)
    policy = plan.workers.policies["default_policy"]
    assert policy.dist == dist and plan.workers.env.observation_shape == obs_shape
    state = plan.init(jax.random.PRNGKey(0))
    _, batch = jax.jit(jaxplan.ParallelRollouts(plan.workers).pull)(state)
    pb = batch.policy_batches["default_policy"]
    assert pb["obs"].shape == (16, *obs_shape)
    assert pb["action_dist_inputs"].shape == (16, dist.num_inputs)
    state, result = jax.jit(plan.step)(state)
    report = plan.report(result)
    stats = report["info"]["learner"]["default_policy"]["learner_stats"]
    assert all(np.isfinite(v) for v in stats.values()), stats
    assert report["timesteps_total"] == 16


def test_box_actions_are_normalized_to_the_bounds():
    plan = jaxplan.ppo_plan(SMALL, env="Pendulum-v1")  # torque in [-2, 2]
    raw = jax.numpy.array([[-5.0], [-1.0], [0.0], [0.5], [3.0]])
    np.testing.assert_allclose(
        to_env_action(
            plan.workers.env.action_space, raw, normalize_actions=plan.workers.normalize_actions
        )[:, 0],
        [-2, -2, 0, 1, 2],
    )
    plain = jaxplan.ppo_plan({**SMALL, "normalize_actions": False}, env="Pendulum-v1")
    np.testing.assert_allclose(
        to_env_action(
            plain.workers.env.action_space, raw, normalize_actions=plain.workers.normalize_actions
        )[:, 0],
        [-2, -1, 0, 0.5, 2],
    )


def test_vmap_envs_is_the_nested_vmap():
    """`vmap_envs` (one `vmap` over the flattened `[groups, envs]` axes, which XLA's CPU
    compiles faster) gives bitwise the numbers of `vmap(vmap(...))`: gymnax's own reset and
    step (their random numbers included) on 3 x 4 CartPole envs, over a few steps."""
    import gymnax

    from jaxplan.workers import vmap_envs

    env, env_params = gymnax.make("CartPole-v1")
    reset = lambda k: env.reset(k, env_params)  # noqa: E731
    step = lambda k, s, a: env.step(k, s, a, env_params)  # noqa: E731
    keys = jax.random.split(jax.random.PRNGKey(0), 12).reshape(3, 4, -1)
    nested = jax.jit(jax.vmap(jax.vmap(reset)))(keys)
    flat = jax.jit(vmap_envs(reset))(keys)
    chex.assert_trees_all_equal(nested, flat)
    state = nested[1]
    for t in range(20):
        k = jax.random.split(jax.random.PRNGKey(t), 12).reshape(3, 4, -1)
        actions = jnp.asarray(np.random.default_rng(t).integers(0, 2, (3, 4)), jnp.int32)
        a = jax.jit(jax.vmap(jax.vmap(step)))(k, state, actions)
        b = jax.jit(vmap_envs(step))(k, state, actions)
        chex.assert_trees_all_equal(a, b)
        state = a[1]
    assert a[0].shape == (3, 4, 4)
