"""jaxplan.compiler: the XLA options of jaxplan's own programs (LLVM -O1 on the CPU)."""

import jax
import numpy as np

import jaxplan
from jaxplan import compiler

TINY = {
    "num_workers": 1,
    "num_envs_per_worker": 4,
    "rollout_fragment_length": 32,
    "train_batch_size": 128,
    "sgd_minibatch_size": 64,
    "num_sgd_iter": 2,
    "model": {"fcnet_hiddens": [8]},
}


def test_options_per_platform():
    assert compiler.compiler_options("cpu") == {"xla_backend_optimization_level": 1}
    assert compiler.compiler_options("gpu") is None and compiler.compiler_options("tpu") is None
    assert jaxplan.compiler_options() == compiler.compiler_options(jax.default_backend())


def test_a_run_compiled_with_them_is_the_same_run_up_to_rounding():
    plan = jaxplan.ppo_plan(TINY, env="CartPole-v1")
    lowered = jax.jit(jaxplan.make_train(plan, 3)).lower(jax.random.PRNGKey(0))
    ours = lowered.compile(jaxplan.compiler_options())(jax.random.PRNGKey(0))
    plain = lowered.compile()(jax.random.PRNGKey(0))
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(plain), strict=True):
        a, b = np.asarray(a), np.asarray(b)
        if np.issubdtype(a.dtype, np.floating):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
        else:  # counters, episodes: the same steps
            np.testing.assert_array_equal(a, b)


def test_runner_and_train_seeds_compile_with_them(monkeypatch):
    from jaxplan import run, runner

    calls = []

    def spy(platform=None):
        calls.append(platform)
        return compiler.compiler_options(platform)

    monkeypatch.setattr(runner, "compiler_options", spy)
    monkeypatch.setattr(run, "compiler_options", spy)
    plan = jaxplan.ppo_plan(TINY, env="CartPole-v1")
    runner.Runner(plan, [0], jaxplan.Stop(training_iteration=1), chunk=1).compile()
    assert len(calls) == 2  # init and the chunk
    jaxplan.train_seeds(plan, [0, 1], 1)
    assert len(calls) == 3
