"""A2C's execution plan, line for line as RLlib writes it (`rllib/agents/a3c/a2c.py`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxplan import trainer
from jaxplan.a2c.config import PRESETS, A2CConfig
from jaxplan.a2c.policy import A2CPolicy
from jaxplan.algorithms import Algorithm, train_batch
from jaxplan.flow import Plan
from jaxplan.stages import (
    ConcatBatches,
    MultiGPUTrainOneStep,
    ParallelRollouts,
    TrainOneStep,
)
from jaxplan.stages.gradients import ApplyGradients, AverageGradients, ComputeGradients
from jaxplan.workers import WorkerSet


def execution_plan(workers: WorkerSet, config: A2CConfig) -> Plan:
    """A2C: sample synchronously, then either one gradient step on the whole train batch, or
    (`microbatch_size`) gradients of microbatches summed over a train batch's worth of them
    and applied in one step (less memory for large batches)."""
    rollouts = ParallelRollouts(workers, mode="bulk_sync")
    count_steps_by = config.multiagent.count_steps_by
    schedules = trainer.schedules_stage(config)
    if config.microbatch_size:
        train_op = rollouts.combine(
            ConcatBatches(min_batch_size=config.microbatch_size, count_steps_by=count_steps_by)
        )
        if schedules is not None:  # RLlib applies them inside its policies; here a stage
            train_op = train_op.for_each(schedules)
        train_op = (
            train_op.for_each(ComputeGradients(workers))
            .batch(config.num_microbatches)
            .for_each(AverageGradients())
            .for_each(ApplyGradients(workers))
        )
    else:
        train_op = rollouts.combine(
            ConcatBatches(min_batch_size=config.train_batch_size, count_steps_by=count_steps_by)
        )
        if schedules is not None:
            train_op = train_op.for_each(schedules)
        if config.simple_optimizer or workers.mesh is None:
            train_op = train_op.for_each(TrainOneStep(workers, shuffle_sequences=False))
        else:  # on a mesh: each device differentiates its shard (RLlib's multi-GPU learner)
            train_op = train_op.for_each(
                MultiGPUTrainOneStep(
                    workers,
                    num_gpus=config.data_parallel_devices,
                    shuffle_sequences=False,
                    _fake_gpus=config.fake_gpus,
                )
            )
    return trainer.reporting(train_op, workers, config)


def build_workers(config: A2CConfig) -> WorkerSet:
    """The env, one A2C policy per policy id and the agent -> policy mapping, as a
    `WorkerSet` on the config's devices (`jaxplan.trainer.build_workers`)."""
    return trainer.build_workers(config, A2CPolicy)


def a2c_plan(
    config: A2CConfig | Mapping[str, Any] | None = None, *, env: str | None = None
) -> Plan:
    """The A2C plan for a config (an `A2CConfig`, or an RLlib-style dict applied on top of the
    tuned preset for its env). `a2c_plan(env="CartPole-v1")` uses that env's preset."""
    return ALGORITHM.plan(config, env=env)


def _describe(config: A2CConfig) -> str:
    if config.microbatch_size:
        return (
            f"{config.num_microbatches} microbatch gradients of >= {config.microbatch_size} "
            "steps summed, 1 step"
        )
    return f"{train_batch(config)} | 1 gradient step on the whole batch"


ALGORITHM = Algorithm(
    name="A2C",
    config_class=A2CConfig,
    presets=PRESETS,
    build_workers=build_workers,
    execution_plan=execution_plan,
    describe=_describe,
)
"""A2C for `jaxplan train a2c` (`jaxplan.algorithms`)."""
