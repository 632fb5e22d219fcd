"""DQN's execution plan, line for line as RLlib writes it (`rllib/agents/dqn/dqn.py`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxplan import trainer
from jaxplan.algorithms import Algorithm
from jaxplan.dqn.config import (
    PRESETS,
    DQNConfig,
    calculate_rr_weights,
    cycles_per_iteration,
)
from jaxplan.dqn.policy import DQNPolicy
from jaxplan.flow import Plan
from jaxplan.stages import MultiGPUTrainOneStep, ParallelRollouts, TrainOneStep
from jaxplan.stages.concurrently import Concurrently
from jaxplan.stages.replay import (
    LocalReplayBuffer,
    Replay,
    StoreToReplayBuffer,
    UpdatePriorities,
)
from jaxplan.stages.update_target_network import UpdateTargetNetwork
from jaxplan.workers import WorkerSet


def execution_plan(workers: WorkerSet, config: DQNConfig) -> Plan:
    """DQN: store every rollout round in the replay buffer; in turn, replay a train batch,
    take one gradient step on it, (prioritized replay) set the replayed rows' priorities from
    their TD errors and update the target network every
    `target_network_update_freq` sampled steps. One iteration is `cycles_per_iteration`
    round-robin cycles (>= `timesteps_per_iteration` env steps)."""
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
    if config.simple_optimizer or workers.mesh is None:
        train_step = TrainOneStep(workers)
    else:  # each device differentiates its shard of the replayed batch (RLlib's multi-GPU)
        train_step = MultiGPUTrainOneStep(  # the whole batch as one minibatch, as TrainOneStep
            workers,
            num_sgd_iter=1,
            num_gpus=config.data_parallel_devices,
            shuffle_sequences=True,
            _fake_gpus=config.fake_gpus,
        )
    replay_op = Replay(local_buffer=local_replay_buffer).for_each(train_step)
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


def build_workers(config: DQNConfig) -> WorkerSet:
    """The env, one DQN policy per policy id and the agent -> policy mapping, as a
    `WorkerSet` (`jaxplan.trainer.build_workers`)."""
    return trainer.build_workers(config, DQNPolicy)


def dqn_plan(
    config: DQNConfig | Mapping[str, Any] | None = None, *, env: str | None = None
) -> Plan:
    """The DQN plan for a config (a `DQNConfig`, or an RLlib-style dict applied on top of the
    tuned preset for its env). `dqn_plan(env="CartPole-v1")` uses that env's preset."""
    return ALGORITHM.plan(config, env=env)


def describe(config: DQNConfig) -> str:
    """The CLI header's line: the round-robin cycles of one iteration (DQN and SAC)."""
    rollouts, trains = calculate_rr_weights(config)
    cycles = cycles_per_iteration(config)
    return (
        f"{cycles} cycles of {rollouts} rollout round(s) + {trains} replayed train step(s) "
        f"of {config.train_batch_size}"
    )


ALGORITHM = Algorithm(
    name="DQN",
    config_class=DQNConfig,
    presets=PRESETS,
    build_workers=build_workers,
    execution_plan=execution_plan,
    describe=describe,
)
"""DQN for `jaxplan train dqn` (`jaxplan.algorithms`)."""
