"""The library runner: chunks of compiled iterations, per-seed stopping, host results."""

import pytest

import jaxplan
from jaxplan.runner import Runner

TINY = {"model": {"fcnet_hiddens": [8]}, "train_batch_size": 128, "num_sgd_iter": 1}


def test_runner_two_seeds_without_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = jaxplan.ppo_plan(TINY, env="CartPole-v1")
    runner = Runner(plan, seeds=[3, 4], stop=jaxplan.Stop(training_iteration=3), chunk=2)
    assert runner.compile().compile_s > 0 and runner.writer is None
    chunks = []
    results = runner.run(on_results=chunks.append)
    # iterations 1-2, then 3 (each seed stops after it; the chunk's 4th iteration is dropped)
    assert [[(r["training_iteration"], r["seed"]) for r in c] for c in chunks] == [
        [(1, 3), (1, 4), (2, 3), (2, 4)],
        [(3, 3), (3, 4)],
    ]
    assert results == [r for c in chunks for r in c]
    assert sorted(runner.done) == [3, 4] and runner.last[4] is results[-1]
    round_steps = plan.workers.round_env_steps  # bulk_sync: one round of 512 steps >= 128
    for r in results:
        assert r["timesteps_this_iter"] == round_steps
        assert r["timesteps_total"] == r["training_iteration"] * round_steps
        assert r["num_env_steps_sampled_throughput_per_sec"] == pytest.approx(
            r["timesteps_this_iter"] / r["time_this_iter_s"]
        )
    first, last = results[0]["time_this_iter_s"], results[-1]["time_this_iter_s"]
    assert results[-1]["time_total_s"] == pytest.approx(2 * first + last)
    assert list(runner) == [] and list(tmp_path.iterdir()) == []  # done; wrote nothing


@pytest.mark.parametrize("seeds", [[5], [5, 6]])
def test_runner_state_is_run_iterations(seeds):
    """On one device the runner compiles init in a thread while it traces the chunk from
    init's abstract outputs: it ends with bitwise the state of `run_iterations` from a jitted
    `plan.init` (`vmap`ped over the seeds and lowered with the unrolled threefry, as the
    runner does for several)."""
    import contextlib

    import jax
    import numpy as np

    from jaxplan.fast_rng import unrolled_threefry
    from jaxplan.run import run_iterations

    plan = jaxplan.ppo_plan(TINY, env="CartPole-v1")
    stop = jaxplan.Stop(training_iteration=3)
    runner = Runner(plan, seeds=seeds, stop=stop, chunk=3)
    runner.run()
    init, run = plan.init, lambda s: run_iterations(plan, s, 3, stop)
    keys = jax.vmap(jax.random.PRNGKey)(np.asarray(seeds, np.uint32))
    if len(seeds) == 1:
        keys, lowering = keys[0], contextlib.nullcontext()
    else:  # several seeds: the runner lowers threefry unrolled (jaxplan.fast_rng)
        init, run = jax.vmap(init), jax.vmap(run)
        lowering = unrolled_threefry()
    with lowering:
        opts = jaxplan.compiler_options()  # the runner's XLA options
        state, _ = jax.jit(run, compiler_options=opts)(jax.jit(init, compiler_options=opts)(keys))
    for a, b in zip(jax.tree.leaves(runner.state), jax.tree.leaves(state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
