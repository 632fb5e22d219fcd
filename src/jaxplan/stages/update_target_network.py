"""UpdateTargetNetwork: RLlib's periodic update of each trainable policy's target network
(DQN: a copy, SAC: Polyak averaging), by env steps sampled."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from jaxplan.flow import Stage
from jaxplan.workers import PlanState, WorkerSet


@struct.dataclass
class TargetUpdateState:
    """`num_steps_sampled` at the last update (the low uint32 word: differences are exact
    below 2**32 steps) and the number of updates so far (int32)."""

    last_update: jax.Array
    num_target_updates: jax.Array


class UpdateTargetNetwork(Stage):
    """Passes its item through; after it, when at least `target_update_freq` env steps were
    sampled since the last update, every trainable policy's `update_target(policy_state)`
    runs (RLlib's `cur_ts - last_update >= target_update_freq`; the first update happens
    `target_update_freq` steps after the start; with 0, after every item, as RLlib's SAC
    default). The update is the policy's: DQN copies, SAC averages with `tau`. Reports
    `info.num_target_updates` and `info.last_target_update_ts`, as RLlib's counters."""

    def __init__(self, workers: WorkerSet, target_update_freq: int):
        if isinstance(target_update_freq, bool) or not isinstance(target_update_freq, int):
            raise ValueError(f"target_update_freq must be an integer, got {target_update_freq!r}")
        self.workers = workers
        if target_update_freq < 0:
            raise ValueError(f"target_update_freq must be >= 0, got {target_update_freq}")
        self.target_update_freq = target_update_freq

    def init(self, state: PlanState) -> tuple[PlanState, TargetUpdateState]:
        return state, TargetUpdateState(
            last_update=state.counters.num_steps_sampled.lo, num_target_updates=jnp.int32(0)
        )

    def metrics(self, state: PlanState, own: TargetUpdateState) -> dict:
        return {
            "info": {
                "num_target_updates": own.num_target_updates,
                "last_target_update_ts": own.last_update,
            }
        }

    def due(self, elapsed: jax.Array) -> jax.Array:
        """Whether `elapsed` env steps (uint32) since the last update call for one now."""
        return elapsed >= jnp.uint32(self.target_update_freq)

    def apply(self, state: PlanState, own: TargetUpdateState, item: Any):
        now = state.counters.num_steps_sampled.lo
        due = self.due(now - own.last_update)
        policies = dict(state.policies)
        for pid in self.workers.trainable_policies():
            updated = self.workers.policies[pid].update_target(policies[pid])
            policies[pid] = jax.tree.map(lambda n, o: jnp.where(due, n, o), updated, policies[pid])
        own = TargetUpdateState(
            last_update=jnp.where(due, now, own.last_update),
            num_target_updates=own.num_target_updates + due.astype(jnp.int32),
        )
        return state.replace(policies=policies), own, item
