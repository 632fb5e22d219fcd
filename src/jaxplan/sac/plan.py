"""SAC's execution plan: RLlib 1.x's SAC trainer reuses DQN's (`GenericOffPolicyTrainer`),
line for line as `rllib/agents/dqn/dqn.py` writes it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxplan import trainer
from jaxplan.algorithms import Algorithm
from jaxplan.dqn import plan as dqn_plan
from jaxplan.flow import Plan
from jaxplan.sac.config import PRESETS, SACConfig
from jaxplan.sac.policy import SACPolicy
from jaxplan.workers import WorkerSet


def execution_plan(workers: WorkerSet, config: SACConfig) -> Plan:
    """SAC is DQN's plan (`jaxplan.dqn.plan.execution_plan`, as RLlib's SAC trainer reuses
    DQN's): store every rollout round in the replay buffer; in turn, replay a train batch,
    take one actor, critic and alpha step on it, (prioritized replay) set the replayed rows'
    priorities from their TD errors and move the target Q networks `tau` of the way to the
    online ones (after every train step with `target_network_update_freq` 0). One iteration
    is `cycles_per_iteration` round-robin cycles (>= `timesteps_per_iteration` env steps);
    on a mesh the buffer is sharded and the learner data-parallel, as DQN's."""
    return dqn_plan.execution_plan(workers, config)


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


ALGORITHM = Algorithm(
    name="SAC",
    config_class=SACConfig,
    presets=PRESETS,
    build_workers=build_workers,
    execution_plan=execution_plan,
    describe=dqn_plan.describe,  # the same round-robin cycles
)
"""SAC for `jaxplan train sac` (`jaxplan.algorithms`)."""
