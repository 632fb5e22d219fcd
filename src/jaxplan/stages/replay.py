"""RLlib's replay operators: a `LocalReplayBuffer` shared by `StoreToReplayBuffer` (writes
every rollout batch into it) and `Replay` (a flow source sampling train batches from it).

The buffer is a `jaxplan.flow.SharedState`: one entry of `PlanState.stages` that both stages
read and write, so a checkpoint holds it like any stage state. Per policy it is a ring of
`capacity` rows (RLlib's `buffer_size`) of every field of the rollout batches (after the
policy's postprocessing, e.g. DQN's n-step rewards), written in batch order; `Replay` samples
`replay_batch_size` rows uniformly, with replacement, from the filled slots only, and is
ready once `learning_starts` env steps were added (RLlib's `replay_starts`).

With `prioritized_replay` (RLlib's `PrioritizedReplayBuffer`, proportional variant) the state
also holds each slot's priority `p_i` (float32 `[capacity]` per policy, next to the rows) and
the largest priority seen so far (1.0 at the start); a new row gets that largest priority.
`Replay` then samples slot `i` with probability `P(i) = p_i^alpha / sum_k p_k^alpha` over the
filled slots, and puts RLlib's importance weights `w_i = (N P(i))^-beta / (N min_k P(k))^-beta`
(`N` filled slots, so the largest possible weight is 1) in the batch's `weights`, with `beta`
linear in the env steps sampled (RLlib's `PiecewiseSchedule`). `UpdatePriorities` sets
`p_i = |td_error_i| + prioritized_replay_eps` at the replayed `batch_indexes`.

The sampler is an inverse-CDF over a cumulative sum of `p^alpha` (one `cumsum` over the ring
and one `searchsorted` per train batch), not a sum tree: O(capacity) per batch, but a single
fused, static-shape pass on device that is exact in the same sense as a tree (float32 sums;
fine for capacities up to ~1e5-1e6) and keeps no second structure in sync with the ring.

On a mesh of `N` devices the ring is sharded over the devices: each holds
`capacity / N` slots and writes only the rows its own actor groups sampled, so no rollout row
crosses devices. The ring's slots keep their one-device numbering (`batch_indexes`): with
`capacity` a multiple of the rows of one rollout round, global slot `s` is written by the
same add and row as on one device, and lives on the device whose groups sampled that row
(`LocalReplayBuffer.locate`). `Replay` draws the same global slots as one device from the
replicated key, every device reads the ones it holds, one all-gather assembles the train
batch, the same on every device (the data-parallel learner differentiates its `1/N` of it):
the batch one device would replay, bit for bit. Prioritized replay's priorities (one float
per slot) stay replicated in the one-device numbering: every device samples the same slots
and applies the same updates (the learner gathers the per-row TD errors of all devices).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct
from jax.sharding import PartitionSpec as P

from jaxplan import devices
from jaxplan.batch import LearnerInfo, MultiAgentBatch, TrainOutput, batch_rows
from jaxplan.counters import Counter
from jaxplan.flow import Flow, SharedState, Stage
from jaxplan.stages.apply_schedules import piecewise_linear
from jaxplan.workers import PlanState, WorkerSet

BATCH_INDEXES = "batch_indexes"
"""The replayed rows' slots in the buffer (RLlib's field; prioritized replay updates them)."""

PRIO_WEIGHTS = "weights"
"""Prioritized replay's importance weights of the replayed rows (RLlib's field)."""

TD_ERROR = "td_error"
"""`learner_info[pid]` entry with the per-row TD errors `UpdatePriorities` reads (RLlib's)."""


@struct.dataclass
class ReplayState:
    """Per policy the ring `storage` (`{field: [capacity, ...]}`), the slot the next row goes
    to and how many slots are filled (int32); `num_added`: env steps added (all policies).
    Prioritized replay only (empty dicts otherwise): per policy the slots' priorities `p_i`
    (float32 `[capacity]`) and the largest priority seen so far (float32, 1.0 at first)."""

    storage: dict[str, dict[str, jax.Array]]
    next_index: dict[str, jax.Array]
    size: dict[str, jax.Array]
    num_added: Counter
    priorities: dict[str, jax.Array] = struct.field(default_factory=dict)
    max_priority: dict[str, jax.Array] = struct.field(default_factory=dict)


class LocalReplayBuffer(SharedState):
    """RLlib's `LocalReplayBuffer(num_shards=1, learning_starts, capacity, replay_batch_size,
    prioritized_replay_alpha, prioritized_replay_beta, prioritized_replay_eps)` over the rows
    of `workers`' bulk_sync rollout batches (the row layout is taken from them at `init`).
    `prioritized_replay=False` samples uniformly (the alpha/beta/eps keys are then unused);
    beta goes linearly from `prioritized_replay_beta` to `final_prioritized_replay_beta` over
    the first `prioritized_replay_beta_annealing_timesteps` env steps sampled (constant
    without a final value). On a mesh the ring is sharded over the devices (see the module
    docstring): `capacity` a multiple of one rollout round's rows and `replay_batch_size` a
    multiple of the device count, each checked with a `ValueError`."""

    name = "local_replay_buffer"

    def __init__(
        self,
        workers: WorkerSet,
        *,
        capacity: int,
        replay_batch_size: int,
        learning_starts: int = 0,
        prioritized_replay: bool = False,
        prioritized_replay_alpha: float = 0.6,
        prioritized_replay_beta: float = 0.4,
        final_prioritized_replay_beta: float | None = None,
        prioritized_replay_beta_annealing_timesteps: int = 0,
        prioritized_replay_eps: float = 1e-6,
    ):
        for key, value, low in (
            ("capacity", capacity, 1),
            ("replay_batch_size", replay_batch_size, 1),
            ("learning_starts", learning_starts, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(
                    f"LocalReplayBuffer {key} must be an integer >= {low}, got {value!r}"
                )
        n = 1 if workers.mesh is None else workers.mesh.size
        if replay_batch_size % n:
            raise ValueError(
                f"replay_batch_size (train_batch_size: {replay_batch_size}) does not split "
                f"evenly across {n} devices; use a multiple of {n}"
            )
        self.round_rows = {}  # on a mesh: per policy, the rows of one rollout round
        for pid in workers.policies if n > 1 else ():
            rows = workers.round_env_steps * workers.rows_per_env_step(pid)
            self.round_rows[pid] = rows
            if capacity % rows:
                raise ValueError(
                    f"buffer_size ({capacity}) must be a multiple of one rollout round's rows "
                    f"of policy {pid!r} ({rows}) to be sharded over {n} devices; e.g. "
                    f"{max(capacity // rows, 1) * rows}"
                )
        self.workers = workers
        self.capacity = capacity
        self.replay_batch_size = replay_batch_size
        self.learning_starts = learning_starts
        self.prioritized_replay = bool(prioritized_replay)
        self.axis = None if workers.mesh is None else devices.AXIS
        self.num_shards = n
        self.time_steps = 1  # of one rollout round's rows (`init` sets it)
        if prioritized_replay:
            if prioritized_replay_alpha < 0 or prioritized_replay_eps <= 0:
                raise ValueError(
                    f"prioritized replay needs alpha >= 0 and eps > 0, got alpha "
                    f"{prioritized_replay_alpha!r}, eps {prioritized_replay_eps!r}"
                )
            if prioritized_replay_beta_annealing_timesteps < 0:
                raise ValueError("prioritized_replay_beta_annealing_timesteps must be >= 0")
        self.alpha = float(prioritized_replay_alpha)
        self.eps = float(prioritized_replay_eps)
        final = final_prioritized_replay_beta
        final = prioritized_replay_beta if final is None else final
        self.beta_points = (
            (0.0, float(prioritized_replay_beta)),
            (float(prioritized_replay_beta_annealing_timesteps), float(final)),
        )

    def init(self, state: PlanState) -> tuple[PlanState, ReplayState]:
        from jaxplan.stages.rollouts import Rollouts

        rollouts = Rollouts(self.workers)

        meta = {}

        def one_round(s):  # one rollout round's rows (this device's on a mesh)
            batch = rollouts.apply(s.replace(stages={}), None, None)[2]
            meta["time_steps"] = batch.time_steps  # static: how device shards interleave
            return batch.policy_batches

        if self.axis is not None:  # every device's rows, concatenated: the global round
            one_round = jax.shard_map(
                one_round,
                mesh=self.workers.mesh,
                in_specs=(self.workers.state_specs(),),
                out_specs=P(self.axis),
            )
        shapes = jax.eval_shape(one_round, state.replace(stages={}))
        self.time_steps = meta["time_steps"]
        storage = {}
        for pid, rows in shapes.items():
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
        priorities, max_priority = {}, {}
        if self.prioritized_replay:
            priorities = {pid: jnp.zeros(self.capacity, jnp.float32) for pid in storage}
            max_priority = {pid: jnp.float32(1.0) for pid in storage}
        return state, ReplayState(storage, zero, zero, Counter.zero(), priorities, max_priority)

    def partition_spec(self) -> ReplayState:
        """The ring's slots sharded over the mesh's devices; the rest replicated."""
        rep = P()
        storage = rep if self.axis is None else P(self.axis)
        return ReplayState(storage, rep, rep, rep, rep, rep)

    def locate(self, pid: str, slots: jax.Array) -> tuple[jax.Array, jax.Array]:
        """The device that holds each global slot of policy `pid`'s ring and the slot in its
        shard (`[B]` int32 each; device 0 and `slots` on one device). Global slot `s` is row
        `r = s % n` of the `s // n`-th round in the ring (`n` rows per round); the round's rows
        are `time_steps` blocks of every device's rows in device order (`devices.gather_rows`)."""
        if self.axis is None:
            return jnp.zeros_like(slots), slots
        n = self.round_rows[pid]
        local_rows, block = n // self.num_shards, n // self.time_steps
        local_block = block // self.num_shards
        ring_round, row = jnp.divmod(slots, n)
        t, within = jnp.divmod(row, block)
        device, offset = jnp.divmod(within, local_block)
        return device, ring_round * local_rows + t * local_block + offset

    def metrics(self, state: PlanState, own: ReplayState) -> dict:
        return {"info": {"replay_buffer": {"num_added": own.num_added, "size": dict(own.size)}}}

    def add(self, own: ReplayState, batch: MultiAgentBatch) -> ReplayState:
        """`own` with every row of `batch` written at the ring's next slots (on a mesh each
        device writes its own rows to its shard)."""
        storage, next_index, size = dict(own.storage), dict(own.next_index), dict(own.size)
        priorities = dict(own.priorities)
        for pid, rows in batch.policy_batches.items():
            n = batch_rows(rows) * self.num_shards  # the round's rows, all devices
            local_rows = batch_rows(rows)
            ring_slots = (next_index[pid] + jnp.arange(n)) % self.capacity  # one-device slots
            slots = ring_slots
            if self.axis is not None:  # this device's rows, at its shard's next slots
                first = next_index[pid] // n * local_rows  # (see `locate`)
                slots = (first + jnp.arange(local_rows)) % (self.capacity // self.num_shards)
            storage[pid] = {
                k: buf.at[slots].set(rows[k].astype(buf.dtype)) for k, buf in storage[pid].items()
            }
            next_index[pid] = (next_index[pid] + n) % self.capacity
            size[pid] = jnp.minimum(size[pid] + n, self.capacity)
            if pid in priorities:  # new rows: the largest priority so far (RLlib's)
                priorities[pid] = priorities[pid].at[ring_slots].set(own.max_priority[pid])
        return own.replace(
            storage=storage,
            next_index=next_index,
            size=size,
            num_added=own.num_added.add(batch.env_steps),
            priorities=priorities,
        )

    def beta(self, timestep: jax.Array) -> jax.Array:
        """Importance-sampling exponent after `timestep` env steps sampled (float32)."""
        return piecewise_linear(jnp.asarray(self.beta_points, jnp.float32), timestep)

    def probabilities(self, own: ReplayState, pid: str) -> jax.Array:
        """`[capacity]` float32: `P(i) = p_i^alpha / sum_k p_k^alpha` over the filled slots
        of policy `pid` (0 elsewhere; all 0 while empty). Prioritized replay only."""
        mass = self._mass(own, pid)
        return mass / jnp.maximum(jnp.sum(mass), jnp.finfo(jnp.float32).tiny)

    def _mass(self, own: ReplayState, pid: str) -> jax.Array:
        filled = jnp.arange(self.capacity) < own.size[pid]  # the ring fills slots 0.. first
        return jnp.where(filled, own.priorities[pid] ** self.alpha, 0.0)

    def sample(
        self, own: ReplayState, key: jax.Array, timestep: jax.Array | float = 0.0
    ) -> MultiAgentBatch:
        """`replay_batch_size` rows per policy from its filled slots (with replacement), with
        their slots in `batch_indexes` (on a mesh the same batch on every device): uniformly,
        or with prioritized replay by `P(i)` and with the importance weights at
        beta(`timestep`, env steps sampled) in `weights`."""
        batches = {}
        keys = jax.random.split(key, len(own.storage))
        for (pid, storage), k in zip(own.storage.items(), keys, strict=True):
            high = jnp.maximum(own.size[pid], 1)
            if self.prioritized_replay:
                slots, weights = self._sample_prioritized(own, pid, k, timestep)
            else:
                slots = jax.random.randint(k, (self.replay_batch_size,), 0, high)
            device, local = self.locate(pid, slots)
            rows = {f: buf[local] for f, buf in storage.items()}
            if self.axis is not None:  # each device's reads, gathered; the holder's kept
                every = devices.gather(jax.tree.map(lambda x: x[None], rows), self.axis)
                rows = jax.tree.map(
                    lambda x, d=device: x[d, jnp.arange(self.replay_batch_size)], every
                )
            rows[BATCH_INDEXES] = slots
            if self.prioritized_replay:
                rows[PRIO_WEIGHTS] = weights
            batches[pid] = rows
        return MultiAgentBatch(batches, env_steps=self.replay_batch_size)

    def _sample_prioritized(self, own, pid, key, timestep):
        """Inverse CDF: `u ~ U[0, total)`, the first slot whose cumulative mass exceeds `u`
        (slots without mass are never picked); RLlib's weights normalised by the largest
        possible weight, that of the least likely filled slot."""
        mass = self._mass(own, pid)
        cumulative = jnp.cumsum(mass)
        total = cumulative[-1]
        u = jax.random.uniform(key, (self.replay_batch_size,)) * total
        last = jnp.maximum(own.size[pid], 1) - 1
        slots = jnp.minimum(jnp.searchsorted(cumulative, u, side="right"), last)
        slots = slots.astype(jnp.int32)
        total = jnp.maximum(total, jnp.finfo(jnp.float32).tiny)  # empty: never used
        n = jnp.maximum(own.size[pid], 1).astype(jnp.float32)
        min_mass = jnp.min(jnp.where(mass > 0, mass, jnp.inf))
        min_mass = jnp.where(jnp.isfinite(min_mass), min_mass, total)
        beta = self.beta(jnp.asarray(timestep, jnp.float32))
        max_weight = (min_mass / total * n) ** -beta
        weights = (mass[slots] / total * n) ** -beta / max_weight
        return slots, weights

    def update_priorities(
        self, own: ReplayState, pid: str, slots: jax.Array, td_errors: jax.Array
    ) -> ReplayState:
        """`p_i = |td_error_i| + eps` at `slots` (`[B]`); a slot replayed twice takes the
        later row's (RLlib's loop: last write wins); a non-finite TD error leaves its slot's
        priority as it was. The largest priority seen is updated (RLlib's `_max_priority`)."""
        new = jnp.abs(td_errors).astype(jnp.float32) + self.eps
        ok = jnp.isfinite(new)
        b = slots.shape[0]
        later = jnp.arange(b)[None, :] > jnp.arange(b)[:, None]  # later[j, k]: k after j
        dup_later = jnp.any(later & (slots[None, :] == slots[:, None]) & ok[None, :], axis=1)
        write = ok & ~dup_later
        target = jnp.where(write, slots, self.capacity)  # out of bounds: dropped
        priorities = dict(own.priorities)
        priorities[pid] = priorities[pid].at[target].set(new, mode="drop")
        max_priority = dict(own.max_priority)
        max_priority[pid] = jnp.maximum(
            max_priority[pid], jnp.max(jnp.where(ok, new, 0.0), initial=0.0)
        )
        return own.replace(priorities=priorities, max_priority=max_priority)

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
        timestep = state.counters.num_steps_sampled.to_float()
        return state.replace(key=key), own, self.shares.sample(own, k_sample, timestep)


def Replay(*, local_buffer: LocalReplayBuffer) -> Flow:  # noqa: N802 - RLlib's name
    """A flow of train batches replayed from `local_buffer`, ready once it holds
    `learning_starts` env steps (RLlib's `Replay(local_buffer=...)`)."""
    return Flow.source(ReplayStage(local_buffer))


class UpdatePriorities(Stage):
    """`TrainOutput -> TrainOutput`: RLlib DQN's `update_prio`; per policy with a
    `learner_info[pid]["td_error"]` (`[B]`, the replayed rows' order) sets the priorities of
    `local_buffer` at the batch's `batch_indexes` to `|td_error| + prioritized_replay_eps`
    (`LocalReplayBuffer.update_priorities`). The per-row TD errors are then dropped from the
    learner info, so the reported results hold scalars only."""

    def __init__(self, *, local_buffer: LocalReplayBuffer):
        if not local_buffer.prioritized_replay:
            raise ValueError("UpdatePriorities needs a LocalReplayBuffer(prioritized_replay=True)")
        self.shares = local_buffer

    def apply(self, state: PlanState, own: ReplayState, item: TrainOutput):
        batch, learner_info = item
        info = dict(learner_info)
        for pid, pinfo in learner_info.items():
            if TD_ERROR not in pinfo:
                continue
            slots = batch.policy_batches[pid][BATCH_INDEXES]
            own = self.shares.update_priorities(own, pid, slots, pinfo[TD_ERROR])
            info[pid] = {k: v for k, v in pinfo.items() if k != TD_ERROR}
        return state, own, TrainOutput(batch, LearnerInfo(info))
