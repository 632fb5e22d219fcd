"""benchmarks/throughput.py's pieces that are not jaxplan: the raw gymnax yardstick and the
program-memory figure (the full script runs in benchmarks, not here)."""

import sys
from pathlib import Path

import gymnax
import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from common import aot_compile  # noqa: E402
from throughput import gymnax_random_rollout  # noqa: E402


def test_raw_gymnax_rollout_steps_every_env_with_gymnax_auto_reset():
    """CartPole pays reward 1 every step, so the mean reward is exactly 1; a random policy
    ends episodes after ~22 steps, so 64 steps of 4 envs end several; the observations and
    actions match a step-by-step Python loop over the same keys."""
    envs, length, iterations = 4, 64, 2
    train = gymnax_random_rollout(envs, length, iterations)
    mean_reward, dones, obs_sum, action_sum = jax.jit(train)(jax.random.PRNGKey(0))
    np.testing.assert_array_equal(mean_reward, np.ones(iterations))
    assert np.all(dones >= 4) and np.all(dones <= envs * length)

    env, params = gymnax.make("CartPole-v1")
    key, reset_key = jax.random.split(jax.random.PRNGKey(0))
    keys = jax.random.split(reset_key, envs)
    states = [env.reset(keys[i], params) for i in range(envs)]
    obs, state = [s[0] for s in states], [s[1] for s in states]
    step = jax.jit(env.step)
    sample = jax.jit(env.action_space(params).sample)
    total_obs, total_act, total_done = 0.0, 0, 0
    for _ in range(length):
        key, act_key, step_key = jax.random.split(key, 3)
        act_keys, step_keys = jax.random.split(act_key, envs), jax.random.split(step_key, envs)
        for i in range(envs):
            a = sample(act_keys[i])
            total_obs += float(jnp.sum(obs[i]))
            total_act += int(a)
            obs[i], state[i], _, term, trunc, _ = step(step_keys[i], state[i], a, params)
            total_done += int(term | trunc)
    assert int(action_sum[0]) == total_act
    assert int(dones[0]) == total_done
    np.testing.assert_allclose(float(obs_sum[0]), total_obs, rtol=1e-4, atol=1e-3)


def test_program_memory_counts_arguments_outputs_and_temporaries():
    """`Compiled.memory_bytes` is XLA's buffer assignment: a program that takes a 1 MiB array
    and returns a 1 MiB array needs at least 2 MiB."""
    x = jnp.ones((512, 512), jnp.float32)  # 1 MiB
    compiled = aot_compile(lambda a: jnp.tanh(a) * 2.0, x)
    mem = compiled.memory_bytes()
    assert mem is not None and 2 * 2**20 <= mem < 4 * 2**20
