"""ApplySchedules: RLlib's `lr_schedule` and `entropy_coeff_schedule`, as a stage before SGD."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
from flax import struct

from jaxplan.batch import MultiAgentBatch
from jaxplan.flow import Stage
from jaxplan.workers import PlanState


def piecewise_linear(points: jax.Array, t: jax.Array) -> jax.Array:
    """RLlib's `PiecewiseSchedule(points, outside_value=points[-1][1])` at `t`: linear
    between consecutive points `t_i <= t < t_{i+1}`, the last value anywhere else (before the
    first point too). `points`: `[k, 2]`, timesteps non-decreasing; returns a scalar."""
    steps, values = points[:, 0], points[:, 1]
    inside = (steps[:-1] <= t) & (t < steps[1:])  # [k - 1], at most one True
    alpha = (t - steps[:-1]) / jnp.where(inside, steps[1:] - steps[:-1], 1.0)
    segment = values[:-1] + alpha * (values[1:] - values[:-1])
    return jnp.where(jnp.any(inside), jnp.sum(jnp.where(inside, segment, 0.0)), values[-1])


@struct.dataclass
class ScheduleState:
    """Per policy and scheduled hyper-parameter: the `[points, 2]` table, and the traced
    value the run started with (`plan.init`'s, possibly swept under `vmap`)."""

    tables: dict[str, dict[str, jax.Array]]
    started: dict[str, dict[str, jax.Array]]


class ApplySchedules(Stage):
    """`MultiAgentBatch -> MultiAgentBatch`; before SGD, sets each scheduled traced
    hyper-parameter (`lr`, `entropy_coeff`) of a policy to its schedule's value at the env steps
    sampled before this iteration (the timestep RLlib's schedules read in that update).

    `configured[pid][name]` is the config's constant value. A run whose traced value was swept
    (`plan.init(key, hparams=...)`) follows the schedule scaled by `swept / configured`, so a
    sweep of `lr` moves a scheduled `lr` too; unswept, the factor is exactly 1 (RLlib's
    semantics), and with a configured 0 there is no factor. The tables are this stage's state,
    so vmapped runs can also follow different schedules."""

    def __init__(
        self,
        schedules: Mapping[str, Mapping[str, Sequence[Sequence[float]]]],
        configured: Mapping[str, Mapping[str, float]],
    ):
        self.schedules = {
            pid: {name: tuple(tuple(p) for p in points) for name, points in named.items()}
            for pid, named in schedules.items()
        }
        self.configured = {pid: dict(configured[pid]) for pid in self.schedules}

    def init(self, state: PlanState) -> tuple[PlanState, ScheduleState]:
        tables = {
            pid: {name: jnp.asarray(points, jnp.float32) for name, points in named.items()}
            for pid, named in self.schedules.items()
        }
        started = {
            pid: {name: getattr(state.policies[pid].hparams, name) for name in named}
            for pid, named in self.schedules.items()
        }
        return state, ScheduleState(tables=tables, started=started)

    def apply(self, state: PlanState, own: ScheduleState, batch: MultiAgentBatch):
        t = state.counters.num_steps_sampled.to_float() - batch.env_steps
        policies = dict(state.policies)
        for pid, named in own.tables.items():
            values = {}
            for name, points in named.items():
                value = piecewise_linear(points, t)
                base = self.configured[pid][name]
                # factor exactly 1 unless swept: unswept runs follow the table bit for bit
                values[name] = value * (own.started[pid][name] / base) if base else value
            ps = policies[pid]
            policies[pid] = ps.replace(hparams=ps.hparams.replace(**values))
        return state.replace(policies=policies), own, batch
