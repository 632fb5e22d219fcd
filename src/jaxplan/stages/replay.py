"""RLlib's replay operators: a `LocalReplayBuffer` shared by `StoreToReplayBuffer` (writes
every rollout batch into it) and `Replay` (a flow source sampling train batches from it).

The buffer is a `jaxplan.flow.SharedState`: one entry of `PlanState.stages` that both stages
read and write, so a checkpoint holds it like any stage state. Per policy it is a ring of
`capacity` rows (RLlib's `buffer_size`) of every field of the rollout batches (after the
policy's postprocessing, e.g. DQN's n-step rewards), written in batch order; `Replay` samples
`replay_batch_size` rows uniformly, with replacement, from the filled slots only, and is
ready once `learning_starts` env steps were added (RLlib's `replay_starts`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from jaxplan.batch import MultiAgentBatch, batch_rows
from jaxplan.counters import Counter
from jaxplan.flow import Flow, SharedState, Stage
from jaxplan.workers import PlanState, WorkerSet

BATCH_INDEXES = "batch_indexes"
"""The replayed rows' slots in the buffer (RLlib's field; prioritized replay updates them)."""


@struct.dataclass
class ReplayState:
    """Per policy the ring `storage` (`{field: [capacity, ...]}`), the slot the next row goes
    to and how many slots are filled (int32); `num_added`: env steps added (all policies)."""

    storage: dict[str, dict[str, jax.Array]]
    next_index: dict[str, jax.Array]
    size: dict[str, jax.Array]
    num_added: Counter


class LocalReplayBuffer(SharedState):
    """RLlib's `LocalReplayBuffer(num_shards=1, learning_starts, capacity, replay_batch_size)`
    over the rows of `workers`' bulk_sync rollout batches (the row layout is taken from them
    at `init`). One device only: on a mesh it raises a `ValueError` naming `num_devices`."""

    name = "local_replay_buffer"

    def __init__(
        self,
        workers: WorkerSet,
        *,
        capacity: int,
        replay_batch_size: int,
        learning_starts: int = 0,
    ):
        if workers.mesh is not None:
            raise ValueError(
                f"the replay buffer runs on one device; this WorkerSet has a mesh of "
                f"{workers.mesh.size} devices: use num_devices=0 (and num_gpus<=1)"
            )
        for key, value, low in (
            ("capacity", capacity, 1),
            ("replay_batch_size", replay_batch_size, 1),
            ("learning_starts", learning_starts, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(
                    f"LocalReplayBuffer {key} must be an integer >= {low}, got {value!r}"
                )
        self.workers = workers
        self.capacity = capacity
        self.replay_batch_size = replay_batch_size
        self.learning_starts = learning_starts

    def init(self, state: PlanState) -> tuple[PlanState, ReplayState]:
        from jaxplan.stages.rollouts import Rollouts

        rollouts = Rollouts(self.workers)
        batch = jax.eval_shape(lambda s: rollouts.apply(s, None, None)[2], state)
        storage = {}
        for pid, rows in batch.policy_batches.items():
            n = batch_rows(rows)
            if n > self.capacity:
                raise ValueError(
                    f"buffer_size ({self.capacity}) is smaller than one rollout batch of "
                    f"policy {pid!r} ({n} rows)"
                )
            storage[pid] = {
                k: jnp.zeros((self.capacity, *v.shape[1:]), v.dtype) for k, v in rows.items()
            }
        zero = {pid: jnp.zeros((), jnp.int32) for pid in storage}
        return state, ReplayState(storage, zero, zero, Counter.zero())

    def metrics(self, state: PlanState, own: ReplayState) -> dict:
        return {"info": {"replay_buffer": {"num_added": own.num_added, "size": dict(own.size)}}}

    def add(self, own: ReplayState, batch: MultiAgentBatch) -> ReplayState:
        """`own` with every row of `batch` written at the ring's next slots."""
        storage, next_index, size = dict(own.storage), dict(own.next_index), dict(own.size)
        for pid, rows in batch.policy_batches.items():
            n = batch_rows(rows)
            slots = (next_index[pid] + jnp.arange(n)) % self.capacity
            storage[pid] = {
                k: buf.at[slots].set(rows[k].astype(buf.dtype)) for k, buf in storage[pid].items()
            }
            next_index[pid] = (next_index[pid] + n) % self.capacity
            size[pid] = jnp.minimum(size[pid] + n, self.capacity)
        return ReplayState(storage, next_index, size, own.num_added.add(batch.env_steps))

    def sample(self, own: ReplayState, key: jax.Array) -> MultiAgentBatch:
        """`replay_batch_size` rows per policy, uniformly from its filled slots (with
        replacement), with their slots in `batch_indexes`."""
        batches = {}
        keys = jax.random.split(key, len(own.storage))
        for (pid, storage), k in zip(own.storage.items(), keys, strict=True):
            high = jnp.maximum(own.size[pid], 1)
            slots = jax.random.randint(k, (self.replay_batch_size,), 0, high)
            batches[pid] = {f: buf[slots] for f, buf in storage.items()}
            batches[pid][BATCH_INDEXES] = slots
        return MultiAgentBatch(batches, env_steps=self.replay_batch_size)

    def ready(self, own: ReplayState) -> jax.Array:
        """Whether `learning_starts` env steps (at least one) have been added."""
        return own.num_added.ge(max(self.learning_starts, 1))


class StoreToReplayBuffer(Stage):
    """`MultiAgentBatch -> MultiAgentBatch` (unchanged): adds the batch to `local_buffer`."""

    def __init__(self, *, local_buffer: LocalReplayBuffer):
        self.shares = local_buffer

    def apply(self, state: PlanState, own: ReplayState, batch: MultiAgentBatch):
        return state, self.shares.add(own, batch), batch


class ReplayStage(Stage):
    """The source behind `Replay`: each pull samples a train batch (a `MultiAgentBatch` of
    `replay_batch_size` env steps) with a key split from the plan's."""

    def __init__(self, local_buffer: LocalReplayBuffer):
        self.shares = local_buffer

    def ready(self, state: PlanState, own: ReplayState) -> jax.Array:
        return self.shares.ready(own)

    def apply(self, state: PlanState, own: ReplayState, item: Any = None):
        key, k_sample = jax.random.split(state.key)
        return state.replace(key=key), own, self.shares.sample(own, k_sample)


def Replay(*, local_buffer: LocalReplayBuffer) -> Flow:  # noqa: N802 - RLlib's name
    """A flow of train batches replayed from `local_buffer`, ready once it holds
    `learning_starts` env steps (RLlib's `Replay(local_buffer=...)`)."""
    return Flow.source(ReplayStage(local_buffer))
