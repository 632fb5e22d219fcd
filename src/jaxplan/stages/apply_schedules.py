"""ApplySchedules: RLlib's `lr_schedule` and `entropy_coeff_schedule`, as a stage before SGD."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp

from jaxplan.batch import MultiAgentBatch
from jaxplan.flow import Stage
from jaxplan.workers import PlanState

Tables = dict[str, dict[str, jax.Array]]
"""`{policy_id: {hyper-parameter: f32 [points, 2]}}`: `[timestep, value]` rows."""


def piecewise_linear(points: jax.Array, t: jax.Array) -> jax.Array:
    """RLlib's `PiecewiseSchedule(points, outside_value=points[-1][1])` at `t`: linear
    between consecutive points `t_i <= t < t_{i+1}`, the last value anywhere else (before the
    first point too). `points`: `[k, 2]`, timesteps non-decreasing; returns a scalar."""
    steps, values = points[:, 0], points[:, 1]
    inside = (steps[:-1] <= t) & (t < steps[1:])  # [k - 1], at most one True
    alpha = (t - steps[:-1]) / jnp.where(inside, steps[1:] - steps[:-1], 1.0)
    segment = values[:-1] + alpha * (values[1:] - values[:-1])
    return jnp.where(jnp.any(inside), jnp.sum(jnp.where(inside, segment, 0.0)), values[-1])


class ApplySchedules(Stage):
    """`MultiAgentBatch -> MultiAgentBatch`; before SGD, sets each scheduled traced
    hyper-parameter (`lr`, `entropy_coeff`) of a policy to its schedule's value at the env steps
    sampled before this iteration (the timestep RLlib's schedules read in that update). The
    tables are this stage's state, so they can differ per run under `vmap`."""

    def __init__(self, schedules: Mapping[str, Mapping[str, Sequence[Sequence[float]]]]):
        self.schedules = {
            pid: {name: tuple(tuple(p) for p in points) for name, points in named.items()}
            for pid, named in schedules.items()
        }

    def init(self, state: PlanState) -> tuple[PlanState, Tables]:
        tables = {
            pid: {name: jnp.asarray(points, jnp.float32) for name, points in named.items()}
            for pid, named in self.schedules.items()
        }
        return state, tables

    def apply(self, state: PlanState, tables: Tables, batch: MultiAgentBatch):
        t = state.counters.num_steps_sampled.to_float() - batch.env_steps
        policies = dict(state.policies)
        for pid, named in tables.items():
            ps = policies[pid]
            values = {name: piecewise_linear(points, t) for name, points in named.items()}
            policies[pid] = ps.replace(hparams=ps.hparams.replace(**values))
        return state.replace(policies=policies), tables, batch
