"""The policy contract that plan stages rely on, and the per-policy state they update.

A policy object is static (networks, distribution, fixed options); everything that changes
or may be `vmap`ped over lives in `PolicyState`.
"""

from __future__ import annotations

from typing import Any, Protocol

import jax
from flax import struct

from jaxplan.batch import SampleBatch


@struct.dataclass
class PolicyState:
    """Params, optimizer state, traced hyper-parameters, the adaptive KL coefficient and the
    params' version (int32: how many train steps have updated them; async rollouts measure
    policy lag with it)."""

    params: Any
    opt_state: Any
    hparams: Any
    kl_coeff: jax.Array
    version: jax.Array


class Policy(Protocol):
    """What ParallelRollouts and TrainOneStep need from a policy."""

    def init(self, key: jax.Array, hparams: Any) -> PolicyState:
        """Fresh params and optimizer state."""

    def compute_actions(
        self, params: Any, obs: jax.Array, key: jax.Array, *, explore: bool = True
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """`obs [*B, *obs_shape] -> (actions [*B, ...], extras)`; extras hold the fields a loss
        needs later (`action_logp [*B]`, `action_dist_inputs [*B, D]`). `explore=False`
        (RLlib's evaluation setting, static) asks for the deterministic action (the
        distribution's mode); rollouts always explore and may leave the argument out.

        A recurrent policy also has `initial_state(batch_shape) -> {field: [*batch_shape,
        ...]}` (an optional method; `{}` or absent: feed-forward). Its agents' state then lives
        in `ActorState.policy_states` (zeroed after every episode end), `compute_actions` gets
        it as `state=` and returns the state after the step as `state_out_i` extras (the
        `state_in_i` fields, plus `prev_actions` / `prev_rewards` if it has them, are the
        rows' record of what each step started from: see `jaxplan.recurrent`); its learner
        reads sequences, and the policy's `max_seq_len` tells `TrainOneStep` their length."""

    def postprocess_trajectory(self, params: Any, hparams: Any, traj: SampleBatch) -> SampleBatch:
        """Adds `vf_preds`, `advantages`, `value_targets` to a time-major trajectory `[T, *B]`."""

    def loss(
        self,
        params: Any,
        hparams: Any,
        kl_coeff: jax.Array,
        batch: SampleBatch,
        axis_name: str | None = None,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """Scalar loss on a minibatch and its learner statistics (scalars).

        Data-parallel SGD passes `axis_name` when `batch` is this device's shard of the
        minibatch (the trainer averages loss gradients and statistics across the axis; a
        statistic that is not a mean of rows should reduce over the axis itself). A policy
        used on one device only may leave the argument out. A policy whose class sets
        `loss_takes_key = True` also gets `key=` (a PRNG key per minibatch) for a loss that
        samples (SAC)."""

    def apply_gradients(self, state: PolicyState, grads: Any) -> PolicyState:
        """One optimizer step."""


def acting_params(policy: Policy, state: PolicyState, timestep: jax.Array) -> Any:
    """The params rollouts act with when `timestep` env steps have been sampled (f32): the
    policy's `acting_params(state, timestep)` if it has one (an optional hook: DQN adds its
    epsilon-greedy exploration's epsilon, RLlib's `timestep` argument of
    `compute_actions`), else `state.params`."""
    hook = getattr(policy, "acting_params", None)
    return state.params if hook is None else hook(state, timestep)
