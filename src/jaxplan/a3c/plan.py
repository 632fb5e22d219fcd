"""A3C's execution plan, as RLlib writes it (`rllib/agents/a3c/a3c.py`), with its
asynchronous workers as staggered actor groups (deterministic, lag measured)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from jaxplan import trainer
from jaxplan.a2c.policy import A2CPolicy
from jaxplan.a3c.config import PRESETS, A3CConfig
from jaxplan.algorithms import Algorithm
from jaxplan.flow import Flow, Plan
from jaxplan.stages.gradients import ApplyGradients, AsyncGradients, mean_learner_info
from jaxplan.workers import WorkerSet


def execution_plan(workers: WorkerSet, config: A3CConfig) -> Plan:
    """A3C: each round the actor group that completes a fragment sends the gradient computed
    with its own (lagged) params; it is applied to the newest params, which only that group
    takes next. `gradients_per_iteration(config, workers)` of them make one iteration."""
    grads = Flow.source(AsyncGradients(workers, num_async=config.num_async))
    schedules = trainer.schedules_stage(config)
    if schedules is not None:
        raise ValueError(
            "A3C: lr_schedule / entropy_coeff_schedule are not supported yet (its gradients "
            "are computed with each group's own params); remove them"
        )
    train_op = grads.for_each(ApplyGradients(workers))
    n = gradients_per_iteration(config, workers)
    if n > 1:
        train_op = train_op.batch(n).for_each(mean_learner_info)
    return trainer.reporting(train_op, workers, config)


def gradients_per_iteration(config: A3CConfig, workers: WorkerSet) -> int:
    """Gradients (fragments) per iteration: enough to sample `timesteps_per_iteration`."""
    fragment = workers.num_envs_per_worker * workers.rollout_fragment_length
    return max(1, math.ceil(config.timesteps_per_iteration / fragment))


def build_workers(config: A3CConfig) -> WorkerSet:
    """The env, one A2C/A3C policy per policy id, the agent -> policy mapping (one device)."""
    return trainer.build_workers(config, A2CPolicy)


def a3c_plan(
    config: A3CConfig | Mapping[str, Any] | None = None, *, env: str | None = None
) -> Plan:
    """The A3C plan for a config (an `A3CConfig`, or an RLlib-style dict applied on top of the
    tuned preset for its env)."""
    return ALGORITHM.plan(config, env=env)


def _describe(config: A3CConfig) -> str:
    return (
        f"async gradients of {config.rollout_fragment_length}-step fragments, "
        f">= {config.timesteps_per_iteration} steps per iteration"
    )


ALGORITHM = Algorithm(
    name="A3C",
    config_class=A3CConfig,
    presets=PRESETS,
    build_workers=build_workers,
    execution_plan=execution_plan,
    describe=_describe,
)
"""A3C for `jaxplan train a3c` (`jaxplan.algorithms`)."""
