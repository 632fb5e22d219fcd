"""Same seed, same result; `vmap` over seeds equals the runs one by one."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TINY_PPO

import jaxplan
from jaxplan.counters import counter_value

NUM_ITERS = 5


@pytest.fixture(scope="module")
def plan():
    return jaxplan.ppo_plan(TINY_PPO, env="CartPole-v1")


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_two_runs_with_one_seed_are_identical():
    # two plans built from scratch, two separate compilations
    runs = []
    for _ in range(2):
        plan = jaxplan.ppo_plan(TINY_PPO, env="CartPole-v1")
        runs.append(jax.jit(jaxplan.make_train(plan, NUM_ITERS))(jax.random.PRNGKey(7)))
    for a, b in zip(_leaves(runs[0]), _leaves(runs[1]), strict=True):
        np.testing.assert_array_equal(a, b)


def test_different_seeds_differ(plan):
    train = jax.jit(jaxplan.make_train(plan, 2))
    (s0, _), (s1, _) = train(jax.random.PRNGKey(0)), train(jax.random.PRNGKey(1))
    p0 = jax.tree.leaves(s0.policies["default_policy"].params)
    p1 = jax.tree.leaves(s1.policies["default_policy"].params)
    assert any(not np.array_equal(a, b) for a, b in zip(p0, p1, strict=True))


def test_vmap_over_seeds_equals_runs_one_by_one(plan):
    seeds = [0, 1, 2]
    state_v, results_v = jaxplan.train_seeds(plan, seeds, NUM_ITERS)
    train = jax.jit(jaxplan.make_train(plan, NUM_ITERS))
    for i, seed in enumerate(seeds):
        state_1, results_1 = train(jax.random.PRNGKey(seed))
        # counts and the sampled episodes are identical ...
        np.testing.assert_array_equal(
            counter_value(results_1["timesteps_total"]),
            counter_value(jax.tree.map(lambda x, i=i: x[i], results_v["timesteps_total"])),
        )
        np.testing.assert_array_equal(results_1["episodes_total"], results_v["episodes_total"][i])
        # ... and floats agree to float32 rounding: vmap batches the matmuls, which changes
        # XLA's summation order (measured max |diff| ~4e-6 after 5 iterations)
        one = _leaves((state_1, results_1))
        batched = _leaves(jax.tree.map(lambda x, i=i: x[i], (state_v, results_v)))
        for a, b in zip(one, batched, strict=True):
            if np.issubdtype(a.dtype, np.floating):
                np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
            else:
                np.testing.assert_array_equal(a, b)


def test_vmap_over_hyperparameters(plan):
    """Traced hyper-parameters: one program, two learning rates, params move differently."""
    base = jaxplan.PPOHParams.from_config(plan.workers.policies["default_policy"].config)
    lrs = jnp.array([1e-4, 1e-2], jnp.float32)

    def train(lr):
        state = plan.init(jax.random.PRNGKey(0), {"default_policy": base.replace(lr=lr)})
        return jaxplan.run_iterations(plan, state, 2)

    state, results = jax.jit(jax.vmap(train))(lrs)
    cur_lr = results["info"]["learner"]["default_policy"]["learner_stats"]["cur_lr"]
    np.testing.assert_allclose(cur_lr[:, 0], lrs)
    init = plan.init(jax.random.PRNGKey(0)).policies["default_policy"].params
    moved = [
        sum(
            float(np.abs(np.asarray(p)[i] - np.asarray(q)).sum())
            for p, q in zip(
                jax.tree.leaves(state.policies["default_policy"].params),
                jax.tree.leaves(init),
                strict=True,
            )
        )
        for i in range(2)
    ]
    assert moved[1] > 5 * moved[0]


def test_compiled_init_is_the_runners_init(plan):
    """`plan.init` on concrete values runs as one compiled program: the init that
    `Runner`/`train_seeds` trace into theirs and the op-by-op one (`jax.disable_jit`), with and
    without hparams, up to float32 rounding (programs fuse the orthogonal init's scaling
    differently: measured <= 1.2e-7, the last bit)."""
    key, hp = jax.random.PRNGKey(3), {"default_policy": {"lr": 1e-3}}
    traced = jax.jit(lambda k, h: plan.init(k, h))
    with jax.disable_jit():
        eager = plan.init(key)

    def assert_close(got, want):
        assert jax.tree.structure(got) == jax.tree.structure(want)
        for a, b in zip(_leaves(got), _leaves(want), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=2e-7)

    assert_close(plan.init(key), traced(key, None))
    assert_close(plan.init(key, hp), traced(key, hp))
    assert_close(plan.init(key), eager)
    assert plan.init(key, hp).policies["default_policy"].hparams.lr == np.float32(1e-3)
    batched = jax.vmap(plan.init)(jnp.stack([key, key]))  # traced inline under vmap
    assert_close(jax.tree.map(lambda x: x[1], batched), plan.init(key))
    with pytest.raises(ValueError, match="'lr' = 'x': expected a number"):
        plan.init(key, {"default_policy": {"lr": "x"}})
