"""Whole training runs: `lax.scan` over `plan.step`, optionally stopped early, `vmap`-able.

`make_train(plan, n)` returns a pure `train(key) -> (PlanState, results)` in the style of
PureJaxRL: `jax.jit(train)` is one program, `jax.jit(jax.vmap(train))(keys)` trains one agent
per key in one program.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from jaxplan.flow import Plan, Result
from jaxplan.workers import PlanState


@dataclasses.dataclass(frozen=True)
class Stop:
    """RLlib-style stop criteria (static); any one that is set and met stops the run."""

    episode_reward_mean: float | None = None
    timesteps_total: int | None = None
    training_iteration: int | None = None

    def met(self, result: Result) -> jax.Array:
        done = jnp.zeros((), bool)
        if self.episode_reward_mean is not None:
            done |= result["episode_reward_mean"] >= self.episode_reward_mean  # NaN: False
        if self.timesteps_total is not None:
            done |= result["timesteps_total"].ge(int(self.timesteps_total))
        if self.training_iteration is not None:
            done |= result["training_iteration"] >= self.training_iteration
        return done


def run_iterations(
    plan: Plan, state: PlanState, num_iterations: int, stop: Stop | None = None
) -> tuple[PlanState, Result]:
    """`num_iterations` steps as one `lax.scan`; results are stacked on a leading axis.

    With `stop`, every result carries `done` (a criterion was met at or before it); once done,
    the state is frozen and later results repeat the last real one, so a chunked or `vmap`ped
    run stops each agent at its own iteration.
    """
    if stop is None:
        return jax.lax.scan(lambda s, _: plan.step(s), state, None, length=num_iterations)

    def with_done(state):
        state, result = plan.step(state)
        return state, {**result, "done": stop.met(result)}

    _, shape = jax.eval_shape(with_done, state)
    empty = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shape)

    def body(carry, _):
        state, last = carry
        state, result = jax.lax.cond(last["done"], lambda s: (s, last), with_done, state)
        return (state, result), result

    (state, _), results = jax.lax.scan(body, (state, empty), None, length=num_iterations)
    return state, results


def make_train(
    plan: Plan, num_iterations: int, stop: Stop | None = None
) -> Callable[[jax.Array], tuple[PlanState, Result]]:
    """A pure `train(key) -> (final PlanState, stacked results)` for the whole run."""

    def train(key: jax.Array):
        return run_iterations(plan, plan.init(key), num_iterations, stop)

    return train


def train_seeds(
    plan: Plan, seeds: list[int] | jax.Array, num_iterations: int, stop: Stop | None = None
) -> tuple[PlanState, Result]:
    """One compiled program training one agent per seed (`vmap` over `PRNGKey(seed)`).
    Leaves of the returned state and results have a leading seed axis."""
    keys = jax.vmap(jax.random.PRNGKey)(jnp.asarray(seeds, jnp.uint32))
    return jax.jit(jax.vmap(make_train(plan, num_iterations, stop)))(keys)
