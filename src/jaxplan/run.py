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
