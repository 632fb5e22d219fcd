"""RLlib's learner queue: `Enqueue(queue)` ends the flow that builds train batches, and
`Dequeue(queue)` starts the learner's flow (RLlib's `Enqueue(learner_thread.inqueue)` and the
learner thread's loop over it; IMPALA and APPO join both with `Concurrently(mode="async")`).

The queue is a `jaxplan.flow.SharedState`: one entry of `PlanState.stages`, a bounded FIFO of
`learner_queue_size` train batches on device (a ring: the batches' rows, the head slot and the
size), so a checkpoint holds it like any stage state.

What it models in a synchronous, compiled plan: each cycle of `Concurrently` pulls the
producer flow (rollouts -> train batches -> `Enqueue`) once and then the learner flow
(`Dequeue` -> learner) once. The learner takes the oldest train batch whenever the queue holds
one (RLlib's `_NextValueNotReady` otherwise); the producer pushes what one pull emits: one
train batch, or with `MixInReplay` the new batch and the replayed ones (0 to
`ceil(replay_proportion)` of them). When the queue has no room for the most one pull can emit,
the producer is not pulled that cycle (no env steps, its state unchanged): RLlib's `Enqueue`
blocks on a full queue, which stalls the sampling until the learner frees a slot
(backpressure). Without replay the queue therefore holds the one batch of the cycle between
`Enqueue` and `Dequeue` and is empty after each cycle (the learner keeps up); with replay the
producer emits `1 + replay_proportion` batches per pull on average, the learner one per cycle,
so the queue fills and the producer is held back until the learner has taken `1 +
replay_proportion` batches per sampled one, as RLlib's learner-bound pipeline does.

`MinibatchBuffer(queue, num_passes)` starts the learner's flow instead of `Dequeue` when the
queue holds RLlib's minibatch ring (`minibatch_buffer_size > 1`): RLlib's `LearnerThread`
takes its batches through `MinibatchBuffer(inqueue, size, timeout, num_passes=num_sgd_iter)`,
a ring of `size` train batches, each returned `num_passes` times: every get looks at the
ring's current slot, refills it from the queue when its passes are used up (waiting for
one: not ready while the queue is empty), returns it (one pass used) and moves to the next
slot. With `size = B` and `num_passes = k` the learner trains on batches `0, 1, .., B-1` in
turn `k` times over, then on the next `B` (a slot is refilled on the learner steps `t` with
`floor(t / B) % k == 0`). The ring lives in the queue's state (RLlib's `LearnerThread` holds
both), one pull is one get (one learner step).

Metrics (RLlib's `LearnerThread` stats): `info.learner_queue` holds `size_count`,
`size_mean`, `size_std` and `size_quantiles` (0, 10, 50, 90, 100th percentiles) of the queue
size after each of the last 50 learner pulls (RLlib's `WindowStat("size", 50)`), and jaxplan's
`num_enqueued` and `num_dequeued` (train batches; a cycle whose producer was held back samples
no env steps, which `timesteps_this_iter` shows).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct
from jax.sharding import PartitionSpec as P

from jaxplan.batch import MultiAgentBatch
from jaxplan.devices import AXIS
from jaxplan.flow import Flow, SharedState, Stage, item_shape
from jaxplan.workers import PlanState, WorkerSet

WINDOW = 50
"""RLlib's `learner_queue_size` window (`WindowStat("size", 50)`)."""

QUANTILES = (0.0, 10.0, 50.0, 90.0, 100.0)
"""RLlib's `WindowStat` percentiles."""


@struct.dataclass
class MixedBatches:
    """Several train batches out of one pull (`MixInReplay`): `batches` stacked on a leading
    axis `[n, rows, ...]`, of which the first `count` (int32, 1..n) are emitted."""

    batches: MultiAgentBatch
    count: jax.Array


@struct.dataclass
class MinibatchRing:
    """RLlib's `MinibatchBuffer`: `size` train batches (`{policy_id: {field: [size, rows,
    ...]}}`), the passes left of each (int32 `[size]`, 0: refill on the next visit) and the
    slot the next get looks at (int32)."""

    items: dict[str, dict[str, jax.Array]]
    ttl: jax.Array
    idx: jax.Array


@struct.dataclass
class QueueState:
    """The ring of train batches (`{policy_id: {field: [capacity, rows, ...]}}`), the slot of
    the oldest one and how many are queued (int32); the sizes after the last `WINDOW` learner
    pulls (float32, NaN before them) and where the next goes; the counts of batches enqueued
    and dequeued (int32); the learner's `MinibatchRing` (`{}` with `minibatch_buffer_size`
    1)."""

    items: dict[str, dict[str, jax.Array]]
    head: jax.Array
    size: jax.Array
    sizes: jax.Array
    sizes_next: jax.Array
    num_enqueued: jax.Array
    num_dequeued: jax.Array
    buffer: MinibatchRing | dict


class LearnerQueue(SharedState):
    """A bounded FIFO of `learner_queue_size` train batches as produced by `producer` (the
    flow `Enqueue` ends: its items are `MultiAgentBatch`es or `MixedBatches`; their layout is
    taken from it when the queue is built), and with `minibatch_buffer_size > 1` the
    learner's ring of that many batches (`MinibatchBuffer`). Shared by `Enqueue` and
    `Dequeue` or `MinibatchBuffer` (see the module docstring). On a mesh every device keeps
    its shard of each batch's rows."""

    name = "learner_queue"

    def __init__(
        self,
        workers: WorkerSet,
        producer: Flow,
        *,
        learner_queue_size: int,
        minibatch_buffer_size: int = 1,
    ):
        for key, value in (
            ("learner_queue_size", learner_queue_size),
            ("minibatch_buffer_size", minibatch_buffer_size),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{key} must be an integer >= 1, got {value!r}")
        self.workers = workers
        self.producer = producer
        self.capacity = learner_queue_size
        self.minibatch_buffer_size = minibatch_buffer_size
        item = item_shape(producer, workers)
        if isinstance(item, MixedBatches):
            self.per_pull = jax.tree.leaves(item.batches.policy_batches)[0].shape[0]
            self.template = item.batches.replace(
                policy_batches=jax.tree.map(
                    lambda s: jax.ShapeDtypeStruct(s.shape[1:], s.dtype),
                    item.batches.policy_batches,
                )
            )
        elif isinstance(item, MultiAgentBatch):
            self.per_pull = 1
            self.template = item
        else:
            raise TypeError(
                f"Enqueue takes train batches (MultiAgentBatch or MixedBatches), got "
                f"{type(item).__name__}"
            )
        if self.per_pull > self.capacity:
            raise ValueError(
                f"learner_queue_size ({self.capacity}) must hold the {self.per_pull} train "
                "batches one pull of the producer can emit (1 + ceil(replay_proportion))"
            )

    def init(self, state: PlanState) -> tuple[PlanState, QueueState]:
        shards = self.workers.num_shards  # one device's rows each, side by side

        def ring(s):
            return jnp.zeros((self.capacity, s.shape[0] * shards, *s.shape[1:]), s.dtype)

        items = jax.tree.map(ring, self.template.policy_batches)
        zero = jnp.zeros((), jnp.int32)
        buffer = {}
        if self.minibatch_buffer_size > 1:
            size = self.minibatch_buffer_size
            buffer = MinibatchRing(
                items=jax.tree.map(lambda x: jnp.zeros((size, *x.shape[1:]), x.dtype), items),
                ttl=jnp.zeros((size,), jnp.int32),
                idx=zero,
            )
        return state, QueueState(
            items=items,
            head=zero,
            size=zero,
            sizes=jnp.full((WINDOW,), jnp.nan, jnp.float32),
            sizes_next=zero,
            num_enqueued=zero,
            num_dequeued=zero,
            buffer=buffer,
        )

    def partition_spec(self) -> QueueState:
        rep = P()
        buffer = rep
        if self.minibatch_buffer_size > 1:
            buffer = MinibatchRing(items=P(None, AXIS), ttl=rep, idx=rep)
        return QueueState(
            items=P(None, AXIS),
            head=rep,
            size=rep,
            sizes=rep,
            sizes_next=rep,
            num_enqueued=rep,
            num_dequeued=rep,
            buffer=buffer,
        )

    def metrics(self, state: PlanState, own: QueueState) -> dict:
        sizes = own.sizes
        count = jnp.sum(~jnp.isnan(sizes)).astype(jnp.int32)
        return {
            "info": {
                "learner_queue": {
                    "size_count": count,
                    "size_mean": jnp.nanmean(sizes),
                    "size_std": jnp.nanstd(sizes),
                    "size_quantiles": jnp.nanpercentile(sizes, jnp.asarray(QUANTILES)),
                    "num_enqueued": own.num_enqueued,
                    "num_dequeued": own.num_dequeued,
                }
            }
        }

    # ---- operations -----------------------------------------------------------------------
    def has_room(self, own: QueueState) -> jax.Array:
        """Whether the most one producer pull can emit fits."""
        return own.size + self.per_pull <= self.capacity

    def push(self, own: QueueState, batches: dict, count: jax.Array) -> QueueState:
        """`own` with the first `count` of `batches` (`{pid: {field: [n, rows, ...]}}`) appended;
        those beyond the free slots are dropped (never under `Enqueue`'s backpressure)."""
        n = jax.tree.leaves(batches)[0].shape[0]
        count = jnp.minimum(count, self.capacity - own.size)
        slots = (own.head + own.size + jnp.arange(n)) % self.capacity
        slots = jnp.where(jnp.arange(n) < count, slots, self.capacity)  # out of range: dropped
        items = jax.tree.map(
            lambda ring, new: ring.at[slots].set(new.astype(ring.dtype), mode="drop"),
            own.items,
            batches,
        )
        return own.replace(
            items=items, size=own.size + count, num_enqueued=own.num_enqueued + count
        )

    def pop(self, own: QueueState, *, take: jax.Array | bool = True) -> tuple[QueueState, dict]:
        """The oldest batch's rows (`{pid: {field: [rows, ...]}}`) and `own` without it (the
        caller checked it is not empty); with `take` False (traced) `own` as it is. The size
        after it goes into the window (RLlib records it after every learner step)."""
        rows = jax.tree.map(lambda ring: ring[own.head], own.items)
        take = jnp.asarray(take)
        size = own.size - take.astype(jnp.int32)
        own = own.replace(
            head=jnp.where(take, (own.head + 1) % self.capacity, own.head),
            size=size,
            sizes=own.sizes.at[own.sizes_next].set(size.astype(jnp.float32)),
            sizes_next=(own.sizes_next + 1) % WINDOW,
            num_dequeued=own.num_dequeued + take.astype(jnp.int32),
        )
        return own, rows


class Enqueue(Stage):
    """`MultiAgentBatch | MixedBatches -> same`: RLlib's `Enqueue(queue)`; pushes the item's
    train batches onto `queue`. Its `ready` is the backpressure: the flow it ends is pulled
    only when the queue has room for the most that flow's item can hold (see
    `Flow.for_each`)."""

    def __init__(self, queue: LearnerQueue):
        self.shares = queue

    def ready(self, state: PlanState, own: QueueState) -> jax.Array:
        return self.shares.has_room(own)

    def apply(self, state: PlanState, own: QueueState, item: Any):
        if isinstance(item, MixedBatches):
            own = self.shares.push(own, item.batches.policy_batches, item.count)
        else:
            stacked = jax.tree.map(lambda x: x[None], item.policy_batches)
            own = self.shares.push(own, stacked, jnp.int32(1))
        return state, own, item


class DequeueStage(Stage):
    """The source behind `Dequeue`: each pull takes the oldest train batch; ready while the
    queue holds one."""

    def __init__(self, queue: LearnerQueue):
        self.shares = queue

    def ready(self, state: PlanState, own: QueueState) -> jax.Array:
        return own.size > 0

    def apply(self, state: PlanState, own: QueueState, item: Any = None):
        own, rows = self.shares.pop(own)
        return state, own, self.shares.template.replace(policy_batches=rows)


def Dequeue(queue: LearnerQueue) -> Flow:  # noqa: N802 - RLlib's name
    """A flow of the train batches `queue` holds, oldest first (RLlib's `Dequeue`)."""
    return Flow.source(DequeueStage(queue))


class MinibatchBufferStage(Stage):
    """The source behind `MinibatchBuffer`: each pull is one get from the queue's ring (see
    the module docstring); ready unless the current slot needs a refill and the queue is
    empty."""

    def __init__(self, queue: LearnerQueue, num_passes: int):
        if isinstance(num_passes, bool) or not isinstance(num_passes, int) or num_passes < 1:
            raise ValueError(f"num_passes must be an integer >= 1, got {num_passes!r}")
        if queue.minibatch_buffer_size < 2:
            raise ValueError(
                "MinibatchBuffer needs a LearnerQueue built with minibatch_buffer_size > 1 "
                "(with 1, Dequeue and num_sgd_iter passes over each batch are the same)"
            )
        self.shares = queue
        self.num_passes = num_passes

    def ready(self, state: PlanState, own: QueueState) -> jax.Array:
        ring = own.buffer
        return (ring.ttl[ring.idx] > 0) | (own.size > 0)

    def apply(self, state: PlanState, own: QueueState, item: Any = None):
        ring, size = own.buffer, self.shares.minibatch_buffer_size
        refill = ring.ttl[ring.idx] <= 0
        own, rows = self.shares.pop(own, take=refill)
        items = jax.tree.map(
            lambda r, new: r.at[ring.idx].set(jnp.where(refill, new.astype(r.dtype), r[ring.idx])),
            ring.items,
            rows,
        )
        ttl = jnp.where(refill, self.num_passes, ring.ttl[ring.idx]) - 1
        batch = jax.tree.map(lambda r: r[ring.idx], items)
        ring = MinibatchRing(
            items=items, ttl=ring.ttl.at[ring.idx].set(ttl), idx=(ring.idx + 1) % size
        )
        own = own.replace(buffer=ring)
        return state, own, self.shares.template.replace(policy_batches=batch)


def MinibatchBuffer(queue: LearnerQueue, *, num_passes: int) -> Flow:  # noqa: N802 - RLlib's name
    """A flow of the train batches of `queue`'s minibatch ring (RLlib's `MinibatchBuffer` with
    `size = queue.minibatch_buffer_size`): each batch `num_passes` times, `size` of them in
    turn (see the module docstring)."""
    return Flow.source(MinibatchBufferStage(queue, num_passes))
