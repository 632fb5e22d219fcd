"""Whole runs: stop criteria, chunked runs equal one long run, frozen state after stopping."""

import jax
import numpy as np
import pytest
from conftest import TINY_PPO

import jaxplan
from jaxplan.counters import counter_value


@pytest.fixture(scope="module")
def plan():
    return jaxplan.ppo_plan(TINY_PPO, env="CartPole-v1")


def test_chunked_run_stops_where_one_long_run_stops(plan):
    stop = jaxplan.Stop(training_iteration=7)
    state0 = plan.init(jax.random.PRNGKey(3))
    long_state, long_results = jax.jit(lambda s: jaxplan.run_iterations(plan, s, 10, stop))(state0)
    assert list(np.asarray(long_results["done"])) == [False] * 6 + [True] * 4
    assert list(np.asarray(long_results["training_iteration"])) == [1, 2, 3, 4, 5, 6, 7, 7, 7, 7]

    chunk = jax.jit(lambda s: jaxplan.run_iterations(plan, s, 3, stop))
    state, iterations, done = state0, [], []
    for _ in range(4):  # 12 iterations' worth of calls; the last ones must do nothing
        state, results = chunk(state)
        iterations += [int(i) for i in results["training_iteration"]]
        done += [bool(d) for d in results["done"]]
    # 7 real iterations, the repeat of the stopping result, then zeros from a done state
    assert iterations == [1, 2, 3, 4, 5, 6, 7, 7, 7, 0, 0, 0]
    assert done == [False] * 6 + [True] * 6
    assert int(state.counters.training_iteration) == 7
    assert counter_value(state.counters.num_steps_sampled) == 7 * 64
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(long_state), strict=True):
        np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=1e-6)


def test_stop_by_timesteps_is_exact(plan):
    stop = jaxplan.Stop(timesteps_total=200)  # 64 steps/iter: met after iteration 4 (256)
    state, results = jax.jit(lambda s: jaxplan.run_iterations(plan, s, 6, stop))(
        plan.init(jax.random.PRNGKey(0))
    )
    assert list(np.asarray(results["done"])) == [False, False, False, True, True, True]
    assert counter_value(state.counters.num_steps_sampled) == 256
