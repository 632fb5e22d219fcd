"""Whole training runs: `lax.scan` over `plan.step`, optionally stopped early, `vmap`-able.

`make_train(plan, n)` returns a pure `train(key) -> (PlanState, results)` in the style of
PureJaxRL: `jax.jit(train)` is one program, `jax.jit(jax.vmap(train))(keys)` trains one agent
per key in one program.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jaxplan.compiler import compiler_options
from jaxplan.fast_rng import unrolled_threefry
from jaxplan.flow import Plan, Result
from jaxplan.seed_devices import SEED_AXIS, pad_seeds, padded_seeds, seed_mesh, spread_seeds
from jaxplan.stages.metrics import episode_stats
from jaxplan.workers import PlanState


@dataclasses.dataclass(frozen=True)
class Stop:
    """RLlib-style stop criteria (static); any one that is set and met stops the run.

    Criteria are read from `PlanState` (the episode window, the counters), so a run split into
    several `run_iterations` calls stops exactly where one long run would.
    """

    episode_reward_mean: float | None = None
    timesteps_total: int | None = None
    training_iteration: int | None = None

    def met(self, state: PlanState) -> jax.Array:
        done = jnp.zeros((), bool)
        if self.episode_reward_mean is not None:
            mean = episode_stats(state.episodes)["episode_reward_mean"]
            done |= mean >= self.episode_reward_mean  # NaN before any episode: False
        if self.timesteps_total is not None:
            done |= state.counters.num_steps_sampled.ge(int(self.timesteps_total))
        if self.training_iteration is not None:
            done |= state.counters.training_iteration >= self.training_iteration
        return done


def run_iterations(
    plan: Plan, state: PlanState, num_iterations: int, stop: Stop | None = None
) -> tuple[PlanState, Result]:
    """`num_iterations` steps as one `lax.scan`; results are stacked on a leading axis.

    With `stop`, each result also holds `done` (a criterion is met after that iteration). Once
    met, the state is frozen: later iterations do no work (under `vmap` they compute and
    discard) and their results repeat the last real one, or are zeros with `done=True` when the
    state was already done on entry. Read each run's results up to its first `done`.
    """
    if stop is None:
        return jax.lax.scan(lambda s, _: plan.step(s), state, None, length=num_iterations)

    def step(state):
        state, result = plan.step(state)
        return state, {**result, "done": stop.met(state)}

    _, shape = jax.eval_shape(step, state)
    first = {
        **jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shape),
        "done": stop.met(state),
    }

    def body(carry, _):
        state, last = carry
        state, result = jax.lax.cond(last["done"], lambda s: (s, last), step, state)
        return (state, result), result

    (state, _), results = jax.lax.scan(body, (state, first), None, length=num_iterations)
    return state, results


def make_train(
    plan: Plan, num_iterations: int, stop: Stop | None = None
) -> Callable[..., tuple[PlanState, Result]]:
    """A pure `train(key, hparams=None) -> (final PlanState, stacked results)` for the whole run.

    `hparams` is `plan.init`'s: per policy id, a `PPOHParams` or a mapping of some of its fields
    (`{"default_policy": {"lr": lr}}`). A sweep is `jax.vmap(train)(keys, hparams)` with
    `[runs]` arrays as the swept values, or `train_seeds(..., hparams=...)`.
    """

    def train(key: jax.Array, hparams: Mapping[str, Any] | None = None):
        return run_iterations(plan, plan.init(key, hparams), num_iterations, stop)

    return train


def train_seeds(
    plan: Plan,
    seeds: list[int] | jax.Array,
    num_iterations: int,
    stop: Stop | None = None,
    hparams: Mapping[str, Any] | None = None,
) -> tuple[PlanState, Result]:
    """One compiled program training one agent per seed (`vmap` over `PRNGKey(seed)`).
    Leaves of the returned state and results have a leading seed axis. The program is lowered
    with the unrolled threefry (`jaxplan.fast_rng.unrolled_threefry`: the same random numbers)
    and compiled with `jaxplan.compiler_options()`, so its floats may differ in the last bits
    from a plain `jax.jit(jax.vmap(make_train(...)))`. With several devices (on the CPU:
    `jaxplan.use_cpu_devices()` at the start) the seeds are split over them
    (`jaxplan.seed_devices`; 3 seeds on 2 devices: 2 each, the fourth a copy of the last seed,
    dropped), the returned leaves placed along the seed axis over them.

    `hparams` (see `make_train`): each value is a number shared by all runs or a `[len(seeds)]`
    array, one per run, so `seeds=[0, 0, 0], hparams={"default_policy": {"lr": [1e-4, 3e-4,
    1e-3]}}` is an lr sweep in one program. Checked before anything compiles.
    """
    seeds = jnp.asarray(seeds, jnp.uint32)
    if seeds.ndim != 1 or seeds.shape[0] == 0:
        raise ValueError(f"seeds must be a non-empty list of ints, got shape {list(seeds.shape)}")
    n = seeds.shape[0]
    mesh = seed_mesh(n, plan.workers.mesh)
    length = padded_seeds(n, mesh)  # n, or up to a multiple of the devices (copies of the last)
    keys = pad_seeds(jax.vmap(jax.random.PRNGKey)(seeds), length)
    if hparams is None:
        train = jax.vmap(make_train(plan, num_iterations, stop))
        train, args = spread_seeds(train, mesh), (keys,)
    else:
        hparams, axes = _per_run(hparams, n)
        first = jax.tree.map(lambda x, a: x if a is None else x[0], hparams, axes)
        jax.eval_shape(lambda key: plan.init(key, first), keys[0])  # bad hparams fail here
        hparams = jax.tree.map(lambda x, a: x if a is None else pad_seeds(x, length), hparams, axes)
        train = jax.vmap(make_train(plan, num_iterations, stop), in_axes=(0, axes))
        shared = jax.tree.map(lambda a: P() if a is None else P(SEED_AXIS), axes, is_leaf=_none)
        train, args = spread_seeds(train, mesh, (P(SEED_AXIS), shared)), (keys, hparams)

    def run(*args):
        out = train(*args)
        return out if length == n else jax.tree.map(lambda x: x[:n], out)  # the padding dropped

    with unrolled_threefry():  # the same numbers; cheaper with a seed axis (jaxplan.fast_rng)
        return jax.jit(run, compiler_options=compiler_options())(*args)


def _none(x: Any) -> bool:
    return x is None


def _per_run(hparams: Mapping[str, Any], runs: int) -> tuple[Any, Any]:
    """`hparams` with array leaves, and their `vmap` axes: None for a shared scalar, 0 for a
    `[runs]` array; `ValueError` naming any other leaf shape."""

    def leaf(path, x):
        try:
            x = jnp.asarray(x)
        except TypeError:
            return x, None  # not a number: `plan.init` names it
        if x.ndim == 0:
            return x, None
        if x.shape == (runs,):
            return x, 0
        raise ValueError(
            f"hparams{jax.tree_util.keystr(path)} has shape {list(x.shape)}; expected a "
            f"number shared by all runs or one value per seed (shape [{runs}])"
        )

    is_list = lambda x: isinstance(x, list | tuple)  # a list of numbers is one [runs] value
    pairs = jax.tree_util.tree_map_with_path(leaf, dict(hparams), is_leaf=is_list)
    is_pair = lambda x: isinstance(x, tuple) and len(x) == 2
    values = jax.tree.map(lambda p: p[0], pairs, is_leaf=is_pair)
    axes = jax.tree.map(lambda p: p[1], pairs, is_leaf=is_pair)
    return values, axes
