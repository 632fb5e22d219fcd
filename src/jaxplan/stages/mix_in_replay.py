"""MixInReplay: RLlib's operator that adds replayed experience to a stream of batches
(`rllib/execution/replay_ops.py`, used by IMPALA and APPO with `replay_proportion`).

RLlib keeps the last `num_slots` batches (a `SimpleReplayBuffer`: a ring filled in order, the
oldest overwritten) and returns, for each input batch, a list of that batch followed by `k`
batches drawn uniformly (with replacement) from the buffer, the input batch just added
included. Its loop `f = replay_proportion; while random() < f: f -= 1; replay()` makes
`k = floor(p) + Bernoulli(p - floor(p))`: `p` replays per input batch on average, at most
`ceil(p)`.

jaxplan draws the same `k` and the same uniform slots with the plan's key (deterministic for a
seed), and emits a static shape: `MixedBatches` of `1 + ceil(p)` batches (the input, then
`ceil(p)` draws) of which the first `1 + k` count (`Enqueue` pushes those). Two choices differ
from RLlib in form, not in expectation:

- The ring holds whole train batches: jaxplan's `MixInReplay` follows `ConcatBatches`, where
  RLlib's precedes it and mixes rollout fragments into the stream that `ConcatBatches` cuts.
  With the static shapes of a compiled plan a train batch cannot hold a random number of new
  fragments; mixing whole train batches keeps each one a fixed shape and the learner queue
  absorbs the random count. The expected share of replayed data is the same, `p / (1 + p)`
  of the batches the learner takes; with a train batch of one rollout round (the CartPole
  presets) the two are the same operator. `replay_buffer_num_slots` counts train batches.
- The replayed rows keep the fields they were stored with (the acting policy's log-probs
  among them); IMPALA/APPO recompute V-trace on the learner side when replay is on
  (`LearnerPostprocessing`), as RLlib computes it in the loss.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import struct
from jax.sharding import PartitionSpec as P

from jaxplan.batch import MultiAgentBatch
from jaxplan.devices import AXIS
from jaxplan.flow import Flow, Stage, item_shape
from jaxplan.stages.learner_queue import MixedBatches
from jaxplan.workers import PlanState, WorkerSet


@struct.dataclass
class MixInReplayState:
    """The ring of batches (`{policy_id: {field: [num_slots, rows, ...]}}`), the slot the
    next batch goes to and how many slots are filled (int32), and the batches added and
    replayed so far (int32)."""

    slots: dict[str, dict[str, jax.Array]]
    next_index: jax.Array
    size: jax.Array
    num_added: jax.Array
    num_replayed: jax.Array


def replay_count(key: jax.Array, replay_proportion: float) -> jax.Array:
    """int32 `k`: RLlib's `f = p; while random() < f: f -= 1; k += 1`, i.e. `floor(p)` plus
    one more with probability `p - floor(p)`."""
    whole = math.floor(replay_proportion)
    extra = jax.random.uniform(key) < (replay_proportion - whole)
    return jnp.int32(whole) + extra.astype(jnp.int32)


class MixInReplay(Stage):
    """`MultiAgentBatch -> MixedBatches`: RLlib's `MixInReplay(num_slots, replay_proportion)`
    on the train batches of `upstream` (the flow this stage is appended to; their layout is
    taken from it). See the module docstring. On a mesh each device keeps its shard."""

    def __init__(
        self,
        workers: WorkerSet,
        upstream: Flow,
        *,
        num_slots: int,
        replay_proportion: float,
    ):
        if replay_proportion < 0 or not math.isfinite(replay_proportion):
            raise ValueError(f"replay_proportion must be >= 0, got {replay_proportion!r}")
        if replay_proportion > 0 and num_slots < 1:
            raise ValueError("You must set num_slots > 0 if replay_proportion > 0.")  # RLlib's
        self.workers = workers
        self.num_slots = max(int(num_slots), 1)
        self.replay_proportion = float(replay_proportion)
        self.max_replays = math.ceil(self.replay_proportion)
        batch = item_shape(upstream, workers)
        if not isinstance(batch, MultiAgentBatch):
            raise TypeError(f"MixInReplay takes train batches, got {type(batch).__name__}")
        self.template = batch

    def init(self, state: PlanState) -> tuple[PlanState, MixInReplayState]:
        shards = self.workers.num_shards  # one device's rows each, side by side

        def ring(s):
            return jnp.zeros((self.num_slots, s.shape[0] * shards, *s.shape[1:]), s.dtype)

        zero = jnp.zeros((), jnp.int32)
        slots = jax.tree.map(ring, self.template.policy_batches)
        return state, MixInReplayState(slots, zero, zero, zero, zero)

    def partition_spec(self) -> MixInReplayState:
        rep = P()
        return MixInReplayState(P(None, AXIS), rep, rep, rep, rep)

    def metrics(self, state: PlanState, own: MixInReplayState) -> dict:
        return {
            "info": {
                "mix_in_replay": {
                    "num_added": own.num_added,
                    "num_replayed": own.num_replayed,
                    "size": own.size,
                }
            }
        }

    def apply(self, state: PlanState, own: MixInReplayState, batch: MultiAgentBatch):
        # add first: the batch itself may be replayed (RLlib's order)
        slots = jax.tree.map(
            lambda ring, new: ring.at[own.next_index].set(new.astype(ring.dtype)),
            own.slots,
            batch.policy_batches,
        )
        size = jnp.minimum(own.size + 1, self.num_slots)
        # the same key on every device, so the draws agree across shards
        key, k_count, k_slots = jax.random.split(state.key, 3)
        count = replay_count(k_count, self.replay_proportion)
        picks = jax.random.randint(k_slots, (self.max_replays,), 0, size)
        stacked = jax.tree.map(
            lambda new, ring: jnp.concatenate([new[None].astype(ring.dtype), ring[picks]]),
            batch.policy_batches,
            slots,
        )
        own = MixInReplayState(
            slots=slots,
            next_index=(own.next_index + 1) % self.num_slots,
            size=size,
            num_added=own.num_added + 1,
            num_replayed=own.num_replayed + count,
        )
        out = MixedBatches(batches=batch.replace(policy_batches=stacked), count=1 + count)
        return state.replace(key=key), own, out
