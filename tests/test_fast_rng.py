"""jaxplan.fast_rng: the unrolled threefry lowering on the CPU gives the same bits without
while loops. It reaches into JAX internals, so this test is the alarm for a JAX upgrade."""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TINY_PPO, assert_same_run

import jaxplan
from jaxplan.fast_rng import use_unrolled_threefry


@pytest.fixture
def unrolled():
    assert use_unrolled_threefry(True), (
        "jax._src.random.threefry2x32 / jax._src.interpreters.mlir moved: update "
        "jaxplan/fast_rng.py for this JAX (the fallback leaves JAX's rolled lowering)"
    )
    yield
    assert use_unrolled_threefry(False)


def _draws(key):
    k1, k2 = jax.random.split(key)
    return (
        jax.random.uniform(k1, (5,)),
        jax.random.categorical(k2, jnp.log(jnp.asarray([0.2, 0.3, 0.5])), shape=(7,)),
        jax.random.split(key, 3),
    )


def _while_loops(fn, *args) -> int:
    return jax.jit(fn).lower(*args).as_text().count("stablehlo.while")


def test_same_bits_and_no_loops(unrolled):
    key = jax.random.PRNGKey(3)
    fast = jax.jit(lambda k: _draws(k))(key)  # a fresh function, lowered with the new rule
    assert _while_loops(lambda k: _draws(k), key) == 0
    use_unrolled_threefry(False)
    rolled = jax.jit(lambda k: _draws(k))(key)
    assert _while_loops(lambda k: _draws(k), key) > 0  # JAX's CPU default: rolled loops
    for a, b in zip(jax.tree.leaves(fast), jax.tree.leaves(rolled), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_ppo_run_is_the_same_run(unrolled):
    config = {
        "num_workers": 1,
        "num_envs_per_worker": 4,
        "rollout_fragment_length": 32,
        "train_batch_size": 128,
        "sgd_minibatch_size": 64,
        "num_sgd_iter": 2,
        "model": {"fcnet_hiddens": [8]},
    }
    plan = jaxplan.ppo_plan(config, env="CartPole-v1")
    fast = jax.jit(lambda key: jaxplan.make_train(plan, 2)(key))(jax.random.PRNGKey(0))
    use_unrolled_threefry(False)
    rolled = jax.jit(lambda key: jaxplan.make_train(plan, 2)(key))(jax.random.PRNGKey(0))
    # another program: XLA may round floats otherwise; the same random stream
    assert_same_run(fast, rolled, rtol=1e-5, atol=1e-7)


def test_unrolled_threefry_block_restores_the_lowering_before_it():
    from jaxplan.fast_rng import unrolled_threefry

    key = jax.random.PRNGKey(3)
    assert _while_loops(lambda k: _draws(k), key) > 0  # JAX's CPU default
    with unrolled_threefry() as ok:
        assert ok and _while_loops(lambda k: _draws(k), key) == 0
    assert _while_loops(lambda k: _draws(k), key) > 0
    assert use_unrolled_threefry(True)
    try:
        with unrolled_threefry():
            pass
        assert _while_loops(lambda k: _draws(k), key) == 0  # a process-wide choice stays
    finally:
        use_unrolled_threefry(False)


def test_seed_vmapped_programs_are_lowered_unrolled(monkeypatch, tmp_path):
    """`train_seeds` and a `Runner` of several seeds trace their programs inside
    `unrolled_threefry` (tests/test_determinism.py: the same runs as seed by seed); a one-seed
    `Runner` keeps JAX's lowering."""
    from jaxplan import fast_rng
    from jaxplan.runner import Runner

    plan = jaxplan.ppo_plan(TINY_PPO, env="CartPole-v1")
    seen, split = [], jax.random.split

    def spy(*args, **kwargs):
        seen.append(fast_rng._unrolled)
        return split(*args, **kwargs)

    monkeypatch.setattr(jax.random, "split", spy)
    jaxplan.train_seeds(plan, [0, 1], 1)
    assert seen and all(seen) and not fast_rng._unrolled
    for seeds, unrolled in [([0, 1], True), ([0], False)]:
        seen.clear()
        Runner(plan, seeds, jaxplan.Stop(training_iteration=1), chunk=1).compile()
        assert seen and all(s == unrolled for s in seen) and not fast_rng._unrolled


def test_unrolled_here_unrolls_only_what_is_traced_inside():
    """The hashes traced inside `unrolled_here` (here inside a `scan`, through `jax.random`'s
    own jitted functions) lower without loops, those outside keep JAX's rolled loops, and
    the bits are those of the plain program."""
    from jaxplan.fast_rng import unrolled_here

    def program(key, marked):
        def body(k, _):
            k, s = jax.random.split(k)
            return k, jax.random.uniform(s, (3,))

        outside = jax.random.normal(key, (4,))
        with unrolled_here() if marked else contextlib.nullcontext() as ok:
            _, inside = jax.lax.scan(body, key, None, 5)
        assert ok in (True, None), (
            "jaxplan.fast_rng.unrolled_here: jax.experimental.xla_metadata or the lowering "
            "internals moved; update jaxplan/fast_rng.py for this JAX"
        )
        return outside, inside

    key = jax.random.PRNGKey(5)
    loops = {m: _while_loops(lambda k, m=m: program(k, m), key) for m in (False, True)}
    # the scan's own loop stays; the rolled hashes inside it are gone, not the one outside
    assert loops[True] >= 2 and loops[False] > loops[True]
    assert _while_loops(lambda k: program(k, True)[0], key) >= 1  # the outside draw: rolled
    marked = jax.jit(lambda k: program(k, True))(key)
    plain = jax.jit(lambda k: program(k, False))(key)
    for a, b in zip(jax.tree.leaves(marked), jax.tree.leaves(plain), strict=True):
        np.testing.assert_array_equal(a, b)


def test_rollouts_act_unrolled_with_the_same_numbers(monkeypatch):
    """The rollout stage traces its steps inside `unrolled_here`: an acting plan's program
    has fewer loops than without it and takes the same actions, episodes and returns."""
    from jaxplan.stages import rollouts

    plan = jaxplan.ppo_plan(TINY_PPO, env="CartPole-v1")
    acting = jaxplan.sample_only_plan(plan.workers, mode="bulk_sync")
    key = jax.random.PRNGKey(0)

    def lowered():
        return jax.jit(lambda k: jaxplan.make_train(acting, 3)(k)).lower(key)

    fast_text, fast = lowered().as_text(), jax.jit(jaxplan.make_train(acting, 3))(key)
    monkeypatch.setattr(rollouts, "unrolled_here", contextlib.nullcontext)
    plain_text, plain = lowered().as_text(), jax.jit(jaxplan.make_train(acting, 3))(key)
    assert fast_text.count("stablehlo.while") < plain_text.count("stablehlo.while")
    assert_same_run(fast, plain, rtol=1e-6, atol=1e-7)
