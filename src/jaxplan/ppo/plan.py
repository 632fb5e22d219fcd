"""PPO's execution plan, line for line as RLlib writes it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxplan import trainer
from jaxplan.algorithms import Algorithm, train_batch
from jaxplan.flow import Plan
from jaxplan.ppo.config import PPOConfig
from jaxplan.ppo.policy import PPOPolicy
from jaxplan.ppo.presets import PRESETS
from jaxplan.stages import (
    ConcatBatches,
    MultiGPUTrainOneStep,
    ParallelRollouts,
    SelectExperiences,
    StandardizeFields,
    TrainOneStep,
    UpdateKL,
    warn_about_bad_reward_scales,
)
from jaxplan.workers import WorkerSet


def execution_plan(workers: WorkerSet, config: PPOConfig) -> Plan:
    """PPO: sample, select trainable policies, build the train batch, standardize advantages,
    SGD, adapt the KL coefficient, report. RLlib's PPO samples `bulk_sync`; with
    `rollout_mode="async"` it is PPO with lagged actors (the surrogate's ratio is taken
    against the acting policy's log-probs, optionally with V-trace advantages); RLlib's
    asynchronous PPO, with IMPALA's learner queue and a target network, is `appo`."""
    rollouts = ParallelRollouts(workers, mode=config.rollout_mode, num_async=config.num_async)
    rollouts = rollouts.for_each(SelectExperiences(workers.trainable_policies()))
    rollouts = rollouts.combine(
        ConcatBatches(
            min_batch_size=config.train_batch_size, count_steps_by=config.multiagent.count_steps_by
        )
    )
    rollouts = rollouts.for_each(StandardizeFields(["advantages"]))
    schedules = trainer.schedules_stage(config)
    if schedules is not None:  # RLlib applies them inside its policies; here they are a stage
        rollouts = rollouts.for_each(schedules)
    if config.simple_optimizer:
        train_op = rollouts.for_each(
            TrainOneStep(
                workers,
                num_sgd_iter=config.num_sgd_iter,
                sgd_minibatch_size=config.sgd_minibatch_size,
                shuffle_sequences=config.shuffle_sequences,
            )
        )
    else:
        train_op = rollouts.for_each(
            MultiGPUTrainOneStep(
                workers,
                sgd_minibatch_size=config.sgd_minibatch_size,
                num_sgd_iter=config.num_sgd_iter,
                num_gpus=config.data_parallel_devices,
                shuffle_sequences=config.shuffle_sequences,
                _fake_gpus=config.fake_gpus,
            )
        )
    train_op = train_op.for_each(lambda t: t[1]).for_each(UpdateKL())
    return trainer.reporting(train_op, workers, config).on_result(
        lambda result: warn_about_bad_reward_scales(config, result)
    )


def build_workers(config: PPOConfig) -> WorkerSet:
    """The env (gymnax, built-in multi-agent or `jaxmarl:...`), one PPO policy per policy id
    (with its `multiagent.policies` overrides) and the agent -> policy mapping, as a
    `WorkerSet` on the config's devices (`jaxplan.trainer.build_workers`)."""
    return trainer.build_workers(config, PPOPolicy)


def ppo_plan(
    config: PPOConfig | Mapping[str, Any] | None = None, *, env: str | None = None
) -> Plan:
    """The PPO plan for a config (a `PPOConfig`, or an RLlib-style dict applied on top of the
    tuned preset for its env). `ppo_plan(env="CartPole-v1")` uses that env's preset."""
    return ALGORITHM.plan(config, env=env)


ALGORITHM = Algorithm(
    name="PPO",
    config_class=PPOConfig,
    presets=PRESETS,
    build_workers=build_workers,
    execution_plan=execution_plan,
    describe=lambda c: (
        f"{train_batch(c)} | {c.num_sgd_iter} epochs of minibatch {c.sgd_minibatch_size}"
    ),
)
"""PPO for `jaxplan train ppo` (`jaxplan.algorithms`)."""
