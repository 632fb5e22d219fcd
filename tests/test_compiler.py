"""jaxplan.compiler: the XLA options of jaxplan's own programs (LLVM -O1 on the CPU)."""

import jax
from conftest import TINY_PPO, assert_same_run

import jaxplan
from jaxplan import compiler


def test_options_per_platform():
    assert compiler.compiler_options("cpu") == {"xla_backend_optimization_level": 1}
    assert compiler.compiler_options("gpu") is None and compiler.compiler_options("tpu") is None
    assert jaxplan.compiler_options() == compiler.compiler_options(jax.default_backend())


def test_a_run_compiled_with_them_is_the_same_run_up_to_rounding():
    plan = jaxplan.ppo_plan(TINY_PPO, env="CartPole-v1")
    lowered = jax.jit(jaxplan.make_train(plan, 3)).lower(jax.random.PRNGKey(0))
    ours = lowered.compile(jaxplan.compiler_options())(jax.random.PRNGKey(0))
    plain = lowered.compile()(jax.random.PRNGKey(0))
    assert_same_run(ours, plain, rtol=1e-4, atol=1e-5)


def test_runner_and_train_seeds_compile_with_them(monkeypatch):
    from jaxplan import run, runner

    calls = []

    def spy(platform=None):
        calls.append(platform)
        return compiler.compiler_options(platform)

    monkeypatch.setattr(runner, "compiler_options", spy)
    monkeypatch.setattr(run, "compiler_options", spy)
    plan = jaxplan.ppo_plan(TINY_PPO, env="CartPole-v1")
    runner.Runner(plan, [0], jaxplan.Stop(training_iteration=1), chunk=1).compile()
    assert len(calls) == 2  # init and the chunk
    jaxplan.train_seeds(plan, [0, 1], 1)
    assert len(calls) == 3
