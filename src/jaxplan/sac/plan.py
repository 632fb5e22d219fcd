"""SAC's execution plan: RLlib 1.x's SAC trainer reuses DQN's (`GenericOffPolicyTrainer`),
line for line as `rllib/agents/dqn/dqn.py` writes it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxplan import trainer
from jaxplan.algorithms import Algorithm
from jaxplan.flow import Plan
from jaxplan.sac.config import PRESETS, SACConfig, calculate_rr_weights, cycles_per_iteration
from jaxplan.sac.policy import SACPolicy
from jaxplan.stages import ParallelRollouts, TrainOneStep
from jaxplan.stages.concurrently import Concurrently
from jaxplan.stages.replay import (
    LocalReplayBuffer,
    Replay,
    StoreToReplayBuffer,
    UpdatePriorities,
)
from jaxplan.stages.update_target_network import UpdateTargetNetwork
from jaxplan.workers import WorkerSet


def execution_plan(workers: WorkerSet, config: SACConfig) -> Plan:
    """SAC (DQN's plan): store every rollout round in the replay buffer; in turn, replay a
    train batch, take one actor, critic and alpha step on it, (prioritized replay) set the
    replayed rows' priorities from their TD errors and move the target Q networks `tau` of
    the way to the online ones (after every train step with `target_network_update_freq`
    0). One iteration is `cycles_per_iteration` round-robin cycles (>=
    `timesteps_per_iteration` env steps)."""
    local_replay_buffer = LocalReplayBuffer(
        workers,
        capacity=config.buffer_size,
        replay_batch_size=config.train_batch_size,
        learning_starts=config.learning_starts,
        prioritized_replay=config.prioritized_replay,
        prioritized_replay_alpha=config.prioritized_replay_alpha,
        prioritized_replay_beta=config.prioritized_replay_beta,
        final_prioritized_replay_beta=config.final_prioritized_replay_beta,
        prioritized_replay_beta_annealing_timesteps=(
            config.prioritized_replay_beta_annealing_timesteps
        ),
        prioritized_replay_eps=config.prioritized_replay_eps,
    )
    rollouts = ParallelRollouts(workers, mode="bulk_sync")
    store_op = rollouts.for_each(StoreToReplayBuffer(local_buffer=local_replay_buffer))
    replay_op = Replay(local_buffer=local_replay_buffer).for_each(TrainOneStep(workers))
    if config.prioritized_replay:  # RLlib's update_prio: |td_error| + eps at batch_indexes
        replay_op = replay_op.for_each(UpdatePriorities(local_buffer=local_replay_buffer))
    replay_op = replay_op.for_each(UpdateTargetNetwork(workers, config.target_network_update_freq))
    train_op = Concurrently(
        [store_op, replay_op],
        mode="round_robin",
        output_indexes=[1],
        round_robin_weights=calculate_rr_weights(config),
    ).repeat(cycles_per_iteration(config))  # RLlib: until timesteps_per_iteration are sampled
    return trainer.reporting(train_op, workers, config)


def build_workers(config: SACConfig) -> WorkerSet:
    """The env, one SAC policy per policy id and the agent -> policy mapping, as a
    `WorkerSet` (`jaxplan.trainer.build_workers`)."""
    return trainer.build_workers(config, SACPolicy)


def sac_plan(
    config: SACConfig | Mapping[str, Any] | None = None, *, env: str | None = None
) -> Plan:
    """The SAC plan for a config (a `SACConfig`, or an RLlib-style dict applied on top of the
    tuned preset for its env). `sac_plan()` uses the Pendulum-v1 preset."""
    return ALGORITHM.plan(config, env=env)


def _describe(config: SACConfig) -> str:
    rollouts, trains = calculate_rr_weights(config)
    cycles = cycles_per_iteration(config)
    return (
        f"{cycles} cycles of {rollouts} rollout round(s) + {trains} replayed train step(s) "
        f"of {config.train_batch_size}"
    )


ALGORITHM = Algorithm(
    name="SAC",
    config_class=SACConfig,
    presets=PRESETS,
    build_workers=build_workers,
    execution_plan=execution_plan,
    describe=_describe,
)
"""SAC for `jaxplan train sac` (`jaxplan.algorithms`)."""
