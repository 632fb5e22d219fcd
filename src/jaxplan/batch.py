"""Sample batches: dicts of arrays with one leading row axis, grouped per policy.

Field names follow RLlib's `SampleBatch`. A batch that flows through a plan is always a
`MultiAgentBatch` (a single-agent env has one policy, `DEFAULT_POLICY_ID`), so every stage
handles one shape of data. Training stages emit a `TrainOutput` (batch and `LearnerInfo`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import jax
from flax import struct

DEFAULT_POLICY_ID = "default_policy"

OBS = "obs"
NEXT_OBS = "new_obs"
ACTIONS = "actions"
REWARDS = "rewards"
TERMINATEDS = "terminateds"
TRUNCATEDS = "truncateds"
ACTION_LOGP = "action_logp"
ACTION_DIST_INPUTS = "action_dist_inputs"
VF_PREDS = "vf_preds"
ADVANTAGES = "advantages"
VALUE_TARGETS = "value_targets"
POLICY_VERSION = "policy_version"  # int32: version of the params that acted (policy lag)
# recurrent policies (`model.use_lstm`): the state a row's step started from, RLlib's names
PREV_ACTIONS = "prev_actions"  # the previous step's action (zero at an episode's first step)
PREV_REWARDS = "prev_rewards"  # the previous step's (clipped) reward (zero at the first step)


def state_in(i: int) -> str:
    """RLlib's `state_in_{i}`: the recurrent state's `i`-th array before a step (LSTM: 0 is
    `h`, 1 is `c`; GRU: 0 is `h`)."""
    return f"state_in_{i}"


def state_out(i: int) -> str:
    """RLlib's `state_out_{i}`: the recurrent state's `i`-th array after a step."""
    return f"state_out_{i}"


SampleBatch = dict[str, jax.Array]
"""Field name -> array `[rows, ...]`; all fields have the same number of rows."""


def batch_rows(batch: SampleBatch) -> int:
    """Number of rows (static)."""
    return next(iter(batch.values())).shape[0]


@struct.dataclass
class MultiAgentBatch:
    """Per-policy sample batches plus the number of env steps they came from (static).

    `env_steps` is what RLlib counts as `env_steps()`: several agents acting in one env step
    count once; `agent_steps()` is the total number of rows over all policies.

    Inside a multi-device plan (`shard_map`) the rows are split across the mesh axis
    `shard_axis` into `num_shards` equal shards: each device's `policy_batches` hold its own
    shard, while `env_steps` and `agent_steps()` count the whole (global) batch.

    `time_steps` (static) says how the shards interleave: each shard's rows are `time_steps`
    equal blocks of consecutive rows, one per time step (rollouts: rows `[T, groups, envs,
    agents]` of the device's own actor groups, flattened; concatenated rounds add their steps).
    The whole batch is block 0 of every shard in device order, then block 1, ...
    (`devices.gather_rows`): time-major, the rows of the same rollouts on one device. `1` (the
    default) means the shards are contiguous parts of the whole batch.
    """

    policy_batches: dict[str, SampleBatch]
    env_steps: int = struct.field(pytree_node=False)
    shard_axis: str | None = struct.field(pytree_node=False, default=None)
    num_shards: int = struct.field(pytree_node=False, default=1)
    time_steps: int = struct.field(pytree_node=False, default=1)

    def agent_steps(self) -> int:
        return self.num_shards * sum(batch_rows(b) for b in self.policy_batches.values())


@struct.dataclass
class LearnerInfo(Mapping):
    """RLlib's learner info: `{policy_id: {"learner_stats": {name: scalar}, ...}}` for the
    policies trained in one step (a read-only mapping over `policies`)."""

    policies: dict[str, dict[str, Any]]

    def __getitem__(self, policy_id: str) -> dict[str, Any]:
        return self.policies[policy_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self.policies)

    def __len__(self) -> int:
        return len(self.policies)


@struct.dataclass
class TrainOutput:
    """TrainOneStep's item, RLlib's `(batch, learner_info)`: `t[1]` and `batch, info = t` work
    as on RLlib's tuple."""

    batch: MultiAgentBatch
    learner_info: LearnerInfo

    def __getitem__(self, index: int):
        return (self.batch, self.learner_info)[index]

    def __iter__(self):
        return iter((self.batch, self.learner_info))
