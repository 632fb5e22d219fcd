"""APPO's execution plan: RLlib's `APPOTrainer` is IMPALA's trainer with APPO's policy and
`after_train_step=UpdateTargetAndKL` (`rllib/agents/ppo/appo.py`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from jaxplan import trainer
from jaxplan.algorithms import Algorithm, train_batch
from jaxplan.appo.config import PRESETS, APPOConfig
from jaxplan.appo.policy import APPOPolicy
from jaxplan.batch import LearnerInfo
from jaxplan.flow import Plan
from jaxplan.impala import plan as impala
from jaxplan.stages.update_kl import update_kl_coeff
from jaxplan.stages.update_target_network import TargetUpdateState, UpdateTargetNetwork
from jaxplan.workers import PlanState, WorkerSet


class UpdateTargetAndKL(UpdateTargetNetwork):
    """`LearnerInfo -> LearnerInfo`, RLlib APPO's `UpdateTargetAndKL`: after a learner step,
    when more than `num_sgd_iter * minibatch_buffer_size` env steps were sampled since the
    last update (RLlib 1.x compares that product with its steps-sampled counter, strictly),
    every trainable policy's target network is set to its model and, with `use_kl_loss`,
    its `kl_coeff` adapts to the step's `kl` (PPO's rule, `update_kl_coeff`). Reports
    `info.num_target_updates` and `info.last_target_update_ts`."""

    def __init__(self, workers: WorkerSet, config: APPOConfig):
        super().__init__(workers, config.target_update_frequency)
        self.use_kl_loss = bool(config.use_kl_loss)

    def due(self, elapsed: jax.Array) -> jax.Array:
        return elapsed > jnp.uint32(self.target_update_freq)

    def apply(self, state: PlanState, own: TargetUpdateState, learner_info: LearnerInfo):
        before = own.num_target_updates
        state, own, learner_info = super().apply(state, own, learner_info)
        if self.use_kl_loss:
            updated = own.num_target_updates > before
            policies = dict(state.policies)
            for pid, info in learner_info.items():
                ps = policies[pid]
                kl_coeff = update_kl_coeff(
                    ps.kl_coeff, info["learner_stats"]["kl"], ps.hparams.kl_target
                )
                policies[pid] = ps.replace(kl_coeff=jnp.where(updated, kl_coeff, ps.kl_coeff))
            state = state.replace(policies=policies)
        return state, own, learner_info


def execution_plan(workers: WorkerSet, config: APPOConfig) -> Plan:
    """APPO: IMPALA's plan (async actor groups -> train batches -> the learner's
    `num_sgd_iter` passes, here with APPO's loss) followed by `UpdateTargetAndKL`."""
    return impala.execution_plan(
        workers, config, after_train_step=UpdateTargetAndKL(workers, config)
    )


def build_workers(config: APPOConfig) -> WorkerSet:
    """The env, one APPO policy per policy id and the agent -> policy mapping, as a
    `WorkerSet` on the config's devices (`jaxplan.trainer.build_workers`)."""
    return trainer.build_workers(config, APPOPolicy)


def appo_plan(
    config: APPOConfig | Mapping[str, Any] | None = None, *, env: str | None = None
) -> Plan:
    """The APPO plan for a config (an `APPOConfig`, or an RLlib-style dict applied on top of
    the tuned preset for its env)."""
    return ALGORITHM.plan(config, env=env)


ALGORITHM = Algorithm(
    name="APPO",
    config_class=APPOConfig,
    presets=PRESETS,
    build_workers=build_workers,
    execution_plan=execution_plan,
    describe=lambda c: (
        f"{train_batch(c)} | {c.num_sgd_iter} clipped-surrogate pass(es) on it "
        f"({'V-trace' if c.vtrace else 'GAE'}), target net"
    ),
)
"""APPO for `jaxplan train appo` (`jaxplan.algorithms`)."""
