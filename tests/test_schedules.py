"""RLlib's `lr_schedule` / `entropy_coeff_schedule`: the interpolation against a float64
reference of RLlib's PiecewiseSchedule, the values SGD used in a plan (`cur_lr`,
`entropy_coeff` in the results), config validation, and schedules swept under `vmap`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxplan
from jaxplan.stages.apply_schedules import piecewise_linear

PID = jaxplan.DEFAULT_POLICY_ID


def piecewise_reference(points, t):
    """RLlib's PiecewiseSchedule with `outside_value = points[-1][1]`, in float64."""
    for (l_t, l_v), (r_t, r_v) in zip(points[:-1], points[1:], strict=True):
        if l_t <= t < r_t:
            alpha = float(t - l_t) / (r_t - l_t)
            return l_v + alpha * (r_v - l_v)
    return points[-1][1]


@pytest.mark.parametrize(
    "points",
    [
        [[0, 1e-3], [1000, 1e-4]],
        [[0, 0.01], [500, 0.0], [2000, 0.005]],
        [[100, 5e-4], [100, 1e-3], [300, 2e-3]],  # a step, and t before the first point
        [[0, 3e-4]],
    ],
)
def test_piecewise_linear_matches_rllibs_schedule(points):
    ts = [0, 1, 50, 99.5, 100, 101, 256, 299, 300, 499, 500, 999, 1000, 1500, 2000, 10**6]
    got = jax.jit(jax.vmap(piecewise_linear, in_axes=(None, 0)))(
        jnp.asarray(points, jnp.float32), jnp.asarray(ts, jnp.float32)
    )
    want = [piecewise_reference([(float(a), float(b)) for a, b in points], t) for t in ts]
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-9)


SMALL = {
    "num_workers": 1,
    "num_envs_per_worker": 2,
    "rollout_fragment_length": 128,  # 256 env steps per iteration
    "train_batch_size": 256,
    "num_sgd_iter": 1,
    "model": {"fcnet_hiddens": [8]},
    "lr_schedule": [[0, 1e-3], [1000, 1e-4]],
    "entropy_coeff_schedule": [[0, 0.01], [512, 0.0]],
}


def _stats(plan, results, seed=None):
    if seed is not None:
        results = jax.tree.map(lambda x: x[seed], results)
    return [r["info"]["learner"][PID]["learner_stats"] for r in plan.reports(results)]


def test_plan_trains_with_the_scheduled_values():
    plan = jaxplan.ppo_plan(SMALL, env="CartPole-v1")
    state = jax.jit(plan.init)(jax.random.PRNGKey(0))
    _, results = jax.jit(lambda s: jaxplan.run_iterations(plan, s, 6))(state)
    for i, stats in enumerate(_stats(plan, results)):
        t = 256 * i  # env steps sampled before iteration i + 1
        assert stats["cur_lr"] == pytest.approx(piecewise_reference(SMALL["lr_schedule"], t))
        assert stats["entropy_coeff"] == pytest.approx(
            piecewise_reference(SMALL["entropy_coeff_schedule"], t), abs=1e-9
        )


def test_schedules_sweep_under_vmap():
    """Two runs in one program with two lr schedules: the tables are the stage's state."""
    plan = jaxplan.ppo_plan(SMALL, env="CartPole-v1")
    keys = jax.vmap(jax.random.PRNGKey)(jnp.arange(2))
    states = jax.vmap(plan.init)(keys)
    tables = [[[0, 1e-3], [1000, 1e-4]], [[0, 2e-3], [512, 5e-4]]]
    lr = jnp.asarray(tables, jnp.float32)
    stage = states.stages["apply_schedules"]
    stage = stage.replace(tables={PID: {**stage.tables[PID], "lr": lr}})
    states = states.replace(stages={"apply_schedules": stage})
    _, results = jax.jit(jax.vmap(lambda s: jaxplan.run_iterations(plan, s, 4)))(states)
    for seed, table in enumerate(tables):
        got = [s["cur_lr"] for s in _stats(plan, results, seed)]
        want = [piecewise_reference(table, 256 * i) for i in range(4)]
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_per_policy_schedule():
    """Only policy `a` overrides `lr_schedule`; `b` trains with the constant `lr`."""
    config = {
        **SMALL,
        "lr_schedule": None,
        "entropy_coeff_schedule": None,
        "lr": 3e-4,
        "multiagent": {
            "policies": {"a": {"lr_schedule": [[0, 1e-3], [1024, 1e-4]]}, "b": {}},
            "policy_mapping": {"agent_0": "a", "agent_1": "b"},
        },
    }
    plan = jaxplan.ppo_plan(config, env="MultiAgentCartPole")
    state = jax.jit(plan.init)(jax.random.PRNGKey(0))
    _, results = jax.jit(lambda s: jaxplan.run_iterations(plan, s, 3))(state)
    for i, r in enumerate(plan.reports(results)):
        learner = r["info"]["learner"]
        want = piecewise_reference([[0, 1e-3], [1024, 1e-4]], 256 * i)
        assert learner["a"]["learner_stats"]["cur_lr"] == pytest.approx(want)
        assert learner["b"]["learner_stats"]["cur_lr"] == pytest.approx(3e-4)


def test_an_lr_sweep_scales_a_scheduled_lr():
    """`plan.init(key, hparams=...)` with another `lr` scales the schedule by swept / configured
    (here the config's lr 1e-3 is the schedule's first value): a sweep still sweeps."""
    plan = jaxplan.ppo_plan({**SMALL, "lr": 1e-3}, env="CartPole-v1")
    base = jaxplan.PPOHParams.from_config(plan.workers.policies[PID].config)
    lrs = jnp.asarray([1e-3, 4e-3], jnp.float32)

    def train(lr):
        state = plan.init(jax.random.PRNGKey(0), {PID: base.replace(lr=lr)})
        return jaxplan.run_iterations(plan, state, 3)

    _, results = jax.jit(jax.vmap(train))(lrs)
    for run, factor in enumerate([1.0, 4.0]):
        got = [s["cur_lr"] for s in _stats(plan, results, run)]
        want = [factor * piecewise_reference(SMALL["lr_schedule"], 256 * i) for i in range(3)]
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_no_schedule_no_stage():
    plan = jaxplan.ppo_plan({**SMALL, "lr_schedule": None, "entropy_coeff_schedule": None})
    assert [name for name, _ in plan.flow.stages if "schedule" in name] == []


@pytest.mark.parametrize(
    "value,fragment",
    [
        ([[0, 1e-3, 5]], "expected a list of [number, number] pairs"),
        ([[10, 1e-3], [5, 1e-4]], "non-decreasing"),
        ([[0, 0.0]], "values must be > 0"),
        ([], "at least one"),
    ],
)
def test_bad_lr_schedule_is_a_clear_error(value, fragment):
    with pytest.raises(ValueError, match="lr_schedule") as e:
        jaxplan.PPOConfig.from_dict({"lr_schedule": value})
    assert fragment in str(e.value)
