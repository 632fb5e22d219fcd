"""jaxplan.compiler: the XLA options of jaxplan's own programs (on the CPU: LLVM -O1, no
tree-reduction rewrite)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TINY_PPO, assert_same_run

import jaxplan
from jaxplan import compiler


def test_options_per_platform():
    assert compiler.compiler_options("cpu") == {
        "xla_backend_optimization_level": 1,
        "xla_disable_hlo_passes": "tree_reduction_rewriter",
    }
    assert compiler.compiler_options("gpu") is None and compiler.compiler_options("tpu") is None
    assert jaxplan.compiler_options() == compiler.compiler_options(jax.default_backend())


cpu_only = pytest.mark.skipif(jax.default_backend() != "cpu", reason="CPU compiler options")


@cpu_only
def test_reductions_compile_to_one_kernel_each():
    """The alarm for a jaxlib that renames or drops XLA's CPU pass `tree_reduction_rewriter`:
    by default it splits every reduction of more than 32 elements into windows of 32 (two or
    three kernels: `reduce-window`s, then the reduce); with the options it does not."""

    def reductions(x):
        return jnp.sum(x * 2.0), jnp.all(jnp.isfinite(x))  # float sum, boolean "and"

    lowered = jax.jit(reductions).lower(jnp.ones(18_310, jnp.float32))
    assert "reduce-window" in lowered.compile().as_text()  # XLA's default still rewrites
    assert "reduce-window" not in lowered.compile(compiler.compiler_options()).as_text()


@cpu_only
@pytest.mark.parametrize("n", [1_000, 262_144, 4_194_304])
def test_long_float32_sums_stay_accurate(n):
    """Without the rewrite a long float32 sum is still as accurate: mean and std of `n`
    values against float64 (a 2,048-env x 128-step train batch has 262,144 rows)."""
    x = np.random.default_rng(n).normal(3.0, 1.0, n).astype(np.float32)
    ref = x.astype(np.float64) * 1.5 + 0.25

    def stats(a):
        y = a * 1.5 + 0.25  # fused into the reduction, as in a loss
        return jnp.mean(y), jnp.std(y)

    mean, std = jax.jit(stats).lower(x).compile(compiler.compiler_options())(x)
    np.testing.assert_allclose(float(mean), ref.mean(), rtol=1e-6)
    np.testing.assert_allclose(float(std), ref.std(), rtol=1e-6)


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
